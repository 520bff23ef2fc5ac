//! The local OTLP agent (`--otlp-listen`), end to end: the request-chain
//! server (tests/fixtures/requests_server.js) traced by the official
//! OpenTelemetry JS SDK (tests/fixtures/otel_sdk_listen.js: http
//! instrumentation, traces, metrics and logs) exports through uvspan's
//! listener, over gRPC and over HTTP/protobuf, and its traces also straight
//! to a second receiver. At uvspan's endpoint: the app's spans are exactly
//! the ones exported directly (resource, scope, ids, times, attributes),
//! its metrics and logs arrived, and at least 95% of uvspan's fs/DNS spans
//! of the requests have the app's SERVER span of their request as parent,
//! in the app's trace (requests with and without traceparent; the share is
//! printed). A collector outage loses nothing; malformed requests get the
//! protocol's error answer; an address in use stops uvspan with one line.
//! Root only, never skipped.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;

const N: usize = 48;
const CONCURRENCY: &str = "8";

fn sdk_modules() -> PathBuf {
    let modules = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/node_modules");
    assert!(
        modules.join("@opentelemetry/sdk-node").is_dir() && modules.join("@opentelemetry/exporter-trace-otlp-proto").is_dir(),
        "the OpenTelemetry JS SDK is not installed in {}: run `npm ci` in bench/ (scripts/test.sh does)",
        modules.display()
    );
    modules
}

/// uvspan with --otlp-listen on a free port, forwarding to `upstream`
/// (endpoint, protocol), running the fixture with the SDK preloaded, which
/// exports to the listener over `via` and its traces to `direct` too.
fn listen_cmd(dir: &TempDir, upstream: (&str, Protocol), via: Protocol, direct: &Receiver, extra: &[&str]) -> std::process::Command {
    let port = reserve_port();
    let listen = format!("127.0.0.1:{port}");
    let (preload, script, n) = (fixture("otel_sdk_listen.js"), fixture("requests_server.js"), N.to_string());
    let mut args = vec![
        "--loop-threshold",
        "10m",
        "--status-interval",
        "0",
        "--otlp-endpoint",
        upstream.0,
        "--otlp-protocol",
        upstream.1.flag(),
        "--otlp-listen",
        listen.as_str(),
    ];
    args.extend_from_slice(extra);
    let ds = dir.str();
    args.extend(["--", "node", "-r", preload.as_str(), script.as_str(), ds.as_str(), n.as_str(), CONCURRENCY]);
    let mut cmd = uvspan_cmd(&args);
    cmd.env("NODE_PATH", sdk_modules())
        .env("OTLP_VIA", format!("http://{listen}"))
        .env("OTLP_VIA_PROTOCOL", via.flag())
        .env("OTLP_DIRECT", direct.endpoint())
        // The SDK exports every 200 ms (a test need not wait 5 s).
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
        // Says the app runs the SDK's instrumentation (as auto-instrumentation's variable does).
        .env("OTEL_NODE_ENABLED_INSTRUMENTATIONS", "http");
    cmd
}

fn by_id(mut v: Vec<Span>) -> Vec<Span> {
    v.sort_by(|a, b| (&a.trace_id, &a.span_id).cmp(&(&b.trace_id, &b.span_id)));
    v
}

/// The app's spans that reached uvspan's endpoint are exactly those it
/// exported directly.
fn check_unchanged(forwarded: &[Span], direct: &[Span]) {
    check_unchanged_n(forwarded, direct, N)
}

fn check_unchanged_n(forwarded: &[Span], direct: &[Span], requests: usize) {
    let app: Vec<Span> = forwarded.iter().filter(|s| s.scope != "uvspan").cloned().collect();
    let servers = direct.iter().filter(|s| s.kind == 2).count();
    assert_eq!(servers, requests, "the SDK made a SERVER span per request");
    assert_eq!(app.len(), direct.len(), "as many app spans forwarded as exported directly");
    let (app, direct) = (by_id(app), by_id(direct.to_vec()));
    for (a, d) in app.iter().zip(&direct) {
        assert_eq!(a, d, "a forwarded span differs from the one exported directly");
    }
}

