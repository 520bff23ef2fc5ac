//! OTLP export (gRPC via tonic, or HTTP/protobuf): the spans of each traced
//! process under that process's resource, encoded by `encode.rs`.

use std::sync::Arc;

use anyhow::Result;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use opentelemetry_sdk::Resource;
use prost::Message;

use super::client::{Body, Client, Fail, Settings};
use super::encode::Encoded;
use super::{Part, Sink};

/// The OTLP trace sink: spans encoded by [`super::encode`] and sent as they
/// are through the one OTLP [`Client`] (gRPC `TraceService/Export` or
/// HTTP/protobuf `POST /v1/traces`).
pub struct Otlp {
    client: Client,
    /// Spans the collector rejected (partial success), said once.
    said_rejected: bool,
}

impl Otlp {
    /// Sets up the client (inside the tokio runtime).
    pub fn new(s: &Settings) -> Result<Otlp> {
        Ok(Otlp { client: Client::new(s)?, said_rejected: false })
    }
}

impl Sink for Otlp {
    async fn export(&mut self, resource: &Resource, _label: &str, parts: &mut [Part]) -> Result<u64, Fail> {
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
        let sent = self.client.send(body).await;
        for (p, b) in parts.iter_mut().zip(runs) {
            if let Part::Otlp(e) = p {
                e.bytes = take_back(b);
            }
        }
        let partial = ExportTraceServiceResponse::decode(sent?.as_ref()).ok().and_then(|r| r.partial_success);
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
