//! The kernel side from Rust: load bpf/uvspan.bpf.c, attach the catalog's
//! probes to a libuv image ([`attach`]), manage the set of traced
//! processes, read the ring buffer and the counters, detach ([`detach`]).

mod attach;
mod detach;

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{AsRawLibbpf, Link, MapCore, MapFlags, MapHandle, OpenObject, RingBuffer, RingBufferBuilder};

pub use attach::Attach;
use attach::{Attached, FileId};
use detach::{detach_all, Detacher};

use crate::kernel::core_btf::CoreBtf;
use crate::kernel::diagnose::{self, Stage};
use crate::kernel::features::{self, Features};
use crate::kernel::skel::types::{req_key, stat_idx, traced_flags};
use crate::kernel::skel::{OpenUvspanSkel, UvspanSkel, UvspanSkelBuilder};
use crate::probes::catalog::Detail;
use crate::probes::plan::{self, ProbeStatus};

/// Settings fixed at load time.
#[derive(Clone, Debug)]
pub struct Settings {
    pub loop_threshold: Duration,
    /// Trace children forked by traced processes (`-- COMMAND`, and --pid's
    /// descendants).
    pub follow_forks: bool,
    /// The children followed are covered by probes attached for every
    /// process of their file (`-- COMMAND`), not attached one by one as
    /// they are found (--pid): their epoll waits cannot be libc uprobes
    /// attached per process.
    pub children_by_file: bool,
    /// Report every exec on the host (--all).
    pub discover: bool,
    /// Ring buffer bytes (power of two).
    pub ring_buffer_size: u32,
    /// Optional probe groups (--detail).
    pub detail: Detail,
    /// Benchmark only: probe programs return at once (UVSPAN_BENCH_TRAP_ONLY=1).
    pub trap_only: bool,
    /// With `trap_only` (else 0): ns each entry hit spins (benchmark only).
    pub trap_spin_ns: u64,
    /// --sample-time: uprobes live only in sampling windows
    /// ([`Tracer::close_window`], [`Tracer::open_window`]).
    pub sampling: bool,
    /// --stacks: sample loop threads during slow iterations.
    pub stacks: bool,
    /// --stacks all-ops: the user stack at each fs/DNS submit.
    pub stacks_all_ops: bool,
    /// uvspan's PID namespace when it is not the initial one: the kernel
    /// side gives every id as uvspan sees it.
    pub pidns: Option<crate::discover::pidns::PidNs>,
    /// The trace sampler decided in the kernel (None: in user space).
    pub kernel_sampling: Option<KernelSampling>,
    /// The operation histograms' bucket bounds (s) per `enum hist_family`:
    /// fs, DNS, threadpool queue wait, HTTP server requests.
    pub hist_bounds: [&'static [f64]; 4],
    /// --publish-trace-context: the pinned map's fd (open while the
    /// tracer loads) and the run's key of the ids (bpf/ops.h: ctx_ids).
    pub publish_ctx: Option<(i32, [u64; 2])>,
}

/// The trace sampler as the kernel runs it where traces start
/// (`ksample_*`, bpf/common.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSampling {
    /// Requests (HTTP/1.x heads).
    pub requests: bool,
    /// With `requests`: an unsampled HTTP/1 request is followed in the
    /// kernel to its end and counted there, no record sent
    /// (bpf/http_follow.h).
    pub follow_requests: bool,
    /// Tasks (each a trace of its own).
    pub tasks: bool,
    /// An incoming traceparent's flag decides.
    pub parent_based: bool,
    /// A trace's 56 random bits are kept when at least this.
    pub threshold: u64,
    /// Tail exceptions (`--keep-errors`, `--keep-slower-than`): with
    /// `follow_requests`, a followed request's records are sent marked
    /// held, and its end in the kernel says whether they go on.
    pub tail: Option<crate::requests::Tail>,
}

/// Kernel-side counters (summed over CPUs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Records lost in the kernel: ring buffer full, an async request
    /// not tracked because the in-flight table was full, or a finished job
    /// past the most one batch of them is walked (UVSPAN_BATCH_WALK).
    pub records_lost: u64,
    pub loop_iterations: u64,
    pub loop_emitted: u64,
    pub inflight_replaced: u64,
    /// --sample-time: operations that crossed a window edge, dropped.
    pub straddled: u64,
    pub stack_samples: u64,
    /// --stacks: how many times the sampler went on (a loop thread slow);
    /// None before the sampler started.
    pub sampler_on: Option<u64>,
    /// Async requests in flight in a thread's own state when it exited
    /// (those in the in-flight table are counted at their process's exit).
    pub unfinished_in_threads: u64,
    /// Operations of traces the kernel's sampler dropped: counted in its
    /// histograms, no record sent.
    pub unsampled_ops: u64,
    /// Operations of unsampled traces not counted: the histogram map was full.
    pub hist_full: u64,
    /// Unsampled HTTP requests the kernel followed to their end and
    /// counted (no record); those uvspan ends itself are not in it.
    pub followed_requests: u64,
    /// Request headers of HTTP/2 streams dropped as roots and then sampled
    /// by their traceparent, past the ones a stream saves: not sent.
    pub h2_headers_unsent: u64,
    /// Reads of a client connection while two causes waited for replies
    /// there (pipelined commands of several requests): tasks of their own.
    pub mixed_reads: u64,
    /// Replies a client connection read after the request that wrote
    /// there had answered (a pooled connection handed on): tasks of their
    /// own, not that request's.
    pub after_answer: u64,
}

/// One entry of the kernel's operation histograms (`op_hists`): a
/// process's operations of one family and attribute set, summed over CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelOps {
    pub pid: u32,
    /// `enum hist_family`: 0 fs, 1 DNS, 2 threadpool queue wait.
    pub family: u8,
    /// fs: the catalog operation; queue wait: the job's family.
    pub op_id: u8,
    pub sync: bool,
    /// HTTP: the request's minor version (HTTP/1.ver), or 2 (HTTP/2).
    pub ver: u8,
    /// fs: the negative errno; DNS: the UV_EAI_* code; 0: success; HTTP:
    /// the status (0: none).
    pub err: i32,
    pub count: u64,
    pub sum_ns: u64,
    pub buckets: Vec<u64>,
}

