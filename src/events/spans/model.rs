//! uvspan's span: what a record becomes and what the exporters read.
//!
//! Not the SDK's `SpanData`: at 100k spans/s building, moving, encoding and
//! freeing that struct (352 bytes: a `SystemTime` pair, an instrumentation
//! scope cloned into every span, event and link lists, attribute values
//! behind the SDK's string type) was a large part of uvspan's CPU per span.
//! Here times are wall-clock nanoseconds, keys and fixed values are static
//! strings, and the one instrumentation scope (uvspan's) is the exporter's,
//! not each span's. The OTLP encoder writes this type directly; its tests
//! check the bytes against opentelemetry-proto's conversion of the same
//! spans made into `SpanData` ([`Span::to_sdk`]).

use std::borrow::Cow;
use std::fmt;

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceId};

/// An attribute key: static for uvspan's own keys, owned when built.
#[derive(Clone, Debug, PartialEq)]
pub struct Key(Cow<'static, str>);

impl Key {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&'static str> for Key {
    fn from(s: &'static str) -> Key {
        Key(Cow::Borrowed(s))
    }
}

impl From<String> for Key {
    fn from(s: String) -> Key {
        Key(Cow::Owned(s))
    }
}

/// An attribute value (the kinds uvspan writes).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    String(Cow<'static, str>),
    I64(i64),
    F64(f64),
    Bool(bool),
    /// A list of strings (`dns.answers`).
    Strings(Vec<String>),
}

impl Value {
    /// The value as text (a string's own text; other kinds formatted).
    pub fn as_str(&self) -> Cow<'_, str> {
        match self {
            Value::String(s) => Cow::Borrowed(s),
            other => Cow::Owned(other.to_string()),
        }
    }
}

impl From<&'static str> for Value {
    fn from(s: &'static str) -> Value {
        Value::String(Cow::Borrowed(s))
    }
}
impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::String(Cow::Owned(s))
    }
}
impl From<Cow<'static, str>> for Value {
    fn from(s: Cow<'static, str>) -> Value {
        Value::String(s)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::I64(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::F64(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

/// As the SDK's `Value` displays (the console and golden files rely on it).
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::String(s) => f.write_str(s),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::Strings(v) => {
                f.write_str("[")?;
                for (i, s) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "\"{s}\"")?;
                }
                f.write_str("]")
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct KeyValue {
    pub key: Key,
    pub value: Value,
}

impl KeyValue {
    pub fn new(key: impl Into<Key>, value: impl Into<Value>) -> KeyValue {
        KeyValue { key: key.into(), value: value.into() }
    }
}

/// A span event (threadpool start/end, a sampled stack).
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub name: &'static str,
    /// Wall clock, nanoseconds since the Unix epoch.
    pub time_ns: u64,
    pub attributes: Vec<KeyValue>,
}

/// What a span is, said where its family builds it (the report counts
/// spans by this, never by their names). uvspan's own: not exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// An fs request: its operation (`stat`; the catalog row's, `unknown`
    /// for an operation id with no row).
    Fs(&'static str),
    /// A DNS lookup (`dns.getaddrinfo`).
    Dns,
    /// A loop iteration (`uv.loop.iteration`).
    Iteration,
    /// A phase of a loop iteration (a child of its span).
    Phase,
    /// A request's SERVER span or an outgoing call's CLIENT span.
    Http,
    /// A database or cache call's CLIENT span (`db.system.name`).
    Db,
    /// A background task's root span, or a process's start-up span.
    Task,
    /// A process's root span (`--trace-per process`).
    Process,
    /// None of uvspan's families (spans made in tests).
    Other,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub span_context: SpanContext,
    /// INVALID: a root.
    pub parent_span_id: SpanId,
    pub parent_span_is_remote: bool,
    pub span_kind: SpanKind,
    pub name: Cow<'static, str>,
    /// Wall clock, nanoseconds since the Unix epoch.
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: Vec<KeyValue>,
    pub events: Vec<Event>,
    pub status: Status,
    /// What the span is (not exported: the name says it on the wire).
    pub family: Family,
}

impl Span {
    pub fn span_id(&self) -> SpanId {
        self.span_context.span_id()
    }

    pub fn trace_id(&self) -> TraceId {
        self.span_context.trace_id()
    }

    pub fn attr(&self, key: &str) -> Option<&Value> {
        self.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| &kv.value)
    }

    /// Duration in milliseconds.
    pub fn ms(&self) -> f64 {
        self.end_ns.saturating_sub(self.start_ns) as f64 / 1e6
    }

    /// The same span as the SDK's `SpanData` under `scope`: what the OTLP
    /// encoder's tests compare against opentelemetry-proto's conversion.
    pub fn to_sdk(&self, scope: &opentelemetry::InstrumentationScope) -> opentelemetry_sdk::trace::SpanData {
        use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
        let time = |ns: u64| std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns);
        let kvs = |a: &[KeyValue]| a.iter().map(KeyValue::to_sdk).collect::<Vec<_>>();
        let mut events = SpanEvents::default();
        for e in &self.events {
            events.events.push(opentelemetry::trace::Event::new(e.name, time(e.time_ns), kvs(&e.attributes), 0));
        }
        opentelemetry_sdk::trace::SpanData {
            span_context: self.span_context.clone(),
            parent_span_id: self.parent_span_id,
            parent_span_is_remote: self.parent_span_is_remote,
            span_kind: self.span_kind.clone(),
            name: self.name.clone(),
            start_time: time(self.start_ns),
            end_time: time(self.end_ns),
            attributes: kvs(&self.attributes),
            dropped_attributes_count: 0,
            events,
            links: SpanLinks::default(),
            status: self.status.clone(),
            instrumentation_scope: scope.clone(),
        }
    }
}

impl KeyValue {
    pub fn to_sdk(&self) -> opentelemetry::KeyValue {
        use opentelemetry::{Array, StringValue};
        let v = match &self.value {
            Value::String(s) => opentelemetry::Value::String(s.to_string().into()),
            Value::I64(v) => opentelemetry::Value::I64(*v),
            Value::F64(v) => opentelemetry::Value::F64(*v),
            Value::Bool(v) => opentelemetry::Value::Bool(*v),
            Value::Strings(v) => opentelemetry::Value::Array(Array::String(v.iter().map(|s| StringValue::from(s.clone())).collect())),
        };
        opentelemetry::KeyValue::new(self.key.as_str().to_string(), v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The console and the golden files show values as the SDK's `Value` did.
    #[test]
    fn values_display_as_the_sdk_displays_them() {
        use opentelemetry::{Array, StringValue};
        let pairs: Vec<(Value, opentelemetry::Value)> = vec![
            (Value::from("/etc/hosts"), opentelemetry::Value::from("/etc/hosts")),
            (Value::from(-3i64), opentelemetry::Value::from(-3i64)),
            (Value::from(0.25), opentelemetry::Value::from(0.25)),
            (Value::from(1e-7), opentelemetry::Value::from(1e-7)),
            (Value::from(true), opentelemetry::Value::from(true)),
            (
                Value::Strings(vec!["127.0.0.1".into(), "a\"b".into()]),
                opentelemetry::Value::Array(Array::String(vec![StringValue::from("127.0.0.1"), StringValue::from("a\"b")])),
            ),
            (Value::Strings(vec![]), opentelemetry::Value::Array(Array::String(vec![]))),
        ];
        for (ours, sdk) in pairs {
            assert_eq!(ours.to_string(), sdk.to_string());
        }
    }
}
