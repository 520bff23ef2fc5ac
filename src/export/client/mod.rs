//! The one OTLP client: uvspan's spans, its metrics and the app's OTLP
//! forwarded by `--otlp-listen` all leave through it. It owns the
//! configuration ([`settings`]), the gRPC and HTTP/protobuf transports over
//! one connector (TLS by rustls, [`tls`]), headers, gzip, the timeout, and
//! what a failure means: retryable or not, and after how long
//! (`Retry-After`, gRPC `RetryInfo`, else [`Backoff`]).

pub mod settings;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use prost::Message;
use tonic::codec::CompressionEncoding;

pub use settings::{OtlpProtocol, Settings};

/// An OTLP signal: its paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Signal {
    Traces,
    Metrics,
    Logs,
}

impl Signal {
    pub const ALL: [Signal; 3] = [Signal::Traces, Signal::Metrics, Signal::Logs];

    pub fn name(self) -> &'static str {
        match self {
            Signal::Traces => "traces",
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
        }
    }

    /// The HTTP path (`/v1/traces`).
    pub fn http_path(self) -> &'static str {
        match self {
            Signal::Traces => "/v1/traces",
            Signal::Metrics => "/v1/metrics",
            Signal::Logs => "/v1/logs",
        }
    }

    /// The gRPC method path.
    pub fn grpc_path(self) -> &'static str {
        match self {
            Signal::Traces => "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            Signal::Metrics => "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            Signal::Logs => "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
        }
    }
}

/// Why an export failed.
#[derive(Debug, Clone, PartialEq)]
pub struct Fail {
    pub message: String,
    /// Worth another try later (the collector is down, busy or slow).
    pub retryable: bool,
    /// When the collector said when (`Retry-After`, gRPC `RetryInfo`).
    pub after: Option<Duration>,
    /// No answer of the collector's own (the connection failed or ended).
    pub unanswered: bool,
}

impl Fail {
    fn retry(message: String) -> Fail {
        Fail { message, retryable: true, after: None, unanswered: true }
    }
}

/// Waits between retries: from 200 ms, doubling up to 5 s; a wait the
/// collector asked for is taken instead (at most 30 s).
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: Self::FIRST }
    }
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(5);
    const MAX_ASKED: Duration = Duration::from_secs(30);

    /// How long to wait before the next try after `f`.
    pub fn wait(&mut self, f: &Fail) -> Duration {
        let w = f.after.map_or(self.next, |a| a.min(Self::MAX_ASKED));
        self.next = (self.next * 2).min(Self::MAX);
        w
    }

    /// An export went through.
    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// The largest answer read from a collector.
const MAX_ANSWER: usize = 4 << 20;

/// One signal's OTLP client (cheap to clone; connects lazily, so a
/// collector that is not up yet is only a failed export).
#[derive(Clone)]
pub struct Client {
    transport: Transport,
    /// For an `https://` endpoint: to name a TLS problem that a failed gRPC
    /// call hides (the alert ends the connection; the call only sees it
    /// cancelled).
    tls: Option<Arc<rustls::ClientConfig>>,
    timeout: Duration,
    signal: Signal,
    url: Arc<str>,
    protocol: OtlpProtocol,
    /// Where the protocol was set (for the message when the collector speaks the other one).
    protocol_from: Arc<str>,
}

// One per client, built once: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Transport {
    Grpc {
        grpc: tonic::client::Grpc<tonic::transport::Channel>,
        metadata: tonic::metadata::MetadataMap,
    },
    Http {
        client: hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
        uri: http::Uri,
        headers: http::HeaderMap,
        gzip: bool,
    },
}

