//! OTLP protobuf bytes straight from uvspan's spans: one
//! `ExportTraceServiceRequest` per process and batch, written in one pass
//! into one buffer.
//!
//! The OpenTelemetry SDK exporter first converts every span into the
//! generated (prost) message types — a `String` per attribute key and value,
//! a `Vec` per list — then encodes and frees them; at tens of thousands of
//! spans per second that was most of uvspan's own CPU per span (allocation,
//! conversion, buffer growth). Here each field is written once, from the
//! span as it is. The message layout is opentelemetry-proto's (the
//! `opentelemetry/proto/{collector/trace,trace,common,resource}/v1` files);
//! the unit tests check that the bytes are exactly what that crate's own
//! conversion and prost give for the same spans made into the SDK's type.

use std::borrow::Borrow;

use opentelemetry::trace::{SpanId, SpanKind, Status};
use opentelemetry::{Array, StringValue};
use opentelemetry_sdk::Resource;

use crate::events::spans::{KeyValue, Span, Value, SCOPE_NAME, SCOPE_VERSION};

/// Protobuf wire types.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;
const FIXED32: u32 = 5;

/// Span flags (opentelemetry.proto.trace.v1.SpanFlags).
const CONTEXT_HAS_IS_REMOTE: u32 = 0x100;
const CONTEXT_IS_REMOTE: u32 = 0x200;

/// The buffer being written. One pass: a nested message's length is
/// written before its body, so [`Enc::begin`] reserves the bytes the length
/// usually takes at that level and [`Enc::end`] fills them in, moving the
/// body when the length needs more or fewer (the bytes stay canonical:
/// equal to what prost writes).
struct Enc {
    buf: Vec<u8>,
}

/// An open nested message: where its length goes and how many bytes were
/// reserved for it.
#[derive(Clone, Copy)]
#[must_use]
struct Open {
    at: usize,
    reserved: usize,
}

impl Enc {
    fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }
    fn key(&mut self, field: u32, wire: u32) {
        self.varint(u64::from(field << 3 | wire));
    }
    fn bytes(&mut self, field: u32, b: &[u8]) {
        if !b.is_empty() {
            self.key(field, LEN);
            self.varint(b.len() as u64);
            self.raw(b);
        }
    }
    fn string(&mut self, field: u32, s: &str) {
        self.bytes(field, s.as_bytes());
    }
    fn uint(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.key(field, VARINT);
            self.varint(v);
        }
    }
    fn fixed64(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.key(field, FIXED64);
            self.raw(&v.to_le_bytes());
        }
    }
    fn fixed32(&mut self, field: u32, v: u32) {
        if v != 0 {
            self.key(field, FIXED32);
            self.raw(&v.to_le_bytes());
        }
    }
    /// Starts nested message `field`, reserving `reserved` bytes (1..=5) for
    /// its length: what its size usually needs (1 below 128 bytes, 2 below
    /// 16 KiB, 3 below 2 MiB).
    fn begin(&mut self, field: u32, reserved: usize) -> Open {
        self.key(field, LEN);
        let at = self.buf.len();
        self.buf.resize(at + reserved, 0);
        Open { at, reserved }
    }
    /// Ends it: writes its length into the reserved bytes, moving the body
    /// if the length takes another number of bytes.
    fn end(&mut self, m: Open) {
        let body = m.at + m.reserved;
        let n = self.buf.len() - body;
        let need = varint_len(n as u64);
        if need > m.reserved {
            let grow = need - m.reserved;
            self.buf.resize(self.buf.len() + grow, 0);
            self.buf.copy_within(body..body + n, body + grow);
        } else if need < m.reserved {
            self.buf.copy_within(body..body + n, m.at + need);
            self.buf.truncate(m.at + need + n);
        }
        let mut v = n as u64;
        for b in &mut self.buf[m.at..m.at + need] {
            *b = (v as u8 & 0x7f) | 0x80;
            v >>= 7;
        }
        self.buf[m.at + need - 1] &= 0x7f;
    }
}

