//! A finished request's spans: its SERVER span (with the request's
//! attributes), the fs/DNS work it held built under it, and a CLIENT span
//! per outgoing HTTP call it made. Pure.

use std::borrow::Cow;

use opentelemetry::trace::{SpanId, SpanKind, Status};

use super::head::{host_port, parse_traceparent, redact_query, Head};
use super::template::url_template;
use super::tracker::{Call, Request};
use crate::events::spans::{build_into, span_under, Family, KeyValue, Parent, Span, SpanContextSource};
use crate::semconv;

/// A finished request's spans, built into `spans`: its SERVER span (when
/// uvspan makes it), its held work under `parent`, a CLIENT span per
/// outgoing call.
pub(super) fn request_spans(req: &mut Request, parent: &Parent, src: &SpanContextSource<'_>, spans: &mut Vec<Span>) {
    let n = req.held.len() + 1 + req.calls.len();
    spans.reserve(n);
    if req.server_span {
        spans.push(server_span(req, src));
    }
    for rec in std::mem::take(&mut req.held) {
        build_into(rec, src, Some(parent), spans);
    }
    let mut taken = Vec::new();
    for call in req.calls.iter().filter(|c| !c.head.is_otlp_export()) {
        spans.push(client_span(req, call, parent, src, &mut taken));
    }
}

/// A span of the request under `parent` (times in kernel ns).
fn span(
    src: &SpanContextSource<'_>,
    parent: &Parent,
    span_id: SpanId,
    name: Cow<'static, str>,
    kind: SpanKind,
    times: (u64, u64),
    attributes: Vec<KeyValue>,
) -> Span {
    span_under(src, parent, span_id, name, (kind, Family::Http), times, attributes)
}

/// The request's SERVER span: under the incoming parent, or a root.
fn server_span(req: &Request, src: &SpanContextSource<'_>) -> Span {
    let parent = match req.incoming {
        Some((_, span, _)) => Parent { trace_id: req.trace_id(), span_id: span, remote: true, state: req.state.clone() },
        None => Parent { trace_id: req.trace_id(), span_id: SpanId::INVALID, remote: false, state: req.state.clone() },
    };
    let h = &req.head;
    // Sized for all it may get (one allocation).
    let mut attrs = Vec::with_capacity(14);
    attrs.extend([
        KeyValue::new(semconv::HTTP_REQUEST_METHOD, h.method.clone()),
        KeyValue::new(semconv::URL_PATH, h.path.clone()),
        KeyValue::new(semconv::URL_SCHEME, if req.tls { "https" } else { "http" }),
        KeyValue::new(semconv::THREAD_ID, i64::from(req.tid)),
    ]);
    // Not known where the request line was longer than the capture.
    if !h.version.is_empty() {
        attrs.push(KeyValue::new(semconv::NETWORK_PROTOCOL_VERSION, h.version));
    }
    if let Some(q) = &h.query {
        attrs.push(KeyValue::new(semconv::URL_QUERY, redact_query(q)));
    }
    if let Some(p) = req.peer {
        attrs.push(KeyValue::new(semconv::CLIENT_ADDRESS, p.ip().to_string()));
        attrs.push(KeyValue::new(semconv::CLIENT_PORT, i64::from(p.port())));
    }
    if let Some(p) = req.local_port {
        attrs.push(KeyValue::new(semconv::SERVER_PORT, i64::from(p)));
    }
    // HTTP/2: its :authority (HTTP/1's Host is the client's say, not kept).
    if let Some(host) = h.header("host").filter(|_| h.version == "2") {
        attrs.push(KeyValue::new(semconv::SERVER_ADDRESS, host_port(host, 0).0.to_string()));
    }
    if let Some(ua) = h.header("user-agent") {
        attrs.push(KeyValue::new(semconv::USER_AGENT_ORIGINAL, ua.to_string()));
    }
    // unanswered: until it was given up
    let end = req.unanswered.map_or(req.last_ns, |(_, at)| at.max(req.last_ns));
    if let Some((service, method)) = h.grpc() {
        return grpc_span(req, src, &parent, attrs, service, method);
    }
    let template = url_template(&h.path);
    let name = Cow::Owned(format!("{} {template}", h.method));
    attrs.push(KeyValue::new(semconv::URL_TEMPLATE, template.into_owned()));
    let mut s = span(src, &parent, req.span_id, name, SpanKind::Server, (req.start_ns, end), attrs);
    match req.status {
        Some(code) => {
            s.attributes.push(KeyValue::new(semconv::HTTP_RESPONSE_STATUS_CODE, i64::from(code)));
            if code >= 500 {
                s.status = Status::error(format!("HTTP {code}"));
                s.attributes.push(KeyValue::new(semconv::ERROR_TYPE, code.to_string()));
            }
        }
        None => unanswered(&mut s, req),
    }
    s
}

