//! Exact parents: uvspan's spans of a request re-parented under the app's
//! own SERVER span of that request, read from the app's OTLP traces as they
//! pass through the listener. Pure: no clock of its own (`now` is passed in).
//!
//! A request is matched to the app's SERVER span by the incoming
//! traceparent (the app's SERVER span has the caller's span as its parent
//! and the caller's trace id) or, without one, by process (resource
//! `process.pid`), the client's port and time overlap. uvspan's spans of a
//! request wait here until the match arrives or the join window passes;
//! then they go out as they were built (counted unjoined).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::events::spans::Span as UvSpan;
use crate::requests::RequestKey;
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, TraceId};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as PbValue;
use opentelemetry_proto::tonic::common::v1::KeyValue as PbKeyValue;

/// App SERVER spans remembered (oldest forgotten first).
const SERVERS_MAX: usize = 16_384;
/// uvspan spans held at once; over it, spans go out as they are.
const HELD_SPANS_MAX: usize = 65_536;
/// Clock slack between uvspan's and the app's timestamps when matching by time.
const SLACK_NS: u64 = 20_000_000;

/// App operation spans remembered for the twin rule (oldest forgotten first).
const OPS_MAX: usize = 65_536;

/// OTLP span kinds.
/// The SDK's batch delay when its process sets none
/// (OTEL_BSP_SCHEDULE_DELAY's default in the SDK specification).
const BSP_DELAY_DEFAULT: Duration = Duration::from_millis(5000);
/// What a join window adds to the batch delay: the export itself, a
/// collector tee's own batching, a busy host.
const WINDOW_SLACK: Duration = Duration::from_secs(2);
/// The longest window a batch delay makes (a larger one: `--join-window`).
const WINDOW_MAX: Duration = Duration::from_secs(60);

/// The join window for a process with environment `env`: its SDK exports
/// every OTEL_BSP_SCHEDULE_DELAY milliseconds (5000 when unset or not a
/// number, as the SDK itself does), and its SERVER span arrives up to that
/// late, plus [`WINDOW_SLACK`]; at most [`WINDOW_MAX`].
pub fn window_for(env: &[(String, String)]) -> Duration {
    let delay = env
        .iter()
        .rev()
        .find(|(k, _)| k == "OTEL_BSP_SCHEDULE_DELAY")
        .and_then(|(_, v)| v.trim().parse::<u64>().ok())
        .map_or(BSP_DELAY_DEFAULT, Duration::from_millis);
    (delay + WINDOW_SLACK).min(WINDOW_MAX)
}

const KIND_SERVER: i32 = 2;
const KIND_CLIENT: i32 = 3;

/// What the app's SERVER span says about its request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppServer {
    /// The resource's `process.pid`.
    pub pid: Option<u32>,
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// INVALID: a root (no traceparent reached the app).
    pub parent: SpanId,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The client's port (`client.port`, `net.peer.port`, `network.peer.port`).
    pub peer_port: Option<u16>,
}

/// What an app span of an operation is, as uvspan would name its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// `dns.lookup` (the SDK's DNS instrumentation).
    Dns,
    /// An outgoing HTTP call (CLIENT with a request method), by method.
    HttpClient(String),
    /// An fs call (`fs stat`, `fs statSync`, `fs promises.stat`), by
    /// operation (`stat`).
    Fs(String),
}

/// One of the app's spans of an operation uvspan may also have seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppOp {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub kind: OpKind,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// What the joiner reads of an OTLP trace export: its SERVER spans and
/// the spans of operations uvspan may also have seen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppSpans {
    pub servers: Vec<AppServer>,
    pub ops: Vec<AppOp>,
}

/// The kind of operation an app span stands for (None: not one uvspan sees).
fn op_kind(s: &opentelemetry_proto::tonic::trace::v1::Span) -> Option<OpKind> {
    if s.name == "dns.lookup" {
        return Some(OpKind::Dns);
    }
    if s.kind == KIND_CLIENT {
        let method = s.attributes.iter().filter(|kv| kv.key == "http.request.method" || kv.key == "http.method").find_map(|kv| {
            match kv.value.as_ref()?.value.as_ref()? {
                PbValue::StringValue(m) => Some(m.to_ascii_uppercase()),
                _ => None,
            }
        });
        return method.map(OpKind::HttpClient);
    }
    let op = s.name.strip_prefix("fs ")?;
    let op = op.strip_prefix("promises.").unwrap_or(op);
    let op = op.strip_suffix("Sync").unwrap_or(op);
    (!op.is_empty() && op.len() <= 32).then(|| OpKind::Fs(op.to_string()))
}

