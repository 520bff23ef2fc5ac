//! HTTP/2 request context, end to end: a node:http2 server (h2c, and TLS
//! with ALPN h2) answering 40 requests multiplexed on 2 client sessions
//! (20 concurrent streams each, sent after random delays so the streams of
//! both sessions interleave), every request with a random W3C traceparent,
//! each handler doing two async fs.stat (the second in the first's
//! callback) before answering; every 7th request answered 503
//! (tests/fixtures/http2_server.js). Real uvspan, real eBPF, real node, real
//! OTLP. Checked: one SERVER span per stream with its method, path, redacted
//! query, scheme, authority, protocol version 2, status and user agent, in
//! the caller's trace under the caller's span; a 503 stream is ERROR; both
//! fs spans of each stream under its SERVER span (at least 95%, the share
//! printed). The h2c case on the host, with uvspan and the app in one
//! non-host PID and mount namespace, and with the app alone in its own; on
//! every official build and a stripped node. gRPC as @grpc/grpc-js answers
//! on the wire (tests/fixtures/grpc_server.js): `{package.Service}/{Method}`
//! spans with `rpc.*` and the call's grpc-status. Clients: HTTP/2 calls
//! (h2c and TLS) made under incoming HTTP/1 requests, each a CLIENT span in
//! its caller's trace matched to its own response per stream
//! (tests/fixtures/http2_client.js); a real @grpc/grpc-js client's calls
//! under requests, CLIENT spans with `rpc.*` and the server's SERVER span
//! under them (tests/fixtures/grpc_js.js). Root only; never skipped.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::*;

const N: usize = 40;
const SESSIONS: &str = "2";

/// The gRPC fixtures' `{"marker":"call",...}` lines, `n` of them.
fn call_markers(out: &Output, n: usize) -> Vec<serde_json::Value> {
    let calls: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("{\"marker\":\"call\""))
        .map(|l| serde_json::from_str(l).expect("call marker"))
        .collect();
    assert_eq!(calls.len(), n, "{}", out.context());
    calls
}

/// A gRPC call's SERVER span (its fixture's call marker): the only gRPC
/// one in the caller's trace, under the caller's span, named and
/// attributed as `test.Echo/{method}` with the call's grpc-status.
fn grpc_server_span<'a>(spans: &'a [Span], call: &serde_json::Value, i: u64, method: &str, code: i64) -> &'a Span {
    let p: Vec<&str> = call["traceparent"].as_str().expect("traceparent").split('-').collect();
    let servers: Vec<&Span> = spans.iter().filter(|s| s.kind == 2 && s.trace_id == p[1] && s.str("rpc.system.name").is_some()).collect();
    let [srv] = servers[..] else { panic!("call {i}: one gRPC SERVER span in the caller's trace\n{}", dump(&servers)) };
    assert_eq!(srv.name, format!("test.Echo/{method}"), "{}", srv.brief());
    assert_eq!(srv.parent_span_id, p[2], "call {i}: under the caller's span");
    assert_eq!(srv.str("rpc.system.name"), Some("grpc"), "{}", srv.brief());
    assert_eq!(srv.str("rpc.method"), Some(format!("test.Echo/{method}").as_str()), "{}", srv.brief());
    assert_eq!(srv.str("rpc.response.status_code"), Some(grpc_code_name(code)), "{}", srv.brief());
    for old in ["rpc.system", "rpc.service", "rpc.grpc.status_code"] {
        assert!(srv.str(old).is_none() && srv.int(old).is_none(), "no {old}: {}", srv.brief());
    }
    srv
}

/// The gRPC status code's name, as `rpc.response.status_code` carries it.
fn grpc_code_name(code: i64) -> &'static str {
    match code {
        0 => "OK",
        5 => "NOT_FOUND",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        _ => panic!("no name for gRPC status {code} in this test"),
    }
}

/// What the fixture says about one request it sent: (traceparent, status).
fn sent(stdout: &str) -> BTreeMap<usize, (String, i64)> {
    let mut out = BTreeMap::new();
    for line in stdout.lines().filter(|l| l.starts_with("{\"marker\":\"req\"")) {
        let v: serde_json::Value = serde_json::from_str(line).expect("req marker");
        let i = v["i"].as_u64().expect("i") as usize;
        out.insert(i, (v["traceparent"].as_str().expect("traceparent").to_string(), v["status"].as_i64().expect("status")));
    }
    out
}

/// The fixture under uvspan in `topology`: its directory, output and spans.
fn run_h2(tag: &str, topology: Topology, fixture_args: &[String]) -> (TempDir, Output, Vec<Span>) {
    run_h2_on("node", tag, topology, fixture_args)
}

fn run_h2_on(node: &str, tag: &str, topology: Topology, fixture_args: &[String]) -> (TempDir, Output, Vec<Span>) {
    run_h2_with(node, tag, topology, fixture_args, &[])
}

fn run_h2_with(node: &str, tag: &str, topology: Topology, fixture_args: &[String], env: &[(&str, &str)]) -> (TempDir, Output, Vec<Span>) {
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let dir = TempDir::new(tag);
    let uv = ["--loop-threshold", "10m", "--status-interval", "0", "--otlp-endpoint", ep.as_str()];
    let mut app: Vec<String> = vec![node.into(), fixture("http2_server.js"), dir.str(), N.to_string(), SESSIONS.into()];
    app.extend(fixture_args.iter().cloned());
    let app: Vec<&str> = app.iter().map(String::as_str).collect();
    let mut c = topology.command(&uv, &app);
    c.envs(env.iter().copied());
    let out = run(c);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    assert!(out.stdout.contains("{\"marker\":\"done\"}"), "{}", out.context());
    check_summary(&out, rx.spans().len());
    (dir, out, rx.spans())
}

