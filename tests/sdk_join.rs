//! uvspan beside an app instrumented the zero-code way by the official
//! OpenTelemetry JS SDK (`@opentelemetry/auto-instrumentations-node`, pinned
//! by tests/sdk/package-lock.json), the app exporting straight to its
//! collector and never changed for uvspan. The collector is a tee
//! ([`Receiver::tee`]: it keeps what it gets, as its backend would, and sends
//! a copy of every trace export to uvspan's `--otlp-listen` address, as a
//! second exporter of the collector does); uvspan exports its own spans to
//! the same collector and forwards nothing (`--otlp-listen-forward none`).
//! The shipped rotel collector takes one traces exporter only, so the tee is
//! in the test; otel-config/collector-tee.yaml is the OpenTelemetry
//! Collector's configuration of the same fan-out.
//!
//! In each topology, for a CommonJS app (`--require …/register`: the SDK
//! makes a SERVER span per request) and an ES module app (`--import
//! …/register` with no loader hook: the SDK makes none), half the requests
//! with an incoming traceparent: at least 95% of uvspan's fs/DNS spans of a
//! request sit under the request's one SERVER span, in its trace; exactly
//! one SERVER span per request (the SDK's when it came, else uvspan's);
//! the app's spans reach the backend once (nothing sent round again);
//! uvspan makes no CLIENT span of the SDK's own exports. Root only, never
//! skipped.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use common::*;

const N: usize = 40;

fn sdk_dir() -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk");
    assert!(
        dir.join("node_modules/@opentelemetry/auto-instrumentations-node").is_dir(),
        "the zero-code OpenTelemetry JS SDK is not installed in {}: run `npm ci` there (scripts/test.sh does)",
        dir.display()
    );
    dir
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum App {
    CommonJs,
    Esm,
}

