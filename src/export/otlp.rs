//! OTLP export through opentelemetry-otlp (gRPC via tonic, or HTTP/protobuf).
//! Spans of each traced process are exported under that process's resource.

use anyhow::{bail, Context, Result};
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use opentelemetry_sdk::Resource;

use super::Sink;

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

pub struct Otlp {
    exporter: SpanExporter,
}

impl Otlp {
    /// Builds the exporter (inside the tokio runtime). Headers come from
    /// OTEL_EXPORTER_OTLP_HEADERS, timeout from OTEL_EXPORTER_OTLP_TIMEOUT.
    pub fn new(c: &OtlpConfig) -> Result<Otlp> {
        let url = c.traces_url();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bail!("invalid OTLP endpoint {:?}: it must start with http:// or https://", c.endpoint);
        }
        let exporter = match c.protocol {
            OtlpProtocol::Grpc => {
                let mut b = SpanExporter::builder().with_tonic().with_endpoint(url.clone());
                if !c.headers.is_empty() {
                    let mut md = tonic::metadata::MetadataMap::new();
                    for (k, v) in &c.headers {
                        let key = tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                            .with_context(|| format!("invalid OTLP header name {k:?}"))?;
                        let val = v.parse().with_context(|| format!("invalid OTLP header value for {k:?}"))?;
                        md.insert(key, val);
                    }
                    b = b.with_metadata(md);
                }
                b.build()
            }
            OtlpProtocol::HttpProtobuf => SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(url.clone())
                .with_headers(c.headers.iter().cloned().collect())
                .build(),
        }
        .with_context(|| format!("cannot set up the OTLP exporter for {url}"))?;
        Ok(Otlp { exporter })
    }
}

impl Sink for Otlp {
    async fn export(&mut self, resource: &Resource, _label: &str, spans: Vec<SpanData>) -> Result<(), String> {
        self.exporter.set_resource(resource);
        self.exporter.export(spans).await.map_err(|e| e.to_string())
    }
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
}
