//! The probe catalog: every libuv function uvspan attaches to, what fires
//! there, and what it captures. Adding an fs operation is adding a row to
//! [`FS_OPS`]; adding another kind of probe is a row in [`other_probes`]
//! next to its program in bpf/uvspan.bpf.c.

/// Which BPF program (bpf/uvspan.bpf.c) serves a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Program {
    /// `uv_fs_*` entry: an fs request is submitted (cookie: [`fs_cookie`]).
    FsSubmit,
    /// `uv__fs_work` entry: a threadpool thread starts the request.
    FsWork,
    /// `uv__fs_done` entry: completion delivered on the loop thread.
    FsDone,
    /// `uv_fs_req_cleanup` entry: ends sync requests (and async ones when
    /// `uv__fs_done` is missing).
    FsCleanup,
    /// `uv_async_send` entry on a threadpool thread: its job just finished.
    WorkEnd,
    /// `uv_getaddrinfo` entry.
    DnsSubmit,
    /// `uv__getaddrinfo_work` entry.
    DnsWork,
    /// `uv__getaddrinfo_done` entry.
    DnsDone,
    /// Loop phase function entry (cookie: the phase).
    LoopPhase,
    /// Fallback: libc `getaddrinfo` on a pool thread (DNS work start).
    DnsWorkLibc,
    /// Fallback: `uv_freeaddrinfo` (DNS completion, after the callback).
    DnsFree,
    /// Fallback: `uv_run` marks loop threads; epoll waits delimit iterations.
    LoopRun,
}

impl Program {
    /// The handler id (enum probe_kind in bpf/uvspan.h).
    pub fn kind(self) -> u64 {
        use crate::bpf::types::probe_kind as k;
        let v = match self {
            Program::FsSubmit => k::PROBE_FS_SUBMIT,
            Program::FsWork => k::PROBE_FS_WORK,
            Program::FsDone => k::PROBE_FS_DONE,
            Program::FsCleanup => k::PROBE_FS_CLEANUP,
            Program::WorkEnd => k::PROBE_WORK_END,
            Program::DnsSubmit => k::PROBE_DNS_SUBMIT,
            Program::DnsWork => k::PROBE_DNS_WORK,
            Program::DnsDone => k::PROBE_DNS_DONE,
            Program::LoopPhase => k::PROBE_LOOP_PHASE,
            Program::DnsWorkLibc => k::PROBE_DNS_WORK_LIBC,
            Program::DnsFree => k::PROBE_DNS_FREE,
            Program::LoopRun => k::PROBE_LOOP_RUN,
        };
        u64::from(v.0)
    }
}

/// Bit position of the handler id in a cookie (PROBE_KIND_SHIFT in bpf/uvspan.h).
pub const KIND_SHIFT: u32 = 56;

/// What a probe is for, so a missing one can be explained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Submit,
    WorkStart,
    WorkEnd,
    Completion,
    Phase,
}

/// Which file a probe's symbol lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageKind {
    /// The node executable, libnode.so or libuv.so: wherever libuv is.
    Libuv,
    /// The C library (for getaddrinfo).
    Libc,
}

/// An optional group of probes: more detail for more probe hits. Each hit
/// is a trap into the kernel (about 1 µs on the benchmark machine), so the
/// default set is the cheapest one that still gives every fs and DNS span
/// and every slow loop iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum DetailKind {
    /// Threadpool queue/run/callback-wait split of fs and DNS spans
    /// (uv__fs_work, uv__getaddrinfo_work, uv_async_send: +2 hits per job).
    Threadpool,
    /// Loop phase spans under slow iterations (uv__io_poll, uv__run_*: +5
    /// hits per loop iteration). Without them, iterations come from the
    /// loop thread's epoll waits, with no probe hits.
    Phases,
    /// Both.
    All,
}

impl DetailKind {
    pub fn name(self) -> &'static str {
        match self {
            DetailKind::Threadpool => "threadpool",
            DetailKind::Phases => "phases",
            DetailKind::All => "all",
        }
    }
}

/// Which optional groups are on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Detail {
    pub threadpool: bool,
    pub phases: bool,
}

impl Detail {
    pub fn from_kinds(kinds: &[DetailKind]) -> Detail {
        let has = |k| kinds.contains(&k) || kinds.contains(&DetailKind::All);
        Detail { threadpool: has(DetailKind::Threadpool), phases: has(DetailKind::Phases) }
    }

