//! The plan for one process's images: each catalog probe with the offset to
//! attach at, or why it is not attached, and what that loses. Pure, so what
//! `uvspan probes` shows is what `uvspan` attaches; the kernel side only
//! turns `Usable` into `Failed` when the kernel refuses.

use std::collections::HashMap;

use crate::kernel::skel::types::probe_kind;
use crate::probes::catalog::{self, Detail, DetailKind, ImageKind, Needed, Probe};
use crate::probes::io_uring;
use crate::symbols::{Images, Located};

/// What decides the probes attached only for something ([`Needed`]), on
/// this kernel and in this process: whether anything is left for
/// `uv_fs_req_cleanup` to end ([`Needed::FsEnds`]), and whether the loop's
/// epoll waits are seen in libc ([`Needed::LoopWaits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conditions {
    /// Sync calls end at their uv_fs_* function's return (session uprobes).
    pub sync_at_return: bool,
    /// Fs requests may complete through io_uring, skipping `uv__fs_done`.
    pub io_uring: bool,
    /// The loop's epoll waits are seen by uprobes on libc's wrappers.
    pub waits_by_uprobe: bool,
    /// Finished jobs may be ended in batches at uv__work_done (false: one
    /// hit per job, for a comparison: `UVSPAN_BENCH_PER_JOB_DONE=1`).
    pub work_batch: bool,
}

impl Conditions {
    /// For a process of `images` with this `UV_USE_IO_URING`.
    pub fn of(sync_at_return: bool, waits_by_uprobe: bool, images: &Images, env: &io_uring::Env) -> Conditions {
        let img = &images.libuv.image;
        let io_uring = io_uring::fs_may_use_io_uring(img.uv_version, img.node_io_uring_patch, env);
        let work_batch = std::env::var_os("UVSPAN_BENCH_PER_JOB_DONE").is_none_or(|v| v != "1");
        Conditions { sync_at_return, io_uring, waits_by_uprobe, work_batch }
    }
}

/// How one probe fares on one build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeState {
    /// Found: attached (or, for `uvspan probes`, attachable).
    Usable,
    /// A fallback whose primary symbol exists.
    NotNeeded,
    /// The symbol is not in the file (or there is no file of its kind).
    Missing,
    /// Found, but the kernel refused to attach it.
    Failed(String),
    /// In a `--detail` group that is off.
    Off(DetailKind),
}

/// One catalog probe on one process's images.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProbeStatus {
    pub symbol: &'static str,
    pub image: ImageKind,
    /// The file the symbol is in (as the process sees it).
    pub path: Option<String>,
    /// File offset of the probe point, when found.
    pub offset: Option<u64>,
    #[serde(rename = "status", serialize_with = "state_word")]
    pub state: ProbeState,
    /// What is lost when missing (or, for a fallback, what it stands in for).
    pub if_missing: &'static str,
    pub fallback_for: Option<&'static str>,
    /// Useful only with this symbol (not attached without it).
    pub requires: Option<&'static str>,
    /// Attached only while it has something to end.
    #[serde(skip)]
    pub only_for: Option<Needed>,
    /// The kernel cannot emulate the instruction at the probe point, so each
    /// hit is single-stepped (much slower).
    pub single_stepped: bool,
    #[serde(skip)]
    pub kind: probe_kind,
    #[serde(skip)]
    pub cookie: u64,
}

fn state_word<S: serde::Serializer>(s: &ProbeState, ser: S) -> Result<S::Ok, S::Error> {
    match s {
        ProbeState::Usable => ser.serialize_str("usable"),
        ProbeState::NotNeeded => ser.serialize_str("not_needed"),
        ProbeState::Missing => ser.serialize_str("missing"),
        ProbeState::Failed(e) => ser.serialize_str(&format!("failed: {e}")),
        ProbeState::Off(k) => ser.serialize_str(&format!("off: {}", k.how_to_enable().trim_start_matches("with "))),
    }
}