/// One SERVER span per stream, its attributes, the caller's trace, its two
/// stats under it.
/// `full`: a build with libuv's internals. Without them (a stripped node)
/// the client's address is not known (no uv__stream_io, whose connection
/// it is read from) and work started in a callback joins no request (no
/// uv__fs_done, where the cause is restored): only the handler's first stat
/// is under its SERVER span.
fn check_streams(dir: &TempDir, out: &Output, spans: &[Span], scheme: &str, what: &str, full: bool) {
    let sent = sent(&out.stdout);
    assert_eq!(sent.len(), N, "{}", out.context());
    let servers: Vec<&Span> = spans.iter().filter(|s| s.kind == 2).collect();
    let mut by_i: BTreeMap<usize, &Span> = BTreeMap::new();
    for s in &servers {
        let path = s.str("url.path").unwrap_or_else(|| panic!("url.path: {}", s.brief()));
        let i = path.rsplit('/').next().and_then(|i| i.parse::<usize>().ok()).unwrap_or_else(|| panic!("/kind/<i>: {}", s.brief()));
        assert!(by_i.insert(i, s).is_none(), "two SERVER spans for stream {i}\n{}", dump(&servers));
    }
    assert_eq!(by_i.len(), N, "one SERVER span per stream ({what})\n{}", dump(&servers));
    let mut errors = 0;
    for (i, (tp, status)) in &sent {
        let srv = by_i[i];
        let kind = if *status == 503 { "fail" } else { "item" };
        assert_eq!(srv.name, format!("GET /{kind}/{{id}}"), "{}", srv.brief());
        assert_eq!(srv.str("url.template"), Some(format!("/{kind}/{{id}}").as_str()), "{}", srv.brief());
        assert_eq!(srv.str("http.request.method"), Some("GET"));
        assert_eq!(srv.str("url.path"), Some(format!("/{kind}/{i}").as_str()), "{}", srv.brief());
        assert_eq!(srv.str("url.query"), Some(format!("token=REDACTED&n={i}").as_str()), "{}", srv.brief());
        assert_eq!(srv.str("url.scheme"), Some(scheme), "{}", srv.brief());
        assert_eq!(srv.str("network.protocol.version"), Some("2"), "{}", srv.brief());
        assert_eq!(srv.str("server.address"), Some("127.0.0.1"), "{}", srv.brief());
        assert_eq!(srv.str("user_agent.original"), Some("uvspan-test/1"), "{}", srv.brief());
        if full {
            assert_eq!(srv.str("client.address"), Some("127.0.0.1"), "{}", srv.brief());
            assert!(srv.int("client.port").is_some_and(|p| p > 0), "{}", srv.brief());
        } else {
            assert_eq!(srv.str("client.address"), None, "{}", srv.brief());
        }
        assert_eq!(srv.int("http.response.status_code"), Some(*status), "{}", srv.brief());
        if *status >= 500 {
            errors += 1;
            assert_eq!(srv.status, StatusCode::Error, "a 5xx stream is ERROR: {}", srv.brief());
        } else {
            assert_ne!(srv.status, StatusCode::Error, "{}", srv.brief());
        }
        let p: Vec<&str> = tp.split('-').collect();
        assert_eq!(srv.trace_id, p[1], "stream {i}: the caller's trace\n{}", srv.brief());
        assert_eq!(srv.parent_span_id, p[2], "stream {i}: under the caller's span\n{}", srv.brief());
    }
    assert!(errors > 0, "the fixture answered some streams 503");
    // The streams were in flight together (what the per-stream cause is for).
    let overlapping = servers
        .iter()
        .map(|a| servers.iter().filter(|b| b.start_unix_nano < a.end_unix_nano && a.start_unix_nano < b.end_unix_nano).count())
        .max()
        .unwrap_or(0);
    eprintln!("http2 ({what}): most SERVER spans in flight at once: {overlapping}");
    assert!(overlapping >= 2, "streams interleaved: at most {overlapping} in flight at once");
    let under = |i: usize, x: &str| {
        let srv = by_i[&i];
        let file = dir.join(&format!("s{i}-{x}"));
        spans
            .iter()
            .filter(|s| {
                s.name == "fs.stat"
                    && s.str("file.path") == Some(file.as_str())
                    && s.trace_id == srv.trace_id
                    && s.parent_span_id == srv.span_id
            })
            .count()
            == 1
    };
    let first = (0..N).filter(|&i| under(i, "a")).count();
    let both = (0..N).filter(|&i| under(i, "a") && under(i, "b")).count();
    eprintln!("http2 ({what}): streams with their first stat under their SERVER span: {first}/{N}, with both: {both}/{N}");
    let joined = if full { both } else { first };
    assert!(joined * 100 >= N * 95, "{joined} of {N} streams have their stats under their SERVER span (< 95%; full: {full})");
    // Every stat of the fixture is some stream's.
    let stats: Vec<&Span> = spans.iter().filter(|s| s.str("file.path").is_some_and(|f| f.starts_with(&dir.str()))).collect();
    assert_eq!(stats.len(), 2 * N, "two stats per stream\n{}", dump(&stats));
}

#[test]
fn h2c_streams_are_server_spans_with_their_work_under_them() {
    require_root();
    let (dir, out, spans) = run_h2("h2c-host", Topology::Host, &[]);
    check_streams(&dir, &out, &spans, "http", "h2c, host", true);
}

#[test]
fn h2c_streams_with_uvspan_and_the_app_in_one_pid_namespace() {
    require_root();
    let (dir, out, spans) = run_h2("h2c-both", Topology::BothInOne, &[]);
    check_streams(&dir, &out, &spans, "http", "h2c, both in one namespace", true);
}

#[test]
fn h2c_streams_with_the_app_alone_in_its_pid_namespace() {
    require_root();
    let (dir, out, spans) = run_h2("h2c-alone", Topology::AppAlone, &[]);
    check_streams(&dir, &out, &spans, "http", "h2c, app alone in its namespace", true);
}

/// Streams the sampler drops as roots (`parentbased_always_off`) but whose
/// callers sampled them (traceparent flag 01): the kernel sends none of
/// their headers as they come, and decides each stream when its HEADERS
/// frame has been read; sampled by its traceparent, its saved headers go up
/// then. Each is exported as if sent as it came: every attribute, the
/// client's address, the caller's trace, its work under it.
fn streams_dropped_as_roots_in(topology: Topology, tag: &str) {
    streams_dropped_as_roots_over(topology, tag, &[], "http");
}

