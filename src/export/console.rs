//! The console view: one line per span, children indented under their parent.
//!
//! `14:03:07.123456 demo[4242] fs.open 0.081ms file.path=/etc/hosts uvspan.fs.fd=21 …`

use std::borrow::Borrow;
use std::io::Write;

use opentelemetry::trace::{SpanId, Status};
use opentelemetry_sdk::Resource;

use crate::events::spans::{Span, Value};

use super::client::Fail as ExportError;
use super::{Part, Sink};

pub struct Console<W: Write + Send + 'static> {
    out: W,
}

impl Console<std::io::Stdout> {
    pub fn stdout() -> Self {
        Console { out: std::io::stdout() }
    }
}

impl<W: Write + Send + 'static> Sink for Console<W> {
    async fn export(&mut self, _resource: &Resource, label: &str, parts: &mut [Part]) -> Result<u64, ExportError> {
        let mut spans: Vec<&Span> = Vec::new();
        for p in parts.iter() {
            match p {
                Part::Spans(s) => spans.extend(s),
                // The console's exporter keeps spans; an encoded run cannot be shown.
                Part::Otlp(_) => {
                    return Err(ExportError {
                        message: "OTLP-encoded spans queued for the console".into(),
                        retryable: false,
                        after: None,
                        unanswered: false,
                    })
                }
            }
        }
        let text = render(label, &spans);
        self.out.write_all(text.as_bytes()).and_then(|_| self.out.flush()).map_err(|e| ExportError {
            message: e.to_string(),
            retryable: false,
            after: None,
            unanswered: false,
        })?;
        Ok(0)
    }
}

/// Renders spans, each root followed by its descendants, indented.
pub fn render<S: Borrow<Span>>(label: &str, spans: &[S]) -> String {
    let spans: Vec<&Span> = spans.iter().map(Borrow::borrow).collect();
    let spans = &spans[..];
    let mut out = String::new();
    let ids: Vec<SpanId> = spans.iter().map(|s| s.span_context.span_id()).collect();
    for (i, s) in spans.iter().enumerate() {
        if s.parent_span_id == SpanId::INVALID || !ids.contains(&s.parent_span_id) {
            walk(label, spans, i, 0, &mut out);
        }
    }
    out
}

fn walk(label: &str, spans: &[&Span], i: usize, depth: usize, out: &mut String) {
    out.push_str(&line(label, spans[i], depth));
    out.push('\n');
    let id = spans[i].span_context.span_id();
    for (j, c) in spans.iter().enumerate() {
        if c.parent_span_id == id && depth < 16 {
            walk(label, spans, j, depth + 1, out);
        }
    }
}

/// One span as a line.
pub fn line(label: &str, s: &Span, depth: usize) -> String {
    let mut l = format!("{} {label} {:indent$}{} {:.3}ms", clock(s.start_ns), "", s.name, s.ms(), indent = depth * 2);
    if let Status::Error { description } = &s.status {
        l.push_str(&format!(" ERROR({description})"));
    }
    for kv in &s.attributes {
        l.push(' ');
        l.push_str(kv.key.as_str());
        l.push('=');
        l.push_str(&value(&kv.value));
    }
    l
}

fn value(v: &Value) -> String {
    match v {
        Value::F64(f) => format!("{f:.3}"),
        Value::String(s) if s.contains(' ') || s.is_empty() => format!("{s:?}"),
        other => other.to_string(),
    }
}

/// HH:MM:SS.micro (UTC).
fn clock(unix_ns: u64) -> String {
    let s = unix_ns / 1_000_000_000;
    let micros = unix_ns % 1_000_000_000 / 1_000;
    format!("{:02}:{:02}:{:02}.{micros:06}", (s / 3600) % 24, (s / 60) % 60, s % 60)
}
