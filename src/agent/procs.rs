//! The traced processes: each one's resource goes to the exporter once, its
//! records become spans, and exited ones are forgotten once their spans are
//! queued (but for `--pid` targets, whose exit ends the run).

use std::collections::HashMap;

use opentelemetry_sdk::trace::RandomIdGenerator;

use crate::discover::pidns::Views;
use crate::enrich::resource::ProcessInfo;
use crate::events::clock::Clock;
use crate::events::decode::{DnsRecord, FsRecord, Record};
use crate::events::sampler::Sampler;
use crate::events::spans::{self, Span, SpanContextSource};
use crate::export::Exporter;
use crate::requests::{Ready, Requests};
use crate::tasks::{Tasks, TracePer};

/// One traced process.
struct Proc {
    registered: bool,
    exited: bool,
    /// Given by --pid (its exit counts towards "all targets exited").
    target: bool,
    node_version: Option<String>,
    /// The ids the process sees itself as, when it lives in a PID namespace
    /// below uvspan's (its spans carry those).
    views: Option<Views>,
    /// Records the kernel sent of it (its exit included).
    records: u64,
    /// When it started to be traced, and its CPU time (clock ticks) then.
    since: std::time::Instant,
    cpu0: Option<u64>,
    /// Its loop thread was seen by the probes, or its silence was said.
    loop_checked: bool,
    /// The probes sent an operation of it (not only its fork, exec, exit):
    /// it ran Node.js.
    ran_node: bool,
}

impl Proc {
    fn new(target: bool, node_version: Option<String>) -> Proc {
        Proc {
            registered: false,
            exited: false,
            target,
            node_version,
            views: None,
            records: 0,
            since: std::time::Instant::now(),
            cpu0: None,
            loop_checked: false,
            ran_node: false,
        }
    }
}

/// A process's CPU time so far (user + system, clock ticks).
fn cpu_ticks(pid: u32) -> Option<u64> {
    procfs::process::Process::new(pid as i32).and_then(|p| p.stat()).ok().map(|s| s.utime + s.stime)
}

/// How long a traced process runs before its loop must have been seen.
const LOOP_SEEN_AFTER: std::time::Duration = std::time::Duration::from_secs(5);
/// CPU it must have used meanwhile for the silence to be worth a line.
const LOOP_BUSY_SECS: f64 = 1.0;

/// How a process came to be traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `--pid`: the run ends when all of them have exited.
    Target,
    /// Found by `--all`, started by `-- COMMAND`, or forked by a traced process.
    Other,
}

/// A batch of spans by process, as records are handled.
pub type Out = Ready;

pub struct Procs {
    /// OTEL_TRACES_SAMPLER, decided where each trace starts.
    sampler: Sampler,
    /// The metrics of every operation (before the sampler), when exported.
    pub metrics: Option<std::sync::Arc<std::sync::Mutex<crate::metrics::Metrics>>>,
    /// Operations and loop iterations outside requests whose trace the
    /// sampler dropped.
    pub unsampled: u64,
    /// --min-duration: fs/DNS operations outside requests shorter than
    /// this are not exported, and counted.
    pub min_duration_ns: u64,
    pub short: u64,
    procs: rustc_hash::FxHashMap<u32, Proc>,
    service_name: Option<String>,
    host: String,
    ids: std::rc::Rc<RandomIdGenerator>,
    /// The environ notice was printed.
    warned_environ: bool,
    /// Processes forgotten after they exited.
    pub forgotten: u64,
    /// Of those, the ones the probes saw run Node.js.
    forgotten_node: u64,
    /// Processes that load the OpenTelemetry JS SDK (their SDK makes the
    /// SERVER spans; request context only joins uvspan's work to them).
    with_sdk: std::collections::HashSet<u32>,
    /// The join window of each process (its SDK's batch delay: see
    /// [`crate::listen::join::window_for`]).
    join_windows: HashMap<u32, std::time::Duration>,
    /// `uvspan run`: each process's command line, kept for the report.
    pub commands: Option<HashMap<u32, Vec<String>>>,
    /// Processes gone without the kernel having sent anything of them, not
    /// even their exit: the probes did not see them.
    pub unseen: Vec<u32>,
    /// Records in the batch being handled (see [`Procs::begin_batch`]).
    batch_hint: usize,
    /// Span lists used before, emptied (see [`Procs::give_back`]).
    spare: Vec<Vec<Span>>,
    /// Work no request caused: its tasks, and each process's trace with
    /// `--trace-per process`.
    pub tasks: Tasks,
}