/// A SERVER span whose response was not seen: says so, and how it ended.
fn unanswered(s: &mut Span, req: &Request) {
    s.attributes.push(KeyValue::new(semconv::UVSPAN_HTTP_RESPONSE_SEEN, false));
    if let Some((how, _)) = req.unanswered {
        s.attributes.push(KeyValue::new(semconv::UVSPAN_HTTP_ENDED_BY, how.as_str()));
    }
}

/// A gRPC call's SERVER span: `{package.Service}/{Method}`, with the
/// `rpc.*` attributes beside the HTTP ones.
fn grpc_span(req: &Request, src: &SpanContextSource<'_>, parent: &Parent, mut attrs: Vec<KeyValue>, service: &str, method: &str) -> Span {
    attrs.extend([
        KeyValue::new(semconv::RPC_SYSTEM_NAME, semconv::RPC_SYSTEM_NAME_GRPC),
        KeyValue::new(semconv::RPC_METHOD, format!("{service}/{method}")),
    ]);
    if let Some(code) = req.status {
        attrs.push(KeyValue::new(semconv::HTTP_RESPONSE_STATUS_CODE, i64::from(code)));
    }
    let name = Cow::Owned(format!("{service}/{method}"));
    let end = req.unanswered.map_or(req.last_ns, |(_, at)| at.max(req.last_ns));
    let mut s = span(src, parent, req.span_id, name, SpanKind::Server, (req.start_ns, end), attrs);
    match (req.grpc_status, req.status) {
        (Some(code), _) => {
            let name = semconv::grpc_status_name(u32::from(code));
            s.attributes.push(KeyValue::new(semconv::RPC_RESPONSE_STATUS_CODE, name.to_string()));
            if semconv::grpc_server_error(code) {
                s.status = Status::error(format!("gRPC status {code} ({name})"));
                s.attributes.push(KeyValue::new(semconv::ERROR_TYPE, name.into_owned()));
            }
        }
        (None, Some(code)) if code >= 500 => {
            s.status = Status::error(format!("HTTP {code}"));
            s.attributes.push(KeyValue::new(semconv::ERROR_TYPE, code.to_string()));
        }
        (None, Some(_)) => {}
        (None, None) => unanswered(&mut s, req),
    }
    s
}

/// A CLIENT span for an outgoing call the request made (HTTP/1, or an
/// HTTP/2 stream: a gRPC call's named and attributed as such). Its span id
/// is the one the traceparent the app wrote on the call names, when that is
/// in the span's own trace, the app runs no OpenTelemetry SDK (whose own
/// CLIENT span that id is), it is not the request's own or its caller's
/// (a traceparent passed on unchanged) and no earlier call of the request
/// took it (`taken`): the callee's spans are then under it. Else an id of
/// its own.
fn client_span(req: &Request, call: &Call, parent: &Parent, src: &SpanContextSource<'_>, taken: &mut Vec<SpanId>) -> Span {
    let span_id = match call.head.header("traceparent").and_then(parse_traceparent) {
        Some((trace, span, _))
            if !call.app_sdk
                && trace == parent.trace_id
                && span != SpanId::INVALID
                && span != req.span_id
                && req.incoming.is_none_or(|i| i.1 != span)
                && !taken.contains(&span) =>
        {
            taken.push(span);
            span
        }
        _ => src.ids.new_span_id(),
    };
    call_span(&call.span_parts(req.last_ns), span_id, parent, src)
}

/// What a CLIENT span is made of: an outgoing call (a request's or a
/// task's), its request's head, its response's status when seen.
pub(crate) struct CallSpan<'a> {
    pub head: &'a Head,
    pub tls: bool,
    /// An HTTP/2 stream (not HTTP/1).
    pub h2: bool,
    pub status: Option<u16>,
    pub grpc_status: Option<u8>,
    pub times: (u64, u64),
}