/// The kind of operation one of uvspan's spans is (None: it has no twin).
fn uv_kind(s: &UvSpan) -> Option<OpKind> {
    match s.family {
        crate::events::spans::Family::Dns => Some(OpKind::Dns),
        crate::events::spans::Family::Fs(op) => Some(OpKind::Fs(op.to_string())),
        crate::events::spans::Family::Http if s.span_kind == SpanKind::Client => match s.attr("http.request.method") {
            Some(crate::events::spans::Value::String(m)) => Some(OpKind::HttpClient(m.to_ascii_uppercase())),
            _ => None,
        },
        _ => None,
    }
}

/// The SERVER and operation spans in an OTLP trace export (uvspan's own,
/// back through a collector tee, are never the app's).
pub fn app_spans(req: &ExportTraceServiceRequest) -> AppSpans {
    let mut out = AppSpans::default();
    for rs in &req.resource_spans {
        let pid = rs.resource.as_ref().and_then(|r| int_attr(&r.attributes, &["process.pid"])).and_then(|p| u32::try_from(p).ok());
        // uvspan's own spans, back from a collector that sends everything it
        // gets to uvspan's listener (a tee): never the app's.
        for ss in rs.scope_spans.iter().filter(|ss| ss.scope.as_ref().is_none_or(|s| s.name != crate::events::spans::SCOPE_NAME)) {
            for s in &ss.spans {
                let (Ok(t), Ok(id)) = (<[u8; 16]>::try_from(s.trace_id.as_slice()), <[u8; 8]>::try_from(s.span_id.as_slice())) else {
                    continue;
                };
                if s.kind != KIND_SERVER {
                    if let Some(kind) = op_kind(s) {
                        out.ops.push(AppOp {
                            trace_id: TraceId::from_bytes(t),
                            span_id: SpanId::from_bytes(id),
                            kind,
                            start_ns: s.start_time_unix_nano,
                            end_ns: s.end_time_unix_nano.max(s.start_time_unix_nano),
                        });
                    }
                    continue;
                }
                let parent = <[u8; 8]>::try_from(s.parent_span_id.as_slice()).map_or(SpanId::INVALID, SpanId::from_bytes);
                out.servers.push(AppServer {
                    pid,
                    trace_id: TraceId::from_bytes(t),
                    span_id: SpanId::from_bytes(id),
                    parent,
                    start_ns: s.start_time_unix_nano,
                    end_ns: s.end_time_unix_nano.max(s.start_time_unix_nano),
                    peer_port: int_attr(&s.attributes, &["client.port", "net.peer.port", "network.peer.port"])
                        .and_then(|p| u16::try_from(p).ok()),
                });
            }
        }
    }
    out
}

fn int_attr(kvs: &[PbKeyValue], keys: &[&str]) -> Option<i64> {
    kvs.iter().filter(|kv| keys.contains(&kv.key.as_str())).find_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
        PbValue::IntValue(i) => Some(*i),
        PbValue::StringValue(s) => s.parse().ok(),
        _ => None,
    })
}

/// Counters of the joiner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JoinStats {
    /// uvspan spans put under the app's SERVER span.
    pub joined: u64,
    /// uvspan spans sent as they were: no SERVER span of the app matched
    /// within the window, or too many were held.
    pub unjoined: u64,
    /// uvspan's own SERVER spans not sent: the app's stood for the request.
    pub own_servers_dropped: u64,
    /// uvspan's spans of an operation not sent: the app's span of it stood
    /// for it (not counted in `joined`).
    pub twins_dropped: u64,
}

struct Held {
    key: RequestKey,
    spans: Vec<UvSpan>,
    until: Instant,
}

pub struct Joiner {
    window: Duration,
    /// Incoming parent (trace, span) → the app's SERVER span (trace, span).
    by_parent: HashMap<(TraceId, SpanId), (TraceId, SpanId)>,
    /// Every SERVER span, per process (0: no process.pid), for requests
    /// uvspan saw without a traceparent (or whose traceparent it missed).
    by_pid: HashMap<u32, VecDeque<AppServer>>,
    /// Arrival order of every remembered SERVER span (for SERVERS_MAX).
    order: VecDeque<AppServer>,
    held: VecDeque<Held>,
    held_spans: usize,
    /// SERVER spans arrived since the held ones were last matched.
    news: bool,
    /// The app's operation spans not yet standing for one of uvspan's, by
    /// trace, and their traces in arrival order (for OPS_MAX).
    ops: HashMap<TraceId, Vec<AppOp>>,
    ops_order: VecDeque<TraceId>,
    pub stats: JoinStats,
}