/// How the loop threads' epoll waits are seen (the epoll path: loop
/// iterations without phase probes). Best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waits {
    /// fentry/fexit on the epoll system calls: only epoll calls pay.
    Fentry,
    /// The kernel refuses fentry: session uprobes on each traced process's
    /// libc `epoll_wait`/`epoll_pwait` (only that process's waits pay); the
    /// system call tracepoints for a process whose libc cannot be probed.
    LibcUprobes,
    /// The system call tracepoints: every system call on the host passes
    /// them while uvspan runs (no fentry, and no session uprobes or a
    /// `-- COMMAND`, whose descendants start after attach).
    Tracepoints,
}

impl Waits {
    fn choose(f: Features, children_by_file: bool) -> Waits {
        if f.fentry {
            Waits::Fentry
        } else if f.session && !children_by_file {
            Waits::LibcUprobes
        } else {
            Waits::Tracepoints
        }
    }
}

pub struct Tracer {
    skel: UvspanSkel<'static>,
    /// The same object opened again for the uprobe dispatcher alone
    /// (`uv_multi` or `uv_single`), `skel`'s maps its: see
    /// [`Tracer::open_and_load`]. Its `.bss` is the one to write: libbpf
    /// maps a global-data map's memory into the copy that made the map, and
    /// leaves `skel`'s (which reuses it) on its unmapped initial image.
    dispatcher: UvspanSkel<'static>,
    /// Multi-uprobe links available (one link per image: fast attach and detach).
    multi: bool,
    /// The fs submit probes are session uprobes: sync calls end at their
    /// return (see the BPF side's uv_session).
    session: bool,
    detail: Detail,
    /// Uprobe links per (file, pid filter), with what was attached there;
    /// dropped = detached. A file is attached once per pid filter, however
    /// many processes map it and whichever path they reach it by.
    uprobes: HashMap<(FileId, i32), Attached>,
    /// Epoll (fentry) and process lifecycle links.
    _global: Vec<Link>,
    waits: Waits,
    /// The system call tracepoint links, when some process's waits go
    /// through them (attached at load for [`Waits::Tracepoints`], on demand
    /// for [`Waits::LibcUprobes`]).
    syscall_links: Vec<Link>,
    /// [`Waits::LibcUprobes`]: each traced process's libc epoll links. Not
    /// detached with --sample-time's windows (the epoll path stays on).
    wait_links: HashMap<u32, Vec<Link>>,
    /// Detaches the links of exited processes off the ring buffer's thread
    /// (see [`Detacher`]).
    detacher: Detacher,
    /// --stacks: the sampling link per CPU (each owns its perf event fd),
    /// opened with the first traced process.
    samplers: Vec<Link>,
    /// --stacks: turns the samplers on while a loop thread is slow.
    sampler_gate: Option<crate::kernel::sampler::Gate>,
    stacks: bool,
    /// --stacks: the samplers go on once an iteration is busy this long.
    sampler_lead: Duration,
    notices: Vec<String>,
    /// --sample-time: the uprobes are detached now.
    window_closed: bool,
    /// In-flight operations removed when a window closed (they straddle it).
    swept: u64,
}

/// libbpf's latest messages (bounded), read for the program and the
/// verifier's verdict when a load fails ([`diagnose::refusal`]).
static LIBBPF_SAID: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());
const LIBBPF_SAID_MAX: usize = 64 * 1024;

fn keep_libbpf(m: &str) {
    let mut said = LIBBPF_SAID.lock().unwrap_or_else(|e| e.into_inner());
    if said.len() + m.len() > LIBBPF_SAID_MAX {
        let cut = said.len().saturating_sub(LIBBPF_SAID_MAX / 2);
        let cut = (cut..said.len()).find(|&i| said.is_char_boundary(i)).unwrap_or(said.len());
        said.drain(..cut);
    }
    said.push_str(&m[..m.len().min(LIBBPF_SAID_MAX / 2)]);
}

/// libbpf's own messages go to stderr only with UVSPAN_DEBUG=1; they are
/// kept either way for the error line of a failed load.
fn quiet_libbpf() {
    let debug = std::env::var_os("UVSPAN_DEBUG").is_some_and(|v| v != "0");
    let cb: libbpf_rs::PrintCallback = if debug {
        |_, m| {
            eprint!("{m}");
            keep_libbpf(&m);
        }
    } else {
        |_, m| keep_libbpf(&m)
    };
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, cb)));
}

impl Tracer {
    pub fn load(settings: &Settings) -> Result<Tracer> {
        quiet_libbpf();
        let known = features::remembered();
        let mut fentry_refused = known.as_ref().and_then(|r| r.fentry_refused);
        let candidates: Vec<Features> = match &known {
            Some(r) => std::iter::once(r.features).chain(features::ORDER).collect(),
            // Not known on this boot: a refused fentry is found out by a
            // small program, not by failing a whole load.
            None => match features::fentry_loads() {
                Some(Err(errno)) => {
                    fentry_refused = Some(errno);
                    features::ORDER.into_iter().filter(|f| !f.fentry).collect()
                }
                _ => features::ORDER.to_vec(),
            },
        };
        let mut last = None;
        for f in candidates {
            match Self::load_with(settings, f) {
                Ok(mut t) => {
                    if known.as_ref().map(|r| r.features) != Some(f) {
                        features::remember(f, fentry_refused.filter(|_| !f.fentry));
                    }
                    if !f.fentry {
                        t.notices.push(features::fallback_notice(
                            fentry_refused,
                            t.waits == Waits::LibcUprobes,
                            std::fs::read_to_string("/sys/kernel/security/lockdown")
                                .ok()
                                .and_then(|f| features::lockdown_mode(&f))
                                .as_deref(),
                        ));
                    }
                    return Ok(t);
                }
                Err((stage, e, errno)) => {
                    if f.fentry && fentry_refused.is_none() {
                        fentry_refused = errno;
                    }
                    last = Some((stage, e, errno));
                }
            }
        }
        let (stage, context, errno) = last.expect("ORDER is not empty");
        let said = diagnose::refusal(&LIBBPF_SAID.lock().unwrap_or_else(|e| e.into_inner()));
        Err(anyhow!(diagnose::explain_refusal(stage, errno, &diagnose::Facts::read(), said.as_ref())).context(context))
    }

