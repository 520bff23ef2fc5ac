//! What a process start costs: the app of tests/sdk (CommonJS with
//! `--require @opentelemetry/auto-instrumentations-node/register`, and an
//! ES module with `--import …/register`: the SDK's loader hook), the
//! zero-code OpenTelemetry SDK exporting to a collector of its own, traced
//! by uvspan with its default flags. Up to the app's first request, uvspan
//! exports at most 200 spans; the module loading (tens of thousands of
//! calls) is counted on the spans it ran under (`uvspan.module_load.*`);
//! the app's own top-level `fs.statSync` of a data file is still a span.
//! In the three topologies (a trace per process: `-- COMMAND`'s default),
//! and on the host with a trace per task (the sidecar's default). Root
//! only, never skipped.

mod common;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;

/// Spans a process start may cost, up to the app's first request.
const BUDGET: usize = 200;

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

fn get(port: u16, path: &str) -> u16 {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the app");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("read timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").expect("send the request");
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_nanos() as u64
}

/// The SDK app under uvspan (`uv`: flags beyond the endpoint), three
/// requests, /quit: uvspan's spans and when the first request was sent.
fn start_app(tag: &str, topology: Topology, app: App, uv: &[&str]) -> (Output, Vec<Span>, u64, TempDir) {
    require_root();
    let sdk = sdk_dir();
    let dir = TempDir::new(tag);
    let theirs = Receiver::start(Protocol::Grpc);
    let mine = Receiver::start(Protocol::Grpc);
    let my_ep = mine.endpoint();
    let mut args = vec!["--status-interval", "0", "--otlp-endpoint", &my_ep];
    args.extend(uv);
    let (node_options, script) = match app {
        App::CommonJs => ("NODE_OPTIONS=--require @opentelemetry/auto-instrumentations-node/register", "app.js"),
        App::Esm => ("NODE_OPTIONS=--import @opentelemetry/auto-instrumentations-node/register", "app.mjs"),
    };
    let app_ep = format!("OTEL_EXPORTER_OTLP_ENDPOINT={}", theirs.endpoint());
    let ds = dir.str();
    let command = [
        "env",
        node_options,
        &app_ep,
        "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
        "OTEL_SERVICE_NAME=sdk-app",
        "OTEL_BSP_SCHEDULE_DELAY=300",
        "OTEL_NODE_RESOURCE_DETECTORS=env,host,os,process",
        "OTEL_METRICS_EXPORTER=none",
        "OTEL_LOGS_EXPORTER=none",
        "QUIT_MS=2000",
        "node",
        script,
        &ds,
    ];
    let mut cmd = topology.command(&args, &command);
    cmd.current_dir(&sdk);
    let mut running = Running::spawn(cmd);
    running.wait_stdout(Duration::from_secs(60), "the app listening", |s| s.contains("\"marker\":\"listening\""));
    let port = Markers::parse(&running.stdout()).i64("listening", "port") as u16;
    // What the process did before it was ready is exported on its own
    // schedule; the first request comes after it listens.
    let first = now_ns();
    for i in 0..3 {
        assert_eq!(get(port, &format!("/r/{i}")), 200, "request {i}");
    }
    get(port, "/quit");
    let out = running.finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let spans = mine.spans();
    check_summary(&out, spans.len());
    (out, spans, first, dir)
}

/// The start-up's cost (spans up to the first request) and what was
/// counted; the app's top-level statSync of a data file is a span.
fn check_startup(tag: &str, topology: Topology, app: App, uv: &[&str]) {
    let (out, spans, first, dir) = start_app(tag, topology, app, uv);
    let ctx = format!("{tag}\n{}", out.context());
    let before: Vec<&Span> = spans.iter().filter(|s| s.start_unix_nano < first).collect();
    let counted = |ss: &[&Span]| ss.iter().filter_map(|s| s.int("uvspan.module_load.count")).sum::<i64>();
    let all: Vec<&Span> = spans.iter().collect();
    let (early, total) = (counted(&before), counted(&all));
    let carriers: Vec<String> = all
        .iter()
        .filter(|s| s.int("uvspan.module_load.count").is_some())
        .map(|s| format!("{} {:?}", s.name, s.int("uvspan.module_load.count")))
        .collect();
    let mut names: std::collections::BTreeMap<&str, usize> = Default::default();
    for s in &before {
        *names.entry(s.name.as_str()).or_default() += 1;
    }
    eprintln!(
        "start-up ({tag}): {} spans before the first request ({names:?}), {} in all; module loading counted: {early} before, {total} in all, on {carriers:?}",
        before.len(),
        spans.len()
    );
    assert!(before.len() <= BUDGET, "{} spans before the first request (at most {BUDGET}): {names:?}\n{ctx}", before.len());
    assert!(early > 1_000, "the SDK's module loading counted on the start-up's spans: {early}\n{ctx}");
    let failed: i64 = before.iter().filter_map(|s| s.int("uvspan.module_load.errors")).sum();
    assert!(failed > 0, "the resolver's failed probes counted\n{ctx}");
    // The app's own statSync of its data file, at the top level.
    let settings = dir.join("settings");
    let mine: Vec<&&Span> = before.iter().filter(|s| s.name == "fs.stat" && s.str("file.path") == Some(settings.as_str())).collect();
    assert_eq!(mine.len(), 1, "the app's top-level statSync of {settings} is a span\n{ctx}");
    assert_eq!(mine[0].bool("uvspan.sync"), Some(true), "{}", mine[0].brief());
}

#[test]
fn a_commonjs_sdk_apps_start_is_a_few_spans_on_the_host() {
    check_startup("startup-cjs-host", Topology::Host, App::CommonJs, &[]);
}

#[test]
fn a_commonjs_sdk_apps_start_is_a_few_spans_with_uvspan_and_the_app_in_one_namespace() {
    check_startup("startup-cjs-both", Topology::BothInOne, App::CommonJs, &[]);
}

#[test]
fn a_commonjs_sdk_apps_start_is_a_few_spans_with_the_app_alone_in_its_namespace() {
    check_startup("startup-cjs-alone", Topology::AppAlone, App::CommonJs, &[]);
}

#[test]
fn an_esm_sdk_apps_start_is_a_few_spans_on_the_host() {
    check_startup("startup-esm-host", Topology::Host, App::Esm, &[]);
}

#[test]
fn an_esm_sdk_apps_start_is_a_few_spans_with_uvspan_and_the_app_in_one_namespace() {
    check_startup("startup-esm-both", Topology::BothInOne, App::Esm, &[]);
}

#[test]
fn an_esm_sdk_apps_start_is_a_few_spans_with_the_app_alone_in_its_namespace() {
    check_startup("startup-esm-alone", Topology::AppAlone, App::Esm, &[]);
}

#[test]
fn sdk_apps_start_is_a_few_spans_with_a_trace_per_task() {
    check_startup("startup-cjs-task", Topology::Host, App::CommonJs, &["--trace-per", "task"]);
    check_startup("startup-esm-task", Topology::Host, App::Esm, &["--trace-per", "task"]);
}