/// Spans ready to send, per process.
pub type Out = Vec<(u32, Vec<UvSpan>)>;

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

impl Joiner {
    pub fn new(window: Duration) -> Joiner {
        Joiner {
            window,
            by_parent: HashMap::new(),
            by_pid: HashMap::new(),
            order: VecDeque::new(),
            held: VecDeque::new(),
            held_spans: 0,
            news: false,
            ops: HashMap::new(),
            ops_order: VecDeque::new(),
            stats: JoinStats::default(),
        }
    }

    /// Spans held now.
    pub fn held(&self) -> usize {
        self.held_spans
    }

    /// The app's spans, as they pass through the listener.
    pub fn offer_spans(&mut self, spans: AppSpans) {
        for op in spans.ops {
            self.ops_order.push_back(op.trace_id);
            self.ops.entry(op.trace_id).or_default().push(op);
        }
        while self.ops_order.len() > OPS_MAX {
            let Some(t) = self.ops_order.pop_front() else { break };
            if let Some(v) = self.ops.get_mut(&t) {
                if !v.is_empty() {
                    v.remove(0);
                }
                if v.is_empty() {
                    self.ops.remove(&t);
                }
            }
        }
        self.offer(spans.servers);
    }

    /// SERVER spans of the app, as they pass through the listener.
    pub fn offer(&mut self, servers: Vec<AppServer>) {
        for s in servers {
            if s.parent != SpanId::INVALID {
                self.by_parent.insert((s.trace_id, s.parent), (s.trace_id, s.span_id));
            }
            self.by_pid.entry(s.pid.unwrap_or(0)).or_default().push_back(s.clone());
            self.order.push_back(s);
            self.news = true;
        }
        while self.order.len() > SERVERS_MAX {
            let Some(old) = self.order.pop_front() else { break };
            if old.parent != SpanId::INVALID && self.by_parent.get(&(old.trace_id, old.parent)) == Some(&(old.trace_id, old.span_id)) {
                self.by_parent.remove(&(old.trace_id, old.parent));
            }
            let pid = old.pid.unwrap_or(0);
            if let Some(q) = self.by_pid.get_mut(&pid) {
                // The oldest of its process is the oldest overall.
                if q.front() == Some(&old) {
                    q.pop_front();
                } else if let Some(i) = q.iter().position(|s| *s == old) {
                    q.remove(i);
                }
                if q.is_empty() {
                    self.by_pid.remove(&pid);
                }
            }
        }
    }

    /// The app's SERVER span for a request, if it has arrived.
    fn find(&self, key: &RequestKey) -> Option<(TraceId, SpanId)> {
        if let Some(tp) = key.incoming {
            return self.by_parent.get(&tp).copied();
        }
        let (start, end) = (unix_ns(key.start), unix_ns(key.end));
        let candidates = self.by_pid.get(&key.app_pid).into_iter().chain(self.by_pid.get(&0)).flatten();
        candidates
            .filter(|s| s.pid.is_none_or(|p| p == key.app_pid))
            .filter(|s| match (s.peer_port, key.peer_port) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            })
            // The app's span lies within what uvspan saw of the request
            // (uvspan sees the bytes before the app and work after it).
            .filter(|s| s.start_ns <= end + SLACK_NS && s.end_ns + SLACK_NS >= start)
            .min_by_key(|s| s.start_ns.abs_diff(start))
            .map(|s| (s.trace_id, s.span_id))
    }

    /// A request's spans: joined now if the app's SERVER span is known,
    /// else held for the join window (or, over the bound, sent as they are).
    pub fn hold(&mut self, key: RequestKey, spans: Vec<UvSpan>, now: Instant, out: &mut Out) {
        let window = self.window;
        self.hold_for(key, spans, window, now, out);
    }

    /// [`Joiner::hold`], for `window` (the request's process's).
    pub fn hold_for(&mut self, key: RequestKey, mut spans: Vec<UvSpan>, window: Duration, now: Instant, out: &mut Out) {
        if spans.is_empty() {
            return;
        }
        if let Some(server) = self.find(&key) {
            self.join_into(&mut spans, &key, server);
            out.push((key.pid, spans));
            return;
        }
        if self.held_spans + spans.len() > HELD_SPANS_MAX {
            self.stats.unjoined += spans.len() as u64;
            out.push((key.pid, spans));
            return;
        }
        self.held_spans += spans.len();
        self.held.push_back(Held { key, spans, until: now + window });
    }

    /// Held spans whose SERVER span arrived (joined) or whose window passed
    /// (as they are); everything with `all` (uvspan is stopping).
    pub fn poll(&mut self, now: Instant, all: bool, out: &mut Out) {
        let news = std::mem::take(&mut self.news);
        let mut keep = VecDeque::with_capacity(self.held.len());
        for mut h in std::mem::take(&mut self.held) {
            let found = if news || all { self.find(&h.key) } else { None };
            if let Some(server) = found {
                let before = h.spans.len();
                self.join_into(&mut h.spans, &h.key, server);
                self.held_spans -= before - h.spans.len();
            } else if all || now >= h.until {
                self.stats.unjoined += h.spans.len() as u64;
            } else {
                keep.push_back(h);
                continue;
            }
            self.held_spans -= h.spans.len();
            out.push((h.key.pid, h.spans));
        }
        self.held = keep;
    }
}