    /// Loads and attaches the kernel side with these features; on failure,
    /// what was being done and the errno.
    fn load_with(settings: &Settings, f: Features) -> std::result::Result<Tracer, (Stage, String, Option<i32>)> {
        let failed = |stage, what: String, e: libbpf_rs::Error| {
            let errno = diagnose::errno_of(&e, std::io::Error::last_os_error());
            (stage, what, errno)
        };
        let (skel, dispatcher) =
            Self::open_and_load(settings, f).map_err(|e| failed(Stage::Load, "loading the eBPF programs".into(), e))?;
        let p = &skel.progs;
        let waits = Waits::choose(f, settings.children_by_file);
        // All attached by BTF id: no tracefs needed.
        let epoll = if f.fentry {
            [
                &p.fentry_epoll_wait,
                &p.fexit_epoll_wait,
                &p.fentry_epoll_pwait,
                &p.fexit_epoll_pwait,
                &p.fentry_epoll_pwait2,
                &p.fexit_epoll_pwait2,
            ]
            .to_vec()
        } else {
            Vec::new()
        };
        let mut global = Vec::new();
        for prog in epoll.into_iter().chain([&p.proc_fork, &p.proc_exec, &p.proc_exit]) {
            let name = prog.name().to_string_lossy().into_owned();
            let link = prog.attach().map_err(|e| failed(Stage::AttachRawTracepoint, format!("attaching {name}"), e))?;
            global.push(link);
        }
        let syscall_links = match waits {
            Waits::Tracepoints => attach_syscall_tracepoints(&skel).map_err(|(what, e)| failed(Stage::AttachRawTracepoint, what, e))?,
            _ => Vec::new(),
        };
        Ok(Tracer {
            skel,
            dispatcher,
            multi: f.multi_uprobe,
            session: f.session,
            detail: settings.detail,
            uprobes: HashMap::new(),
            _global: global,
            waits,
            syscall_links,
            wait_links: HashMap::new(),
            detacher: Detacher::default(),
            samplers: Vec::new(),
            sampler_gate: None,
            stacks: settings.stacks,
            // Half the threshold (at least 1 ms): on by the time an
            // iteration reaches it, the gate looking that often.
            sampler_lead: sampler_lead(settings.loop_threshold),
            notices: Vec::new(),
            window_closed: false,
            swept: 0,
        })
    }

    /// What the user should know about how the kernel side runs here (said
    /// once at start).
    pub fn notices(&self) -> &[String] {
        &self.notices
    }

