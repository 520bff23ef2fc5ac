//! The agent: sets up every step of the flow, then turns the crank until the
//! targets exit or a signal arrives, then flushes and reports.
//!
//! ```text
//! run:  Agent::setup  →  while agent.tick()? {}  →  agent.shutdown()
//! tick: wait (ring buffer or waker) → records → spans → exporter
//!       → discovery → command exit / signals / exited targets → timers
//! ```

mod cost;
mod procs;
mod report;
mod sampling;
mod setup;
mod targets;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use libbpf_rs::RingBuffer;

use crate::cli::{Cli, RequestsMode, StacksMode};
use crate::config::FileConfig;
use crate::discover::target::Spawned;
use crate::discover::watcher::Watcher;
use crate::events::clock::Clock;
use crate::events::decode::{self, Record};
use crate::events::sampler::Sampler;
use crate::export::client::settings::{self, Output, Plan, Sources};
use crate::export::health::{Health, HealthMetrics};
use crate::export::{Destination, Exporter};
use crate::kernel::tracer::{KernelSampling, Settings, Tracer};
use crate::kernel::wake::{self, Sleeper, Waker};
use crate::listen::join::Joiner;
use crate::listen::{BindError, ListenConfig, Listener};
use crate::probes::catalog::Detail;
use crate::requests::Requests;
use crate::stacks::Stacks;
use crate::symbols::Images;
use crate::tasks::{Tasks, TracePer};
use procs::Procs;
use report::RunStats;
use setup::*;
use targets::resolve_targets;

/// Runs uvspan; returns the process exit code.
pub fn run(cli: Cli, file: FileConfig) -> Result<i32> {
    let mut agent = Agent::setup(cli, file)?;
    while agent.tick()? {}
    agent.shutdown()
}

/// A period, and whether it has elapsed since it last did.
struct Every {
    period: Duration,
    last: Instant,
}

impl Every {
    fn new(period: Duration) -> Every {
        Every { period, last: Instant::now() }
    }

    /// True once per period (never for a zero period).
    fn due(&mut self) -> bool {
        if self.period.is_zero() || self.last.elapsed() < self.period {
            return false;
        }
        self.last = Instant::now();
        true
    }
}

struct Timers {
    /// Exited processes the kernel did not report (and --pid targets' exit).
    check: Every,
    health: Every,
    /// Re-estimating the monotonic → wall clock offset.
    clock: Every,
    status: Every,
    /// Requests over (a quiet period after their response).
    requests: Every,
}

/// Where the ring buffer's callback puts decoded records.
#[derive(Clone, Default)]
struct Inbox {
    records: Rc<RefCell<Vec<Record>>>,
    undecodable: Rc<Cell<u64>>,
}

