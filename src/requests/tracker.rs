//! The request tracker: each request a process serves, from its head to its
//! end, and the fs/DNS work it caused (the kernel tags each operation with
//! its cause). A request's work is held until the request ends (its response
//! written, the next request on its connection, its process gone, or a
//! quiet period), then its spans are built in one batch
//! ([`super::spans`]). Work that arrives after its request ended still joins
//! its trace (recent requests are remembered). With `--otlp-listen`, a
//! request's spans go to the joiner with the [`RequestKey`] it matches them
//! on. Pure: no kernel, no clock of its own.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::SystemTime;

use opentelemetry::trace::{SpanId, TraceId, TraceState};
use rustc_hash::FxHashMap;

use super::head::{parse_request, parse_status, parse_traceparent, H2Field, Head};
use super::spans::{request_spans, CallSpan};
use crate::events::decode::{DnsRecord, FsRecord, HttpRecord, HttpWhat, Record};
use crate::events::sampler::Sampler;
use crate::events::spans::{build_in, build_into, Parent, Span, SpanContextSource};

/// Operations held per request before they are sent as they come.
const HELD_MAX: usize = 512;
/// Requests held at once before the oldest is sent as it is.
const OPEN_MAX: usize = 8192;
/// Finished requests remembered for work that arrives late.
const RECENT_MAX: usize = 8192;
/// TLS connections whose socket is remembered (all forgotten past it, and
/// learned again at their next write).
const TLS_SOCKETS_MAX: usize = 16384;
/// A request with its response started and no write since: over.
const QUIET_NS: u64 = 1_000_000_000;
/// A request with no response seen: over after this.
pub(super) const NO_RESPONSE_NS: u64 = 30_000_000_000;

/// Whether a request not answered whole is over by now (`now_ns`, kernel
/// time): quiet since its last write or work (`last_ns`), for a while once
/// its response began (`answered`), for long before.
pub fn request_over(now_ns: u64, last_ns: u64, answered: bool) -> bool {
    let quiet = now_ns.saturating_sub(last_ns);
    (answered && quiet >= QUIET_NS) || quiet >= NO_RESPONSE_NS
}

/// What uvspan saw of a request whose SERVER span is the app's.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestKey {
    /// The process as uvspan sees it.
    pub pid: u32,
    /// The process as it sees itself (its SDK's `process.pid`): differs
    /// from `pid` for an app in a PID namespace below uvspan's.
    pub app_pid: u32,
    /// The incoming traceparent's trace and span.
    pub incoming: Option<(TraceId, SpanId)>,
    pub peer_port: Option<u16>,
    pub start: SystemTime,
    pub end: SystemTime,
    /// The span the request's top spans were built under (re-pointed at the
    /// app's SERVER span when joined).
    pub parent: SpanId,
    /// uvspan's own SERVER span of the request, made in case the app's does
    /// not arrive: not sent when it does (one SERVER span per request).
    pub own_server: Option<SpanId>,
}

/// Counters of the request tracker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestStats {
    pub requests: u64,
    /// Requests whose traceparent was malformed (ignored: a new trace).
    pub bad_traceparent: u64,
    /// Requests the sampler dropped (by default: those their caller did not
    /// sample): their spans are not exported.
    pub unsampled: u64,
    /// Requests the sampler dropped, kept by --keep-errors or
    /// --keep-slower-than.
    pub tail_kept: u64,
    /// Operations sent as they came because their request held too many,
    /// or too many requests were open.
    pub not_held: u64,
    /// --sample-time: requests whose end fell past a window's close (not
    /// answered whole by then), dropped, and the operations they held.
    pub straddled: u64,
    pub straddled_ops: u64,
    /// Unsampled requests the kernel followed (metrics only, no record):
    /// in none of the counts above.
    pub followed: u64,
    /// Tail exceptions decided in the kernel: records sent held and not
    /// kept (over uvspan's bounds, or their request's end lost).
    pub tail_lost: u64,
    /// Unsampled HTTP/2 streams the kernel followed whose close never came
    /// (their process exited, or uvspan did, first): not in the metrics.
    pub h2_open_at_end: u64,
    /// Requests ended without their response seen (their process exited,
    /// uvspan stopped, none came in time, too many open).
    pub unanswered: u64,
}

/// An outgoing HTTP call a request (or a task) made.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    /// The connection (HTTP/2: the nghttp2 session).
    pub(crate) conn: u64,
    /// An HTTPS call: the socket its ciphertext went out on (`conn` is the
    /// TLS connection), where its response comes back.
    pub(crate) stream: Option<u64>,
    pub(super) start_ns: u64,
    pub(crate) end_ns: Option<u64>,
    pub(super) head: Head,
    pub(super) status: Option<u16>,
    pub(crate) tls: bool,
    /// An HTTP/2 call: its stream on the session.
    pub(crate) h2_stream: Option<i32>,
    /// A gRPC call's `grpc-status` (its response's headers or trailers).
    pub(super) grpc_status: Option<u8>,
    /// Made by a process that runs the OpenTelemetry SDK (whose own CLIENT
    /// span the traceparent it wrote names).
    pub(super) app_sdk: bool,
}

/// A request in progress (what the span builder reads is `pub(super)`).
#[derive(Clone, Debug)]
pub(super) struct Request {
    pid: u32,
    pub(super) tid: u32,
    conn: u64,
    pub(super) start_ns: u64,
    pub(super) last_ns: u64,
    pub(super) head: Head,
    pub(super) tls: bool,
    pub(super) peer: Option<SocketAddr>,
    pub(super) local_port: Option<u16>,
    /// The SERVER span's id (also the parent of the request's work).
    pub(super) span_id: SpanId,
    /// From an incoming traceparent: (trace, parent span, sampled).
    pub(super) incoming: Option<(TraceId, SpanId, bool)>,
    pub(super) state: TraceState,
    /// Learned from an outgoing traceparent the app wrote (no incoming one).
    adopted: Option<TraceId>,
    /// --publish-trace-context: its ids are the ones profiles carry (never
    /// another trace adopted).
    publish: bool,
    own_trace: TraceId,
    pub(super) status: Option<u16>,
    response_conn: Option<u64>,
    /// Bytes the response takes (head + body), when it says.
    response_total: Option<u64>,
    response_written: u64,
    pub(super) held: Vec<Record>,
    pub(super) calls: Vec<Call>,
    /// uvspan makes the SERVER span (not the app's SDK).
    pub(super) server_span: bool,
    /// HTTP/2: its traceparent was counted malformed.
    bad_traceparent: bool,
    /// A gRPC call's `grpc-status`.
    pub(super) grpc_status: Option<u8>,
    /// The kernel's sampler dropped it (`CAUSE_DROP`): its work sent no record.
    kernel_dropped: bool,
    /// Ended before its response was seen: how ([`Unanswered`]), and
    /// when (its SERVER span's end).
    pub(super) unanswered: Option<(Unanswered, u64)>,
}