    /// Loads the programs for features `f`. The uprobe dispatcher is most
    /// of the kernel's verifying time: it loads from a copy of the object of
    /// its own, which makes the maps, on a thread of its own, while this
    /// thread loads the other programs from a copy whose maps are those.
    /// Both relocate against the kernel types the object names
    /// ([`CoreBtf`]), not the whole of the kernel's BTF.
    fn open_and_load(
        settings: &Settings,
        f: Features,
    ) -> std::result::Result<(UvspanSkel<'static>, UvspanSkel<'static>), libbpf_rs::Error> {
        let mut core = CoreBtf::new();
        let mut dispatcher = Self::open_configured(settings, f, core.as_ref())?;
        if core.as_ref().is_some_and(|c| c.fill(&dispatcher).is_err()) {
            // Not written: relocate against the whole of the kernel's BTF.
            core = None;
            dispatcher = Self::open_configured(settings, f, None)?;
        }
        for mut prog in dispatcher.open_object_mut().progs_mut() {
            prog.set_autoload(false);
        }
        dispatcher.progs.uv_single.set_autoload(!f.multi_uprobe);
        dispatcher.progs.uv_multi.set_autoload(f.multi_uprobe);
        let mut main = Self::open_configured(settings, f, core.as_ref())?;
        main.progs.uv_single.set_autoload(false);
        main.progs.uv_multi.set_autoload(false);
        // The maps made (and the load-time constants frozen) before either
        // loads a program.
        if let Some((fd, _)) = settings.publish_ctx {
            // SAFETY: the pinned map's fd, open (crate::kernel::trace_ctx)
            // for the whole run; reuse_fd duplicates it.
            dispatcher.maps.traces_ctx_v1.reuse_fd(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })?;
        }
        let object = dispatcher.open_object_mut().as_libbpf_object().as_ptr();
        // SAFETY: `object` is the dispatcher's live bpf_object, opened and
        // not yet prepared or loaded.
        let rc = unsafe { libbpf_rs::libbpf_sys::bpf_object__prepare(object) };
        if rc != 0 {
            return Err(libbpf_rs::Error::from_raw_os_error(rc.saturating_neg()));
        }
        let fds: HashMap<std::ffi::OsString, i32> = dispatcher
            .open_object()
            .maps()
            // SAFETY: a map of the dispatcher's prepared object: bpf_map__fd
            // reads its fd.
            .map(|m| (m.name().to_os_string(), unsafe { libbpf_rs::libbpf_sys::bpf_map__fd(m.as_libbpf_object().as_ptr()) }))
            .collect();
        for mut m in main.open_object_mut().maps_mut() {
            let fd =
                fds.get(m.name()).copied().filter(|fd| *fd >= 0).ok_or_else(|| {
                    libbpf_rs::Error::from(std::io::Error::other(format!("map {} was not made", m.name().to_string_lossy())))
                })?;
            // SAFETY: the fd is the dispatcher object's map's, open until
            // that object is closed, after this call (reuse_fd duplicates it).
            m.reuse_fd(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })?;
        }
        let dispatcher = AssertSend(dispatcher);
        let loading = std::thread::Builder::new()
            .name("uvspan-load".into())
            .spawn(move || dispatcher.into_inner().load().map(AssertSend))
            .map_err(libbpf_rs::Error::from)?;
        let main = main.load();
        let dispatcher = loading.join().map_err(|_| libbpf_rs::Error::from(std::io::Error::other("the loading thread panicked")))?;
        Ok((main?, dispatcher?.into_inner()))
    }

    /// The object opened with uvspan's settings, the programs these
    /// features use marked for loading (all but the dispatcher, which
    /// [`Tracer::open_and_load`] marks in its own copy).
    fn open_configured(
        settings: &Settings,
        f: Features,
        core: Option<&CoreBtf>,
    ) -> std::result::Result<OpenUvspanSkel<'static>, libbpf_rs::Error> {
        // The skeleton borrows its object for its whole life; uvspan keeps one
        // tracer for the whole run, so the object is leaked on purpose.
        let object: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut builder = UvspanSkelBuilder::default();
        if let Some(core) = core {
            builder.obj_builder.btf_custom_path(core.path())?;
        }
        let mut open = builder.open(object)?;
        let timed = times_hits(f.multi_uprobe);
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.loop_threshold_ns = settings.loop_threshold.as_nanos().min(u128::from(u64::MAX)) as u64;
            ro.follow_forks = u32::from(settings.follow_forks);
            ro.discover = u32::from(settings.discover);
            ro.trap_only = u32::from(settings.trap_only);
            ro.trap_spin_ns = settings.trap_spin_ns;
            // Benchmark only: the loop split reads the thread's CPU time as the
            // scheduler last updated it, without the catch-up (bpf/loop.h).
            ro.sched_catchup = u32::from(std::env::var_os("UVSPAN_BENCH_SCHED_RAW").is_none_or(|v| v != "1"));
            ro.count_hits = u32::from(bench_count_hits());
            ro.time_hits = u32::from(timed);
            ro.requests = u32::from(settings.detail.requests);
            ro.sampling = u32::from(settings.sampling);
            // bpf/common.h: ops_local.
            ro.ops_local = u32::from(!settings.sampling && !settings.detail.threadpool);
            ro.stacks_all_ops = u32::from(settings.stacks_all_ops);
            ro.gate_lead_ns = u64::try_from(sampler_lead(settings.loop_threshold).as_nanos()).unwrap_or(u64::MAX);
            if let Some(k) = settings.kernel_sampling {
                ro.ksample_requests = u32::from(k.requests);
                ro.khttp = u32::from(k.requests && k.follow_requests);
                ro.ksample_tasks = u32::from(k.tasks);
                ro.ksample_parent = u32::from(k.parent_based);
                ro.ksample_threshold = k.threshold;
                if let Some(t) = k.tail.filter(|_| k.requests && k.follow_requests) {
                    ro.ktail = 1;
                    ro.ktail_errors = u32::from(t.errors);
                    ro.ktail_slow_ns = t.slower_than_ns.unwrap_or(u64::MAX);
                }
            }
            for (family, bounds) in ro.hist_bounds_ns.iter_mut().zip(settings.hist_bounds) {
                for (i, b) in family.iter_mut().enumerate() {
                    // Unused: 2^62, over any duration (the kernel's bucket search needs bounds below 2^62).
                    *b = bounds.get(i).map_or(1 << 62, |s| ((s * 1e9).round() as u64).min(1 << 62));
                }
            }
            if let Some(ns) = settings.pidns {
                ro.pidns_dev = ns.dev;
                ro.pidns_ino = ns.ino;
            }
            if let Some((_, key)) = settings.publish_ctx {
                ro.publish_ctx = 1;
                ro.ctx_key = key;
            }
            // Wake the reader once a quarter of the buffer (at most 256 KiB) is waiting.
            ro.wakeup_bytes = u64::from(settings.ring_buffer_size / 4).min(256 * 1024);
        }
        let p = &mut open.progs;
        for prog in [
            &mut p.fentry_epoll_wait,
            &mut p.fexit_epoll_wait,
            &mut p.fentry_epoll_pwait,
            &mut p.fexit_epoll_pwait,
            &mut p.fentry_epoll_pwait2,
            &mut p.fexit_epoll_pwait2,
        ] {
            prog.set_autoload(f.fentry);
        }
        p.syscall_enter.set_autoload(!f.fentry);
        p.loop_sample.set_autoload(settings.stacks);
        p.gate_tick.set_autoload(settings.stacks);
        p.syscall_exit.set_autoload(!f.fentry);
        // Load only the programs that will be used: each costs verifier time
        // (the dispatcher's copy is chosen in open_and_load).
        open.progs.uv_session.set_autoload(f.session);
        open.progs.bench_enter.set_autoload(timed);
        open.progs.bench_leave.set_autoload(timed);
        open.maps.events.set_max_entries(settings.ring_buffer_size)?;
        if settings.publish_ctx.is_none() {
            // Off: never used, one entry each.
            open.maps.traces_ctx_v1.set_max_entries(1)?;
            open.maps.ctx_parent.set_max_entries(1)?;
            open.maps.ctx_threads.set_max_entries(1)?;
        }
        Ok(open)
    }

    /// Marks a process as traced: its events pass the kernel-side filter.
    /// `report` is what was attached for it.
    pub fn add_pid(&mut self, pid: u32, report: &[ProbeStatus]) -> Result<()> {
        // Without phase probes (not asked for, or a stripped build), the
        // loop thread's epoll waits delimit iterations.
        let mut flags = traced_flags::TRACED.0 as u8;
        if plan::epoll_only(report) {
            flags |= traced_flags::TRACED_EPOLL_ONLY.0 as u8;
        }
        if plan::gc_probed(report) {
            flags |= traced_flags::TRACED_GC.0 as u8;
        }
        if self.wait_links.contains_key(&pid) {
            flags |= traced_flags::TRACED_WAITS_BY_UPROBE.0 as u8;
        } else {
            // Its libc could not be probed (the report says why).
            self.syscall_tracepoints()?;
        }
        self.skel
            .maps
            .traced
            .update(&pid.to_ne_bytes(), &[flags], MapFlags::ANY)
            .with_context(|| format!("cannot add process {pid} to the traced set"))
    }

    /// A process below a traced one, found already running: its forks are
    /// followed by the kernel from now on. Its flags stay those it has (it
    /// may be in the set already); whether it is Node.js is decided apart
    /// ([`Tracer::add_pid`] once it is attached).
    pub fn follow_pid(&mut self, pid: u32) {
        let flags = traced_flags::TRACED.0 as u8;
        // EEXIST: already followed (a fork the kernel saw), left as it is.
        let _ = self.skel.maps.traced.update(&pid.to_ne_bytes(), &[flags], MapFlags::NO_EXIST);
    }

    /// The system call tracepoints, for processes whose epoll waits no
    /// fentry program or libc uprobe sees (attached once, kept).
    fn syscall_tracepoints(&mut self) -> Result<()> {
        if self.waits == Waits::Fentry || !self.syscall_links.is_empty() {
            return Ok(());
        }
        self.syscall_links = attach_syscall_tracepoints(&self.skel).map_err(|(what, e)| anyhow!("{what}: {e}"))?;
        Ok(())
    }

    /// Forgets a process that exited: its per-pid links (detached off this
    /// thread, see [`Detacher`]), and the requests it had in flight
    /// (returned: how many were dropped unfinished).
    pub fn remove_pid(&mut self, pid: u32) -> u64 {
        let _ = self.skel.maps.traced.delete(&pid.to_ne_bytes());
        if let Some(g) = &self.sampler_gate {
            g.forget(pid);
        }
        let mut gone: Vec<Link> = self.wait_links.remove(&pid).unwrap_or_default();
        self.uprobes.retain(|&(_, p), a| {
            if p == pid as i32 {
                gone.append(&mut a.links);
            }
            p != pid as i32
        });
        if !gone.is_empty() {
            self.detacher.detach(gone);
        }
        // Its operation histograms (read at its exit record).
        let mine: Vec<Vec<u8>> = self.skel.maps.op_hists.keys().filter(|k| k.get(..4).is_some_and(|p| p == pid.to_ne_bytes())).collect();
        for k in mine {
            let _ = self.skel.maps.op_hists.delete(&k);
        }
        self.sweep_inflight(|p| p == pid)
    }

    /// --stacks: the loop thread of `pid` (its main thread) is sampled every
    /// `period_ns` while it runs. The events are per CPU, opened with the
    /// first process, and on only while a traced loop thread is slow
    /// ([`crate::kernel::sampler::Gate`]); the BPF side keeps only traced
    /// loop threads' samples. Nothing to do with --stacks off.
    pub fn sample_loop(&mut self, pid: u32, period_ns: u64) -> Result<()> {
        self.watch_loop(pid);
        if !self.stacks || !self.samplers.is_empty() {
            return Ok(());
        }
        let cpus = crate::kernel::sampler::online_cpus().map_err(|e| anyhow!(diagnose::perf_event(pid, &e)))?;
        let (mut links, mut copies) = (Vec::new(), Vec::new());
        for cpu in cpus {
            let fd = crate::kernel::sampler::open_cpu_clock(cpu, period_ns).map_err(|e| anyhow!(diagnose::perf_event(pid, &e)))?;
            // libbpf owns the fd from here: the link closes it when dropped.
            // The gate's own copy, apart from the link's.
            copies.push(fd.try_clone().map_err(|e| anyhow!(diagnose::perf_event(pid, &e)))?);
            let raw = std::os::fd::IntoRawFd::into_raw_fd(fd);
            let link = self.skel.progs.loop_sample.attach_perf_event(raw).map_err(|e| {
                // SAFETY: libbpf did not take the fd (the attach failed): ours to close.
                unsafe { libc::close(raw) };
                anyhow!("cannot attach the stack sampler on CPU {cpu}: {e}")
            })?;
            links.push(link);
        }
        let loops = MapHandle::try_from(&self.skel.maps.loops).context("cannot read the loop threads' state for the stack sampler")?;
        // What wakes the gate (none: it looks every lead, and says so).
        // Benchmark only: UVSPAN_BENCH_GATE_POLL=1 makes it look every lead.
        let wake = if std::env::var_os("UVSPAN_BENCH_GATE_POLL").is_some_and(|v| v == "1") {
            Err(anyhow!("UVSPAN_BENCH_GATE_POLL=1"))
        } else {
            self.skel.progs.gate_tick.attach().map_err(anyhow::Error::from).and_then(|link| {
                let ring = MapHandle::try_from(&self.skel.maps.gate_wake)?;
                let awake = MapHandle::try_from(&self.skel.maps.gate_awake)?;
                links.push(link);
                Ok(crate::kernel::sampler::Wake { ring, awake })
            })
        };
        let wake = wake
            .map_err(|e| {
                eprintln!(
                    "uvspan: the stack sampler looks at the loops every {:?}, wake-ups that cost uvspan ~1% of a CPU or more on a VM (the timer tracepoint that would wake it only when a loop is slow is not attached: {e})",
                    self.sampler_lead
                )
            })
            .ok();
        let gate = crate::kernel::sampler::Gate::start(copies, loops, self.sampler_lead, wake)
            .context("cannot start the stack sampler's thread")?;
        gate.watch(pid);
        self.sampler_gate = Some(gate);
        self.samplers = links;
        Ok(())
    }

    /// --stacks: the sampler goes on when process `pid`'s loop is slow too
    /// (a descendant of a traced command: its probes are the command's,
    /// attached for every process of the file).
    pub fn watch_loop(&self, pid: u32) {
        if let Some(g) = &self.sampler_gate {
            g.watch(pid);
        }
    }

    /// The optional probe groups this tracer attaches.
    pub fn detail(&self) -> Detail {
        self.detail
    }

    /// Whether the kernel holds loop state for this thread (its event loop
    /// has been seen by the probes).
    /// --publish-trace-context: the threads the kernel side published for.
    pub fn ctx_threads(&self) -> Option<libbpf_rs::MapHandle> {
        libbpf_rs::MapHandle::try_from(&self.skel.maps.ctx_threads).ok()
    }

    /// --publish-trace-context: the kernel side publishes no more (set
    /// before the pinned map is left as found).
    pub fn stop_publishing(&mut self) {
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            bss.ctx_stop = 1;
        }
    }

    pub fn loop_seen(&self, tid: u32) -> bool {
        self.skel.maps.loops.lookup(&tid.to_ne_bytes(), MapFlags::ANY).ok().flatten().is_some()
    }

    /// A loop thread's time as the kernel counts it (since when, kernel
    /// ns; how long blocked in epoll waits since then, a wait in progress
    /// counted up to `now_ns`; the split of its busy parts already ended).
    /// None: no loop seen.
    pub fn loop_time(&self, tid: u32, now_ns: u64) -> Option<crate::kernel::skel::types::loop_time> {
        let bytes = self.skel.maps.loops.lookup(&tid.to_ne_bytes(), MapFlags::ANY).ok().flatten()?;
        use crate::kernel::skel::types::{loop_state, loop_time};
        let at = std::mem::offset_of!(loop_state, time);
        let mut t = loop_time::default();
        plain::copy_from_bytes(&mut t, bytes.get(at..at + std::mem::size_of::<loop_time>())?).ok()?;
        let at = std::mem::offset_of!(loop_state, epoll_enter);
        let waiting_since = u64::from_ne_bytes(bytes.get(at..at + 8)?.try_into().ok()?);
        if waiting_since > 0 {
            t.idle_ns += now_ns.saturating_sub(waiting_since);
        }
        Some(t)
    }

    /// Processes currently in the kernel-side traced set.
    pub fn traced_count(&self) -> usize {
        self.skel.maps.traced.keys().count()
    }

    /// --sample-time: the window closes, returning when: the BPF side's
    /// flag is set first (the programs do nothing from then on, every probe
    /// at once), then the uprobes are detached (which takes tens of ms, most
    /// of it waiting for RCU grace periods), then the async operations still
    /// in flight are removed, counted: their end will not be seen. The BPF
    /// side drops and counts sync calls still open when their end comes.
    pub fn close_window(&mut self) -> Instant {
        let now = Instant::now();
        if self.window_closed {
            return now;
        }
        self.window_closed = true;
        if let Some(bss) = self.dispatcher.maps.bss_data.as_deref_mut() {
            bss.window_closed = 1;
        }
        let links: Vec<Link> = self.uprobes.values_mut().flat_map(|a| std::mem::take(&mut a.links)).collect();
        detach_all(links);
        self.swept += self.sweep_inflight(|_| true);
        now
    }

    /// --sample-time: the window opens, returning when. The probes of every
    /// attached file are attached again with the BPF side's flag still set
    /// (attaching takes milliseconds, probe by probe); then the flag is
    /// cleared, so every probe goes live at that moment. A file that cannot
    /// be attached any more (its processes are gone) is forgotten.
    pub fn open_window(&mut self) -> Instant {
        if !self.window_closed {
            return Instant::now();
        }
        self.window_closed = false;
        let keys: Vec<(FileId, i32)> = self.uprobes.keys().copied().collect();
        for k in keys {
            let spec = self.uprobes[&k].spec.clone();
            let (links, _failed) = self.attach_probes(&spec.path, spec.pid, &spec.probes);
            if links.is_empty() {
                self.uprobes.remove(&k);
            } else if let Some(a) = self.uprobes.get_mut(&k) {
                a.links = links;
            }
        }
        let now = Instant::now();
        if let Some(bss) = self.dispatcher.maps.bss_data.as_deref_mut() {
            // Causes made before now are stale (see fresh_cause); the
            // generation and the start written before the flag clears.
            bss.window_open_ns = crate::events::clock::monotonic_ns();
            bss.window_gen = bss.window_gen.wrapping_add(1);
            std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
            bss.window_closed = 0;
        }
        now
    }

    /// Removes in-flight async operations whose pid matches; how many.
    fn sweep_inflight(&self, of_pid: impl Fn(u32) -> bool) -> u64 {
        let mut removed = 0;
        for map in [&self.skel.maps.inflight_fs, &self.skel.maps.inflight_dns] {
            let matches = |k: &Vec<u8>| {
                let mut key = req_key::default();
                plain::copy_from_bytes(&mut key, k).is_ok() && of_pid(key.pid)
            };
            let stale: Vec<Vec<u8>> = map.keys().filter(matches).collect();
            for k in stale {
                if map.delete(&k).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }

    /// A ring-buffer reader that hands each raw record to `on_record`.
    pub fn ring_buffer(&self, mut on_record: impl FnMut(&[u8]) + 'static) -> Result<RingBuffer<'static>> {
        let mut b = RingBufferBuilder::new();
        b.add(&self.skel.maps.events, move |data: &[u8]| {
            on_record(data);
            0
        })?;
        Ok(b.build()?)
    }

    pub fn stats(&self) -> Stats {
        let read = |idx: stat_idx| -> u64 {
            self.skel
                .maps
                .stats
                .lookup_percpu(&idx.0.to_ne_bytes(), MapFlags::ANY)
                .ok()
                .flatten()
                .map(|cpus| cpus.iter().map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap_or([0; 8]))).sum())
                .unwrap_or(0)
        };
        Stats {
            records_lost: read(stat_idx::STAT_RINGBUF_LOST) + read(stat_idx::STAT_INFLIGHT_FULL) + read(stat_idx::STAT_BATCH_CUT),
            loop_iterations: read(stat_idx::STAT_LOOP_ITERATIONS),
            loop_emitted: read(stat_idx::STAT_LOOP_EMITTED),
            inflight_replaced: read(stat_idx::STAT_INFLIGHT_REPLACED),
            straddled: read(stat_idx::STAT_STRADDLED) + self.swept,
            unfinished_in_threads: read(stat_idx::STAT_OPS_UNFINISHED),
            stack_samples: read(stat_idx::STAT_STACK_SAMPLES),
            sampler_on: self.sampler_gate.as_ref().map(crate::kernel::sampler::Gate::switched_on),
            unsampled_ops: read(stat_idx::STAT_UNSAMPLED_OPS),
            followed_requests: read(stat_idx::STAT_UNSAMPLED_REQS),
            hist_full: read(stat_idx::STAT_HIST_FULL),
            h2_headers_unsent: read(stat_idx::STAT_H2_UNSENT),
            mixed_reads: read(stat_idx::STAT_MIXED_READS),
            after_answer: read(stat_idx::STAT_AFTER_ANSWER),
        }
    }

    /// The kernel's operation histograms (of unsampled traces), of one
    /// process or all, summed over CPUs; cumulative since each entry was
    /// made.
    pub fn op_hists(&self, pid: Option<u32>) -> Vec<KernelOps> {
        use crate::kernel::skel::types::{op_hist, op_hist_key};
        let map = &self.skel.maps.op_hists;
        let mut out = Vec::new();
        for k in map.keys() {
            let mut key = op_hist_key::default();
            if plain::copy_from_bytes(&mut key, &k).is_err() || pid.is_some_and(|p| p != key.pid) {
                continue;
            }
            let Ok(Some(cpus)) = map.lookup_percpu(&k, MapFlags::ANY) else { continue };
            let mut sum = KernelOps {
                pid: key.pid,
                family: key.family,
                op_id: key.op_id,
                sync: key.sync != 0,
                ver: key.ver,
                err: key.err,
                ..Default::default()
            };
            for v in cpus {
                let mut h = op_hist::default();
                if plain::copy_from_bytes(&mut h, &v).is_err() {
                    continue;
                }
                sum.count += h.count;
                sum.sum_ns += h.sum_ns;
                sum.buckets.resize(h.buckets.len(), 0);
                for (a, b) in sum.buckets.iter_mut().zip(h.buckets) {
                    *a += b;
                }
            }
            out.push(sum);
        }
        out
    }
}