    pub fn all() -> Detail {
        Detail { threadpool: true, phases: true }
    }

    pub fn enables(self, k: DetailKind) -> bool {
        match k {
            DetailKind::Threadpool => self.threadpool,
            DetailKind::Phases => self.phases,
            DetailKind::All => self.threadpool && self.phases,
        }
    }
}

/// One attach point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub symbol: &'static str,
    pub image: ImageKind,
    pub program: Program,
    pub role: Role,
    /// The handler's own cookie; [`Probe::attach_cookie`] adds the handler id.
    pub cookie: u64,
    /// Shown when the symbol is missing: what is lost, or what takes over.
    pub if_missing: &'static str,
    /// A fallback: attached only when this (libuv) symbol is missing.
    pub fallback_for: Option<&'static str>,
    /// Attached only with `--detail` of this group.
    pub detail: Option<DetailKind>,
}

impl Probe {
    /// The full attach cookie: handler id in the top byte, handler cookie below.
    pub fn attach_cookie(&self) -> u64 {
        (self.program.kind() << KIND_SHIFT) | self.cookie
    }
}

/// An fs operation: libuv function, span name and where its arguments are.
/// Argument indices count integer/pointer arguments only (System V: doubles
/// travel in xmm registers and do not shift them). Index 6 and 7 are on the
/// stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsOp {
    pub symbol: &'static str,
    pub span: &'static str,
    pub cb: u8,
    pub path: Option<u8>,
    pub path2: Option<u8>,
    pub fd: Option<u8>,
}

const fn op(symbol: &'static str, span: &'static str, cb: u8, path: Option<u8>, path2: Option<u8>, fd: Option<u8>) -> FsOp {
    FsOp { symbol, span, cb, path, path2, fd }
}

const P: Option<u8> = Some(2); // path / fd argument right after (loop, req)
const N: Option<u8> = None;

/// Every `uv_fs_*` request function (libuv 1.x `include/uv.h`).
/// The row index is the operation id carried in the cookie and the event.
pub const FS_OPS: &[FsOp] = &[
    op("uv_fs_open", "fs.open", 5, P, N, N),
    op("uv_fs_close", "fs.close", 3, N, N, P),
    op("uv_fs_read", "fs.read", 6, N, N, P),
    op("uv_fs_write", "fs.write", 6, N, N, P),
    op("uv_fs_stat", "fs.stat", 3, P, N, N),
    op("uv_fs_fstat", "fs.fstat", 3, N, N, P),
    op("uv_fs_lstat", "fs.lstat", 3, P, N, N),
    op("uv_fs_statfs", "fs.statfs", 3, P, N, N),
    op("uv_fs_unlink", "fs.unlink", 3, P, N, N),
    op("uv_fs_rename", "fs.rename", 4, P, Some(3), N),
    op("uv_fs_mkdir", "fs.mkdir", 4, P, N, N),
    op("uv_fs_mkdtemp", "fs.mkdtemp", 3, P, N, N),
    op("uv_fs_mkstemp", "fs.mkstemp", 3, P, N, N),
    op("uv_fs_rmdir", "fs.rmdir", 3, P, N, N),
    op("uv_fs_scandir", "fs.scandir", 4, P, N, N),
    op("uv_fs_opendir", "fs.opendir", 3, P, N, N),
    op("uv_fs_readdir", "fs.readdir", 3, N, N, N),
    op("uv_fs_closedir", "fs.closedir", 3, N, N, N),
    op("uv_fs_realpath", "fs.realpath", 3, P, N, N),
    op("uv_fs_readlink", "fs.readlink", 3, P, N, N),
    op("uv_fs_access", "fs.access", 4, P, N, N),
    op("uv_fs_chmod", "fs.chmod", 4, P, N, N),
    op("uv_fs_fchmod", "fs.fchmod", 4, N, N, P),
    op("uv_fs_chown", "fs.chown", 5, P, N, N),
    op("uv_fs_fchown", "fs.fchown", 5, N, N, P),
    op("uv_fs_lchown", "fs.lchown", 5, P, N, N),
    op("uv_fs_fsync", "fs.fsync", 3, N, N, P),
    op("uv_fs_fdatasync", "fs.fdatasync", 3, N, N, P),
    op("uv_fs_ftruncate", "fs.ftruncate", 4, N, N, P),
    op("uv_fs_copyfile", "fs.copyfile", 5, P, Some(3), N),
    op("uv_fs_sendfile", "fs.sendfile", 6, N, N, P),
    op("uv_fs_symlink", "fs.symlink", 5, P, Some(3), N),
    op("uv_fs_link", "fs.link", 4, P, Some(3), N),
    op("uv_fs_utime", "fs.utime", 3, P, N, N),
    op("uv_fs_futime", "fs.futime", 3, N, N, P),
    op("uv_fs_lutime", "fs.lutime", 3, P, N, N),
];

