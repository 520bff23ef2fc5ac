//! Spans leave uvspan here: to an OTLP collector (gRPC or HTTP/protobuf) or,
//! without an endpoint, to a readable console view.
//!
//! The tracer thread hands batches to [`Exporter::send`], which encodes them
//! for OTLP right there (see [`encode::Encoded`]); a task on the tokio
//! runtime batches them per process (each process is its own OTLP resource)
//! and exports. The queue is bounded in spans: what does not fit is dropped
//! and counted, never buffered without limit.

pub mod buffers;
pub mod client;
pub mod console;
pub mod encode;
pub mod health;
pub mod metrics;
pub mod otlp;

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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
    /// Dropped because the queue was full.
    pub dropped: AtomicU64,
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
    Spans {
        pid: u32,
        part: Part,
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
    outbox: std::sync::Mutex<Outbox>,
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
    /// Exports runs of one process's spans: how many the receiver rejected
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
        let task = match dest {
            Destination::Console => {
                // A person is watching: print promptly.
                let cfg = BatchConfig { schedule_delay: cfg.schedule_delay.min(Duration::from_millis(200)), ..cfg.clone() };
                rt.spawn(run(console::Console::stdout(), rx, counters.clone(), cfg, buffers.clone()))
            }
            Destination::Otlp(c) => {
                let sink = rt.block_on(async { otlp::Otlp::new(c) })?;
                rt.spawn(run(sink, rx, counters.clone(), cfg.clone(), buffers.clone()))
            }
        };
        Ok(Exporter { tx, outbox: Default::default(), encode, buffers, counters, cfg, task, rt: rt.handle().clone() })
    }

    /// A process is gone: its resource is dropped after its last spans.
    pub fn forget(&self, pid: u32) {
        self.hand_over();
        let _ = self.tx.send(Msg::Forget(pid));
    }

    pub fn process(&self, pid: u32, resource: Resource, label: String) {
        self.hand_over();
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
            let mut o = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
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
        let old = self.outbox.lock().unwrap_or_else(|e| e.into_inner()).since.is_some_and(|t| t.elapsed() >= OUTBOX_AGE);
        if old {
            self.hand_over();
        }
    }

    /// Hands every waiting span to the export task, in order (before any
    /// message about their process); drops (and counts) them when the
    /// queue is full.
    fn hand_over(&self) {
        let parts = {
            let mut o = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
            o.n = 0;
            o.since = None;
            std::mem::take(&mut o.parts)
        };
        for (pid, part) in parts {
            let n = part.len() as u64;
            let queued = self.counters.queued.load(Ordering::Relaxed);
            if queued + n > self.cfg.max_queue_spans || self.tx.send(Msg::Spans { pid, part }).is_err() {
                self.counters.dropped.fetch_add(n, Ordering::Relaxed);
                continue;
            }
            self.counters.queued.fetch_add(n, Ordering::Relaxed);
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

async fn run<S: Sink>(
    mut sink: S,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    counters: Arc<Counters>,
    cfg: BatchConfig,
    buffers: Arc<buffers::Buffers>,
) {
    let mut procs: rustc_hash::FxHashMap<u32, (Resource, String)> = Default::default();
    // Per process, the runs as they came: appended, never copied
    // (extending one queue span by span showed in profiles).
    let mut pending: rustc_hash::FxHashMap<u32, Vec<Part>> = Default::default();
    let mut pending_n: usize = 0;
    let mut forgotten: Vec<u32> = Vec::new();
    let mut tick = tokio::time::interval(cfg.schedule_delay);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut flush_ack = None;
    // After a retryable failure: when to try again, and the next wait.
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut backoff = client::Backoff::default();
    loop {
        let mut closed = false;
        let retry = async {
            match retry_at {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(Msg::Process { pid, resource, label }) => { procs.insert(pid, (resource, label)); continue; }
                Some(Msg::Spans { pid, part }) => {
                    pending_n += part.len();
                    pending.entry(pid).or_default().push(part);
                    if pending_n < cfg.max_batch || retry_at.is_some() { continue; }
                }
                Some(Msg::Flush(ack)) => flush_ack = Some(ack),
                Some(Msg::Forget(pid)) => {
                    if pending.contains_key(&pid) { forgotten.push(pid); } else { procs.remove(&pid); }
                    continue;
                }
                None => closed = true,
            },
            _ = tick.tick(), if retry_at.is_none() => {}
            _ = retry => retry_at = None,
        }
        if retry_at.is_none() {
            let mut batch: Vec<(u32, Vec<Part>)> = pending.drain().collect();
            pending_n = 0;
            while let Some((pid, mut parts)) = batch.pop() {
                let (resource, label) =
                    procs.get(&pid).cloned().unwrap_or_else(|| (Resource::builder_empty().build(), format!("pid {pid}")));
                let unsent = export_parts(&mut sink, &resource, &label, &mut parts, &counters, cfg.max_batch, &mut backoff).await;
                if let Some((sent, wait)) = unsent {
                    // Back in the queue, in order, with what was not sent
                    // yet; tried again after a wait.
                    let rest = pending.entry(pid).or_default();
                    let newer = std::mem::take(rest);
                    parts.drain(..sent).for_each(|p| p.recycle(&buffers));
                    *rest = parts;
                    rest.extend(newer);
                    for (p, s) in batch.drain(..) {
                        pending.entry(p).or_default().splice(0..0, s);
                    }
                    pending_n = pending.values().flatten().map(Part::len).sum();
                    retry_at = Some(tokio::time::Instant::now() + wait);
                    break;
                }
                parts.into_iter().for_each(|p| p.recycle(&buffers));
            }
            for pid in forgotten.drain(..) {
                if !pending.contains_key(&pid) {
                    procs.remove(&pid);
                }
            }
        }
        if pending.is_empty() {
            if let Some(ack) = flush_ack.take() {
                let _ = ack.send(());
            }
        }
        if closed {
            return;
        }
    }
}

/// Exports one process's runs in requests of at most `max_batch` spans,
/// counting what was exported or failed. `Some(sent)`: a retryable failure
/// after the first `sent` runs, the rest to be tried again; `None`: every
/// run was exported or counted as failed.
async fn export_parts<S: Sink>(
    sink: &mut S,
    resource: &Resource,
    label: &str,
    parts: &mut [Part],
    counters: &Counters,
    max_batch: usize,
    backoff: &mut client::Backoff,
) -> Option<(usize, Duration)> {
    for r in requests(parts.iter().map(Part::len), max_batch.max(1)) {
        let chunk = &mut parts[r.clone()];
        let m: u64 = chunk.iter().map(|p| p.len() as u64).sum();
        match sink.export(resource, label, chunk).await {
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
                    return Some((r.start, backoff.wait(&e)));
                }
                counters.failed.fetch_add(m, Ordering::Relaxed);
            }
        }
        // Per chunk: if the flush deadline cuts the export short, what
        // was sent is not also counted as not flushed.
        counters.queued.fetch_sub(m, Ordering::Relaxed);
    }
    None
}

/// Consecutive runs of `lens` spans grouped into export requests of at most
/// `max` spans each, in order; a run is never split (one larger than `max`,
/// which the queue does not make for OTLP, goes alone).
fn requests(lens: impl Iterator<Item = usize>, max: usize) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    let mut n = 0;
    for (i, len) in lens.enumerate() {
        match out.last_mut() {
            Some(r) if n + len <= max => {
                r.end = i + 1;
                n += len;
            }
            _ => {
                out.push(i..i + 1);
                n = len;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::requests;

    #[test]
    fn runs_grouped_into_requests_in_order_never_split() {
        let g = |lens: &[usize], max| requests(lens.iter().copied(), max);
        assert!(g(&[], 10).is_empty());
        assert_eq!(g(&[3, 3, 4, 1], 10), [0..3, 3..4]);
        assert_eq!(g(&[10, 1, 9], 10), [0..1, 1..3]);
        assert_eq!(g(&[12, 2], 10), [0..1, 1..2], "a run over the limit goes alone");
        assert_eq!(g(&[2, 12, 2], 10), [0..1, 1..2, 2..3]);
        assert_eq!(g(&[1, 1, 1], 1), [0..1, 1..2, 2..3]);
    }
}