/// An unsampled HTTP/1 request the kernel followed that uvspan ends
/// itself (`http_reqs`): not answered whole, or its process gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowedRequest {
    pub pid: u32,
    /// `enum http_method` (index into [`HTTP_METHODS`]).
    pub method: u8,
    /// HTTP/1.ver
    pub ver: u8,
    pub tls: bool,
    pub status: Option<u16>,
    pub start_ns: u64,
    /// Its last write or work.
    pub end_ns: u64,
    /// Its cause as the kernel keys it (with the sampler's bit).
    pub cause: u64,
    /// Where its response's head was written (0: not yet).
    pub conn: u64,
}

/// `enum http_method` (bpf/uvspan.h), in order.
pub const HTTP_METHODS: [&str; 9] = ["GET", "POST", "PUT", "HEAD", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"];

impl Tracer {
    /// The requests the kernel follows that are over by now (`now_ns`,
    /// kernel time) as the request tracker ends its own (`over`: its
    /// last activity and whether it has a status), or whose process is
    /// `gone`: taken out of the map.
    pub fn followed_over(&self, over: impl Fn(u64, bool) -> bool, gone: Option<u32>) -> Vec<FollowedRequest> {
        use crate::kernel::skel::types::{conn_key, http_req};
        let map = &self.skel.maps.http_reqs;
        let mut out = Vec::new();
        // Listed first: a key deleted while walking would start the walk over.
        let keys: Vec<Vec<u8>> = map.keys().collect();
        for k in keys {
            let mut key = conn_key::default();
            let mut r = http_req::default();
            if plain::copy_from_bytes(&mut key, &k).is_err() {
                continue;
            }
            let Ok(Some(v)) = map.lookup(&k, MapFlags::ANY) else { continue };
            if plain::copy_from_bytes(&mut r, &v).is_err() {
                continue;
            }
            if gone != Some(key.pid) && !over(r.last_ns, r.status != 0) {
                continue;
            }
            // Ended in the kernel meanwhile: it counted it.
            if map.delete(&k).is_err() {
                continue;
            }
            out.push(FollowedRequest {
                pid: key.pid,
                method: r.method,
                ver: r.ver,
                tls: r.tls != 0,
                status: (r.status != 0).then_some(r.status),
                start_ns: r.start_ns,
                end_ns: r.last_ns,
                cause: key.ptr,
                conn: r.conn,
            });
        }
        out
    }

    /// Unsampled HTTP/2 streams the kernel follows (bpf/h2.h) of a process
    /// that is `gone`, or (None) of every process, whose close has not come:
    /// taken out of the kernel's map; how many (not in the metrics: the
    /// kernel counts a stream at its close).
    pub fn h2_followed_open(&self, gone: Option<u32>) -> u64 {
        use crate::kernel::skel::types::{h2_key, h2_state, h2_stream};
        let map = &self.skel.maps.h2_stream_cause;
        let keys: Vec<Vec<u8>> = map.keys().collect();
        let mut open = 0;
        for k in keys {
            let mut key = h2_key::default();
            let mut st = h2_stream::default();
            if plain::copy_from_bytes(&mut key, &k).is_err() || gone.is_some_and(|p| p != key.pid) {
                continue;
            }
            let Ok(Some(v)) = map.lookup(&k, MapFlags::ANY) else { continue };
            if plain::copy_from_bytes(&mut st, &v).is_err() || st.client != 0 || u32::from(st.state) != h2_state::H2_FOLLOWED.0 {
                continue;
            }
            // Closed in the kernel meanwhile: it counted it.
            if map.delete(&k).is_ok() {
                open += 1;
            }
        }
        open
    }
}

/// The system call tracepoint programs, attached; else what failed.
fn attach_syscall_tracepoints(skel: &UvspanSkel<'static>) -> std::result::Result<Vec<Link>, (String, libbpf_rs::Error)> {
    let p = &skel.progs;
    [&p.syscall_enter, &p.syscall_exit]
        .into_iter()
        .map(|prog| prog.attach().map_err(|e| (format!("attaching {}", prog.name().to_string_lossy()), e)))
        .collect()
}

/// Benchmark only (`UVSPAN_BENCH_COUNT_HITS=1`): the kernel counts every
/// uprobe hit by attach point, printed on stderr at exit.
fn bench_count_hits() -> bool {
    std::env::var_os("UVSPAN_BENCH_COUNT_HITS").is_some_and(|v| v == "1")
}

/// Benchmark only (`UVSPAN_BENCH_TIME_HITS=1`, kernels with multi-uprobe
/// links, `multi`): the time inside uvspan's program at each attach point,
/// printed on stderr at exit.
pub(super) fn times_hits(multi: bool) -> bool {
    multi && std::env::var_os("UVSPAN_BENCH_TIME_HITS").is_some_and(|v| v == "1")
}

/// The probe points an attach cookie stands for (`cookie …` if none).
fn cookie_name(base: u64) -> String {
    use crate::kernel::skel::types::{cookie_layout, probe_kind};
    // The batch probe's cookie also says where things are in its image.
    let kind = base >> cookie_layout::COOKIE_KIND_SHIFT.0;
    let base = if kind == u64::from(probe_kind::PROBE_WORK_BATCH.0) { kind << cookie_layout::COOKIE_KIND_SHIFT.0 } else { base };
    let names: Vec<&str> = crate::probes::catalog::all_probes().iter().filter(|p| p.attach_cookie() == base).map(|p| p.symbol).collect();
    if names.is_empty() {
        format!("cookie {base:#x}")
    } else {
        names.join("|")
    }
}

/// Benchmark only: the entries of a map keyed by attach cookie (hit_counts,
/// hit_times), the cookie without COOKIE_ONE_PROCESS and the value as
/// native-endian u64 words.
fn cookie_entries(map: &impl MapCore) -> Vec<(u64, Vec<u64>)> {
    let one_process = 1u64 << crate::kernel::skel::types::cookie_layout::COOKIE_ONE_PROCESS_SHIFT.0;
    let word = |c: &[u8]| <[u8; 8]>::try_from(c).map_or(0, u64::from_ne_bytes);
    map.keys()
        .filter(|k| k.len() == 8)
        .filter_map(|k| {
            let v = map.lookup(&k, MapFlags::ANY).ok().flatten()?;
            Some((word(&k) & !one_process, v.chunks_exact(8).map(word).collect()))
        })
        .collect()
}

impl Tracer {
    /// Benchmark only: one stderr line per timed probe point,
    /// `uvspan: hit-ns NS_PER_HIT TIMED UNORDERED OUTLIERS SYMBOL`, most
    /// timed hits first (see hit_times in bpf/maps.h).
    fn print_hit_times(&self) {
        let mut rows: Vec<([u64; 4], String)> = cookie_entries(&self.skel.maps.hit_times)
            .into_iter()
            .map(|(cookie, v)| {
                let mut t = [0u64; 4];
                t.iter_mut().zip(v).for_each(|(t, v)| *t = v);
                (t, cookie_name(cookie))
            })
            .collect();
        rows.sort_by(|a, b| b.0[0].cmp(&a.0[0]).then_with(|| a.1.cmp(&b.1)));
        for ([n, ns, unordered, outliers], name) in rows {
            let per = ns.checked_div(n).unwrap_or(0);
            eprintln!("uvspan: hit-ns {per} {n} {unordered} {outliers} {name}");
        }
    }

    /// Benchmark only: one stderr line per probe point that fired,
    /// `uvspan: hits N SYMBOL` (`SYMBOL:return` for a session probe's
    /// returns), most hits first. When hits are timed, the timing program
    /// counted the entries (timed or not), hit_counts the returns.
    fn print_hit_counts(&self) {
        let ret = 1u64 << 54; // HIT_RETURN in bpf/maps.h
        let mut counts: Vec<(u64, u64)> =
            cookie_entries(&self.skel.maps.hit_counts).into_iter().map(|(cookie, v)| (cookie, v.first().copied().unwrap_or(0))).collect();
        if times_hits(self.multi) {
            // struct hit_time: n, ns, unordered, outliers
            let timed = cookie_entries(&self.skel.maps.hit_times);
            counts.extend(timed.into_iter().map(|(cookie, v)| (cookie, [0, 2, 3].iter().filter_map(|&i| v.get(i)).sum())));
        }
        let mut rows: Vec<(u64, String)> = counts
            .into_iter()
            .map(|(cookie, n)| {
                let mut name = cookie_name(cookie & !ret);
                if cookie & ret != 0 {
                    name.push_str(":return");
                }
                (n, name)
            })
            .collect();
        rows.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        for (n, name) in rows {
            eprintln!("uvspan: hits {n} {name}");
        }
    }
}

impl Drop for Tracer {
    /// Detaching waits for RCU grace periods in the kernel (tens of ms per
    /// tracepoint link); detaching the links side by side roughly halves
    /// uvspan's exit time (measured 620 ms → 320 ms).
    fn drop(&mut self) {
        if bench_count_hits() {
            self.print_hit_counts();
        }
        if times_hits(self.multi) {
            self.print_hit_times();
        }
        // Links handed over for detaching go before the skeleton does.
        drop(std::mem::take(&mut self.detacher));
        self.sampler_gate = None;
        self.samplers.clear();
        self.uprobes.clear();
        let waits = self.wait_links.drain().flat_map(|(_, l)| l);
        detach_all(self._global.drain(..).chain(self.syscall_links.drain(..)).chain(waits).collect());
    }
}

/// A skeleton handed to the loading thread: used there alone until the
/// thread is joined.
struct AssertSend<T>(T);

// SAFETY: the wrapped skeleton (raw pointers into its libbpf object) is
// used by one thread at a time: made here, loaded on the loading thread
// only, handed back through join.
unsafe impl Send for AssertSend<OpenUvspanSkel<'static>> {}
// SAFETY: as above: the loaded skeleton goes back once, through join.
unsafe impl Send for AssertSend<UvspanSkel<'static>> {}

impl<T> AssertSend<T> {
    fn into_inner(self) -> T {
        self.0
    }
}

/// --stacks: how busy a loop's iteration is when the sampler goes on (half
/// the loop threshold, at least 1 ms; samples are kept from the threshold).
fn sampler_lead(threshold: Duration) -> Duration {
    (threshold / 2).max(Duration::from_millis(1))
}
