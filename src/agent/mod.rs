//! The run: resolve targets, load and attach, then read → spans → export
//! until the targets exit or a signal arrives; flush; report.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use opentelemetry_sdk::trace::{RandomIdGenerator, SpanData};

use crate::cli::Cli;
use crate::config::FileConfig;
use crate::discover::{self, Candidate, Filter};
use crate::events::clock::Clock;
use crate::events::decode::{self, Record};
use crate::kernel::wake::{Sleeper, Waker};
use crate::export::otlp::OtlpConfig;
use crate::export::health::{Health, HealthMetrics};
use crate::export::{Destination, Exporter};
use crate::enrich::resource::{self, ProcessInfo};
use crate::events::spans::{self, SpanContextSource};
use crate::symbols::{self, Images};
use crate::discover::target::{self, Spawned};
use crate::kernel::tracer::{Settings, Tracer};
use crate::probes::plan::{notices, ProbeState, ProbeStatus};

/// One traced process.
struct Proc {
    registered: bool,
    exited: bool,
    /// Given by --pid (its exit counts towards "all targets exited").
    target: bool,
    node_version: Option<String>,
}

struct State<'a> {
    cli: &'a Cli,
    exporter: Exporter,
    procs: HashMap<u32, Proc>,
    host: String,
    clock: Clock,
    ids: RandomIdGenerator,
    scope: opentelemetry::InstrumentationScope,
    /// The environ notice was printed.
    warned_environ: bool,
}

impl State<'_> {
    /// Sends the process's resource to the exporter (once, while it is alive).
    fn register(&mut self, pid: u32) {
        let host = self.host.clone();
        let Some(p) = self.procs.get_mut(&pid) else { return };
        if p.registered {
            return;
        }
        let info = ProcessInfo::read(pid, p.node_version.clone());
        if info.environ_denied && !self.warned_environ {
            self.warned_environ = true;
            eprintln!(
                "uvspan: cannot read /proc/{pid}/environ (permission denied): the target's OTEL_SERVICE_NAME, \
                 OTEL_RESOURCE_ATTRIBUTES and K8S_* are not used; give uvspan CAP_DAC_READ_SEARCH (said once)"
            );
        }
        let name = info.service_name(self.cli.service_name.as_deref());
        self.exporter.process(pid, info.resource(self.cli.service_name.as_deref(), &host), format!("{name}[{pid}]"));
        p.registered = true;
    }

    fn handle(&mut self, rec: Record, out: &mut HashMap<u32, Vec<SpanData>>) {
        match &rec {
            Record::Fork { pid, ppid } => {
                let nv = self.procs.get(ppid).and_then(|p| p.node_version.clone());
                self.procs.insert(*pid, Proc { registered: false, exited: false, target: false, node_version: nv });
                return;
            }
            Record::Exec { pid } => {
                if let Some(p) = self.procs.get_mut(pid) {
                    p.registered = false; // a new program: read its resource again
                }
                self.register(*pid);
                return;
            }
            Record::Exit { pid } => {
                if let Some(p) = self.procs.get_mut(pid) {
                    p.exited = true;
                }
                return;
            }
            Record::Fs(r) => self.ensure(r.pid),
            Record::Dns(r) => self.ensure(r.pid),
            Record::Loop(r) => self.ensure(r.pid),
        }
        let src = SpanContextSource { clock: self.clock, ids: &self.ids, scope: self.scope.clone() };
        let pid = match &rec {
            Record::Fs(r) => r.pid,
            Record::Dns(r) => r.pid,
            Record::Loop(r) => r.pid,
            _ => return,
        };
        out.entry(pid).or_default().extend(spans::build(&rec, &src));
    }

    fn ensure(&mut self, pid: u32) {
        self.procs.entry(pid).or_insert(Proc { registered: false, exited: false, target: false, node_version: None });
        self.register(pid);
    }
}