/// As `streams_dropped_as_roots_in`, the fixture given `fixture_args`
/// (`--tls KEY CERT`: scheme https).
fn streams_dropped_as_roots_over(topology: Topology, tag: &str, fixture_args: &[String], scheme: &str) {
    require_root();
    let env = [("OTEL_TRACES_SAMPLER", "parentbased_always_off")];
    let (dir, out, spans) = run_h2_with("node", tag, topology, fixture_args, &env);
    check_streams(&dir, &out, &spans, scheme, &format!("{scheme}, dropped as roots, {topology:?}"), true);
    assert!(!out.stderr.contains(" of them followed in the kernel"), "every stream was sampled by its caller\n{}", out.context());
    assert!(!out.stderr.contains("HTTP/2 request headers not sent"), "every header fit what a stream saves\n{}", out.context());
}

/// Streams dropped as roots, sampled by their callers, each with 8
/// tracestate fields after its 4 pseudo-headers, traceparent and
/// user-agent: 14 kept headers, of which a stream saves 10. The first 10
/// are sent (the stream whole), the other 4 of each stream counted.
fn repeated_headers_past_what_a_stream_saves_in(topology: Topology, tag: &str) {
    require_root();
    let env = [("OTEL_TRACES_SAMPLER", "parentbased_always_off"), ("FIXTURE_TRACESTATES", "8")];
    let (dir, out, spans) = run_h2_with("node", tag, topology, &[], &env);
    check_streams(&dir, &out, &spans, "http", &format!("8 tracestates, dropped as roots, {topology:?}"), true);
    let unsent = summary_number(&out.stderr, " HTTP/2 request headers not sent");
    assert_eq!(unsent, 4 * N as u64, "4 tracestate fields of each of the {N} streams past the 10 saved ({topology:?})\n{}", out.context());
}

#[test]
fn repeated_headers_past_what_a_stream_saves_are_counted() {
    repeated_headers_past_what_a_stream_saves_in(Topology::Host, "h2c-unsent");
}

#[test]
fn repeated_headers_past_what_a_stream_saves_are_counted_in_one_namespace() {
    repeated_headers_past_what_a_stream_saves_in(Topology::BothInOne, "h2c-unsent-both");
}

#[test]
fn repeated_headers_past_what_a_stream_saves_are_counted_app_alone() {
    repeated_headers_past_what_a_stream_saves_in(Topology::AppAlone, "h2c-unsent-alone");
}

#[test]
fn streams_dropped_as_roots_wait_for_their_traceparent() {
    streams_dropped_as_roots_in(Topology::Host, "h2c-roots");
}

#[test]
fn tls_streams_dropped_as_roots_wait_for_their_traceparent() {
    let certs = TempDir::new("h2-roots-tls-certs");
    let (key, cert) = self_signed(&certs);
    streams_dropped_as_roots_over(Topology::Host, "h2-roots-tls", &["--tls".into(), key, cert], "https");
}

#[test]
fn streams_dropped_as_roots_wait_for_their_traceparent_in_one_namespace() {
    streams_dropped_as_roots_in(Topology::BothInOne, "h2c-roots-both");
}

#[test]
fn streams_dropped_as_roots_wait_for_their_traceparent_app_alone() {
    streams_dropped_as_roots_in(Topology::AppAlone, "h2c-roots-alone");
}

#[test]
fn tls_h2_streams_too() {
    require_root();
    let certs = TempDir::new("h2-certs");
    let (key, cert) = self_signed(&certs);
    let (dir, out, spans) = run_h2("h2-tls", Topology::Host, &["--tls".into(), key, cert]);
    check_streams(&dir, &out, &spans, "https", "TLS, ALPN h2", true);
}

/// The HTTP/2 probe points of a node build, as `uvspan probes` lists them
/// (nghttp2_submit_request: with session uprobes).
const H2_SYMBOLS: [&str; 7] = [
    "_ZN4node5http212Http2Session16OnHeaderCallbackEP15nghttp2_sessionPK13nghttp2_frameP13nghttp2_rcbufS8_hPv",
    "_ZN4node5http212Http2Session14OnFrameReceiveEP15nghttp2_sessionPK13nghttp2_framePv",
    "_ZN4node5http212Http2Session19OnDataChunkReceivedEP15nghttp2_sessionhiPKhmPv",
    "nghttp2_submit_response",
    "nghttp2_submit_trailer",
    "_ZN4node5http212Http2Session13OnStreamCloseEP15nghttp2_sessionijPv",
    "nghttp2_submit_request",
];

/// Every official build (18, 20, 22, 24, 26 from the test cache) and the
/// stripped node (only .dynsym, where node exports these symbols too),
/// official builds also with streams dropped as roots (their headers sent
/// at the frame's end):
/// `uvspan probes` lists the HTTP/2 points usable and not single-stepped,
/// and the h2c case holds (on the stripped node as far as it can: see
/// check_streams), its calls too (check_h2_calls).
#[test]
fn h2c_on_every_official_build_and_the_stripped_node() {
    require_root();
    let builds: Vec<(String, std::path::PathBuf)> = [18, 20, 22, 24, 26]
        .into_iter()
        .map(|m| (format!("node {m}"), official_node(m)))
        .chain([("stripped node".to_string(), stripped_node())])
        .collect();
    for (name, node) in builds {
        let listing = run(uvspan_cmd(["probes", "--json", &node.to_string_lossy()]));
        assert_eq!(listing.code(), Some(0), "{}", listing.context());
        let v: serde_json::Value = serde_json::from_str(&listing.stdout).expect("json");
        for sym in H2_SYMBOLS {
            let p = v["probes"]
                .as_array()
                .expect("probes")
                .iter()
                .find(|p| p["symbol"] == sym)
                .unwrap_or_else(|| panic!("{name}: {sym} not listed"));
            assert_eq!(p["status"], "usable", "{name}: {sym}: {p}");
            assert_ne!(p["single_stepped"], true, "{name}: {sym} single-stepped");
        }
        let (dir, out, spans) = run_h2_on(&node.to_string_lossy(), &format!("h2c-{}", name.replace(' ', "-")), Topology::Host, &[]);
        // The stripped node keeps only libuv's exported API.
        check_streams(&dir, &out, &spans, "http", &name, !name.starts_with("stripped"));
        // Dropped as roots: the headers are read again at the frame's end
        // (on the official builds: on the stripped node, the work a
        // callback starts joins no stream, and this sampler drops it).
        if !name.starts_with("stripped") {
            let env = [("OTEL_TRACES_SAMPLER", "parentbased_always_off")];
            let tag = format!("h2c-roots-{}", name.replace(' ', "-"));
            let (dir, out, spans) = run_h2_with(&node.to_string_lossy(), &tag, Topology::Host, &[], &env);
            check_streams(&dir, &out, &spans, "http", &format!("{name}, dropped as roots"), true);
        }
        h2_calls_on(&node.to_string_lossy(), Topology::Host, &format!("h2call-{}", name.replace(' ', "-")), false);
    }
}