/// One GET to the app, with `traceparent` if given; the status code.
fn get(port: u16, path: &str, traceparent: Option<&str>) -> u16 {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the app");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("read timeout");
    let tp = traceparent.map(|t| format!("traceparent: {t}\r\n")).unwrap_or_default();
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{tp}Connection: close\r\n\r\n").expect("send the request");
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// The incoming traceparent of request `i` (even ones only): (header, trace id).
fn traceparent(i: usize) -> Option<(String, String)> {
    (i % 2 == 0).then(|| {
        let trace = format!("{:032x}", 0x5d1e_0000_0000_0000_0000_0000_0000_0000u128 + i as u128 * 7919);
        (format!("00-{trace}-{:016x}-01", 0xca11_e400_0000_0000u64 + i as u64), trace)
    })
}

/// The request number of a SERVER span (`/r/<i>`), whoever made it.
fn request_of(s: &Span) -> Option<usize> {
    let target = s.str("url.path").or(s.str("http.target"))?;
    target.strip_prefix("/r/")?.split('?').next()?.parse().ok()
}

struct Run {
    out: Output,
    /// Everything the collector got (the app's spans and uvspan's).
    spans: Vec<Span>,
    dir: TempDir,
    collector_port: u16,
}

/// The app under uvspan as `topology` places them, instrumented the
/// zero-code way (its OTEL_* variables its own, not uvspan's), N requests
/// from the test, then /quit.
fn run_app(tag: &str, topology: Topology, app: App) -> Run {
    require_root();
    require_node();
    let sdk = sdk_dir();
    let dir = TempDir::new(tag);
    let listen = format!("127.0.0.1:{}", reserve_port());
    let collector = Receiver::tee(&format!("http://{listen}"));
    let ep = collector.endpoint();
    let uv = [
        "--loop-threshold",
        "10m",
        "--status-interval",
        "0",
        "--otlp-endpoint",
        &ep,
        "--otlp-protocol",
        "grpc",
        "--otlp-listen",
        &listen,
        "--otlp-listen-forward",
        "none",
        // No --join-window: each app's own, from its OTEL_BSP_SCHEDULE_DELAY (3 s here).
    ];
    let (node_options, script) = match app {
        App::CommonJs => ("NODE_OPTIONS=--require @opentelemetry/auto-instrumentations-node/register", "app.js"),
        App::Esm => ("NODE_OPTIONS=--import @opentelemetry/auto-instrumentations-node/register", "app.mjs"),
    };
    let app_ep = format!("OTEL_EXPORTER_OTLP_ENDPOINT={ep}");
    let ds = dir.str();
    let command = [
        "env",
        node_options,
        &app_ep,
        "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
        "OTEL_SERVICE_NAME=sdk-app",
        // Exports every second (a test need not wait 5 s): uvspan's join
        // window for it is 3 s; no cloud metadata lookups.
        "OTEL_BSP_SCHEDULE_DELAY=1000",
        "OTEL_NODE_RESOURCE_DETECTORS=env,host,os,process",
        "OTEL_METRICS_EXPORTER=none",
        "OTEL_LOGS_EXPORTER=none",
        "node",
        script,
        &ds,
    ];
    let mut cmd = topology.command(&uv, &command);
    cmd.current_dir(&sdk);
    let mut running = Running::spawn(cmd);
    running.wait_stdout(Duration::from_secs(60), "the app listening", |s| s.contains("\"marker\":\"listening\""));
    let port = Markers::parse(&running.stdout()).i64("listening", "port") as u16;
    for i in 0..N {
        let tp = traceparent(i);
        assert_eq!(get(port, &format!("/r/{i}"), tp.as_ref().map(|t| t.0.as_str())), 200, "request {i}");
    }
    get(port, "/quit", None);
    let out = running.finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let spans = collector.spans();
    Run { out, spans, dir, collector_port: collector.port }
}

fn pct((a, b): (usize, usize)) -> f64 {
    100.0 * a as f64 / b.max(1) as f64
}

/// The checks every run passes; returns the join figure (joined, all) for
/// requests with and without traceparent.
fn check_joined(tag: &str, run: &Run, app: App) -> ((usize, usize), (usize, usize)) {
    let ctx = run.out.context();
    let (app_spans, uv): (Vec<&Span>, Vec<&Span>) = run.spans.iter().partition(|s| s.scope != "uvspan");
    // The collector got each of the app's spans once: uvspan sent none of
    // the copy back (else the tee would send it round again).
    let mut ids: Vec<(&str, &str)> = app_spans.iter().map(|s| (s.trace_id.as_str(), s.span_id.as_str())).collect();
    let before = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), before, "an app span reached the collector twice\n{ctx}");
    assert!(
        run.out.stderr.contains("OTLP copy of the app's telemetry from the collector"),
        "the summary says what the listener got\n{ctx}"
    );
    // One SERVER span per request: the SDK's when it made one, else uvspan's.
    let mut servers: BTreeMap<usize, Vec<&Span>> = BTreeMap::new();
    for s in run.spans.iter().filter(|s| s.kind == 2) {
        if let Some(i) = request_of(s) {
            servers.entry(i).or_default().push(s);
        }
    }
    for i in 0..N {
        let got = servers.get(&i).map_or(0, Vec::len);
        assert_eq!(got, 1, "request {i}: {got} SERVER spans (one expected)\n{ctx}");
    }
    let sdk_servers = servers.values().filter(|v| v[0].scope != "uvspan").count();
    match app {
        App::CommonJs => assert_eq!(sdk_servers, N, "the SDK's SERVER span stands for each request\n{ctx}"),
        App::Esm => assert_eq!(sdk_servers, 0, "the SDK makes no HTTP span in an ES module app without its loader hook"),
    }
    let (mut yes, mut no) = ((0, 0), (0, 0));
    let server_ids: BTreeMap<&str, &str> = servers.values().map(|v| (v[0].span_id.as_str(), v[0].trace_id.as_str())).collect();
    for (i, v) in &servers {
        let srv = v[0];
        if let Some((_, trace)) = traceparent(*i) {
            if srv.trace_id != trace {
                let in_its: Vec<String> = run
                    .spans
                    .iter()
                    .filter(|s| s.trace_id == srv.trace_id)
                    .map(|s| format!("{} {} kind {} span {} parent {}", s.scope, s.name, s.kind, s.span_id, s.parent_span_id))
                    .collect();
                panic!(
                    "request {i}: its SERVER span is in trace {}, not the caller's {trace}; that trace: {in_its:#?}\n{ctx}",
                    srv.trace_id
                );
            }
        }
        let files: Vec<String> = (1..=4).map(|k| run.dir.join(&format!("{k}-{i}"))).collect();
        let mine: Vec<&&Span> = uv.iter().filter(|s| s.str("file.path").is_some_and(|p| files.iter().any(|f| f == p))).collect();
        assert!(mine.len() >= 4, "request {i}: its four fs operations were traced: {}\n{ctx}", mine.len());
        let joined = mine.iter().filter(|s| s.parent_span_id == srv.span_id && s.trace_id == srv.trace_id).count();
        let acc = if traceparent(*i).is_some() { &mut yes } else { &mut no };
        acc.0 += joined;
        acc.1 += mine.len();
    }
    // The lookups (one per request): the SDK's `dns.lookup` where it made
    // one, else uvspan's, under one of the SERVER spans; never both (no twin).
    let dns: Vec<&&Span> = uv.iter().filter(|s| s.name == "dns.getaddrinfo").collect();
    let app_dns: Vec<&&Span> = app_spans.iter().filter(|s| s.name == "dns.lookup").collect();
    let overlap =
        |a: &Span, b: &Span| a.trace_id == b.trace_id && a.start_unix_nano <= b.end_unix_nano && b.start_unix_nano <= a.end_unix_nano;
    let twins = dns.iter().filter(|u| app_dns.iter().any(|a| overlap(a, u))).count();
    assert_eq!(twins, 0, "{twins} of uvspan's lookups beside the SDK's dns.lookup of the same call\n{ctx}");
    assert!(dns.len() + app_dns.len() >= N, "a lookup per request: uvspan's {}, the SDK's {}", dns.len(), app_dns.len());
    let not_sent: u64 = run
        .out
        .stderr
        .split("the app's span of the same operation stood for them ")
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .unwrap_or_else(|| panic!("the summary counts the spans the app's stood for\n{ctx}"));
    assert!(app_dns.is_empty() || not_sent > 0, "the SDK made {} lookups, and no twin was counted\n{ctx}", app_dns.len());
    let dns_joined = dns.iter().filter(|s| server_ids.get(s.parent_span_id.as_str()) == Some(&s.trace_id.as_str())).count();
    no.0 += dns_joined;
    no.1 += dns.len();
    // The SDK's own exports (gRPC to the collector) are not the app's work.
    let to_collector: Vec<&&Span> =
        uv.iter().filter(|s| s.kind == 3 && s.int("server.port") == Some(i64::from(run.collector_port))).collect();
    assert!(to_collector.is_empty(), "{} CLIENT spans of the SDK's own export, e.g. {:?}", to_collector.len(), to_collector.first());
    let all = (yes.0 + no.0, yes.1 + no.1);
    eprintln!(
        "sdk join ({tag}): uvspan fs/DNS spans under the request's SERVER span {:.1}% ({}/{}); with traceparent {:.1}% ({}/{}), without (and DNS) {:.1}% ({}/{}); SERVER spans the SDK's {sdk_servers}, uvspan's {}",
        pct(all),
        all.0,
        all.1,
        pct(yes),
        yes.0,
        yes.1,
        pct(no),
        no.0,
        no.1,
        N - sdk_servers
    );
    assert!(yes.0 * 100 >= yes.1 * 95, "join rate with traceparent below 95%\n{ctx}");
    assert!(no.0 * 100 >= no.1 * 95, "join rate without traceparent below 95%\n{ctx}");
    (yes, no)
}

