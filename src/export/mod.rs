//! Spans leave uvspan here: to an OTLP collector (gRPC or HTTP/protobuf) or,
//! without an endpoint, to a readable console view.
//!
//! The tracer thread hands batches to [`Exporter::send`], which encodes them
//! for OTLP right there (see [`encode::Encoded`]) and queues them per
//! process; a task on the tokio runtime exports them, one request per
//! process in turn (each process is its own OTLP resource). The queue is
//! bounded in spans and shared fairly between the processes
//! ([`queue::Queue`]): what does not fit is dropped and counted per process,
//! never buffered without limit.

pub mod buffers;
pub mod client;
pub mod console;
pub mod dropped;
pub mod encode;
pub mod health;
pub mod metrics;
pub mod otlp;
pub mod queue;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::events::spans::Span;
use anyhow::Result;
use opentelemetry_sdk::Resource;
use tokio::sync::mpsc;

/// Where spans go.
// One per run.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Destination {
    Console,
    Otlp(client::Settings),
}

/// Batching settings (OTEL_BSP_* names).
#[derive(Clone, Debug)]
pub struct BatchConfig {
    pub max_queue_spans: u64,
    pub max_batch: usize,
    pub schedule_delay: Duration,
}

impl Default for BatchConfig {
    fn default() -> Self {
        // Larger export requests than the SDK default (512): less per-request
        // overhead at high span rates (bench/, sidecar throughput).
        BatchConfig { max_queue_spans: 65_536, max_batch: 2048, schedule_delay: Duration::from_millis(1000) }
    }
}

/// Counters shared by the tracer thread and the export task.
#[derive(Debug, Default)]
pub struct Counters {
    pub queued: AtomicU64,
    pub exported: AtomicU64,
    /// Dropped because the queue was full (also in `by_process`).
    pub dropped: AtomicU64,
    /// The same, per process.
    pub by_process: Mutex<dropped::Drops>,
    /// Lost in failed exports.
    pub failed: AtomicU64,
    pub export_errors: AtomicU64,
}

/// A snapshot of [`Counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub exported: u64,
    pub dropped: u64,
    pub failed: u64,
    pub export_errors: u64,
    /// Spans still queued when the flush deadline passed.
    pub unflushed: u64,
}

pub(crate) enum Msg {
    Process {
        pid: u32,
        resource: Resource,
        label: String,
    },
    Flush(tokio::sync::oneshot::Sender<()>),
    /// The process exited: drop its resource once its queued spans are out.
    Forget(u32),
}

/// Spans handed to the export task at once: at most this many wait…
const OUTBOX_SPANS: usize = 1024;
/// …or this long (the agent calls [`Exporter::tick`] at least every 100 ms).
const OUTBOX_AGE: Duration = Duration::from_millis(50);

/// A run of one process's spans as queued: for OTLP already encoded, on the
/// tracer thread that built them ([`encode::Encoded`]: the spans are still
/// in its cache and are freed by the thread that allocated them); for the
/// console, the spans.
#[derive(Debug)]
pub(crate) enum Part {
    Spans(Vec<Span>),
    Otlp(encode::Encoded),
}

impl queue::Run for Part {
    fn spans(&self) -> u64 {
        self.len() as u64
    }
}

/// The queue, shared by the tracer thread (which fills it) and the export
/// task (which empties it).
type Shared = Arc<Mutex<queue::Queue<Part>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Part {
    /// Done with: its buffer is used again.
    fn recycle(self, buffers: &buffers::Buffers) {
        if let Part::Otlp(e) = self {
            buffers.give(e.bytes);
        }
    }

    /// How many spans.
    pub fn len(&self) -> usize {
        match self {
            Part::Spans(s) => s.len(),
            Part::Otlp(e) => e.n,
        }
    }
}

/// Spans not yet handed to the export task: handed over in bursts, one
/// wake-up of it per burst instead of one per ring-buffer read.
#[derive(Default)]
struct Outbox {
    parts: Vec<(u32, Part)>,
    n: usize,
    since: Option<std::time::Instant>,
}

/// The sending side, used from the tracer thread.
pub struct Exporter {
    tx: mpsc::UnboundedSender<Msg>,
    outbox: Mutex<Outbox>,
    queue: Shared,
    /// Wakes the export task when a request's worth waits.
    wake: Arc<tokio::sync::Notify>,
    /// Spans are encoded for OTLP as they are queued.
    encode: bool,
    buffers: Arc<buffers::Buffers>,
    counters: Arc<Counters>,
    cfg: BatchConfig,
    task: tokio::task::JoinHandle<()>,
    rt: tokio::runtime::Handle,
}

/// The sink the export task writes to.
pub(crate) trait Sink: Send + 'static {
    /// Exports runs of one process's spans (one request): how many the receiver rejected
    /// (partial success, counted as failed). Err: none arrived; a retryable
    /// error keeps them queued for another try (while the queue bound
    /// holds), another is counted as failed.
    fn export(
        &mut self,
        resource: &Resource,
        label: &str,
        parts: &mut [Part],
    ) -> impl std::future::Future<Output = Result<u64, client::Fail>> + Send;
}

