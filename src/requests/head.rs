//! HTTP heads as they reach the parser (or leave the app): a request's
//! line and the headers uvspan reads, a response's status line and its
//! length, W3C `traceparent`, a Host header; `url.query` with credentials
//! redacted. Pure; the bytes come from the traced process (and from whoever
//! sent it a request), so any input gives a bounded result or `None`.

use std::borrow::Cow;

use opentelemetry::trace::{SpanId, TraceId};

/// Longest `url.query` kept (bytes).
pub const QUERY_MAX: usize = 256;

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

    /// An OTLP export (the app's OpenTelemetry SDK sending its telemetry:
    /// gRPC `opentelemetry.proto.collector.*` or `POST …/v1/{traces,metrics,logs}`):
    /// telemetry about the app, not the app's work, so no CLIENT span of it.
    pub fn is_otlp_export(&self) -> bool {
        self.path.starts_with("/opentelemetry.proto.collector.")
            || (self.method == "POST" && ["/v1/traces", "/v1/metrics", "/v1/logs"].iter().any(|p| self.path.ends_with(p)))
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
    if req.path.is_none() {
        return cut_request_line(req.method?, data);
    }
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

/// A request line longer than the capture (no line end in it): its method
/// and the part of its target that came; its version is not known (""),
/// nor are its headers.
fn cut_request_line(method: &str, data: &[u8]) -> Option<Head> {
    if data.contains(&b'\n') {
        return None;
    }
    let target = data.get(method.len() + 1..).filter(|t| t.first() == Some(&b'/'))?;
    let target = String::from_utf8_lossy(target);
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), Some(q.to_string())),
        None => (target.to_string(), None),
    };
    Some(Head { method: method_of(method), path, query, version: "", headers: Vec::new() })
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

/// What an HTTP/2 header record says about its stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum H2Field {
    /// A request header, applied to its head ([`Head::apply_h2`]).
    Request,
    /// The response's `:status`.
    Status(u16),
    /// A gRPC call's `grpc-status` (its trailers, or its headers).
    GrpcStatus(u8),
    /// Unreadable, or a header uvspan does not keep.
    Other,
}

/// An HTTP/2 header record's `name\0value` as a head sees it: the
/// pseudo-headers become the request line (`:authority` the `host`
/// header), the headers uvspan reads (and `content-type`) are kept.
pub fn split_h2(data: &[u8]) -> Option<(&str, &str)> {
    let at = data.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&data[..at]).ok()?;
    let value = std::str::from_utf8(&data[at + 1..]).ok()?;
    Some((name, value.trim()))
}

impl Head {
    /// An HTTP/2 request's head before its first header.
    pub fn h2() -> Head {
        Head { version: "2", ..Head::default() }
    }

    /// An HTTP/2 header record applied to the stream's head.
    pub fn apply_h2(&mut self, data: &[u8]) -> H2Field {
        let Some((name, value)) = split_h2(data) else { return H2Field::Other };
        match name {
            ":status" => return value.parse().map_or(H2Field::Other, H2Field::Status),
            "grpc-status" => return value.parse().map_or(H2Field::Other, H2Field::GrpcStatus),
            ":method" => self.method = method_of(value),
            ":path" => {
                let (path, query) = match value.split_once('?') {
                    Some((p, q)) => (p, Some(q.to_string())),
                    None => (value, None),
                };
                self.path = path.to_string();
                self.query = query;
            }
            ":authority" => self.set_header("host", value),
            ":scheme" => self.set_header(":scheme", value),
            "content-type" => self.set_header("content-type", value),
            n => match header_read(n) {
                Some(k) => self.set_header(k, value),
                None => return H2Field::Other,
            },
        }
        H2Field::Request
    }

    /// An outgoing HTTP/2 stream's head from its request-headers record
    /// (`name\0value\0name\0value…`).
    pub fn h2_request(data: &[u8]) -> Head {
        let mut head = Head::h2();
        let mut fields = data.split(|&b| b == 0);
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            let mut field = Vec::with_capacity(name.len() + 1 + value.len());
            field.extend_from_slice(name);
            field.push(0);
            field.extend_from_slice(value);
            head.apply_h2(&field);
        }
        head
    }

    /// A gRPC call (`content-type: application/grpc…`): its service and
    /// method, from `/{package.Service}/{Method}`.
    pub fn grpc(&self) -> Option<(&str, &str)> {
        if !self.header("content-type").is_some_and(|c| c.starts_with("application/grpc")) {
            return None;
        }
        let (service, method) = self.path.strip_prefix('/')?.split_once('/')?;
        (!service.is_empty() && !method.is_empty() && !method.contains('/')).then_some((service, method))
    }

    fn set_header(&mut self, k: &'static str, v: &str) {
        match self.headers.iter_mut().find(|(h, _)| *h == k) {
            Some(h) => h.1 = v.to_string(),
            None => self.headers.push((k, v.to_string())),
        }
    }
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

