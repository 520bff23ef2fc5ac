//! Why the kernel refused: one line naming the real cause, found by checking
//! the machine (BTF, kernel version, capabilities, seccomp, lockdown,
//! AppArmor) and the failure's errno, never by matching error text.
//!
//! [`Facts::read`] looks at the machine; [`explain`] is pure, so every cause
//! has a unit test.

/// What uvspan was doing when the kernel said no.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Creating maps and loading programs (bpf(2)).
    Load,
    /// Attaching the BTF raw tracepoints (syscall entry/exit, process
    /// fork/exec/exit).
    AttachRawTracepoint,
}

/// Capability numbers (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The machine, as far as a failed BPF operation depends on it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// /sys/kernel/btf/vmlinux exists.
    pub btf: bool,
    /// (major, minor) of the running kernel.
    pub kernel: Option<(u32, u32)>,
    /// Effective capabilities (CapEff in /proc/self/status).
    pub cap_eff: u64,
    /// Seccomp mode (0 none, 1 strict, 2 filter).
    pub seccomp: Option<u32>,
    /// The active lockdown mode ("none", "integrity", "confidentiality").
    pub lockdown: Option<String>,
    /// The AppArmor profile uvspan runs under, when enforced.
    pub apparmor: Option<String>,
}

impl Facts {
    pub fn read() -> Facts {
        let status = procfs::process::Process::myself().and_then(|p| p.status()).ok();
        Facts {
            btf: std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
            kernel: kernel_version(&std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default()),
            cap_eff: status.as_ref().map_or(0, |s| s.capeff),
            seccomp: status.as_ref().and_then(|s| s.seccomp),
            lockdown: std::fs::read_to_string("/sys/kernel/security/lockdown").ok().and_then(|s| active_lockdown(&s)),
            apparmor: std::fs::read_to_string("/proc/self/attr/apparmor/current")
                .or_else(|_| std::fs::read_to_string("/proc/self/attr/current"))
                .ok()
                .and_then(|s| enforced_apparmor(&s)),
        }
    }

    fn has(&self, cap: u32) -> bool {
        self.cap_eff & (1u64 << cap) != 0
    }

    /// The capabilities BPF tracing needs that uvspan lacks (CAP_SYS_ADMIN
    /// stands in for both on any kernel).
    fn missing_caps(&self) -> Vec<&'static str> {
        if self.has(CAP_SYS_ADMIN) {
            return vec![];
        }
        let mut v = Vec::new();
        if !self.has(CAP_BPF) {
            v.push("CAP_BPF");
        }
        if !self.has(CAP_PERFMON) {
            v.push("CAP_PERFMON");
        }
        v
    }
}

/// "6.18.44-fc" → (6, 18).
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.trim().split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// "none [integrity] confidentiality" → "integrity".
fn active_lockdown(s: &str) -> Option<String> {
    let start = s.find('[')? + 1;
    let end = s[start..].find(']')? + start;
    Some(s[start..end].to_string())
}

/// "docker-default (enforce)" → the profile; unconfined or complain → None.
fn enforced_apparmor(s: &str) -> Option<String> {
    let s = s.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    let name = s.strip_suffix("(enforce)")?.trim();
    (!name.is_empty() && name != "unconfined").then(|| name.to_string())
}

const PRIVILEGES: &str = "uvspan needs root, or the capabilities CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE (and CAP_DAC_READ_SEARCH to read other users' environment)";

/// What libbpf said of the last program the kernel refused to load.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refusal {
    /// The program's name.
    pub prog: String,
    /// The errno libbpf printed (`-EACCES`): exact, where the thread's
    /// errno may have been overwritten since.
    pub errno: Option<i32>,
    /// The verifier's verdict: its log's last line before the statistics
    /// (`combined stack size of 4 calls is 528. Too large`).
    pub verdict: Option<String>,
}

/// The last refusal in libbpf's messages (pure): `libbpf: prog 'NAME': BPF
/// program load failed: -EACCES` and the load log between `-- BEGIN PROG
/// LOAD LOG --` and `-- END PROG LOAD LOG --`.
pub fn refusal(messages: &str) -> Option<Refusal> {
    let mut last: Option<Refusal> = None;
    let mut log: Option<Vec<&str>> = None;
    for line in messages.lines() {
        if line.contains("-- BEGIN PROG LOAD LOG --") {
            log = Some(Vec::new());
        } else if line.contains("-- END PROG LOAD LOG --") {
            let verdict = log.take().and_then(|l| {
                l.into_iter()
                    .rev()
                    .map(str::trim)
                    .find(|l| !l.is_empty() && !l.starts_with("processed ") && !l.starts_with("verification time"))
                    .map(|l| l.chars().take(200).collect::<String>())
            });
            if let Some(r) = last.as_mut() {
                r.verdict = verdict;
            }
        } else if let Some(l) = log.as_mut() {
            l.push(line);
        } else if let Some(rest) = line.split("prog '").nth(1) {
            let Some((prog, tail)) = rest.split_once('\'') else { continue };
            let Some(code) = tail.split("load failed: ").nth(1) else { continue };
            let errno = errno_named(code.trim());
            // "failed to load" lines repeat the one before: keep its log.
            if last.as_ref().is_some_and(|r| r.prog == prog && r.errno == errno) {
                continue;
            }
            last = Some(Refusal { prog: prog.chars().take(64).collect(), errno, verdict: None });
        }
    }
    last
}