pub struct Agent {
    cli: Cli,
    // Field order is drop order: the ring buffer goes before the tracer.
    rb: RingBuffer<'static>,
    sleeper: Sleeper,
    inbox: Inbox,
    /// The inbox's previous Vec, emptied: swapped in so the callback does not
    /// grow a new one from nothing at every read.
    spare_records: Vec<Record>,
    /// Unsampled requests the kernel followed that uvspan ended itself.
    followed_ended: u64,
    /// Unsampled HTTP/2 streams the kernel followed whose close never came
    /// (their process exited, or uvspan did, first): not in the metrics.
    h2_open_at_end: u64,
    /// Tail exceptions decided in the kernel: a followed request uvspan
    /// ends itself goes to the request tracker with the records held for
    /// it, which decides (and counts it) as for any other.
    tail_in_kernel: bool,
    /// Tail exceptions decided in the kernel: the bytes of the records
    /// sent held, per request, until its end.
    held: crate::requests::Held,
    tracer: Tracer,
    /// --publish-trace-context: the pinned map (after the tracer: dropped
    /// after it on an early return).
    published: Option<crate::kernel::trace_ctx::Published>,
    exporter: Exporter,
    health: Arc<Health>,
    health_metrics: Option<HealthMetrics>,
    /// The metrics of what uvspan sees, sent periodically.
    op_metrics: Option<crate::export::metrics::Periodic>,
    procs: Procs,
    /// Request context (None with --requests off).
    requests: Option<Requests>,
    /// --otlp-listen: the app's OTLP forwarded, and its SERVER spans for
    /// the joiner, which holds the spans of requests until they arrive.
    listener: Option<Listener>,
    joiner: Option<Joiner>,
    /// Loop-thread stacks on slow iterations (None with --stacks off).
    stacks: Option<Stacks>,
    /// V8 garbage collections waiting for their slow iteration.
    gcs: crate::events::gc::PendingGcs,
    /// Database connections' bytes made into operations.
    wire: crate::db::live::Wire,
    watcher: Option<Watcher>,
    /// --pid: the processes below the targets are followed (the watcher
    /// looks at what they exec).
    follow: bool,
    /// The processes traced as Node.js, for the summary.
    traced: report::Traced,
    /// The libuv files whose notices were said (--pid's descendants: once per file).
    noticed: std::collections::HashSet<String>,
    command: Option<Spawned>,
    /// The images `-- COMMAND` was attached for.
    command_images: Option<Images>,
    /// `-- COMMAND`: the node executable its probes are for, and whether a
    /// Node.js process ran under it (the command itself, an exec of that
    /// node, or a record of its probes).
    node_exe: Option<(u64, u64)>,
    node_ran: bool,
    /// A process of the command exec'd something gone before it could be
    /// looked at, and a loop was seen: it may have been Node.js.
    exec_unknown: bool,
    loop_seen: bool,
    waker: Waker,
    signal: Arc<AtomicI32>,
    /// When a signal was passed on to the command.
    forwarded_at: Option<Instant>,
    exit_code: i32,
    clock: Clock,
    stats: RunStats,
    timers: Timers,
    /// --sample-time: when the probes are live.
    windows: Option<sampling::Windows>,
    /// `uvspan run`: the report the spans are folded into.
    report: Option<crate::report::Collector>,
    /// Spans go to the exporter (not with `uvspan run` and no endpoint: the
    /// console shows only the summary).
    export_spans: bool,
    /// The export runtime outlives everything that sends to it.
    _rt: tokio::runtime::Runtime,
}