impl Exporter {
    pub fn start(dest: &Destination, cfg: BatchConfig, rt: &tokio::runtime::Runtime) -> Result<Exporter> {
        let (tx, rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let encode = matches!(dest, Destination::Otlp(_));
        let buffers = Arc::new(buffers::Buffers::default());
        let queue: Shared = Arc::new(Mutex::new(queue::Queue::new(cfg.max_queue_spans)));
        let wake = Arc::new(tokio::sync::Notify::new());
        let task = Task { rx, queue: queue.clone(), wake: wake.clone(), counters: counters.clone(), buffers: buffers.clone() };
        let task = match dest {
            Destination::Console => {
                // A person is watching: print promptly.
                let cfg = BatchConfig { schedule_delay: cfg.schedule_delay.min(Duration::from_millis(200)), ..cfg.clone() };
                rt.spawn(run(console::Console::stdout(), task, cfg))
            }
            Destination::Otlp(c) => {
                let sink = rt.block_on(async { otlp::Otlp::new(c) })?;
                rt.spawn(run(sink, task, cfg.clone()))
            }
        };
        Ok(Exporter { tx, outbox: Default::default(), queue, wake, encode, buffers, counters, cfg, task, rt: rt.handle().clone() })
    }

    /// A process is gone: its resource is dropped after its last spans.
    pub fn forget(&self, pid: u32) {
        self.hand_over();
        lock(&self.counters.by_process).forget(pid);
        let _ = self.tx.send(Msg::Forget(pid));
    }

    /// A process's resource, the label the console shows and its command
    /// line (for the drops named in the summary).
    pub fn process(&self, pid: u32, resource: Resource, label: String, argv: &[String]) {
        self.hand_over();
        lock(&self.counters.by_process).name(pid, &label, argv);
        let _ = self.tx.send(Msg::Process { pid, resource, label });
    }

    /// Queues spans, taken from `spans` (handed to the export task in
    /// bursts, see [`Exporter::tick`]); for OTLP they are encoded here,
    /// appended to the process's last run while it holds fewer than a
    /// request's worth, and `spans` keeps its allocation for the next batch.
    pub fn send(&self, pid: u32, spans: &mut Vec<Span>) {
        if spans.is_empty() {
            return;
        }
        let max = self.cfg.max_batch.max(1);
        let full = {
            let mut o = lock(&self.outbox);
            o.n += spans.len();
            if !self.encode {
                o.parts.push((pid, Part::Spans(std::mem::take(spans))));
            } else {
                match o.parts.last_mut() {
                    Some((p, Part::Otlp(run))) if *p == pid && run.n + spans.len() <= max => run.push(spans),
                    _ => {
                        for c in spans.chunks(max) {
                            o.parts.push((pid, Part::Otlp(encode::Encoded::in_buffer(self.buffers.take(), c))));
                        }
                    }
                }
            }
            o.since.get_or_insert_with(std::time::Instant::now);
            o.n >= OUTBOX_SPANS
        };
        // Encoded (or moved out): dropped here, not under the outbox's lock.
        spans.clear();
        if full {
            self.hand_over();
        }
    }

    /// Hands waiting spans over if they have waited long enough.
    pub fn tick(&self) {
        let old = lock(&self.outbox).since.is_some_and(|t| t.elapsed() >= OUTBOX_AGE);
        if old {
            self.hand_over();
        }
    }

    /// Queues every waiting span for the export task, in order (before any
    /// message about their process); what the queue's fair share drops (of
    /// these, or runs of other processes still waiting) is counted per
    /// process.
    fn hand_over(&self) {
        let parts = {
            let mut o = lock(&self.outbox);
            o.n = 0;
            o.since = None;
            std::mem::take(&mut o.parts)
        };
        if parts.is_empty() {
            return;
        }
        let mut dropped = Vec::new();
        let full = {
            let mut q = lock(&self.queue);
            for (pid, part) in parts {
                q.offer(pid, part, &mut dropped);
            }
            self.counters.queued.store(q.len(), Ordering::Relaxed);
            q.waiting() >= self.cfg.max_batch as u64
        };
        if full {
            self.wake.notify_one();
        }
        if !dropped.is_empty() {
            let mut by = lock(&self.counters.by_process);
            for (pid, part) in &dropped {
                by.add(*pid, part.len() as u64);
            }
            self.counters.dropped.store(by.total, Ordering::Relaxed);
        }
        for (_, part) in dropped {
            part.recycle(&self.buffers);
        }
    }

    /// The live counters (for the health metrics).
    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    pub fn summary(&self) -> Summary {
        let c = &self.counters;
        Summary {
            exported: c.exported.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            export_errors: c.export_errors.load(Ordering::Relaxed),
            unflushed: c.queued.load(Ordering::Relaxed),
        }
    }

    /// Exports everything queued, waiting at most `deadline`.
    pub fn finish(self, deadline: Duration) -> Summary {
        self.hand_over();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let _ = self.tx.send(Msg::Flush(done_tx));
        let _ = self.rt.block_on(async { tokio::time::timeout(deadline, done_rx).await });
        self.task.abort();
        self.summary()
    }
}

/// What the export task works with besides its sink.
struct Task {
    rx: mpsc::UnboundedReceiver<Msg>,
    queue: Shared,
    wake: Arc<tokio::sync::Notify>,
    counters: Arc<Counters>,
    buffers: Arc<buffers::Buffers>,
}

/// The export task's view of the messages: each process's resource and
/// label, the processes gone whose spans are still queued, a flush asked.
#[derive(Default)]
struct Known {
    procs: rustc_hash::FxHashMap<u32, (Resource, String)>,
    forgotten: Vec<u32>,
    flush_ack: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Known {
    fn on(&mut self, msg: Msg, queue: &Shared) {
        match msg {
            Msg::Process { pid, resource, label } => {
                self.procs.insert(pid, (resource, label));
            }
            Msg::Flush(ack) => self.flush_ack = Some(ack),
            Msg::Forget(pid) => {
                if lock(queue).holds(pid) {
                    self.forgotten.push(pid);
                } else {
                    self.procs.remove(&pid);
                }
            }
        }
    }
}

async fn run<S: Sink>(mut sink: S, mut t: Task, cfg: BatchConfig) {
    let mut known = Known::default();
    let mut tick = tokio::time::interval(cfg.schedule_delay);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // After a retryable failure: when to try again, and the next wait.
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut backoff = client::Backoff::default();
    let mut closed = false;
    loop {
        let mut due = false;
        let retry = async {
            match retry_at {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            msg = t.rx.recv(), if !closed => match msg {
                Some(m) => known.on(m, &t.queue),
                None => closed = true,
            },
            _ = t.wake.notified() => {}
            _ = tick.tick(), if retry_at.is_none() => due = true,
            _ = retry => { retry_at = None; due = true; }
        }
        let full = lock(&t.queue).waiting() >= cfg.max_batch as u64;
        if retry_at.is_none() && (due || full || known.flush_ack.is_some() || closed) {
            // What waits now goes out, a request at a time, each process in turn.
            let mut left = lock(&t.queue).waiting();
            while left > 0 {
                let Some((pid, mut parts)) = lock(&t.queue).take(cfg.max_batch.max(1)) else { break };
                // The messages sent before these spans were queued (their
                // process's resource among them).
                while let Ok(m) = t.rx.try_recv() {
                    known.on(m, &t.queue);
                }
                let m: u64 = parts.iter().map(|p| p.len() as u64).sum();
                left = left.saturating_sub(m);
                let (resource, label) =
                    known.procs.get(&pid).cloned().unwrap_or_else(|| (Resource::builder_empty().build(), format!("pid {pid}")));
                if let Some(wait) = export_request(&mut sink, &resource, &label, &mut parts, m, &t.counters, &mut backoff).await {
                    // Back in the queue, first, in order; tried again after a wait.
                    lock(&t.queue).put_back(pid, parts);
                    retry_at = Some(tokio::time::Instant::now() + wait);
                    break;
                }
                {
                    let mut q = lock(&t.queue);
                    q.done(pid, m);
                    // Per request: if the flush deadline cuts the export
                    // short, what was sent is not also counted as not flushed.
                    t.counters.queued.store(q.len(), Ordering::Relaxed);
                }
                parts.into_iter().for_each(|p| p.recycle(&t.buffers));
            }
            let q = t.queue.clone();
            known.forgotten.retain(|pid| {
                let held = lock(&q).holds(*pid);
                if !held {
                    known.procs.remove(pid);
                }
                held
            });
        }
        if lock(&t.queue).is_empty() {
            if let Some(ack) = known.flush_ack.take() {
                let _ = ack.send(());
            }
        }
        if closed && (retry_at.is_some() || lock(&t.queue).is_empty()) {
            return;
        }
    }
}

/// Exports one process's runs as one request, counting what was exported
/// or failed. `Some(wait)`: a retryable failure, the runs to be tried again
/// after `wait`.
async fn export_request<S: Sink>(
    sink: &mut S,
    resource: &Resource,
    label: &str,
    parts: &mut [Part],
    m: u64,
    counters: &Counters,
    backoff: &mut client::Backoff,
) -> Option<Duration> {
    match sink.export(resource, label, parts).await {
        Ok(rejected) => {
            let rejected = rejected.min(m);
            counters.failed.fetch_add(rejected, Ordering::Relaxed);
            counters.exported.fetch_add(m - rejected, Ordering::Relaxed);
            backoff.reset();
        }
        Err(e) => {
            if counters.export_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                eprintln!("uvspan: export failed: {} (further errors are counted in the summary)", e.message);
            }
            if e.retryable {
                return Some(backoff.wait(&e));
            }
            counters.failed.fetch_add(m, Ordering::Relaxed);
        }
    }
    None
}