/// `-EACCES` (or `-13`) as an errno.
fn errno_named(s: &str) -> Option<i32> {
    let s = s.strip_prefix('-').unwrap_or(s);
    if let Ok(n) = s.parse::<i32>() {
        return Some(n);
    }
    Some(match s {
        "EPERM" => libc::EPERM,
        "EACCES" => libc::EACCES,
        "EINVAL" => libc::EINVAL,
        "E2BIG" => libc::E2BIG,
        "ENOMEM" => libc::ENOMEM,
        "ENOENT" => libc::ENOENT,
        "ENOTSUPP" | "EOPNOTSUPP" => libc::EOPNOTSUPP,
        "ESRCH" => libc::ESRCH,
        _ => return None,
    })
}

/// The one line for a kernel refusal with `errno` at `stage`, naming the
/// program and the verifier's verdict when libbpf said them.
pub fn explain_refusal(stage: Stage, errno: Option<i32>, f: &Facts, r: Option<&Refusal>) -> String {
    let r = r.filter(|_| stage == Stage::Load);
    let errno = r.and_then(|r| r.errno).or(errno);
    let line = explain(stage, errno, f);
    match r.and_then(|r| Some((r, r.verdict.as_ref()?))) {
        Some((r, v)) if line.starts_with("the kernel's BPF verifier") => line.replacen(
            "the kernel's BPF verifier rejected uvspan's program",
            &format!("the kernel's BPF verifier rejected uvspan's program '{}' ({v})", r.prog),
            1,
        ),
        _ => line,
    }
}

/// The one line for a kernel refusal with `errno` at `stage`.
pub fn explain(stage: Stage, errno: Option<i32>, f: &Facts) -> String {
    if !f.btf {
        return "this kernel has no BTF type information (/sys/kernel/btf/vmlinux is missing): uvspan needs \
                Linux >= 5.15 built with CONFIG_DEBUG_INFO_BTF=y (most distribution kernels are)"
            .into();
    }
    if let Some((maj, min)) = f.kernel.filter(|&v| v < (5, 15)) {
        return format!("Linux {maj}.{min} is too old: uvspan needs Linux >= 5.15 with BTF");
    }
    let denied = matches!(errno, Some(libc::EPERM) | Some(libc::EACCES));
    let missing = f.missing_caps();
    if denied && !missing.is_empty() {
        return format!("cannot load the eBPF program: permission denied (missing {}). {PRIVILEGES}; run it with sudo", missing.join(", "));
    }
    if errno == Some(libc::EPERM) {
        if f.seccomp == Some(2) {
            return "cannot load the eBPF program: permission denied by a seccomp filter (Seccomp: 2 in \
                    /proc/self/status; container runtimes' default profiles refuse bpf() and perf_event_open()): \
                    run uvspan with a seccomp profile that allows them (Kubernetes: seccompProfile: Unconfined)"
                .into();
        }
        if let Some(profile) = &f.apparmor {
            return format!(
                "cannot load the eBPF program: permission denied under the AppArmor profile {profile:?}: \
                 run uvspan unconfined or with a profile that allows bpf and perfmon"
            );
        }
        if f.lockdown.as_deref() == Some("confidentiality") {
            return "cannot load the eBPF program: kernel lockdown (confidentiality) forbids it \
                    (/sys/kernel/security/lockdown): boot with lockdown=integrity or none"
                .into();
        }
        return format!(
            "cannot load the eBPF program: permission denied although uvspan has the capabilities it needs: \
             a security module (SELinux, Landlock) or the container runtime refuses bpf(); see the kernel log (dmesg). {PRIVILEGES}"
        );
    }
    match (stage, errno) {
        (Stage::Load, Some(libc::EACCES)) | (Stage::Load, Some(libc::EINVAL)) => {
            "the kernel's BPF verifier rejected uvspan's program: this is a uvspan bug or an unsupported kernel; \
             rerun with UVSPAN_DEBUG=1 for the verifier log and report it"
                .into()
        }
        (Stage::AttachRawTracepoint, Some(libc::ENOENT) | Some(libc::ESRCH)) => {
            "the sys_enter/sys_exit/sched_process_* tracepoints are not in this kernel's BTF (Linux >= 5.15 has them)".into()
        }
        (_, Some(e)) => format!(
            "the kernel refused uvspan's eBPF program ({}); uvspan needs Linux >= 5.15 with BTF; rerun with \
             UVSPAN_DEBUG=1 for libbpf's messages",
            std::io::Error::from_raw_os_error(e)
        ),
        (_, None) => "the kernel refused uvspan's eBPF program; rerun with UVSPAN_DEBUG=1 for libbpf's messages".into(),
    }
}

