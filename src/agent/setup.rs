//! What the agent sets up before its first tick: the tracer's settings,
//! the export plan and its runtime, the listener, signals, the ring buffer.

use super::*;

/// Benchmark mode (scripts/bench.sh): uprobes and epoll programs attach and
/// fire, but return at once, so a run measures what the kernel charges for
/// the probes alone.
pub(super) fn bench_trap_only() -> bool {
    let on = std::env::var_os("UVSPAN_BENCH_TRAP_ONLY").is_some_and(|v| v == "1");
    if on {
        eprintln!("uvspan: UVSPAN_BENCH_TRAP_ONLY=1: probes fire but record nothing (benchmark mode, no spans)");
    }
    on
}

/// Benchmark only, with `UVSPAN_BENCH_TRAP_ONLY=1` (called then):
/// `UVSPAN_BENCH_TRAP_SPIN_NS=N` makes each entry hit spin N ns (up to 1 ms)
/// in a compact loop: BPF time without the memory the real programs touch.
fn bench_trap_spin_ns() -> u64 {
    let ns = std::env::var("UVSPAN_BENCH_TRAP_SPIN_NS").ok().and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0).min(1_000_000);
    if ns > 0 {
        eprintln!("uvspan: UVSPAN_BENCH_TRAP_SPIN_NS={ns}: each probe hit spins {ns} ns (benchmark mode)");
    }
    ns
}

/// Benchmark only (`UVSPAN_BENCH_NO_FOLLOW=1`): unsampled HTTP/1 requests
/// are sent up as records instead of followed in the kernel, to measure
/// what following them saves.
fn bench_no_follow() -> bool {
    std::env::var_os("UVSPAN_BENCH_NO_FOLLOW").is_some_and(|v| v == "1")
}

/// Where the trace sampler runs: in the kernel (the work of a trace it
/// drops sends no record) unless it keeps everything, or `uvspan run`
/// reports on every operation. Tail exceptions are decided there too when
/// the kernel follows unsampled requests (it holds their records until
/// their end); else (`--otlp-listen`) user space sees every request's work
/// to decide at its end. Tasks are decided there only when each is a
/// trace of its own (a process's trace decides its tasks).
pub(super) fn kernel_sampling(cli: &Cli, sampler: &Sampler, per: TracePer) -> Option<KernelSampling> {
    let tail = tail_rule(cli).is_some();
    let report = matches!(cli.sub, Some(crate::cli::Sub::Run(_)));
    // --otlp-listen joins the app's spans to requests uvspan saw.
    let follow = cli.otlp_listen.is_empty() && !bench_no_follow();
    if cli.requests == RequestsMode::Off || sampler.keeps_all() || (tail && !follow) || report {
        return None;
    }
    Some(KernelSampling {
        requests: true,
        follow_requests: follow,
        tasks: per == TracePer::Task,
        parent_based: sampler.parent_based,
        threshold: sampler.kernel_threshold(),
        tail: tail_rule(cli),
    })
}

/// --publish-trace-context: the pinned map profilers read, made or reused
/// (None: not asked for).
pub(super) fn publish_trace_context(cli: &Cli) -> Result<Option<crate::kernel::trace_ctx::Published>> {
    if !cli.publish_trace_context {
        return Ok(None);
    }
    if cli.requests == RequestsMode::Off {
        return Err(usage("--publish-trace-context publishes requests' ids: it needs --requests on (the default)".into()));
    }
    if !cli.otlp_listen.is_empty() {
        return Err(usage(
            "--publish-trace-context with --otlp-listen is not supported: a request's SERVER span may be the app's, whose id the \
             kernel cannot know at the request's head; drop one of the two"
                .into(),
        ));
    }
    crate::kernel::trace_ctx::Published::open().map(Some)
}

/// The tail exceptions asked for (`--keep-errors`, `--keep-slower-than`).
pub(super) fn tail_rule(cli: &Cli) -> Option<crate::requests::Tail> {
    let slower_than_ns = cli.keep_slower_than.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    (cli.keep_errors || slower_than_ns.is_some()).then_some(crate::requests::Tail { errors: cli.keep_errors, slower_than_ns })
}

