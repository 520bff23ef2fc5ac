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

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use prost::Message;
use tokio::sync::mpsc;
use tonic::codec::CompressionEncoding;

use super::{ListenCounters, Signal};
use crate::export::otlp::Body;
pub use crate::export::otlp::Raw;
use crate::export::otlp::{self, OtlpConfig, OtlpProtocol};

/// Backoff between retries of one request: from this, doubling, up to MAX.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

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
pub fn start(cfg: &OtlpConfig, cap: u64, counters: Arc<ListenCounters>) -> Result<Handle> {
    let upstream = Upstream::new(cfg)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let state = Arc::new(State { cap, bytes: AtomicU64::new(0), pending: Default::default(), closed: AtomicBool::new(false), counters });
    tokio::spawn(run(upstream, rx, state.clone()));
    Ok(Handle { queue: Queue { tx, state } })
}

async fn run(mut up: Upstream, mut rx: mpsc::UnboundedReceiver<Item>, s: Arc<State>) {
    let mut said_retry = false;
    let mut said_refused = false;
    let mut said_rejected = false;
    while let Some(it) = rx.recv().await {
        let mut backoff = BACKOFF_MIN;
        let outcome = loop {
            if s.closed.load(Ordering::SeqCst) {
                break None;
            }
            match up.send(&it).await {
                Ok(rejected) => break Some(Ok(rejected)),
                Err(Fail::Permanent(e)) => break Some(Err(e)),
                Err(Fail::Retry(after, e)) => {
                    if !said_retry {
                        said_retry = true;
                        eprintln!(
                            "uvspan: forwarding the app's OTLP {}: {e}; retrying while it stays queued (said once)",
                            it.signal.name()
                        );
                    }
                    tokio::time::sleep(after.unwrap_or(backoff).min(Duration::from_secs(30))).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
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
                if !said_refused {
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

enum Fail {
    /// Worth retrying (after this long, when the endpoint said).
    Retry(Option<Duration>, String),
    Permanent(String),
}

enum Upstream {
    Grpc { grpc: Box<tonic::client::Grpc<tonic::transport::Channel>>, headers: tonic::metadata::MetadataMap, timeout: Duration },
    Http { client: reqwest::Client, base: String, headers: Vec<(String, String)>, gzip: bool },
}

impl Upstream {
    fn new(cfg: &OtlpConfig) -> Result<Upstream> {
        let base = cfg.endpoint.trim_end_matches('/').trim_end_matches("/v1/traces").to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            bail!("invalid OTLP endpoint {:?}: it must start with http:// or https://", cfg.endpoint);
        }
        let gzip = std::env::var("OTEL_EXPORTER_OTLP_COMPRESSION").is_ok_and(|v| v.trim() == "gzip");
        let timeout = otlp::timeout();
        Ok(match cfg.protocol {
            OtlpProtocol::Grpc => {
                let channel = tonic::transport::Endpoint::from_shared(base.clone())
                    .with_context(|| format!("invalid OTLP endpoint {base:?}"))?
                    .timeout(timeout)
                    .connect_lazy();
                let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(usize::MAX);
                if gzip {
                    grpc = grpc.send_compressed(CompressionEncoding::Gzip);
                }
                Upstream::Grpc { grpc: Box::new(grpc), headers: otlp::grpc_metadata(&otlp::headers(cfg)?)?, timeout }
            }
            OtlpProtocol::HttpProtobuf => Upstream::Http {
                client: reqwest::Client::builder().timeout(timeout).build().context("cannot set up the HTTP client")?,
                base,
                headers: otlp::headers(cfg)?,
                gzip,
            },
        })
    }

    /// Sends one request; Ok(rejected items, the endpoint's message).
    async fn send(&mut self, it: &Item) -> Result<(u64, String), Fail> {
        let reply = match self {
            Upstream::Grpc { grpc, headers, timeout } => {
                grpc.ready().await.map_err(|e| Fail::Retry(None, format!("endpoint not ready: {e}")))?;
                let mut req = tonic::Request::new(Body::from(it.body.clone()));
                *req.metadata_mut() = headers.clone();
                req.set_timeout(*timeout);
                let path = http::uri::PathAndQuery::from_static(it.signal.grpc_path());
                match grpc.unary(req, path, Raw).await {
                    Ok(r) => r.into_inner(),
                    Err(st) => {
                        let e = format!("{:?}: {}", st.code(), st.message());
                        return Err(if otlp::grpc_retryable(st.code()) { Fail::Retry(None, e) } else { Fail::Permanent(e) });
                    }
                }
            }
            Upstream::Http { client, base, headers, gzip } => {
                let mut rb = client.post(format!("{base}{}", it.signal.http_path())).header("content-type", "application/x-protobuf");
                for (k, v) in headers.iter() {
                    rb = rb.header(k.as_str(), v.as_str());
                }
                let body = if *gzip {
                    rb = rb.header("content-encoding", "gzip");
                    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                    std::io::Write::write_all(&mut enc, &it.body).and_then(|()| enc.finish()).map_err(|e| Fail::Permanent(e.to_string()))?
                } else {
                    it.body.to_vec()
                };
                let resp = rb.body(body).send().await.map_err(|e| Fail::Retry(None, format!("{e}")))?;
                let status = resp.status().as_u16();
                let after = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                let bytes = resp.bytes().await.map_err(|e| Fail::Retry(None, format!("{e}")))?;
                match status {
                    200..=299 => bytes,
                    s if otlp::http_retryable(s) => return Err(Fail::Retry(after, format!("HTTP {status}"))),
                    _ => {
                        return Err(Fail::Permanent(format!("HTTP {status}: {}", String::from_utf8_lossy(&bytes[..bytes.len().min(200)]))))
                    }
                }
            }
        };
        Ok(partial_success(it.signal, &reply))
    }
}

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
        let cfg = OtlpConfig { endpoint: "http://127.0.0.1:9".into(), protocol: OtlpProtocol::HttpProtobuf, headers: vec![] };
        let h = start(&cfg, 100, counters.clone()).unwrap();
        let q = h.queue();
        let item = |n: usize| Item { signal: Signal::Logs, body: Bytes::from(vec![0u8; n]), items: 1 };
        assert!(q.push(item(60)).is_ok());
        assert!(q.push(item(60)).is_err(), "over the bound");
        assert!(q.push(item(40)).is_ok());
        h.flush(Duration::from_millis(50)).await;
        assert_eq!(ListenCounters::get(&counters.dropped, Signal::Logs), 2, "the endpoint never answered: counted");
    }
}