/// The symbols found in each image of a process.
#[derive(Clone, Copy)]
pub struct Symbols<'a> {
    pub libuv: &'a HashMap<&'static str, u64>,
    pub libc: Option<&'a HashMap<&'static str, u64>>,
    /// V8's image when it is not libuv's (Debian's libnode.so beside a
    /// shared libuv.so); None: V8 is in libuv's image, or nowhere found.
    pub v8: Option<&'a HashMap<&'static str, u64>>,
}

impl<'a> Symbols<'a> {
    fn of(&self, image: ImageKind) -> Option<&'a HashMap<&'static str, u64>> {
        match image {
            ImageKind::Libuv => Some(self.libuv),
            ImageKind::Libc => self.libc,
            ImageKind::V8 => Some(self.v8.unwrap_or(self.libuv)),
        }
    }
}

/// The state of `p` given the symbols found in the process's images.
fn state_of(p: &Probe, images: Symbols, detail: Detail, ends: Conditions) -> (ProbeState, Option<u64>) {
    let libuv = images.libuv;
    let syms = images.of(p.image);
    if let Some(k) = p.detail.filter(|&k| !detail.enables(k)) {
        return (ProbeState::Off(k), None);
    }
    // A fallback's primary is a libuv symbol (V8's: in V8's image).
    let primaries = if p.image == ImageKind::V8 { syms } else { Some(libuv) };
    if p.fallback_for.is_some_and(|primary| primaries.is_some_and(|s| s.contains_key(primary))) {
        return (ProbeState::NotNeeded, None);
    }
    if p.requires.is_some_and(|needed| !libuv.contains_key(needed)) {
        return (ProbeState::NotNeeded, None);
    }
    let needed = match p.only_for {
        None => true,
        Some(Needed::FsEnds) => !ends.sync_at_return || ends.io_uring || !libuv.contains_key("uv__fs_done"),
        Some(Needed::LoopWaits) => ends.waits_by_uprobe,
        Some(Needed::JobDone) => !ends.work_batch || !libuv.contains_key(catalog::WORK_BATCH),
        Some(Needed::Batches) => ends.work_batch,
    };
    if !needed {
        return (ProbeState::NotNeeded, None);
    }
    match syms.and_then(|s| s.get(p.symbol)) {
        // An outgoing HTTP/2 stream's id is the return value: a session
        // uprobe's (Linux >= 6.13), the only way it is read.
        Some(_) if p.kind == probe_kind::PROBE_H2_SUBMIT && !ends.sync_at_return => {
            (ProbeState::Failed("the kernel has no session uprobes (Linux >= 6.13)".into()), None)
        }
        Some(&off) => (ProbeState::Usable, Some(off)),
        None => (ProbeState::Missing, None),
    }
}

/// The plan over bare symbol tables (no files): for tests and [`plan`].
pub fn plan_symbols(images: Symbols, detail: Detail, ends: Conditions) -> Vec<ProbeStatus> {
    catalog::all_probes()
        .into_iter()
        .map(|p| {
            let (state, offset) = state_of(&p, images, detail, ends);
            ProbeStatus {
                symbol: p.symbol,
                image: p.image,
                path: None,
                offset,
                state,
                if_missing: p.if_missing,
                fallback_for: p.fallback_for,
                requires: p.requires,
                only_for: p.only_for,
                single_stepped: false,
                kind: p.kind,
                cookie: p.attach_cookie(),
            }
        })
        .collect()
}

/// The plan for a process's images (nothing attached yet).
pub fn plan(images: &Images, detail: Detail, ends: Conditions) -> Vec<ProbeStatus> {
    let syms = Symbols {
        libuv: &images.libuv.image.offsets,
        libc: images.libc.as_ref().map(|l| &l.image.offsets),
        v8: images.v8.as_ref().map(|l| &l.image.offsets),
    };
    let mut out = plan_symbols(syms, detail, ends);
    for r in &mut out {
        let loc = images.of(r.image);
        r.path = loc.map(|l| l.path.clone());
        r.single_stepped = r.state == ProbeState::Usable && loc.is_some_and(|l| l.image.single_stepped.contains(&r.symbol));
        if r.kind == probe_kind::PROBE_WORK_BATCH {
            r.cookie |= images.libuv.image.work_batch.unwrap_or(0);
        }
    }
    out
}