/// A record's thread ids as its process sees them (a process in a PID
/// namespace below uvspan's).
fn own_thread_ids(rec: &mut Record, v: &mut Views) {
    let (pid, tid, worker) = match rec {
        Record::Fs(FsRecord { op, .. }) | Record::Dns(DnsRecord { op, .. }) => (op.pid, &mut op.tid, op.worker_tid.as_mut()),
        Record::Loop(r) => (r.pid, &mut r.tid, None),
        Record::Http(r) => (r.pid, &mut r.tid, None),
        Record::Db(r) => (r.pid, &mut r.tid, None),
        _ => return,
    };
    *tid = v.tid(pid, *tid);
    if let Some(w) = worker {
        *w = v.tid(pid, *w);
    }
}

/// When a process started (kernel monotonic ns, from /proc: clock ticks
/// since boot), for one whose fork or exec was not seen.
fn started_ns(pid: u32) -> u64 {
    let ticks = procfs::process::Process::new(pid as i32).and_then(|p| p.stat()).map_or(0, |s| s.starttime);
    ticks.saturating_mul(1_000_000_000) / procfs::ticks_per_second().max(1)
}

/// Whether a process is still running (not gone, not a zombie).
pub fn alive(pid: u32) -> bool {
    procfs::process::Process::new(pid as i32).and_then(|p| p.stat()).is_ok_and(|s| !matches!(s.state, 'Z' | 'X'))
}

impl Procs {
    pub fn new(service_name: Option<String>, sampler: Sampler) -> Procs {
        Procs {
            sampler,
            metrics: None,
            unsampled: 0,
            min_duration_ns: 0,
            short: 0,
            procs: Default::default(),
            service_name,
            host: crate::enrich::resource::host_name(),
            ids: std::rc::Rc::default(),
            warned_environ: false,
            forgotten: 0,
            forgotten_node: 0,
            with_sdk: Default::default(),
            join_windows: HashMap::new(),
            commands: None,
            unseen: Vec::new(),
            batch_hint: 0,
            spare: Vec::new(),
            tasks: Tasks::new(TracePer::Task, false),
        }
    }

