//! OTLP served on each `--otlp-listen` address, both protocols on one port
//! (hyper answers HTTP/1.1 and HTTP/2): gRPC (`content-type:
//! application/grpc`, tonic's server framing and gzip) and HTTP/protobuf
//! (`POST /v1/traces`, `/v1/metrics`, `/v1/logs`, gzip bodies too). Each
//! request is decoded once, to check it and to count (and, for traces, to
//! read the app's SERVER spans), then queued as the bytes that came.

use std::convert::Infallible;
use std::io::Read;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use prost::Message;
use tonic::codec::CompressionEncoding;

use super::forward::{Item, Queue, Raw};
use super::join::{app_spans, AppSpans};
use super::{ListenCounters, Signal};
use crate::export::client::Body;

/// Largest request accepted (bytes, after decompression).
pub const MAX_REQUEST: usize = 64 << 20;

#[derive(Clone)]
pub struct State {
    /// None: a collector tee (read, never forwarded).
    pub queue: Option<Queue>,
    pub counters: Arc<ListenCounters>,
    pub servers: std::sync::mpsc::Sender<AppSpans>,
}

/// Why a request was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    Malformed(String),
    /// The queue is full: retry later.
    Full,
}

/// Spans, data points or log records in a request, checking that it decodes.
pub fn count(signal: Signal, body: &[u8]) -> Result<(u64, AppSpans), String> {
    use opentelemetry_proto::tonic::collector::{logs::v1 as l, metrics::v1 as m, trace::v1 as t};
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let e = |e: prost::DecodeError| format!("not an OTLP {} request: {e}", signal.name());
    Ok(match signal {
        Signal::Traces => {
            let r = t::ExportTraceServiceRequest::decode(body).map_err(e)?;
            let n = r.resource_spans.iter().flat_map(|rs| &rs.scope_spans).map(|ss| ss.spans.len() as u64).sum();
            (n, app_spans(&r))
        }
        Signal::Metrics => {
            let r = m::ExportMetricsServiceRequest::decode(body).map_err(e)?;
            let points = |d: &Option<Data>| match d {
                Some(Data::Gauge(g)) => g.data_points.len(),
                Some(Data::Sum(s)) => s.data_points.len(),
                Some(Data::Histogram(h)) => h.data_points.len(),
                Some(Data::ExponentialHistogram(h)) => h.data_points.len(),
                Some(Data::Summary(s)) => s.data_points.len(),
                None => 0,
            } as u64;
            let n = r.resource_metrics.iter().flat_map(|rm| &rm.scope_metrics).flat_map(|sm| &sm.metrics).map(|m| points(&m.data)).sum();
            (n, AppSpans::default())
        }
        Signal::Logs => {
            let r = l::ExportLogsServiceRequest::decode(body).map_err(e)?;
            let n = r.resource_logs.iter().flat_map(|rl| &rl.scope_logs).map(|sl| sl.log_records.len() as u64).sum();
            (n, AppSpans::default())
        }
    })
}

impl State {
    /// One request of the app: checked, counted, its SERVER spans passed on, queued.
    pub fn accept(&self, signal: Signal, body: Bytes) -> Result<(), Refused> {
        let c = &self.counters;
        let (items, servers) = match count(signal, &body) {
            Ok(x) => x,
            Err(e) => {
                c.malformed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Err(Refused::Malformed(e));
            }
        };
        ListenCounters::add(&c.received, signal, items);
        if self.queue.as_ref().is_some_and(|q| q.push(Item { signal, body, items }).is_err()) {
            ListenCounters::add(&c.refused, signal, items);
            return Err(Refused::Full);
        }
        if !servers.servers.is_empty() || !servers.ops.is_empty() {
            let _ = self.servers.send(servers);
        }
        Ok(())
    }
}

/// Accepts connections until the runtime stops.
pub async fn serve(listener: tokio::net::TcpListener, st: State) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                // Out of file descriptors and the like: try again shortly.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let st = st.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| handle(st.clone(), req));
            let builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let _ = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), svc).await;
        });
    }
}

type Response = http::Response<tonic::body::Body>;

async fn handle(st: State, req: http::Request<Incoming>) -> Result<Response, Infallible> {
    let grpc =
        req.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/grpc"));
    if grpc {
        let Some(signal) = Signal::ALL.into_iter().find(|s| s.grpc_path() == req.uri().path()) else {
            return Ok(tonic::Status::unimplemented(format!("no such method: {}", req.uri().path())).into_http());
        };
        let mut g = tonic::server::Grpc::new(Raw)
            .accept_compressed(CompressionEncoding::Gzip)
            .send_compressed(CompressionEncoding::Gzip)
            .max_decoding_message_size(MAX_REQUEST);
        return Ok(g.unary(Export { st, signal }, req).await);
    }
    Ok(http_request(st, req).await)
}

struct Export {
    st: State,
    signal: Signal,
}

impl tonic::server::UnaryService<Bytes> for Export {
    type Response = Body;
    type Future = std::future::Ready<Result<tonic::Response<Body>, tonic::Status>>;