/// Whether loop iterations come from the loop thread's epoll waits alone
/// (no phase probe in use: not asked for, or a stripped build).
pub fn epoll_only(report: &[ProbeStatus]) -> bool {
    !report.iter().any(|r| r.kind == probe_kind::PROBE_LOOP_PHASE && r.state == ProbeState::Usable)
}

/// Whether V8's garbage collections are seen: both GC callbacks usable, or
/// all of V8 10.2's points (Node 18).
pub fn gc_probed(report: &[ProbeStatus]) -> bool {
    let usable = |s: &str| report.iter().any(|r| r.symbol == s && r.state == ProbeState::Usable);
    (usable(catalog::GC_PROLOGUE) && usable(catalog::GC_EPILOGUE)) || catalog::GC_V10.iter().all(|s| usable(s))
}

/// What this build cannot trace, in words, one line per capability (the
/// notices said by default at start; [`notices`] names the probes): the
/// distinct losses of the probes missing, of a fallback only when what it
/// stands in for is missing too, of V8's collections only when none is seen.
pub fn short_notices(report: &[ProbeStatus]) -> Vec<String> {
    let lost = |r: &&ProbeStatus| matches!(r.state, ProbeState::Missing | ProbeState::Failed(_));
    let usable = |s: &str| report.iter().any(|r| r.symbol == s && r.state == ProbeState::Usable);
    let gc = gc_probed(report);
    let mut out: Vec<String> = Vec::new();
    for r in report.iter().filter(lost) {
        // GC points: what is lost is said by the fallbacks' rows.
        if r.kind == probe_kind::PROBE_GC && (gc || r.fallback_for.is_none()) {
            continue;
        }
        if r.fallback_for.is_some_and(usable) {
            continue;
        }
        if !r.if_missing.is_empty() && !out.iter().any(|o| o == r.if_missing) {
            out.push(r.if_missing.to_string());
        }
    }
    out
}