    pub fn contains(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    /// Processes traced and not exited.
    pub fn live(&self) -> usize {
        self.procs.values().filter(|p| !p.exited).count()
    }

    /// The processes traced that have not exited.
    pub fn live_pids(&self) -> Vec<u32> {
        self.procs.iter().filter(|(_, p)| !p.exited).map(|(pid, _)| *pid).collect()
    }

    /// Every process traced in the run.
    pub fn seen(&self) -> u64 {
        self.forgotten + self.procs.len() as u64
    }

    /// Of [`Procs::seen`], the processes whose probes sent an operation: the
    /// Node.js ones (a shell, npm's `sh -c`, a compiler a script runs are
    /// traced too, and send only their lifecycle).
    pub fn seen_node(&self) -> u64 {
        self.forgotten_node + self.procs.values().filter(|p| p.ran_node).count() as u64
    }

    /// Starts tracing `pid`; its resource is sent now (`exporter`) unless it
    /// is a command that has not exec'd node yet (`register_now` false).
    /// A process followed already (forked by a traced one, its exec seen)
    /// keeps what was counted of it; its resource is read again if its
    /// Node.js version was not known right.
    pub fn add(&mut self, pid: u32, origin: Origin, node_version: Option<String>, exporter: &Exporter, register_now: bool) {
        let target = origin == Origin::Target;
        match self.procs.get_mut(&pid) {
            Some(p) if !p.exited => {
                p.target |= target;
                if p.node_version != node_version {
                    p.node_version = node_version;
                    p.registered = false;
                }
            }
            _ => {
                self.procs.insert(pid, Proc::new(target, node_version));
            }
        }
        if register_now {
            self.register(pid, exporter);
        }
    }

    /// Sends the process's resource to the exporter (once, while it is alive).
    fn register(&mut self, pid: u32, exporter: &Exporter) {
        let Some(p) = self.procs.get_mut(&pid) else { return };
        if p.registered {
            return;
        }
        let info = ProcessInfo::read(pid, p.node_version.clone());
        p.views = info.own_pid.map(Views::new);
        if info.environ_denied && !self.warned_environ {
            self.warned_environ = true;
            eprintln!(
                "uvspan: cannot read /proc/{pid}/environ (permission denied): the target's OTEL_SERVICE_NAME, \
                 OTEL_RESOURCE_ATTRIBUTES and K8S_* are not used; give uvspan CAP_DAC_READ_SEARCH (said once)"
            );
        }
        let flag = self.service_name.as_deref();
        let name = info.service_name(flag);
        let resource = info.resource(flag, &self.host);
        if let Some(m) = &self.metrics {
            m.lock().unwrap_or_else(|e| e.into_inner()).resource(pid, &resource);
        }
        exporter.process(pid, resource, format!("{name}[{pid}]"), &info.argv);
        p.registered = true;
        if self.tasks.per() == TracePer::Process {
            self.tasks.process(pid, &info.argv, started_ns(pid), &*self.ids, self.sampler);
        }
        if let Some(c) = self.commands.as_mut() {
            c.insert(pid, info.argv.clone());
        }
        self.join_windows.insert(pid, crate::listen::join::window_for(&info.env));
        if crate::discover::instrumented(&info.argv, &info.env) {
            self.with_sdk.insert(pid);
        } else {
            self.with_sdk.remove(&pid);
        }
    }

    /// One record: process lifecycle updates the table; operations become
    /// spans, added to `out` under their process (with request context:
    /// held with the request that caused them, sent when it ends).
    pub fn handle(&mut self, rec: Record, clock: Clock, exporter: &Exporter, requests: Option<&mut Requests>, out: &mut Out) {
        let ids = self.ids.clone();
        let src = SpanContextSource { clock, ids: &*ids, sampler: self.sampler };
        if let Some(p) = self.procs.get_mut(&rec.pid()) {
            p.records += 1;
        }
        let pid = match &rec {
            Record::Fork { pid, ppid, ts_ns } => {
                self.tasks.started(*pid, *ts_ns);
                let nv = self.procs.get(ppid).and_then(|p| p.node_version.clone());
                let mut child = Proc::new(false, nv);
                child.records = 1; // its fork is the kernel's word of it
                self.procs.insert(*pid, child);
                return;
            }
            Record::Exec { pid, ts_ns } => {
                self.tasks.started(*pid, *ts_ns);
                if let Some(p) = self.procs.get_mut(pid) {
                    p.registered = false; // a new program: read its resource again
                }
                self.register(*pid, exporter);
                return;
            }
            Record::Exit { pid, ts_ns, code, loop_since_ns, loop_time, .. } => {
                self.mark_exited(*pid);
                if let Some(l) = loop_since_ns {
                    self.tasks.loop_started(*pid, *l);
                }
                self.tasks.exited(*pid, *ts_ns, Some(*code), &src, out);
                if let Some(m) = &self.metrics {
                    let mut m = m.lock().unwrap_or_else(|e| e.into_inner());
                    // Its loop up to the exit: the last interval's time and iterations.
                    if let Some(t) = loop_time {
                        m.loop_time(*pid, *t);
                    }
                    // Marked exited by the agent, once the requests this
                    // exit ends are in its metrics.
                }
                if let Some(r) = requests {
                    r.exited(*pid, *ts_ns, &src, out);
                }
                return;
            }
            Record::Stack(_) => return,
            _ => rec.pid(),
        };
        self.procs.entry(pid).or_insert_with(|| Proc::new(false, None)).ran_node = true;
        self.register(pid, exporter);
        let mut rec = rec;
        if let Some(v) = self.procs.get_mut(&pid).and_then(|p| p.views.as_mut()) {
            own_thread_ids(&mut rec, v);
        }
        if let Some(m) = &self.metrics {
            let mut m = m.lock().unwrap_or_else(|e| e.into_inner());
            match &rec {
                Record::Fs(r) => m.fs(r),
                Record::Dns(r) => m.dns(r),
                Record::Gc(r) => m.gc(r),
                Record::Db(r) => m.db(r),
                _ => {}
            }
        }
        // An operation of a trace the kernel's sampler dropped: its metric only.
        if matches!(&rec, Record::Db(d) if d.dropped) {
            return;
        }
        // A collection's span event goes with its iteration (the agent's).
        if matches!(rec, Record::Gc(_)) {
            return;
        }
        // The process's list in this batch, sized for it up front (the
        // request tracker builds into it too).
        let hint = self.batch_hint;
        let spare = &mut self.spare;
        out.entry(pid).or_insert_with(|| spare.pop().unwrap_or_else(|| Vec::with_capacity(hint)));
        let rec = match (requests, rec) {
            // A task's outgoing call, or its response.
            (Some(r), Record::Http(h)) if crate::tasks::cause::task_of(h.cause).is_some() && !r.claims(&h) => {
                self.tasks.http(&h, &src, out);
                None
            }
            (Some(r), Record::Http(h)) => {
                r.http(&h, self.with_sdk.contains(&h.pid), &src, out);
                None
            }
            (Some(r), rec) => r.work(rec, &src, out),
            (None, rec) => Some(rec),
        };
        let rec = rec.filter(|r| {
            let short = match r {
                Record::Fs(f) => f.op.end_ns.saturating_sub(f.op.start_ns) < self.min_duration_ns,
                Record::Dns(d) => d.op.end_ns.saturating_sub(d.op.start_ns) < self.min_duration_ns,
                _ => false,
            };
            self.short += u64::from(short);
            !short
        });
        let rec = rec.and_then(|r| self.tasks.work(r, &src, out));
        if let Some(rec) = rec {
            if !spans::build_into(rec, &src, None, out.entry(pid).or_default()) {
                self.unsampled += 1;
            }
        }
    }

    /// A span list the batch's spans were taken from, for the next batch
    /// (two are kept: a batch is usually one process's).
    pub fn give_back(&mut self, mut list: Vec<Span>) {
        if list.capacity() > 0 && self.spare.len() < 2 {
            list.clear();
            self.spare.push(list);
        }
    }

    /// A batch of `records` is about to be handled: a process's first span
    /// list in it is sized for them (not grown span by span).
    pub fn begin_batch(&mut self, records: usize) {
        self.batch_hint = records.min(4096);
    }

    /// The pid a process sees itself as (its SDK's `process.pid`).
    /// How long the spans of `pid`'s requests wait for its SDK's SERVER
    /// span (by its OTEL_BSP_SCHEDULE_DELAY).
    pub fn join_window(&self, pid: u32) -> std::time::Duration {
        self.join_windows.get(&pid).copied().unwrap_or_else(|| crate::listen::join::window_for(&[]))
    }

    pub fn own_pid(&self, pid: u32) -> u32 {
        self.procs.get(&pid).and_then(|p| p.views.as_ref()).map_or(pid, |v| v.pid)
    }

    /// Requests and tasks over by `now_ns` (kernel time), or all of them
    /// (`all`: uvspan is stopping).
    pub fn expire(&mut self, requests: Option<&mut Requests>, clock: Clock, now_ns: u64, all: bool, out: &mut Out) {
        let src = SpanContextSource { clock, ids: &*self.ids, sampler: self.sampler };
        match (requests, all) {
            (Some(r), true) => r.finish_all(now_ns, &src, out),
            (Some(r), false) => r.expire(now_ns, &src, out),
            (None, _) => {}
        }
        if all {
            self.tasks.finish_all(now_ns, &src, out);
        } else {
            self.tasks.expire(now_ns, &src, out);
        }
    }

    pub fn mark_exited(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.exited = true;
        }
    }

