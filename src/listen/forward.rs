//! The app's OTLP requests, queued (bounded in bytes) and forwarded as the
//! same protobuf bytes to uvspan's endpoint, over uvspan's protocol (gRPC
//! through tonic with a pass-through codec, or HTTP/protobuf), with the
//! endpoint's headers and compression. Retryable failures (unreachable,
//! UNAVAILABLE, RESOURCE_EXHAUSTED, HTTP 429/502/503/504) are retried with
//! backoff while the request stays queued; a permanent refusal drops it
//! (counted).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use prost::Message;
use tokio::sync::mpsc;

use super::{ListenCounters, Signal};
pub use crate::export::client::Raw;
use crate::export::client::{Backoff, Body, Client, Settings};

/// One request of the app, to forward.
pub struct Item {
    pub signal: Signal,
    /// The protobuf message as the app sent it (decompressed).
    pub body: Bytes,
    /// Spans, data points or log records in it.
    pub items: u64,
}

/// The queue is full: the app is asked to retry later.
#[derive(Debug)]
pub struct Full;

/// The sending side (the servers).
#[derive(Clone)]
pub struct Queue {
    tx: mpsc::UnboundedSender<Item>,
    state: Arc<State>,
}

struct State {
    cap: u64,
    bytes: AtomicU64,
    /// Items queued or in flight, per signal.
    pending: [AtomicU64; 3],
    /// The flush deadline passed: what is left was counted as dropped.
    closed: AtomicBool,
    counters: Arc<ListenCounters>,
}

impl Queue {
    pub fn push(&self, it: Item) -> Result<(), Full> {
        let len = it.body.len() as u64;
        let s = &self.state;
        if s.closed.load(Ordering::SeqCst) {
            // uvspan is stopping: the app keeps what it would send.
            return Err(Full);
        }
        // Reserve, then check: concurrent pushes never overshoot together.
        let before = s.bytes.fetch_add(len, Ordering::SeqCst);
        if before + len > s.cap && before > 0 {
            s.bytes.fetch_sub(len, Ordering::SeqCst);
            return Err(Full);
        }
        let (signal, items) = (it.signal, it.items);
        s.pending[signal as usize].fetch_add(items, Ordering::SeqCst);
        if self.tx.send(it).is_err() {
            s.bytes.fetch_sub(len, Ordering::SeqCst);
            s.pending[signal as usize].fetch_sub(items, Ordering::SeqCst);
            return Err(Full);
        }
        Ok(())
    }
}

pub struct Handle {
    queue: Queue,
}

impl Handle {
    pub fn queue(&self) -> Queue {
        self.queue.clone()
    }

    /// Waits (at most `deadline`) until everything queued is forwarded; what
    /// is left then is counted as dropped.
    pub async fn flush(&self, deadline: Duration) {
        let s = &self.queue.state;
        let until = Instant::now() + deadline;
        while Instant::now() < until && s.pending.iter().any(|p| p.load(Ordering::SeqCst) > 0) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        s.closed.store(true, Ordering::SeqCst);
        for sig in Signal::ALL {
            let left = s.pending[sig as usize].swap(0, Ordering::SeqCst);
            ListenCounters::add(&s.counters.dropped, sig, left);
        }
    }
}

/// Starts the forwarding task (inside the runtime).
pub fn start(upstream: &[Option<Settings>; 3], cap: u64, counters: Arc<ListenCounters>) -> Result<Handle> {
    let mut clients: [Option<Client>; 3] = Default::default();
    for (c, s) in clients.iter_mut().zip(upstream) {
        *c = s.as_ref().map(Client::new).transpose()?;
    }
    let upstream = Upstream(clients);
    let (tx, rx) = mpsc::unbounded_channel();
    let state = Arc::new(State { cap, bytes: AtomicU64::new(0), pending: Default::default(), closed: AtomicBool::new(false), counters });
    tokio::spawn(run(upstream, rx, state.clone()));
    Ok(Handle { queue: Queue { tx, state } })
}