impl Joiner {
    /// A request's spans into the app's trace under its SERVER span, without
    /// uvspan's own SERVER span and the twins of the app's spans (counted).
    fn join_into(&mut self, spans: &mut Vec<UvSpan>, key: &RequestKey, server: (TraceId, SpanId)) {
        let joined = reparent(spans, key, server);
        self.stats.own_servers_dropped += drop_own_server(spans, key);
        let twins = self.drop_twins(spans, server.0);
        self.stats.joined += joined - twins;
        self.stats.twins_dropped += twins;
    }

    /// Removes the spans of `spans` (joined into `trace`) that the app's
    /// span of the same operation stands for; their children go under the
    /// app's span. Returns how many were removed.
    fn drop_twins(&mut self, spans: &mut Vec<UvSpan>, trace: TraceId) -> u64 {
        let Some(ops) = self.ops.get_mut(&trace) else { return 0 };
        let mut moved: Vec<(SpanId, SpanId)> = Vec::new();
        spans.retain(|s| {
            let Some(kind) = uv_kind(s) else { return true };
            // The app's span runs from the JS call to its callback, uvspan's
            // within it (from libuv's start to its end): overlap, nearest start.
            let best = ops
                .iter()
                .enumerate()
                .filter(|(_, o)| o.kind == kind && o.start_ns <= s.end_ns + SLACK_NS && s.start_ns <= o.end_ns + SLACK_NS)
                .min_by_key(|(_, o)| o.start_ns.abs_diff(s.start_ns))
                .map(|(i, _)| i);
            match best {
                Some(i) => {
                    let op = ops.remove(i);
                    moved.push((s.span_id(), op.span_id));
                    false
                }
                None => true,
            }
        });
        if ops.is_empty() {
            self.ops.remove(&trace);
        }
        for s in spans.iter_mut() {
            if let Some((_, app)) = moved.iter().find(|(uv, _)| *uv == s.parent_span_id) {
                s.parent_span_id = *app;
                s.parent_span_is_remote = false;
            }
        }
        moved.len() as u64
    }
}

/// Moves a request's spans into the app's trace, its top spans under the
/// app's SERVER span; returns how many spans were joined (uvspan's own
/// SERVER span made in case, [`RequestKey::own_server`], is not one of them).
fn reparent(spans: &mut [UvSpan], key: &RequestKey, (trace, server): (TraceId, SpanId)) -> u64 {
    let mut joined = 0;
    for s in spans.iter_mut() {
        let c = &s.span_context;
        if Some(c.span_id()) == key.own_server {
            continue;
        }
        s.span_context = SpanContext::new(trace, c.span_id(), c.trace_flags(), false, c.trace_state().clone());
        // uvspan's own SERVER span (--requests always) stays where it is in the tree.
        if s.parent_span_id == key.parent && s.span_kind != SpanKind::Server {
            s.parent_span_id = server;
            s.parent_span_is_remote = false;
        }
        joined += 1;
    }
    joined
}