impl Agent {
    /// Everything up to the first tick: BPF loaded, targets attached, the
    /// command started, discovery watching.
    pub fn setup(cli: Cli, file: FileConfig) -> Result<Agent> {
        let discovering = check_targets(&cli)?;
        let report = match &cli.sub {
            // config::cli_with_file made sure it has a command and no --pid/--all.
            Some(crate::cli::Sub::Run(opts)) => Some(crate::report::Collector::new(opts.clone())?),
            _ => None,
        };
        let plan = export_plan(&cli, &file)?;
        // Refused before anything starts; left as found on any error below.
        let mut published = publish_trace_context(&cli)?;
        let sampler = Sampler::from_env(&|k| std::env::var(k).ok()).map_err(|e| usage(e.to_string()))?;
        // `uvspan run` with no collector: the report instead of spans on the console.
        let export_spans = match plan.traces {
            Output::Off => false,
            Output::Console => report.is_none(),
            Output::Otlp(_) => true,
        };
        // Before anything starts: the kernel's ids must map to uvspan's.
        let pidns = crate::discover::pidns::own()?;
        let lookup = resolve_targets(&cli);
        let (rt, exporter, health, health_metrics) = start_export(&plan, &file)?;
        let listener = start_listener(&cli, &plan, &rt, &health)?;
        let per = cli.trace_per.unwrap_or(if cli.command.is_empty() { TracePer::Task } else { TracePer::Process });
        let ksampling = kernel_sampling(&cli, &sampler, per);
        let tail_in_kernel = ksampling.is_some_and(|k| k.follow_requests && k.tail.is_some());
        let loaded = Tracer::load(&tracer_settings(&cli, pidns, ksampling, published.as_ref()));
        let targets = lookup.join().map_err(|_| anyhow!("target lookup panicked"))??;
        let tracer = loaded?;
        if let Some(p) = published.as_mut() {
            if let Some(t) = tracer.ctx_threads() {
                p.set_threads(t);
            }
        }
        for n in tracer.notices() {
            eprintln!("uvspan: {n}");
        }
        let waker = Waker::new()?;
        let signal = watch_signals(&rt, waker.clone());
        let (rb, inbox) = open_ring(&tracer)?;
        let sleeper = Sleeper::new(Some(rb.epoll_fd()), waker.clone())?;
        let status = cli.status_interval;
        // --max-overhead: the budget's controller sets the share of each period.
        let control = cli.max_overhead.map(|b| cost::Controller::new(b, cli.sample_time));
        let share = control.map(|c| c.share).or(cli.sample_time.filter(|&s| s < 1.0));
        health.sample_time_ppm.store(share.map_or(1_000_000, |s| (s * 1e6).round() as u64), Ordering::Relaxed);
        health.sample_work_ppm.store(share.map_or(1_000_000, |s| (s * 1e6).round() as u64), Ordering::Relaxed);
        let mut procs = Procs::new(cli.service_name.clone(), sampler);
        let op_metrics = start_op_metrics(&plan, &rt)?;
        procs.metrics = op_metrics.as_ref().map(|(m, _)| m.clone());
        procs.min_duration_ns = cli.min_duration.map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        if report.is_some() {
            procs.commands = Some(HashMap::new());
        }
        procs.tasks = Tasks::new(per, cli.requests != RequestsMode::Off).startup_ops(startup_ops(&cli, report.is_some()));
        if op_metrics.is_some() {
            procs.tasks.finished_calls = Some(Vec::new());
        }
        let follow = cli.follow_children();
        let mut agent = Agent {
            procs,
            requests: (cli.requests != RequestsMode::Off).then(|| {
                let mut r = Requests::new(cli.requests == RequestsMode::Always);
                if listener.is_some() {
                    r.hold_for_join();
                }
                if op_metrics.is_some() {
                    r.finished = Some(Vec::new());
                }
                r.tail = tail_rule(&cli).unwrap_or_default();
                r.publish = published.as_ref().map(|p| crate::events::sampler::ContextKey(p.key));
                r
            }),
            op_metrics: op_metrics.map(|(_, p)| p),
            stacks: (cli.stacks != StacksMode::Off).then(Stacks::new),
            gcs: Default::default(),
            wire: crate::db::live::Wire::new(crate::db::Options::default()),
            joiner: listener.as_ref().map(|_| Joiner::new(cli.join_window.unwrap_or(crate::listen::join::window_for(&[])))),
            listener,
            cli,
            rb,
            sleeper,
            inbox,
            spare_records: Vec::new(),
            followed_ended: 0,
            h2_open_at_end: 0,
            tail_in_kernel,
            held: Default::default(),
            tracer,
            published,
            exporter,
            health,
            health_metrics,
            watcher: None,
            follow,
            traced: Default::default(),
            noticed: Default::default(),
            command: None,
            command_images: None,
            node_exe: None,
            node_ran: false,
            exec_unknown: false,
            loop_seen: false,
            waker,
            signal,
            forwarded_at: None,
            exit_code: 0,
            clock: Clock::estimate(25),
            stats: RunStats {
                sampler: (sampler != Sampler::default()).then(|| (sampler.describe(), 0)),
                traces_off: traces_off(&plan),
                ..Default::default()
            },
            report,
            export_spans,
            timers: Timers {
                check: Every::new(Duration::from_millis(500)),
                health: Every::new(Duration::from_secs(1)),
                clock: Every::new(Duration::from_secs(10)),
                status: Every::new(status),
                requests: Every::new(Duration::from_millis(200)),
            },
            windows: None,
            _rt: rt,
        };
        for (pid, images) in &targets.pids {
            agent.attach_target(*pid, images, targets.found)?;
        }
        if agent.follow {
            agent.start_following()?;
        } else if agent.cli.no_follow_children {
            agent.traced.not_followed = Some(agent.cli.pids.iter().map(|&p| crate::discover::tree::descendants(p).len()).sum());
        }
        if discovering {
            agent.start_watching()?;
        }
        if let Some(node) = &targets.command_node {
            agent.start_command(node, targets.found)?;
        }
        // The first sampling window starts now that the probes are live.
        agent.windows = share.map(|s| sampling::Windows::new(s, Instant::now()).with_control(control));
        if let Some(m) = &agent.health_metrics {
            m.arm();
        }
        Ok(agent)
    }

