//! The task tracker: the work of each background task held until the task
//! is quiet, then built under its root span; with `--trace-per process`,
//! each process's spans under its root span, held until it exits (within
//! bounds). Pure: no kernel, no clock of its own (times are the records').

use std::collections::VecDeque;

use opentelemetry::trace::{SpanId, TraceId, TraceState};
use opentelemetry_sdk::trace::IdGenerator;
use rustc_hash::FxHashMap;

use super::cause::{started_ns, task_of, TaskKind};
use super::modules::{Files, ModuleOp};
use super::spans::{process_span, startup_span, task_span};
use crate::events::decode::{DnsRecord, FsRecord, HttpRecord, HttpWhat, Record};
use crate::events::sampler::Sampler;
use crate::events::spans::{build_into, Parent, Span, SpanContextSource};
use crate::requests::head::{parse_request, Head};
use crate::requests::{call_span, Call, FinishedCall, Ready};

/// Operations held per task before they are sent as they come.
const HELD_MAX: usize = 512;
/// Tasks open at once before the oldest is sent as it is.
const OPEN_MAX: usize = 8192;
/// Finished tasks remembered for work that arrives late.
const RECENT_MAX: usize = 8192;
/// A task with no new work for this long is over.
pub(super) const QUIET_NS: u64 = 500_000_000;
/// A task waiting for a call's response is over after this all the same.
const CALL_WAIT_NS: u64 = 30_000_000_000;
/// A process's spans held (for one tree at its exit) before they go out as
/// they come: at most this many, for at most this long.
const PROCESS_HELD_MAX: usize = 8192;
const PROCESS_HELD_NS: u64 = 5_000_000_000;

/// What a trace is made of, for work no request caused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TracePer {
    /// Each task is a trace (its root span: the task); the start-up's and
    /// other work outside tasks: a trace per operation.
    #[default]
    Task,
    /// Each process is a trace: its root span (exec → exit), its start-up
    /// and its tasks under it.
    Process,
}

/// Which fs operations are counted on the span they ran under (how many,
/// their time, failures, the slowest) instead of being a span each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum StartupOps {
    /// None: a span each.
    Spans,
    /// Module loading (`require` and the ES module loader resolving,
    /// statting and reading module files), wherever it runs: the start-up,
    /// `main`, any task.
    #[default]
    Modules,
    /// Module loading, and with a trace per process every other sync fs
    /// call of the start-up and `main` too (top-level `*Sync` calls).
    Summary,
}

/// The slowest operations a summary names.
const SUMMARY_SLOWEST: usize = 5;

/// Operations counted, not sent: how many, their time, their failures, and
/// the slowest (duration, "name path"), slowest first.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) count: u32,
    pub(super) ns: u64,
    pub(super) errors: u32,
    pub(super) slowest: Vec<(u64, String)>,
}

impl Tally {
    /// `f` counted (`file`: the file its fd is open on, for its name).
    fn add(&mut self, f: &FsRecord, file: Option<&str>) {
        let took = f.op.end_ns.saturating_sub(f.op.start_ns);
        self.count += 1;
        self.ns += took;
        self.errors += u32::from(f.result < 0);
        if self.slowest.len() < SUMMARY_SLOWEST || self.slowest.last().is_some_and(|l| l.0 < took) {
            let what = format!("{} {}", fs_name(f), f.path.as_deref().or(file).unwrap_or(""));
            let at = self.slowest.partition_point(|s| s.0 >= took);
            self.slowest.insert(at, (took, what.trim_end().to_string()));
            self.slowest.truncate(SUMMARY_SLOWEST);
        }
    }
}

fn fs_name(f: &FsRecord) -> &'static str {
    crate::probes::catalog::fs_op(f.op_id).map_or("fs.unknown", |o| o.span)
}

/// Counters of the task tracker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskStats {
    /// Tasks that did traced work (sampled or not).
    pub tasks: u64,
    /// Process traces made (`--trace-per process`): processes that did
    /// traced work, sampled or not.
    pub processes: u64,
    /// Tasks (or, per process, operations) the sampler dropped.
    pub unsampled: u64,
    /// Operations sent as they came because their task held too many, or
    /// too many tasks were open.
    pub not_held: u64,
    /// Operations counted on the span they ran under, not sent (module
    /// loading; with `StartupOps::Summary`, the start-ups' sync fs calls).
    pub summarised: u64,
}

