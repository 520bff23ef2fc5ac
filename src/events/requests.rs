//! Request context: the HTTP requests a process serves, seen where their
//! bytes reach the parser, and the fs/DNS work they caused (the kernel tags
//! each operation with its cause), as one trace per request — inside the
//! caller's trace when the request carried a W3C `traceparent`.
//!
//! A request's work is held until the request ends (its response written,
//! the next request on its connection, its process gone, or a quiet
//! period), then built in one batch: its SERVER span, the fs/DNS spans under
//! it, and a CLIENT span per outgoing HTTP call it made. Work that arrives
//! after its request ended still joins its trace (recent requests are
//! remembered). Pure: no kernel, no clock of its own.

use std::borrow::Cow;
use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use std::net::SocketAddr;

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};

use crate::events::decode::{HttpRecord, HttpWhat, Record};
use crate::events::spans::{build_in, build_into, KeyValue, Parent, Span, SpanContextSource};
use crate::listen::join::RequestKey;

/// Longest `url.query` kept (bytes).
pub const QUERY_MAX: usize = 256;
/// Operations held per request before they are sent as they come.
const HELD_MAX: usize = 512;
/// Requests held at once before the oldest is sent as it is.
const OPEN_MAX: usize = 8192;
/// Finished requests remembered for work that arrives late.
const RECENT_MAX: usize = 8192;
/// A request with its response started and no write since: over.
const QUIET_NS: u64 = 1_000_000_000;
/// A request with no response seen: over after this.
const NO_RESPONSE_NS: u64 = 30_000_000_000;

/// Query parameters whose values are credentials (semantic conventions:
/// redact them): matched on the key, case-insensitively, as a substring.
const SECRET_KEYS: &[&str] = &["token", "key", "sig", "password", "passwd", "secret", "auth", "credential", "session"];

/// The request headers uvspan reads (the others are not kept).
const HEADERS_READ: &[&str] = &["traceparent", "tracestate", "user-agent", "host"];

/// The methods of RFC 9110 and PATCH, as static text (no allocation for
/// the span name and attribute of a request).
const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"];

/// A request line and the headers uvspan reads ([`HEADERS_READ`]), parsed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Head {
    pub method: Cow<'static, str>,
    pub path: String,
    pub query: Option<String>,
    /// "1.1", "1.0"
    pub version: &'static str,
    /// (lower-case name, value), only the headers in [`HEADERS_READ`]
    pub headers: Vec<(&'static str, String)>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }
}

/// The name as uvspan reads it, if it is one of [`HEADERS_READ`].
fn header_read(name: &str) -> Option<&'static str> {
    HEADERS_READ.iter().copied().find(|k| k.eq_ignore_ascii_case(name.trim()))
}

fn header_value(v: &[u8]) -> String {
    String::from_utf8_lossy(v).trim().to_string()
}

fn headers_of(h: &[httparse::Header<'_>]) -> Vec<(&'static str, String)> {
    h.iter().filter_map(|h| Some((header_read(h.name)?, header_value(h.value)))).collect()
}

fn method_of(m: &str) -> Cow<'static, str> {
    METHODS.iter().find(|k| **k == m).map_or_else(|| Cow::Owned(m.to_string()), |k| Cow::Borrowed(*k))
}

/// A request's head from its first bytes (a head cut short by the capture
/// keeps the headers read so far).
pub fn parse_request(data: &[u8]) -> Option<Head> {
    let mut buf = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut buf);
    let complete = req.parse(data);
    let (method, target, version) = (req.method?, req.path?, req.version?);
    let headers = match complete {
        Ok(_) => headers_of(req.headers),
        // Cut short: parse the lines we have, one by one.
        Err(_) => partial_headers(data),
    };
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), Some(q.to_string())),
        None => (target.to_string(), None),
    };
    let version = if version == 0 { "1.0" } else { "1.1" };
    Some(Head { method: method_of(method), path, query, version, headers })
}

/// Headers from a head whose end was not captured.
fn partial_headers(data: &[u8]) -> Vec<(&'static str, String)> {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split("\r\n");
    lines.next(); // request line
    let complete: Vec<&str> = lines.collect();
    // The last piece may be a header cut in the middle: left out.
    let n = complete.len().saturating_sub(1);
    complete[..n]
        .iter()
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(k, v)| Some((header_read(k)?, v.trim().to_string())))
        .collect()
}

/// A response's status line and what says how long it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusHead {
    pub status: u16,
    pub content_length: Option<u64>,
    pub chunked: bool,
    /// Bytes of the head (status line and headers), when all of it was captured.
    pub head_len: Option<u64>,
}

pub fn parse_status(data: &[u8]) -> Option<StatusHead> {
    let mut buf = [httparse::EMPTY_HEADER; 64];
    let mut res = httparse::Response::new(&mut buf);
    let parsed = res.parse(data);
    let status = res.code?;
    let head_len = match parsed {
        Ok(httparse::Status::Complete(n)) => Some(n as u64),
        _ => None,
    };
    // Read in place: a response's headers are not kept.
    let get = |k: &str| res.headers.iter().find(|h| h.name.eq_ignore_ascii_case(k)).map(|h| h.value);
    fn text(v: &[u8]) -> Option<&str> {
        std::str::from_utf8(v).ok().map(str::trim)
    }
    Some(StatusHead {
        status,
        content_length: get("content-length").and_then(text).and_then(|v| v.parse().ok()),
        chunked: get("transfer-encoding").is_some_and(|v| v.windows(7).any(|w| w.eq_ignore_ascii_case(b"chunked"))),
        head_len,
    })
}