/// The request number of an SDK SERVER span (`/r/<i>`).
fn request_of(s: &Span) -> Option<usize> {
    let target = s.str("url.path").or(s.str("http.target"))?;
    target.trim_start_matches("/r/").split('?').next()?.parse().ok()
}

/// Shares of uvspan's fs/DNS spans of the requests with the app's SERVER
/// span of their request as parent, in its trace: (joined, all) for
/// requests with and without traceparent.
fn join_shares(dir: &TempDir, out: &Output, spans: &[Span]) -> ((usize, usize), (usize, usize)) {
    join_shares_of(dir, &traceparents(out), spans, None)
}

/// Which requests the fixture sent with a traceparent (N of them).
fn traceparents(out: &Output) -> BTreeMap<usize, bool> {
    traceparents_n(out, N)
}

fn traceparents_n(out: &Output, n: usize) -> BTreeMap<usize, bool> {
    let with_tp: BTreeMap<usize, bool> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("{\"marker\":\"req\""))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("req marker");
            (v["i"].as_u64().expect("i") as usize, v["traceparent"].is_string())
        })
        .collect();
    assert_eq!(with_tp.len(), n, "{}", out.context());
    assert!(with_tp.values().any(|t| !t) && with_tp.values().any(|t| *t), "requests with and without traceparent");
    with_tp
}

/// [`join_shares`] for the process `pid` only (resource process.pid), when given.
fn join_shares_of(dir: &TempDir, with_tp: &BTreeMap<usize, bool>, spans: &[Span], pid: Option<i64>) -> ((usize, usize), (usize, usize)) {
    let spans: Vec<&Span> = spans.iter().filter(|s| pid.is_none() || s.res_int("process.pid") == pid).collect();
    let servers: BTreeMap<usize, &Span> =
        spans.iter().filter(|s| s.kind == 2 && s.scope != "uvspan").filter_map(|s| Some((request_of(s)?, *s))).collect();
    assert_eq!(servers.len(), with_tp.len());
    let uv: Vec<&Span> = spans.iter().filter(|s| s.scope == "uvspan").copied().collect();
    assert!(uv.iter().all(|s| s.kind != 2), "no SERVER span of uvspan's own: the app's stands for each request");
    let (mut yes, mut no) = ((0, 0), (0, 0));
    for (i, srv) in &servers {
        let files: Vec<String> = (1..=4).map(|k| dir.join(&format!("{k}-{i}"))).collect();
        let mine: Vec<&&Span> = uv.iter().filter(|s| s.str("file.path").is_some_and(|p| files.iter().any(|f| f == p))).collect();
        assert!(mine.len() >= 4, "request {i}: its four fs operations were traced: {}", mine.len());
        let joined = mine.iter().filter(|s| s.parent_span_id == srv.span_id && s.trace_id == srv.trace_id).count();
        let acc = if with_tp[i] { &mut yes } else { &mut no };
        acc.0 += joined;
        acc.1 += mine.len();
    }
    // DNS lookups (all of them are the requests'): under one of the SERVER spans.
    let server_ids: BTreeMap<&str, &str> = servers.values().map(|s| (s.span_id.as_str(), s.trace_id.as_str())).collect();
    let dns: Vec<&&Span> = uv.iter().filter(|s| s.name == "dns.getaddrinfo").collect();
    assert!(dns.len() >= with_tp.len(), "a lookup per request: {}", dns.len());
    let dns_joined = dns.iter().filter(|s| server_ids.get(s.parent_span_id.as_str()) == Some(&s.trace_id.as_str())).count();
    yes.0 += dns_joined;
    yes.1 += dns.len();
    (yes, no)
}

fn pct((a, b): (usize, usize)) -> f64 {
    100.0 * a as f64 / b.max(1) as f64
}