/// What the kernel side is loaded with.
pub(super) fn tracer_settings(
    cli: &Cli,
    pidns: Option<crate::discover::pidns::PidNs>,
    sampling: Option<KernelSampling>,
    published: Option<&crate::kernel::trace_ctx::Published>,
) -> Settings {
    use crate::metrics::Metric;
    let trap_only = bench_trap_only();
    Settings {
        loop_threshold: cli.loop_threshold,
        follow_forks: !cli.command.is_empty() || cli.follow_children(),
        children_by_file: !cli.command.is_empty(),
        discover: cli.discover(),
        ring_buffer_size: cli.ring_buffer_size,
        detail: Detail::from_kinds(&cli.detail).with_requests(cli.requests != RequestsMode::Off),
        trap_only,
        trap_spin_ns: if trap_only { bench_trap_spin_ns() } else { 0 },
        sampling: cli.samples_time(),
        stacks: cli.stacks != StacksMode::Off,
        stacks_all_ops: cli.stacks == StacksMode::AllOps,
        pidns,
        kernel_sampling: sampling,
        hist_bounds: [Metric::Fs.bounds(), Metric::Dns.bounds(), Metric::QueueWait.bounds(), Metric::HttpServer.bounds()],
        publish_ctx: published.and_then(|p| Some((std::os::fd::AsRawFd::as_raw_fd(&p.fd()?), p.key))),
    }
}

/// What the run exports, from the command line, the `OTEL_*` variables and
/// the config file.
pub(super) fn export_plan(cli: &Cli, file: &FileConfig) -> Result<Plan> {
    let env = |k: &str| std::env::var(k).ok();
    let src =
        Sources { env: &env, file: file.otlp.as_ref(), flag_endpoint: cli.otlp_endpoint.as_deref(), flag_protocol: cli.otlp_protocol };
    settings::plan(&src).map_err(|e| usage(format!("{e:#}")))
}

/// The metrics of every operation and request (see [`crate::metrics`]):
/// their aggregates, and the task that exports them.
pub(super) type OpMetrics = (Arc<std::sync::Mutex<crate::metrics::Metrics>>, crate::export::metrics::Periodic);

pub(super) fn start_op_metrics(plan: &Plan, rt: &tokio::runtime::Runtime) -> Result<Option<OpMetrics>> {
    use crate::export::metrics::{interval, temporality, Periodic};
    let shared = Arc::new(std::sync::Mutex::new(crate::metrics::Metrics::default()));
    let t = temporality(std::env::var("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE").ok().as_deref())?;
    let _guard = rt.enter();
    Ok(Periodic::start(&plan.metrics, shared.clone(), interval(), t)?.map(|p| (shared, p)))
}

/// Whether uvspan discovers its targets (--all, --cgroup, --container); an
/// error when the command line names none, or a command with discovery.
pub(super) fn check_targets(cli: &Cli) -> Result<bool> {
    let discovering = cli.discover();
    if cli.pids.is_empty() && cli.command.is_empty() && !discovering {
        bail!("nothing to trace: give --pid PID (repeatable), --all, or -- COMMAND [ARGS...]; see uvspan --help");
    }
    if cli.no_follow_children && cli.pids.is_empty() {
        return Err(usage(
            "--no-follow-children is for --pid (the processes below a PID are followed by default); \
             -- COMMAND always traces the Node.js processes it starts, --all every one"
                .into(),
        ));
    }
    if discovering && !cli.command.is_empty() {
        bail!("--all (or --cgroup/--container) traces processes already running or started later; it cannot be combined with a command");
    }
    Ok(discovering)
}

/// Why spans are not exported at all, if they are not.
pub(super) fn traces_off(plan: &Plan) -> Option<&'static str> {
    if plan.traces != Output::Off {
        return None;
    }
    let sdk_off = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    Some(if sdk_off { "OTEL_SDK_DISABLED=true" } else { "OTEL_TRACES_EXPORTER=none" })
}

pub(super) fn usage(msg: String) -> anyhow::Error {
    anyhow::Error::new(crate::discover::target::ExitCodeError { code: 2, msg })
}

/// The export side: runtime, span exporter, health metrics.
pub(super) fn start_export(
    plan: &Plan,
    file: &FileConfig,
) -> Result<(tokio::runtime::Runtime, Exporter, Arc<Health>, Option<HealthMetrics>)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("uvspan-export")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let dest = match &plan.traces {
        Output::Otlp(s) => Destination::Otlp(s.clone()),
        Output::Console | Output::Off => Destination::Console,
    };
    let exporter = Exporter::start(&dest, file.batch()?, &rt)?;
    let health = Arc::new(Health::default());
    let metrics = {
        let _guard = rt.enter();
        HealthMetrics::start(&plan.metrics, health.clone(), exporter.counters())?
    };
    Ok((rt, exporter, health, metrics))
}

