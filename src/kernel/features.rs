//! Which kernel features uvspan's BPF side uses on this machine: multi-uprobe
//! links (Linux >= 6.6; else one link per probe), session uprobes on the fs
//! submit functions (Linux >= 6.13: sync calls end at their return, so
//! uv_fs_req_cleanup need not be probed), and fentry/fexit trampolines
//! for the epoll system calls (refused by kernels in lockdown; else the
//! sys_enter/sys_exit BTF raw tracepoints). Tried best first; what worked is
//! remembered for the current boot next to the symbol cache, so later starts
//! do not pay for the failed attempts. Whether fentry loads is asked first
//! with a two-instruction program ([`fentry_loads`]).

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Features {
    pub multi_uprobe: bool,
    /// Session uprobes (only with multi-uprobe links). Not defaulted: a
    /// remembered file from before they were tried is read as unknown.
    pub session: bool,
    pub fentry: bool,
}

const fn f(multi_uprobe: bool, session: bool, fentry: bool) -> Features {
    Features { multi_uprobe, session, fentry }
}

/// Every combination, best first.
pub const ORDER: [Features; 6] =
    [f(true, true, true), f(true, true, false), f(true, false, true), f(true, false, false), f(false, false, true), f(false, false, false)];

/// What a boot's kernel was seen to accept.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remembered {
    pub boot_id: String,
    pub features: Features,
    /// The errno fentry programs were refused with, if they were.
    pub fentry_refused: Option<i32>,
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|s| s.trim().to_string())
}

fn path() -> Option<std::path::PathBuf> {
    Some(crate::symbols::cache_dir()?.join("kernel.json"))
}

/// What worked before on this boot, if known.
pub fn remembered() -> Option<Remembered> {
    let r: Remembered = serde_json::from_slice(&std::fs::read(path()?).ok()?).ok()?;
    (Some(&r.boot_id) == boot_id().as_ref()).then_some(r)
}

/// Notes what worked (best effort: an unwritable cache costs the next start
/// the failed attempts again).
pub fn remember(features: Features, fentry_refused: Option<i32>) {
    let (Some(path), Some(boot_id)) = (path(), boot_id()) else { return };
    let r = Remembered { boot_id, features, fentry_refused };
    let Ok(text) = serde_json::to_vec(&r) else { return };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::create_dir_all(path.parent().unwrap_or(&path))
        .and_then(|()| std::fs::write(&tmp, text))
        .and_then(|()| std::fs::rename(&tmp, &path));
}

/// Whether this kernel loads fentry programs: a two-instruction one on the
/// epoll_wait entry (`Err(errno)` if refused, as kernels in lockdown do).
/// `None` where it cannot be asked (no BTF id): the full load tells. Asked
/// once per boot, before the first load: failing a whole load with fentry
/// programs took ~100 ms, on every start with no remembered result (a
/// fresh container's sidecar).
pub fn fentry_loads() -> Option<Result<(), i32>> {
    let btf_id = crate::kernel::core_btf::kernel_func_id("__x64_sys_epoll_wait")?;
    use libbpf_rs::libbpf_sys as sys;
    // r0 = 0; exit
    let mut insns = [sys::bpf_insn::default(), sys::bpf_insn::default()];
    insns[0].code = (sys::BPF_ALU64 | sys::BPF_MOV | sys::BPF_K) as u8;
    insns[1].code = (sys::BPF_JMP | sys::BPF_EXIT) as u8;
    let mut opts = sys::bpf_prog_load_opts {
        sz: std::mem::size_of::<sys::bpf_prog_load_opts>() as _,
        expected_attach_type: sys::BPF_TRACE_FENTRY,
        attach_btf_id: btf_id,
        ..Default::default()
    };
    // SAFETY: NUL-terminated name and license, `insns` holds the 2
    // instructions counted, `opts` is initialized with its size.
    let fd =
        unsafe { sys::bpf_prog_load(sys::BPF_PROG_TYPE_TRACING, c"uvspan_fentry".as_ptr(), c"GPL".as_ptr(), insns.as_ptr(), 2, &mut opts) };
    if fd < 0 {
        return Some(Err(-fd));
    }
    // SAFETY: `fd` is the program's, just returned to us and owned by nothing else.
    drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    Some(Ok(()))
}

/// What uvspan would use here, for `uvspan probes` (which loads nothing):
/// as the last run on this boot found, else as the kernel's version says
/// (multi-uprobe links came in Linux 6.6, session uprobes in 6.13), with
/// fentry taken as allowed (only loading tells a kernel in lockdown).
pub fn known() -> Features {
    match remembered() {
        Some(r) => r.features,
        None => {
            let at_least = |a, b| procfs::KernelVersion::current().is_ok_and(|v| v >= procfs::KernelVersion::new(a, b, 0));
            f(at_least(6, 6), at_least(6, 13), true)
        }
    }
}

