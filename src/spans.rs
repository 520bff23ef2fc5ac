//! Finished operations (decoded records) to OpenTelemetry spans. Pure: ids
//! come from an injectable generator and times from an explicit clock, so the
//! same records always give the same spans in tests.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{IdGenerator, SpanData, SpanEvents, SpanLinks};

use crate::clock::Clock;
use crate::decode::{DnsRecord, FsRecord, LoopRecord, Record};
use crate::errno;
use crate::probes::catalog;

/// Attribute keys not covered by OpenTelemetry semantic conventions.
pub mod keys {
    pub const THREAD_ID: &str = "thread.id";
    pub const FILE_PATH: &str = "file.path";
    pub const ERROR_TYPE: &str = "error.type";
    pub const DNS_NAME: &str = "dns.question.name";
    pub const DNS_ANSWERS: &str = "dns.answers";
    pub const NEW_PATH: &str = "uvspan.file.new_path";
    pub const FD: &str = "uvspan.fs.fd";
    pub const BYTES: &str = "uvspan.fs.bytes";
    pub const ENTRIES: &str = "uvspan.fs.entries";
    pub const SYNC: &str = "uvspan.sync";
    pub const ENDED_AT: &str = "uvspan.ended_at";
    pub const QUEUE_WAIT: &str = "uvspan.threadpool.queue_wait_ms";
    pub const RUN: &str = "uvspan.threadpool.run_ms";
    pub const CALLBACK_WAIT: &str = "uvspan.loop.callback_wait_ms";
    pub const WORKER: &str = "uvspan.threadpool.thread.id";
    pub const BUSY: &str = "uvspan.loop.busy_ms";
    pub const POLL_WAIT: &str = "uvspan.loop.poll_wait_ms";
    pub const FAST_BEFORE: &str = "uvspan.loop.fast_iterations_before";
    pub const PHASE: &str = "uvspan.loop.phase";
}

pub const ITERATION: &str = "uv.loop.iteration";
pub const DNS: &str = "dns.getaddrinfo";

/// What span building needs besides the record.
pub struct SpanContextSource<'a> {
    pub clock: Clock,
    pub ids: &'a dyn IdGenerator,
    pub scope: InstrumentationScope,
}

/// Ids 1, 2, 3, … : deterministic spans for golden tests and replays.
#[derive(Debug, Default)]
pub struct SequentialIds(std::sync::atomic::AtomicU64);

impl IdGenerator for SequentialIds {
    fn new_trace_id(&self) -> TraceId {
        TraceId::from(u128::from(self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1))
    }
    fn new_span_id(&self) -> SpanId {
        SpanId::from(self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1)
    }
}

/// The instrumentation scope of every uvspan span.
pub fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("uvspan").with_version(env!("CARGO_PKG_VERSION")).build()
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

struct Builder<'a> {
    src: &'a SpanContextSource<'a>,
    trace_id: TraceId,
}

impl Builder<'_> {
    fn span(
        &self,
        name: impl Into<Cow<'static, str>>,
        parent: SpanId,
        start: u64,
        end: u64,
        attributes: Vec<KeyValue>,
    ) -> SpanData {
        let span_id = self.src.ids.new_span_id();
        SpanData {
            span_context: SpanContext::new(self.trace_id, span_id, TraceFlags::SAMPLED, false, TraceState::NONE),
            parent_span_id: parent,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: name.into(),
            start_time: self.wall(start),
            end_time: self.wall(end.max(start)),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: self.src.scope.clone(),
        }
    }

    fn wall(&self, ns: u64) -> SystemTime {
        self.src.clock.to_wall(ns)
    }
}

/// The spans for one record (none for process lifecycle records).
pub fn build(rec: &Record, src: &SpanContextSource<'_>) -> Vec<SpanData> {
    let b = Builder { src, trace_id: src.ids.new_trace_id() };
    match rec {
        Record::Fs(r) => vec![fs_span(&b, r)],
        Record::Dns(r) => vec![dns_span(&b, r)],
        Record::Loop(r) => loop_spans(&b, r),
        Record::Fork { .. } | Record::Exec { .. } | Record::Exit { .. } => vec![],
    }
}

/// Queue wait / run / callback wait of a threadpool job, as attributes and events.
fn threadpool(
    b: &Builder<'_>,
    span: &mut SpanData,
    (start, end): (u64, u64),
    work_start: Option<u64>,
    work_end: Option<u64>,
    worker: Option<u32>,
) {
    if let Some(ws) = work_start {
        span.attributes.push(KeyValue::new(keys::QUEUE_WAIT, ms(ws.saturating_sub(start))));
        span.events.events.push(opentelemetry::trace::Event::new("threadpool.start", b.wall(ws), vec![], 0));
        if let Some(we) = work_end.filter(|&we| we >= ws) {
            span.attributes.push(KeyValue::new(keys::RUN, ms(we - ws)));
            span.attributes.push(KeyValue::new(keys::CALLBACK_WAIT, ms(end.saturating_sub(we))));
            span.events.events.push(opentelemetry::trace::Event::new("threadpool.end", b.wall(we), vec![], 0));
        }
    }
    if let Some(w) = worker {
        span.attributes.push(KeyValue::new(keys::WORKER, i64::from(w)));
    }
}

