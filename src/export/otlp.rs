//! OTLP export (gRPC via tonic, or HTTP/protobuf): the spans of each traced
//! process under that process's resource, encoded by `encode.rs`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTracePartialSuccess, ExportTraceServiceResponse};
use opentelemetry_sdk::Resource;
use prost::Message;

use super::encode::Encoded;
use super::{ExportError, Part, Sink};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
    HttpProtobuf,
}

impl std::str::FromStr for OtlpProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "grpc" => Ok(OtlpProtocol::Grpc),
            "http/protobuf" => Ok(OtlpProtocol::HttpProtobuf),
            other => Err(format!("unsupported OTLP protocol {other:?}: use grpc or http/protobuf")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct OtlpConfig {
    /// Base endpoint (`http://collector:4317`); for HTTP `/v1/traces` is added.
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    /// Extra headers (from the config file; OTEL_EXPORTER_OTLP_HEADERS is
    /// read by the exporter itself).
    pub headers: Vec<(String, String)>,
}

impl OtlpConfig {
    /// The URL spans are sent to.
    pub fn traces_url(&self) -> String {
        let base = self.endpoint.trim_end_matches('/');
        match self.protocol {
            OtlpProtocol::Grpc => base.to_string(),
            OtlpProtocol::HttpProtobuf if base.ends_with("/v1/traces") => base.to_string(),
            OtlpProtocol::HttpProtobuf => format!("{base}/v1/traces"),
        }
    }
}

/// The OTLP trace sink: spans encoded by [`super::encode`] and sent as they
/// are, over gRPC (tonic, `TraceService/Export`) or HTTP/protobuf
/// (`POST /v1/traces`). Headers: `OTEL_EXPORTER_OTLP_HEADERS`, else the
/// config file's; timeout per export request: `OTEL_EXPORTER_OTLP_TIMEOUT`
/// (ms, default 10000).
pub struct Otlp {
    transport: Transport,
    timeout: Duration,
    /// Spans the collector rejected (partial success), said once.
    said_rejected: bool,
}

// One per exporter, built once and never moved on a hot path: the size
// difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Transport {
    Grpc { client: tonic::client::Grpc<tonic::transport::Channel>, metadata: tonic::metadata::MetadataMap },
    Http { client: reqwest::Client, url: String },
}

const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

impl Otlp {
    /// Sets up the transport (inside the tokio runtime); connects lazily, so
    /// a collector that is not up yet is only a failed export.
    pub fn new(c: &OtlpConfig) -> Result<Otlp> {
        let url = c.traces_url();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bail!("invalid OTLP endpoint {:?}: it must start with http:// or https://", c.endpoint);
        }
        let headers = headers(c)?;
        let timeout = timeout();
        let transport = match c.protocol {
            OtlpProtocol::Grpc => {
                let channel = tonic::transport::Endpoint::from_shared(url.clone())
                    .with_context(|| format!("invalid OTLP endpoint {url:?}"))?
                    .connect_timeout(timeout)
                    .connect_lazy();
                Transport::Grpc { client: tonic::client::Grpc::new(channel), metadata: grpc_metadata(&headers)? }
            }
            OtlpProtocol::HttpProtobuf => {
                let mut map = reqwest::header::HeaderMap::new();
                for (k, v) in &headers {
                    let name =
                        reqwest::header::HeaderName::from_bytes(k.as_bytes()).with_context(|| format!("invalid OTLP header name {k:?}"))?;
                    let val = reqwest::header::HeaderValue::from_str(v).with_context(|| format!("invalid OTLP header value for {k:?}"))?;
                    map.insert(name, val);
                }
                map.insert(reqwest::header::CONTENT_TYPE, reqwest::header::HeaderValue::from_static("application/x-protobuf"));
                let client = reqwest::Client::builder()
                    .default_headers(map)
                    .timeout(timeout)
                    .build()
                    .context("cannot set up the OTLP HTTP client")?;
                Transport::Http { client, url: url.clone() }
            }
        };
        Ok(Otlp { transport, timeout, said_rejected: false })
    }

    /// Sends one encoded request; the collector's partial-success answer
    /// (spans rejected, and why).
    async fn send(&mut self, body: Body) -> Result<Option<ExportTracePartialSuccess>, ExportError> {
        let retry = |message: String| ExportError { message, retryable: true };
        let timeout = self.timeout;
        let late = move || retry(format!("no answer within {timeout:?} (OTEL_EXPORTER_OTLP_TIMEOUT)"));
        let answer = match &mut self.transport {
            Transport::Grpc { client, metadata } => {
                let call = async {
                    client.ready().await.map_err(|e| retry(format!("cannot reach the collector: {e}")))?;
                    let mut req = tonic::Request::new(body);
                    *req.metadata_mut() = metadata.clone();
                    let path = tonic::codegen::http::uri::PathAndQuery::from_static(EXPORT_PATH);
                    client.unary(req, path, Raw).await.map(tonic::Response::into_inner).map_err(|s| ExportError {
                        message: format!("the collector answered {:?}: {}", s.code(), s.message()),
                        retryable: grpc_retryable(s.code()),
                    })
                };
                tokio::time::timeout(timeout, call).await.map_err(|_| late())??
            }
            Transport::Http { client, url } => {
                let resp = client.post(url.as_str()).body(body.into_bytes()).send().await.map_err(|e| {
                    if e.is_timeout() {
                        late()
                    } else {
                        retry(format!("cannot reach the collector: {e}"))
                    }
                })?;
                let status = resp.status();
                let bytes = resp.bytes().await.map_err(|e| retry(format!("reading the collector's answer: {e}")))?;
                if !status.is_success() {
                    return Err(ExportError {
                        message: format!("the collector answered HTTP {status}"),
                        retryable: http_retryable(status.as_u16()),
                    });
                }
                bytes
            }
        };
        Ok(ExportTraceServiceResponse::decode(answer.as_ref()).ok().and_then(|r| r.partial_success))
    }
}