/// Removes uvspan's SERVER span made in case the app's did not arrive (it
/// did); returns how many were removed (0 or 1).
fn drop_own_server(spans: &mut Vec<UvSpan>, key: &RequestKey) -> u64 {
    let Some(own) = key.own_server else { return 0 };
    let before = spans.len();
    spans.retain(|s| s.span_context.span_id() != own);
    (before - spans.len()) as u64
}

#[cfg(test)]
mod tests {
    /// The window follows the app's batch delay, as its SDK reads it.
    #[test]
    fn the_join_window_is_the_apps_batch_delay_and_a_second() {
        let env = |v: &str| vec![("PATH".to_string(), "/bin".to_string()), ("OTEL_BSP_SCHEDULE_DELAY".to_string(), v.to_string())];
        assert_eq!(window_for(&[]), Duration::from_secs(7), "the SDK's default 5 s");
        assert_eq!(window_for(&env("500")), Duration::from_millis(2500));
        assert_eq!(window_for(&env(" 1000 ")), Duration::from_secs(3));
        assert_eq!(window_for(&env("0")), Duration::from_secs(2), "exports at once");
        assert_eq!(window_for(&env("soon")), Duration::from_secs(7), "not a number: the SDK's default");
        assert_eq!(window_for(&env("-5")), Duration::from_secs(7));
        assert_eq!(window_for(&env("600000")), Duration::from_secs(60), "bounded");
    }

    /// A request held for its process's window goes out as it is after
    /// that window, not the joiner's.
    #[test]
    fn a_request_waits_its_own_processes_window() {
        let mut j = Joiner::new(Duration::from_secs(6));
        let now = Instant::now();
        let mut out = Vec::new();
        let key = RequestKey {
            pid: 9,
            app_pid: 9,
            incoming: Some((TraceId::from(9), SpanId::from(5))),
            peer_port: None,
            start: SystemTime::now(),
            end: SystemTime::now(),
            parent: SpanId::from(5),
            own_server: None,
        };
        j.hold_for(key, vec![uv_span(9, 100, 5)], Duration::from_millis(1500), now, &mut out);
        j.poll(now + Duration::from_millis(1400), false, &mut out);
        assert!(out.is_empty(), "still in its window");
        j.poll(now + Duration::from_millis(1500), false, &mut out);
        assert_eq!(out.len(), 1, "out after its own 1.5 s window, not the joiner's 6 s");
        assert_eq!(j.stats.unjoined, 1);
    }