/// How a request whose response uvspan never saw was ended: its span then
/// lasts until then (at least its last work), says so
/// (`uvspan.http.ended_by`), and is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unanswered {
    /// Its process exited first.
    ProcessExit,
    /// uvspan stopped first.
    Stopped,
    /// No response for [`NO_RESPONSE_NS`].
    NoResponse,
    /// More requests were open than uvspan keeps: the oldest went.
    Evicted,
    /// Its connection began another request (or its stream's memory came
    /// back as a new connection's): it was gone by then.
    NextRequest,
}

impl Unanswered {
    pub fn as_str(self) -> &'static str {
        match self {
            Unanswered::ProcessExit => "process_exit",
            Unanswered::Stopped => "uvspan_stopped",
            Unanswered::NoResponse => "no_response",
            Unanswered::Evicted => "evicted",
            Unanswered::NextRequest => "next_request",
        }
    }
}

impl Call {
    /// A call whose request `r` wrote (`head`: its request's head), not
    /// answered yet.
    pub(crate) fn new(r: &HttpRecord, head: Head, tls: bool, h2_stream: Option<i32>, app_sdk: bool) -> Call {
        let (conn, start_ns) = (r.conn, r.ts_ns);
        Call { conn, stream: None, start_ns, end_ns: None, head, status: None, tls, h2_stream, grpc_status: None, app_sdk }
    }

    /// An HTTP/1 call still waiting for its response on `conn` (its
    /// connection, or an HTTPS call's socket).
    pub(crate) fn waits_on(&self, conn: u64) -> bool {
        self.h2_stream.is_none() && (self.conn == conn || self.stream == Some(conn)) && self.end_ns.is_none()
    }

    /// Its HTTP/1 response, parsed (`r`).
    pub(crate) fn answered(&mut self, r: &HttpRecord) {
        self.end_ns = Some(r.ts_ns);
        self.status = parse_status(&r.data).map(|s| s.status);
    }

    /// Whether `r` is a record of this HTTP/2 stream.
    pub(crate) fn is_stream_of(&self, r: &HttpRecord) -> bool {
        self.h2_stream == Some(r.stream) && self.conn == r.conn
    }

    /// An HTTP/2 stream's response record: its `:status`, `grpc-status`,
    /// its end (the first one seen: the response's last frame, or a reset).
    pub(crate) fn h2_record(&mut self, r: &HttpRecord) {
        if r.what == HttpWhat::Http2Close {
            self.end_ns.get_or_insert(r.ts_ns);
            return;
        }
        match Head::h2().apply_h2(&r.data) {
            H2Field::Status(code) => self.status = Some(code),
            H2Field::GrpcStatus(code) => self.grpc_status = Some(code),
            _ => {}
        }
    }

    /// When it ended: at its response, or (none seen) with its caller.
    fn end_or(&self, caller_end: u64) -> u64 {
        self.end_ns.unwrap_or(caller_end.max(self.start_ns))
    }

    /// The app's SDK exporting its telemetry ([`Head::is_otlp_export`]): no CLIENT span.
    pub(crate) fn is_otlp_export(&self) -> bool {
        self.head.is_otlp_export()
    }

    /// What its CLIENT span is made of (unanswered: ended with its caller).
    pub(crate) fn span_parts(&self, caller_end: u64) -> CallSpan<'_> {
        CallSpan {
            head: &self.head,
            tls: self.tls,
            h2: self.h2_stream.is_some(),
            status: self.status,
            grpc_status: self.grpc_status,
            times: (self.start_ns, self.end_or(caller_end)),
        }
    }

    /// As the metrics see it (unanswered: ended with its caller).
    pub(crate) fn finished(&self, caller_end: u64) -> FinishedCall {
        let mut f = FinishedCall::of(&self.head, self.tls, self.status, (self.start_ns, self.end_or(caller_end)));
        if let Some(rpc) = f.rpc.as_mut() {
            rpc.1 = self.grpc_status;
        }
        f
    }
}

impl Request {
    /// An outgoing call it made (`r`: its request's record); an app that
    /// writes a traceparent (its SDK) says which trace the request is in.
    fn call(&mut self, r: &HttpRecord, head: Head, tls: bool, h2_stream: Option<i32>, app_sdk: bool) {
        if self.incoming.is_none() && self.adopted.is_none() && !self.publish {
            self.adopted = head.header("traceparent").and_then(parse_traceparent).map(|t| t.0);
        }
        self.calls.push(Call::new(r, head, tls, h2_stream, app_sdk));
    }

    pub(super) fn trace_id(&self) -> TraceId {
        self.incoming.map(|i| i.0).or(self.adopted).unwrap_or(self.own_trace)
    }

    /// The sampler's decision for the request's trace (with its caller's
    /// flag when the sampler is parent-based).
    fn sampled(&self, s: &Sampler) -> bool {
        !self.kernel_dropped && s.keeps(self.incoming.map(|i| i.2), self.trace_id())
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
    /// (pid, server connection) -> its pipelined requests still open, in
    /// the order they came (their responses come in that order). Only
    /// connections that pipelined have one.
    pipelines: FxHashMap<(u32, u64), VecDeque<u64>>,
    /// An HTTPS call's request just written (pid, thread, cause, TLS
    /// connection, the request whose call it is): the next write of that
    /// thread and cause is its ciphertext, on its socket.
    tls_call: Option<(u32, u32, u64, u64, u64)>,
    /// (pid, TLS connection, or the socket its ciphertext went out on) ->
    /// the request whose call on it is not answered yet (HTTP/1 clients
    /// send one at a time).
    tls_calls: FxHashMap<(u32, u64), u64>,
    /// The last TLS write (pid, thread, TLS connection): the next write of
    /// that thread is its ciphertext, on the connection's socket.
    tls_last: Option<(u32, u32, u64)>,
    /// (pid, TLS connection) -> its socket (a server's responses go to
    /// the requests pipelined on the socket, in order).
    tls_sockets: FxHashMap<(u32, u64), u64>,
    recent: FxHashMap<u64, (u32, Parent, Option<RequestKey>)>,
    recent_order: VecDeque<u64>,
    /// A SERVER span per request also where the app's SDK makes its own.
    always_server_spans: bool,
    /// --publish-trace-context: requests' ids from their cause (see
    /// [`crate::events::sampler::ContextKey`]), and always a SERVER span of uvspan's.
    pub publish: Option<crate::events::sampler::ContextKey>,
    /// --otlp-listen: the spans of requests whose SERVER span is the app's
    /// go to `joinable` (with what identifies the request), not `ready`.
    join: bool,
    pub joinable: Vec<(RequestKey, Vec<Span>)>,
    pub stats: RequestStats,
    /// Every finished request, sampled or not (for the metrics; taken by
    /// the caller), when asked for.
    pub finished: Option<Vec<Finished>>,
    /// Requests the sampler dropped that are kept anyway.
    pub tail: Tail,
}

/// Tail exceptions to the trace sampler (`--keep-errors`,
/// `--keep-slower-than`): decided when a request ends, from what it held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tail {
    pub errors: bool,
    pub slower_than_ns: Option<u64>,
}