impl Sink for Otlp {
    async fn export(&mut self, resource: &Resource, _label: &str, parts: &mut [Part]) -> Result<u64, ExportError> {
        // Runs come encoded from the queue; spans (not made by uvspan's
        // queue) are encoded here. The runs' bytes are lent to the request
        // (gRPC copies them into its frame once; no request buffer is
        // built for it) and taken back after.
        let mut runs = Vec::with_capacity(parts.len());
        let mut n = 0;
        for p in parts.iter_mut() {
            let e = match p {
                Part::Otlp(e) => std::mem::take(&mut e.bytes),
                Part::Spans(s) => Encoded::of(s).bytes,
            };
            n += p.len();
            runs.push(Arc::new(e));
        }
        // No spans: no scope and no runs (they are empty anyway).
        let lent = if n > 0 { runs.clone() } else { Vec::new() };
        let f = super::encode::framing(resource, lent.iter().map(|r| r.len()).sum(), n > 0);
        let body = Body::Pieces { head: f.head, runs: lent, tail: f.tail };
        let sent = self.send(body).await;
        for (p, b) in parts.iter_mut().zip(runs) {
            if let Part::Otlp(e) = p {
                e.bytes = take_back(b);
            }
        }
        let partial = sent?;
        let rejected = partial.as_ref().map_or(0, |p| p.rejected_spans.max(0) as u64);
        if rejected > 0 && !self.said_rejected {
            self.said_rejected = true;
            let why = partial.map(|p| p.error_message).unwrap_or_default();
            eprintln!("uvspan: the collector rejected {rejected} spans: {why} (counted as failed; said once)");
        }
        Ok(rejected)
    }
}

/// A buffer lent to a request, back as it was (copied only if the request
/// still holds it, which it does not once it was encoded or dropped).
fn take_back(b: Arc<Vec<u8>>) -> Vec<u8> {
    Arc::try_unwrap(b).unwrap_or_else(|shared| shared.to_vec())
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

/// uvspan's OTLP headers (its span exporter's and the forwarder's):
/// `OTEL_EXPORTER_OTLP_HEADERS`, else the config file's.
pub fn headers(c: &OtlpConfig) -> Result<Vec<(String, String)>> {
    match std::env::var("OTEL_EXPORTER_OTLP_HEADERS") {
        Ok(v) => parse_headers(&v).context("invalid OTEL_EXPORTER_OTLP_HEADERS"),
        Err(_) => Ok(c.headers.clone()),
    }
}

/// Per export request: `OTEL_EXPORTER_OTLP_TIMEOUT` (ms), default 10 s.
pub fn timeout() -> Duration {
    std::env::var("OTEL_EXPORTER_OTLP_TIMEOUT")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis)
}

/// The headers as gRPC metadata (names lower-cased).
pub fn grpc_metadata(headers: &[(String, String)]) -> Result<tonic::metadata::MetadataMap> {
    let mut md = tonic::metadata::MetadataMap::new();
    for (k, v) in headers {
        let key = tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
            .with_context(|| format!("invalid OTLP header name {k:?}"))?;
        md.insert(key, v.parse().with_context(|| format!("invalid OTLP header value for {k:?}"))?);
    }
    Ok(md)
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

/// `OTEL_EXPORTER_OTLP_HEADERS`: `k1=v1,k2=v2`, values percent-decoded (W3C
/// baggage format, as the OpenTelemetry specification says).
pub fn parse_headers(s: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((k, v)) = item.split_once('=') else { bail!("{item:?} is not key=value") };
        let k = k.trim();
        if k.is_empty() {
            bail!("{item:?} has no header name");
        }
        out.push((k.to_string(), percent_decode(v.trim())));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let c = |e: &str, p| OtlpConfig { endpoint: e.into(), protocol: p, headers: vec![] };
        assert_eq!(c("http://h:4318", OtlpProtocol::HttpProtobuf).traces_url(), "http://h:4318/v1/traces");
        assert_eq!(c("http://h:4318/", OtlpProtocol::HttpProtobuf).traces_url(), "http://h:4318/v1/traces");
        assert_eq!(c("http://h:4318/v1/traces", OtlpProtocol::HttpProtobuf).traces_url(), "http://h:4318/v1/traces");
        assert_eq!(c("http://h:4317", OtlpProtocol::Grpc).traces_url(), "http://h:4317");
        assert!("http/json".parse::<OtlpProtocol>().is_err());
    }

    #[test]
    fn headers_from_the_environment_format() {
        assert_eq!(
            parse_headers("api-key=abc%20def, x-tenant = t1 ,,").unwrap(),
            vec![("api-key".to_string(), "abc def".to_string()), ("x-tenant".to_string(), "t1".to_string())]
        );
        assert_eq!(parse_headers("a=100%").unwrap(), vec![("a".to_string(), "100%".to_string())]);
        assert_eq!(parse_headers("a=b=c").unwrap(), vec![("a".to_string(), "b=c".to_string())]);
        assert!(parse_headers("novalue").is_err());
        assert!(parse_headers("=v").is_err());
        assert_eq!(parse_headers("").unwrap(), vec![]);
    }
}