    /// One turn of the crank; false when the run is over.
    pub fn tick(&mut self) -> Result<bool> {
        // Records come without a wakeup until a batch has piled up (see
        // wake_flags in bpf/), so wait at most 100 ms; 5 ms while the
        // symbol worker has something coming. The waker ends it early.
        let busy = self.watcher.as_ref().is_some_and(Watcher::busy);
        let mut wait = Duration::from_millis(if busy { 5 } else { 100 });
        if let Some(w) = &self.windows {
            wait = wait.min(w.until_next(Instant::now()));
        }
        self.sleeper.sleep(wait);
        if let Some(s) = self.stacks.as_mut() {
            s.refresh_live();
        }
        let _ = self.rb.consume();
        self.handle_records(false);
        self.sample_window();
        self.discover();
        if let Some(code) = self.command_exited() {
            if let Some(r) = self.report.as_mut() {
                r.command_exited();
            }
            self.exit_code = code;
            return Ok(false);
        }
        if self.stop_for_signal() {
            return Ok(false);
        }
        if self.timers.check.due() {
            if let Some(c) = &self.command {
                crate::discover::tree::reap_orphans(Some(c.pid));
            }
            if self.check_exited() {
                return Ok(false);
            }
            let tracer = &self.tracer;
            for line in self.procs.silent_loops(|tid| tracer.loop_seen(tid)) {
                eprintln!("{line}");
            }
        }
        if self.timers.health.due() {
            self.read_loop_times();
            self.stats.requests = self.request_stats();
            self.stats.tasks = self.procs.tasks.stats;
            if let Some(s) = self.stats.sampler.as_mut() {
                s.1 = self.procs.unsampled;
            }
            self.stats.short = self.procs.short;
            self.stats.gc_events_dropped = self.gcs.dropped;
            self.stats.db = self.wire.stats;
            self.stats.sampling = self.sampled();
            self.stats.cost = self.costs();
            report::update_health(&self.health, self.procs.live(), &self.tracer.stats(), &self.stats);
        }
        if self.timers.clock.due() {
            self.clock = Clock::estimate(25);
        }
        if self.timers.status.due() {
            self.stats.requests = self.request_stats();
            self.stats.tasks = self.procs.tasks.stats;
            let mut line = report::status_line(self.procs.live(), &self.exporter.summary(), &self.tracer.stats(), &self.stats);
            if self.listener.is_some() {
                line.push_str("; ");
                line.push_str(&self.health.listen.summary());
            }
            eprintln!("{line}");
        }
        Ok(true)
    }

    /// Decoded records → process table and spans → exporter; requests
    /// that are over (all of them at `shutdown`) go out too.
    pub(super) fn handle_records(&mut self, shutdown: bool) {
        let spare = std::mem::take(&mut self.spare_records);
        let mut recs = std::mem::replace(&mut *self.inbox.records.borrow_mut(), spare);
        let mut out = procs::Out::default();
        self.procs.begin_batch(recs.len());
        if !shutdown && self.timers.requests.due() {
            let now = crate::events::clock::monotonic_ns();
            for pid in self.procs.tasks.loop_start_unknown() {
                if let Some(t) = self.tracer.loop_time(pid, now) {
                    self.procs.tasks.loop_started(pid, t.since_ns);
                }
            }
            self.procs.expire(self.requests.as_mut(), self.clock, crate::events::clock::monotonic_ns(), false, &mut out);
            self.end_followed(false, None, &mut out);
            self.held.sweep(now);
        }
        for rec in recs.drain(..) {
            self.handle_one(rec, &mut out);
        }
        let mut ops = Vec::new();
        if shutdown {
            self.wire.flush(&mut ops);
        } else {
            self.wire.tick(crate::events::clock::monotonic_ns(), &mut ops);
        }
        self.db_ops(ops, &mut out);
        if recs.capacity() <= 65_536 {
            self.spare_records = recs;
        }
        // Stopping: what is still open ends after the last records (a
        // process's exit among them ends its trace with its exit code).
        if shutdown {
            self.end_followed(true, None, &mut out);
            self.procs.expire(self.requests.as_mut(), self.clock, crate::events::clock::monotonic_ns(), true, &mut out);
        }
        self.join(shutdown, &mut out);
        for (pid, mut spans) in out {
            if let Some(w) = &self.windows {
                sampling::mark(&mut spans, w.share);
            }
            if let Some(r) = self.report.as_mut() {
                r.add(pid, &spans);
            }
            if self.export_spans {
                self.exporter.send(pid, &mut spans);
            }
            self.procs.give_back(spans);
        }
        self.exporter.tick();
        self.finished_to_metrics();
    }

