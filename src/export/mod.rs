//! Spans leave uvspan here: to an OTLP collector (gRPC or HTTP/protobuf) or,
//! without an endpoint, to a readable console view.
//!
//! The tracer thread hands batches to [`Exporter::send`]; a task on the tokio
//! runtime batches them per process (each process is its own OTLP resource)
//! and exports. The queue is bounded in spans: what does not fit is dropped
//! and counted, never buffered without limit.

pub mod console;
pub mod encode;
pub mod health;
pub mod otlp;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use crate::events::spans::Span;
use opentelemetry_sdk::Resource;
use tokio::sync::mpsc;

/// Where spans go.
#[derive(Clone, Debug)]
pub enum Destination {
    Console,
    Otlp(otlp::OtlpConfig),
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
    Process { pid: u32, resource: Resource, label: String },
    Spans { pid: u32, spans: Vec<Span> },
    Flush(tokio::sync::oneshot::Sender<()>),
    /// The process exited: drop its resource once its queued spans are out.
    Forget(u32),
}

/// Spans handed to the export task at once: at most this many wait…
const OUTBOX_SPANS: usize = 1024;
/// …or this long (the agent calls [`Exporter::tick`] at least every 100 ms).
const OUTBOX_AGE: Duration = Duration::from_millis(50);

/// Spans not yet handed to the export task: handed over in bursts, one
/// wake-up of it per burst instead of one per ring-buffer read.
#[derive(Default)]
struct Outbox {
    spans: Vec<(u32, Vec<Span>)>,
    n: usize,
    since: Option<std::time::Instant>,
}

/// The sending side, used from the tracer thread.
pub struct Exporter {
    tx: mpsc::UnboundedSender<Msg>,
    outbox: std::sync::Mutex<Outbox>,
    counters: Arc<Counters>,
    cfg: BatchConfig,
    task: tokio::task::JoinHandle<()>,
    rt: tokio::runtime::Handle,
}

/// The sink the export task writes to.
pub(crate) trait Sink: Send + 'static {
    /// Exports one process's spans: how many the receiver rejected (partial
    /// success, counted as failed). Err: none arrived; a retryable error keeps
    /// them queued for another try (while the queue bound holds), another is
    /// counted as failed.
    fn export(
        &mut self,
        resource: &Resource,
        label: &str,
        spans: &[&Span],
    ) -> impl std::future::Future<Output = Result<u64, ExportError>> + Send;
}

/// Why an export failed.
#[derive(Debug)]
pub(crate) struct ExportError {
    pub message: String,
    /// Worth another try later (the collector is down, busy or slow).
    pub retryable: bool,
}