/// --otlp-listen: the app's OTLP served on its addresses (bound now: a bad
/// address stops uvspan before anything is traced) and forwarded to uvspan's
/// endpoint.
pub(super) fn start_listener(cli: &Cli, plan: &Plan, rt: &tokio::runtime::Runtime, health: &Health) -> Result<Option<Listener>> {
    if cli.otlp_listen.is_empty() {
        return Ok(None);
    }
    let forward = cli.otlp_listen_forward == crate::cli::ListenForward::Endpoint;
    if !forward {
        // A collector tee: the listener gets a copy of what the collector
        // already sent on; forwarding it would send it round again.
        let cfg = ListenConfig { addrs: cli.otlp_listen.clone(), upstream: Default::default(), queue_bytes: 0, forward: false };
        return match Listener::start(&cfg, rt, health.listen.clone()) {
            Ok(l) => Ok(Some(l)),
            Err(e) => match e.downcast::<BindError>() {
                Ok(b) => Err(usage(b.to_string())),
                Err(e) => Err(e),
            },
        };
    }
    let Some(traces) = &plan.forward[0] else {
        return Err(usage(
            "--otlp-listen forwards the app's OTLP to uvspan's endpoint, and none is set: give --otlp-endpoint URL \
             (or OTEL_EXPORTER_OTLP_ENDPOINT)"
                .into(),
        ));
    };
    // The endpoint being one of our own addresses would send everything round in a circle.
    for s in plan.forward.iter().flatten() {
        let hostport = s.url.split("://").nth(1).unwrap_or(&s.url).split('/').next().unwrap_or("");
        if let Ok(a) = hostport.parse::<std::net::SocketAddr>() {
            if cli.otlp_listen.contains(&a) {
                return Err(usage(format!(
                    "the OTLP endpoint {} is uvspan's own --otlp-listen address: give uvspan the collector's address \
                     (--otlp-endpoint) and the app the listen address (its OTEL_EXPORTER_OTLP_ENDPOINT)",
                    traces.url
                )));
            }
        }
    }
    let cfg = ListenConfig {
        addrs: cli.otlp_listen.clone(),
        upstream: plan.forward.clone(),
        queue_bytes: u64::from(cli.otlp_listen_queue),
        forward: true,
    };
    match Listener::start(&cfg, rt, health.listen.clone()) {
        Ok(l) => Ok(Some(l)),
        Err(e) => match e.downcast::<BindError>() {
            Ok(b) => Err(usage(b.to_string())),
            Err(e) => Err(e),
        },
    }
}

/// SIGINT/SIGTERM: stored in the returned flag, and the waker rung.
pub(super) fn watch_signals(rt: &tokio::runtime::Runtime, waker: Waker) -> Arc<AtomicI32> {
    let signal = Arc::new(AtomicI32::new(0));
    let flag = signal.clone();
    rt.spawn(async move {
        use tokio::signal::unix::{signal as sig, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (sig(SignalKind::interrupt()), sig(SignalKind::terminate())) else { return };
        loop {
            let n = tokio::select! { _ = int.recv() => libc::SIGINT, _ = term.recv() => libc::SIGTERM };
            flag.store(n, Ordering::SeqCst);
            waker.wake();
        }
    });
    signal
}

/// The ring buffer reader: records decoded into the inbox (and, with
/// UVSPAN_RECORD=<file>, kept raw for golden tests: tests/golden/).
pub(super) fn open_ring(tracer: &Tracer) -> Result<(RingBuffer<'static>, Inbox)> {
    let inbox = Inbox::default();
    let mut recording = match std::env::var_os("UVSPAN_RECORD") {
        Some(p) => {
            Some(std::io::BufWriter::new(std::fs::File::create(&p).with_context(|| format!("cannot create UVSPAN_RECORD file {p:?}"))?))
        }
        None => None,
    };
    let sink = inbox.clone();
    let rb = tracer.ring_buffer(move |data| {
        if let Some(w) = recording.as_mut() {
            let _ = decode::write_recorded(w, data).and_then(|_| std::io::Write::flush(w));
        }
        match decode::decode(data) {
            Ok(r) => sink.records.borrow_mut().push(r),
            Err(_) => sink.undecodable.set(sink.undecodable.get() + 1),
        }
    })?;
    Ok((rb, inbox))
}

/// Which fs operations are counted on their span instead of a span each:
/// `--startup-ops`, else module loading, except under `uvspan run`
/// (`report`), whose report counts every operation: a compiler's or a test
/// runner's reads under `node_modules` are the job's work.
pub(super) fn startup_ops(cli: &Cli, report: bool) -> crate::tasks::StartupOps {
    use crate::tasks::StartupOps;
    cli.startup_ops.unwrap_or(if report { StartupOps::Spans } else { StartupOps::Modules })
}