/// Loop phases, in the order of enum loop_phase in bpf/uvspan.h.
pub const PHASES: &[(&str, &str)] = &[
    ("uv__io_poll", "poll"),
    ("uv__run_check", "check"),
    ("uv__run_timers", "timers"),
    ("uv__run_idle", "idle"),
    ("uv__run_prepare", "prepare"),
];

const NONE: u64 = 0xF;

/// The attach cookie of an fs submit probe; layout documented in
/// bpf/uvspan.bpf.c next to `fs_submit`.
pub fn fs_cookie(id: usize, op: &FsOp) -> u64 {
    let idx = |a: Option<u8>| a.map_or(NONE, u64::from);
    (id as u64 & 0xFF) | (u64::from(op.cb) << 8) | (idx(op.path) << 12) | (idx(op.path2) << 16) | (idx(op.fd) << 20)
}

const TP: Option<DetailKind> = Some(DetailKind::Threadpool);
const PH: Option<DetailKind> = Some(DetailKind::Phases);

/// The probes besides the fs submits: (symbol, image, program, role, cookie,
/// if missing, fallback for, detail group).
#[rustfmt::skip]
const OTHER: &[(&str, ImageKind, Program, Role, u64, &str, Option<&str>, Option<DetailKind>)] = &[
    ("uv__fs_done", ImageKind::Libuv, Program::FsDone, Role::Completion, 0,
        "async fs spans end at uv_fs_req_cleanup, after the JS callback ran", None, None),
    ("uv_fs_req_cleanup", ImageKind::Libuv, Program::FsCleanup, Role::Completion, 0,
        "sync fs calls are not seen to end: no spans for them", None, None),
    ("uv_getaddrinfo", ImageKind::Libuv, Program::DnsSubmit, Role::Submit, 0,
        "no DNS spans", None, None),
    ("uv__getaddrinfo_done", ImageKind::Libuv, Program::DnsDone, Role::Completion, 0,
        "DNS spans end at uv_freeaddrinfo, after the JS callback ran", None, None),
    // --detail threadpool
    ("uv__fs_work", ImageKind::Libuv, Program::FsWork, Role::WorkStart, 0,
        "async fs spans have no threadpool queue/run split", None, TP),
    ("uv_async_send", ImageKind::Libuv, Program::WorkEnd, Role::WorkEnd, 0,
        "threadpool run time is not split from the wait for the loop", None, TP),
    ("uv__getaddrinfo_work", ImageKind::Libuv, Program::DnsWork, Role::WorkStart, 0,
        "DNS threadpool start is taken from libc getaddrinfo", None, TP),
    // --detail phases
    ("uv__io_poll", ImageKind::Libuv, Program::LoopPhase, Role::Phase, 0,
        "loop iterations are delimited by the loop thread's epoll waits, without phases", None, PH),
    ("uv__run_check", ImageKind::Libuv, Program::LoopPhase, Role::Phase, 1,
        "no check phase span (its time joins the phase before)", None, PH),
    ("uv__run_timers", ImageKind::Libuv, Program::LoopPhase, Role::Phase, 2,
        "no timers phase span (its time joins the phase before)", None, PH),
    ("uv__run_idle", ImageKind::Libuv, Program::LoopPhase, Role::Phase, 3,
        "no idle phase span (its time joins the phase before)", None, PH),
    ("uv__run_prepare", ImageKind::Libuv, Program::LoopPhase, Role::Phase, 4,
        "no prepare phase span (its time joins the phase before)", None, PH),
    // Fallbacks, for builds that only export libuv's public API.
    ("getaddrinfo", ImageKind::Libc, Program::DnsWorkLibc, Role::WorkStart, 0,
        "DNS spans have no threadpool queue/run split", Some("uv__getaddrinfo_work"), TP),
    ("uv_freeaddrinfo", ImageKind::Libuv, Program::DnsFree, Role::Completion, 0,
        "DNS lookups are not seen to end: no DNS spans", Some("uv__getaddrinfo_done"), None),
    ("uv_run", ImageKind::Libuv, Program::LoopRun, Role::Phase, 0,
        "no loop iterations", Some("uv__io_poll"), PH),
];