fn joined(tag: &str, topology: Topology, app: App) {
    let run = run_app(tag, topology, app);
    check_joined(tag, &run, app);
}

#[test]
fn commonjs_app_on_the_host_joins_through_a_collector_tee() {
    joined("sdk-cjs-host", Topology::Host, App::CommonJs);
}

#[test]
fn commonjs_app_with_uvspan_in_one_namespace_joins_through_a_collector_tee() {
    joined("sdk-cjs-both", Topology::BothInOne, App::CommonJs);
}

#[test]
fn commonjs_app_alone_in_its_namespace_joins_through_a_collector_tee() {
    joined("sdk-cjs-alone", Topology::AppAlone, App::CommonJs);
}

#[test]
fn esm_app_on_the_host_gets_uvspans_server_spans() {
    joined("sdk-esm-host", Topology::Host, App::Esm);
}

#[test]
fn esm_app_with_uvspan_in_one_namespace_gets_uvspans_server_spans() {
    joined("sdk-esm-both", Topology::BothInOne, App::Esm);
}

#[test]
fn esm_app_alone_in_its_namespace_gets_uvspans_server_spans() {
    joined("sdk-esm-alone", Topology::AppAlone, App::Esm);
}

/// uvspan beside the app with only its own flags, no listener, a trace per
/// task (the sidecar's default): the SDK's exports to its collector (over
/// `protocol`) are no CLIENT span of uvspan's, in a request or a task.
fn no_span_of_the_sdks_export(tag: &str, protocol: Protocol) {
    require_root();
    require_node();
    let sdk = sdk_dir();
    let dir = TempDir::new(tag);
    let collector = Receiver::start(protocol);
    let mine = Receiver::start(Protocol::Grpc);
    let (ep, my_ep) = (collector.endpoint(), mine.endpoint());
    let uv =
        ["--loop-threshold", "10m", "--status-interval", "0", "--otlp-endpoint", &my_ep, "--otlp-protocol", "grpc", "--trace-per", "task"];
    let (app_ep, app_proto) = (format!("OTEL_EXPORTER_OTLP_ENDPOINT={ep}"), format!("OTEL_EXPORTER_OTLP_PROTOCOL={}", protocol.flag()));
    let ds = dir.str();
    let command = [
        "env",
        "NODE_OPTIONS=--require @opentelemetry/auto-instrumentations-node/register",
        &app_ep,
        &app_proto,
        "OTEL_BSP_SCHEDULE_DELAY=1000",
        // An export as soon as a span ends, inside the request's own callbacks too.
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=1",
        "OTEL_NODE_RESOURCE_DETECTORS=env,host,os,process",
        "OTEL_METRICS_EXPORTER=none",
        "OTEL_LOGS_EXPORTER=none",
        "node",
        "app.js",
        &ds,
    ];
    let mut cmd = Topology::Host.command(&uv, &command);
    cmd.current_dir(&sdk);
    let mut running = Running::spawn(cmd);
    running.wait_stdout(Duration::from_secs(60), "the app listening", |s| s.contains("\"marker\":\"listening\""));
    let port = Markers::parse(&running.stdout()).i64("listening", "port") as u16;
    for i in 0..10 {
        assert_eq!(get(port, &format!("/r/{i}"), None), 200);
    }
    get(port, "/quit", None);
    let out = running.finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    assert!(collector.spans().iter().any(|s| s.kind == 2), "the SDK exported its SERVER spans to its collector\n{}", out.context());
    let spans = mine.spans();
    assert!(spans.iter().any(|s| s.name == "dns.getaddrinfo"), "uvspan traced the app\n{}", out.context());
    let clients: Vec<String> = spans.iter().filter(|s| s.kind == 3).map(|s| format!("{} {:?}", s.name, s.int("server.port"))).collect();
    eprintln!("sdk export ({tag}): uvspan CLIENT spans {clients:?}");
    let to_collector = spans.iter().filter(|s| s.kind == 3 && s.int("server.port") == Some(i64::from(collector.port))).count();
    assert_eq!(to_collector, 0, "CLIENT spans of the SDK's own export: {clients:?}\n{}", out.context());
}