impl Client {
    /// Builds the client (inside the tokio runtime); certificate files are
    /// read now, so a missing one stops uvspan before it traces.
    pub fn new(s: &Settings) -> Result<Client> {
        let http = |h2: bool| -> Result<HttpsConnector<HttpConnector>> {
            let mut tcp = HttpConnector::new();
            tcp.enforce_http(false);
            tcp.set_nodelay(true);
            tcp.set_connect_timeout(Some(s.timeout));
            // Roots and certificates are read only for an https:// endpoint.
            let tls = if s.is_tls() { tls::client_config(&s.tls)? } else { tls::plain_config()? };
            let b = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http();
            Ok(if h2 { b.enable_http2().wrap_connector(tcp) } else { b.enable_http1().wrap_connector(tcp) })
        };
        let transport = match s.protocol {
            OtlpProtocol::Grpc => {
                let channel = tonic::transport::Endpoint::from_shared(s.url.clone())
                    .with_context(|| format!("invalid OTLP endpoint {:?}", s.url))?
                    .connect_with_connector_lazy(http(true)?);
                let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(usize::MAX);
                if s.gzip {
                    grpc = grpc.send_compressed(CompressionEncoding::Gzip);
                }
                Transport::Grpc { grpc, metadata: grpc_metadata(&s.headers)? }
            }
            OtlpProtocol::HttpProtobuf => {
                let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(http(false)?);
                let uri = s.url.parse().with_context(|| format!("invalid OTLP endpoint {:?}", s.url))?;
                Transport::Http { client, uri, headers: http_headers(&s.headers)?, gzip: s.gzip }
            }
        };
        let tls = s.is_tls().then(|| tls::client_config(&s.tls).map(Arc::new)).transpose()?;
        Ok(Client {
            transport,
            tls,
            timeout: s.timeout,
            signal: s.signal,
            url: s.url.as_str().into(),
            protocol: s.protocol,
            protocol_from: s.protocol_from.as_str().into(),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sends one export request (one try, within the timeout): the
    /// collector's answer, protobuf.
    pub async fn send(&self, body: Body) -> Result<Bytes, Fail> {
        self.send_once(body).await.map_err(|f| self.other_protocol(f))
    }

    /// A failure that says the collector speaks the other OTLP protocol
    /// (HTTP/1.1 sent to a gRPC port, gRPC to an HTTP/1.1 one), said as
    /// such, with where the protocol was set; not retried (it does not mend
    /// itself).
    fn other_protocol(&self, f: Fail) -> Fail {
        let m = &f.message;
        let (answered, is, other, port) = match self.protocol {
            // hyper's words for HTTP/2 frames where an HTTP/1.1 answer
            // belongs (the gRPC server's SETTINGS, before or after the request).
            OtlpProtocol::HttpProtobuf
                if m.contains("invalid HTTP version parsed") || m.contains("received unexpected message from connection") =>
            {
                ("HTTP/2 (gRPC)", "a gRPC port", "grpc", "4318")
            }
            OtlpProtocol::Grpc if m.contains("frame with invalid size") || m.contains("invalid preface") => {
                ("HTTP/1.1", "an OTLP/HTTP port", "http/protobuf", "4317")
            }
            _ => return f,
        };
        let (sent, from) = (self.protocol.name(), &self.protocol_from);
        Fail {
            message: format!(
                "the collector at {} answered {answered} to OTLP {sent}: it is {is}; the protocol {sent} came from {from}: \
                 set it to {other} (for uvspan: --otlp-protocol {other}) or give the collector's {sent} port ({port} by default)",
                self.url
            ),
            retryable: false,
            after: None,
            unanswered: true,
        }
    }

    async fn send_once(&self, body: Body) -> Result<Bytes, Fail> {
        let timeout = self.timeout;
        let late = move || Fail::retry(format!("no answer within {timeout:?} (OTEL_EXPORTER_OTLP_TIMEOUT)"));
        match &self.transport {
            Transport::Grpc { grpc, metadata } => {
                let call = grpc_send(grpc.clone(), metadata.clone(), self.signal, body);
                let sent = tokio::time::timeout(timeout, call).await.map_err(|_| late())?;
                match (sent, &self.tls) {
                    (Err(f), Some(tls)) if f.unanswered => Err(tls::handshake(tls.clone(), &self.url, timeout).await.map_or(f, |d| Fail {
                        message: d,
                        retryable: false,
                        after: None,
                        unanswered: true,
                    })),
                    (sent, _) => sent,
                }
            }
            Transport::Http { client, uri, headers, gzip } => {
                let call = http_send(client, uri, headers, *gzip, body);
                tokio::time::timeout(timeout, call).await.map_err(|_| late())?
            }
        }
    }
}

async fn grpc_send(
    mut grpc: tonic::client::Grpc<tonic::transport::Channel>,
    metadata: tonic::metadata::MetadataMap,
    signal: Signal,
    body: Body,
) -> Result<Bytes, Fail> {
    grpc.ready().await.map_err(|e| unreachable(&e))?;
    let mut req = tonic::Request::new(body);
    *req.metadata_mut() = metadata;
    let path = http::uri::PathAndQuery::from_static(signal.grpc_path());
    match grpc.unary(req, path, Raw).await {
        Ok(r) => Ok(r.into_inner()),
        Err(st) => {
            if let Some(d) = std::error::Error::source(&st).and_then(tls::describe) {
                return Err(Fail { message: d, retryable: false, after: None, unanswered: true });
            }
            if st.code() == tonic::Code::Unavailable && st.message().contains("transport error") {
                return Err(unreachable(&st));
            }
            // A status the server did not send (tonic's own, for a
            // connection that failed or ended) has no grpc-status header.
            let unanswered = !st.metadata().contains_key("grpc-status")
                && matches!(st.code(), tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Unavailable | tonic::Code::Internal);
            // The connection's own error under tonic's status (an HTTP/1.1
            // answer read as HTTP/2 frames: "frame with invalid size").
            let mut cause = String::new();
            let mut cur = std::error::Error::source(&st);
            while let Some(e) = cur {
                let t = e.to_string();
                if unanswered && !st.message().contains(&t) && !cause.contains(&t) {
                    cause = format!("{cause}: {t}");
                }
                cur = e.source();
            }
            Err(Fail {
                message: format!("the collector answered {:?}: {}{cause}", st.code(), st.message()),
                retryable: grpc_retryable(st.code()),
                after: retry_info(st.details()),
                unanswered,
            })
        }
    }
}

async fn http_send(
    client: &hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    uri: &http::Uri,
    headers: &http::HeaderMap,
    gzip: bool,
    body: Body,
) -> Result<Bytes, Fail> {
    let mut bytes = body.into_bytes();
    let mut req = http::Request::post(uri.clone());
    if let Some(h) = req.headers_mut() {
        h.extend(headers.clone());
        h.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/x-protobuf"));
        if gzip {
            h.insert(http::header::CONTENT_ENCODING, http::HeaderValue::from_static("gzip"));
            bytes = gzip_bytes(&bytes);
        }
    }
    let req = req.body(Full::new(bytes)).map_err(|e| Fail {
        message: format!("bad request: {e}"),
        retryable: false,
        after: None,
        unanswered: false,
    })?;
    let resp = client.request(req).await.map_err(|e| unreachable(&e))?;
    let status = resp.status().as_u16();
    let after = resp
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let answer = Limited::new(resp.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| Fail::retry(format!("reading the collector's answer: {e}")))?;
    match status {
        200..=299 => Ok(answer),
        s => Err(Fail {
            message: format!("the collector answered HTTP {s}: {}", String::from_utf8_lossy(&answer[..answer.len().min(200)]).trim()),
            retryable: http_retryable(s),
            after,
            unanswered: false,
        }),
    }
}

/// The connection failed: a TLS problem (not retried: it does not mend
/// itself) or the collector not reachable (retried).
fn unreachable(e: &(dyn std::error::Error + 'static)) -> Fail {
    if let Some(d) = tls::describe(e) {
        return Fail { message: d, retryable: false, after: None, unanswered: true };
    }
    let mut why = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let s_text = s.to_string();
        if !why.contains(&s_text) {
            why = format!("{why}: {s_text}");
        }
        cur = s.source();
    }
    Fail::retry(format!("cannot reach the collector: {why}"))
}

fn gzip_bytes(b: &[u8]) -> Bytes {
    let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(b.len() / 4), flate2::Compression::fast());
    // Writing to a Vec does not fail.
    let _ = std::io::Write::write_all(&mut enc, b);
    Bytes::from(enc.finish().unwrap_or_default())
}

/// gRPC `RetryInfo` in a status's details (google.rpc.Status).
fn retry_info(details: &[u8]) -> Option<Duration> {
    #[derive(Clone, PartialEq, prost::Message)]
    struct RpcStatus {
        #[prost(message, repeated, tag = "3")]
        details: Vec<prost_types::Any>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct RetryInfo {
        #[prost(message, optional, tag = "1")]
        retry_delay: Option<prost_types::Duration>,
    }
    let st = RpcStatus::decode(details).ok()?;
    let any = st.details.iter().find(|a| a.type_url.ends_with("google.rpc.RetryInfo"))?;
    let d = RetryInfo::decode(any.value.as_slice()).ok()?.retry_delay?;
    Some(Duration::from_secs(u64::try_from(d.seconds).ok()?) + Duration::from_nanos(u64::try_from(d.nanos).unwrap_or(0)))
}

/// The headers as gRPC metadata (names lower-cased).
fn grpc_metadata(headers: &[(String, String)]) -> Result<tonic::metadata::MetadataMap> {
    let mut md = tonic::metadata::MetadataMap::new();
    for (k, v) in headers {
        let key = tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
            .with_context(|| format!("invalid OTLP header name {k:?}"))?;
        md.insert(key, v.parse().with_context(|| format!("invalid OTLP header value for {k:?}"))?);
    }
    Ok(md)
}

fn http_headers(headers: &[(String, String)]) -> Result<http::HeaderMap> {
    let mut map = http::HeaderMap::new();
    for (k, v) in headers {
        let name = http::HeaderName::from_bytes(k.as_bytes()).with_context(|| format!("invalid OTLP header name {k:?}"))?;
        map.insert(name, http::HeaderValue::from_str(v).with_context(|| format!("invalid OTLP header value for {k:?}"))?);
    }
    Ok(map)
}

/// The HTTP statuses the OTLP specification says to retry.
pub fn http_retryable(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504)
}

/// The gRPC codes the OTLP specification says to retry.
pub fn grpc_retryable(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(code, Cancelled | DeadlineExceeded | ResourceExhausted | Aborted | OutOfRange | Unavailable | DataLoss)
}

/// What an export request sends: a message as it is, or uvspan's spans in
/// pieces (see [`super::encode::framing`]).
#[derive(Debug)]
pub enum Body {
    Bytes(Bytes),
    Pieces { head: Vec<u8>, runs: Vec<Arc<Vec<u8>>>, tail: Vec<u8> },
}

impl Body {
    fn len(&self) -> usize {
        match self {
            Body::Bytes(b) => b.len(),
            Body::Pieces { head, runs, tail } => head.len() + runs.iter().map(|r| r.len()).sum::<usize>() + tail.len(),
        }
    }

    /// In one buffer (HTTP sends one body).
    fn into_bytes(self) -> Bytes {
        let len = self.len();
        match self {
            Body::Bytes(b) => b,
            Body::Pieces { head, runs, tail } => {
                let mut v = Vec::with_capacity(len);
                v.extend_from_slice(&head);
                runs.iter().for_each(|r| v.extend_from_slice(r));
                v.extend_from_slice(&tail);
                Bytes::from(v)
            }
        }
    }
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Body {
        Body::Bytes(b)
    }
}

/// gRPC with the bytes of a message, neither decoded nor encoded (framing
/// and compression are tonic's): uvspan's spans are encoded already, the
/// app's (--otlp-listen) forwarded as they came.
#[derive(Clone, Copy, Debug, Default)]
pub struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Body;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Body;
    type Error = tonic::Status;
    fn encode(&mut self, item: Body, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.reserve(item.len());
        match item {
            Body::Bytes(b) => dst.put_slice(&b),
            Body::Pieces { head, runs, tail } => {
                dst.put_slice(&head);
                runs.iter().for_each(|r| dst.put_slice(r));
                dst.put_slice(&tail);
            }
        }
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        use bytes::Buf;
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers every connection with `reply` (what a server of
    /// the other protocol sends first), then closes it.
    async fn other_protocol(reply: &'static [u8]) -> u16 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf).await;
                let _ = c.write_all(reply).await;
                let _ = c.shutdown().await;
            }
        });
        port
    }

