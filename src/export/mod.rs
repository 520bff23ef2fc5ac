//! Spans leave uvspan here: to an OTLP collector (gRPC or HTTP/protobuf) or,
//! without an endpoint, to a readable console view.
//!
//! The tracer thread hands batches to [`Exporter::send`]; a task on the tokio
//! runtime batches them per process (each process is its own OTLP resource)
//! and exports. The queue is bounded in spans: what does not fit is dropped
//! and counted, never buffered without limit.

pub mod console;
pub mod health;
pub mod otlp;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use opentelemetry_sdk::trace::SpanData;
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
    Spans { pid: u32, spans: Vec<SpanData> },
    Flush(tokio::sync::oneshot::Sender<()>),
    /// The process exited: drop its resource once its queued spans are out.
    Forget(u32),
}

/// The sending side, used from the tracer thread.
pub struct Exporter {
    tx: mpsc::UnboundedSender<Msg>,
    counters: Arc<Counters>,
    cfg: BatchConfig,
    task: tokio::task::JoinHandle<()>,
    rt: tokio::runtime::Handle,
}

/// The sink the export task writes to.
pub(crate) trait Sink: Send + 'static {
    /// Exports one process's spans. Err is counted as failed.
    fn export(
        &mut self,
        resource: &Resource,
        label: &str,
        spans: Vec<SpanData>,
    ) -> impl std::future::Future<Output = Result<(), String>> + Send;
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
        Ok(Exporter { tx, counters, cfg, task, rt: rt.handle().clone() })
    }

    /// A process is gone: its resource is dropped after its last spans.
    pub fn forget(&self, pid: u32) {
        let _ = self.tx.send(Msg::Forget(pid));
    }

    pub fn process(&self, pid: u32, resource: Resource, label: String) {
        let _ = self.tx.send(Msg::Process { pid, resource, label });
    }

    /// Queues spans; drops (and counts) them when the queue is full.
    pub fn send(&self, pid: u32, spans: Vec<SpanData>) {
        let n = spans.len() as u64;
        if n == 0 {
            return;
        }
        let queued = self.counters.queued.load(Ordering::Relaxed);
        if queued + n > self.cfg.max_queue_spans || self.tx.send(Msg::Spans { pid, spans }).is_err() {
            self.counters.dropped.fetch_add(n, Ordering::Relaxed);
            return;
        }
        self.counters.queued.fetch_add(n, Ordering::Relaxed);
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
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let _ = self.tx.send(Msg::Flush(done_tx));
        let _ = self.rt.block_on(async { tokio::time::timeout(deadline, done_rx).await });
        self.task.abort();
        self.summary()
    }
}

async fn run<S: Sink>(mut sink: S, mut rx: mpsc::UnboundedReceiver<Msg>, counters: Arc<Counters>, cfg: BatchConfig) {
    let mut procs: HashMap<u32, (Resource, String)> = HashMap::new();
    let mut pending: HashMap<u32, Vec<SpanData>> = HashMap::new();
    let mut forgotten: Vec<u32> = Vec::new();
    let mut pending_n = 0usize;
    let mut tick = tokio::time::interval(cfg.schedule_delay);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut flush_ack = None;
        let mut closed = false;
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(Msg::Process { pid, resource, label }) => { procs.insert(pid, (resource, label)); continue; }
                Some(Msg::Spans { pid, spans }) => {
                    pending_n += spans.len();
                    pending.entry(pid).or_default().extend(spans);
                    if pending_n < cfg.max_batch { continue; }
                }
                Some(Msg::Flush(ack)) => flush_ack = Some(ack),
                Some(Msg::Forget(pid)) => {
                    if pending.contains_key(&pid) { forgotten.push(pid); } else { procs.remove(&pid); }
                    continue;
                }
                None => closed = true,
            },
            _ = tick.tick() => {}
        }
        for (pid, spans) in pending.drain() {
            let (resource, label) = procs
                .get(&pid)
                .cloned()
                .unwrap_or_else(|| (Resource::builder_empty().build(), format!("pid {pid}")));
            for chunk in chunks(spans, cfg.max_batch) {
                let m = chunk.len() as u64;
                match sink.export(&resource, &label, chunk).await {
                    Ok(()) => counters.exported.fetch_add(m, Ordering::Relaxed),
                    Err(e) => {
                        if counters.export_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                            eprintln!("uvspan: export failed: {e} (further errors are counted in the summary)");
                        }
                        counters.failed.fetch_add(m, Ordering::Relaxed)
                    }
                };
                // Per chunk: if the flush deadline cuts the export short, what was
                // sent is not also counted as not flushed.
                counters.queued.fetch_sub(m, Ordering::Relaxed);
            }
        }
        pending_n = 0;
        for pid in forgotten.drain(..) {
            procs.remove(&pid);
        }
        if let Some(ack) = flush_ack {
            let _ = ack.send(());
        }
        if closed {
            return;
        }
    }
}

fn chunks(mut v: Vec<SpanData>, n: usize) -> Vec<Vec<SpanData>> {
    let mut out = Vec::new();
    while v.len() > n {
        let rest = v.split_off(n);
        out.push(v);
        v = rest;
    }
    out.push(v);
    out
}