/// Every probe uvspan knows, fs submits first.
pub fn all_probes() -> Vec<Probe> {
    let fs = FS_OPS.iter().enumerate().map(|(i, op)| Probe {
        symbol: op.symbol,
        image: ImageKind::Libuv,
        program: Program::FsSubmit,
        role: Role::Submit,
        cookie: fs_cookie(i, op),
        if_missing: "no spans for this fs operation",
        fallback_for: None,
        detail: None,
    });
    let other = OTHER.iter().map(|&(symbol, image, program, role, cookie, if_missing, fallback_for, detail)| Probe {
        symbol,
        image,
        program,
        role,
        cookie,
        if_missing,
        fallback_for,
        detail,
    });
    fs.chain(other).collect()
}

/// What uvspan does with one probe on a given build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Use {
    /// Found: attach it.
    Attach(u64),
    /// A fallback whose primary symbol exists: not needed.
    NotNeeded,
    /// Not found in the image (or no image of its kind).
    Missing,
    /// In a `--detail` group that is off.
    Off(DetailKind),
}

/// The plan for one build: each probe with the symbol offset to attach at,
/// given the symbols found in the libuv image and (optionally) in libc.
/// Pure, so what `uvspan probes` shows is what `uvspan` attaches.
pub fn plan(
    libuv: &std::collections::HashMap<&'static str, u64>,
    libc: Option<&std::collections::HashMap<&'static str, u64>>,
    detail: Detail,
) -> Vec<(Probe, Use)> {
    all_probes()
        .into_iter()
        .map(|p| {
            let syms = match p.image {
                ImageKind::Libuv => Some(libuv),
                ImageKind::Libc => libc,
            };
            let off_group = p.detail.filter(|&k| !detail.enables(k));
            let u = match (off_group, p.fallback_for, syms.and_then(|s| s.get(p.symbol))) {
                (Some(k), _, _) => Use::Off(k),
                (None, Some(primary), _) if libuv.contains_key(primary) => Use::NotNeeded,
                (None, _, Some(&off)) => Use::Attach(off),
                (None, _, None) => Use::Missing,
            };
            (p, u)
        })
        .collect()
}

/// The fs operation of an event's op id.
pub fn fs_op(id: u8) -> Option<&'static FsOp> {
    FS_OPS.get(usize::from(id))
}