impl Tail {
    fn keeps(&self, req: &Request) -> bool {
        (self.errors && req.status.is_some_and(|s| s >= 500))
            || self.slower_than_ns.is_some_and(|t| req.last_ns.saturating_sub(req.start_ns) > t)
    }
}

/// A finished request as the metrics see it (sampled or not).
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    pub pid: u32,
    pub method: String,
    pub status: Option<u16>,
    pub tls: bool,
    pub version: &'static str,
    /// `url.template` of its path; `None` for gRPC calls (named by their method).
    pub template: Option<String>,
    /// A gRPC call: `rpc.method` (`package.Service/Method`) and its grpc-status.
    pub rpc: Option<(String, Option<u8>)>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub calls: Vec<FinishedCall>,
}

/// An outgoing call of a finished request.
#[derive(Clone, Debug, PartialEq)]
pub struct FinishedCall {
    pub method: String,
    pub status: Option<u16>,
    pub tls: bool,
    /// From its Host header.
    pub server: Option<(String, u16)>,
    /// `url.template` of its path; `None` for gRPC calls.
    pub template: Option<String>,
    /// A gRPC call: `rpc.method` and its grpc-status.
    pub rpc: Option<(String, Option<u8>)>,
    pub start_ns: u64,
    pub end_ns: u64,
}

impl FinishedCall {
    /// A call from its request's head (the server from its Host header).
    pub fn of(head: &Head, tls: bool, status: Option<u16>, (start_ns, end_ns): (u64, u64)) -> FinishedCall {
        FinishedCall {
            method: head.method.to_string(),
            status,
            tls,
            server: head.header("host").map(|h| {
                let (name, port) = super::head::host_port(h, if tls { 443 } else { 80 });
                (name.to_string(), port)
            }),
            template: super::template::of_head(head),
            rpc: head.grpc().map(|(s, m)| (format!("{s}/{m}"), None)),
            start_ns,
            end_ns,
        }
    }
}

impl Finished {
    fn of(req: &Request) -> Finished {
        let calls = req.calls.iter().map(|c| c.finished(req.last_ns)).collect();
        Finished {
            pid: req.pid,
            method: req.head.method.to_string(),
            status: req.status,
            tls: req.tls,
            version: req.head.version,
            template: super::template::of_head(&req.head),
            rpc: req.head.grpc().map(|(s, m)| (format!("{s}/{m}"), req.grpc_status)),
            start_ns: req.start_ns,
            end_ns: req.last_ns,
            calls,
        }
    }
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
            pipelines: FxHashMap::default(),
            tls_call: None,
            tls_calls: FxHashMap::default(),
            tls_last: None,
            tls_sockets: FxHashMap::default(),
            recent: FxHashMap::default(),
            recent_order: VecDeque::new(),
            always_server_spans,
            join: false,
            joinable: Vec::new(),
            stats: RequestStats::default(),
            finished: None,
            tail: Tail::default(),
            publish: None,
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

