//! Finished operations (decoded records) to OpenTelemetry spans, one module
//! per family: [`fs`], [`dns`], [`iteration`]. Pure: ids come from an
//! injectable generator and times from an explicit clock, so the same
//! records always give the same spans in tests.

mod dns;
mod fs;
mod iteration;
mod model;

pub use model::{Event, Family, Key, KeyValue, Span, Value};

use std::borrow::Cow;

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::trace::IdGenerator;

use crate::events::clock::Clock;
use crate::events::decode::{OpRecord, Record};
use crate::events::errno;

/// The attribute keys of [`crate::semconv`] under the short names the span modules and the
/// report use.
pub mod keys {
    pub use crate::semconv::{
        CODE_STACKTRACE as STACKTRACE, DNS_ANSWERS, DNS_QUESTION_NAME as DNS_NAME, ERROR_TYPE, FILE_PATH, THREAD_ID,
        UVSPAN_ENDED_AT as ENDED_AT, UVSPAN_FILE_NEW_PATH as NEW_PATH, UVSPAN_FS_BYTES as BYTES, UVSPAN_FS_ENTRIES as ENTRIES,
        UVSPAN_FS_FD as FD, UVSPAN_GC_DURATION_MS as GC_DURATION, UVSPAN_LOOP_BLOCKED_BY as BLOCKED_BY, UVSPAN_LOOP_BUSY_MS as BUSY,
        UVSPAN_LOOP_CALLBACK_WAIT_MS as CALLBACK_WAIT, UVSPAN_LOOP_FAST_ITERATIONS_BEFORE as FAST_BEFORE, UVSPAN_LOOP_GC_COUNT as GC_COUNT,
        UVSPAN_LOOP_GC_MS as GC, UVSPAN_LOOP_OFF_CPU_MS as OFF_CPU, UVSPAN_LOOP_ON_CPU_MS as ON_CPU, UVSPAN_LOOP_PHASE as PHASE,
        UVSPAN_LOOP_POLL_WAIT_MS as POLL_WAIT, UVSPAN_LOOP_RUNQUEUE_MS as RUNQUEUE, UVSPAN_LOOP_STACKS_NOTICE as STACKS_NOTICE,
        UVSPAN_LOOP_STACK_SAMPLES as STACK_SAMPLES, UVSPAN_LOOP_THROTTLED_MS as THROTTLED, UVSPAN_STACK_MS as SAMPLED_MS,
        UVSPAN_STACK_SAMPLES as SAMPLES, UVSPAN_STACK_SHARE as SHARE, UVSPAN_SYNC as SYNC, UVSPAN_THREADPOOL_QUEUE_WAIT_MS as QUEUE_WAIT,
        UVSPAN_THREADPOOL_RUN_MS as RUN, UVSPAN_THREADPOOL_THREAD_ID as WORKER, V8JS_GC_TYPE as GC_TYPE,
    };
}

/// Name of the span event of one V8 garbage collection in a slow iteration.
pub const GC_EVENT: &str = "v8js.gc";

/// Name of the span event carrying one sampled stack of a slow iteration.
pub const STACK_EVENT: &str = "uvspan.loop.stack";

pub const ITERATION: &str = "uv.loop.iteration";
pub const DNS: &str = "dns.getaddrinfo";

/// What span building needs besides the record.
pub struct SpanContextSource<'a> {
    pub clock: Clock,
    pub ids: &'a dyn IdGenerator,
    /// Which traces are kept (decided where a trace starts).
    pub sampler: crate::events::sampler::Sampler,
}

impl SpanContextSource<'_> {
    /// A new trace's id for a trace that starts with `cause` (a request or
    /// a task): under a ratio sampler its low bits are the cause's random
    /// number, so it is decided as the kernel decided it
    /// ([`crate::events::sampler::trace_for_cause`]).
    pub fn trace_for(&self, cause: u64) -> TraceId {
        let t = self.ids.new_trace_id();
        if self.sampler.by_trace_id() {
            crate::events::sampler::trace_for_cause(t, cause)
        } else {
            t
        }
    }
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

/// The instrumentation scope of every uvspan span (the exporters write it
/// once per batch, not per span).
pub const SCOPE_NAME: &str = "uvspan";
pub const SCOPE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The same scope as the SDK's type.
pub fn scope() -> InstrumentationScope {
    InstrumentationScope::builder(SCOPE_NAME).with_version(SCOPE_VERSION).build()
}

pub(crate) fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Where a record's spans go: a trace and the span they hang under.
#[derive(Clone, Debug, PartialEq)]
pub struct Parent {
    pub trace_id: TraceId,
    /// The span the record's top span is a child of (INVALID: a root).
    pub span_id: SpanId,
    /// The parent span is in another process (an incoming traceparent).
    pub remote: bool,
    pub state: TraceState,
}

/// A span with its own id under `parent` (times in kernel ns): what the
/// request and task stages build their own spans with.
pub fn span_under(
    src: &SpanContextSource<'_>,
    parent: &Parent,
    span_id: SpanId,
    name: Cow<'static, str>,
    (kind, family): (SpanKind, Family),
    (start, end): (u64, u64),
    attributes: Vec<KeyValue>,
) -> Span {
    Span {
        span_context: SpanContext::new(parent.trace_id, span_id, TraceFlags::SAMPLED, false, parent.state.clone()),
        parent_span_id: parent.span_id,
        parent_span_is_remote: parent.remote,
        span_kind: kind,
        name,
        start_ns: src.clock.to_wall_ns(start),
        end_ns: src.clock.to_wall_ns(end.max(start)),
        attributes,
        events: Vec::new(),
        status: Status::Unset,
        family,
    }
}