/// A W3C traceparent: (trace id, parent span id, sampled). None when
/// malformed (which is never trusted).
pub fn parse_traceparent(v: &str) -> Option<(TraceId, SpanId, bool)> {
    let v = v.trim();
    let parts: Vec<&str> = v.split('-').collect();
    if parts.len() < 4 {
        return None;
    }
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let (version, trace, span, flags) = (parts[0], parts[1], parts[2], parts[3]);
    // Version 00 has exactly four fields; later versions may add more.
    if !hex(version, 2) || version == "ff" || (version == "00" && parts.len() != 4) || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok().filter(|t| *t != TraceId::INVALID)?;
    let span_id = SpanId::from_hex(span).ok().filter(|s| *s != SpanId::INVALID)?;
    let sampled = u8::from_str_radix(flags, 16).ok()? & 1 == 1;
    Some((trace_id, span_id, sampled))
}

/// `url.query`, capped, with credential-like values redacted.
pub fn redact_query(q: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    for pair in q.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let lk = k.to_ascii_lowercase();
        if !v.is_empty() && SECRET_KEYS.iter().any(|s| lk.contains(s)) {
            out.push(format!("{k}=REDACTED"));
        } else {
            out.push(pair.to_string());
        }
    }
    let mut s = out.join("&");
    if s.len() > QUERY_MAX {
        let mut end = QUERY_MAX;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Counters of the request tracker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestStats {
    pub requests: u64,
    /// Requests whose traceparent was malformed (ignored: a new trace).
    pub bad_traceparent: u64,
    /// Requests their caller did not sample: their spans are not exported.
    pub unsampled: u64,
    /// Operations sent as they came because their request held too many,
    /// or too many requests were open.
    pub not_held: u64,
}

/// An outgoing HTTP call a request made.
#[derive(Clone, Debug)]
struct Call {
    conn: u64,
    start_ns: u64,
    end_ns: Option<u64>,
    head: Head,
    status: Option<u16>,
    tls: bool,
}

#[derive(Clone, Debug)]
struct Request {
    pid: u32,
    tid: u32,
    conn: u64,
    start_ns: u64,
    last_ns: u64,
    head: Head,
    tls: bool,
    peer: Option<SocketAddr>,
    local_port: Option<u16>,
    /// The SERVER span's id (also the parent of the request's work).
    span_id: SpanId,
    /// From an incoming traceparent: (trace, parent span, sampled).
    incoming: Option<(TraceId, SpanId, bool)>,
    state: TraceState,
    /// Learned from an outgoing traceparent the app wrote (no incoming one).
    adopted: Option<TraceId>,
    own_trace: TraceId,
    status: Option<u16>,
    response_conn: Option<u64>,
    /// Bytes the response takes (head + body), when it says.
    response_total: Option<u64>,
    response_written: u64,
    held: Vec<Record>,
    calls: Vec<Call>,
    /// uvspan makes the SERVER span (not the app's SDK).
    server_span: bool,
}

impl Request {
    fn trace_id(&self) -> TraceId {
        self.incoming.map(|i| i.0).or(self.adopted).unwrap_or(self.own_trace)
    }

    fn sampled(&self) -> bool {
        self.incoming.is_none_or(|i| i.2)
    }

    fn complete(&self) -> bool {
        self.response_total.is_some_and(|t| self.response_written >= t)
    }

    /// Where the request's work goes: under the SERVER span (or, without
    /// one, under the incoming parent).
    fn parent(&self) -> Parent {
        let (span_id, remote) =
            if self.server_span { (self.span_id, false) } else { self.incoming.map_or((SpanId::INVALID, false), |i| (i.1, true)) };
        Parent { trace_id: self.trace_id(), span_id, remote, state: self.state.clone() }
    }
}

pub struct Requests {
    open: FxHashMap<u64, Request>,
    /// Arrival order of open requests (for the OPEN_MAX bound).
    order: VecDeque<u64>,
    /// (pid, server connection) -> its request in progress.
    by_conn: FxHashMap<(u32, u64), u64>,
    recent: FxHashMap<u64, (u32, Parent, Option<RequestKey>)>,
    recent_order: VecDeque<u64>,
    /// A SERVER span per request also where the app's SDK makes its own.
    always_server_spans: bool,
    /// --otlp-listen: the spans of requests whose SERVER span is the app's
    /// go to `joinable` (with what identifies the request), not `ready`.
    join: bool,
    pub joinable: Vec<(RequestKey, Vec<Span>)>,
    pub stats: RequestStats,
}

/// Spans ready to send, per process (a batch's: spans are built straight
/// into their process's list).
pub type Ready = FxHashMap<u32, Vec<Span>>;

impl Requests {
    pub fn new(always_server_spans: bool) -> Requests {
        Requests {
            open: FxHashMap::default(),
            order: VecDeque::new(),
            by_conn: FxHashMap::default(),
            recent: FxHashMap::default(),
            recent_order: VecDeque::new(),
            always_server_spans,
            join: false,
            joinable: Vec::new(),
            stats: RequestStats::default(),
        }
    }

    /// Spans of requests served under the app's own SERVER span are handed
    /// to the joiner (`joinable`) instead of being sent.
    pub fn hold_for_join(&mut self) {
        self.join = true;
    }

    /// What the joiner matches the request on (None: not joining). Every
    /// request is held for the join, whether or not its process is known to
    /// run an SDK yet (an app that loads its SDK from its own code exports
    /// only after its first requests): uvspan's SERVER span is made in case
    /// the app's does not arrive, and dropped when it does (but with
    /// `--requests always`, which asks for both).
    fn join_key(&self, req: &Request, src: &SpanContextSource<'_>) -> Option<RequestKey> {
        self.join.then(|| RequestKey {
            pid: req.pid,
            app_pid: req.pid,
            incoming: req.incoming.map(|i| (i.0, i.1)),
            peer_port: req.peer.map(|p| p.port()),
            start: src.clock.to_wall(req.start_ns),
            end: src.clock.to_wall(req.last_ns),
            parent: req.parent().span_id,
            own_server: (req.server_span && !self.always_server_spans).then_some(req.span_id),
        })
    }

    /// Requests open now.
    pub fn open(&self) -> usize {
        self.open.len()
    }

    /// An HTTP record: a new request, a response's bytes, an outgoing call.
    /// `app_sdk`: the process runs the OpenTelemetry SDK, whose own SERVER
    /// span stands for the request.
    pub fn http(&mut self, r: &HttpRecord, app_sdk: bool, src: &SpanContextSource<'_>, ready: &mut Ready) {
        match r.what {
            HttpWhat::Request => self.start(r, !app_sdk || self.always_server_spans || self.join, src, ready),
            HttpWhat::Write => self.write(r, src, ready),
            HttpWhat::Response => self.response(r),
        }
    }

    fn start(&mut self, r: &HttpRecord, server_span: bool, src: &SpanContextSource<'_>, ready: &mut Ready) {
        // Keep-alive: the previous request on the connection is over. (An
        // unknown connection, 0: a socket that reached the server without a
        // libuv stream callback, says nothing about other requests.)
        if r.conn != 0 {
            if let Some(prev) = self.by_conn.insert((r.pid, r.conn), r.cause) {
                if prev != r.cause {
                    self.finish(prev, src, ready);
                }
            }
        }
        let head = parse_request(&r.data).unwrap_or_default();
        let incoming = head.header("traceparent").map(parse_traceparent);
        if matches!(incoming, Some(None)) {
            self.stats.bad_traceparent += 1;
        }
        let incoming = incoming.flatten();
        let state = match (incoming, head.header("tracestate")) {
            (Some(_), Some(ts)) => ts.parse().unwrap_or_default(),
            _ => TraceState::NONE,
        };
        self.stats.requests += 1;
        if incoming.is_some_and(|i| !i.2) {
            self.stats.unsampled += 1;
        }
        let req = Request {
            pid: r.pid,
            tid: r.tid,
            conn: r.conn,
            start_ns: r.ts_ns,
            last_ns: r.ts_ns,
            head,
            tls: r.tls,
            peer: r.peer,
            local_port: r.local_port,
            span_id: src.ids.new_span_id(),
            incoming,
            state,
            adopted: None,
            own_trace: src.ids.new_trace_id(),
            status: None,
            response_conn: None,
            response_total: None,
            response_written: 0,
            // An fs read and a DNS lookup or two: one allocation, not grown.
            held: Vec::with_capacity(8),
            calls: Vec::new(),
            server_span,
        };
        self.open.insert(r.cause, req);
        self.order.push_back(r.cause);
        while self.open.len() > OPEN_MAX {
            let Some(oldest) = self.order.pop_front() else { break };
            if self.open.contains_key(&oldest) {
                self.stats.not_held += 1;
                self.finish(oldest, src, ready);
            }
        }
    }

    fn write(&mut self, r: &HttpRecord, src: &SpanContextSource<'_>, ready: &mut Ready) {
        let Some(req) = self.open.get_mut(&r.cause) else { return };
        req.last_ns = r.ts_ns;
        if req.response_conn.is_none() {
            if let Some(st) = parse_status(&r.data) {
                req.status = Some(st.status);
                req.response_conn = Some(r.conn);
                // Its plaintext came through SSL_write: an HTTPS request.
                req.tls |= r.tls;
                req.response_total = match (st.head_len, st.content_length, st.chunked) {
                    (Some(h), Some(n), false) => Some(h + n),
                    _ => None,
                };
            } else if let Some(head) = parse_request(&r.data) {
                // An outgoing call; an app that writes a traceparent (its
                // SDK) says which trace the request is in.
                if req.incoming.is_none() && req.adopted.is_none() {
                    req.adopted = head.header("traceparent").and_then(parse_traceparent).map(|t| t.0);
                }
                req.calls.push(Call { conn: r.conn, start_ns: r.ts_ns, end_ns: None, head, status: None, tls: r.tls });
                return;
            }
        }
        if req.response_conn == Some(r.conn) {
            req.response_written += u64::from(r.len);
            if req.complete() {
                self.finish(r.cause, src, ready);
            }
        }
    }

    fn response(&mut self, r: &HttpRecord) {
        let Some(req) = self.open.get_mut(&r.cause) else { return };
        req.last_ns = r.ts_ns;
        let status = parse_status(&r.data).map(|s| s.status);
        if let Some(call) = req.calls.iter_mut().find(|c| c.conn == r.conn && c.end_ns.is_none()) {
            call.end_ns = Some(r.ts_ns);
            call.status = status;
        }
    }

    /// An fs or DNS record: held with its request, sent under it if the
    /// request is over, or given back (no cause known: its own trace).
    pub fn work(&mut self, rec: Record, src: &SpanContextSource<'_>, ready: &mut Ready) -> Option<Record> {
        let (cause, pid, end) = match &rec {
            Record::Fs(r) => (r.cause, r.pid, r.end_ns),
            Record::Dns(r) => (r.cause, r.pid, r.end_ns),
            _ => return Some(rec),
        };
        if cause == 0 {
            return Some(rec);
        }
        if let Some(req) = self.open.get_mut(&cause) {
            req.last_ns = req.last_ns.max(end);
            if req.held.len() < HELD_MAX {
                req.held.push(rec);
                return None;
            }
            self.stats.not_held += 1;
            if req.sampled() {
                let parent = req.parent();
                let key = self.join_key(&self.open[&cause], src);
                send_late(&mut self.joinable, ready, key, pid, rec, &parent, src);
            }
            return None;
        }
        match self.recent.get(&cause) {
            Some((sampled_pid, parent, key)) if *sampled_pid == pid => {
                if parent.trace_id != TraceId::INVALID {
                    send_late(&mut self.joinable, ready, key.clone(), pid, rec, parent, src);
                }
                None
            }
            _ => Some(rec),
        }
    }

    /// Requests over by now (`now_ns`, kernel time): their spans.
    pub fn expire(&mut self, now_ns: u64, src: &SpanContextSource<'_>, ready: &mut Ready) {
        let over: Vec<u64> = self
            .open
            .iter()
            .filter(|(_, r)| {
                let quiet = now_ns.saturating_sub(r.last_ns);
                (r.status.is_some() && quiet >= QUIET_NS) || quiet >= NO_RESPONSE_NS
            })
            .map(|(c, _)| *c)
            .collect();
        for c in over {
            self.finish(c, src, ready);
        }
    }

    /// A process exited: its requests are over.
    pub fn exited(&mut self, pid: u32, src: &SpanContextSource<'_>, ready: &mut Ready) {
        let mine: Vec<u64> = self.open.iter().filter(|(_, r)| r.pid == pid).map(|(c, _)| *c).collect();
        for c in mine {
            self.finish(c, src, ready);
        }
        self.by_conn.retain(|(p, _), _| *p != pid);
    }

    /// Everything still open (uvspan is stopping).
    pub fn finish_all(&mut self, src: &SpanContextSource<'_>, ready: &mut Ready) {
        let all: Vec<u64> = self.open.keys().copied().collect();
        for c in all {
            self.finish(c, src, ready);
        }
    }

    /// A request is over: its spans, and its context kept for late work.
    fn finish(&mut self, cause: u64, src: &SpanContextSource<'_>, ready: &mut Ready) {
        let Some(mut req) = self.open.remove(&cause) else { return };
        if self.by_conn.get(&(req.pid, req.conn)) == Some(&cause) {
            self.by_conn.remove(&(req.pid, req.conn));
        }
        let parent = req.parent();
        let sampled = req.sampled();
        // Late work of an unsampled request is not exported either.
        let remembered = if sampled { parent.clone() } else { Parent { trace_id: TraceId::INVALID, ..parent.clone() } };
        let key = self.join_key(&req, src);
        self.recent.insert(cause, (req.pid, remembered, key.clone()));
        self.recent_order.push_back(cause);
        while self.recent_order.len() > RECENT_MAX {
            if let Some(old) = self.recent_order.pop_front() {
                self.recent.remove(&old);
            }
        }
        if !sampled {
            return;
        }
        let n = req.held.len() + 1 + req.calls.len();
        let mut joined = Vec::new();
        // Built into the process's list itself (no list per request), but
        // for the joiner, which takes them per request.
        let spans = match key {
            Some(_) => &mut joined,
            None => ready.entry(req.pid).or_default(),
        };
        spans.reserve(n);
        if req.server_span {
            spans.push(server_span(&req, src));
        }
        for rec in std::mem::take(&mut req.held) {
            build_into(rec, src, Some(&parent), spans);
        }
        for call in &req.calls {
            spans.push(client_span(&req, call, &parent, src));
        }
        if let Some(key) = key {
            self.joinable.push((key, joined));
        }
    }
}

/// A record of a request that is not held (over, or holding its maximum):
/// its spans under `parent`, to the joiner with `key`, else straight into
/// its process's list.
fn send_late(
    joinable: &mut Vec<(RequestKey, Vec<Span>)>,
    ready: &mut Ready,
    key: Option<RequestKey>,
    pid: u32,
    rec: Record,
    parent: &Parent,
    src: &SpanContextSource<'_>,
) {
    match key {
        Some(key) => joinable.push((key, build_in(rec, src, Some(parent)))),
        None => build_into(rec, src, Some(parent), ready.entry(pid).or_default()),
    }
}

fn span(
    src: &SpanContextSource<'_>,
    parent: &Parent,
    span_id: SpanId,
    name: Cow<'static, str>,
    kind: SpanKind,
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
    }
}