    /// Processes the kernel has not reported gone but /proc has (a missed
    /// exit record): marked exited and returned. One the kernel sent
    /// nothing of at all is [`Procs::unseen`].
    pub fn find_gone(&mut self) -> Vec<u32> {
        let gone: Vec<u32> = self.procs.iter().filter(|(pid, p)| !p.exited && !alive(**pid)).map(|(p, _)| *p).collect();
        for &pid in &gone {
            if self.procs.get(&pid).is_some_and(|p| p.records == 0 && p.registered) {
                self.unseen.push(pid);
            }
            self.mark_exited(pid);
        }
        gone
    }

    /// Lines for live processes traced for a while whose loop thread no
    /// probe has seen although they kept a CPU busy (`seen`: whether the
    /// kernel holds loop state for a thread): said once per process.
    pub fn silent_loops(&mut self, seen: impl Fn(u32) -> bool) -> Vec<String> {
        let tick = procfs::ticks_per_second() as f64;
        let mut out = Vec::new();
        for (&pid, p) in self.procs.iter_mut().filter(|(_, p)| !p.exited && !p.loop_checked && p.registered) {
            if seen(pid) {
                p.loop_checked = true;
                continue;
            }
            let Some(now) = cpu_ticks(pid) else { continue };
            let cpu0 = *p.cpu0.get_or_insert(now);
            let busy = now.saturating_sub(cpu0) as f64 / tick;
            if p.since.elapsed() >= LOOP_SEEN_AFTER && busy >= LOOP_BUSY_SECS {
                p.loop_checked = true;
                // A command's child that exec'd something else (a compiler
                // a build script runs) has no loop to see.
                if crate::symbols::locate(pid).is_err() {
                    continue;
                }
                // Operations seen, no loop yet: a compiler or a script that
                // runs to its end before its loop (tsc). Its spans are not
                // missing; its loop figures are empty until it starts.
                if p.ran_node {
                    out.push(format!(
                        "uvspan: process {pid} has run {busy:.1} s of CPU for {:.0} s without entering its event loop ({} records of its \
                         synchronous work so far): its operations are traced; loop iterations, and loop budgets, cover it once its loop starts",
                        p.since.elapsed().as_secs_f64(),
                        p.records
                    ));
                    continue;
                }
                out.push(format!(
                    "uvspan: process {pid} used {busy:.1} s of CPU in its first {:.0} s of tracing and no probe has seen its event loop \
                     ({} records): its spans are missing; run `uvspan probes --pid {pid}` to see which probes its build has",
                    p.since.elapsed().as_secs_f64(),
                    p.records
                ));
            }
        }
        out
    }

    /// Forgets exited processes (their spans are already queued; the
    /// exporter drops their resource after them), except `--pid` targets.
    pub fn forget_exited(&mut self, exporter: &Exporter) {
        for (pid, p) in self.procs.iter().filter(|(_, p)| p.exited && !p.target) {
            exporter.forget(*pid);
            self.with_sdk.remove(pid);
            self.join_windows.remove(pid);
            self.forgotten += 1;
            self.forgotten_node += u64::from(p.ran_node);
        }
        self.procs.retain(|_, p| !p.exited || p.target);
    }

    /// Whether every `--pid` target has exited (false when there are none).
    pub fn targets_all_exited(&self) -> bool {
        let mut targets = self.procs.values().filter(|p| p.target).peekable();
        targets.peek().is_some() && targets.all(|p| p.exited)
    }
}