/// Bytes of `v` as a varint.
fn varint_len(v: u64) -> usize {
    // 1 byte per 7 bits, at least one.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// AnyValue.string_value: an empty string is still "set" in a oneof, so it
/// is written explicitly.
fn string_value(o: &mut Enc, s: &str) {
    o.key(1, LEN);
    o.varint(s.len() as u64);
    o.raw(s.as_bytes());
}

/// common.v1.AnyValue's oneof.
fn any_value(o: &mut Enc, v: &Value) {
    match v {
        Value::String(s) => string_value(o, s),
        Value::Bool(b) => {
            o.key(2, VARINT);
            o.varint(u64::from(*b));
        }
        Value::I64(i) => {
            o.key(3, VARINT);
            o.varint(*i as u64);
        }
        Value::F64(f) => {
            o.key(4, FIXED64);
            o.raw(&f.to_le_bytes());
        }
        Value::Strings(v) => {
            let m = o.begin(5, 1);
            v.iter().for_each(|s| element(o, |o| string_value(o, s)));
            o.end(m);
        }
    }
}

/// The SDK's AnyValue (resource attributes), its oneof (nothing for a value
/// kind it does not know).
fn sdk_value(o: &mut Enc, v: &opentelemetry::Value) {
    use opentelemetry::Value as V;
    match v {
        V::String(s) => string_value(o, s.as_str()),
        V::Bool(b) => any_value(o, &Value::Bool(*b)),
        V::I64(i) => any_value(o, &Value::I64(*i)),
        V::F64(f) => any_value(o, &Value::F64(*f)),
        V::Array(a) => {
            let m = o.begin(5, 1);
            array(o, a);
            o.end(m);
        }
        _ => {}
    }
}

/// One element of a common.v1.ArrayValue: an AnyValue message.
fn element(o: &mut Enc, write: impl FnOnce(&mut Enc)) {
    let m = o.begin(1, 1);
    write(o);
    o.end(m);
}

/// common.v1.ArrayValue (the SDK's arrays, in resource attributes).
fn array(o: &mut Enc, a: &Array) {
    match a {
        Array::Bool(v) => v.iter().for_each(|x| element(o, |o| any_value(o, &Value::Bool(*x)))),
        Array::I64(v) => v.iter().for_each(|x| element(o, |o| any_value(o, &Value::I64(*x)))),
        Array::F64(v) => v.iter().for_each(|x| element(o, |o| any_value(o, &Value::F64(*x)))),
        Array::String(v) => v.iter().for_each(|x: &StringValue| element(o, |o| string_value(o, x.as_str()))),
        _ => {}
    }
}

/// One common.v1.KeyValue at `field`.
fn key_value(o: &mut Enc, field: u32, key: &str, value: impl FnOnce(&mut Enc)) {
    let m = o.begin(field, 1);
    o.string(1, key);
    let v = o.begin(2, 1);
    value(o);
    o.end(v);
    o.end(m);
}

/// Bytes of an AnyValue holding `v`, for the kinds whose size is known
/// without writing them (None: a list).
fn scalar_len(v: &Value) -> Option<usize> {
    Some(match v {
        Value::String(s) => 1 + varint_len(s.len() as u64) + s.len(),
        Value::Bool(_) => 2,
        Value::I64(i) => 1 + varint_len(*i as u64),
        Value::F64(_) => 9,
        Value::Strings(_) => return None,
    })
}

/// Repeated common.v1.KeyValue at `field`. Scalars (nearly every
/// attribute) are written with their lengths computed first, not reserved
/// and filled in afterwards.
fn attributes(o: &mut Enc, field: u32, kvs: &[KeyValue]) {
    for kv in kvs {
        let key = kv.key.as_str();
        let Some(value) = scalar_len(&kv.value) else {
            key_value(o, field, key, |o| any_value(o, &kv.value));
            continue;
        };
        let key_len = if key.is_empty() { 0 } else { 1 + varint_len(key.len() as u64) + key.len() };
        o.key(field, LEN);
        o.varint((key_len + 1 + varint_len(value as u64) + value) as u64);
        o.string(1, key);
        o.key(2, LEN);
        o.varint(value as u64);
        any_value(o, &kv.value);
    }
}

/// trace.v1.Span.
fn span(o: &mut Enc, s: &Span) {
    let ctx = &s.span_context;
    o.bytes(1, &ctx.trace_id().to_bytes());
    o.bytes(2, &ctx.span_id().to_bytes());
    trace_state(o, ctx.trace_state());
    if s.parent_span_id != SpanId::INVALID {
        o.bytes(4, &s.parent_span_id.to_bytes());
    }
    o.string(5, &s.name);
    let kind = match s.span_kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    };
    o.uint(6, kind);
    o.fixed64(7, s.start_ns);
    o.fixed64(8, s.end_ns);
    attributes(o, 9, &s.attributes);
    for e in &s.events {
        let m = o.begin(11, 1);
        o.fixed64(1, e.time_ns);
        o.string(2, e.name);
        attributes(o, 3, &e.attributes);
        o.end(m);
    }
    let (code, message) = match &s.status {
        Status::Unset => (0, ""),
        Status::Ok => (1, ""),
        Status::Error { description } => (2, description.as_ref()),
    };
    let m = o.begin(15, 1);
    o.string(2, message);
    o.uint(3, code);
    o.end(m);
    o.fixed32(16, flags(s.parent_span_is_remote, ctx.trace_flags().to_u8()));
}