/// The phase name of a phase index.
pub fn phase_name(i: usize) -> &'static str {
    PHASES.get(i).map_or("unknown", |p| p.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_layout_matches_bpf() {
        // uv_fs_rename(loop, req, path, new_path, cb): cb 4, path 2, path2 3, no fd
        let (i, rename) = FS_OPS.iter().enumerate().find(|(_, o)| o.symbol == "uv_fs_rename").unwrap();
        assert_eq!(fs_cookie(i, rename), i as u64 | 4 << 8 | 2 << 12 | 3 << 16 | 0xF << 20);
        // uv_fs_read(loop, req, file, bufs, nbufs, offset, cb): cb on the stack
        let (i, read) = FS_OPS.iter().enumerate().find(|(_, o)| o.symbol == "uv_fs_read").unwrap();
        assert_eq!(fs_cookie(i, read), i as u64 | 6 << 8 | 0xF << 12 | 0xF << 16 | 2 << 20);
    }

    #[test]
    fn phase_cookies_match_phase_table() {
        for p in all_probes().iter().filter(|p| p.program == Program::LoopPhase) {
            assert_eq!(PHASES[p.cookie as usize].0, p.symbol);
        }
    }

    #[test]
    fn plan_uses_fallbacks_only_when_needed() {
        use std::collections::HashMap;
        let full: HashMap<&'static str, u64> = all_probes()
            .iter()
            .filter(|p| p.image == ImageKind::Libuv && p.fallback_for.is_none())
            .map(|p| (p.symbol, 0x1000))
            .chain([("uv_freeaddrinfo", 0x2000), ("uv_run", 0x3000)])
            .collect();
        let libc: HashMap<&'static str, u64> = [("getaddrinfo", 0x10)].into();
        let plan_full = plan(&full, Some(&libc), Detail::all());
        let get = |pl: &[(Probe, Use)], s: &str| pl.iter().find(|(p, _)| p.symbol == s).unwrap().1.clone();
        assert_eq!(get(&plan_full, "uv_run"), Use::NotNeeded);
        assert_eq!(get(&plan_full, "getaddrinfo"), Use::NotNeeded);
        assert_eq!(get(&plan_full, "uv__io_poll"), Use::Attach(0x1000));

        // Stripped: only the exported API.
        let stripped: HashMap<&'static str, u64> = full.iter().filter(|(k, _)| !k.starts_with("uv__")).map(|(k, v)| (*k, *v)).collect();
        let plan_s = plan(&stripped, Some(&libc), Detail::all());
        assert_eq!(get(&plan_s, "uv__io_poll"), Use::Missing);
        assert_eq!(get(&plan_s, "uv_run"), Use::Attach(0x3000));
        assert_eq!(get(&plan_s, "uv_freeaddrinfo"), Use::Attach(0x2000));
        assert_eq!(get(&plan_s, "getaddrinfo"), Use::Attach(0x10));
        assert_eq!(plan(&stripped, None, Detail::all()).iter().find(|(p, _)| p.symbol == "getaddrinfo").unwrap().1, Use::Missing);
    }

    #[test]
    fn default_plan_is_the_cheap_set() {
        use std::collections::HashMap;
        let full: HashMap<&'static str, u64> = all_probes().iter().filter(|p| p.image == ImageKind::Libuv).map(|p| (p.symbol, 0x1000)).collect();
        let libc: HashMap<&'static str, u64> = [("getaddrinfo", 0x10)].into();
        let attached = |d: Detail| -> Vec<&'static str> {
            let mut v: Vec<_> = plan(&full, Some(&libc), d)
                .into_iter()
                .filter(|(p, u)| matches!(u, Use::Attach(_)) && p.program != Program::FsSubmit)
                .map(|(p, _)| p.symbol)
                .collect();
            v.sort();
            v
        };
        // Per async fs request: submit, uv__fs_done, uv_fs_req_cleanup; per
        // DNS lookup: submit and done; no probe per loop iteration.
        assert_eq!(attached(Detail::default()), ["uv__fs_done", "uv__getaddrinfo_done", "uv_fs_req_cleanup", "uv_getaddrinfo"]);
        let tp = attached(Detail::from_kinds(&[DetailKind::Threadpool]));
        assert!(tp.contains(&"uv__fs_work") && tp.contains(&"uv_async_send") && !tp.contains(&"uv__io_poll"));
        let ph = attached(Detail::from_kinds(&[DetailKind::Phases]));
        assert!(ph.contains(&"uv__io_poll") && ph.contains(&"uv__run_timers") && !ph.contains(&"uv__fs_work"));
        assert_eq!(attached(Detail::from_kinds(&[DetailKind::All])).len(), 12);
        let off = plan(&full, Some(&libc), Detail::default());
        assert_eq!(off.iter().find(|(p, _)| p.symbol == "uv__run_check").unwrap().1, Use::Off(DetailKind::Phases));
    }

    #[test]
    fn attach_cookie_carries_the_handler() {
        for p in all_probes() {
            assert_eq!(p.attach_cookie() >> KIND_SHIFT, p.program.kind());
            assert_eq!(p.attach_cookie() & ((1 << KIND_SHIFT) - 1), p.cookie);
        }
    }

    #[test]
    fn symbols_and_spans_are_unique_and_ids_fit() {
        let probes = all_probes();
        let mut syms: Vec<_> = probes.iter().map(|p| p.symbol).collect();
        syms.sort();
        syms.dedup();
        assert_eq!(syms.len(), probes.len());
        assert!(FS_OPS.len() < 256);
        for op in FS_OPS {
            assert_eq!(op.span, op.symbol.replacen("uv_fs_", "fs.", 1));
            assert!(op.cb <= 7 && op.path.is_some() != op.fd.is_some() || op.path.is_none());
        }
    }
}