/// `<what> a/b/c` in the summary's OTLP part: (traces, metrics, logs).
fn per_signal(stderr: &str, what: &str) -> (u64, u64, u64) {
    let line = stderr.lines().find(|l| l.contains("OTLP forwarded for the app")).expect("the summary's OTLP part");
    let line = &line[line.find("(traces/metrics/logs):").expect("counts per signal")..];
    let rest = &line[line.find(&format!("{what} ")).unwrap_or_else(|| panic!("{what} in {line}")) + what.len() + 1..];
    let v: Vec<u64> = rest.split([',', ';']).next().expect("counts").trim().split('/').map(|x| x.parse().expect("a count")).collect();
    (v[0], v[1], v[2])
}

fn forwarded_and_joined(tag: &str, via: Protocol, upstream_protocol: Protocol) {
    forwarded_and_joined_with(tag, via, upstream_protocol, false)
}

/// `defaults`: the SDK's default batch delay (5 s) and uvspan's default
/// join window, the app alive long enough for its SDK to export on its own
/// schedule (not only at exit).
fn forwarded_and_joined_with(tag: &str, via: Protocol, upstream_protocol: Protocol, defaults: bool) {
    require_root();
    let upstream = Receiver::start(upstream_protocol);
    let direct = Receiver::start(Protocol::Grpc);
    let dir = TempDir::new(tag);
    let ep = upstream.endpoint();
    let window: &[&str] = if defaults { &[] } else { &["--join-window", "3s"] };
    let mut cmd = listen_cmd(&dir, (ep.as_str(), upstream_protocol), via, &direct, window);
    if defaults {
        cmd.env_remove("OTEL_BSP_SCHEDULE_DELAY").env("OTLP_STAY_MS", "9000");
    }
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let direct_spans = direct.spans();
    let spans = upstream.spans();
    check_unchanged(&spans, &direct_spans);
    let (received, forwarded, dropped) =
        (per_signal(&out.stderr, "received"), per_signal(&out.stderr, "forwarded"), per_signal(&out.stderr, "dropped"));
    assert_eq!(received, forwarded, "everything the app sent was forwarded\n{}", out.context());
    assert_eq!(dropped, (0, 0, 0));
    assert_eq!(received.0 as usize, direct_spans.len());
    assert!(received.1 > 0, "the app's metrics came through uvspan\n{}", out.context());
    assert_eq!(received.2 as usize, N, "a log record per request\n{}", out.context());
    // The receiver also gets uvspan's own health metrics: at least the app's points.
    assert!(upstream.signals.points() >= received.1, "{} metric points at the endpoint", upstream.signals.points());
    assert_eq!(upstream.signals.records(), N as u64, "the app's log records at the endpoint");
    let (yes, no) = join_shares(&dir, &out, &spans);
    let all = (yes.0 + no.0, yes.1 + no.1);
    eprintln!(
        "listen ({} → uvspan → {}): uvspan fs/DNS spans under the app's SERVER span: {:.1}% ({}/{}); with traceparent {:.1}% ({}/{}), without {:.1}% ({}/{})",
        via.flag(),
        upstream_protocol.flag(),
        pct(all),
        all.0,
        all.1,
        pct(yes),
        yes.0,
        yes.1,
        pct(no),
        no.0,
        no.1
    );
    assert!(all.0 * 100 >= all.1 * 95, "join rate below 95%\n{}", out.context());
    assert!(no.0 * 100 >= no.1 * 95, "join rate without traceparent below 95%\n{}", out.context());
}

#[test]
fn app_exports_over_grpc_through_uvspan_unchanged_and_its_spans_parent_uvspans() {
    forwarded_and_joined("listen-grpc", Protocol::Grpc, Protocol::HttpProtobuf);
}

#[test]
fn app_exports_over_http_protobuf_through_uvspan_unchanged_and_its_spans_parent_uvspans() {
    forwarded_and_joined("listen-http", Protocol::HttpProtobuf, Protocol::Grpc);
}

/// The defaults fit each other: the SDK exports every 5 s, uvspan waits 6 s.
#[test]
fn the_default_join_window_covers_the_sdks_default_batch_delay() {
    forwarded_and_joined_with("listen-defaults", Protocol::Grpc, Protocol::Grpc, true);
}