    fn call(&mut self, req: tonic::Request<Bytes>) -> Self::Future {
        std::future::ready(match self.st.accept(self.signal, req.into_inner()) {
            // An empty Export*ServiceResponse: everything taken.
            Ok(()) => Ok(tonic::Response::new(Body::Bytes(Bytes::new()))),
            Err(Refused::Malformed(e)) => Err(tonic::Status::invalid_argument(e)),
            Err(Refused::Full) => Err(resource_exhausted()),
        })
    }
}

/// google.rpc.RetryInfo.
#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<prost_types::Duration>,
}

/// google.rpc.Status (a gRPC status's details).
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<prost_types::Any>,
}

/// RESOURCE_EXHAUSTED with a RetryInfo of 1 s, as the OTLP spec asks of a
/// server that can take the data later.
fn resource_exhausted() -> tonic::Status {
    let msg = "uvspan's forwarding queue is full; retry later";
    let info = RetryInfo { retry_delay: Some(prost_types::Duration { seconds: 1, nanos: 0 }) };
    let any = prost_types::Any { type_url: "type.googleapis.com/google.rpc.RetryInfo".into(), value: info.encode_to_vec() };
    let st = RpcStatus { code: tonic::Code::ResourceExhausted as i32, message: msg.into(), details: vec![any] };
    tonic::Status::with_details(tonic::Code::ResourceExhausted, msg, st.encode_to_vec().into())
}

fn reply(status: http::StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response {
    let mut r = http::Response::new(tonic::body::Body::new(Full::new(body.into())));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

async fn http_request(st: State, req: http::Request<Incoming>) -> Response {
    use http::StatusCode as S;
    let Some(signal) = Signal::ALL.into_iter().find(|s| s.http_path() == req.uri().path()) else {
        return reply(S::NOT_FOUND, "text/plain", "not an OTLP path: use /v1/traces, /v1/metrics or /v1/logs\n");
    };
    if req.method() != http::Method::POST {
        return reply(S::METHOD_NOT_ALLOWED, "text/plain", "OTLP export requests are POSTs\n");
    }
    let header = |n: http::header::HeaderName| req.headers().get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
    let content_type = header(http::header::CONTENT_TYPE);
    if !content_type.starts_with("application/x-protobuf") {
        return reply(S::UNSUPPORTED_MEDIA_TYPE, "text/plain", "only OTLP/HTTP protobuf (application/x-protobuf) is taken\n");
    }
    let gzip = match header(http::header::CONTENT_ENCODING).as_str() {
        "" | "identity" => false,
        "gzip" => true,
        _ => return reply(S::UNSUPPORTED_MEDIA_TYPE, "text/plain", "content-encoding: only gzip is taken\n"),
    };
    let body = match Limited::new(req.into_body(), MAX_REQUEST).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return reply(S::PAYLOAD_TOO_LARGE, "text/plain", "request too large or cut short\n"),
    };
    let body = if gzip {
        let mut out = Vec::new();
        let read = flate2::read::GzDecoder::new(body.as_ref()).take(MAX_REQUEST as u64 + 1).read_to_end(&mut out);
        if read.is_err() || out.len() > MAX_REQUEST {
            st.counters.malformed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return reply(S::BAD_REQUEST, "text/plain", "bad gzip body (or too large once unpacked)\n");
        }
        Bytes::from(out)
    } else {
        body
    };
    match st.accept(signal, body) {
        // An empty Export*ServiceResponse: everything taken.
        Ok(()) => reply(S::OK, "application/x-protobuf", Bytes::new()),
        Err(Refused::Malformed(e)) => reply(S::BAD_REQUEST, "text/plain", format!("{e}\n")),
        Err(Refused::Full) => {
            let mut r = reply(S::SERVICE_UNAVAILABLE, "text/plain", "uvspan's forwarding queue is full; retry later\n");
            r.headers_mut().insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("1"));
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};

    #[test]
    fn requests_are_checked_and_counted() {
        let logs = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs { log_records: vec![LogRecord::default(), LogRecord::default()], ..Default::default() }],
                ..Default::default()
            }],
        };
        assert_eq!(count(Signal::Logs, &logs.encode_to_vec()).unwrap().0, 2);
        assert_eq!(count(Signal::Traces, b"").unwrap().0, 0, "an empty request is a valid one");
        assert!(count(Signal::Traces, b"\xff\xff\xff").is_err());
        assert!(count(Signal::Metrics, b"\x0a\x05ab").is_err(), "a field cut short");
    }

    #[test]
    fn a_full_queue_says_when_to_retry() {
        let st = resource_exhausted();
        assert_eq!(st.code(), tonic::Code::ResourceExhausted);
        let details = RpcStatus::decode(st.details()).unwrap();
        assert_eq!(details.details[0].type_url, "type.googleapis.com/google.rpc.RetryInfo");
        let info = RetryInfo::decode(details.details[0].value.as_slice()).unwrap();
        assert_eq!(info.retry_delay.map(|d| d.seconds), Some(1));
    }
}