#[test]
fn the_sdks_grpc_export_is_not_the_apps_work() {
    no_span_of_the_sdks_export("sdk-export-grpc", Protocol::Grpc);
}

#[test]
fn the_sdks_http_protobuf_export_is_not_the_apps_work() {
    no_span_of_the_sdks_export("sdk-export-http", Protocol::HttpProtobuf);
}

/// uvspan sending OTLP/HTTP to a gRPC port because OTEL_EXPORTER_OTLP_PROTOCOL
/// (meant for the app) is in its environment, or its config file says so:
/// one line says the collector speaks the other protocol and where the
/// setting came from.
fn protocol_message(tag: &str, via_file: bool) {
    require_root();
    require_node();
    let dir = TempDir::new(tag);
    let grpc = Receiver::start(Protocol::Grpc);
    let ep = grpc.endpoint();
    let file = dir.join("uvspan.yaml");
    std::fs::write(&file, format!("otlp:\n  endpoint: {ep}\n  protocol: http/protobuf\n")).expect("write the config file");
    let uv: Vec<&str> = if via_file { vec!["--status-interval", "0", "--config", &file] } else { vec!["--status-interval", "0"] };
    let mut cmd = Topology::Host.command(&uv, &["node", "-e", "require('fs').statSync('/'); setTimeout(() => {}, 300)"]);
    if !via_file {
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", &ep).env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf");
    }
    let out = run(cmd);
    // One line per signal that tried (spans, and uvspan's metrics when they were due).
    let lines: Vec<&str> =
        out.stderr.lines().filter(|l| l.contains("answered HTTP/2 (gRPC) to OTLP http/protobuf") && l.contains("/v1/traces")).collect();
    assert_eq!(lines.len(), 1, "one line names the protocol mismatch of the spans' export\n{}", out.context());
    let from = if via_file { "came from config otlp.protocol" } else { "came from OTEL_EXPORTER_OTLP_PROTOCOL" };
    assert!(lines[0].contains(from) && lines[0].contains("--otlp-protocol grpc"), "{}", lines[0]);
    for hyper in ["invalid HTTP version parsed", "received unexpected message from connection"] {
        assert!(!out.stderr.contains(hyper), "the mismatch is named, not hyper's error\n{}", out.context());
    }
}

#[test]
fn http_to_a_grpc_port_is_named_with_the_variable_that_set_it() {
    protocol_message("sdk-proto-env", false);
}

#[test]
fn http_to_a_grpc_port_is_named_with_the_config_key_that_set_it() {
    protocol_message("sdk-proto-file", true);
}