/// The one line said when the kernel refuses fentry: where the epoll waits
/// are read instead (libc uprobes in each traced process, or the raw
/// system call tracepoints).
/// `lockdown`: the kernel's lockdown mode when it is on (`integrity`,
/// `confidentiality`), the one cause that is named; read by the caller
/// from securityfs, which is often not mounted: then no cause is named.
pub fn fallback_notice(errno: Option<i32>, by_uprobe: bool, lockdown: Option<&str>) -> String {
    let why = errno.map_or_else(String::new, |e| format!(" ({})", crate::events::errno::error_type(-i64::from(e))));
    let lock = lockdown.map_or_else(String::new, |m| format!(" (kernel lockdown: {m})"));
    let instead =
        if by_uprobe { "by libc epoll_wait uprobes (2 traps a wait)" } else { "at syscall tracepoints (~0.2 µs a host syscall)" };
    format!("this kernel refuses fentry programs{why}{lock}: loop epoll waits read {instead}")
}

/// The kernel's lockdown mode when it is on: the selected word of
/// securityfs's `lockdown` file (`none [integrity] confidentiality`), or
/// `None` when it is off or the file cannot be read.
pub fn lockdown_mode(file: &str) -> Option<String> {
    let sel = file.split_whitespace().find(|w| w.starts_with('[') && w.ends_with(']'))?;
    let mode = sel.trim_matches(['[', ']']);
    (mode != "none" && !mode.is_empty()).then(|| mode.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_notice_is_one_short_line() {
        for by_uprobe in [true, false] {
            let n = fallback_notice(Some(libc::EPERM), by_uprobe, None);
            assert!(n.starts_with("this kernel refuses fentry programs (EPERM): loop epoll waits read "), "{n}");
            assert!(!n.contains('\n') && n.chars().count() <= 125, "{} chars: {n}", n.chars().count());
            let n = fallback_notice(Some(libc::EPERM), by_uprobe, Some("confidentiality"));
            assert!(n.starts_with("this kernel refuses fentry programs (EPERM) (kernel lockdown: confidentiality): "), "{n}");
            assert!(n.chars().count() <= 150, "{} chars: {n}", n.chars().count());
        }
    }

    #[test]
    fn the_lockdown_mode_is_named_only_when_it_is_on() {
        assert_eq!(lockdown_mode("none [integrity] confidentiality\n").as_deref(), Some("integrity"));
        assert_eq!(lockdown_mode("none integrity [confidentiality]").as_deref(), Some("confidentiality"));
        assert_eq!(lockdown_mode("[none] integrity confidentiality\n"), None);
        assert_eq!(lockdown_mode(""), None);
        assert_eq!(lockdown_mode("garbage"), None);
    }

    #[test]
    fn best_first_and_all_combinations() {
        assert_eq!(ORDER[0], Features { multi_uprobe: true, session: true, fentry: true });
        let mut all: Vec<(bool, bool, bool)> = ORDER.iter().map(|f| (f.multi_uprobe, f.session, f.fentry)).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 6);
        assert!(ORDER.iter().all(|f| f.multi_uprobe || !f.session), "session uprobes are multi-uprobe links");
    }

    #[test]
    fn a_file_from_before_session_uprobes_is_not_remembered() {
        let old = r#"{"boot_id":"b","features":{"multi_uprobe":true,"fentry":false},"fentry_refused":1}"#;
        assert!(serde_json::from_str::<Remembered>(old).is_err());
    }

    /// Root: the small program's verdict is the one of loading uvspan's
    /// own fentry program (refused with the same errno, or both loaded).
    #[test]
    fn the_fentry_probe_agrees_with_loading_the_fentry_programs() {
        use crate::kernel::skel::UvspanSkelBuilder;
        use libbpf_rs::skel::{OpenSkel, SkelBuilder};

        libbpf_rs::set_print(None);
        let probe = fentry_loads().expect("the kernel's BTF names the epoll_wait entry");
        let object = Box::leak(Box::new(std::mem::MaybeUninit::uninit()));
        let mut open = UvspanSkelBuilder::default().open(object).unwrap();
        for mut p in open.open_object_mut().progs_mut() {
            p.set_autoload(false);
        }
        open.progs.fentry_epoll_wait.set_autoload(true);
        match (probe, open.load()) {
            (Ok(()), Ok(_)) => {}
            (Err(errno), Err(e)) => {
                assert_eq!(Some(errno), crate::kernel::diagnose::errno_of(&e, std::io::Error::last_os_error()), "{e}")
            }
            (probe, loaded) => panic!("the probe says {probe:?}, the load {:?}", loaded.map(|_| ())),
        }
    }

    #[test]
    fn remembered_round_trips() {
        let r = Remembered { boot_id: "b".into(), features: ORDER[1], fentry_refused: Some(1) };
        let back: Remembered = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert!(fallback_notice(Some(1), false, None).contains("fentry programs (EPERM)"));
        assert!(fallback_notice(None, true, None).contains("libc epoll_wait"));
    }
}