    use super::*;
    use opentelemetry::trace::{SpanKind, Status, TraceFlags, TraceState};
    use opentelemetry_proto::tonic::common::v1::AnyValue;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    fn kv(k: &str, v: PbValue) -> PbKeyValue {
        PbKeyValue { key: k.into(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
    }

    fn t(n: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(n)
    }

    fn uv_span(trace: u128, id: u64, parent: u64) -> UvSpan {
        UvSpan {
            span_context: SpanContext::new(TraceId::from(trace), SpanId::from(id), TraceFlags::SAMPLED, false, TraceState::NONE),
            parent_span_id: SpanId::from(parent),
            parent_span_is_remote: parent != 0,
            span_kind: SpanKind::Internal,
            name: "fs.stat".into(),
            start_ns: 1,
            end_ns: 2,
            attributes: vec![],
            events: vec![],
            status: Status::Unset,
            family: crate::events::spans::Family::Fs("stat"),
        }
    }

    fn server(pid: u32, trace: u128, id: u64, parent: u64, start: u64, end: u64, port: u16) -> AppServer {
        AppServer {
            pid: Some(pid),
            trace_id: TraceId::from(trace),
            span_id: SpanId::from(id),
            parent: SpanId::from(parent),
            start_ns: start,
            end_ns: end,
            peer_port: Some(port),
        }
    }

    #[test]
    fn server_spans_are_read_from_an_export() {
        let span = |kind, port: i64, parent: Vec<u8>| Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            parent_span_id: parent,
            kind,
            start_time_unix_nano: 10,
            end_time_unix_nano: 20,
            attributes: vec![kv("net.peer.port", PbValue::IntValue(port))],
            ..Default::default()
        };
        let req = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource { attributes: vec![kv("process.pid", PbValue::IntValue(42))], ..Default::default() }),
                scope_spans: vec![ScopeSpans {
                    spans: vec![span(2, 5000, vec![]), span(3, 1, vec![]), span(2, 70000, vec![3; 8])],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let got = app_spans(&req).servers;
        assert_eq!(got.len(), 2, "SERVER spans only");
        // uvspan's own spans, back through a collector tee: not the app's.
        let mut back = req.clone();
        back.resource_spans[0].scope_spans[0].scope =
            Some(opentelemetry_proto::tonic::common::v1::InstrumentationScope { name: "uvspan".into(), ..Default::default() });
        assert!(app_spans(&back).servers.is_empty());
        assert_eq!(got[0], server(42, u128::from_be_bytes([1; 16]), u64::from_be_bytes([2; 8]), 0, 10, 20, 5000));
        assert_eq!(got[1].parent, SpanId::from_bytes([3; 8]));
        assert_eq!(got[1].peer_port, None, "not a port");
    }

    #[test]
    fn with_traceparent_the_spans_join_the_apps_server_span() {
        let mut j = Joiner::new(Duration::from_secs(6));
        let now = Instant::now();
        let mut out = Out::new();
        let key = RequestKey {
            pid: 7,
            app_pid: 7,
            incoming: Some((TraceId::from(9), SpanId::from(5))),
            peer_port: None,
            start: t(0),
            end: t(1),
            parent: SpanId::from(5),
            own_server: None,
        };
        // A child of a uvspan span (threadpool detail) keeps its parent.
        j.hold(key, vec![uv_span(9, 100, 5), uv_span(9, 101, 100)], now, &mut out);
        j.poll(now, false, &mut out);
        assert!(out.is_empty(), "held until the app's span comes");
        j.offer(vec![server(7, 9, 50, 5, 0, 1, 1)]);
        j.poll(now, false, &mut out);
        let spans = &out[0].1;
        assert_eq!(spans[0].parent_span_id, SpanId::from(50));
        assert!(!spans[0].parent_span_is_remote);
        assert_eq!(spans[1].parent_span_id, SpanId::from(100));
        assert_eq!(j.stats, JoinStats { joined: 2, unjoined: 0, own_servers_dropped: 0, twins_dropped: 0 });
        assert_eq!(j.held(), 0);
    }

    /// uvspan's SERVER span made in case the app's did not come: dropped
    /// when it comes (its children go under the app's), sent when it does not.
    #[test]
    fn uvspans_own_server_span_goes_only_when_the_apps_does_not_come() {
        let mut j = Joiner::new(Duration::from_secs(6));
        let now = Instant::now();
        let own = |trace| {
            let mut s = uv_span(trace, 40, 5);
            s.span_kind = SpanKind::Server;
            vec![s, uv_span(trace, 41, 40), uv_span(trace, 42, 41)]
        };
        let key = |trace: u128| RequestKey {
            pid: 29845,
            app_pid: 1,
            incoming: Some((TraceId::from(trace), SpanId::from(5))),
            peer_port: None,
            start: t(0),
            end: t(1),
            parent: SpanId::from(40),
            own_server: Some(SpanId::from(40)),
        };
        let mut out = Out::new();
        j.hold(key(9), own(9), now, &mut out);
        j.hold(key(8), own(8), now, &mut out);
        j.offer(vec![server(1, 9, 50, 5, 0, 1, 1)]);
        j.poll(now, false, &mut out);
        assert_eq!(out.len(), 1);
        let (pid, spans) = &out[0];
        assert_eq!(*pid, 29845, "sent as uvspan's process");
        let ids: Vec<(u64, u64)> = spans
            .iter()
            .map(|s| (u64::from_be_bytes(s.span_context.span_id().to_bytes()), u64::from_be_bytes(s.parent_span_id.to_bytes())))
            .collect();
        assert_eq!(ids, vec![(41, 50), (42, 41)], "no second SERVER span; its child under the app's");
        assert_eq!(j.held(), 3);
        j.poll(now + Duration::from_secs(6), false, &mut out);
        assert_eq!(out[1].1.len(), 3, "the app's did not come: uvspan's SERVER span goes with its work");
        assert_eq!(out[1].1[0].span_kind, SpanKind::Server);
        assert_eq!(j.stats, JoinStats { joined: 2, unjoined: 3, own_servers_dropped: 1, twins_dropped: 0 });
        assert_eq!(j.held(), 0);
    }

    #[test]
    fn without_traceparent_process_port_and_time_decide() {
        let mut j = Joiner::new(Duration::from_secs(6));
        let now = Instant::now();
        let ms = 1_000_000u64;
        // Two keep-alive requests on the same connection, one on another, another process.
        j.offer(vec![
            server(7, 1, 11, 0, 100 * ms, 110 * ms, 4000),
            server(7, 2, 22, 0, 200 * ms, 210 * ms, 4000),
            server(7, 3, 33, 0, 200 * ms, 210 * ms, 4001),
            server(8, 4, 44, 0, 200 * ms, 210 * ms, 4000),
        ]);
        let key = |pid, port, start: u64, end: u64| RequestKey {
            pid: pid + 1000,
            app_pid: pid,
            incoming: None,
            peer_port: Some(port),
            start: t(start),
            end: t(end),
            parent: SpanId::INVALID,
            own_server: None,
        };
        let mut out = Out::new();
        j.hold(key(7, 4000, 199 * ms, 230 * ms), vec![uv_span(77, 1, 0)], now, &mut out);
        j.hold(key(7, 4001, 199 * ms, 230 * ms), vec![uv_span(78, 2, 0)], now, &mut out);
        j.hold(key(8, 4000, 199 * ms, 230 * ms), vec![uv_span(79, 3, 0)], now, &mut out);
        j.hold(key(7, 4000, 99 * ms, 105 * ms), vec![uv_span(80, 4, 0)], now, &mut out);
        let got: Vec<(u128, u64)> = out
            .iter()
            .map(|(_, s)| {
                (u128::from_be_bytes(s[0].span_context.trace_id().to_bytes()), u64::from_be_bytes(s[0].parent_span_id.to_bytes()))
            })
            .collect();
        assert_eq!(got, vec![(2, 22), (3, 33), (4, 44), (1, 11)]);
        // Nothing of the app overlaps: held, then sent as it is.
        out.clear();
        j.hold(key(7, 4000, 500 * ms, 510 * ms), vec![uv_span(81, 5, 0)], now, &mut out);
        j.poll(now + Duration::from_secs(5), false, &mut out);
        assert!(out.is_empty());
        j.poll(now + Duration::from_secs(6), false, &mut out);
        assert_eq!(out[0].1[0].span_context.trace_id(), TraceId::from(81));
        assert_eq!(out[0].1[0].parent_span_id, SpanId::INVALID);
        assert_eq!(j.stats, JoinStats { joined: 4, unjoined: 1, own_servers_dropped: 0, twins_dropped: 0 });
        // A traceparent the app saw and uvspan did not (cut from its capture): port and time still match.
        out.clear();
        j.offer(vec![server(7, 5, 55, 99, 700 * ms, 710 * ms, 4002)]);
        j.hold(key(7, 4002, 699 * ms, 720 * ms), vec![uv_span(82, 6, 0)], now, &mut out);
        assert_eq!(out[0].1[0].parent_span_id, SpanId::from(55));
    }

    /// The app's `dns.lookup`, CLIENT `GET` and `fs stat` stand for uvspan's
    /// spans of the same operations in the joined trace: those are not sent,
    /// their children go under the app's; an operation the app has no span of,
    /// one of another trace, and one outside the app's span's time stay.
    #[test]
    fn the_apps_span_of_an_operation_stands_for_uvspans_twin() {
        use crate::events::spans::Family;
        let ms = 1_000_000u64;
        let op = |id: u64, trace: u128, name: &str, kind: i32, method: Option<&str>, start: u64, end: u64| Span {
            trace_id: TraceId::from(trace).to_bytes().to_vec(),
            span_id: SpanId::from(id).to_bytes().to_vec(),
            name: name.into(),
            kind,
            start_time_unix_nano: start * ms,
            end_time_unix_nano: end * ms,
            attributes: method.map(|m| kv("http.request.method", PbValue::StringValue(m.into()))).into_iter().collect(),
            ..Default::default()
        };
        let req = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![
                        op(60, 9, "dns.lookup", 3, None, 10, 20),
                        op(61, 9, "GET", 3, Some("GET"), 30, 40),
                        op(62, 9, "fs statSync", 1, None, 50, 51),
                        op(63, 9, "fs promises.readFile", 1, None, 60, 70),
                        op(64, 8, "dns.lookup", 3, None, 10, 20),
                        op(65, 9, "middleware - query", 1, None, 10, 20),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let got = app_spans(&req);
        let kinds: Vec<&OpKind> = got.ops.iter().map(|o| &o.kind).collect();
        assert_eq!(
            kinds,
            [&OpKind::Dns, &OpKind::HttpClient("GET".into()), &OpKind::Fs("stat".into()), &OpKind::Fs("readFile".into()), &OpKind::Dns],
            "operation spans only"
        );
        let mut j = Joiner::new(Duration::from_secs(6));
        j.offer_spans(got);
        j.offer(vec![server(7, 9, 50, 5, 0, 100 * ms, 1)]);
        let span = |id: u64, parent: u64, family: Family, kind: SpanKind, start: u64, end: u64| {
            let mut s = uv_span(9, id, parent);
            s.family = family;
            let client = kind == SpanKind::Client;
            s.span_kind = kind;
            s.start_ns = start * ms;
            s.end_ns = end * ms;
            if client {
                s.attributes.push(crate::events::spans::KeyValue::new("http.request.method", "GET"));
            }
            s
        };
        let key = RequestKey {
            pid: 7,
            app_pid: 7,
            incoming: Some((TraceId::from(9), SpanId::from(5))),
            peer_port: None,
            start: t(0),
            end: t(100 * ms),
            parent: SpanId::from(5),
            own_server: None,
        };
        let uv = vec![
            span(100, 5, Family::Dns, SpanKind::Client, 11, 19),
            // (threadpool detail: a child of the lookup)
            span(101, 100, Family::Other, SpanKind::Internal, 12, 18),
            span(102, 5, Family::Http, SpanKind::Client, 31, 39),
            span(103, 5, Family::Fs("stat"), SpanKind::Internal, 50, 51),
            // readFile's own operations: no twin (the app's span is of another call).
            span(104, 5, Family::Fs("open"), SpanKind::Internal, 61, 62),
            // A second lookup the app has no span of (its one stands for the first).
            span(105, 5, Family::Dns, SpanKind::Client, 80, 90),
        ];
        let mut out = Out::new();
        j.hold(key, uv, Instant::now(), &mut out);
        let ids: Vec<(u64, u64)> = out[0]
            .1
            .iter()
            .map(|s| (u64::from_be_bytes(s.span_context.span_id().to_bytes()), u64::from_be_bytes(s.parent_span_id.to_bytes())))
            .collect();
        assert_eq!(ids, vec![(101, 60), (104, 50), (105, 50)]);
        assert_eq!(j.stats, JoinStats { joined: 3, unjoined: 0, own_servers_dropped: 0, twins_dropped: 3 });
        assert_eq!(j.ops[&TraceId::from(9)].len(), 1, "the readFile span is left, unused");
    }

    #[test]
    fn memory_stays_bounded() {
        let mut j = Joiner::new(Duration::from_secs(6));
        let now = Instant::now();
        j.offer((0..SERVERS_MAX as u64 + 10).map(|i| server(7, 1, i + 1, 0, i, i, 1)).collect());
        j.offer((0..10u64).map(|i| server(7, 1, i + 1, i + 1, i, i, 1)).collect());
        assert_eq!(j.order.len(), SERVERS_MAX);
        assert_eq!(j.by_pid[&7].len(), SERVERS_MAX);
        assert_eq!(j.by_parent.len(), 10);
        let op = |i: u64| AppOp {
            trace_id: TraceId::from(u128::from(i % 100 + 1)),
            span_id: SpanId::from(i + 1),
            kind: OpKind::Dns,
            start_ns: i,
            end_ns: i,
        };
        j.offer_spans(AppSpans { servers: vec![], ops: (0..OPS_MAX as u64 + 10).map(op).collect() });
        assert_eq!(j.ops_order.len(), OPS_MAX);
        assert_eq!(j.ops.values().map(Vec::len).sum::<usize>(), OPS_MAX);
        let mut out = Out::new();
        let key = RequestKey {
            pid: 9,
            app_pid: 9,
            incoming: None,
            peer_port: None,
            start: t(0),
            end: t(0),
            parent: SpanId::INVALID,
            own_server: None,
        };
        for i in 0..=(HELD_SPANS_MAX as u64 / 1000) {
            j.hold(key.clone(), (0..1000).map(|k| uv_span(5, i * 1000 + k + 1, 0)).collect(), now, &mut out);
        }
        assert!(j.held() <= HELD_SPANS_MAX);
        assert_eq!(out.len(), 1, "over the bound: sent as it is");
        j.poll(now, true, &mut out);
        assert_eq!(j.held(), 0);
        assert_eq!(j.stats.unjoined, (HELD_SPANS_MAX as u64 / 1000 + 1) * 1000);
    }
}