/// The collector goes away while the app runs and comes back later: every
/// span the app exported arrives once it is back (held in uvspan's queue).
#[test]
fn a_collector_outage_loses_none_of_the_apps_spans() {
    require_root();
    let mut upstream = FaultyReceiver::started();
    let direct = Receiver::start(Protocol::Grpc);
    let dir = TempDir::new("listen-outage");
    let ep = upstream.endpoint();
    let mut cmd =
        listen_cmd(&dir, (ep.as_str(), Protocol::Grpc), Protocol::Grpc, &direct, &["--flush-timeout", "60s", "--join-window", "3s"]);
    cmd.env("OTLP_TRACES_ONLY", "1");
    let mut uv = Running::spawn(cmd);
    uv.wait_stdout(RUN_TIMEOUT, "the first request", |o| o.contains("{\"marker\":\"req\""));
    upstream.stop();
    uv.wait_stdout(RUN_TIMEOUT, "the last request", |o| o.contains("{\"marker\":\"done\"}"));
    // The app's spans reach uvspan meanwhile (no assertion on time: the
    // outage only has to cover part of the run).
    std::thread::sleep(Duration::from_secs(1));
    upstream.start();
    let out = uv.finish(RUN_TIMEOUT + Duration::from_secs(60));
    assert_eq!(out.code(), Some(0), "{}", out.context());
    assert!(out.stderr.contains("retrying while it stays queued"), "the outage was seen\n{}", out.context());
    check_unchanged(&upstream.spans(), &direct.spans());
    assert_eq!(per_signal(&out.stderr, "dropped"), (0, 0, 0), "{}", out.context());
}

/// Sends one HTTP request to the listener; its status code.
fn post(port: u16, path: &str, body: &[u8], content_type: &str) -> u16 {
    post_reply(port, path, body, content_type).0
}

/// Sends one HTTP request to the listener; its status code and the whole reply.
fn post_reply(port: u16, path: &str, body: &[u8], content_type: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the listener");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).and_then(|()| s.write_all(body)).expect("send");
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    (reply.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0), reply)
}

/// POSTs a gzip body to /v1/traces; the status code.
fn post_gzip(port: u16, body: &[u8]) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the listener");
    let head = format!(
        "POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-protobuf\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).and_then(|()| s.write_all(body)).expect("send");
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// An OTLP traces request with one SERVER span named `name`.
fn one_span(name: &str) -> Vec<u8> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span as PbSpan};
    use prost::Message;
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans: vec![PbSpan { trace_id: vec![7; 16], span_id: vec![7; 8], name: name.into(), kind: 2, ..Default::default() }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// Sends raw bytes as a gRPC traces export; the status code.
fn grpc_export(port: u16, body: Vec<u8>) -> tonic::Code {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async move {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let mut g = tonic::client::Grpc::new(channel);
        g.ready().await.expect("ready");
        let path = http::uri::PathAndQuery::from_static("/opentelemetry.proto.collector.trace.v1.TraceService/Export");
        match g
            .unary(tonic::Request::new(uvspan::export::client::Body::from(bytes::Bytes::from(body))), path, uvspan::listen::forward::Raw)
            .await
        {
            Ok(_) => tonic::Code::Ok,
            Err(st) => st.code(),
        }
    })
}