/// The errno of a libbpf failure. libbpf-rs keeps the errno inside its
/// error without exposing it, only its kind; libbpf also leaves it in
/// `errno`, so `last` (read right after the failure) gives the exact value
/// when it agrees with the kind (EPERM and EACCES are both "permission
/// denied"), else the kind's usual errno stands in.
pub fn errno_of(e: &libbpf_rs::Error, last: std::io::Error) -> Option<i32> {
    use libbpf_rs::ErrorKind as K;
    let usual = match e.kind() {
        K::PermissionDenied => libc::EPERM,
        K::NotFound => libc::ENOENT,
        K::InvalidInput => libc::EINVAL,
        K::Unsupported => libc::EOPNOTSUPP,
        K::OutOfMemory => libc::ENOMEM,
        K::TooBig => libc::E2BIG,
        K::AlreadyExists => libc::EEXIST,
        _ => return last.raw_os_error().filter(|&n| n != 0),
    };
    let same_kind = |n: i32| libbpf_rs::Error::from_raw_os_error(n).kind() == e.kind();
    Some(last.raw_os_error().filter(|&n| n > 0 && same_kind(n)).unwrap_or(usual))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> Facts {
        Facts { btf: true, kernel: Some((6, 18)), cap_eff: 0x1ff_ffff_ffff, seccomp: Some(0), lockdown: None, apparmor: None }
    }

    #[test]
    fn parses_machine_files() {
        assert_eq!(kernel_version("6.18.44-fc-v782\n"), Some((6, 18)));
        assert_eq!(kernel_version("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(kernel_version("garbage"), None);
        assert_eq!(active_lockdown("none [integrity] confidentiality\n").as_deref(), Some("integrity"));
        assert_eq!(active_lockdown("[none] integrity confidentiality").as_deref(), Some("none"));
        assert_eq!(enforced_apparmor("docker-default (enforce)\n").as_deref(), Some("docker-default"));
        assert_eq!(enforced_apparmor("unconfined\n"), None);
        assert_eq!(enforced_apparmor("x (complain)"), None);
    }

    #[test]
    fn missing_btf_and_old_kernels_come_first() {
        let f = Facts { btf: false, ..root() };
        assert!(explain(Stage::Load, Some(libc::EINVAL), &f).contains("/sys/kernel/btf/vmlinux is missing"));
        let f = Facts { kernel: Some((5, 10)), ..root() };
        assert!(explain(Stage::Load, Some(libc::EINVAL), &f).starts_with("Linux 5.10 is too old"));
    }

    #[test]
    fn names_the_missing_capabilities() {
        let f = Facts { cap_eff: 1 << CAP_BPF, ..root() };
        let line = explain(Stage::Load, Some(libc::EPERM), &f);
        assert!(line.contains("missing CAP_PERFMON") && !line.contains("missing CAP_BPF,"), "{line}");
        assert!(line.contains("root") && line.contains("capabilities"), "{line}");
        let f = Facts { cap_eff: 0, ..root() };
        assert!(explain(Stage::Load, Some(libc::EACCES), &f).contains("missing CAP_BPF, CAP_PERFMON"));
        // CAP_SYS_ADMIN covers both.
        let f = Facts { cap_eff: 1 << CAP_SYS_ADMIN, seccomp: Some(2), ..root() };
        assert!(explain(Stage::Load, Some(libc::EPERM), &f).contains("seccomp"));
    }

    #[test]
    fn seccomp_apparmor_lockdown_when_capabilities_are_there() {
        let f = Facts { seccomp: Some(2), ..root() };
        assert!(explain(Stage::Load, Some(libc::EPERM), &f).contains("seccomp filter"));
        let f = Facts { apparmor: Some("docker-default".into()), ..root() };
        assert!(explain(Stage::Load, Some(libc::EPERM), &f).contains("AppArmor profile \"docker-default\""));
        let f = Facts { lockdown: Some("confidentiality".into()), ..root() };
        assert!(explain(Stage::Load, Some(libc::EPERM), &f).contains("lockdown"));
        assert!(explain(Stage::Load, Some(libc::EPERM), &root()).contains("security module"));
    }

    #[test]
    fn errno_from_libbpf_errors() {
        let e = libbpf_rs::Error::from_raw_os_error(libc::EACCES);
        assert_eq!(errno_of(&e, std::io::Error::from_raw_os_error(libc::EACCES)), Some(libc::EACCES));
        // errno overwritten by something else meanwhile: the kind's usual errno.
        assert_eq!(errno_of(&e, std::io::Error::from_raw_os_error(libc::ENOENT)), Some(libc::EPERM));
        let e = libbpf_rs::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(errno_of(&e, std::io::Error::from_raw_os_error(0)), Some(libc::ENOENT));
    }

    #[test]
    fn a_refusal_is_read_from_libbpfs_messages() {
        let msgs = "libbpf: prog 'uv_multi': skipped loading\n\
            libbpf: prog 'uv_single': BPF program load failed: -EACCES\n\
            libbpf: prog 'uv_single': -- BEGIN PROG LOAD LOG --\n\
            Func#50 ('task_sched_read') is safe for any args that match its prototype\n\
            combined stack size of 4 calls is 528. Too large\n\
            processed 39406 insns (limit 1000000) max_states_per_insn 8 total_states 2235 peak_states 2048 mark_read 0\n\
            -- END PROG LOAD LOG --\n\
            libbpf: prog 'uv_single': failed to load: -EACCES\n\
            libbpf: failed to load object 'uvspan_bpf'\n";
        let r = refusal(msgs).expect("a refusal");
        assert_eq!(
            r,
            Refusal {
                prog: "uv_single".into(),
                errno: Some(libc::EACCES),
                verdict: Some("combined stack size of 4 calls is 528. Too large".into())
            }
        );
        // The errno libbpf printed wins over a stale one; the line names the program and the verdict.
        let line = explain_refusal(Stage::Load, Some(libc::EPERM), &root(), Some(&r));
        assert!(
            line.starts_with(
                "the kernel's BPF verifier rejected uvspan's program 'uv_single' (combined stack size of 4 calls is 528. Too large)"
            ),
            "{line}"
        );
        assert!(!line.contains("security module"), "{line}");
        assert_eq!(refusal("libbpf: loading object 'uvspan_bpf'\n"), None);
        // A real EPERM stays one.
        let eperm = Refusal { prog: "uv_single".into(), errno: Some(libc::EPERM), verdict: None };
        assert!(explain_refusal(Stage::Load, None, &root(), Some(&eperm)).contains("security module"));
    }

    #[test]
    fn verifier_and_attach_failures() {
        assert!(explain(Stage::Load, Some(libc::EACCES), &root()).contains("verifier"));
        assert!(explain(Stage::AttachRawTracepoint, Some(libc::ENOENT), &root()).contains("sched_process"));
        let other = explain(Stage::AttachRawTracepoint, Some(libc::EBUSY), &root());
        assert!(other.contains("UVSPAN_DEBUG=1") && other.contains("busy"), "{other}");
    }
}

/// Why the loop-thread sampling event (--stacks) could not be opened, and
/// what to do: from the errno of perf_event_open(2).
pub fn perf_event(pid: u32, e: &std::io::Error) -> String {
    let what = format!("cannot sample the loop thread of process {pid} (--stacks)");
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => format!(
            "{what}: perf events are refused ({e}); run uvspan as root or with CAP_PERFMON, \
             or lower /proc/sys/kernel/perf_event_paranoid; or use --stacks off"
        ),
        Some(libc::ESRCH) => format!("{what}: the process is gone"),
        Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {
            format!("{what}: this kernel has no CPU-clock perf event ({e}); use --stacks off")
        }
        Some(libc::EMFILE) | Some(libc::ENFILE) => {
            format!("{what}: out of file descriptors ({e}); raise the limit (ulimit -n)")
        }
        _ => format!("{what}: {e}; use --stacks off to trace without stacks"),
    }
}

#[cfg(test)]
mod perf_event_tests {
    use super::perf_event;

    #[test]
    fn perf_event_errors_say_what_to_do() {
        let m = perf_event(7, &std::io::Error::from_raw_os_error(libc::EACCES));
        assert!(m.contains("process 7") && m.contains("CAP_PERFMON"), "{m}");
        let m = perf_event(7, &std::io::Error::from_raw_os_error(libc::ESRCH));
        assert!(m.contains("gone"), "{m}");
    }
}