/// gRPC over node:http2 as @grpc/grpc-js answers on the wire
/// (tests/fixtures/grpc_server.js, 20 concurrent calls on one session):
/// each call a SERVER span named `{package.Service}/{Method}` with
/// `rpc.system.name`, `rpc.method` (`test.Echo/Say`) and `rpc.response.status_code`
/// (from trailers, or from the headers of a trailers-only answer), INTERNAL
/// and UNIMPLEMENTED as ERROR, in the caller's trace, with the stats of its
/// 'data' and 'end' handlers under it (at least 95%).
#[test]
fn grpc_calls_are_named_by_service_and_method() {
    require_root();
    const CALLS: usize = 20;
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let dir = TempDir::new("grpc");
    let mut c = Command::new(uvspan_bin());
    c.args(["--loop-threshold", "10m", "--status-interval", "0", "--otlp-endpoint", ep.as_str(), "--", "node"])
        .arg(fixture("grpc_server.js"))
        .arg(dir.str())
        .arg(CALLS.to_string());
    scrub_env(&mut c);
    c.stdin(std::process::Stdio::null());
    let out = run(c);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    assert!(out.stdout.contains("{\"marker\":\"done\"}"), "{}", out.context());
    let spans = rx.spans();
    check_summary(&out, spans.len());
    let calls = call_markers(&out, CALLS);
    let mut joined = 0;
    for call in &calls {
        let (i, method, code) =
            (call["i"].as_u64().expect("i"), call["method"].as_str().expect("method"), call["code"].as_i64().expect("code"));
        let srv = grpc_server_span(&spans, call, i, method, code);
        assert_eq!(srv.int("http.response.status_code"), Some(200), "{}", srv.brief());
        assert_eq!(srv.status == StatusCode::Error, code != 0, "grpc-status {code}: {}", srv.brief());
        let under = |x: &str| {
            let file = dir.join(&format!("g{i}-{x}"));
            spans.iter().any(|s| s.str("file.path") == Some(file.as_str()) && s.parent_span_id == srv.span_id && s.trace_id == srv.trace_id)
        };
        joined += usize::from(under("data") && under("end"));
    }
    eprintln!("grpc: calls with their 'data' and 'end' handlers' stats under their SERVER span: {joined}/{CALLS}");
    assert!(joined * 100 >= CALLS * 95, "{joined} of {CALLS} calls have both stats under their SERVER span (< 95%)");
}

/// The sampler decided in the kernel for HTTP/2 streams: each stream is
/// decided as a root at its first header and again at its traceparent
/// (parentbased_always_on, the default: the caller's flag decides). The
/// streams the callers did not sample send no record of their work (the
/// kernel counts it, and says so); the sampled ones are whole; the fs
/// metric counts both.
fn unsampled_streams_in(topology: Topology) {
    unsampled_streams_with(topology, false, None);
}

/// The same under `parentbased_always_off`: every stream is dropped as a
/// root, so the kernel waits for its traceparent before it sends anything;
/// the streams their callers did not sample send no record at all (the
/// kernel follows them to their close and counts them), the sampled ones
/// are whole.
fn unsampled_streams_dropped_as_roots_in(topology: Topology) {
    unsampled_streams_with(topology, false, Some("parentbased_always_off"));
}

/// With `keep_errors` (`--keep-errors`): the failed streams (503) among the
/// unsampled are kept whole too (the kernel follows no HTTP/2 stream: their
/// work is sent, marked as counted, and the tracker decides), and the
/// metrics count each operation once.
fn unsampled_streams_with(topology: Topology, keep_errors: bool, sampler: Option<&str>) {
    unsampled_streams_over(topology, keep_errors, sampler, &[], "http");
}