/// Malformed requests get INVALID_ARGUMENT / 400 and are counted; uvspan
/// keeps serving (a valid request after them is forwarded). Also prints the
/// time one forwarded request takes to reach the endpoint.
#[test]
fn malformed_requests_are_refused_and_counted() {
    require_root();
    let upstream = Receiver::start(Protocol::Grpc);
    let port = reserve_port();
    let listen = format!("127.0.0.1:{port}");
    let ep = upstream.endpoint();
    let mut uv = Running::spawn(uvspan_cmd([
        "--status-interval",
        "0",
        "--otlp-endpoint",
        ep.as_str(),
        "--otlp-listen",
        listen.as_str(),
        "--",
        "node",
        "-e",
        "setTimeout(() => {}, 60000)",
    ]));
    uv.wait_stderr(RUN_TIMEOUT, "tracing", |e| e.contains("uvspan: tracing"));
    assert_eq!(post(port, "/v1/traces", b"\xff\xff\xff\xff", "application/x-protobuf"), 400);
    assert_eq!(post(port, "/v1/metrics", b"\x0a\x05ab", "application/x-protobuf"), 400);
    assert_eq!(post(port, "/v1/nothing", b"", "application/x-protobuf"), 404);
    assert_eq!(post(port, "/v1/logs", b"{}", "application/json"), 415);
    assert_eq!(grpc_export(port, b"\xff\xff\xff\xff".to_vec()), tonic::Code::InvalidArgument);
    // A gzip body that is not gzip; then a real one.
    assert_eq!(post_gzip(port, b"not gzip at all"), 400);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &one_span("gzipped")).expect("gzip");
    assert_eq!(post_gzip(port, &gz.finish().expect("gzip")), 200);
    assert!(wait_until(RUN_TIMEOUT, || upstream.spans().iter().any(|s| s.name == "gzipped")), "a gzip body is forwarded");
    // Still serving: a valid request goes through, over both protocols.
    // Still serving, over both protocols; how long a request takes from the
    // app to the endpoint (printed, never asserted: a loaded machine).
    let mut took: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    for k in 0..20 {
        for via in ["http", "grpc"] {
            let name = format!("via-{via}-{k}");
            let t0 = Instant::now();
            match via {
                "http" => assert_eq!(post(port, "/v1/traces", &one_span(&name), "application/x-protobuf"), 200),
                _ => assert_eq!(grpc_export(port, one_span(&name)), tonic::Code::Ok),
            }
            let deadline = Instant::now() + RUN_TIMEOUT;
            while !upstream.spans().iter().any(|s| s.name == name) {
                assert!(Instant::now() < deadline, "{name} never reached the endpoint");
                std::thread::sleep(Duration::from_micros(200));
            }
            took.entry(via).or_default().push(t0.elapsed());
        }
    }
    for (via, mut t) in took {
        t.sort();
        eprintln!(
            "listen: app → uvspan ({via}) → endpoint (gRPC), send to arrival: median {:?}, max {:?} of {}",
            t[t.len() / 2],
            t[t.len() - 1],
            t.len()
        );
    }
    // SAFETY: kill(2) on the uvspan process this test started.
    unsafe { libc::kill(uv.pid as i32, libc::SIGTERM) };
    let out = uv.finish(RUN_TIMEOUT);
    assert!(out.stderr.contains("malformed requests 4"), "{}", out.context());
    assert_eq!(per_signal(&out.stderr, "forwarded").0, 41, "{}", out.context());
}

/// An address in use: one line naming it, exit code 2, nothing traced.
#[test]
fn an_address_in_use_stops_uvspan_with_one_line() {
    require_root();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("address").to_string();
    let out = run(uvspan_cmd(["--otlp-endpoint", "http://127.0.0.1:9", "--otlp-listen", addr.as_str(), "--", "node", "-e", "1"]));
    assert_eq!(out.code(), Some(2), "{}", out.context());
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", out.context());
    assert!(lines[0].starts_with("uvspan: cannot listen for OTLP on ") && lines[0].contains("in use"), "{}", lines[0]);
    // Without an endpoint to forward to: a usage error too.
    let out = run(uvspan_cmd(["--otlp-listen", "127.0.0.1:0", "--", "node", "-e", "1"]));
    assert_eq!(out.code(), Some(2), "{}", out.context());
    // Forwarding to itself: refused.
    let out = run(uvspan_cmd(["--otlp-endpoint", "http://127.0.0.1:4999", "--otlp-listen", "127.0.0.1:4999", "--", "node", "-e", "1"]));
    assert_eq!(out.code(), Some(2), "{}", out.context());
    assert!(out.stderr.contains("is uvspan's own --otlp-listen address"), "{}", out.context());
}