fn announce(pid: Option<u32>, images: &Images, report: &[ProbeStatus], took: Duration, notices_too: bool) {
    let loc = &images.libuv;
    let attached = report.iter().filter(|r| r.state == ProbeState::Usable).count();
    let who = pid.map_or_else(|| "command".to_string(), |p| format!("process {p}"));
    let version = match (&images.node_version, &loc.image.libuv_version) {
        (Some(n), Some(u)) => format!("node {n}, libuv {u}"),
        (Some(n), None) => format!("node {n}"),
        (None, Some(u)) => format!("libuv {u}"),
        (None, None) => "version unknown".into(),
    };
    eprintln!(
        "uvspan: tracing {who} ({}, {version}): {attached} probes live {:.1} ms after it was found",
        loc.path,
        took.as_secs_f64() * 1e3
    );
    if notices_too {
        for line in notices(loc, report) {
            eprintln!("uvspan:   {line}");
        }
    }
}

fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Counters of the run, besides the exporter's and the kernel's.
#[derive(Default)]
struct RunStats {
    /// Requests a process had in flight when it exited (dropped, counted).
    unfinished_at_exit: u64,
    processes_seen: u64,
}

/// Discovery (--all): which binaries are attached for every process,
/// which executables are known (Node or not), and processes to look at again
/// (a shared libuv is mapped after exec). Reading a new binary's symbols
/// (tens to hundreds of ms for a 100 MB node) happens on a worker thread, so
/// processes of known binaries are traced at once meanwhile.
struct Discovery {
    filter: Filter,
    /// Executables seen to be Node (fast path) or not (skipped).
    node_exes: std::collections::HashSet<(u64, u64)>,
    other_exes: std::collections::HashSet<(u64, u64)>,
    retry: Vec<(u32, Instant, u32)>,
    in_worker: std::collections::HashSet<u32>,
    /// Processes that exec'd again while the worker looked at them.
    exec_again: std::collections::HashSet<u32>,
    to_worker: std::sync::mpsc::Sender<(u32, u32)>,
    from_worker: std::sync::mpsc::Receiver<WorkerResult>,
}

/// (pid, tries, found at, executable looked at, its images).
type WorkerResult = (u32, u32, Instant, Option<(u64, u64)>, Result<Images>);

impl Discovery {
    fn new(filter: Filter, waker: Waker) -> Discovery {
        let (to_worker, jobs) = std::sync::mpsc::channel::<(u32, u32)>();
        let (done, from_worker) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("uvspan-symbols".into())
            .spawn(move || {
                for (pid, tries) in jobs {
                    let t = Instant::now();
                    // The executable is noted first: the process may exec again meanwhile.
                    let exe = exe_id(pid);
                    if done.send((pid, tries, t, exe, symbols::images(pid))).is_err() {
                        return;
                    }
                    waker.wake();
                }
            })
            .ok();
        Discovery {
            filter,
            node_exes: Default::default(),
            other_exes: Default::default(),
            retry: Vec::new(),
            in_worker: Default::default(),
            exec_again: Default::default(),
            to_worker,
            from_worker,
        }
    }
}