    /// Database operations whose owner is known, into the process table.
    fn db_ops(&mut self, ops: Vec<crate::db::live::DbRecord>, out: &mut procs::Out) {
        for op in ops {
            self.procs.handle(Record::Db(Box::new(op)), self.clock, &self.exporter, self.requests.as_mut(), out);
        }
    }

    /// With metrics: the requests and calls that finished, counted.
    fn finished_to_metrics(&mut self) {
        if let (Some(r), Some(m)) = (self.requests.as_mut(), self.procs.metrics.as_ref()) {
            if let Some(done) = r.finished.as_mut().filter(|d| !d.is_empty()) {
                let mut m = m.lock().unwrap_or_else(|e| e.into_inner());
                done.drain(..).for_each(|f| m.request(&f));
            }
        }
        if let (Some(calls), Some(m)) = (self.procs.tasks.finished_calls.as_mut().filter(|c| !c.is_empty()), self.procs.metrics.as_ref()) {
            let mut m = m.lock().unwrap_or_else(|e| e.into_inner());
            calls.drain(..).for_each(|(pid, c)| m.call(pid, &c));
        }
    }

    /// With metrics: each live process's loop time, as the kernel counts it
    /// (`nodejs.eventloop.*`), read now.
    fn read_loop_times(&mut self) {
        let Some(m) = &self.procs.metrics else { return };
        let now_ns = crate::events::clock::monotonic_ns();
        let times: Vec<_> = self.procs.live_pids().into_iter().filter_map(|pid| Some((pid, self.tracer.loop_time(pid, now_ns)?))).collect();
        let kernel_ops = self.tracer.op_hists(None);
        let mut m = m.lock().unwrap_or_else(|e| e.into_inner());
        for (pid, t) in times {
            m.loop_time(pid, crate::metrics::LoopTime::of(&t, now_ns));
        }
        m.kernel_ops(&kernel_ops);
    }