/// A Host header's name and port: `name`, `name:port`, `[v6]`, `[v6]:port`.
pub(crate) fn host_port(host: &str, default_port: u16) -> (&str, u16) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requests::testing::TP;

    #[test]
    fn the_sdks_own_exports_are_told_apart() {
        let head = |method: &'static str, path: &str| Head {
            method: method.into(),
            path: path.into(),
            query: None,
            version: "1.1",
            headers: vec![],
        };
        assert!(head("POST", "/opentelemetry.proto.collector.trace.v1.TraceService/Export").is_otlp_export());
        assert!(head("POST", "/v1/traces").is_otlp_export());
        assert!(head("POST", "/otlp/v1/logs").is_otlp_export(), "a collector behind a path prefix");
        assert!(!head("GET", "/v1/traces").is_otlp_export(), "a GET is an app's call");
        assert!(!head("POST", "/v1/orders").is_otlp_export());
        assert!(!head("POST", "/users/v1/tracesx").is_otlp_export());
    }

    #[test]
    fn http2_headers_make_a_head() {
        let mut h = Head::h2();
        let f = |n: &str, v: &str| format!("{n}\0{v}").into_bytes();
        assert_eq!(h.apply_h2(&f(":method", "POST")), H2Field::Request);
        h.apply_h2(&f(":path", "/a/b?token=x&y=1"));
        h.apply_h2(&f(":scheme", "https"));
        h.apply_h2(&f(":authority", "api:8443"));
        h.apply_h2(&f("traceparent", TP));
        assert_eq!(h.apply_h2(&f("x-other", "1")), H2Field::Other);
        assert_eq!(h.apply_h2(&f(":status", "503")), H2Field::Status(503));
        assert_eq!(h.apply_h2(&f(":status", "5x")), H2Field::Other);
        assert_eq!(h.apply_h2(b"no-nul"), H2Field::Other);
        assert_eq!(h.apply_h2(b"\xff\0x"), H2Field::Other);
        assert_eq!((h.method.as_ref(), h.path.as_str(), h.query.as_deref(), h.version), ("POST", "/a/b", Some("token=x&y=1"), "2"));
        assert_eq!(h.header("host"), Some("api:8443"));
        assert_eq!(h.header(":scheme"), Some("https"));
        assert_eq!(h.header("traceparent"), Some(TP));
        assert_eq!(h.grpc(), None, "no gRPC content type");
        assert_eq!(h.apply_h2(&f("grpc-status", "13")), H2Field::GrpcStatus(13));
        assert_eq!(h.apply_h2(&f("grpc-status", "300")), H2Field::Other);
        h.apply_h2(&f("content-type", "application/grpc+proto"));
        assert_eq!(h.grpc(), Some(("a", "b")), "a gRPC content type: /a/b is service a, method b");
    }

    #[test]
    fn grpc_service_and_method() {
        let mut h = Head::h2();
        let f = |n: &str, v: &str| format!("{n}\0{v}").into_bytes();
        h.apply_h2(&f("content-type", "application/grpc"));
        for (path, want) in [
            ("/helloworld.Greeter/SayHello", Some(("helloworld.Greeter", "SayHello"))),
            ("/Svc/M", Some(("Svc", "M"))),
            ("/helloworld.Greeter/", None),
            ("//SayHello", None),
            ("/a/b/c", None),
            ("nope", None),
        ] {
            h.apply_h2(&f(":path", path));
            assert_eq!(h.grpc(), want, "{path}");
        }
    }

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
        // A request line longer than the capture: its method and the
        // target so far; no version.
        let long = format!("DELETE /{}?q=1", "x".repeat(1_000));
        let h = parse_request(long.as_bytes()).unwrap();
        assert_eq!((&*h.method, h.path.len(), h.query.as_deref(), h.version), ("DELETE", 1_001, Some("q=1"), ""));
        assert!(parse_request(b"GET x").is_none(), "not a path");
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

    #[test]
    fn host_headers() {
        assert_eq!(host_port("api:9000", 80), ("api", 9000));
        assert_eq!(host_port("api", 443), ("api", 443));
        assert_eq!(host_port("[::1]:8080", 80), ("::1", 8080));
        assert_eq!(host_port("[::1]", 80), ("::1", 80));
        assert_eq!(host_port("api:x", 80), ("api:x", 80));
    }

    /// Any head, cut anywhere, any traceparent: no panic, and what is kept
    /// is bounded by what came in.
    mod props {
        use proptest::prelude::*;

        use super::*;
        use crate::requests::testing::bytes;

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
        }
    }
}