/// Two traced processes export through one uvspan: each one's spans join
/// its own SERVER spans (matched per process: resource process.pid).
#[test]
fn several_processes_export_through_one_uvspan() {
    require_root();
    let upstream = Receiver::start(Protocol::Grpc);
    let direct = Receiver::start(Protocol::Grpc);
    let (a, b) = (TempDir::new("listen-multi-a"), TempDir::new("listen-multi-b"));
    let ep = upstream.endpoint();
    let mut cmd = listen_cmd(&a, (ep.as_str(), Protocol::Grpc), Protocol::HttpProtobuf, &direct, &["--join-window", "3s"]);
    // The same fixture twice, under one shell: uvspan follows its node children.
    let (preload, script) = (fixture("otel_sdk_listen.js"), fixture("requests_server.js"));
    let one = |d: &TempDir| format!("node -r {preload} {script} {} {N} {CONCURRENCY}", d.str());
    let args: Vec<String> = cmd.get_args().map(|x| x.to_string_lossy().into_owned()).collect();
    let dashes = args.iter().position(|x| x == "--").expect("--");
    let mut args = args[..=dashes].to_vec();
    args.extend(["sh".into(), "-c".into(), format!("{} > {} & {} > {}; wait", one(&a), a.join("out"), one(&b), b.join("out"))]);
    let envs: Vec<(std::ffi::OsString, std::ffi::OsString)> =
        cmd.get_envs().filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))).collect();
    cmd = uvspan_cmd(&args);
    cmd.envs(envs);
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let spans = upstream.spans();
    check_unchanged_n(&spans, &direct.spans(), 2 * N);
    let mut all = (0, 0);
    for d in [&a, &b] {
        let stdout = std::fs::read_to_string(d.join("out")).expect("the fixture's output");
        let fake = Output { status: out.status, stdout, stderr: String::new(), pid: 0 };
        // The process whose fs spans are in this directory.
        let pid = spans
            .iter()
            .find(|s| s.scope == "uvspan" && s.str("file.path").is_some_and(|p| p.starts_with(&d.str())))
            .and_then(|s| s.res_int("process.pid"))
            .expect("uvspan's spans of the process");
        let (yes, no) = join_shares_of(d, &traceparents(&fake), &spans, Some(pid));
        all = (all.0 + yes.0 + no.0, all.1 + yes.1 + no.1);
    }
    eprintln!("listen (two processes): uvspan fs/DNS spans under their app's SERVER span: {:.1}% ({}/{})", pct(all), all.0, all.1);
    assert!(all.0 * 100 >= all.1 * 95, "join rate below 95%\n{}", out.context());
}

/// The endpoint is down and the queue fills: the app is told to retry
/// (HTTP 503 with Retry-After, gRPC RESOURCE_EXHAUSTED; counted as refused);
/// everything taken arrives once the endpoint is up.
#[test]
fn a_full_queue_tells_the_app_to_retry_and_keeps_what_it_took() {
    require_root();
    let mut upstream = FaultyReceiver::unstarted(reserve_port());
    let port = reserve_port();
    let (listen, ep) = (format!("127.0.0.1:{port}"), upstream.endpoint());
    let mut uv = Running::spawn(uvspan_cmd([
        "--status-interval",
        "0",
        "--otlp-endpoint",
        ep.as_str(),
        "--otlp-listen",
        listen.as_str(),
        "--otlp-listen-queue",
        "4KiB",
        "--flush-timeout",
        "60s",
        "--",
        "node",
        "-e",
        "setTimeout(() => {}, 60000)",
    ]));
    uv.wait_stderr(RUN_TIMEOUT, "tracing", |e| e.contains("uvspan: tracing"));
    // Requests of ~1 KiB: a few fit.
    let name = |k: usize| format!("queued-{k}-{}", "x".repeat(1000));
    let mut taken = Vec::new();
    let full = loop {
        let k = taken.len();
        assert!(k < 100, "the queue never filled");
        let (status, reply) = post_reply(port, "/v1/traces", &one_span(&name(k)), "application/x-protobuf");
        match status {
            200 => taken.push(name(k)),
            _ => break (status, reply),
        }
    };
    assert_eq!(full.0, 503, "{}", full.1);
    assert!(full.1.to_ascii_lowercase().contains("retry-after: 1"), "{}", full.1);
    assert!(taken.len() >= 2, "{} requests taken", taken.len());
    assert_eq!(grpc_export(port, one_span(&format!("refused-{}", "x".repeat(1000)))), tonic::Code::ResourceExhausted);
    upstream.start();
    let arrived = wait_until(RUN_TIMEOUT, || {
        let names: Vec<String> = upstream.spans().into_iter().map(|s| s.name).collect();
        taken.iter().all(|n| names.contains(n))
    });
    assert!(arrived, "what the queue took arrived once the endpoint was up");
    // SAFETY: kill(2) on the uvspan process this test started.
    unsafe { libc::kill(uv.pid as i32, libc::SIGTERM) };
    let out = uv.finish(RUN_TIMEOUT);
    assert_eq!(per_signal(&out.stderr, "forwarded").0, taken.len() as u64, "{}", out.context());
    assert_eq!(per_signal(&out.stderr, "refused while the queue was full").0, 2, "{}", out.context());
    assert_eq!(per_signal(&out.stderr, "dropped"), (0, 0, 0), "{}", out.context());
}