/// The W3C tracestate header (none: nothing to build).
fn trace_state(o: &mut Enc, ts: &opentelemetry::trace::TraceState) {
    if *ts != opentelemetry::trace::TraceState::NONE {
        o.string(3, &ts.header());
    }
}

/// W3C trace flags plus whether the parent is known to be remote.
fn flags(remote: bool, trace_flags: u8) -> u32 {
    u32::from(trace_flags) | CONTEXT_HAS_IS_REMOTE | if remote { CONTEXT_IS_REMOTE } else { 0 }
}

/// Spans encoded as the repeated `spans` field of a `ScopeSpans` message:
/// a run that the export puts under a process's resource and uvspan's
/// scope as it is (see [`framing`]). Made on the thread that built the spans, right after
/// building them (they are still in its cache, and are freed where they
/// were allocated).
#[derive(Clone, Debug, Default)]
pub struct Encoded {
    pub bytes: Vec<u8>,
    /// How many spans.
    pub n: usize,
}

impl Encoded {
    /// Appends `spans`.
    pub fn push<S: Borrow<Span>>(&mut self, spans: &[S]) {
        // ~150 bytes per fs span: rarely grown.
        self.bytes.reserve(spans.len() * 192);
        let mut o = Enc { buf: std::mem::take(&mut self.bytes) };
        for s in spans {
            let m = o.begin(2, 2);
            span(&mut o, s.borrow());
            o.end(m);
        }
        self.bytes = o.buf;
        self.n += spans.len();
    }

    pub fn of<S: Borrow<Span>>(spans: &[S]) -> Encoded {
        Encoded::in_buffer(Vec::new(), spans)
    }

    /// `spans` written into `buf` (emptied first; one used before keeps its
    /// capacity).
    pub fn in_buffer<S: Borrow<Span>>(mut buf: Vec<u8>, spans: &[S]) -> Encoded {
        buf.clear();
        let mut e = Encoded { bytes: buf, n: 0 };
        e.push(spans);
        e
    }
}

/// An `ExportTraceServiceRequest` around encoded runs of spans, without
/// them: `head`, then the runs' bytes as they are, then `tail`. The runs
/// need not be copied into one buffer to be sent.
#[derive(Debug, PartialEq)]
pub struct Framing {
    pub head: Vec<u8>,
    pub tail: Vec<u8>,
}

/// The framing of runs of `runs_len` bytes in all under `resource`, all in
/// uvspan's instrumentation scope (no scope when there are no spans: then
/// the runs must be empty).
pub fn framing(resource: &Resource, runs_len: usize, any_spans: bool) -> Framing {
    let mut res = Enc { buf: Vec::with_capacity(512) };
    let m = res.begin(1, 2);
    for (k, v) in resource.iter() {
        key_value(&mut res, 1, k.as_str(), |o| sdk_value(o, v));
    }
    res.end(m);
    let mut tail = Enc { buf: Vec::new() };
    tail.string(3, resource.schema_url().unwrap_or_default());
    let mut scope = Enc { buf: Vec::with_capacity(32) };
    if any_spans {
        let m = scope.begin(1, 1);
        scope.string(1, SCOPE_NAME);
        scope.string(2, SCOPE_VERSION);
        scope.end(m);
    }
    // Lengths are known up front: the runs' total and the pieces around them.
    let scope_spans = scope.buf.len() + runs_len;
    let scope_field = if any_spans { 1 + varint_len(scope_spans as u64) + scope_spans } else { 0 };
    let resource_spans = res.buf.len() + scope_field + tail.buf.len();
    let mut head = Enc { buf: Vec::with_capacity(res.buf.len() + scope.buf.len() + 16) };
    head.key(1, LEN);
    head.varint(resource_spans as u64);
    head.raw(&res.buf);
    if any_spans {
        head.key(2, LEN);
        head.varint(scope_spans as u64);
        head.raw(&scope.buf);
    }
    Framing { head: head.buf, tail: tail.buf }
}