fn file_id(p: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

fn exe_id(pid: u32) -> Option<(u64, u64)> {
    file_id(std::path::Path::new(&format!("/proc/{pid}/exe")))
}

impl State<'_> {
    /// A process seen in --all mode: trace it if it is Node and the filter keeps it.
    fn consider(&mut self, tracer: &mut Tracer, d: &mut Discovery, pid: u32, tries: u32) {
        if d.in_worker.contains(&pid) {
            d.exec_again.insert(pid); // look again once the worker is done with it
            return;
        }
        if pid == std::process::id() || self.procs.contains_key(&pid) {
            return;
        }
        let Some(exe) = exe_id(pid) else { return };
        if d.other_exes.contains(&exe) {
            return;
        }
        let Some(cand) = Candidate::read(pid) else { return };
        if !d.filter.admits(&cand) {
            return;
        }
        if d.node_exes.contains(&exe) {
            let t = Instant::now();
            if let Ok(images) = symbols::images(pid) {
                self.start_tracing(tracer, pid, images, t);
            }
        } else if d.to_worker.send((pid, tries)).is_ok() {
            d.in_worker.insert(pid);
        }
    }

    /// Symbols the worker has read: trace, look again later, or remember "not Node".
    fn worker_results(&mut self, tracer: &mut Tracer, d: &mut Discovery) {
        while let Ok((pid, tries, t, exe, result)) = d.from_worker.try_recv() {
            d.in_worker.remove(&pid);
            let again = d.exec_again.remove(&pid);
            let Some(exe) = exe else { continue };
            if again || exe_id(pid) != Some(exe) {
                // It exec'd something else while the worker looked (a shell
                // starting node): what was read may be either; look again.
                self.consider(tracer, d, pid, tries);
                continue;
            }
            match result {
                Ok(images) => {
                    d.node_exes.insert(exe);
                    self.start_tracing(tracer, pid, images, t);
                }
                Err(_) => {
                    // A dynamically linked node maps libuv.so / libnode.so just after
                    // exec: look again shortly (5 times, 20 ms apart).
                    let needs_lib = std::fs::read(format!("/proc/{pid}/exe"))
                        .map(|b| memchr::memmem::find(&b, b"libuv.so").is_some() || memchr::memmem::find(&b, b"libnode.so").is_some())
                        .unwrap_or(false);
                    if !needs_lib {
                        d.other_exes.insert(exe);
                    } else if tries < 5 {
                        d.retry.push((pid, Instant::now() + Duration::from_millis(20), tries + 1));
                    }
                }
            }
        }
    }

    fn start_tracing(&mut self, tracer: &mut Tracer, pid: u32, images: Images, t: Instant) {
        // One link per binary for all its processes; then a pid is one map update.
        let (report, fresh) = match tracer.attach(&images, -1) {
            Ok(a) => (a.report, a.new),
            Err(e) => {
                eprintln!("uvspan: cannot trace process {pid}: {e:#}");
                return;
            }
        };
        if tracer.add_pid(pid, &report).is_err() {
            return;
        }
        announce(Some(pid), &images, &report, t.elapsed(), fresh);
        self.procs.insert(pid, Proc { registered: false, exited: false, target: false, node_version: images.node_version.clone() });
        self.register(pid);
    }
}

/// Benchmark mode (scripts/bench.sh): uprobes and epoll tracepoints attach
/// and fire, but their programs return at once, so a run measures what the
/// kernel charges for the probes alone.
fn bench_trap_only() -> bool {
    let on = std::env::var_os("UVSPAN_BENCH_TRAP_ONLY").is_some_and(|v| v == "1");
    if on {
        eprintln!("uvspan: UVSPAN_BENCH_TRAP_ONLY=1: probes fire but record nothing (benchmark mode, no spans)");
    }
    on
}