fn fail(span: &mut SpanData, code: i64) {
    let (name, msg) = errno::describe(code).unwrap_or(("", "unknown error"));
    let name = if name.is_empty() { errno::error_type(code) } else { name.to_string() };
    span.status = Status::error(format!("{name}: {msg}"));
    span.attributes.push(KeyValue::new(keys::ERROR_TYPE, name));
}

fn fs_span(b: &Builder<'_>, r: &FsRecord) -> SpanData {
    let op = catalog::fs_op(r.op);
    let name = op.map_or("fs.unknown", |o| o.span);
    let mut attrs = Vec::with_capacity(10);
    if let Some(p) = &r.path {
        attrs.push(KeyValue::new(keys::FILE_PATH, p.clone()));
    }
    if let Some(p) = &r.path2 {
        attrs.push(KeyValue::new(keys::NEW_PATH, p.clone()));
    }
    if let Some(fd) = r.fd {
        attrs.push(KeyValue::new(keys::FD, i64::from(fd)));
    }
    attrs.push(KeyValue::new(keys::THREAD_ID, i64::from(r.tid)));
    attrs.push(KeyValue::new(keys::SYNC, r.sync));
    if r.result >= 0 {
        match name {
            "fs.read" | "fs.write" | "fs.sendfile" => attrs.push(KeyValue::new(keys::BYTES, r.result)),
            "fs.open" | "fs.mkstemp" => attrs.push(KeyValue::new(keys::FD, r.result)),
            "fs.scandir" | "fs.readdir" => attrs.push(KeyValue::new(keys::ENTRIES, r.result)),
            _ => {}
        }
    }
    // Said only when the end is not the usual one: sync calls end at
    // uv_fs_req_cleanup, async ones at libuv's completion.
    let usual = if r.sync { "uv_fs_req_cleanup" } else { "libuv_done" };
    if let Some(at) = r.ended_at.filter(|&at| at != usual) {
        attrs.push(KeyValue::new(keys::ENDED_AT, at));
    }
    let mut span = b.span(name, SpanId::INVALID, r.start_ns, r.end_ns, attrs);
    threadpool(b, &mut span, (r.start_ns, r.end_ns), r.work_start_ns, r.work_end_ns, r.worker_tid);
    if r.result < 0 {
        fail(&mut span, r.result);
    }
    span
}

fn dns_span(b: &Builder<'_>, r: &DnsRecord) -> SpanData {
    let mut answers: Vec<StringValue> = Vec::new();
    for a in &r.answers {
        let s = StringValue::from(a.to_string());
        if !answers.contains(&s) {
            answers.push(s);
        }
    }
    let mut attrs = vec![
        KeyValue::new(keys::DNS_NAME, r.host.clone()),
        KeyValue::new(keys::THREAD_ID, i64::from(r.tid)),
        KeyValue::new(keys::SYNC, r.sync),
    ];
    if !answers.is_empty() {
        attrs.push(KeyValue::new(keys::DNS_ANSWERS, Value::Array(Array::String(answers))));
    }
    if let Some(at) = r.ended_at.filter(|&at| at != "libuv_done") {
        attrs.push(KeyValue::new(keys::ENDED_AT, at));
    }
    let mut span = b.span(DNS, SpanId::INVALID, r.start_ns, r.end_ns, attrs);
    span.span_kind = SpanKind::Client;
    threadpool(b, &mut span, (r.start_ns, r.end_ns), r.work_start_ns, r.work_end_ns, r.worker_tid);
    if r.retcode != 0 {
        fail(&mut span, i64::from(r.retcode));
    }
    span
}

/// One `uv.loop.iteration` span and a child per phase. The iteration is
/// shown from the moment the loop woke up in poll (time blocked before that
/// is an attribute), so its duration is how long the loop was busy.
fn loop_spans(b: &Builder<'_>, r: &LoopRecord) -> Vec<SpanData> {
    let start = r.wake_ns.unwrap_or(r.start_ns).min(r.end_ns);
    let total = r.end_ns.saturating_sub(r.start_ns);
    let busy = total.saturating_sub(r.poll_wait_ns);
    let attrs = vec![
        KeyValue::new(keys::THREAD_ID, i64::from(r.tid)),
        KeyValue::new(keys::BUSY, ms(busy)),
        KeyValue::new(keys::POLL_WAIT, ms(r.poll_wait_ns)),
        KeyValue::new(keys::FAST_BEFORE, r.skipped as i64),
    ];
    let root = b.span(ITERATION, SpanId::INVALID, start, r.end_ns, attrs);
    let parent = root.span_context.span_id();
    let mut out = vec![root];
    for &(i, ps, pe) in &r.phases {
        let phase = catalog::phase_name(i);
        let ps = ps.max(start);
        out.push(b.span(
            format!("uv.loop.{phase}"),
            parent,
            ps,
            pe,
            vec![KeyValue::new(keys::PHASE, phase)],
        ));
    }
    out
}