/// What cannot be traced on this build, and why, one line each, naming the
/// probes (`--verbose`).
pub fn notices(loc: &Located, report: &[ProbeStatus]) -> Vec<String> {
    let mut out = Vec::new();
    let slow: Vec<&str> = report.iter().filter(|r| r.single_stepped && r.state == ProbeState::Usable).map(|r| r.symbol).collect();
    if !slow.is_empty() {
        out.push(format!(
            "single-stepped by the kernel (no emulatable instruction near the start; each hit costs more): {}",
            slow.join(", ")
        ));
    }
    let lost = |r: &&ProbeStatus| matches!(r.state, ProbeState::Missing | ProbeState::Failed(_));
    let missing: Vec<&ProbeStatus> = report.iter().filter(lost).filter(|r| r.fallback_for.is_none()).collect();
    if missing.is_empty() {
        return out;
    }
    if !loc.image.has_symtab {
        out.push(format!("{} has no symbol table (stripped build, or a shared libuv): only libuv's exported API can be probed", loc.path));
    }
    for r in missing {
        let why = match &r.state {
            ProbeState::Failed(e) => e.clone(),
            _ => "not found".into(),
        };
        out.push(format!("{} {why}: {}", r.symbol, r.if_missing));
    }
    for r in report.iter().filter(|r| r.fallback_for.is_some() && r.state == ProbeState::Usable) {
        out.push(format!("fallback in use: {} instead of {}", r.symbol, r.fallback_for.unwrap_or("")));
    }
    for r in report.iter().filter(lost).filter(|r| r.fallback_for.is_some()) {
        out.push(format!("fallback {} unavailable: {}", r.symbol, r.if_missing));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without session uprobes: uv_fs_req_cleanup ends sync calls.
    const AT_CLEANUP: Conditions = Conditions { sync_at_return: false, io_uring: true, waits_by_uprobe: false, work_batch: true };

    fn plan_on(
        libuv: &HashMap<&'static str, u64>,
        libc: Option<&HashMap<&'static str, u64>>,
        detail: Detail,
        ends: Conditions,
    ) -> Vec<ProbeStatus> {
        plan_symbols(Symbols { libuv, libc, v8: None }, detail, ends)
    }

    fn get(pl: &[ProbeStatus], s: &str) -> (ProbeState, Option<u64>) {
        let r = pl.iter().find(|p| p.symbol == s).unwrap();
        (r.state.clone(), r.offset)
    }

    /// Every libuv symbol of the catalog (no fallback), plus the exported
    /// API's that stand in for them.
    fn full_libuv() -> HashMap<&'static str, u64> {
        catalog::all_probes()
            .iter()
            .filter(|p| p.image == ImageKind::Libuv && p.fallback_for.is_none())
            .map(|p| (p.symbol, 0x1000))
            .chain([("uv_freeaddrinfo", 0x2000), ("uv_run", 0x3000)])
            .collect()
    }

    #[test]
    fn plan_uses_fallbacks_only_when_needed() {
        let full = full_libuv();
        let libc: HashMap<&'static str, u64> = [("getaddrinfo", 0x10)].into();
        let plan_full = plan_on(&full, Some(&libc), Detail::all(), AT_CLEANUP);
        assert_eq!(get(&plan_full, "uv_run"), (ProbeState::NotNeeded, None));
        assert_eq!(get(&plan_full, "getaddrinfo"), (ProbeState::NotNeeded, None));
        assert_eq!(get(&plan_full, "uv__io_poll"), (ProbeState::Usable, Some(0x1000)));

        // Stripped: only the exported API.
        let stripped: HashMap<&'static str, u64> = full.iter().filter(|(k, _)| !k.starts_with("uv__")).map(|(k, v)| (*k, *v)).collect();
        let plan_s = plan_on(&stripped, Some(&libc), Detail::all(), AT_CLEANUP);
        assert_eq!(get(&plan_s, "uv__io_poll"), (ProbeState::Missing, None));
        assert_eq!(get(&plan_s, "uv_run"), (ProbeState::Usable, Some(0x3000)));
        assert_eq!(get(&plan_s, "uv_freeaddrinfo"), (ProbeState::Usable, Some(0x2000)));
        assert_eq!(get(&plan_s, "getaddrinfo"), (ProbeState::Usable, Some(0x10)));
        assert_eq!(get(&plan_on(&stripped, None, Detail::all(), AT_CLEANUP), "getaddrinfo").0, ProbeState::Missing);
        assert!(epoll_only(&plan_s));
        assert!(!epoll_only(&plan_full));
        // Without llhttp's message callback, no request probe is attached
        // (it would only cost).
        let no_parser: HashMap<&'static str, u64> =
            full.iter().filter(|(k, _)| **k != catalog::HTTP_MESSAGE).map(|(k, v)| (*k, *v)).collect();
        let plan_np = plan_on(&no_parser, Some(&libc), Detail::all(), AT_CLEANUP);
        assert_eq!(get(&plan_np, "uv_try_write"), (ProbeState::NotNeeded, None));
        assert_eq!(get(&plan_np, catalog::HTTP_MESSAGE), (ProbeState::Missing, None));
    }

    #[test]
    fn short_notices_say_each_loss_once_in_words_and_name_no_symbol() {
        let full = full_libuv();
        let libc: HashMap<&'static str, u64> = [("getaddrinfo", 0x10)].into();
        let stripped: HashMap<&'static str, u64> = full.iter().filter(|(k, _)| !k.starts_with("uv__")).map(|(k, v)| (*k, *v)).collect();
        // No V8 image: no GC point at all.
        let report = plan_on(&stripped, Some(&libc), Detail::all(), AT_CLEANUP);
        let short = short_notices(&report);
        let lost: Vec<&ProbeStatus> = report
            .iter()
            .filter(|r| matches!(r.state, ProbeState::Missing) && r.fallback_for.is_none() && r.kind != probe_kind::PROBE_GC)
            .collect();
        assert!(!lost.is_empty());
        for r in &lost {
            assert_eq!(short.iter().filter(|l| *l == r.if_missing).count(), 1, "{} said once: {short:#?}", r.symbol);
        }
        for l in &short {
            assert!(!l.contains("_ZN") && !l.starts_with("fallback"), "{l}");
            assert!(!report.iter().any(|r| l.starts_with(r.symbol)), "a line names a probe: {l}");
        }
        let no_gc = short.iter().filter(|l| l.starts_with("no V8 garbage collections")).count();
        assert_eq!(no_gc, 1, "{short:#?}");
        assert!(!short.iter().any(|l| l.contains("GC points stand in")), "{short:#?}");
        // V8's collections seen through the fallbacks: not said.
        let v8: HashMap<&'static str, u64> = catalog::GC_V10.iter().map(|s| (*s, 0x10)).collect();
        let report = plan_symbols(Symbols { libuv: &full, libc: Some(&libc), v8: Some(&v8) }, Detail::all(), AT_CLEANUP);
        assert!(gc_probed(&report));
        let short = short_notices(&report);
        assert!(!short.iter().any(|l| l.contains("garbage collections") || l.contains("GC points")), "{short:#?}");
    }

    #[test]
    fn cleanup_only_while_something_ends_there() {
        let full: HashMap<&'static str, u64> =
            catalog::all_probes().iter().filter(|p| p.image == ImageKind::Libuv).map(|p| (p.symbol, 0x1000)).collect();
        let no_done: HashMap<&'static str, u64> = full.iter().filter(|(k, _)| **k != "uv__fs_done").map(|(k, v)| (*k, *v)).collect();
        let cleanup = |syms: &HashMap<&'static str, u64>, sync_at_return, io_uring| {
            get(
                &plan_on(syms, None, Detail::default(), Conditions { sync_at_return, io_uring, waits_by_uprobe: false, work_batch: true }),
                "uv_fs_req_cleanup",
            )
            .0
        };
        // Sync calls end at their return, async ones at uv__fs_done: none left.
        assert_eq!(cleanup(&full, true, false), ProbeState::NotNeeded);
        // Sync calls end there (no session uprobes), or async requests may
        // complete through io_uring, or uv__fs_done is missing.
        assert_eq!(cleanup(&full, false, false), ProbeState::Usable);
        assert_eq!(cleanup(&full, true, true), ProbeState::Usable);
        assert_eq!(cleanup(&no_done, true, false), ProbeState::Usable);
    }

    #[test]
    fn v8_gc_needs_the_callbacks_or_all_of_v8_10_2_s_points() {
        let gc: Vec<Probe> = catalog::all_probes().into_iter().filter(|p| p.kind == probe_kind::PROBE_GC).collect();
        assert_eq!(gc.iter().map(|p| p.cookie).collect::<Vec<_>>(), [0, 1, 0, 1, 2, 3, 4, 5], "each point's start, then its end");
        assert!(gc.iter().all(|p| p.image == ImageKind::V8));
        let base: HashMap<&'static str, u64> = catalog::all_probes()
            .iter()
            .filter(|p| p.image == ImageKind::Libuv && p.fallback_for.is_none())
            .map(|p| (p.symbol, 0x1000))
            .collect();
        let syms = |names: &[&'static str]| -> HashMap<&'static str, u64> { names.iter().map(|s| (*s, 0x2000)).collect() };
        let with = |names: &[&'static str]| -> Vec<ProbeStatus> {
            let mut all = base.clone();
            all.extend(syms(names));
            plan_on(&all, None, Detail::default(), AT_CLEANUP)
        };
        let v10_states = |p: &[ProbeStatus]| catalog::GC_V10.iter().map(|s| get(p, s).0).collect::<Vec<_>>();
        // Node 20-26: the callbacks; V8 10.2's points are not needed (20-26 have some).
        let callbacks = with(&[catalog::GC_PROLOGUE, catalog::GC_EPILOGUE]);
        assert!(gc_probed(&callbacks));
        assert!(v10_states(&callbacks).iter().all(|s| *s == ProbeState::NotNeeded));
        let mut both = vec![catalog::GC_PROLOGUE, catalog::GC_EPILOGUE];
        both.extend(catalog::GC_V10);
        assert!(v10_states(&with(&both)).iter().all(|s| *s == ProbeState::NotNeeded));
        // One callback alone is no GC (no durations).
        assert!(!gc_probed(&with(&[catalog::GC_PROLOGUE])));
        // Node 18: all six of V8 10.2's points, or none of them.
        let v10 = with(&catalog::GC_V10);
        assert!(gc_probed(&v10));
        assert!(v10_states(&v10).iter().all(|s| *s == ProbeState::Usable));
        assert_eq!(get(&v10, catalog::GC_PROLOGUE).0, ProbeState::Missing);
        assert!(!gc_probed(&with(&catalog::GC_V10[..5])));
        // None (a stripped Node 24): missing, said so.
        let none = with(&[]);
        assert!(!gc_probed(&none));
        assert!(gc.iter().all(|p| get(&none, p.symbol).0 == ProbeState::Missing));
        // V8 in libnode.so beside a shared libuv.so: looked up there.
        let libnode = syms(&catalog::GC_V10);
        let deb = plan_symbols(Symbols { libuv: &base, libc: None, v8: Some(&libnode) }, Detail::default(), AT_CLEANUP);
        assert!(gc_probed(&deb));
        assert_eq!(get(&deb, catalog::GC_PAUSE_END), (ProbeState::Usable, Some(0x2000)));
    }

    #[test]
    fn libc_epoll_waits_only_where_uprobes_see_them() {
        let full: HashMap<&'static str, u64> =
            catalog::all_probes().iter().filter(|p| p.image == ImageKind::Libuv).map(|p| (p.symbol, 0x1000)).collect();
        let libc: HashMap<&'static str, u64> = [("epoll_wait", 0x10), ("epoll_pwait", 0x20)].into();
        let states = |libc: Option<&HashMap<&'static str, u64>>, waits_by_uprobe| {
            let c = Conditions { waits_by_uprobe, ..AT_CLEANUP };
            let p = plan_on(&full, libc, Detail::default(), c);
            [get(&p, "epoll_wait"), get(&p, "epoll_pwait")]
        };
        assert_eq!(states(Some(&libc), true), [(ProbeState::Usable, Some(0x10)), (ProbeState::Usable, Some(0x20))]);
        // fentry sees them (or the tracepoints do): not attached.
        assert_eq!(states(Some(&libc), false), [(ProbeState::NotNeeded, None), (ProbeState::NotNeeded, None)]);
        // No libc found: said missing (the tracepoints take over).
        assert_eq!(states(None, true), [(ProbeState::Missing, None), (ProbeState::Missing, None)]);
        let p = plan_on(&full, Some(&libc), Detail::default(), Conditions { waits_by_uprobe: true, ..AT_CLEANUP });
        assert!(p.iter().filter(|r| r.kind == probe_kind::PROBE_EPOLL_WAIT).all(|r| r.image == ImageKind::Libc));
    }

    #[test]
    fn default_plan_is_the_cheap_set() {
        let full: HashMap<&'static str, u64> =
            catalog::all_probes().iter().filter(|p| p.image != ImageKind::Libc).map(|p| (p.symbol, 0x1000)).collect();
        let libc: HashMap<&'static str, u64> = [("getaddrinfo", 0x10)].into();
        let attached_on = |syms: &HashMap<&'static str, u64>, d: Detail, ends: Conditions| -> Vec<&'static str> {
            let mut v: Vec<_> = plan_on(syms, Some(&libc), d, ends)
                .into_iter()
                .filter(|r| r.state == ProbeState::Usable && r.kind != probe_kind::PROBE_FS_SUBMIT)
                .map(|r| r.symbol)
                .collect();
            v.sort();
            v
        };
        let attached = |d: Detail| attached_on(&full, d, AT_CLEANUP);
        // Per async fs request: submit and uv_fs_req_cleanup; per DNS
        // lookup: submit; per batch of finished jobs one hit; per V8
        // garbage collection its two callbacks; no probe per loop iteration.
        assert_eq!(
            attached(Detail::default()),
            [catalog::GC_EPILOGUE, catalog::GC_PROLOGUE, catalog::WORK_BATCH, "uv_fs_req_cleanup", "uv_getaddrinfo"]
        );
        // Without the batch point (not found, or turned off): a hit per finished job.
        let mut no_batch = full.clone();
        no_batch.remove(catalog::WORK_BATCH);
        for (syms, ends) in [(&no_batch, AT_CLEANUP), (&full, Conditions { work_batch: false, ..AT_CLEANUP })] {
            assert_eq!(
                attached_on(syms, Detail::default(), ends),
                [catalog::GC_EPILOGUE, catalog::GC_PROLOGUE, "uv__fs_done", "uv__getaddrinfo_done", "uv_fs_req_cleanup", "uv_getaddrinfo"]
            );
        }
        let tp = attached(Detail::from_kinds(&[DetailKind::Threadpool]));
        assert!(tp.contains(&"uv__fs_work") && tp.contains(&"uv_async_send") && !tp.contains(&"uv__io_poll"));
        let ph = attached(Detail::from_kinds(&[DetailKind::Phases]));
        assert!(ph.contains(&"uv__io_poll") && ph.contains(&"uv__run_timers") && !ph.contains(&"uv__fs_work"));
        assert_eq!(attached(Detail::from_kinds(&[DetailKind::All]).with_requests(false)).len(), 13);
        // Request context: where HTTP/1 messages begin (one hit per
        // message), stream callbacks, writes, and node's timers/immediates (which fire only
        // when JS timers or immediates run) and handle closes; the HTTP/2
        // stream points (which HTTP/1 requests never reach).
        let rq = attached(Detail::default().with_requests(true));
        for s in [
            "llhttp__on_message_begin",
            "uv__stream_io",
            "uv_try_write",
            "uv_write2",
            "uv_queue_work",
            "SSL_write",
            "nghttp2_submit_response",
            "nghttp2_submit_trailer",
        ] {
            assert!(rq.contains(&s), "{s}");
        }
        assert_eq!(rq.len(), 5 + 16 + 6);
        // Outgoing HTTP/2 streams: with session uprobes only (the stream id
        // is the return value); without them, said so.
        let at_return = Conditions { sync_at_return: true, ..AT_CLEANUP };
        let rq_session = plan_on(&full, Some(&libc), Detail::default().with_requests(true), at_return);
        assert_eq!(get(&rq_session, catalog::H2_SUBMIT), (ProbeState::Usable, Some(0x1000)));
        let rq_plain = plan_on(&full, Some(&libc), Detail::default().with_requests(true), AT_CLEANUP);
        assert!(matches!(get(&rq_plain, catalog::H2_SUBMIT).0, ProbeState::Failed(e) if e.contains("session uprobes")));
        let off = plan_on(&full, Some(&libc), Detail::default(), AT_CLEANUP);
        assert_eq!(get(&off, "uv__run_check").0, ProbeState::Off(DetailKind::Phases));
        assert!(epoll_only(&off));
    }
}