    /// One decoded record into the process table, the request tracker
    /// and `out`.
    fn handle_one(&mut self, rec: Record, out: &mut procs::Out) {
        // Records of libuv's or V8's probes: a Node.js process ran (those
        // probes are in Node's images only). An event loop alone is not
        // one: its epoll waits may be read from tracepoints, which any
        // program's loop passes (Bun's, Python's asyncio).
        match &rec {
            Record::Fs(_) | Record::Dns(_) | Record::Http(_) | Record::Wire(_) | Record::Gc(_) | Record::Held(_) => self.node_ran = true,
            Record::Loop(_) => self.loop_seen = true,
            _ => {}
        }
        match rec {
            Record::Held(h) => self.held.hold(h, crate::events::clock::monotonic_ns),
            // The kernel ended a request whose records were sent held.
            Record::Http(h) if h.what == decode::HttpWhat::Tail => {
                let held = self.held.take(h.pid, h.cause);
                if h.len == 1 {
                    for rec in crate::requests::released(&held, &self.inbox.undecodable) {
                        self.handle_one(rec, out);
                    }
                }
            }
            // A process below a --pid target exec'd: its resource read
            // again (a new program), and traced if it is Node.js.
            Record::Exec { pid, .. } if self.follow => {
                self.procs.handle(rec, self.clock, &self.exporter, self.requests.as_mut(), out);
                self.followed_exec(pid);
            }
            Record::Exec { pid, .. } if self.watcher.is_some() && !self.procs.contains(pid) => self.consider(pid),
            Record::Exit { pid, fast_iterations, .. } => {
                // Its database operations first, while its requests are open.
                let mut ops = Vec::new();
                self.wire.exited(pid, &mut ops);
                self.db_ops(ops, out);
                if let Some(r) = self.report.as_mut() {
                    r.exited(pid, fast_iterations);
                }
                self.end_followed(false, Some(pid), out);
                self.read_kernel_ops(pid);
                self.procs.handle(rec, self.clock, &self.exporter, self.requests.as_mut(), out);
                // The requests and calls its exit ended are counted before
                // it is marked exited: its last collection, which may come
                // any moment after, drops it.
                self.finished_to_metrics();
                if let Some(m) = &self.procs.metrics {
                    m.lock().unwrap_or_else(|e| e.into_inner()).exited(pid);
                }
                // Its last metrics go out soon, and its resource with them.
                if let Some(m) = &self.op_metrics {
                    m.exited();
                }
                self.stats.unfinished_at_exit += self.tracer.remove_pid(pid);
                self.traced.exited(pid);
                if let Some(s) = self.stacks.as_mut() {
                    s.forget(pid);
                }
                self.gcs.forget(pid);
            }
            Record::Wire(w) => {
                let mut ops = Vec::new();
                self.wire.record(&w, &mut ops);
                self.db_ops(ops, out);
            }
            // A response written where a database operation's response was
            // read says whose it was: decided before the response ends its request.
            Record::Http(h) if h.what == decode::HttpWhat::Write => {
                let mut ops = Vec::new();
                self.wire.http_write(&h, &mut ops);
                self.db_ops(ops, out);
                self.procs.handle(Record::Http(h), self.clock, &self.exporter, self.requests.as_mut(), out);
            }
            Record::Stack(s) => {
                if let Some(st) = self.stacks.as_mut() {
                    st.sample(&s);
                }
            }
            Record::Fs(mut r) => {
                if let Some(st) = self.stacks.as_mut() {
                    r.op.stack = st.take_op(r.op.pid, r.op.req);
                }
                self.procs.handle(Record::Fs(r), self.clock, &self.exporter, self.requests.as_mut(), out);
            }
            Record::Dns(mut r) => {
                if let Some(st) = self.stacks.as_mut() {
                    r.op.stack = st.take_op(r.op.pid, r.op.req);
                }
                self.procs.handle(Record::Dns(r), self.clock, &self.exporter, self.requests.as_mut(), out);
            }
            Record::Gc(r) => {
                self.gcs.add(r);
                self.procs.handle(Record::Gc(r), self.clock, &self.exporter, self.requests.as_mut(), out);
            }
            Record::Loop(mut r) => {
                if let Some(st) = self.stacks.as_mut() {
                    r.stacks = st.take(r.pid, r.start_ns);
                }
                r.gcs = self.gcs.take(&r);
                self.procs.handle(Record::Loop(r), self.clock, &self.exporter, self.requests.as_mut(), out);
            }
            Record::Exec { pid, .. } if self.command_images.is_some() => {
                self.command_exec(pid);
                self.procs.handle(rec, self.clock, &self.exporter, self.requests.as_mut(), out);
            }
            rec => self.procs.handle(rec, self.clock, &self.exporter, self.requests.as_mut(), out),
        }
    }

    /// Unsampled requests the kernel follows (bpf/http_follow.h) that are
    /// over as the request tracker ends its own (not answered whole), whose
    /// process is `gone`, or (`all`) every one: taken from the kernel,
    /// counted in the metrics (with tail exceptions decided in the kernel:
    /// handed to the request tracker with what was held for them).
    fn end_followed(&mut self, all: bool, gone: Option<u32>, out: &mut procs::Out) {
        if self.requests.is_none() {
            return;
        }
        if all || gone.is_some() {
            self.h2_open_at_end += self.tracer.h2_followed_open(gone);
        }
        let now = crate::events::clock::monotonic_ns();
        let ended = self.tracer.followed_over(|last, answered| all || crate::requests::request_over(now, last, answered), gone);
        if self.tail_in_kernel {
            // The tracker decides whether the tail exceptions keep it.
            for r in &ended {
                let held = self.held.take(r.pid, r.cause);
                for rec in crate::requests::held_records(r, &held, &self.inbox.undecodable) {
                    self.handle_one(rec, out);
                }
            }
            return;
        }
        self.followed_ended += ended.len() as u64;
        if let Some(m) = &self.procs.metrics {
            let mut m = m.lock().unwrap_or_else(|e| e.into_inner());
            ended.iter().for_each(|r| m.followed(r));
        }
    }