/// The CLIENT span of an outgoing call, with `span_id`.
pub(crate) fn call_span(c: &CallSpan<'_>, span_id: SpanId, parent: &Parent, src: &SpanContextSource<'_>) -> Span {
    let h = c.head;
    let mut attrs = Vec::with_capacity(12);
    attrs.extend([
        KeyValue::new(semconv::HTTP_REQUEST_METHOD, h.method.clone()),
        KeyValue::new(semconv::URL_PATH, h.path.clone()),
        KeyValue::new(semconv::URL_SCHEME, if c.tls { "https" } else { "http" }),
    ]);
    if c.h2 {
        attrs.push(KeyValue::new(semconv::NETWORK_PROTOCOL_VERSION, "2"));
    }
    if let Some(host) = h.header("host") {
        let (name, port) = host_port(host, if c.tls { 443 } else { 80 });
        attrs.push(KeyValue::new(semconv::SERVER_ADDRESS, name.to_string()));
        attrs.push(KeyValue::new(semconv::SERVER_PORT, i64::from(port)));
    }
    if let Some(tp) = h.header("traceparent") {
        attrs.push(KeyValue::new(semconv::UVSPAN_HTTP_TRACEPARENT_WRITTEN, tp.to_string()));
    }
    if let Some(code) = c.status {
        attrs.push(KeyValue::new(semconv::HTTP_RESPONSE_STATUS_CODE, i64::from(code)));
    }
    let http_error = c.status.filter(|c| *c >= 400);
    if let Some((service, method)) = h.grpc() {
        attrs.extend([
            KeyValue::new(semconv::RPC_SYSTEM_NAME, semconv::RPC_SYSTEM_NAME_GRPC),
            KeyValue::new(semconv::RPC_METHOD, format!("{service}/{method}")),
        ]);
        let name = Cow::Owned(format!("{service}/{method}"));
        let mut s = span(src, parent, span_id, name, SpanKind::Client, c.times, attrs);
        // A client's view: every code but OK is an error.
        match (c.grpc_status, http_error) {
            (Some(code), _) => {
                let name = semconv::grpc_status_name(u32::from(code));
                s.attributes.push(KeyValue::new(semconv::RPC_RESPONSE_STATUS_CODE, name.to_string()));
                if code != 0 {
                    s.status = Status::error(format!("gRPC status {code} ({name})"));
                    s.attributes.push(KeyValue::new(semconv::ERROR_TYPE, name.into_owned()));
                }
            }
            (None, Some(code)) => {
                s.status = Status::error(format!("HTTP {code}"));
                s.attributes.push(KeyValue::new(semconv::ERROR_TYPE, code.to_string()));
            }
            (None, None) => {}
        }
        return s;
    }
    let template = url_template(&h.path);
    let name = Cow::Owned(format!("{} {template}", h.method));
    attrs.push(KeyValue::new(semconv::URL_TEMPLATE, template.into_owned()));
    let mut s = span(src, parent, span_id, name, SpanKind::Client, c.times, attrs);
    if let Some(code) = http_error {
        s.status = Status::error(format!("HTTP {code}"));
        s.attributes.push(KeyValue::new(semconv::ERROR_TYPE, code.to_string()));
    }
    s
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TraceId;

    use super::*;
    use crate::events::decode::{HttpRecord, HttpWhat};
    use crate::events::spans::Value;
    use crate::requests::testing::{attr, fs, http, run, TP};
    use crate::requests::tracker::NO_RESPONSE_NS;

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
        assert_eq!(server.name, "GET /x");
        assert_eq!(attr(server, "url.template"), Some(&Value::from("/x")));
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

    /// A gRPC call (HTTP/2, `content-type: application/grpc`): named
    /// `{package.Service}/{Method}`, `rpc.*` attributes, its grpc-status
    /// (server errors ERROR, client errors not).
    #[test]
    fn grpc_calls_are_named_by_service_and_method() {
        let h = |cause: u64, ts: u64, name: &str, value: &str| http(HttpWhat::Http2Header, cause, 100, ts, &format!("{name}\0{value}"));
        let spans = run(|r, src, ready| {
            for (cause, code) in [(1, "0"), (2, "13"), (3, "5")] {
                r.http(&h(cause, 1_000, ":method", "POST"), false, src, ready);
                r.http(&h(cause, 1_000, ":path", "/helloworld.Greeter/SayHello"), false, src, ready);
                r.http(&h(cause, 1_000, "content-type", "application/grpc+proto"), false, src, ready);
                r.http(&h(cause, 1_100, ":status", "200"), false, src, ready);
                r.http(&h(cause, 1_200, "grpc-status", code), false, src, ready);
                r.http(&http(HttpWhat::Http2Close, cause, 100, 1_300, ""), false, src, ready);
            }
        });
        assert_eq!(spans.len(), 3);
        for (s, code, error) in [(&spans[0], "OK", false), (&spans[1], "INTERNAL", true), (&spans[2], "NOT_FOUND", false)] {
            assert_eq!(s.name, "helloworld.Greeter/SayHello");
            assert_eq!(attr(s, "rpc.system.name"), Some(&Value::from("grpc")));
            assert_eq!(attr(s, "rpc.method"), Some(&Value::from("helloworld.Greeter/SayHello")));
            assert_eq!(attr(s, "rpc.response.status_code"), Some(&Value::from(code)));
            for old in ["rpc.system", "rpc.service", "rpc.grpc.status_code"] {
                assert_eq!(attr(s, old), None, "{old}");
            }
            assert_eq!(attr(s, "error.type"), error.then(|| Value::from(code)).as_ref());
            assert_eq!(attr(s, "http.response.status_code"), Some(&Value::I64(200)));
            assert_eq!(matches!(s.status, Status::Error { .. }), error, "grpc-status {code}");
        }
    }

    /// HTTP/2 calls of a request (streams of one session, interleaved):
    /// each a CLIENT span matched to its own response by its stream id, a
    /// gRPC call named by service and method with its grpc-status (every
    /// code but OK an ERROR for a client); the span id the app wrote taken
    /// once, in the request's trace, by a process without an SDK.
    #[test]
    fn http2_calls_are_client_spans_matched_per_stream() {
        let c = |stream: i32, ts: u64, fields: &[(&str, &str)]| HttpRecord {
            stream,
            ..http(HttpWhat::Http2Client, 1, 500, ts, &fields.iter().map(|(n, v)| format!("{n}\0{v}")).collect::<Vec<_>>().join("\0"))
        };
        let h = |stream: i32, ts: u64, name: &str, value: &str| HttpRecord {
            stream,
            ..http(HttpWhat::Http2Header, 1, 500, ts, &format!("{name}\0{value}"))
        };
        let end = |stream: i32, ts: u64| HttpRecord { stream, ..http(HttpWhat::Http2Close, 1, 500, ts, "") };
        let spans = run(|r, src, ready| {
            r.http(&http(HttpWhat::Request, 1, 100, 1_000, &format!("GET / HTTP/1.1\r\ntraceparent: {TP}\r\n\r\n")), false, src, ready);
            let tp = |span: &str| format!("00-0af7651916cd43dd8448eb211c80319c-{span}-01");
            for (stream, path, span) in
                [(1, "/a", "00000000000000a1"), (3, "/b", "00000000000000a1"), (5, "/test.Echo/Say", "00000000000000c5")]
            {
                let ts = 1_100 + stream as u64;
                let tp = tp(span);
                let mut fields =
                    vec![(":method", if stream == 5 { "POST" } else { "GET" }), (":scheme", "https"), (":authority", "up:8443")];
                if stream == 5 {
                    fields.push(("content-type", "application/grpc"));
                }
                fields.extend([("traceparent", tp.as_str()), (":path", path)]);
                r.http(&c(stream, ts, &fields), false, src, ready);
                // Its stream's again (a repeat): the same call.
                r.http(&c(stream, ts + 1, &[(":path", "/again")]), false, src, ready);
            }
            // Answers in another order; another session's stream 1 is not these.
            r.http(&HttpRecord { conn: 600, ..h(1, 1_150, ":status", "200") }, false, src, ready);
            r.http(&h(5, 1_200, ":status", "200"), false, src, ready);
            r.http(&h(3, 1_210, ":status", "503"), false, src, ready);
            r.http(&h(1, 1_220, ":status", "404"), false, src, ready);
            r.http(&h(5, 1_300, "grpc-status", "5"), false, src, ready);
            for (stream, ts) in [(3, 1_310), (5, 1_320), (1, 1_330), (1, 1_340)] {
                r.http(&end(stream, ts), false, src, ready);
            }
            r.http(&http(HttpWhat::Write, 1, 100, 2_000, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"), false, src, ready);
        });
        let server = spans.iter().find(|s| s.span_kind == SpanKind::Server).unwrap();
        let call = |path: &'static str| {
            spans.iter().find(|s| s.span_kind == SpanKind::Client && attr(s, "url.path") == Some(&Value::from(path))).unwrap()
        };
        assert_eq!(spans.iter().filter(|s| s.span_kind == SpanKind::Client).count(), 3);
        for (path, code, start, end) in [("/a", 404, 1_101, 1_330), ("/b", 503, 1_103, 1_310)] {
            let s = call(path);
            assert_eq!(s.name, format!("GET {path}"));
            assert_eq!(attr(s, "url.template"), Some(&Value::from(path)));
            assert_eq!(attr(s, "http.response.status_code"), Some(&Value::I64(code)), "{path}: its own response");
            assert_eq!((s.start_ns, s.end_ns), (start, end), "{path}: to its response's end");
            assert_eq!(attr(s, "network.protocol.version"), Some(&Value::from("2")));
            assert_eq!(attr(s, "url.scheme"), Some(&Value::from("https")));
            assert_eq!(attr(s, "server.address"), Some(&Value::from("up")));
            assert_eq!(attr(s, "server.port"), Some(&Value::I64(8443)));
            assert!(matches!(s.status, Status::Error { .. }), "{path}: a 4xx/5xx answer");
            assert_eq!(s.parent_span_id, server.span_context.span_id());
        }
        assert_eq!(call("/a").span_context.span_id(), SpanId::from_hex("00000000000000a1").unwrap(), "the id the app wrote");
        assert_ne!(call("/b").span_context.span_id(), call("/a").span_context.span_id(), "an id is taken once");
        let g = call("/test.Echo/Say");
        assert_eq!(g.name, "test.Echo/Say");
        assert_eq!(g.span_context.span_id(), SpanId::from_hex("00000000000000c5").unwrap());
        assert_eq!(attr(g, "rpc.system.name"), Some(&Value::from("grpc")));
        assert_eq!(attr(g, "rpc.method"), Some(&Value::from("test.Echo/Say")));
        assert_eq!(attr(g, "rpc.response.status_code"), Some(&Value::from("NOT_FOUND")));
        assert_eq!(attr(g, "error.type"), Some(&Value::from("NOT_FOUND")));
        assert_eq!(attr(g, "rpc.service"), None);
        assert!(matches!(g.status, Status::Error { .. }), "NOT_FOUND is a client's error");
    }

    /// The span id the app wrote is not taken by a process that runs the
    /// SDK (its own CLIENT span has it), nor from another trace, nor when it
    /// is the caller's (a traceparent passed on unchanged).
    #[test]
    fn a_written_span_id_is_taken_only_in_the_trace_without_an_sdk() {
        let c = |stream: i32, path: &str, tp: &str| HttpRecord {
            stream,
            ..http(HttpWhat::Http2Client, 1, 500, 1_100, &format!(":path\0{path}\0traceparent\0{tp}"))
        };
        let spans = run(|r, src, ready| {
            r.http(&http(HttpWhat::Request, 1, 100, 1_000, &format!("GET / HTTP/1.1\r\ntraceparent: {TP}\r\n\r\n")), false, src, ready);
            r.http(&c(1, "/sdk", "00-0af7651916cd43dd8448eb211c80319c-00000000000000a1-01"), true, src, ready);
            r.http(&c(3, "/other", "00-11111111111111111111111111111111-00000000000000a3-01"), false, src, ready);
            // The caller's traceparent passed on unchanged: its span is the caller's.
            r.http(&c(5, "/passed", TP), false, src, ready);
            r.finish_all(0, src, ready);
        });
        for (path, span) in [("/sdk", "00000000000000a1"), ("/other", "00000000000000a3"), ("/passed", "b7ad6b7169203331")] {
            let s = spans.iter().find(|s| attr(s, "url.path") == Some(&Value::from(path))).unwrap();
            assert_ne!(s.span_context.span_id(), SpanId::from_hex(span).unwrap(), "{path}");
            assert!(attr(s, "uvspan.http.traceparent_written").is_some());
        }
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
}