/// The request's SERVER span: under the incoming parent, or a root.
fn server_span(req: &Request, src: &SpanContextSource<'_>) -> Span {
    let parent = match req.incoming {
        Some((_, span, _)) => Parent { trace_id: req.trace_id(), span_id: span, remote: true, state: req.state.clone() },
        None => Parent { trace_id: req.trace_id(), span_id: SpanId::INVALID, remote: false, state: req.state.clone() },
    };
    let h = &req.head;
    // Sized for all it may get (one allocation).
    let mut attrs = Vec::with_capacity(13);
    attrs.extend([
        KeyValue::new("http.request.method", h.method.clone()),
        KeyValue::new("url.path", h.path.clone()),
        KeyValue::new("url.scheme", if req.tls { "https" } else { "http" }),
        KeyValue::new("network.protocol.version", h.version),
        KeyValue::new("thread.id", i64::from(req.tid)),
    ]);
    if let Some(q) = &h.query {
        attrs.push(KeyValue::new("url.query", redact_query(q)));
    }
    if let Some(p) = req.peer {
        attrs.push(KeyValue::new("client.address", p.ip().to_string()));
        attrs.push(KeyValue::new("client.port", i64::from(p.port())));
    }
    if let Some(p) = req.local_port {
        attrs.push(KeyValue::new("server.port", i64::from(p)));
    }
    if let Some(ua) = h.header("user-agent") {
        attrs.push(KeyValue::new("user_agent.original", ua.to_string()));
    }
    let end = req.last_ns;
    let mut s = span(src, &parent, req.span_id, h.method.clone(), SpanKind::Server, (req.start_ns, end), attrs);
    match req.status {
        Some(code) => {
            s.attributes.push(KeyValue::new("http.response.status_code", i64::from(code)));
            if code >= 500 {
                s.status = Status::error(format!("HTTP {code}"));
                s.attributes.push(KeyValue::new("error.type", code.to_string()));
            }
        }
        None => s.attributes.push(KeyValue::new("uvspan.http.response_seen", false)),
    }
    s
}