    /// The request tracker's counters, with the requests the kernel followed.
    fn request_stats(&self) -> Option<crate::requests::RequestStats> {
        let followed = self.tracer.stats().followed_requests + self.followed_ended;
        self.requests.as_ref().map(|r| crate::requests::RequestStats {
            followed,
            tail_lost: self.held.lost,
            h2_open_at_end: self.h2_open_at_end,
            ..r.stats
        })
    }

    /// With metrics: what the kernel counted of a process's unsampled
    /// operations, read at its exit (before its metrics go out a last time).
    fn read_kernel_ops(&mut self, pid: u32) {
        let Some(m) = &self.procs.metrics else { return };
        let kernel_ops = self.tracer.op_hists(Some(pid));
        m.lock().unwrap_or_else(|e| e.into_inner()).kernel_ops(&kernel_ops);
    }

    /// --otlp-listen: the app's SERVER spans that came through the listener
    /// meet uvspan's spans of their requests; what is joined, or waited for
    /// long enough, goes to `out` (everything held with `all`).
    fn join(&mut self, all: bool, out: &mut procs::Out) {
        let (Some(j), Some(l)) = (self.joiner.as_mut(), self.listener.as_ref()) else { return };
        while let Ok(servers) = l.servers.try_recv() {
            j.offer_spans(servers);
        }
        let now = Instant::now();
        let mut ready = Vec::new();
        if let Some(r) = self.requests.as_mut() {
            for (mut key, spans) in r.joinable.drain(..) {
                // The app's SDK names its process as the process sees itself.
                key.app_pid = self.procs.own_pid(key.pid);
                let window = self.cli.join_window.unwrap_or_else(|| self.procs.join_window(key.pid));
                j.hold_for(key, spans, window, now, &mut ready);
            }
        }
        j.poll(now, all, &mut ready);
        for (pid, spans) in ready {
            out.entry(pid).or_default().extend(spans);
        }
        self.health.listen.joined.store(j.stats.joined, Ordering::Relaxed);
        self.health.listen.unjoined.store(j.stats.unjoined, Ordering::Relaxed);
        self.health.listen.twins.store(j.stats.twins_dropped, Ordering::Relaxed);
    }

    /// Processes gone without an exit record are dropped (their in-flight
    /// requests counted), exited ones forgotten; true when every --pid
    /// target has exited.
    fn check_exited(&mut self) -> bool {
        // What a process sent before it went is read first: a tick slowed
        // down (naming stack samples, a slow export) must not make its last
        // records arrive after it was forgotten.
        let _ = self.rb.consume();
        self.handle_records(false);
        for pid in self.procs.find_gone() {
            self.stats.unfinished_at_exit += self.tracer.remove_pid(pid);
            self.traced.exited(pid);
            if let Some(s) = self.stacks.as_mut() {
                s.forget(pid);
            }
            self.gcs.forget(pid);
        }
        let before = self.procs.forgotten;
        self.procs.forget_exited(&self.exporter);
        if self.procs.forgotten != before {
            // What exited processes held (their resource, command line and
            // links, freed on several threads) goes back to the system, not
            // kept by the allocator between long-lived pieces.
            // SAFETY: malloc_trim only walks and releases the allocator's
            // free memory; it takes no pointers of ours.
            unsafe { libc::malloc_trim(0) };
        }
        // --pid: the run ends once the targets and the Node.js processes
        // followed below them have exited.
        let watching = self.watcher.is_some() && !self.follow;
        self.command.is_none() && !watching && self.procs.targets_all_exited() && (!self.follow || self.traced.live() == 0)
    }