pub(crate) struct Builder<'a> {
    src: &'a SpanContextSource<'a>,
    trace_id: TraceId,
    /// The parent of a record's top span.
    pub(crate) parent: SpanId,
    parent_remote: bool,
    state: TraceState,
}

impl Builder<'_> {
    pub(crate) fn span(
        &self,
        family: Family,
        name: impl Into<Cow<'static, str>>,
        parent: SpanId,
        start: u64,
        end: u64,
        attributes: Vec<KeyValue>,
    ) -> Span {
        let span_id = self.src.ids.new_span_id();
        Span {
            span_context: SpanContext::new(self.trace_id, span_id, TraceFlags::SAMPLED, false, self.state.clone()),
            parent_span_id: parent,
            parent_span_is_remote: self.parent_remote && parent == self.parent && parent != SpanId::INVALID,
            span_kind: SpanKind::Internal,
            name: name.into(),
            start_ns: self.wall(start),
            end_ns: self.wall(end.max(start)),
            attributes,
            events: Vec::new(),
            status: Status::Unset,
            family,
        }
    }

    /// Kernel monotonic nanoseconds to wall-clock nanoseconds.
    pub(crate) fn wall(&self, ns: u64) -> u64 {
        self.src.clock.to_wall_ns(ns)
    }
}

/// The spans for one record, each record its own trace (none for process
/// lifecycle and HTTP records).
pub fn build(rec: Record, src: &SpanContextSource<'_>) -> Vec<Span> {
    build_in(rec, src, None)
}

/// The spans for one record, under `parent` when given.
pub fn build_in(rec: Record, src: &SpanContextSource<'_>, parent: Option<&Parent>) -> Vec<Span> {
    let mut out = Vec::with_capacity(1);
    let _kept = build_into(rec, src, parent, &mut out);
    out
}

/// The spans for one record, under `parent` when given, appended to `out`.
/// The record is consumed: its strings move into the spans. Without a
/// parent the record starts a trace of its own, which the sampler may drop:
/// false then (nothing was built).
pub fn build_into(rec: Record, src: &SpanContextSource<'_>, parent: Option<&Parent>, out: &mut Vec<Span>) -> bool {
    let b = match parent {
        Some(p) => Builder { src, trace_id: p.trace_id, parent: p.span_id, parent_remote: p.remote, state: p.state.clone() },
        None => {
            let trace_id = src.ids.new_trace_id();
            if !src.sampler.keeps(None, trace_id) {
                return false;
            }
            Builder { src, trace_id, parent: SpanId::INVALID, parent_remote: false, state: TraceState::NONE }
        }
    };
    match rec {
        Record::Fs(r) => out.push(fs::span(&b, r)),
        Record::Dns(r) => out.push(dns::span(&b, r)),
        Record::Loop(r) => iteration::spans(&b, &r, out),
        Record::Db(r) => {
            let parent = Parent { trace_id: b.trace_id, span_id: b.parent, remote: b.parent_remote, state: b.state.clone() };
            out.push(crate::db::spans::db_span(&r.call(), src.ids.new_span_id(), &parent, src));
        }
        Record::Http(_)
        | Record::Wire(_)
        | Record::Held(_)
        | Record::Stack(_)
        | Record::Gc(_)
        | Record::Fork { .. }
        | Record::Exec { .. }
        | Record::Exit { .. } => {}
    }
    true
}

/// Queue wait / run / callback wait of an fs or DNS request's threadpool
/// job, as attributes and events.
pub(crate) fn threadpool(b: &Builder<'_>, span: &mut Span, op: &OpRecord) {
    let (start, end) = (op.start_ns, op.end_ns);
    if let Some(ws) = op.work_start_ns {
        span.attributes.push(KeyValue::new(keys::QUEUE_WAIT, ms(ws.saturating_sub(start))));
        span.events.push(Event { name: "threadpool.start", time_ns: b.wall(ws), attributes: Vec::new() });
        if let Some(we) = op.work_end_ns.filter(|&we| we >= ws) {
            span.attributes.push(KeyValue::new(keys::RUN, ms(we - ws)));
            span.attributes.push(KeyValue::new(keys::CALLBACK_WAIT, ms(end.saturating_sub(we))));
            span.events.push(Event { name: "threadpool.end", time_ns: b.wall(we), attributes: Vec::new() });
        }
    }
    if let Some(w) = op.worker_tid {
        span.attributes.push(KeyValue::new(keys::WORKER, i64::from(w)));
    }
}

pub(crate) fn fail(span: &mut Span, code: i64) {
    let (name, msg) = errno::describe(code).unwrap_or(("", "unknown error"));
    let name = if name.is_empty() { errno::error_type(code) } else { name.to_string() };
    span.status = Status::error(format!("{name}: {msg}"));
    span.attributes.push(KeyValue::new(keys::ERROR_TYPE, name));
}

/// What the family tests share: a fixed clock (offset 0: span times are the
/// record's kernel times) and sequential ids.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    pub fn build_one(rec: &Record) -> Vec<Span> {
        let ids = SequentialIds::default();
        let src = SpanContextSource { clock: Clock::with_offset(0), ids: &ids, sampler: Default::default() };
        build(rec.clone(), &src)
    }

    pub fn attr<'a>(s: &'a Span, k: &str) -> Option<&'a Value> {
        s.attr(k)
    }
}