/// A task in progress (what the span builder reads is `pub(super)`).
#[derive(Debug)]
pub(super) struct Task {
    pub(super) pid: u32,
    pub(super) tid: u32,
    pub(super) kind: TaskKind,
    pub(super) start_ns: u64,
    pub(super) last_ns: u64,
    pub(super) span_id: SpanId,
    trace_id: TraceId,
    held: Vec<Record>,
    /// Its outgoing HTTP/1 calls (their CLIENT spans).
    calls: Vec<Call>,
    pub(super) ops: u32,
    /// Its module loading, counted.
    pub(super) modules: Tally,
    /// Not a task: a process's module loading outside tasks with a trace
    /// per task (its span: `startup`, or `main` once the loop ran).
    pub(super) outside: bool,
    /// The kernel's sampler dropped it (its work sent no record).
    dropped: bool,
}

impl Task {
    /// Waiting for a call's response (not over while quiet).
    fn waiting(&self) -> bool {
        self.calls.iter().any(|c| c.end_ns.is_none())
    }
}

/// A process's trace (`--trace-per process`).
#[derive(Debug)]
pub(super) struct Life {
    pub(super) trace_id: TraceId,
    pub(super) span_id: SpanId,
    sampled: bool,
    pub(super) start_ns: u64,
    pub(super) last_ns: u64,
    pub(super) argv: Vec<String>,
    /// The work outside tasks and requests (with request context; without
    /// it, all work is directly under the root span): before the loop
    /// first ran (`startup`: the main module's run, module loading), and
    /// the callbacks and promise chains that run started (`main`).
    pub(super) startup: Option<Startup>,
    pub(super) main: Option<Startup>,
    /// That work, held until it is known which of the two it is (and
    /// whether it was module loading: the file of its fd, if it has one).
    pending: Vec<(Record, Option<ModuleOp>)>,
    /// When its loop first ran (kernel ns), once known.
    loop_since: Option<u64>,
    pub(super) tasks: u32,
    /// Spans built, waiting for the process's exit or the hold's bounds.
    held: Vec<Span>,
    held_since: Option<u64>,
    /// Spans of it that went out (its root span goes at its exit if any did).
    spans: u64,
}

#[derive(Debug)]
pub(super) struct Startup {
    pub(super) span_id: SpanId,
    pub(super) start_ns: u64,
    pub(super) end_ns: u64,
    pub(super) ops: u32,
    /// Module loading counted.
    pub(super) modules: Tally,
    /// Other sync fs calls counted (`StartupOps::Summary`).
    pub(super) sync_fs: Tally,
}

impl Startup {
    fn new(span_id: SpanId, start_ns: u64, end_ns: u64) -> Startup {
        Startup { span_id, start_ns, end_ns, ops: 0, modules: Tally::default(), sync_fs: Tally::default() }
    }

    /// `rec` counted, not sent: true when it was (module loading, or with
    /// `Summary` a sync fs call), false to send it as a span.
    fn summarise(&mut self, rec: &Record, module: Option<&ModuleOp>, ops: StartupOps) -> bool {
        let Record::Fs(f) = rec else { return false };
        match module {
            Some(m) => self.modules.add(f, m.file.as_deref()),
            None if ops == StartupOps::Summary && f.op.sync => self.sync_fs.add(f, None),
            None => return false,
        }
        true
    }
}

impl Life {
    fn parent(&self, span_id: SpanId) -> Parent {
        Parent { trace_id: self.trace_id, span_id, remote: false, state: TraceState::NONE }
    }
}

pub struct Tasks {
    per: TracePer,
    startup_ops: StartupOps,
    /// Work outside tasks goes under a start-up span (the kernel tags
    /// tasks: request context is on).
    startup: bool,
    open: FxHashMap<(u32, u64), Task>,
    order: VecDeque<(u32, u64)>,
    /// Finished tasks: where their late work goes (an INVALID trace: not
    /// sampled, not sent).
    recent: FxHashMap<(u32, u64), Parent>,
    recent_order: VecDeque<(u32, u64)>,
    lives: FxHashMap<u32, Life>,
    /// When processes started (their fork or exec), before their trace is made.
    starts: FxHashMap<u32, u64>,
    /// Per process, what tells its module loading (unless `StartupOps::Spans`).
    files: FxHashMap<u32, Files>,
    pub stats: TaskStats,
    /// With metrics: the calls of finished tasks, sampled or not (pid,
    /// call), for `http.client.request.duration`; drained by the agent.
    pub finished_calls: Option<Vec<(u32, FinishedCall)>>,
    /// The last HTTPS call written (pid, thread, cause, TLS connection):
    /// the next write of that thread and cause is its ciphertext, on its
    /// socket (another cause's write between them, such as the server's
    /// own handshake in the same process, is not).
    tls_last: Option<(u32, u32, u64, u64)>,
    /// (pid, TLS connection or socket) -> the task whose HTTPS call on it
    /// is not answered yet: node retries an SSL_write the handshake held
    /// back in whichever callback runs next (another task's too).
    tls_owner: FxHashMap<(u32, u64), (u32, u64)>,
}