    /// What the kernel still holds, flush, the summary; the exit code.
    pub fn shutdown(mut self) -> Result<i32> {
        // What the command left running is stopped (its exits recorded below).
        if !self.cli.command.is_empty() {
            let left = crate::discover::tree::stop_leftovers(Duration::from_secs(3));
            if !left.is_empty() {
                let mut pids: Vec<String> = left.iter().map(u32::to_string).collect();
                pids.truncate(10);
                eprintln!(
                    "uvspan: stopped {} process(es) the command left running (pids {}): none outlives uvspan",
                    left.len(),
                    pids.join(", ")
                );
            }
        }
        let _ = self.rb.consume();
        self.handle_records(true);
        self.read_loop_times();
        let k = self.tracer.stats();
        self.stats.undecodable = self.inbox.undecodable.get();
        self.stats.requests = self.request_stats();
        self.stats.tasks = self.procs.tasks.stats;
        self.stats.sampling = self.sampled();
        self.stats.cost = self.costs();
        if let Some(s) = self.stats.sampler.as_mut() {
            s.1 = self.procs.unsampled;
        }
        self.stats.short = self.procs.short;
        self.stats.gc_events_dropped = self.gcs.dropped;
        self.stats.db = self.wire.stats;
        report::update_health(&self.health, 0, &k, &self.stats);
        let Agent {
            exporter,
            health_metrics,
            op_metrics,
            procs,
            stats,
            cli,
            rb,
            mut tracer,
            published,
            mut exit_code,
            _rt,
            report,
            listener,
            health,
            node_ran,
            exec_unknown,
            loop_seen,
            traced,
            ..
        } = self;
        if let Some(l) = listener {
            l.finish(cli.flush_timeout);
        }
        let counters = exporter.counters();
        let sum = exporter.finish(cli.flush_timeout);
        if let Some(m) = op_metrics {
            m.finish(Duration::from_secs(2));
        }
        if let Some(m) = health_metrics {
            // The last values, within a short deadline: the collector may be gone.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                m.finish();
                let _ = tx.send(());
            });
            let _ = rx.recv_timeout(Duration::from_secs(2));
        }
        // --pid: which processes were traced (the followed ones named), just
        // before the summary.
        if !cli.pids.is_empty() {
            eprintln!("{}", traced.line());
        }
        let mut line = report::summary_line(procs.seen(), procs.seen_node(), &sum, &k, &stats, cli.loop_threshold);
        if !cli.otlp_listen.is_empty() {
            line.push_str("; ");
            line.push_str(&health.listen.summary());
        }
        eprintln!("{line}");
        if let Some(c) = &stats.cost {
            eprintln!("{}", report::cost_line(c));
        }
        let by_process = crate::export::dropped::line(&counters.by_process.lock().unwrap_or_else(|e| e.into_inner()), 5);
        if let Some(l) = by_process {
            eprintln!("{l}");
        }
        if !procs.unseen.is_empty() {
            let mut pids: Vec<String> = procs.unseen.iter().map(u32::to_string).collect();
            pids.truncate(10);
            eprintln!(
                "uvspan: the kernel sent nothing of {} traced process(es), not even their exit (pids {}): their probes did not fire, \
                 their work is missing from this run",
                procs.unseen.len(),
                pids.join(", ")
            );
        }
        // A command under which no Node.js process ran: nothing was traced.
        let maybe = exec_unknown && (loop_seen || k.loop_iterations > 0);
        let nothing = !cli.command.is_empty() && !node_ran && !maybe;
        if nothing {
            eprintln!(
                "uvspan: no Node.js process ran under {} (it and what it started are not Node.js): nothing was traced",
                cli.command[0]
            );
        }
        // The pinned map left as found, now that the kernel side publishes no more.
        if let Some(p) = published {
            tracer.stop_publishing();
            // A program that read the flag just before runs for microseconds.
            std::thread::sleep(Duration::from_millis(2));
            p.close();
        }
        let report_run = report.is_some();
        if let Some(r) = report {
            let facts = crate::report::aggregate::RunFacts {
                command: cli.command.clone(),
                exit_code,
                wall_ms: 0.0,
                loop_threshold_ms: cli.loop_threshold.as_secs_f64() * 1e3,
                loop_iterations: k.loop_iterations,
                commands: procs.commands.clone().unwrap_or_default(),
                unseen: procs.unseen.clone(),
                processes_traced: procs.seen(),
            };
            exit_code = r.finish(facts);
            // A job uvspan could not see is never a clean gate.
            if nothing && exit_code == 0 {
                exit_code = crate::report::EXIT_UNSEEN;
            }
        }
        // Detaching uprobes waits for the kernel (~40 ms): a child process
        // does it after we are gone.
        // Not behind `uvspan run`: a CI job's process group is left empty.
        if report_run {
            drop(rb);
            drop(tracer);
            return Ok(exit_code);
        }
        wake::detach_after_exit();
        drop(rb);
        drop(tracer);
        Ok(exit_code)
    }
}