impl Exporter {
    pub fn start(dest: &Destination, cfg: BatchConfig, rt: &tokio::runtime::Runtime) -> Result<Exporter> {
        let (tx, rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let task = match dest {
            Destination::Console => {
                // A person is watching: print promptly.
                let cfg = BatchConfig { schedule_delay: cfg.schedule_delay.min(Duration::from_millis(200)), ..cfg.clone() };
                rt.spawn(run(console::Console::stdout(), rx, counters.clone(), cfg))
            }
            Destination::Otlp(c) => {
                let sink = rt.block_on(async { otlp::Otlp::new(c) })?;
                rt.spawn(run(sink, rx, counters.clone(), cfg.clone()))
            }
        };
        Ok(Exporter { tx, outbox: Default::default(), counters, cfg, task, rt: rt.handle().clone() })
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

    /// Queues spans (handed to the export task in bursts, see [`Exporter::tick`]).
    pub fn send(&self, pid: u32, spans: Vec<Span>) {
        if spans.is_empty() {
            return;
        }
        let full = {
            let mut o = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
            o.n += spans.len();
            o.spans.push((pid, spans));
            o.since.get_or_insert_with(std::time::Instant::now);
            o.n >= OUTBOX_SPANS
        };
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
        let spans = {
            let mut o = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
            o.n = 0;
            o.since = None;
            std::mem::take(&mut o.spans)
        };
        for (pid, spans) in spans {
            let n = spans.len() as u64;
            let queued = self.counters.queued.load(Ordering::Relaxed);
            if queued + n > self.cfg.max_queue_spans || self.tx.send(Msg::Spans { pid, spans }).is_err() {
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

/// Retries of a failed export wait this long at first, doubling up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

async fn run<S: Sink>(mut sink: S, mut rx: mpsc::UnboundedReceiver<Msg>, counters: Arc<Counters>, cfg: BatchConfig) {
    let mut procs: rustc_hash::FxHashMap<u32, (Resource, String)> = Default::default();
    // Per process, the batches as they came: appended, never copied
    // (extending one queue span by span showed in profiles).
    let mut pending: rustc_hash::FxHashMap<u32, Vec<Vec<Span>>> = Default::default();
    let mut pending_n: usize = 0;
    let mut forgotten: Vec<u32> = Vec::new();
    let mut tick = tokio::time::interval(cfg.schedule_delay);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut flush_ack = None;
    // After a retryable failure: when to try again, and the next wait.
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut backoff = FIRST_BACKOFF;
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
                Some(Msg::Spans { pid, spans }) => {
                    pending_n += spans.len();
                    pending.entry(pid).or_default().push(spans);
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
            let mut batch: Vec<(u32, Vec<Vec<Span>>)> = pending.drain().collect();
            pending_n = 0;
            while let Some((pid, parts)) = batch.pop() {
                let (resource, label) = procs
                    .get(&pid)
                    .cloned()
                    .unwrap_or_else(|| (Resource::builder_empty().build(), format!("pid {pid}")));
                let all: Vec<&Span> = parts.iter().flatten().collect();
                let mut sent = 0;
                let mut retry = false;
                for chunk in all.chunks(cfg.max_batch.max(1)) {
                    let m = chunk.len() as u64;
                    match sink.export(&resource, &label, chunk).await {
                        Ok(rejected) => {
                            let rejected = rejected.min(m);
                            counters.failed.fetch_add(rejected, Ordering::Relaxed);
                            counters.exported.fetch_add(m - rejected, Ordering::Relaxed);
                            backoff = FIRST_BACKOFF;
                        }
                        Err(e) => {
                            if counters.export_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                                eprintln!("uvspan: export failed: {} (further errors are counted in the summary)", e.message);
                            }
                            if e.retryable {
                                retry = true;
                                break;
                            }
                            counters.failed.fetch_add(m, Ordering::Relaxed);
                        }
                    }
                    // Per chunk: if the flush deadline cuts the export short, what
                    // was sent is not also counted as not flushed.
                    counters.queued.fetch_sub(m, Ordering::Relaxed);
                    sent += chunk.len();
                }
                drop(all);
                if retry {
                    // Back in the queue, in order, with what was not sent
                    // yet; tried again after a wait.
                    let rest = pending.entry(pid).or_default();
                    let newer = std::mem::take(rest);
                    *rest = unsent(parts, sent);
                    rest.extend(newer);
                    for (p, s) in batch.drain(..) {
                        pending.entry(p).or_default().splice(0..0, s);
                    }
                    pending_n = pending.values().flatten().map(Vec::len).sum();
                    retry_at = Some(tokio::time::Instant::now() + backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    break;
                }
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

/// The batches without their first `sent` spans.
fn unsent(parts: Vec<Vec<Span>>, mut sent: usize) -> Vec<Vec<Span>> {
    let mut rest = Vec::with_capacity(parts.len());
    for mut part in parts {
        if sent >= part.len() {
            sent -= part.len();
            continue;
        }
        part.drain(..sent);
        sent = 0;
        rest.push(part);
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::unsent;
    use crate::report::aggregate::tests::span;

    fn names(parts: &[Vec<crate::events::spans::Span>]) -> Vec<Vec<String>> {
        parts.iter().map(|p| p.iter().map(|s| s.name.to_string()).collect()).collect()
    }

    #[test]
    fn unsent_keeps_order_from_the_first_span_not_sent() {
        let parts = || {
            vec![
                vec![span("a", 0.0, 1.0, vec![], None), span("b", 0.0, 1.0, vec![], None)],
                vec![span("c", 0.0, 1.0, vec![], None)],
                vec![span("d", 0.0, 1.0, vec![], None), span("e", 0.0, 1.0, vec![], None)],
            ]
        };
        let n = |v: &[&[&str]]| v.iter().map(|p| p.iter().map(|s| s.to_string()).collect()).collect::<Vec<Vec<String>>>();
        assert_eq!(names(&unsent(parts(), 0)), n(&[&["a", "b"], &["c"], &["d", "e"]]));
        assert_eq!(names(&unsent(parts(), 1)), n(&[&["b"], &["c"], &["d", "e"]]));
        assert_eq!(names(&unsent(parts(), 2)), n(&[&["c"], &["d", "e"]]));
        assert_eq!(names(&unsent(parts(), 4)), n(&[&["e"]]));
        assert!(unsent(parts(), 5).is_empty());
    }
}