/// Where a process's spans go now: held for its tree, or out.
fn sink<'a>(lives: &'a mut FxHashMap<u32, Life>, ready: &'a mut Ready, pid: u32, now_ns: u64) -> &'a mut Vec<Span> {
    match lives.get_mut(&pid) {
        Some(l) => {
            l.held_since.get_or_insert(now_ns);
            &mut l.held
        }
        None => ready.entry(pid).or_default(),
    }
}

impl Tasks {
    /// `tasks_tagged`: the kernel tags work with its task (request context
    /// is on); otherwise every operation is outside tasks.
    pub fn new(per: TracePer, tasks_tagged: bool) -> Tasks {
        Tasks {
            per,
            startup_ops: StartupOps::default(),
            startup: tasks_tagged,
            open: FxHashMap::default(),
            order: VecDeque::new(),
            recent: FxHashMap::default(),
            recent_order: VecDeque::new(),
            lives: FxHashMap::default(),
            starts: FxHashMap::default(),
            files: FxHashMap::default(),
            stats: TaskStats::default(),
            finished_calls: None,
            tls_last: None,
            tls_owner: FxHashMap::default(),
        }
    }

    pub fn per(&self) -> TracePer {
        self.per
    }

    /// What start-up spans hold of their sync fs calls.
    pub fn startup_ops(mut self, ops: StartupOps) -> Tasks {
        self.startup_ops = ops;
        self
    }

    /// Tasks open now.
    pub fn open(&self) -> usize {
        self.open.len()
    }

    /// A process started (its fork or exec, kernel ns).
    pub fn started(&mut self, pid: u32, ts_ns: u64) {
        if self.per == TracePer::Process && !self.lives.contains_key(&pid) {
            self.starts.insert(pid, ts_ns);
        }
    }

    /// A process is traced (or exec'd a new program): its trace, with
    /// `--trace-per process`. `start_ns`: when it started, if its fork or
    /// exec was not seen.
    pub fn process(&mut self, pid: u32, argv: &[String], start_ns: u64, ids: &dyn IdGenerator, sampler: Sampler) {
        // A new program: what was known of the old one's files is not its.
        self.files.remove(&pid);
        if self.per != TracePer::Process {
            return;
        }
        if let Some(l) = self.lives.get_mut(&pid) {
            l.argv = argv.to_vec();
            return;
        }
        let start_ns = self.starts.remove(&pid).unwrap_or(start_ns);
        let trace_id = ids.new_trace_id();
        self.lives.insert(
            pid,
            Life {
                trace_id,
                span_id: ids.new_span_id(),
                sampled: sampler.keeps(None, trace_id),
                start_ns,
                last_ns: start_ns,
                argv: argv.to_vec(),
                startup: None,
                main: None,
                pending: Vec::new(),
                loop_since: None,
                tasks: 0,
                held: Vec::new(),
                held_since: None,
                spans: 0,
            },
        );
    }