/// An `ExportTraceServiceRequest` with the encoded `runs` of spans under
/// `resource`, in one buffer (see [`framing`]): what the tests check
/// against opentelemetry-proto and prost (the exporter sends the pieces).
#[cfg(test)]
pub fn request(resource: &Resource, runs: &[&Encoded]) -> Vec<u8> {
    let any = runs.iter().any(|r| r.n > 0);
    let runs_len: usize = if any { runs.iter().map(|r| r.bytes.len()).sum() } else { 0 };
    let f = framing(resource, runs_len, any);
    let mut buf = Vec::with_capacity(f.head.len() + runs_len + f.tail.len());
    buf.extend_from_slice(&f.head);
    if any {
        runs.iter().for_each(|r| buf.extend_from_slice(&r.bytes));
    }
    buf.extend_from_slice(&f.tail);
    buf
}

/// [`request`] for spans not encoded yet.
#[cfg(test)]
pub fn export_request<S: Borrow<Span>>(resource: &Resource, spans: &[S]) -> Vec<u8> {
    request(resource, &[&Encoded::of(spans)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::spans::{scope, Event, Family};
    use opentelemetry::trace::{SpanContext, TraceFlags, TraceId, TraceState};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use prost::Message;

    fn span_data(i: u64) -> Span {
        let t0 = 1_795_000_000_123_456_789 + i * 1000;
        let ctx = SpanContext::new(
            TraceId::from(0x0123_4567_89ab_cdef_0011_2233_4455_6677 + u128::from(i)),
            SpanId::from(0x1000 + i),
            if i % 2 == 0 { TraceFlags::SAMPLED } else { TraceFlags::default() },
            false,
            if i == 3 { TraceState::from_key_value([("vendor", "x1"), ("b", "2")]).unwrap() } else { TraceState::default() },
        );
        let mut events = vec![];
        if i == 2 {
            events.push(Event { name: "stack", time_ns: t0, attributes: vec![KeyValue::new("samples", 7i64)] });
            events.push(Event { name: "threadpool.end", time_ns: t0 + 5, attributes: vec![] });
        }
        // Lengths around the bytes reserved for them: a span under 128
        // bytes, attributes of 127, 128 and 20,000 bytes.
        let attributes = match i {
            7 => vec![],
            11 => vec![KeyValue::new("file.path", "p".repeat(20_000))],
            13 => vec![KeyValue::new("a", "x".repeat(122)), KeyValue::new("b", "y".repeat(123)), KeyValue::new("c", "z".repeat(200))],
            _ => vec![
                KeyValue::new("file.path", "/etc/hostname"),
                KeyValue::new("empty", ""),
                KeyValue::new("", 5i64),
                KeyValue::new(format!("owned.{i}"), format!("v{i}")),
                KeyValue::new("uvspan.fs.fd", -1i64),
                KeyValue::new("big", i64::MAX),
                KeyValue::new("uvspan.sync", i % 2 == 0),
                KeyValue::new("ms", 0.25f64),
                KeyValue::new("zero", 0.0f64),
                KeyValue::new("dns.answers", Value::Strings(vec!["127.0.0.1".into(), "::1".into()])),
                KeyValue::new("no.answers", Value::Strings(vec![])),
                KeyValue::new("unicode", "päth/ø"),
            ],
        };
        Span {
            span_context: ctx,
            parent_span_id: if i == 0 { SpanId::INVALID } else { SpanId::from(0x99) },
            parent_span_is_remote: i == 1,
            span_kind: [SpanKind::Internal, SpanKind::Server, SpanKind::Client, SpanKind::Producer, SpanKind::Consumer][i as usize % 5]
                .clone(),
            name: if i == 7 { "s".into() } else { format!("fs.op{i}").into() },
            start_ns: t0,
            end_ns: t0 + 37_000 + i,
            attributes,
            events,
            status: match i % 3 {
                0 => Status::Unset,
                1 => Status::error("ENOENT: no such file or directory"),
                _ => Status::Ok,
            },
            family: Family::Other,
        }
    }

    /// The bytes are what opentelemetry-proto's own conversion of the same
    /// spans (as the SDK's `SpanData`) gives, encoded by prost.
    #[test]
    fn same_message_as_the_official_conversion() {
        let resource = Resource::builder_empty()
            .with_schema_url(
                [KeyValue::new("service.name", "shop"), KeyValue::new("process.pid", 4242i64)].map(|kv| kv.to_sdk()),
                "https://s/1",
            )
            .with_attributes([
                opentelemetry::KeyValue::new("ints", opentelemetry::Value::Array(Array::I64(vec![0, 1, -2]))),
                opentelemetry::KeyValue::new("bools", opentelemetry::Value::Array(Array::Bool(vec![true, false]))),
                opentelemetry::KeyValue::new("floats", opentelemetry::Value::Array(Array::F64(vec![1.5]))),
                opentelemetry::KeyValue::new("strs", opentelemetry::Value::Array(Array::String(vec!["a".into()]))),
                opentelemetry::KeyValue::new("f", 2.5),
                opentelemetry::KeyValue::new("b", true),
            ])
            .build();
        // Nested lengths of one, two and three varint bytes (300 spans:
        // over 16 KiB), and ones that take fewer bytes than reserved.
        for n in [1, 7, 14, 300] {
            let spans: Vec<Span> = (0..n).map(span_data).collect();
            let bytes = export_request(&resource, &spans);
            let ours = ExportTraceServiceRequest::decode(bytes.as_slice()).expect("decodes");
            let sdk = spans.iter().map(|s| s.to_sdk(&scope())).collect();
            let official = ExportTraceServiceRequest {
                resource_spans: group_spans_by_resource_and_scope(sdk, &ResourceAttributesWithSchema::from(&resource)),
            };
            assert_eq!(ours, official);
            // Byte for byte what prost writes for the same message (field order, lengths, no padding).
            assert_eq!(bytes, official.encode_to_vec(), "{n} spans");
        }
    }

    /// Runs encoded apart (on the tracer thread, appended to) make the
    /// request one encoding of all their spans makes.
    #[test]
    fn runs_encoded_apart_make_the_same_request() {
        let r = Resource::builder_empty().with_attributes([opentelemetry::KeyValue::new("service.name", "shop")]).build();
        let spans: Vec<Span> = (0..14).map(span_data).collect();
        let mut first = Encoded::of(&spans[..5]);
        first.push(&spans[5..9]);
        let second = Encoded::of(&spans[9..]);
        assert_eq!((first.n, second.n), (9, 5));
        assert_eq!(request(&r, &[&first, &second]), export_request(&r, &spans));
        // Sent in pieces (the runs not copied into one buffer): the same bytes.
        let f = framing(&r, first.bytes.len() + second.bytes.len(), true);
        assert_eq!([&f.head[..], &first.bytes, &second.bytes, &f.tail].concat(), export_request(&r, &spans));
        assert_eq!(request(&r, &[&Encoded::default()]), export_request::<Span>(&r, &[]));
        // Into a buffer used before: what was in it is gone.
        let used = Encoded::in_buffer(b"old bytes".to_vec(), &spans[..9]);
        assert_eq!(used.bytes, first.bytes);
    }

    #[test]
    fn empty_batch_and_empty_resource() {
        let r = Resource::builder_empty().build();
        let bytes = export_request::<Span>(&r, &[]);
        let got = ExportTraceServiceRequest::decode(bytes.as_slice()).expect("decodes");
        // The SDK sends a ResourceSpans even for no spans; so do we.
        assert_eq!(got.resource_spans.len(), 1);
        assert!(got.resource_spans[0].scope_spans.is_empty());
    }

    #[test]
    fn varints() {
        for n in [0u64, 1, 127, 128, 300, 16_383, 16_384, u64::MAX] {
            let mut w = Enc { buf: Vec::new() };
            w.varint(n);
            let v = w.buf;
            assert_eq!(prost::encoding::decode_varint(&mut v.as_slice()).unwrap(), n);
            assert_eq!(v.len(), prost::encoding::encoded_len_varint(n));
            assert_eq!(varint_len(n), v.len());
        }
    }
}