    /// Whether an HTTP record of a task's cause is a request's HTTPS
    /// call's: its SSL_write retried (node retries one the handshake held
    /// back in whichever callback runs next), the ciphertext that follows,
    /// or its response (read under the cause of that last write).
    pub fn claims(&self, r: &HttpRecord) -> bool {
        match r.what {
            HttpWhat::Write if r.tls => self.tls_calls.contains_key(&(r.pid, r.conn)),
            HttpWhat::Write => self.tls_call.is_some_and(|c| (c.0, c.1, c.2) == (r.pid, r.tid, r.cause)),
            HttpWhat::Response => self.tls_calls.contains_key(&(r.pid, r.conn)),
            _ => false,
        }
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
            HttpWhat::Request | HttpWhat::Pipelined => {
                self.start(r, !app_sdk || self.always_server_spans || self.join || self.publish.is_some(), src, ready)
            }
            HttpWhat::Write => {
                let target = self.response_target(r);
                self.write(r, target, app_sdk, src, ready);
            }
            HttpWhat::Response => self.response(r),
            // An outgoing HTTP/2 stream's records (its caller's cause).
            HttpWhat::Http2Client => self.h2_call(r, app_sdk),
            HttpWhat::Http2Header | HttpWhat::Http2Close if r.stream != 0 => self.h2_call_response(r),
            HttpWhat::Http2Header => self.h2_header(r, !app_sdk || self.always_server_spans || self.join, src, ready),
            HttpWhat::Http2Close => {
                if let Some(req) = self.open.get_mut(&r.cause) {
                    req.last_ns = req.last_ns.max(r.ts_ns);
                }
                self.finish(r.cause, src, ready);
            }
            // The held records' verdict (the agent's, see held.rs); a
            // database connection's bytes (db::live's).
            HttpWhat::Tail | HttpWhat::WireWrite | HttpWhat::WireRead => {}
        }
    }

    /// An HTTP/2 stream's header: its first starts its request (streams
    /// share a connection: none ends another), the others fill its head,
    /// `:status` is its response's.
    fn h2_header(&mut self, r: &HttpRecord, server_span: bool, src: &SpanContextSource<'_>, ready: &mut Ready) {
        if !self.open.contains_key(&r.cause) {
            // A response to a stream whose request was not seen (or is over).
            if super::head::split_h2(&r.data).is_some_and(|(n, _)| n == ":status") || self.recent.contains_key(&r.cause) {
                return;
            }
            let req = self.new_request(r, Head::h2(), None, TraceState::NONE, server_span, src);
            self.insert(r.cause, req, src, ready);
        }
        let Some(req) = self.open.get_mut(&r.cause) else { return };
        req.last_ns = req.last_ns.max(r.ts_ns);
        // The kernel decides a stream as a root at its first header, and
        // again at its traceparent.
        req.kernel_dropped = r.dropped;
        match req.head.apply_h2(&r.data) {
            H2Field::Status(code) => req.status = Some(code),
            H2Field::GrpcStatus(code) => req.grpc_status = Some(code),
            H2Field::Request => {
                req.tls = req.head.header(":scheme") == Some("https");
                let tp = req.head.header("traceparent");
                let incoming = tp.and_then(parse_traceparent);
                if tp.is_some() && incoming.is_none() && req.incoming.is_none() && !req.bad_traceparent {
                    req.bad_traceparent = true;
                    self.stats.bad_traceparent += 1;
                }
                req.incoming = incoming;
                req.state = match (incoming, req.head.header("tracestate")) {
                    (Some(_), Some(ts)) => ts.parse().unwrap_or_default(),
                    _ => TraceState::NONE,
                };
            }
            H2Field::Other => {}
        }
    }

    /// An outgoing HTTP/2 stream's request headers: a call of its caller's
    /// request, if still open; an app that writes a traceparent says which
    /// trace the request is in, as on HTTP/1.
    fn h2_call(&mut self, r: &HttpRecord, app_sdk: bool) {
        let Some(req) = self.open.get_mut(&r.cause) else { return };
        req.last_ns = req.last_ns.max(r.ts_ns);
        if req.calls.iter().any(|c| c.h2_stream == Some(r.stream) && c.conn == r.conn) {
            return;
        }
        let head = Head::h2_request(&r.data);
        let tls = head.header(":scheme") == Some("https");
        req.call(r, head, tls, Some(r.stream), app_sdk);
    }

    /// An outgoing HTTP/2 stream's response: its `:status`, `grpc-status`,
    /// its end (the first one seen: the response's last frame, or a reset).
    fn h2_call_response(&mut self, r: &HttpRecord) {
        let Some(req) = self.open.get_mut(&r.cause) else { return };
        let Some(call) = req.calls.iter_mut().find(|c| c.is_stream_of(r)) else { return };
        call.h2_record(r);
        req.last_ns = req.last_ns.max(r.ts_ns);
    }

    fn start(&mut self, r: &HttpRecord, server_span: bool, src: &SpanContextSource<'_>, ready: &mut Ready) {
        // Keep-alive: the previous request on the connection is over, but
        // one a pipelined request came behind (in the same bytes): that one
        // waits for its response, which comes first. (An unknown
        // connection, 0: a socket that reached the server without a libuv
        // stream callback, says nothing about other requests.)
        if r.conn != 0 {
            let key = (r.pid, r.conn);
            let prev = self.by_conn.insert(key, r.cause).filter(|p| *p != r.cause);
            if let Some(prev) = prev {
                if r.what == HttpWhat::Pipelined {
                    let queue = self.pipelines.entry(key).or_default();
                    if queue.is_empty() && self.open.contains_key(&prev) {
                        queue.push_back(prev);
                    }
                    queue.push_back(r.cause);
                } else {
                    self.end_unanswered(prev, Unanswered::NextRequest, r.ts_ns);
                    self.finish(prev, src, ready);
                    for c in self.pipelines.remove(&key).unwrap_or_default() {
                        self.end_unanswered(c, Unanswered::NextRequest, r.ts_ns);
                        self.finish(c, src, ready);
                    }
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
        let mut req = self.new_request(r, head, incoming, state, server_span, src);
        if r.what == HttpWhat::Pipelined && req.peer.is_none() {
            // The kernel reads the peer at a connection's first request.
            if let Some(prev) = self.pipelines.get(&(r.pid, r.conn)).and_then(|q| q.front()).and_then(|c| self.open.get(c)) {
                (req.peer, req.local_port) = (prev.peer, prev.local_port);
            }
        }
        self.insert(r.cause, req, src, ready);
    }

    /// A request from its first record.
    fn new_request(
        &mut self,
        r: &HttpRecord,
        head: Head,
        incoming: Option<(TraceId, SpanId, bool)>,
        state: TraceState,
        server_span: bool,
        src: &SpanContextSource<'_>,
    ) -> Request {
        self.stats.requests += 1;
        Request {
            pid: r.pid,
            tid: r.tid,
            conn: r.conn,
            start_ns: r.ts_ns,
            last_ns: r.ts_ns,
            head,
            tls: r.tls,
            peer: r.peer,
            local_port: r.local_port,
            span_id: self.publish.map_or_else(|| src.ids.new_span_id(), |k| k.span_id(r.cause)),
            incoming,
            state,
            adopted: None,
            own_trace: self.publish.map_or_else(|| src.trace_for(r.cause), |k| k.trace_id(r.cause)),
            publish: self.publish.is_some(),
            status: None,
            response_conn: None,
            response_total: None,
            response_written: 0,
            // An fs read and a DNS lookup or two: one allocation, not grown.
            held: Vec::with_capacity(8),
            calls: Vec::new(),
            server_span,
            bad_traceparent: false,
            grpc_status: None,
            kernel_dropped: r.dropped,
            unanswered: None,
        }
    }

    /// A request open from now on (the oldest sent as it is past OPEN_MAX).
    fn insert(&mut self, cause: u64, req: Request, src: &SpanContextSource<'_>, ready: &mut Ready) {
        let start_ns = req.start_ns;
        self.open.insert(cause, req);
        self.order.push_back(cause);
        while self.open.len() > OPEN_MAX {
            let Some(oldest) = self.order.pop_front() else { break };
            if self.open.contains_key(&oldest) {
                self.stats.not_held += 1;
                self.end_unanswered(oldest, Unanswered::Evicted, start_ns);
                self.finish(oldest, src, ready);
            }
        }
    }

    /// The request a write belongs to: its cause's, but on a connection
    /// that pipelined, the first request there not answered yet (a
    /// response's head) or still being answered (its body). Node writes a
    /// pipelined request's response once the one before it is done, from
    /// whichever callback finished that one.
    fn response_target(&self, r: &HttpRecord) -> u64 {
        // A TLS write's connection is the TLS one; requests are the socket's.
        let conn = if r.tls { self.tls_sockets.get(&(r.pid, r.conn)).copied().unwrap_or(r.conn) } else { r.conn };
        let Some(queue) = self.pipelines.get(&(r.pid, conn)) else { return r.cause };
        let head = parse_status(&r.data).is_some();
        let waiting =
            |c: &&u64| self.open.get(*c).is_some_and(|q| if head { q.status.is_none() } else { q.status.is_some() && !q.complete() });
        queue.iter().find(waiting).copied().unwrap_or(r.cause)
    }

    fn write(&mut self, r: &HttpRecord, target: u64, app_sdk: bool, src: &SpanContextSource<'_>, ready: &mut Ready) {
        if r.tls {
            self.tls_last = Some((r.pid, r.tid, r.conn));
        } else if let Some((.., tls)) = self.tls_last.take().filter(|l| (l.0, l.1) == (r.pid, r.tid)) {
            if self.tls_sockets.len() >= TLS_SOCKETS_MAX {
                self.tls_sockets.clear();
            }
            self.tls_sockets.insert((r.pid, tls), r.conn);
        }
        // node encrypts a TLS write at once (SSL_write, then the socket
        // write of its ciphertext, on the same thread in the same call):
        // an HTTPS call's socket, where its response is parsed.
        if let Some((.., tls_conn, owner)) = self.tls_call.take().filter(|c| !r.tls && (c.0, c.1, c.2) == (r.pid, r.tid, r.cause)) {
            let call = self
                .open
                .get_mut(&owner)
                .and_then(|q| q.calls.iter_mut().rev().find(|c| c.tls && c.h2_stream.is_none() && c.conn == tls_conn));
            if let Some(c) = call {
                c.stream = Some(r.conn);
                // Its response is read there, maybe under this write's
                // cause (a retry in another request's callback).
                self.tls_calls.insert((r.pid, r.conn), owner);
            }
            return;
        }
        // node retries an SSL_write the handshake held back, in whichever
        // callback runs next (another request's, too): a request written
        // on a TLS connection whose call is unanswered is that call, its
        // socket learned again from the ciphertext that follows.
        if r.tls && parse_request(&r.data).is_some() {
            if let Some(&owner) = self.tls_calls.get(&(r.pid, r.conn)) {
                let call = self
                    .open
                    .get_mut(&owner)
                    .and_then(|q| q.calls.iter_mut().find(|c| c.tls && c.h2_stream.is_none() && c.conn == r.conn && c.end_ns.is_none()));
                if let Some(c) = call {
                    c.stream = None;
                    self.tls_call = Some((r.pid, r.tid, r.cause, r.conn, owner));
                    return;
                }
                self.tls_calls.remove(&(r.pid, r.conn));
            }
        }
        let Some(req) = self.open.get_mut(&target) else { return };
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
                req.call(r, head, r.tls, None, app_sdk);
                if r.tls {
                    self.tls_calls.insert((r.pid, r.conn), target);
                    self.tls_call = Some((r.pid, r.tid, r.cause, r.conn, target));
                }
                return;
            }
        }
        if req.response_conn == Some(r.conn) {
            req.response_written += u64::from(r.len);
            if req.complete() {
                self.finish(target, src, ready);
            }
        }
    }

    fn response(&mut self, r: &HttpRecord) {
        let waits = |c: &Call| c.waits_on(r.conn);
        // An HTTPS call's response is read under the cause of the last
        // write on its socket: another request's, when that request's
        // callback retried the call's SSL_write.
        let mine = self.open.get(&r.cause).is_some_and(|q| q.calls.iter().any(waits));
        let target = if mine { r.cause } else { self.tls_calls.get(&(r.pid, r.conn)).copied().unwrap_or(r.cause) };
        let Some(req) = self.open.get_mut(&target) else { return };
        req.last_ns = r.ts_ns;
        if let Some(call) = req.calls.iter_mut().find(|c| waits(c)) {
            call.answered(r);
            if call.tls {
                self.tls_calls.remove(&(r.pid, call.conn));
                self.tls_calls.remove(&(r.pid, r.conn));
            }
        }
    }

    /// An fs or DNS record: held with its request, sent under it if the
    /// request is over, or given back (no cause known: its own trace).
    pub fn work(&mut self, rec: Record, src: &SpanContextSource<'_>, ready: &mut Ready) -> Option<Record> {
        let (cause, pid, end) = match &rec {
            Record::Fs(FsRecord { op, .. }) | Record::Dns(DnsRecord { op, .. }) => (op.cause, op.pid, op.end_ns),
            Record::Db(r) => (r.cause, r.pid, r.end_ns),
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
            if req.sampled(&src.sampler) {
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
        let over: Vec<u64> =
            self.open.iter().filter(|(_, r)| request_over(now_ns, r.last_ns, r.status.is_some())).map(|(c, _)| *c).collect();
        for c in over {
            self.end_unanswered(c, Unanswered::NoResponse, now_ns);
            self.finish(c, src, ready);
        }
    }

    /// A request not answered (no status seen) ends `how`, at `at_ns` (or
    /// its last work, if later): unanswered that long, not 0 ms.
    fn end_unanswered(&mut self, cause: u64, how: Unanswered, at_ns: u64) {
        if let Some(req) = self.open.get_mut(&cause).filter(|r| r.status.is_none()) {
            // The span's end only: the metrics and the tail rule keep its
            // last work, as the kernel does for the requests it follows.
            req.unanswered = Some((how, req.last_ns.max(at_ns)));
            self.stats.unanswered += 1;
        }
    }

    /// A process exited (at `at_ns`): its requests are over.
    pub fn exited(&mut self, pid: u32, at_ns: u64, src: &SpanContextSource<'_>, ready: &mut Ready) {
        let mine: Vec<u64> = self.open.iter().filter(|(_, r)| r.pid == pid).map(|(c, _)| *c).collect();
        for c in mine {
            self.end_unanswered(c, Unanswered::ProcessExit, at_ns);
            self.finish(c, src, ready);
        }
        self.by_conn.retain(|(p, _), _| *p != pid);
        self.pipelines.retain(|(p, _), _| *p != pid);
    }

    /// --sample-time: the probes stopped (every record of the window is
    /// handled). A request not answered whole by then has its end past the
    /// edge: dropped with the work it held, counted. One whose response
    /// started without saying its length stays, to be over after a quiet
    /// period (ended by its last write seen).
    pub fn window_closed(&mut self) {
        let cut: Vec<u64> = self.open.iter().filter(|(_, r)| r.status.is_none() || r.response_total.is_some()).map(|(c, _)| *c).collect();
        for c in cut {
            let Some(req) = self.open.remove(&c) else { continue };
            if self.by_conn.get(&(req.pid, req.conn)) == Some(&c) {
                self.by_conn.remove(&(req.pid, req.conn));
            }
            self.unqueue(req.pid, req.conn, c);
            self.stats.straddled += 1;
            self.stats.straddled_ops += req.held.len() as u64;
        }
    }

    /// Everything still open (uvspan is stopping, at `now_ns`).
    pub fn finish_all(&mut self, now_ns: u64, src: &SpanContextSource<'_>, ready: &mut Ready) {
        let all: Vec<u64> = self.open.keys().copied().collect();
        for c in all {
            self.end_unanswered(c, Unanswered::Stopped, now_ns);
            self.finish(c, src, ready);
        }
    }

    /// A request over: out of its connection's pipeline.
    fn unqueue(&mut self, pid: u32, conn: u64, cause: u64) {
        if let Some(queue) = self.pipelines.get_mut(&(pid, conn)) {
            queue.retain(|c| *c != cause);
            if queue.is_empty() {
                self.pipelines.remove(&(pid, conn));
            }
        }
    }

    /// A request is over: its spans, and its context kept for late work.
    fn finish(&mut self, cause: u64, src: &SpanContextSource<'_>, ready: &mut Ready) {
        let Some(mut req) = self.open.remove(&cause) else { return };
        if self.by_conn.get(&(req.pid, req.conn)) == Some(&cause) {
            self.by_conn.remove(&(req.pid, req.conn));
        }
        for c in req.calls.iter().filter(|c| c.tls && c.end_ns.is_none()) {
            if self.tls_calls.get(&(req.pid, c.conn)) == Some(&cause) {
                self.tls_calls.remove(&(req.pid, c.conn));
            }
        }
        self.unqueue(req.pid, req.conn, cause);
        if let Some(f) = self.finished.as_mut() {
            f.push(Finished::of(&req));
        }
        let parent = req.parent();
        let mut sampled = req.sampled(&src.sampler);
        if !sampled && self.tail.keeps(&req) {
            sampled = true;
            self.stats.tail_kept += 1;
        }
        if !sampled {
            self.stats.unsampled += 1;
        }
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
        let mut joined = Vec::new();
        // Built into the process's list itself (no list per request), but
        // for the joiner, which takes them per request.
        let spans = match key {
            Some(_) => &mut joined,
            None => ready.entry(req.pid).or_default(),
        };
        request_spans(&mut req, &parent, src, spans);
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
        None => {
            build_into(rec, src, Some(parent), ready.entry(pid).or_default());
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, SpanKind, TraceId};

    use super::*;
    use crate::events::spans::Value;
    use crate::requests::testing::{attr, fs, http, run, TP};

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
            r.finish_all(0, src, ready);
            assert_eq!(r.stats.bad_traceparent, 1);
            assert_eq!(r.stats.unsampled, 1);
        });
        assert_eq!(spans.len(), 3, "request 1, its stat, its late stat; nothing of the unsampled request 2");
        let t = spans[0].span_context.trace_id();
        assert!(spans.iter().all(|s| s.span_context.trace_id() == t));
        assert_eq!(spans[0].parent_span_id, SpanId::INVALID, "a malformed traceparent is ignored: a new trace");
        assert_eq!(attr(&spans[0], "uvspan.http.response_seen"), Some(&Value::Bool(false)));
    }

    /// A request whose response was never seen lasts until its process
    /// exited (or uvspan stopped), says how it ended, and is counted: never
    /// a 0 ms span.
    #[test]
    fn unanswered_requests_end_where_they_were_given_up() {
        let spans = run(|r, src, ready| {
            r.http(&http(HttpWhat::Request, 1, 100, 1_000, "GET /a HTTP/1.1\r\n\r\n"), false, src, ready);
            r.http(&http(HttpWhat::Request, 2, 200, 1_500, "GET /b HTTP/1.1\r\n\r\n"), false, src, ready);
            r.http(&http(HttpWhat::Write, 2, 200, 1_600, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"), false, src, ready);
            r.exited(7, 9_000, src, ready);
            assert_eq!(r.stats.unanswered, 1, "request 2 was answered");
        });
        let a = spans.iter().find(|s| attr(s, "url.path") == Some(&Value::from("/a"))).expect("request /a");
        assert_eq!(a.end_ns - a.start_ns, 8_000, "until its process exited");
        assert_eq!(attr(a, "uvspan.http.response_seen"), Some(&Value::Bool(false)));
        assert_eq!(attr(a, "uvspan.http.ended_by"), Some(&Value::from("process_exit")));
        let b = spans.iter().find(|s| attr(s, "url.path") == Some(&Value::from("/b"))).expect("request /b");
        assert_eq!(attr(b, "uvspan.http.ended_by"), None);
    }

    #[test]
    fn requests_on_unknown_connections_do_not_end_each_other() {
        let spans = run(|r, src, ready| {
            r.http(&http(HttpWhat::Request, 1, 0, 1_000, "GET /a HTTP/1.1\r\n\r\n"), false, src, ready);
            r.http(&http(HttpWhat::Request, 2, 0, 1_500, "GET /b HTTP/1.1\r\n\r\n"), false, src, ready);
            assert_eq!(r.open(), 2, "both still open");
            r.work(fs(1, 2_000, 2_100), src, ready);
            r.finish_all(0, src, ready);
        });
        assert_eq!(spans.len(), 3);
        assert_eq!(spans.iter().filter(|s| s.parent_span_id != SpanId::INVALID).count(), 1, "request 1's stat under it");
    }

    #[test]
    fn with_the_apps_sdk_work_hangs_under_the_incoming_parent() {
        let spans = run(|r, src, ready| {
            r.http(&http(HttpWhat::Request, 1, 100, 1_000, &format!("GET / HTTP/1.1\r\ntraceparent: {TP}\r\n\r\n")), true, src, ready);
            r.work(fs(1, 1_100, 1_200), src, ready);
            r.exited(7, 0, src, ready);
        });
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].parent_span_id, SpanId::from_hex("b7ad6b7169203331").unwrap());
        assert!(spans[0].parent_span_is_remote);
    }

    /// HTTP/2: streams of one session (connection) interleave; each is a
    /// request of its own from its first header, its :status from the
    /// response, over at its close; a malformed traceparent is counted once.
    #[test]
    fn http2_streams_of_one_session_are_requests_of_their_own() {
        let h = |cause: u64, ts: u64, name: &str, value: &str| http(HttpWhat::Http2Header, cause, 100, ts, &format!("{name}\0{value}"));
        let spans = run(|r, src, ready| {
            for (cause, path) in [(1, "/a?token=x"), (2, "/b")] {
                r.http(&h(cause, 1_000 + cause, ":method", "POST"), false, src, ready);
                r.http(&h(cause, 1_010, ":path", path), false, src, ready);
                r.http(&h(cause, 1_020, ":scheme", "https"), false, src, ready);
                r.http(&h(cause, 1_030, ":authority", "api.example:8443"), false, src, ready);
            }
            r.http(&h(1, 1_040, "traceparent", TP), false, src, ready);
            r.http(&h(2, 1_040, "traceparent", "nonsense"), false, src, ready);
            r.http(&h(2, 1_041, "user-agent", "curl/8"), false, src, ready);
            assert_eq!(r.open(), 2, "streams of one session do not end each other");
            r.work(fs(2, 1_100, 1_200), src, ready);
            r.work(fs(1, 1_100, 1_300), src, ready);
            r.http(&h(2, 1_400, ":status", "502"), false, src, ready);
            r.http(&http(HttpWhat::Http2Close, 2, 100, 1_500, ""), false, src, ready);
            assert_eq!(r.open(), 1);
            r.http(&h(1, 1_600, ":status", "200"), false, src, ready);
            r.http(&http(HttpWhat::Http2Close, 1, 100, 1_700, ""), false, src, ready);
            // A response to a stream not seen: no request.
            r.http(&h(3, 1_800, ":status", "200"), false, src, ready);
            // Late work of stream 1 joins it.
            assert!(r.work(fs(1, 1_800, 1_900), src, ready).is_none());
            assert_eq!(r.open(), 0);
            assert_eq!((r.stats.requests, r.stats.bad_traceparent), (2, 1));
        });
        assert_eq!(spans.len(), 5, "2 SERVER spans, 3 stats");
        let server = |path: &'static str| spans.iter().find(|s| attr(s, "url.path") == Some(&Value::from(path))).unwrap();
        let (a, b) = (server("/a"), server("/b"));
        assert_eq!(a.span_context.trace_id(), TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap());
        assert_eq!(a.parent_span_id, SpanId::from_hex("b7ad6b7169203331").unwrap());
        assert_eq!(b.parent_span_id, SpanId::INVALID, "a malformed traceparent: a trace of its own");
        assert_eq!((a.name.as_ref(), a.start_ns, a.end_ns), ("POST /a", 1_001, 1_700), "from its first header to its close");
        assert_eq!((b.start_ns, b.end_ns), (1_002, 1_500));
        assert_eq!(attr(a, "network.protocol.version"), Some(&Value::from("2")));
        assert_eq!(attr(a, "url.scheme"), Some(&Value::from("https")));
        assert_eq!(attr(a, "url.query"), Some(&Value::from("token=REDACTED")));
        assert_eq!(attr(a, "server.address"), Some(&Value::from("api.example")));
        assert_eq!(attr(a, "http.response.status_code"), Some(&Value::I64(200)));
        assert_eq!(attr(b, "http.response.status_code"), Some(&Value::I64(502)));
        assert_eq!(attr(b, "user_agent.original"), Some(&Value::from("curl/8")));
        assert!(matches!(b.status, opentelemetry::trace::Status::Error { .. }));
        for (cause, srv, n) in [(1, a, 2), (2, b, 1)] {
            let under = spans.iter().filter(|s| s.parent_span_id == srv.span_context.span_id()).count();
            assert_eq!(under, n, "stream {cause}'s stats under it");
        }
    }

    /// Three requests pipelined in one read: each its own request, none
    /// ended by the next; their responses, written in order from whichever
    /// callback (here all from the first's), go to them in that order; the
    /// next request that is not pipelined ends whatever is left.
    #[test]
    fn pipelined_requests_take_their_responses_in_order() {
        let ok = |body: &str| format!("HTTP/1.1 {body} X\r\nContent-Length: 2\r\n\r\nok");
        let spans = run(|r, src, ready| {
            r.http(&http(HttpWhat::Request, 1, 100, 1_000, "GET /a HTTP/1.1\r\n\r\n"), false, src, ready);
            r.http(&http(HttpWhat::Pipelined, 2, 100, 1_010, "GET /b HTTP/1.1\r\n\r\n"), false, src, ready);
            r.http(&http(HttpWhat::Pipelined, 3, 100, 1_020, "GET /c HTTP/1.1\r\n\r\n"), false, src, ready);
            assert_eq!(r.open(), 3, "pipelined requests do not end each other");
            for c in 1..=3 {
                r.work(fs(c, 1_100, 1_200 + c), src, ready);
            }
            // Response /b's head and body in two writes, all from cause 1.
            r.http(&http(HttpWhat::Write, 1, 100, 2_000, &ok("200")), false, src, ready);
            r.http(&http(HttpWhat::Write, 1, 100, 2_100, "HTTP/1.1 404 X\r\nContent-Length: 4\r\n\r\nno"), false, src, ready);
            r.http(&http(HttpWhat::Write, 1, 100, 2_150, "ne"), false, src, ready);
            assert_eq!(r.open(), 1, "/a and /b answered whole");
            // A write on another connection is not the pipeline's.
            r.http(&http(HttpWhat::Write, 1, 200, 2_160, &ok("503")), false, src, ready);
            r.http(&http(HttpWhat::Write, 3, 100, 2_200, "HTTP/1.1 500 X\r\nTransfer-Encoding: chunked\r\n\r\n"), false, src, ready);
            assert_eq!(r.open(), 1, "/c's length unsaid");
            r.http(&http(HttpWhat::Request, 4, 100, 3_000, "GET /d HTTP/1.1\r\n\r\n"), false, src, ready);
            assert_eq!(r.open(), 1, "the next request ends /c");
            assert!(r.pipelines.is_empty());
            r.finish_all(0, src, ready);
        });
        let server = |path: &'static str| spans.iter().find(|s| attr(s, "url.path") == Some(&Value::from(path))).unwrap();
        for (path, code, end, cause) in [("/a", 200, 2_000, 1), ("/b", 404, 2_150, 2), ("/c", 500, 2_200, 3)] {
            let s = server(path);
            assert_eq!(attr(s, "http.response.status_code"), Some(&Value::I64(code)), "{path}");
            assert_eq!(s.end_ns, end, "{path}");
            let work: Vec<_> = spans.iter().filter(|w| w.parent_span_id == s.span_context.span_id()).collect();
            assert_eq!(work.len(), 1, "{path}'s stat under it");
            assert_eq!(work[0].end_ns, 1_200 + cause, "{path}'s own stat");
        }
    }

    /// Pipelined over TLS: the responses are SSL_write's plaintext, on the
    /// TLS connection; its socket (where the requests were read) is learned
    /// from the ciphertext written right after, so the later responses,
    /// written from the first's callback, go to the socket's requests in
    /// order.
    #[test]
    fn pipelined_https_requests_take_their_responses_in_order() {
        let tls = |cause: u64, ts: u64, data: &str| HttpRecord { tls: true, ..http(HttpWhat::Write, cause, 0x55, ts, data) };
        let spans = run(|r, src, ready| {
            r.http(&http(HttpWhat::Request, 1, 100, 1_000, "GET /a HTTP/1.1\r\n\r\n"), false, src, ready);
            r.http(&http(HttpWhat::Pipelined, 2, 100, 1_010, "GET /b HTTP/1.1\r\n\r\n"), false, src, ready);
            r.http(&tls(1, 2_000, "HTTP/1.1 200 X\r\nContent-Length: 2\r\n\r\nok"), false, src, ready);
            r.http(&http(HttpWhat::Write, 1, 100, 2_010, "\x17\x03"), false, src, ready);
            r.http(&tls(1, 2_100, "HTTP/1.1 404 X\r\nContent-Length: 2\r\n\r\nno"), false, src, ready);
            r.http(&http(HttpWhat::Write, 1, 100, 2_110, "\x17\x03"), false, src, ready);
            r.finish_all(0, src, ready);
        });
        for (path, code) in [("/a", 200), ("/b", 404)] {
            let s = spans.iter().find(|s| attr(s, "url.path") == Some(&Value::from(path))).unwrap();
            assert_eq!(attr(s, "http.response.status_code"), Some(&Value::I64(code)), "{path}");
            assert_eq!(attr(s, "url.scheme"), Some(&Value::from("https")), "{path}");
        }
    }

    /// HTTPS calls: seen as SSL_write's plaintext (on the TLS connection),
    /// their responses parsed from their sockets: each call's socket is the
    /// one its ciphertext went out on, right after (a write the handshake
    /// held back is retried: the same call).
    #[test]
    fn https_calls_are_matched_to_their_responses_by_their_sockets() {
        let tls = |conn: u64, ts: u64, data: &str| HttpRecord { tls: true, ..http(HttpWhat::Write, 1, conn, ts, data) };
        let spans = run(|r, src, ready| {
            r.http(&http(HttpWhat::Request, 1, 100, 1_000, "GET / HTTP/1.1\r\n\r\n"), false, src, ready);
            // Call a's first try, before its handshake: the next write is
            // call b's socket's hello, not a's ciphertext.
            r.http(&tls(0xa, 1_100, "GET /a HTTP/1.1\r\nHost: up:8443\r\n\r\n"), false, src, ready);
            r.http(&http(HttpWhat::Write, 1, 0xb0, 1_110, "\x16\x03"), false, src, ready);
            r.http(&tls(0xb, 1_120, "GET /b HTTP/1.1\r\nHost: up:8443\r\n\r\n"), false, src, ready);
            r.http(&http(HttpWhat::Write, 2, 0xc0, 1_130, "\x16\x03"), false, src, ready);
            // Call a retried in another request's callback, still held back.
            r.http(&http(HttpWhat::Request, 2, 200, 1_140, "GET /two HTTP/1.1\r\n\r\n"), false, src, ready);
            r.http(
                &HttpRecord { tls: true, ..http(HttpWhat::Write, 2, 0xa, 1_150, "GET /a HTTP/1.1\r\nHost: up:8443\r\n\r\n") },
                false,
                src,
                ready,
            );
            r.http(&http(HttpWhat::Write, 2, 0xa0, 1_160, "\x16\x03"), false, src, ready);
            // Both retried, each followed by its ciphertext; /a's from
            // request 2's callback, so its response is read under cause 2.
            r.http(
                &HttpRecord { tls: true, ..http(HttpWhat::Write, 2, 0xa, 1_200, "GET /a HTTP/1.1\r\nHost: up:8443\r\n\r\n") },
                false,
                src,
                ready,
            );
            r.http(&http(HttpWhat::Write, 2, 0xa0, 1_210, "\x17\x03"), false, src, ready);
            r.http(&tls(0xb, 1_300, "GET /b HTTP/1.1\r\nHost: up:8443\r\n\r\n"), false, src, ready);
            r.http(&http(HttpWhat::Write, 1, 0xb0, 1_310, "\x17\x03"), false, src, ready);
            r.http(&http(HttpWhat::Response, 1, 0xb0, 1_400, "HTTP/1.1 503 X\r\n\r\n"), false, src, ready);
            r.http(&http(HttpWhat::Response, 2, 0xa0, 1_500, "HTTP/1.1 200 OK\r\n\r\n"), false, src, ready);
            r.finish_all(0, src, ready);
        });
        let call = |path: &'static str| {
            spans.iter().find(|s| s.span_kind == SpanKind::Client && attr(s, "url.path") == Some(&Value::from(path))).unwrap()
        };
        assert_eq!(spans.iter().filter(|s| s.span_kind == SpanKind::Client).count(), 2, "a retried write is the same call");
        let one = spans.iter().find(|s| s.span_kind == SpanKind::Server && attr(s, "url.path") == Some(&Value::from("/"))).unwrap();
        assert!(spans.iter().filter(|s| s.span_kind == SpanKind::Client).all(|c| c.parent_span_id == one.span_context.span_id()));
        for (path, code, start, end) in [("/a", 200, 1_100, 1_500), ("/b", 503, 1_120, 1_400)] {
            let c = call(path);
            assert_eq!(attr(c, "http.response.status_code"), Some(&Value::I64(code)), "{path}");
            assert_eq!(attr(c, "url.scheme"), Some(&Value::from("https")));
            assert_eq!((c.start_ns, c.end_ns), (start, end), "{path}");
        }
    }

    /// At a sampling window's close, a request not answered whole is
    /// dropped with its work, counted; an answer of unsaid length ends
    /// after a quiet period, as it would have.
    #[test]
    fn a_window_close_drops_requests_not_answered_whole() {
        let spans = run(|r, src, ready| {
            for (cause, conn) in [(1, 100), (2, 200), (3, 300)] {
                r.http(&http(HttpWhat::Request, cause, conn, 1_000, "GET / HTTP/1.1\r\n\r\n"), false, src, ready);
                r.work(fs(cause, 1_100, 1_200), src, ready);
            }
            r.http(&http(HttpWhat::Write, 2, 200, 2_000, "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nok"), false, src, ready);
            r.http(&http(HttpWhat::Write, 3, 300, 2_000, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"), false, src, ready);
            r.window_closed();
            assert_eq!(r.open(), 1, "request 3 stays");
            assert_eq!((r.stats.straddled, r.stats.straddled_ops), (2, 2), "requests 1 (no answer) and 2 (answer cut)");
            // Their late work is not under a request that was not sent.
            assert!(r.work(fs(1, 3_000, 3_100), src, ready).is_some());
            r.expire(2_000 + QUIET_NS, src, ready);
        });
        assert_eq!(spans.len(), 2, "request 3 and its stat");
    }

    /// Any order of records, any head in them: no panic, and no more
    /// requests stay open than came.
    mod props {
        use proptest::prelude::*;

        use super::*;
        use crate::requests::testing::bytes;

        /// (what, cause, connection, time, which of the heads).
        fn record() -> impl Strategy<Value = (u8, u64, u64, u64, prop::sample::Index)> {
            (0u8..8, 0u64..4, 0u64..4, 0u64..3_000_000_000, any::<prop::sample::Index>())
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

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
                            0 => HttpWhat::Request,
                            1 => HttpWhat::Pipelined,
                            2 => HttpWhat::Write,
                            3 => HttpWhat::Response,
                            4 | 5 => HttpWhat::Http2Header,
                            6 => HttpWhat::Http2Close,
                            _ => HttpWhat::Http2Client,
                        };
                        started += usize::from(matches!(what, HttpWhat::Request | HttpWhat::Pipelined | HttpWhat::Http2Header));
                        let mut rec = http(what, *cause, *conn, *ts, "");
                        // Some of them an outgoing stream's.
                        rec.stream = (*ts % 3) as i32;
                        rec.data = data.clone();
                        rec.len = data.len() as u32;
                        r.http(&rec, *cause == 3, src, ready);
                        assert!(r.open() <= started);
                    }
                    for (cause, ts) in &work {
                        let _ = r.work(fs(*cause, *ts, ts + 100), src, ready);
                    }
                    r.expire(u64::MAX / 2, src, ready);
                    r.finish_all(0, src, ready);
                    assert_eq!(r.open(), 0);
                });
                for s in &spans {
                    prop_assert!(s.end_ns >= s.start_ns);
                }
            }
        }
    }
}