    /// A record the request tracker gave back (no request caused it): held
    /// with its task, or built under its process's trace, or given back
    /// (its own trace).
    pub fn work(&mut self, rec: Record, src: &SpanContextSource<'_>, ready: &mut Ready) -> Option<Record> {
        let (cause, pid, end) = match &rec {
            Record::Fs(FsRecord { op, .. }) | Record::Dns(DnsRecord { op, .. }) => (op.cause, op.pid, op.end_ns),
            Record::Db(r) => (r.cause, r.pid, r.end_ns),
            Record::Loop(r) => (0, r.pid, r.end_ns),
            _ => return Some(rec),
        };
        let module = self.module_load(&rec);
        if let Some(kind) = task_of(cause) {
            self.task_work(rec, module, (pid, cause), kind, end, src, ready);
            return None;
        }
        let Some(life) = self.lives.get_mut(&pid) else {
            // A trace per task: the module loading of the start-up (or of
            // `main`) counted on one span, the rest its own traces.
            if module.is_some() {
                self.task_work(rec, module, (pid, 0), TaskKind::Io, end, src, ready);
                return None;
            }
            return Some(rec);
        };
        if !life.sampled {
            self.stats.unsampled += 1;
            return None;
        }
        life.last_ns = life.last_ns.max(end);
        life.held_since.get_or_insert(end);
        match (&rec, self.startup) {
            (Record::Loop(_), _) | (_, false) if module.is_none() => {
                let parent = life.parent(life.span_id);
                build_into(rec, src, Some(&parent), &mut life.held);
            }
            _ => {
                life.pending.push((rec, module));
                if life.pending.len() >= PROCESS_HELD_MAX {
                    self.stats.summarised += settle(life, self.startup_ops, src);
                }
            }
        }
        None
    }

    /// Whether `rec` is module loading (and the file of its fd), unless
    /// every operation is a span.
    fn module_load(&mut self, rec: &Record) -> Option<ModuleOp> {
        let Record::Fs(f) = rec else { return None };
        if self.startup_ops == StartupOps::Spans {
            return None;
        }
        if self.files.len() >= OPEN_MAX && !self.files.contains_key(&f.op.pid) {
            self.files.clear();
        }
        self.files.entry(f.op.pid).or_default().module_load(fs_name(f), f)
    }

    /// When a process's loop first ran (kernel ns): its work outside tasks
    /// that started before is its start-up's.
    pub fn loop_started(&mut self, pid: u32, since_ns: u64) {
        if let Some(l) = self.lives.get_mut(&pid) {
            l.loop_since.get_or_insert(since_ns);
        }
        if let Some(f) = self.files.get_mut(&pid) {
            f.loop_since.get_or_insert(since_ns);
        }
    }