    fn settings(protocol: OtlpProtocol, from: &str, port: u16) -> Settings {
        let path = if protocol == OtlpProtocol::Grpc { "" } else { "/v1/traces" };
        Settings {
            signal: Signal::Traces,
            url: format!("http://127.0.0.1:{port}{path}"),
            protocol,
            protocol_from: from.into(),
            headers: vec![],
            timeout: Duration::from_secs(5),
            gzip: false,
            tls: Default::default(),
        }
    }

    /// An empty HTTP/2 SETTINGS frame: a gRPC port's first bytes.
    const H2_SETTINGS: &[u8] = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    const H1_400: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

    #[tokio::test]
    async fn the_other_protocol_is_named_with_where_the_setting_came_from() {
        let port = other_protocol(H2_SETTINGS).await;
        let c = Client::new(&settings(OtlpProtocol::HttpProtobuf, "OTEL_EXPORTER_OTLP_PROTOCOL", port)).unwrap();
        let f = c.send(Body::Bytes(Bytes::new())).await.unwrap_err();
        eprintln!("http -> h2: {}", f.message);
        assert!(f.message.contains("answered HTTP/2 (gRPC)"), "{}", f.message);
        assert!(f.message.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{}", f.message);
        assert!(!f.retryable, "it does not mend itself");
        assert_eq!(f.message.lines().count(), 1);
        let port = other_protocol(H1_400).await;
        let c = Client::new(&settings(OtlpProtocol::Grpc, "--otlp-protocol", port)).unwrap();
        let f = c.send(Body::Bytes(Bytes::new())).await.unwrap_err();
        eprintln!("grpc -> h1: {}", f.message);
        assert!(f.message.contains("answered HTTP/1.1"), "{}", f.message);
        assert!(f.message.contains("--otlp-protocol"), "{}", f.message);
        assert!(!f.retryable);
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_takes_what_the_collector_asks() {
        let mut b = Backoff::default();
        let f = Fail::retry("x".into());
        let waits: Vec<_> = (0..7).map(|_| b.wait(&f).as_millis()).collect();
        assert_eq!(waits, [200, 400, 800, 1600, 3200, 5000, 5000]);
        let asked = Fail { after: Some(Duration::from_secs(2)), ..f.clone() };
        assert_eq!(b.wait(&asked), Duration::from_secs(2));
        let greedy = Fail { after: Some(Duration::from_secs(3600)), ..f.clone() };
        assert_eq!(b.wait(&greedy), Duration::from_secs(30));
        b.reset();
        assert_eq!(b.wait(&f), Duration::from_millis(200));
    }

    #[test]
    fn retry_info_is_read_from_grpc_status_details() {
        #[derive(Clone, PartialEq, prost::Message)]
        struct RpcStatus {
            #[prost(int32, tag = "1")]
            code: i32,
            #[prost(message, repeated, tag = "3")]
            details: Vec<prost_types::Any>,
        }
        let info = prost_types::Duration { seconds: 3, nanos: 500_000_000 };
        #[derive(Clone, PartialEq, prost::Message)]
        struct RetryInfo {
            #[prost(message, optional, tag = "1")]
            retry_delay: Option<prost_types::Duration>,
        }
        let any = prost_types::Any {
            type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
            value: RetryInfo { retry_delay: Some(info) }.encode_to_vec(),
        };
        let st = RpcStatus { code: 8, details: vec![any] }.encode_to_vec();
        assert_eq!(retry_info(&st), Some(Duration::from_millis(3500)));
        assert_eq!(retry_info(b"\xff\xff"), None);
        assert_eq!(retry_info(&[]), None);
    }

    #[test]
    fn retryable_statuses_and_codes() {
        assert!(http_retryable(503) && http_retryable(429) && !http_retryable(400) && !http_retryable(401));
        assert!(grpc_retryable(tonic::Code::Unavailable) && !grpc_retryable(tonic::Code::InvalidArgument));
    }
}