/// As `unsampled_streams_with`, the fixture given `fixture_args` (`--tls
/// KEY CERT`: scheme https).
fn unsampled_streams_over(topology: Topology, keep_errors: bool, sampler: Option<&str>, fixture_args: &[String], scheme: &str) {
    require_root();
    let col = common::collector::Collector::start(common::collector::Listen::Plain);
    let ep = format!("http://127.0.0.1:{}", col.port());
    let dir = TempDir::new("h2-sampled");
    let mut uv = vec!["--loop-threshold", "10m", "--status-interval", "0"];
    if keep_errors {
        uv.push("--keep-errors");
    }
    let mut app = vec!["node".to_string(), fixture("http2_server.js"), dir.str(), N.to_string(), SESSIONS.into()];
    app.extend(fixture_args.iter().cloned());
    let app: Vec<&str> = app.iter().map(String::as_str).collect();
    let mut c = topology.command(&uv, &app);
    c.envs([
        ("OTEL_EXPORTER_OTLP_ENDPOINT", ep.as_str()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
        ("FIXTURE_UNSAMPLED_ODD", "1"),
    ]);
    if let Some(name) = sampler {
        c.env("OTEL_TRACES_SAMPLER", name);
    }
    let out = run(c);
    let ctx = format!("{topology:?}\n{}", out.context());
    assert_eq!(out.code(), Some(0), "{ctx}");
    let spans = col.spans();
    let sent = sent(&out.stdout);
    assert_eq!(sent.len(), N, "{ctx}");
    let servers: Vec<&Span> = spans.iter().filter(|s| s.kind == 2).collect();
    let mut kept = Vec::new();
    for srv in &servers {
        let i: usize = srv.str("url.path").and_then(|p| p.rsplit('/').next().and_then(|i| i.parse().ok())).expect("/kind/<i>");
        let work = spans.iter().filter(|s| s.parent_span_id == srv.span_id && s.trace_id == srv.trace_id).count();
        assert_eq!(work, 2, "a sampled stream is whole: {}\n{ctx}", srv.brief());
        kept.push(i);
    }
    kept.sort_unstable();
    let failed = |i: &usize| sent[i].1 >= 500;
    let want: Vec<usize> = (0..N).filter(|i| i % 2 == 0 || (keep_errors && failed(i))).collect();
    assert_eq!(kept, want, "the streams their callers sampled (and, with --keep-errors, the failed ones)\n{ctx}");
    if keep_errors {
        let failed_unsampled = (0..N).filter(|i| i % 2 == 1 && failed(i)).count();
        assert!(failed_unsampled > 0);
        assert!(out.stderr.contains(&format!("{failed_unsampled} not sampled but kept")), "{ctx}");
    }
    // The unsampled streams' work was not sent up: the kernel counted it.
    let counted = summary_number(&out.stderr, " operations of unsampled traces counted in the kernel");
    assert_eq!(counted, N as u64, "two stats of each of the {} unsampled streams\n{ctx}", N / 2);
    let stats = common::collector::histogram_count(
        &col,
        "uvspan.fs.duration",
        &[("uvspan.fs.operation", "\"fs.stat\""), ("uvspan.fs.sync", "false")],
    );
    assert_eq!(stats, 2 * N as u64, "the metric counts every stream's stats\n{ctx}");
    // Every stream is in http.server.request.duration with its method,
    // scheme, version and status, sampled or not: counted in the kernel
    // (no record) for a stream dropped as a root whose caller did not
    // sample it either (the kernel waited for its traceparent), else by the
    // tracker (a stream kept as a root that its traceparent drops, or any
    // with --keep-errors).
    let requests = |status: &str| {
        let scheme = format!("\"{scheme}\"");
        let mut want = vec![("network.protocol.version", "\"2\""), ("http.request.method", "\"GET\""), ("url.scheme", scheme.as_str())];
        if !status.is_empty() {
            want.push(("http.response.status_code", status));
        }
        common::collector::histogram_count(&col, "http.server.request.duration", &want)
    };
    let failed_n = (0..N).filter(failed).count() as u64;
    assert_eq!(requests(""), N as u64, "every stream counted once\n{ctx}");
    assert_eq!(requests("503"), failed_n, "the failed streams, with their status\n{ctx}");
    assert_eq!(requests("200"), N as u64 - failed_n, "the others, with theirs\n{ctx}");
    let followed = if sampler.is_some() && !keep_errors { N as u64 / 2 } else { 0 };
    let in_kernel =
        out.stderr.contains(" of them followed in the kernel").then(|| summary_number(&out.stderr, " of them followed in the kernel"));
    assert_eq!(in_kernel.unwrap_or(0), followed, "the unsampled streams the kernel followed, no record sent\n{ctx}");
}

#[test]
fn unsampled_streams_send_no_record_of_their_work() {
    unsampled_streams_in(Topology::Host);
}

#[test]
fn unsampled_failed_streams_are_kept_whole_with_keep_errors() {
    unsampled_streams_with(Topology::Host, true, None);
}

#[test]
fn unsampled_failed_streams_are_kept_whole_with_keep_errors_in_one_namespace() {
    unsampled_streams_with(Topology::BothInOne, true, None);
}

#[test]
fn unsampled_failed_streams_are_kept_whole_with_keep_errors_app_alone() {
    unsampled_streams_with(Topology::AppAlone, true, None);
}

#[test]
fn unsampled_streams_send_no_record_of_their_work_in_one_namespace() {
    unsampled_streams_in(Topology::BothInOne);
}

#[test]
fn unsampled_streams_send_no_record_of_their_work_app_alone() {
    unsampled_streams_in(Topology::AppAlone);
}

#[test]
fn unsampled_streams_dropped_as_roots_send_no_record_at_all() {
    unsampled_streams_dropped_as_roots_in(Topology::Host);
}

#[test]
fn unsampled_tls_streams_dropped_as_roots_send_no_record_at_all() {
    let certs = TempDir::new("h2-roots-certs");
    let (key, cert) = self_signed(&certs);
    unsampled_streams_over(Topology::Host, false, Some("parentbased_always_off"), &["--tls".into(), key, cert], "https");
}

#[test]
fn unsampled_streams_dropped_as_roots_send_no_record_at_all_in_one_namespace() {
    unsampled_streams_dropped_as_roots_in(Topology::BothInOne);
}

#[test]
fn unsampled_streams_dropped_as_roots_send_no_record_at_all_app_alone() {
    unsampled_streams_dropped_as_roots_in(Topology::AppAlone);
}

/// A real @grpc/grpc-js server and client (bench/node_modules; a service
/// defined by hand, JSON messages): unary, server-streaming and failing
/// (UNAVAILABLE) calls, each made under an incoming HTTP/1 request (all at
/// once, on one client connection), each with a traceparent in its
/// metadata: the request's trace, a span id of its own
/// (tests/fixtures/grpc_js.js). Each call is a CLIENT span named
/// `{package.Service}/{Method}` with `rpc.*` and its grpc-status (ERROR for
/// the failing one), in its caller's trace under the caller's SERVER span,
/// with the span id the app wrote; the work of its callback under the
/// caller; and a SERVER span of the same name, its grpc-status, ERROR for
/// the failing one, under the CLIENT span, the handler's stat under it. On
/// the host, in one namespace, with the app alone in its own.
fn grpc_js_in(topology: Topology, tag: &str) {
    grpc_js_with(topology, tag, "node");
}

fn grpc_js_with(topology: Topology, tag: &str, node: &str) {
    const CALLS: usize = 18;
    let modules = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/node_modules");
    assert!(
        modules.join("@grpc/grpc-js").is_dir(),
        "@grpc/grpc-js is not installed in {}: run `npm ci` in bench/ (scripts/test.sh does)",
        modules.display()
    );
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let dir = TempDir::new(tag);
    let uv = ["--loop-threshold", "10m", "--status-interval", "0", "--otlp-endpoint", ep.as_str()];
    let (script, d, n) = (fixture("grpc_js.js"), dir.str(), CALLS.to_string());
    let mut c = topology.command(&uv, &[node, &script, &d, &n]);
    c.env("NODE_PATH", &modules);
    let out = run(c);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    assert!(out.stdout.contains("{\"marker\":\"done\"}"), "{}", out.context());
    let spans = rx.spans();
    check_summary(&out, spans.len());
    let calls = call_markers(&out, CALLS);
    let clients: Vec<&Span> = spans.iter().filter(|s| s.kind == 3 && s.str("rpc.system.name") == Some("grpc")).collect();
    assert_eq!(clients.len(), CALLS, "a CLIENT span per call\n{}", dump(&clients));
    for call in &calls {
        let (i, method, code) =
            (call["i"].as_u64().expect("i"), call["method"].as_str().expect("method"), call["code"].as_i64().expect("code"));
        assert_eq!(code, if method == "Fail" { 14 } else { 0 }, "the fixture's own view of call {i}: {call}");
        let caller_tp: Vec<&str> = call["caller"].as_str().expect("caller").split('-').collect();
        let written: Vec<&str> = call["traceparent"].as_str().expect("traceparent").split('-').collect();
        let path = format!("/call/{i}");
        let caller = spans
            .iter()
            .find(|s| s.kind == 2 && s.str("url.path") == Some(path.as_str()))
            .unwrap_or_else(|| panic!("no SERVER span of {path}"));
        assert_eq!((caller.trace_id.as_str(), caller.parent_span_id.as_str()), (caller_tp[1], caller_tp[2]), "{}", caller.brief());
        // The client's span: in its caller's trace, under its SERVER span.
        let mine: Vec<&&Span> = clients.iter().filter(|c| c.trace_id == caller_tp[1]).collect();
        let [client] = mine[..] else { panic!("call {i}: one gRPC CLIENT span in the caller's trace\n{}", dump(&clients)) };
        assert_eq!(client.name, format!("test.Echo/{method}"), "{}", client.brief());
        assert_eq!(client.parent_span_id, caller.span_id, "call {i}: under its caller's SERVER span\n{}", client.brief());
        assert_eq!(client.span_id, written[2], "call {i}: the span id the app wrote\n{}", client.brief());
        assert_eq!(client.str("rpc.method"), Some(format!("test.Echo/{method}").as_str()), "{}", client.brief());
        assert_eq!(client.str("rpc.response.status_code"), Some(grpc_code_name(code)), "{}\nall:\n{}", client.brief(), dump(&clients));
        assert_eq!(client.int("http.response.status_code"), Some(200), "{}", client.brief());
        assert_eq!(client.str("network.protocol.version"), Some("2"), "{}", client.brief());
        assert_eq!(client.str("server.address"), Some("127.0.0.1"), "{}", client.brief());
        assert_eq!(client.status == StatusCode::Error, code != 0, "grpc-status {code}: {}", client.brief());
        let done = dir.join(&format!("r{i}"));
        let stat = spans.iter().find(|s| s.str("file.path") == Some(done.as_str())).unwrap_or_else(|| panic!("no stat of {done}"));
        assert_eq!(
            (stat.trace_id.as_str(), stat.parent_span_id.as_str()),
            (caller.trace_id.as_str(), caller.span_id.as_str()),
            "call {i}: its callback's stat under its caller\n{}",
            stat.brief()
        );
        // The server's span: under the client's.
        let srv = grpc_server_span(&spans, call, i, method, code);
        assert_eq!(srv.status == StatusCode::Error, code != 0, "grpc-status {code}: {}", srv.brief());
        let file = dir.join(&format!("g{i}"));
        let stat = spans.iter().find(|s| s.str("file.path") == Some(file.as_str())).unwrap_or_else(|| panic!("no stat of {file}"));
        assert_eq!(
            (stat.trace_id.as_str(), stat.parent_span_id.as_str()),
            (srv.trace_id.as_str(), srv.span_id.as_str()),
            "call {i}'s stat under it\n{}\n{}",
            stat.brief(),
            srv.brief()
        );
    }
    eprintln!(
        "grpc-js ({tag}): {CALLS} calls (unary, server-streaming, UNAVAILABLE) under HTTP/1 requests: each a CLIENT span under its caller, a SERVER span under it with rpc.* and its stat"
    );
}

#[test]
fn grpc_js_calls_are_server_spans_with_their_work() {
    require_root();
    grpc_js_in(Topology::Host, "grpcjs-host");
}

/// The same on every official build (18, 20, 22, 24, 26), on the host.
/// A real @grpc/grpc-js server and client's calls as the RPC conventions' metrics:
/// `rpc.server.call.duration` and `rpc.client.call.duration` count every call once, by
/// `rpc.method` and the status's name, and none of them is an HTTP/2 request in
/// `http.server.request.duration` (the HTTP/1 requests that make them are).
#[test]
fn grpc_js_calls_are_rpc_call_durations() {
    require_root();
    const CALLS: usize = 12;
    let modules = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/node_modules");
    assert!(modules.join("@grpc/grpc-js").is_dir(), "@grpc/grpc-js is not installed: run `npm ci` in bench/");
    let col = common::collector::Collector::start(common::collector::Listen::Plain);
    let ep = format!("http://127.0.0.1:{}", col.port());
    let dir = TempDir::new("grpcjs-metrics");
    let uv = ["--loop-threshold", "10m", "--status-interval", "0"];
    let (script, d, n) = (fixture("grpc_js.js"), dir.str(), CALLS.to_string());
    let mut c = Topology::Host.command(&uv, &["node", &script, &d, &n]);
    c.env("NODE_PATH", &modules);
    c.envs([
        ("OTEL_EXPORTER_OTLP_ENDPOINT", ep.as_str()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
    ]);
    let out = run(c);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let calls = call_markers(&out, CALLS);
    let failing = calls.iter().filter(|c| c["method"].as_str() == Some("Fail")).count() as u64;
    assert!(failing > 0 && failing < CALLS as u64, "the fixture makes failing and good calls");
    let count = |metric: &str, want: &[(&str, &str)]| common::collector::histogram_count(&col, metric, want);
    for metric in ["rpc.server.call.duration", "rpc.client.call.duration"] {
        let grpc = [("rpc.system.name", "\"grpc\"")];
        assert_eq!(count(metric, &grpc), CALLS as u64, "{metric}: every call once\n{}", out.context());
        let unavailable = [("rpc.response.status_code", "\"UNAVAILABLE\""), ("error.type", "\"UNAVAILABLE\"")];
        assert_eq!(count(metric, &unavailable), failing, "{metric}: the failing calls\n{}", out.context());
        assert_eq!(count(metric, &[("rpc.response.status_code", "\"OK\"")]), CALLS as u64 - failing, "{metric}\n{}", out.context());
        assert_eq!(count(metric, &[("rpc.method", "/Fail\"")]), failing, "{metric}: rpc.method is Service/Method\n{}", out.context());
    }
    assert_eq!(count("http.server.request.duration", &[("network.protocol.version", "\"2\"")]), 0, "gRPC calls are not HTTP metrics");
    assert_eq!(count("http.server.request.duration", &[("network.protocol.version", "\"1.1\"")]), CALLS as u64, "{}", out.context());
}

#[test]
fn grpc_js_calls_on_every_official_build() {
    require_root();
    for major in [18, 20, 22, 24, 26] {
        let node = official_node(major);
        grpc_js_with(Topology::Host, &format!("grpcjs-node{major}"), &node.to_string_lossy());
    }
}

#[test]
fn grpc_js_calls_in_one_namespace() {
    require_root();
    grpc_js_in(Topology::BothInOne, "grpcjs-both");
}

#[test]
fn grpc_js_calls_of_an_app_alone_in_its_namespace() {
    require_root();
    grpc_js_in(Topology::AppAlone, "grpcjs-alone");
}

/// HTTP/2 calls a request makes (tests/fixtures/http2_client.js: N HTTP/1
/// requests at once, each making two calls at once on one HTTP/2 session
/// all share, each call with a traceparent in the request's trace and a
/// span id of its own): a CLIENT span per stream, in its caller's trace
/// under the caller's SERVER span, with its method, path, server, protocol
/// version 2 and its own response's status (404 and 503 answers among
/// 200 and 201: a pairing of a stream with another's response fails), ERROR
/// for 4xx/5xx; its span id the one the app wrote, so the backend's SERVER
/// span is under it; the stat its 'response' handler made under the
/// caller's SERVER span (at least 95%).
fn check_h2_calls(dir: &TempDir, out: &Output, spans: &[Span], n: usize, scheme: &str, what: &str) {
    let sent: Vec<serde_json::Value> =
        out.stdout.lines().filter(|l| l.starts_with("{\"marker\":\"req\"")).map(|l| serde_json::from_str(l).expect("req marker")).collect();
    assert_eq!(sent.len(), n, "{}", out.context());
    let clients: Vec<&Span> = spans.iter().filter(|s| s.kind == 3 && s.str("network.protocol.version") == Some("2")).collect();
    assert_eq!(clients.len(), 2 * n, "a CLIENT span per HTTP/2 call ({what})\n{}", dump(&clients));
    let (mut joined, mut errors) = (0, 0);
    for v in &sent {
        let i = v["i"].as_u64().expect("i");
        let p: Vec<&str> = v["traceparent"].as_str().expect("traceparent").split('-').collect();
        let path = format!("/call/{i}");
        let caller = spans
            .iter()
            .find(|s| s.kind == 2 && s.str("url.path") == Some(path.as_str()))
            .unwrap_or_else(|| panic!("no SERVER span of {path} ({what})"));
        assert_eq!((caller.trace_id.as_str(), caller.parent_span_id.as_str()), (p[1], p[2]), "{}", caller.brief());
        for x in ["a", "b"] {
            let call = &v["calls"][x];
            let (span, status) = (call["span"].as_str().expect("span"), call["status"].as_i64().expect("status"));
            let path = format!("/b/{i}/{x}");
            let c = clients
                .iter()
                .find(|c| c.str("url.path") == Some(path.as_str()))
                .unwrap_or_else(|| panic!("no CLIENT span of {path} ({what})\n{}", dump(&clients)));
            assert_eq!(c.name, format!("GET /b/{{id}}/{x}"), "{}", c.brief());
            assert_eq!(c.str("http.request.method"), Some("GET"), "{}", c.brief());
            assert_eq!(
                (c.trace_id.as_str(), c.parent_span_id.as_str()),
                (p[1], caller.span_id.as_str()),
                "{path}: in its caller's trace, under its SERVER span\n{}",
                c.brief()
            );
            assert_eq!(c.int("http.response.status_code"), Some(status), "{path}: its own response's status\n{}", c.brief());
            assert_eq!(c.str("url.scheme"), Some(scheme), "{}", c.brief());
            assert_eq!(c.str("server.address"), Some("127.0.0.1"), "{}", c.brief());
            assert!(c.int("server.port").is_some_and(|p| p > 0), "{}", c.brief());
            assert_eq!(c.status == StatusCode::Error, status >= 400, "ERROR for a 4xx/5xx answer: {}", c.brief());
            errors += usize::from(status >= 400);
            assert_eq!(c.span_id, span, "{path}: the span id the app wrote on the call\n{}", c.brief());
            assert!(c.start_unix_nano >= caller.start_unix_nano && c.end_unix_nano <= caller.end_unix_nano, "{path}: within its caller");
            let backend = spans
                .iter()
                .find(|s| s.kind == 2 && s.str("url.path") == Some(path.as_str()))
                .unwrap_or_else(|| panic!("no backend SERVER span of {path}"));
            assert_eq!(
                (backend.trace_id.as_str(), backend.parent_span_id.as_str()),
                (p[1], c.span_id.as_str()),
                "{path}: the backend's SERVER span under the CLIENT span\n{}",
                backend.brief()
            );
            let file = dir.join(&format!("c{i}-{x}"));
            joined += usize::from(
                spans.iter().any(|s| s.str("file.path") == Some(file.as_str()) && s.parent_span_id == caller.span_id && s.trace_id == p[1]),
            );
        }
    }
    assert!(errors > 0, "the fixture answered some calls 404 or 503");
    eprintln!("http2 calls ({what}): {} CLIENT spans; 'response' handlers' stats under their caller: {joined}/{}", clients.len(), 2 * n);
    assert!(joined * 100 >= 2 * n * 95, "{joined} of {} response handlers' stats under their caller (< 95%)", 2 * n);
}

const CALLERS: usize = 20;

fn h2_calls_in(topology: Topology, tag: &str, tls: bool) {
    h2_calls_on("node", topology, tag, tls);
}

fn h2_calls_on(node: &str, topology: Topology, tag: &str, tls: bool) {
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let dir = TempDir::new(tag);
    let certs = TempDir::new(&format!("{tag}-certs"));
    let uv = ["--loop-threshold", "10m", "--status-interval", "0", "--otlp-endpoint", ep.as_str()];
    let mut app: Vec<String> = vec![node.into(), fixture("http2_client.js"), dir.str(), CALLERS.to_string()];
    if tls {
        let (key, cert) = self_signed(&certs);
        app.extend(["--tls".into(), key, cert]);
    }
    let app: Vec<&str> = app.iter().map(String::as_str).collect();
    let out = run(topology.command(&uv, &app));
    assert_eq!(out.code(), Some(0), "{}", out.context());
    assert!(out.stdout.contains("{\"marker\":\"done\"}"), "{}", out.context());
    let spans = rx.spans();
    check_summary(&out, spans.len());
    check_h2_calls(&dir, &out, &spans, CALLERS, if tls { "https" } else { "http" }, &format!("{tag}, {topology:?}"));
}

#[test]
fn h2c_calls_of_a_request_are_client_spans_matched_per_stream() {
    require_root();
    h2_calls_in(Topology::Host, "h2call-host", false);
}

#[test]
fn h2c_calls_in_one_namespace() {
    require_root();
    h2_calls_in(Topology::BothInOne, "h2call-both", false);
}

#[test]
fn h2c_calls_of_an_app_alone_in_its_namespace() {
    require_root();
    h2_calls_in(Topology::AppAlone, "h2call-alone", false);
}

#[test]
fn tls_h2_calls_too() {
    require_root();
    h2_calls_in(Topology::Host, "h2call-tls", true);
}

/// Calls of callers that did not sample their trace (the kernel decides
/// each request at its head; parentbased_always_on): their streams keep
/// their caller's cause, so their response handlers' work is counted in
/// the kernel as unsampled, and the kernel sends no record of them (none
/// of a recording's client stream records is of an unsampled caller); the
/// sampled callers' calls are whole.
fn unsampled_callers_in(topology: Topology) {
    require_root();
    let col = common::collector::Collector::start(common::collector::Listen::Plain);
    let ep = format!("http://127.0.0.1:{}", col.port());
    let dir = TempDir::new("h2call-sampled");
    let recording = dir.join("records");
    let uv = ["--loop-threshold", "10m", "--status-interval", "0"];
    let app = ["node".to_string(), fixture("http2_client.js"), dir.str(), CALLERS.to_string()];
    let app: Vec<&str> = app.iter().map(String::as_str).collect();
    let mut c = topology.command(&uv, &app);
    c.envs([("OTEL_EXPORTER_OTLP_ENDPOINT", ep.as_str()), ("FIXTURE_UNSAMPLED_ODD", "1"), ("UVSPAN_RECORD", recording.as_str())]);
    let out = run(c);
    let ctx = format!("{topology:?}\n{}", out.context());
    assert_eq!(out.code(), Some(0), "{ctx}");
    let spans = col.spans();
    let clients: Vec<&Span> = spans.iter().filter(|s| s.kind == 3 && s.str("network.protocol.version") == Some("2")).collect();
    let mut paths: Vec<String> = clients.iter().map(|c| c.str("url.path").unwrap_or_default().to_string()).collect();
    paths.sort();
    let mut want: Vec<String> = (0..CALLERS).filter(|i| i % 2 == 0).flat_map(|i| [format!("/b/{i}/a"), format!("/b/{i}/b")]).collect();
    want.sort();
    assert_eq!(paths, want, "CLIENT spans of the sampled callers only\n{ctx}");
    // Each odd caller's two 'response' stats: counted, not sent.
    let counted = summary_number(&out.stderr, " operations of unsampled traces counted in the kernel");
    assert_eq!(counted, CALLERS as u64, "the unsampled callers' response handlers' stats\n{ctx}");
    let bytes = std::fs::read(&recording).unwrap_or_else(|e| panic!("{recording}: {e}"));
    let mut client_records = 0;
    for data in uvspan::events::decode::read_recording(&bytes) {
        if let Ok(uvspan::events::decode::Record::Http(r)) = uvspan::events::decode::decode(data) {
            if r.stream != 0 {
                assert!(!r.dropped, "a record of an unsampled caller's call: {r:?}\n{ctx}");
                client_records += 1;
            }
        }
    }
    // Per sampled call: its request headers, :status, its end.
    assert_eq!(client_records, CALLERS * 3, "client stream records\n{ctx}");
}

#[test]
fn unsampled_callers_send_no_record_of_their_calls() {
    unsampled_callers_in(Topology::Host);
}

#[test]
fn unsampled_callers_send_no_record_of_their_calls_in_one_namespace() {
    unsampled_callers_in(Topology::BothInOne);
}

#[test]
fn unsampled_callers_send_no_record_of_their_calls_app_alone() {
    unsampled_callers_in(Topology::AppAlone);
}

/// An unsampled stream the kernel follows is counted at its close; one
/// whose process exits first is not in the metrics, and the summary says
/// so. `always_off`: every stream is dropped as a root and followed; the
/// app's own client opens one stream its server never answers, then exits.
fn streams_open_at_exit_in(topology: Topology) {
    require_root();
    let script = "const h2 = require('http2'); const srv = h2.createServer(); \
        srv.on('stream', () => setTimeout(() => process.exit(0), 100)); \
        srv.listen(0, '127.0.0.1', () => { \
          const c = h2.connect('http://127.0.0.1:' + srv.address().port); \
          setTimeout(() => c.request({ ':path': '/never' }).on('error', () => {}), 300); });";
    let mut c = topology.command(&["--loop-threshold", "10m", "--status-interval", "0"], &["node", "-e", script]);
    c.env("OTEL_TRACES_SAMPLER", "always_off");
    let out = run(c);
    assert_eq!(out.code(), Some(0), "{topology:?}\n{}", out.context());
    let what = " unsampled HTTP/2 streams followed in the kernel still open when their process or uvspan exited";
    assert!(out.stderr.contains(what), "{topology:?}: not counted\n{}", out.context());
    assert_eq!(summary_number(&out.stderr, what), 1, "{topology:?}\n{}", out.context());
}

#[test]
fn streams_open_at_exit_are_counted() {
    streams_open_at_exit_in(Topology::Host);
}

#[test]
fn streams_open_at_exit_are_counted_in_one_namespace() {
    streams_open_at_exit_in(Topology::BothInOne);
}

#[test]
fn streams_open_at_exit_are_counted_app_alone() {
    streams_open_at_exit_in(Topology::AppAlone);
}