/// An app that loads the SDK from its own code and is busy from the moment
/// it listens (`BUSY_N` requests, 8 at a time): uvspan does not know it runs
/// an SDK until its first export, yet every request's work is held for the
/// join and goes under the app's SERVER span, and uvspan's own SERVER span
/// of the request is not sent (one per request). `ns`: the app in a PID and
/// mount namespace of its own (its SDK's `process.pid` is 1), uvspan on the
/// host.
fn joined_from_the_first_request(tag: &str, ns: bool) {
    require_root();
    const BUSY_N: usize = 240;
    let upstream = Receiver::start(Protocol::Grpc);
    let dir = TempDir::new(tag);
    let port = reserve_port();
    let listen = format!("127.0.0.1:{port}");
    let ep = upstream.endpoint();
    let mut args = vec!["--loop-threshold", "10m", "--status-interval", "0", "--otlp-endpoint", &ep, "--otlp-protocol", "grpc"];
    args.extend(["--otlp-listen", &listen, "--join-window", "3s", "--"]);
    if ns {
        require_tool("unshare", "the app's own PID namespace (util-linux)");
        args.extend(["unshare", "--pid", "--fork", "--mount-proc"]);
    }
    let (script, ds, n) = (fixture("sdk_in_app.js"), dir.str(), BUSY_N.to_string());
    args.extend(["node", &script, &ds, &n, CONCURRENCY]);
    let mut cmd = uvspan_cmd(&args);
    cmd.env("NODE_PATH", sdk_modules())
        .env("OTLP_VIA", format!("http://{listen}"))
        .env("OTLP_VIA_PROTOCOL", "grpc")
        .env("OTLP_TRACES_ONLY", "1")
        .env("OTEL_BSP_SCHEDULE_DELAY", "200");
    // Its traces also go straight to a receiver of their own (not compared here).
    let direct = Receiver::start(Protocol::Grpc);
    cmd.env("OTLP_DIRECT", direct.endpoint());
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let spans = upstream.spans();
    if ns {
        let app_pids: std::collections::BTreeSet<i64> =
            spans.iter().filter(|s| s.scope != "uvspan").filter_map(|s| s.res_int("process.pid")).collect();
        assert_eq!(app_pids, [1].into(), "the app's SDK sees itself as pid 1");
        assert!(spans.iter().filter(|s| s.scope == "uvspan").all(|s| s.res_int("process.pid") == Some(1)), "uvspan names it so too");
    }
    // join_shares_of also checks that no SERVER span of uvspan's own went out.
    let (yes, no) = join_shares_of(&dir, &traceparents_n(&out, BUSY_N), &spans, None);
    let all = (yes.0 + no.0, yes.1 + no.1);
    eprintln!(
        "listen ({tag}): uvspan fs/DNS spans under the app's SERVER span from the first request: {:.1}% ({}/{})",
        pct(all),
        all.0,
        all.1
    );
    assert!(all.0 * 100 >= all.1 * 95, "join rate below 95%\n{}", out.context());
}

#[test]
fn the_sdk_loaded_by_the_app_itself_joins_from_the_first_request() {
    joined_from_the_first_request("listen-first", false);
}

#[test]
fn an_app_in_its_own_pid_namespace_joins_by_its_own_pid() {
    joined_from_the_first_request("listen-first-ns", true);
}