    /// Processes whose loop start is not known yet and matters: those with
    /// a trace, and those whose module loading outside tasks is counted.
    pub fn loop_start_unknown(&self) -> Vec<u32> {
        let lives = self.lives.iter().filter(|(_, l)| l.loop_since.is_none()).map(|(p, _)| *p);
        let outside = self.open.keys().filter(|k| k.1 == 0 && self.files.get(&k.0).is_some_and(|f| f.loop_since.is_none())).map(|k| k.0);
        let mut pids: Vec<u32> = lives.chain(outside).collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// `rec` of the task `key` (cause 0: a process's module loading outside
    /// tasks, with a trace per task): held with it, or counted on it
    /// (`module`), or sent under it when it holds too many or is over.
    #[allow(clippy::too_many_arguments)]
    fn task_work(
        &mut self,
        rec: Record,
        module: Option<ModuleOp>,
        key: (u32, u64),
        kind: TaskKind,
        end: u64,
        src: &SpanContextSource<'_>,
        ready: &mut Ready,
    ) {
        if let Some(t) = self.open.get_mut(&key) {
            t.last_ns = t.last_ns.max(end);
            t.ops += 1;
            if let (Some(m), Record::Fs(f)) = (&module, &rec) {
                t.start_ns = t.start_ns.min(f.op.start_ns);
                t.modules.add(f, m.file.as_deref());
                self.stats.summarised += 1;
                return;
            }
            if t.held.len() < HELD_MAX {
                t.held.push(rec);
                return;
            }
            self.stats.not_held += 1;
            let parent = Parent { trace_id: t.trace_id, span_id: t.span_id, remote: false, state: TraceState::NONE };
            let dropped = t.dropped;
            if self.keeps(key.0, dropped, parent.trace_id, src) {
                build_into(rec, src, Some(&parent), sink(&mut self.lives, ready, key.0, end));
            }
            return;
        }
        // A finished task's late work joins its trace (a span each); module
        // loading outside tasks after a while starts a span of its own.
        if let Some(parent) = self.recent.get(&key).filter(|_| key.1 != 0) {
            if parent.trace_id != TraceId::INVALID {
                let parent = parent.clone();
                build_into(rec, src, Some(&parent), sink(&mut self.lives, ready, key.0, end));
            }
            return;
        }
        let (tid, dropped, start) = match &rec {
            Record::Fs(FsRecord { op, .. }) | Record::Dns(DnsRecord { op, .. }) => (op.tid, op.dropped, op.start_ns),
            _ => (0, false, end),
        };
        let t = self.new_task(key, kind, tid, dropped, end, src, ready);
        match (&module, &rec) {
            (Some(m), Record::Fs(f)) => {
                t.start_ns = t.start_ns.min(start);
                t.modules.add(f, m.file.as_deref());
                self.stats.summarised += 1;
            }
            _ => t.held.push(rec),
        }
    }

    /// A task's first record: the task, open (the oldest ones sent as they
    /// are past OPEN_MAX).
    #[allow(clippy::too_many_arguments)]
    fn new_task(
        &mut self,
        key: (u32, u64),
        kind: TaskKind,
        tid: u32,
        dropped: bool,
        end: u64,
        src: &SpanContextSource<'_>,
        ready: &mut Ready,
    ) -> &mut Task {
        let pid = key.0;
        let outside = key.1 == 0;
        let trace_id = match self.lives.get(&pid) {
            Some(l) => l.trace_id,
            None if outside => src.ids.new_trace_id(),
            None => src.trace_for(key.1),
        };
        let start_ns = if outside { end } else { started_ns(key.1).min(end) };
        let span_id = src.ids.new_span_id();
        let task = Task {
            pid,
            tid,
            kind,
            start_ns,
            last_ns: end,
            span_id,
            trace_id,
            held: Vec::new(),
            calls: Vec::new(),
            ops: 1,
            modules: Tally::default(),
            outside,
            dropped,
        };
        self.open.insert(key, task);
        self.order.push_back(key);
        while self.open.len() > OPEN_MAX {
            let Some(oldest) = self.order.pop_front() else { break };
            if self.open.contains_key(&oldest) && oldest != key {
                self.stats.not_held += 1;
                self.finish(oldest, src, ready);
            }
        }
        self.open.get_mut(&key).expect("just opened")
    }

    /// An HTTP record of a task's (its cause is a task's): the request of
    /// an outgoing call it made, or that call's response.
    pub fn http(&mut self, r: &HttpRecord, src: &SpanContextSource<'_>, ready: &mut Ready) {
        let Some(kind) = task_of(r.cause) else { return };
        let key = (r.pid, r.cause);
        match r.what {
            HttpWhat::Write => {
                let Some(head) = parse_request(&r.data) else {
                    // An HTTPS call's ciphertext, right after its SSL_write.
                    if let Some((.., tls)) = self.tls_last.take_if(|l| !r.tls && (l.0, l.1, l.2) == (r.pid, r.tid, r.cause)) {
                        if let Some(owner) = self.tls_owner.get(&(r.pid, tls)).copied() {
                            if let Some(c) = self.open.get_mut(&owner).and_then(|t| t.calls.iter_mut().find(|c| c.waits_on(tls))) {
                                c.stream = Some(r.conn);
                                self.tls_owner.insert((r.pid, r.conn), owner);
                            }
                        }
                    }
                    return;
                };
                if r.tls {
                    self.tls_last = Some((r.pid, r.tid, r.cause, r.conn));
                    // The same call again: its SSL_write retried.
                    if let Some(owner) = self.tls_owner.get(&(r.pid, r.conn)).copied() {
                        if let Some(c) = self.open.get_mut(&owner).and_then(|t| t.calls.iter_mut().find(|c| c.waits_on(r.conn))) {
                            c.stream = None;
                            return;
                        }
                    }
                    if self.tls_owner.len() >= OPEN_MAX {
                        self.tls_owner.clear();
                    }
                    self.tls_owner.insert((r.pid, r.conn), key);
                }
                self.add_call(key, kind, Call::new(r, head, r.tls, None, false), r, src, ready);
            }
            HttpWhat::Http2Client => {
                let head = Head::h2_request(&r.data);
                let tls = head.header(":scheme") == Some("https");
                self.add_call(key, kind, Call::new(r, head, tls, Some(r.stream), false), r, src, ready);
            }
            // An outgoing HTTP/2 stream's :status, grpc-status, end.
            HttpWhat::Http2Header | HttpWhat::Http2Close if r.stream != 0 => {
                let Some(t) = self.open.get_mut(&key) else { return };
                let Some(c) = t.calls.iter_mut().find(|c| c.is_stream_of(r)) else { return };
                c.h2_record(r);
                t.last_ns = t.last_ns.max(r.ts_ns);
            }
            HttpWhat::Response => {
                // Read on the socket the call went out on, under the cause
                // of its last write there (an HTTPS call's retry: maybe
                // another task's).
                let owner = self.tls_owner.remove(&(r.pid, r.conn)).filter(|o| self.open.contains_key(o)).unwrap_or(key);
                let Some(t) = self.open.get_mut(&owner) else { return };
                if let Some(c) = t.calls.iter_mut().find(|c| c.waits_on(r.conn)) {
                    c.answered(r);
                    t.last_ns = t.last_ns.max(r.ts_ns);
                    if c.tls {
                        self.tls_owner.remove(&(r.pid, c.conn));
                    }
                }
            }
            _ => {}
        }
    }

    /// A call the task `key` made (`r`: its request's record): held with
    /// the task (a new one if it is not open), up to HELD_MAX.
    fn add_call(&mut self, key: (u32, u64), kind: TaskKind, call: Call, r: &HttpRecord, src: &SpanContextSource<'_>, ready: &mut Ready) {
        match self.open.get_mut(&key) {
            Some(t) => {
                t.last_ns = t.last_ns.max(r.ts_ns);
                if t.calls.len() < HELD_MAX {
                    t.ops += 1;
                    t.calls.push(call);
                } else {
                    self.stats.not_held += 1;
                }
            }
            // A finished task's late call: its span is not made.
            None if self.recent.contains_key(&key) => self.stats.not_held += 1,
            None => self.new_task(key, kind, r.tid, r.dropped, r.ts_ns, src, ready).calls.push(call),
        }
    }

    /// Whether a task's trace is kept: its process's decision, or its own.
    fn keeps(&self, pid: u32, dropped: bool, trace_id: TraceId, src: &SpanContextSource<'_>) -> bool {
        match self.lives.get(&pid) {
            Some(l) => l.sampled,
            // The kernel's sampler may have dropped it (its work sent no record).
            None => !dropped && src.sampler.keeps(None, trace_id),
        }
    }

    /// A task is over: its spans (into its process's hold, or out), and its
    /// context kept for late work.
    fn finish(&mut self, key: (u32, u64), src: &SpanContextSource<'_>, ready: &mut Ready) {
        let Some(mut t) = self.open.remove(&key) else { return };
        if !t.outside {
            self.stats.tasks += 1;
        }
        if let Some(f) = self.finished_calls.as_mut() {
            f.extend(t.calls.iter().map(|c| (t.pid, c.finished(t.last_ns))));
        }
        let sampled = self.keeps(t.pid, t.dropped, t.trace_id, src);
        let under = Parent { trace_id: t.trace_id, span_id: t.span_id, remote: false, state: TraceState::NONE };
        if !t.outside {
            self.recent.insert(key, if sampled { under.clone() } else { Parent { trace_id: TraceId::INVALID, ..under.clone() } });
            self.recent_order.push_back(key);
        }
        while self.recent_order.len() > RECENT_MAX {
            if let Some(old) = self.recent_order.pop_front() {
                self.recent.remove(&old);
            }
        }
        if !sampled {
            self.stats.unsampled += 1;
            return;
        }
        let root = match self.lives.get_mut(&t.pid) {
            Some(l) => {
                l.tasks += 1;
                l.last_ns = l.last_ns.max(t.last_ns);
                l.parent(l.span_id)
            }
            None => Parent { trace_id: t.trace_id, span_id: SpanId::INVALID, remote: false, state: TraceState::NONE },
        };
        let name = match t.outside {
            true if self.files.get(&t.pid).and_then(|f| f.loop_since).is_some_and(|since| t.start_ns >= since) => "main",
            true => "startup",
            false => t.kind.name(),
        };
        let out = sink(&mut self.lives, ready, t.pid, t.last_ns);
        out.reserve(t.held.len() + 1);
        out.push(task_span(&t, name, &root, src));
        for c in t.calls.iter().filter(|c| !c.is_otlp_export()) {
            out.push(call_span(&c.span_parts(t.last_ns), src.ids.new_span_id(), &under, src));
        }
        for rec in std::mem::take(&mut t.held) {
            build_into(rec, src, Some(&under), out);
        }
    }

    /// Tasks over by now (`now_ns`, kernel time), and process holds past
    /// their bounds: their spans.
    pub fn expire(&mut self, now_ns: u64, src: &SpanContextSource<'_>, ready: &mut Ready) {
        let over: Vec<(u32, u64)> = self
            .open
            .iter()
            .filter(|(_, t)| {
                let quiet = now_ns.saturating_sub(t.last_ns);
                quiet >= QUIET_NS && (!t.waiting() || quiet >= CALL_WAIT_NS)
            })
            .map(|(k, _)| *k)
            .collect();
        for k in over {
            self.finish(k, src, ready);
        }
        for (pid, l) in &mut self.lives {
            let full = l.held.len() >= PROCESS_HELD_MAX || l.held_since.is_some_and(|t| now_ns.saturating_sub(t) >= PROCESS_HELD_NS);
            if full {
                self.stats.summarised += settle(l, self.startup_ops, src);
            }
            if full && !l.held.is_empty() {
                l.spans += l.held.len() as u64;
                ready.entry(*pid).or_default().append(&mut l.held);
                l.held_since = None;
            }
        }
    }

    /// A process exited (kernel time, its exit code): its tasks are over,
    /// and its trace ends.
    pub fn exited(&mut self, pid: u32, ts_ns: u64, code: Option<i32>, src: &SpanContextSource<'_>, ready: &mut Ready) {
        let mine: Vec<(u32, u64)> = self.open.keys().filter(|k| k.0 == pid).copied().collect();
        for k in mine {
            self.finish(k, src, ready);
        }
        self.starts.remove(&pid);
        self.files.remove(&pid);
        if let Some(l) = self.lives.remove(&pid) {
            self.end_life(pid, l, ts_ns, code, src, ready);
        }
    }

    /// Everything still open (uvspan is stopping, `now_ns`): processes
    /// still running end their trace now.
    pub fn finish_all(&mut self, now_ns: u64, src: &SpanContextSource<'_>, ready: &mut Ready) {
        let all: Vec<(u32, u64)> = self.open.keys().copied().collect();
        for k in all {
            self.finish(k, src, ready);
        }
        let pids: Vec<u32> = self.lives.keys().copied().collect();
        for pid in pids {
            if let Some(l) = self.lives.remove(&pid) {
                self.end_life(pid, l, now_ns, None, src, ready);
            }
        }
    }

    /// A process's trace ends: its start-up span, its root span and what
    /// was held, out (nothing for a process that did no traced work).
    fn end_life(&mut self, pid: u32, mut l: Life, end_ns: u64, code: Option<i32>, src: &SpanContextSource<'_>, ready: &mut Ready) {
        self.stats.summarised += settle(&mut l, self.startup_ops, src);
        if l.held.is_empty() && l.spans == 0 && l.startup.is_none() && l.main.is_none() {
            return;
        }
        self.stats.processes += 1;
        if !l.sampled {
            return;
        }
        let out = ready.entry(pid).or_default();
        out.reserve(l.held.len() + 3);
        out.push(process_span(&l, end_ns.max(l.last_ns), code, src));
        for (part, name) in [(&l.startup, "startup"), (&l.main, "main")] {
            if let Some(s) = part {
                out.push(startup_span(&l, s, name, src));
            }
        }
        out.append(&mut l.held);
    }
}

/// A process's pending work outside tasks goes under its start-up span
/// (started before its loop first ran, or when that is not known) or its
/// main span (after), built into its hold, or counted on that span (module
/// loading; with `StartupOps::Summary`, sync fs calls). Returns how many
/// were counted.
fn settle(l: &mut Life, ops: StartupOps, src: &SpanContextSource<'_>) -> u64 {
    let mut counted = 0;
    for (rec, module) in std::mem::take(&mut l.pending) {
        let (start, end) = match &rec {
            Record::Fs(FsRecord { op, .. }) | Record::Dns(DnsRecord { op, .. }) => (op.start_ns, op.end_ns),
            _ => continue,
        };
        let after_loop = l.loop_since.is_some_and(|since| start >= since);
        let (slot, from) = if after_loop { (&mut l.main, start) } else { (&mut l.startup, l.start_ns) };
        let part = slot.get_or_insert_with(|| Startup::new(src.ids.new_span_id(), from.min(start), end));
        part.start_ns = part.start_ns.min(start);
        part.end_ns = part.end_ns.max(end);
        part.ops += 1;
        if part.summarise(&rec, module.as_ref(), ops) {
            counted += 1;
            continue;
        }
        let parent = Parent { trace_id: l.trace_id, span_id: part.span_id, remote: false, state: TraceState::NONE };
        build_into(rec, src, Some(&parent), &mut l.held);
    }
    counted
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