/// Runs uvspan; returns the process exit code.
pub fn run(cli: Cli, file: FileConfig) -> Result<i32> {
    let discovering = cli.discover();
    if cli.pids.is_empty() && cli.command.is_empty() && !discovering {
        bail!("nothing to trace: give --pid PID (repeatable), --all, or -- COMMAND [ARGS...]; see uvspan --help");
    }
    if discovering && !cli.command.is_empty() {
        bail!("--all (or --cgroup/--container) traces processes already running or started later; it cannot be combined with a command");
    }
    // Targets are resolved (ELF symbols read: tens of ms for a 100 MB node)
    // while the BPF program loads; errors are reported right after.
    let lookup = {
        let (pids, argv0) = (cli.pids.clone(), cli.command.first().cloned());
        std::thread::spawn(move || -> Result<_> {
            let found = Instant::now();
            let mut pid_targets = Vec::new();
            for pid in pids {
                pid_targets.push((pid, target::check_pid(pid)?));
            }
            let cmd_node = argv0.map(|a| target::node_binary_for(&a)).transpose()?;
            Ok((found, pid_targets, cmd_node))
        })
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("uvspan-export")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let dest = match &cli.otlp_endpoint {
        Some(ep) if !ep.is_empty() => Destination::Otlp(OtlpConfig {
            endpoint: ep.clone(),
            protocol: cli.otlp_protocol,
            headers: file.headers(),
        }),
        _ => Destination::Console,
    };
    let exporter = Exporter::start(&dest, file.batch()?, &rt)?;
    let health = Arc::new(Health::default());
    let health_metrics = match &dest {
        Destination::Otlp(c) => {
            let _guard = rt.enter();
            Some(HealthMetrics::start(c, health.clone(), exporter.counters())?)
        }
        Destination::Console => None,
    };
    let loaded = Tracer::load(&Settings {
        loop_threshold: cli.loop_threshold,
        follow_forks: !cli.command.is_empty(),
        discover: discovering,
        ring_buffer_size: cli.ring_buffer_size,
        detail: crate::probes::catalog::Detail::from_kinds(&cli.detail),
        trap_only: bench_trap_only(),
    });
    let (found, pid_targets, cmd_node) = lookup.join().map_err(|_| anyhow::anyhow!("target lookup panicked"))??;
    let mut tracer = loaded?;
    for n in tracer.notices() {
        eprintln!("uvspan: {n}");
    }

    let waker = Waker::new()?;
    let signal = Arc::new(AtomicI32::new(0));
    {
        let signal = signal.clone();
        let waker = waker.clone();
        rt.spawn(async move {
            use tokio::signal::unix::{signal as sig, SignalKind};
            let (Ok(mut int), Ok(mut term)) = (sig(SignalKind::interrupt()), sig(SignalKind::terminate())) else { return };
            loop {
                let n = tokio::select! { _ = int.recv() => libc::SIGINT, _ = term.recv() => libc::SIGTERM };
                signal.store(n, Ordering::SeqCst);
                waker.wake();
            }
        });
    }

    let mut st = State {
        cli: &cli,
        exporter,
        procs: HashMap::new(),
        host: resource::host_name(),
        clock: Clock::estimate(25),
        ids: RandomIdGenerator::default(),
        scope: spans::scope(),
        warned_environ: false,
    };
    let mut stats = RunStats::default();

    for (pid, loc) in &pid_targets {
        let report = tracer.attach(loc, *pid as i32)?.report;
        tracer.add_pid(*pid, &report)?;
        announce(Some(*pid), loc, &report, found.elapsed(), true);
        st.procs.insert(*pid, Proc { registered: false, exited: false, target: true, node_version: loc.node_version.clone() });
        st.register(*pid);
    }
    let mut discovery = Discovery::new(
        Filter {
            cgroup: cli.cgroup.clone(),
            container: cli.container.clone(),
            exclude_instrumented: cli.exclude_already_instrumented,
        },
        waker.clone(),
    );
    if discovering {
        let pids = discover::all_pids();
        for &pid in &pids {
            st.consider(&mut tracer, &mut discovery, pid, 0);
        }
        // The processes already running: wait (bounded) for their symbols.
        let until = Instant::now() + Duration::from_secs(5);
        while !discovery.in_worker.is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
            st.worker_results(&mut tracer, &mut discovery);
        }
        eprintln!("uvspan: watching for Node.js processes ({} traced now)", st.procs.len());
    }
    let spawned: Option<Spawned> = match (&cmd_node, cli.command.is_empty()) {
        (Some(loc), false) => {
            let w = waker.clone();
            let child = target::spawn_held(&cli.command, move || w.wake())?;
            let report = tracer.attach(loc, -1)?.report;
            tracer.add_pid(child.pid, &report)?;
            announce(None, loc, &report, found.elapsed(), true);
            st.procs.insert(child.pid, Proc { registered: false, exited: false, target: false, node_version: loc.node_version.clone() });
            child.release()?;
            Some(child)
        }
        _ => None,
    };

    let records: Rc<RefCell<Vec<Record>>> = Rc::default();
    let bad_records = Rc::new(std::cell::Cell::new(0u64));
    // UVSPAN_RECORD=<file> keeps the raw records, for golden tests (tests/golden/).
    let mut recording = match std::env::var_os("UVSPAN_RECORD") {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(&p).with_context(|| format!("cannot create UVSPAN_RECORD file {p:?}"))?,
        )),
        None => None,
    };
    let rb = {
        let (records, bad) = (records.clone(), bad_records.clone());
        tracer.ring_buffer(move |data| {
            if let Some(w) = recording.as_mut() {
                let _ = decode::write_recorded(w, data).and_then(|_| std::io::Write::flush(w));
            }
            match decode::decode(data) {
                Ok(r) => records.borrow_mut().push(r),
                Err(_) => bad.set(bad.get() + 1),
            }
        })?
    };

    let sleeper = Sleeper::new(rb.epoll_fd(), waker.clone())?;
    let mut exit_code = 0;
    let mut forwarded_at: Option<Instant> = None;
    let mut last_check = Instant::now();
    let mut last_clock = Instant::now();
    let mut last_status = Instant::now();
    let mut last_health = Instant::now();
    loop {
        // Records are sent without a wakeup until a batch has piled up (see
        // wake_flags in bpf/): poll waits for that, consume takes the rest.
        // Short waits while the symbol worker has something for us.
        let wait = if discovery.in_worker.is_empty() && discovery.retry.is_empty() { 100 } else { 5 };
        sleeper.sleep(Duration::from_millis(wait));
        let _ = rb.consume();
        let recs = std::mem::take(&mut *records.borrow_mut());
        let mut out: HashMap<u32, Vec<SpanData>> = HashMap::new();
        for r in recs {
            match r {
                Record::Exec { pid } if discovering && !st.procs.contains_key(&pid) => {
                    st.consider(&mut tracer, &mut discovery, pid, 0);
                }
                Record::Exit { pid } => {
                    st.handle(r, &mut out);
                    stats.unfinished_at_exit += tracer.remove_pid(pid);
                }
                r => st.handle(r, &mut out),
            }
        }
        for (pid, spans) in out {
            st.exporter.send(pid, spans);
        }
        if discovering {
            st.worker_results(&mut tracer, &mut discovery);
        }
        if !discovery.retry.is_empty() {
            let now = Instant::now();
            let due: Vec<(u32, Instant, u32)> = discovery.retry.iter().filter(|r| r.1 <= now).copied().collect();
            discovery.retry.retain(|r| r.1 > now);
            for (pid, _, tries) in due {
                st.consider(&mut tracer, &mut discovery, pid, tries);
            }
        }

        if let Some(child) = &spawned {
            if let Ok(status) = child.status.try_recv() {
                exit_code = match status {
                    Ok(s) => s.code().unwrap_or_else(|| 128 + std::os::unix::process::ExitStatusExt::signal(&s).unwrap_or(0)),
                    Err(e) => {
                        eprintln!("uvspan: cannot run {}: {e}", cli.command[0]);
                        127
                    }
                };
                break;
            }
        }
        let sig = signal.load(Ordering::SeqCst);
        if sig != 0 {
            match (&spawned, forwarded_at) {
                // Pass the signal on to the command and wait (bounded) for it to end.
                (Some(child), None) => {
                    // SAFETY: kill(2) with a PID we started and a valid signal number.
                    unsafe { libc::kill(child.pid as i32, sig) };
                    forwarded_at = Some(Instant::now());
                }
                (Some(_), Some(at)) if at.elapsed() < Duration::from_secs(10) => {}
                _ => break,
            }
        }
        if last_check.elapsed() >= Duration::from_millis(500) {
            last_check = Instant::now();
            let gone: Vec<u32> = st.procs.iter().filter(|(pid, p)| !p.exited && !alive(**pid)).map(|(p, _)| *p).collect();
            for pid in gone {
                if let Some(p) = st.procs.get_mut(&pid) {
                    p.exited = true;
                }
                stats.unfinished_at_exit += tracer.remove_pid(pid);
            }
            // Exited processes are forgotten (their spans are already queued), except --pid targets.
            stats.processes_seen += st.procs.values().filter(|p| p.exited && !p.target).count() as u64;
            for (pid, _) in st.procs.iter().filter(|(_, p)| p.exited && !p.target) {
                st.exporter.forget(*pid);
            }
            st.procs.retain(|_, p| !p.exited || p.target);
            if spawned.is_none() && !discovering && st.procs.values().filter(|p| p.target).all(|p| p.exited) {
                break;
            }
        }
        if last_health.elapsed() >= Duration::from_secs(1) {
            last_health = Instant::now();
            let k = tracer.stats();
            health.processes_traced.store(st.procs.values().filter(|p| !p.exited).count() as u64, Ordering::Relaxed);
            health.records_lost.store(k.records_lost, Ordering::Relaxed);
            health.loop_iterations.store(k.loop_iterations, Ordering::Relaxed);
            health.unfinished_at_exit.store(stats.unfinished_at_exit, Ordering::Relaxed);
        }
        if last_clock.elapsed() >= Duration::from_secs(10) {
            last_clock = Instant::now();
            st.clock = Clock::estimate(25);
        }
        if !cli.status_interval.is_zero() && last_status.elapsed() >= cli.status_interval {
            last_status = Instant::now();
            let sum = st.exporter.summary();
            let k = tracer.stats();
            eprintln!(
                "uvspan: status: {} processes traced; spans: {} exported, {} dropped (queue full), {} failed to export, {} export errors; {} records lost in the kernel; {} unfinished at process exit",
                st.procs.values().filter(|p| !p.exited).count(),
                sum.exported,
                sum.dropped,
                sum.failed,
                sum.export_errors,
                k.records_lost,
                stats.unfinished_at_exit
            );
        }
    }
    // What the kernel still holds, then flush.
    let _ = rb.consume();
    drain(&mut st, &records);
    let kstats = tracer.stats();
    let nprocs = stats.processes_seen + st.procs.len() as u64;
    health.records_lost.store(kstats.records_lost, Ordering::Relaxed);
    health.loop_iterations.store(kstats.loop_iterations, Ordering::Relaxed);
    health.unfinished_at_exit.store(stats.unfinished_at_exit, Ordering::Relaxed);
    health.processes_traced.store(0, Ordering::Relaxed);
    let sum = st.exporter.finish(cli.flush_timeout);
    if let Some(m) = health_metrics {
        // The last values, within a short deadline: the collector may be gone.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            m.finish();
            let _ = tx.send(());
        });
        let _ = rx.recv_timeout(Duration::from_secs(2));
    }
    let fast = kstats.loop_iterations.saturating_sub(kstats.loop_emitted);
    eprintln!(
        "uvspan: {nprocs} process(es); spans: {} exported, {} dropped (queue full), {} failed to export, {} not flushed; \
         {} records lost in the kernel (ring buffer or in-flight table full), {} undecodable, {} unfinished at process exit; {} loop iterations, {} under {:?} not reported",
        sum.exported,
        sum.dropped,
        sum.failed,
        sum.unflushed,
        kstats.records_lost,
        bad_records.get(),
        stats.unfinished_at_exit,
        kstats.loop_iterations,
        fast,
        cli.loop_threshold
    );
    // Detaching uprobes waits for the kernel (~40 ms): a child process
    // does it after we are gone.
    crate::kernel::wake::detach_after_exit();
    drop(rb);
    drop(tracer);
    Ok(exit_code)
}

fn drain(st: &mut State<'_>, records: &Rc<RefCell<Vec<Record>>>) {
    let recs = std::mem::take(&mut *records.borrow_mut());
    if recs.is_empty() {
        return;
    }
    let mut out: HashMap<u32, Vec<SpanData>> = HashMap::new();
    for r in recs {
        st.handle(r, &mut out);
    }
    for (pid, spans) in out {
        st.exporter.send(pid, spans);
    }
}