async fn run(up: Upstream, mut rx: mpsc::UnboundedReceiver<Item>, s: Arc<State>) {
    let mut said_retry = false;
    let mut said_refused = false;
    let mut said_rejected = false;
    let mut said_nowhere = [false; 3];
    while let Some(it) = rx.recv().await {
        let mut backoff = Backoff::default();
        let outcome = loop {
            if s.closed.load(Ordering::SeqCst) {
                break None;
            }
            let Some(client) = &up.0[it.signal as usize] else {
                if !std::mem::replace(&mut said_nowhere[it.signal as usize], true) {
                    eprintln!(
                        "uvspan: the app's OTLP {} have no endpoint to go to (set OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_{}_ENDPOINT); dropped (counted; said once)",
                        it.signal.name(),
                        it.signal.name().to_ascii_uppercase()
                    );
                }
                break Some(Err(String::new()));
            };
            match client.send(Body::from(it.body.clone())).await {
                Ok(reply) => break Some(Ok(partial_success(it.signal, &reply))),
                Err(f) if !f.retryable => break Some(Err(f.message)),
                Err(f) => {
                    if !said_retry {
                        said_retry = true;
                        eprintln!(
                            "uvspan: forwarding the app's OTLP {} to {}: {}; retrying while it stays queued (said once)",
                            it.signal.name(),
                            client.url(),
                            f.message
                        );
                    }
                    tokio::time::sleep(backoff.wait(&f)).await;
                }
            }
        };
        let c = &s.counters;
        match outcome {
            None => {} // counted as dropped by the flush
            Some(Ok((rejected, msg))) => {
                ListenCounters::add(&c.forwarded, it.signal, it.items.saturating_sub(rejected));
                if rejected > 0 || !msg.is_empty() {
                    ListenCounters::add(&c.rejected, it.signal, rejected);
                    if !said_rejected {
                        said_rejected = true;
                        eprintln!(
                            "uvspan: the endpoint rejected {rejected} of the app's {} {}: {msg:?} (counted; said once)",
                            it.items,
                            it.signal.name()
                        );
                    }
                }
            }
            Some(Err(e)) => {
                ListenCounters::add(&c.dropped, it.signal, it.items);
                if !said_refused && !e.is_empty() {
                    said_refused = true;
                    eprintln!("uvspan: the endpoint refused the app's OTLP {}: {e}; dropped (counted; said once)", it.signal.name());
                }
            }
        }
        s.bytes.fetch_sub(it.body.len() as u64, Ordering::SeqCst);
        if !s.closed.load(Ordering::SeqCst) {
            let p = &s.pending[it.signal as usize];
            let _ = p.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| Some(v.saturating_sub(it.items)));
        }
    }
}

/// A client per signal (None: no endpoint for it).
struct Upstream([Option<Client>; 3]);

/// The rejected count and message of an export response (0 when it says none).
pub fn partial_success(signal: Signal, reply: &[u8]) -> (u64, String) {
    use opentelemetry_proto::tonic::collector::{logs::v1 as l, metrics::v1 as m, trace::v1 as t};
    let p = match signal {
        Signal::Traces => {
            t::ExportTraceServiceResponse::decode(reply).ok().and_then(|r| r.partial_success).map(|p| (p.rejected_spans, p.error_message))
        }
        Signal::Metrics => m::ExportMetricsServiceResponse::decode(reply)
            .ok()
            .and_then(|r| r.partial_success)
            .map(|p| (p.rejected_data_points, p.error_message)),
        Signal::Logs => l::ExportLogsServiceResponse::decode(reply)
            .ok()
            .and_then(|r| r.partial_success)
            .map(|p| (p.rejected_log_records, p.error_message)),
    };
    p.map_or((0, String::new()), |(n, m)| (u64::try_from(n).unwrap_or(0), m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_successes_are_read() {
        use opentelemetry_proto::tonic::collector::trace::v1::{ExportTracePartialSuccess, ExportTraceServiceResponse};
        let r = ExportTraceServiceResponse {
            partial_success: Some(ExportTracePartialSuccess { rejected_spans: 3, error_message: "too old".into() }),
        };
        assert_eq!(partial_success(Signal::Traces, &r.encode_to_vec()), (3, "too old".to_string()));
        assert_eq!(partial_success(Signal::Logs, b""), (0, String::new()));
    }

    #[tokio::test]
    async fn the_queue_is_bounded_in_bytes() {
        let counters = Arc::new(ListenCounters::default());
        let e = |k: &str| (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://127.0.0.1:9".to_string());
        let src = crate::export::client::settings::Sources { env: &e, file: None, flag_endpoint: None, flag_protocol: None };
        let up = crate::export::client::settings::plan(&src).unwrap().forward;
        let h = start(&up, 100, counters.clone()).unwrap();
        let q = h.queue();
        let item = |n: usize| Item { signal: Signal::Logs, body: Bytes::from(vec![0u8; n]), items: 1 };
        assert!(q.push(item(60)).is_ok());
        assert!(q.push(item(60)).is_err(), "over the bound");
        assert!(q.push(item(40)).is_ok());
        h.flush(Duration::from_millis(50)).await;
        assert_eq!(ListenCounters::get(&counters.dropped, Signal::Logs), 2, "the endpoint never answered: counted");
    }
}