/// A Host header's name and port: `name`, `name:port`, `[v6]`, `[v6]:port`.
fn host_port(host: &str, default_port: u16) -> (&str, u16) {
    if let Some((addr, tail)) = host.strip_prefix('[').and_then(|rest| rest.split_once(']')) {
        return (addr, tail.strip_prefix(':').and_then(|p| p.parse().ok()).unwrap_or(default_port));
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => match port.parse() {
            Ok(p) => (name, p),
            Err(_) => (host, default_port),
        },
        _ => (host, default_port),
    }
}

/// A CLIENT span for an outgoing call the request made.
fn client_span(req: &Request, call: &Call, parent: &Parent, src: &SpanContextSource<'_>) -> Span {
    let h = &call.head;
    let mut attrs = vec![
        KeyValue::new("http.request.method", h.method.clone()),
        KeyValue::new("url.path", h.path.clone()),
        KeyValue::new("url.scheme", if call.tls { "https" } else { "http" }),
    ];
    if let Some(host) = h.header("host") {
        let (name, port) = host_port(host, if call.tls { 443 } else { 80 });
        attrs.push(KeyValue::new("server.address", name.to_string()));
        attrs.push(KeyValue::new("server.port", i64::from(port)));
    }
    if let Some(tp) = h.header("traceparent") {
        attrs.push(KeyValue::new("uvspan.http.traceparent_written", tp.to_string()));
    }
    let end = call.end_ns.unwrap_or(req.last_ns.max(call.start_ns));
    let mut s = span(src, parent, src.ids.new_span_id(), h.method.clone(), SpanKind::Client, (call.start_ns, end), attrs);
    if let Some(code) = call.status {
        s.attributes.push(KeyValue::new("http.response.status_code", i64::from(code)));
        if code >= 400 {
            s.status = Status::error(format!("HTTP {code}"));
            s.attributes.push(KeyValue::new("error.type", code.to_string()));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::clock::Clock;
    use crate::events::decode::FsRecord;
    use crate::events::spans::{SequentialIds, Value};

    fn attr<'a>(s: &'a Span, k: &str) -> Option<&'a Value> {
        s.attr(k)
    }

    fn http(what: HttpWhat, cause: u64, conn: u64, ts: u64, data: &str) -> HttpRecord {
        HttpRecord {
            pid: 7,
            tid: 7,
            ts_ns: ts,
            cause,
            conn,
            what,
            len: data.len() as u32,
            tls: false,
            peer: Some("10.0.0.2:51000".parse().unwrap()),
            local_port: Some(8080),
            data: data.as_bytes().to_vec(),
        }
    }

    fn fs(cause: u64, start: u64, end: u64) -> Record {
        Record::Fs(FsRecord {
            pid: 7,
            tid: 7,
            req: 0,
            stack: None,
            cause,
            op: 4, // uv_fs_stat
            sync: false,
            start_ns: start,
            work_start_ns: None,
            work_end_ns: None,
            end_ns: end,
            result: 0,
            fd: None,
            worker_tid: None,
            ended_at: Some("libuv_done"),
            path: Some("/x".into()),
            path2: None,
        })
    }

    const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn traceparents() {
        let (t, s, sampled) = parse_traceparent(TP).unwrap();
        assert_eq!(t, TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap());
        assert_eq!(s, SpanId::from_hex("b7ad6b7169203331").unwrap());
        assert!(sampled);
        assert!(!parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00").unwrap().2);
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "0-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad:?}");
        }
        // A later version may carry more fields.
        assert!(parse_traceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what").is_some());
    }

    #[test]
    fn request_heads_and_queries() {
        let h = parse_request(b"GET /a/b?x=1&token=abc&Sig=zz HTTP/1.1\r\nHost: h\r\nTraceParent: v\r\n\r\n").unwrap();
        assert_eq!((&*h.method, h.path.as_str(), h.version), ("GET", "/a/b", "1.1"));
        assert_eq!(h.header("traceparent"), Some("v"), "header names are case-insensitive");
        assert_eq!(redact_query(h.query.as_deref().unwrap()), "x=1&token=REDACTED&Sig=REDACTED");
        // Cut short by the capture: the complete header lines are kept.
        let cut = parse_request(b"POST /p HTTP/1.0\r\nhost: h\r\ntraceparent: v\r\nx-long: aaa").unwrap();
        assert_eq!(cut.header("traceparent"), Some("v"));
        assert_eq!(cut.header("x-long"), None);
        assert_eq!(redact_query(&"a".repeat(300)).len(), QUERY_MAX);
        assert!(parse_request(b"\x16\x03\x01 not http").is_none());
        let st = parse_status(b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nnope!").unwrap();
        assert_eq!((st.status, st.content_length, st.head_len), (404, Some(5), Some(45)));
        let st = parse_status(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, Chunked\r\ncontent-length:  7 \r\n\r\n").unwrap();
        assert!(st.chunked, "header names and the coding are case-insensitive");
        assert_eq!(st.content_length, Some(7), "the value is trimmed");
        assert!(!parse_status(b"HTTP/1.1 200 OK\r\nX-Chunked: chunked\r\n\r\n").unwrap().chunked);
    }

    #[test]
    fn only_the_headers_read_are_kept_and_common_methods_are_static() {
        let h = parse_request(b"PATCH / HTTP/1.0\r\nUser-Agent: ua\r\nCookie: secret\r\nHOST: h:1\r\nAccept: */*\r\n\r\n").unwrap();
        assert_eq!(h.headers, vec![("user-agent", "ua".to_string()), ("host", "h:1".to_string())]);
        assert!(matches!(h.method, Cow::Borrowed("PATCH")));
        assert_eq!(h.version, "1.0");
        let other = parse_request(b"PROPFIND /d HTTP/1.1\r\n\r\n").unwrap();
        assert!(matches!(other.method, Cow::Owned(ref m) if m == "PROPFIND"));
    }

    fn run(steps: impl FnOnce(&mut Requests, &SpanContextSource<'_>, &mut Ready)) -> Vec<Span> {
        let ids = SequentialIds::default();
        let src = SpanContextSource { clock: Clock::with_offset(0), ids: &ids };
        let mut r = Requests::new(false);
        let mut ready = Ready::default();
        steps(&mut r, &src, &mut ready);
        ready.into_values().flatten().collect()
    }

    #[test]
    fn a_request_with_traceparent_and_its_work_form_one_subtree_of_the_callers_trace() {
        let spans = run(|r, src, ready| {
            r.http(
                &http(HttpWhat::Request, 1, 100, 1_000, &format!("GET /x?key=s HTTP/1.1\r\ntraceparent: {TP}\r\n\r\n")),
                false,
                src,
                ready,
            );
            assert!(r.work(fs(1, 2_000, 3_000), src, ready).is_none(), "held");
            assert!(r.work(fs(0, 2_000, 3_000), src, ready).is_some(), "no cause: its own trace");
            r.http(&http(HttpWhat::Write, 1, 100, 4_000, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"), false, src, ready);
        });
        assert_eq!(spans.len(), 2, "finished when the whole response was written");
        let (server, stat) = (&spans[0], &spans[1]);
        let trace = TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap();
        assert_eq!(server.span_kind, SpanKind::Server);
        assert_eq!(server.name, "GET");
        assert_eq!(server.span_context.trace_id(), trace);
        assert_eq!(server.parent_span_id, SpanId::from_hex("b7ad6b7169203331").unwrap());
        assert!(server.parent_span_is_remote);
        assert_eq!(attr(server, "http.response.status_code"), Some(&Value::I64(200)));
        assert_eq!(attr(server, "url.query"), Some(&Value::from("key=REDACTED")));
        assert_eq!(attr(server, "client.address"), Some(&Value::from("10.0.0.2")));
        assert_eq!(attr(server, "server.port"), Some(&Value::I64(8080)));
        assert_eq!(stat.span_context.trace_id(), trace);
        assert_eq!(stat.parent_span_id, server.span_context.span_id());
        assert!(!stat.parent_span_is_remote);
    }

    #[test]
    fn keep_alive_bad_traceparent_late_work_and_unsampled() {
        let spans = run(|r, src, ready| {
            r.http(&http(HttpWhat::Request, 1, 100, 1_000, "GET /1 HTTP/1.1\r\ntraceparent: nonsense\r\n\r\n"), false, src, ready);
            r.work(fs(1, 1_100, 1_200), src, ready);
            // The next request on the connection ends the first.
            r.http(
                &http(HttpWhat::Request, 2, 100, 5_000, &format!("GET /2 HTTP/1.1\r\ntraceparent: {}\r\n\r\n", TP.replace("-01", "-00"))),
                false,
                src,
                ready,
            );
            // Late work of request 1 joins its trace; request 2's is not sampled.
            assert!(r.work(fs(1, 6_000, 7_000), src, ready).is_none());
            assert!(r.work(fs(2, 6_000, 7_000), src, ready).is_none());
            r.finish_all(src, ready);
            assert_eq!(r.stats.bad_traceparent, 1);
            assert_eq!(r.stats.unsampled, 1);
        });
        assert_eq!(spans.len(), 3, "request 1, its stat, its late stat; nothing of the unsampled request 2");
        let t = spans[0].span_context.trace_id();
        assert!(spans.iter().all(|s| s.span_context.trace_id() == t));
        assert_eq!(spans[0].parent_span_id, SpanId::INVALID, "a malformed traceparent is ignored: a new trace");
        assert_eq!(attr(&spans[0], "uvspan.http.response_seen"), Some(&Value::Bool(false)));
    }

    #[test]
    fn outgoing_calls_are_client_spans_and_lend_the_request_their_trace() {
        let spans = run(|r, src, ready| {
            r.http(&http(HttpWhat::Request, 1, 100, 1_000, "GET / HTTP/1.1\r\n\r\n"), false, src, ready);
            r.http(
                &http(HttpWhat::Write, 1, 200, 2_000, &format!("GET /up HTTP/1.1\r\nHost: api:9000\r\ntraceparent: {TP}\r\n\r\n")),
                false,
                src,
                ready,
            );
            r.http(&http(HttpWhat::Response, 1, 200, 3_000, "HTTP/1.1 503 Busy\r\n\r\n"), false, src, ready);
            r.work(fs(1, 3_100, 3_200), src, ready);
            r.expire(3_200 + NO_RESPONSE_NS, src, ready);
        });
        assert_eq!(spans.len(), 3);
        let trace = TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap();
        assert!(spans.iter().all(|s| s.span_context.trace_id() == trace), "the app's trace id, learned from its outgoing call");
        let client = spans.iter().find(|s| s.span_kind == SpanKind::Client).unwrap();
        assert_eq!(client.parent_span_id, spans[0].span_context.span_id());
        assert_eq!(attr(client, "server.address"), Some(&Value::from("api")));
        assert_eq!(attr(client, "server.port"), Some(&Value::I64(9000)));
        assert_eq!(attr(client, "http.response.status_code"), Some(&Value::I64(503)));
        assert!(matches!(client.status, Status::Error { .. }));
    }

    #[test]
    fn host_headers() {
        assert_eq!(host_port("api:9000", 80), ("api", 9000));
        assert_eq!(host_port("api", 443), ("api", 443));
        assert_eq!(host_port("[::1]:8080", 80), ("::1", 8080));
        assert_eq!(host_port("[::1]", 80), ("::1", 80));
        assert_eq!(host_port("api:x", 80), ("api:x", 80));
    }

    #[test]
    fn requests_on_unknown_connections_do_not_end_each_other() {
        let spans = run(|r, src, ready| {
            r.http(&http(HttpWhat::Request, 1, 0, 1_000, "GET /a HTTP/1.1\r\n\r\n"), false, src, ready);
            r.http(&http(HttpWhat::Request, 2, 0, 1_500, "GET /b HTTP/1.1\r\n\r\n"), false, src, ready);
            assert_eq!(r.open(), 2, "both still open");
            r.work(fs(1, 2_000, 2_100), src, ready);
            r.finish_all(src, ready);
        });
        assert_eq!(spans.len(), 3);
        assert_eq!(spans.iter().filter(|s| s.parent_span_id != SpanId::INVALID).count(), 1, "request 1's stat under it");
    }

    #[test]
    fn with_the_apps_sdk_work_hangs_under_the_incoming_parent() {
        let spans = run(|r, src, ready| {
            r.http(&http(HttpWhat::Request, 1, 100, 1_000, &format!("GET / HTTP/1.1\r\ntraceparent: {TP}\r\n\r\n")), true, src, ready);
            r.work(fs(1, 1_100, 1_200), src, ready);
            r.exited(7, src, ready);
        });
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].parent_span_id, SpanId::from_hex("b7ad6b7169203331").unwrap());
        assert!(spans[0].parent_span_is_remote);
    }

    /// The bytes come from the traced process (and from whoever sent it a
    /// request): any head, cut anywhere, any traceparent, any order of
    /// records — no panic, and what is kept is bounded by what came in.
    mod props {
        use proptest::prelude::*;

        use super::*;

        /// A request or status head, often well-formed, cut anywhere.
        fn head() -> impl Strategy<Value = Vec<u8>> {
            let line = prop_oneof![
                "(GET|POST|PATCH|PROPFIND|[A-Z]{1,8}) /[ -~]{0,40} HTTP/1\\.[01]",
                "HTTP/1\\.[01] [0-9]{3} [ -~]{0,12}",
                "[ -~]{0,40}",
            ];
            let header = prop_oneof![
                "(traceparent|tracestate|user-agent|host|content-length|transfer-encoding|TraceParent|x-[a-z]{1,5}) ?: ?[ -~]{0,60}",
                "traceparent: 0[0-9a-f]-[0-9a-f]{32}-[0-9a-f]{16}-0[01]",
                "[ -~]{0,30}",
            ];
            // More than httparse's 64 headers sometimes (then read line by line).
            let many = prop_oneof![3 => Just(0usize), 1 => 60usize..70];
            (
                line,
                prop::collection::vec(header, 0..8),
                many,
                any::<bool>(),
                prop::option::of(any::<prop::sample::Index>()),
                prop::collection::vec(any::<u8>(), 0..8),
            )
                .prop_map(|(line, headers, many, end, cut, junk)| {
                    let mut b = line.into_bytes();
                    for h in headers.iter().map(String::as_str).chain(std::iter::repeat_n("x-a: b", many)) {
                        b.extend_from_slice(b"\r\n");
                        b.extend_from_slice(h.as_bytes());
                    }
                    if end {
                        b.extend_from_slice(b"\r\n\r\n");
                    }
                    b.extend_from_slice(&junk);
                    if let Some(cut) = cut {
                        b.truncate(cut.index(b.len() + 1));
                    }
                    b
                })
        }

        fn bytes() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![head(), prop::collection::vec(any::<u8>(), 0..300)]
        }

        /// (what, cause, connection, time, which of the heads).
        fn record() -> impl Strategy<Value = (u8, u64, u64, u64, prop::sample::Index)> {
            (0u8..4, 0u64..4, 0u64..4, 0u64..3_000_000_000, any::<prop::sample::Index>())
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

            #[test]
            fn heads_parse_into_what_they_hold(data in bytes()) {
                if let Some(h) = parse_request(&data) {
                    prop_assert!(h.path.len() + h.query.as_ref().map_or(0, String::len) <= data.len());
                    prop_assert!(h.method.len() <= data.len());
                    prop_assert!(h.headers.len() <= data.len() / 2 + 1);
                    for (k, v) in &h.headers {
                        prop_assert!(HEADERS_READ.contains(k));
                        prop_assert!(v.len() <= 3 * data.len());
                    }
                    if let Some(q) = &h.query {
                        prop_assert!(redact_query(q).len() <= QUERY_MAX);
                    }
                    if let Some(tp) = h.header("traceparent") {
                        if let Some((t, s, _)) = parse_traceparent(tp) {
                            prop_assert!(t != TraceId::INVALID && s != SpanId::INVALID);
                        }
                    }
                    if let Some(host) = h.header("host") {
                        let (name, _) = host_port(host, 80);
                        prop_assert!(name.len() <= host.len());
                    }
                }
                if let Some(st) = parse_status(&data) {
                    prop_assert!(st.head_len.is_none_or(|n| n <= data.len() as u64));
                }
            }

            #[test]
            fn any_text_is_a_traceparent_or_not(v in prop_oneof!["[ -~]{0,80}", "[0-9a-fA-F-]{50,60}", ".{0,60}"], q in ".{0,400}", host in ".{0,40}") {
                if let Some((t, s, _)) = parse_traceparent(&v) {
                    prop_assert!(t != TraceId::INVALID && s != SpanId::INVALID);
                }
                prop_assert!(redact_query(&q).len() <= QUERY_MAX);
                let (name, _) = host_port(&host, 443);
                prop_assert!(name.len() <= host.len());
            }

            /// Requests, writes, responses and work in any order: spans
            /// come out, nothing panics, no more requests stay open than came.
            #[test]
            fn any_sequence_of_records_builds_spans(
                heads in prop::collection::vec(bytes(), 1..6),
                records in prop::collection::vec(record(), 0..40),
                work in prop::collection::vec((0u64..4, 0u64..3_000_000_000), 0..10),
            ) {
                let spans = run(|r, src, ready| {
                    let mut started = 0;
                    for (what, cause, conn, ts, head) in &records {
                        let data = &heads[head.index(heads.len())];
                        let what = match what {
                            0 | 1 => HttpWhat::Request,
                            2 => HttpWhat::Write,
                            _ => HttpWhat::Response,
                        };
                        started += usize::from(what == HttpWhat::Request);
                        let mut rec = http(what, *cause, *conn, *ts, "");
                        rec.data = data.clone();
                        rec.len = data.len() as u32;
                        r.http(&rec, *cause == 3, src, ready);
                        assert!(r.open() <= started);
                    }
                    for (cause, ts) in &work {
                        let _ = r.work(fs(*cause, *ts, ts + 100), src, ready);
                    }
                    r.expire(u64::MAX / 2, src, ready);
                    r.finish_all(src, ready);
                    assert_eq!(r.open(), 0);
                });
                for s in &spans {
                    prop_assert!(s.end_ns >= s.start_ns);
                }
            }
        }
    }
}
