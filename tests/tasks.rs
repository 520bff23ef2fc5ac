//! Work no request caused, end to end: background tasks and processes as
//! traces a person can read. Real uvspan, real eBPF, real node, real OTLP.
//!
//! - A server with a background job (tests/fixtures/background_job.js): each
//!   timer tick's chain (a stat, then a readFile in its callback) in one
//!   trace under its `timers` span, ticks in separate traces, the requests
//!   untouched (their work under their SERVER span, no task in their trace);
//! - a CLI run (tests/fixtures/cli_run.js: 50 top-level statSync, 3 timer
//!   ticks, exit 3) as one trace: the process's root span with its exit
//!   code, its start-up and its tasks under it, every span's parent
//!   exported — on the host, with uvspan and the app in one non-host PID and
//!   mount namespace, and with the app alone in its own;
//! - `npm install` of a local package set (offline): no more traces than
//!   processes;
//! - `--trace-per task` for a command, and a bad value refused.
//!
//! Root only; never skipped.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use common::collector::{histogram_count, Collector, Listen};
use common::*;

const TICKS: usize = 6;
const REQUESTS: usize = 10;

/// uvspan with `args` tracing `command`, in `topology`: its output and the
/// spans received.
fn traced(topology: Topology, args: &[&str], command: &[&str]) -> (Output, Vec<Span>) {
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let mut uv: Vec<&str> = vec!["--status-interval", "0", "--loop-threshold", "10m", "--otlp-endpoint", ep.as_str()];
    uv.extend(args);
    let out = run(topology.command(&uv, command));
    let spans = rx.spans();
    check_summary(&out, spans.len());
    (out, spans)
}

fn dump_all(spans: &[Span]) -> String {
    dump(&spans.iter().collect::<Vec<_>>())
}

/// Spans by id.
fn by_id(spans: &[Span]) -> BTreeMap<&str, &Span> {
    spans.iter().map(|s| (s.span_id.as_str(), s)).collect()
}

/// Every span's parent was exported (or it is a root).
fn parents_exported(spans: &[Span], ctx: &str) {
    let ids = by_id(spans);
    let orphans: Vec<&Span> =
        spans.iter().filter(|s| !s.parent_span_id.is_empty() && !ids.contains_key(s.parent_span_id.as_str())).collect();
    assert!(orphans.is_empty(), "spans whose parent was not exported:\n{}\n{ctx}", dump(&orphans));
}

fn background_dir() -> TempDir {
    let dir = TempDir::new("tasks-bg");
    std::fs::write(dir.join("data"), "payload").expect("data file");
    for k in 0..TICKS {
        std::fs::write(dir.join(&format!("tick-{k}")), "").expect("tick file");
    }
    dir
}

/// The background job's ticks: each tick's stat and the open of its
/// readFile under one `timers` span; returns the tick spans by k.
fn check_ticks<'a>(spans: &'a [Span], dir: &TempDir, ctx: &str) -> BTreeMap<usize, &'a Span> {
    let ids = by_id(spans);
    let mut tasks = BTreeMap::new();
    for k in 0..TICKS {
        let tick = dir.join(&format!("tick-{k}"));
        let stat: Vec<&Span> = spans.iter().filter(|s| s.name == "fs.stat" && s.str("file.path") == Some(tick.as_str())).collect();
        assert_eq!(stat.len(), 1, "tick {k}'s stat\n{}\n{ctx}", dump_all(spans));
        let task =
            ids.get(stat[0].parent_span_id.as_str()).unwrap_or_else(|| panic!("tick {k}'s stat has a parent\n{}\n{ctx}", stat[0].brief()));
        assert_eq!(task.name, "timers", "tick {k}: under its timers task\n{}\n{ctx}", task.brief());
        assert_eq!(task.str("uvspan.task.kind"), Some("timers"));
        // The readFile its callback started: under the same task.
        let data = dir.join("data");
        let opens = spans
            .iter()
            .filter(|s| s.name == "fs.open" && s.str("file.path") == Some(data.as_str()) && s.parent_span_id == task.span_id)
            .count();
        assert_eq!(opens, 1, "tick {k}: its readFile under its task\n{}\n{ctx}", dump_all(spans));
        assert!(task.start_unix_nano <= stat[0].start_unix_nano && task.end_unix_nano >= stat[0].end_unix_nano, "{ctx}");
        tasks.insert(k, *task);
    }
    let distinct: BTreeSet<&str> = tasks.values().map(|t| t.span_id.as_str()).collect();
    assert_eq!(distinct.len(), TICKS, "each tick its own task\n{ctx}");
    tasks
}

/// The requests: each GET's stat under it, and no task in a request's trace.
fn check_requests_untouched(spans: &[Span], dir: &TempDir, ctx: &str) {
    let servers: Vec<&Span> = spans.iter().filter(|s| s.kind == 2).collect();
    assert_eq!(servers.len(), REQUESTS, "{}\n{ctx}", dump(&servers));
    for srv in &servers {
        let i = srv.str("url.path").and_then(|p| p.strip_prefix("/r/")).expect("/r/<i>");
        let file = dir.join(&format!("req-{i}"));
        let under = spans.iter().filter(|s| s.parent_span_id == srv.span_id && s.str("file.path") == Some(file.as_str())).count();
        assert_eq!(under, 1, "request {i}'s stat under it\n{ctx}");
        let tasks_in_trace =
            spans.iter().filter(|s| s.trace_id == srv.trace_id && matches!(s.name.as_str(), "timers" | "immediate" | "io")).count();
        assert_eq!(tasks_in_trace, 0, "no background work in request {i}'s trace\n{ctx}");
    }
}

fn background_run(args: &[&str]) -> (TempDir, Output, Vec<Span>) {
    let dir = background_dir();
    let script = fixture("background_job.js");
    let (n, t) = (REQUESTS.to_string(), TICKS.to_string());
    let (out, spans) = traced(Topology::Host, args, &["node", &script, &dir.str(), &n, &t]);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    assert_eq!(out.stdout.matches("\"marker\":\"tick\"").count(), TICKS, "{}", out.context());
    (dir, out, spans)
}

#[test]
fn background_ticks_are_tasks_each_its_own_trace_beside_requests() {
    require_root();
    let (dir, out, spans) = background_run(&["--trace-per", "task"]);
    let ctx = out.context();
    let tasks = check_ticks(&spans, &dir, &ctx);
    for (k, t) in &tasks {
        assert_eq!(t.parent_span_id, "", "tick {k}'s task is a root with --trace-per task\n{ctx}");
    }
    let traces: BTreeSet<&str> = tasks.values().map(|t| t.trace_id.as_str()).collect();
    assert_eq!(traces.len(), TICKS, "ticks in separate traces\n{ctx}");
    check_requests_untouched(&spans, &dir, &ctx);
    parents_exported(&spans, &ctx);
    // No process trace: the start-up's module loading is a `startup` span of its own trace.
    assert!(!spans.iter().any(|s| s.name == "node"), "no process trace with --trace-per task\n{ctx}");
    assert!(spans.iter().filter(|s| s.name == "startup").all(|s| s.parent_span_id.is_empty()), "{ctx}");
}

#[test]
fn a_commands_background_ticks_go_under_its_process() {
    require_root();
    // `-- COMMAND`: a trace per process by default.
    let (dir, out, spans) = background_run(&[]);
    let ctx = out.context();
    let tasks = check_ticks(&spans, &dir, &ctx);
    let root =
        spans.iter().find(|s| s.name == "node" && s.parent_span_id.is_empty()).unwrap_or_else(|| panic!("the process's span\n{ctx}"));
    for (k, t) in &tasks {
        assert_eq!(t.parent_span_id, root.span_id, "tick {k}'s task under its process\n{ctx}");
    }
    check_requests_untouched(&spans, &dir, &ctx);
    parents_exported(&spans, &ctx);
}

/// The CLI run: one trace for its process; the root's exit code, the
/// start-up's 50 stats (spans, or counted on it: `summary`), 3 timer tasks
/// under the root.
fn check_cli_run(out: &Output, spans: &[Span], dir: &TempDir, pid: Option<i64>, summary: bool, ctx: &str) {
    assert_eq!(out.code(), Some(3), "the command's exit code\n{ctx}");
    let traces: BTreeSet<&str> = spans.iter().map(|s| s.trace_id.as_str()).collect();
    assert_eq!(traces.len(), 1, "one trace for the one process\n{}\n{ctx}", dump_all(spans));
    parents_exported(spans, ctx);
    let roots: Vec<&Span> = spans.iter().filter(|s| s.parent_span_id.is_empty()).collect();
    assert_eq!(roots.len(), 1, "{}\n{ctx}", dump(&roots));
    let root = roots[0];
    assert_eq!(root.name, "node", "{ctx}");
    assert_eq!(root.int("process.exit.code"), Some(3), "{}\n{ctx}", root.brief());
    assert!(root.str("process.command_line").is_some_and(|c| c.contains("cli_run.js")), "{}", root.brief());
    if let Some(pid) = pid {
        assert_eq!(root.res_int("process.pid"), Some(pid), "{ctx}");
    }
    let startup: Vec<&Span> = spans.iter().filter(|s| s.name == "startup").collect();
    assert_eq!(startup.len(), 1, "{ctx}");
    assert_eq!(startup[0].parent_span_id, root.span_id);
    let stats = spans
        .iter()
        .filter(|s| s.parent_span_id == startup[0].span_id && s.str("file.path").is_some_and(|p| p.starts_with(&dir.join("s-"))))
        .count();
    let counted = startup[0].int("uvspan.sync_fs.count").unwrap_or(0);
    if summary {
        assert_eq!(stats, 0, "summarised, not sent\n{ctx}");
        // Module loading (the script, package.json lookups) and the 50.
        assert!(counted >= 50, "the top-level statSync calls counted on the start-up: {}\n{ctx}", startup[0].brief());
        assert!(startup[0].int("uvspan.sync_fs.errors").is_some_and(|e| e >= 50), "{}", startup[0].brief());
    } else {
        assert_eq!(stats, 50, "the top-level statSync calls under the start-up\n{ctx}");
        assert_eq!(counted, 0, "{ctx}");
    }
    let timers: Vec<&Span> = spans.iter().filter(|s| s.name == "timers").collect();
    assert_eq!(timers.len(), 3, "{}\n{ctx}", dump(&timers));
    for t in &timers {
        assert_eq!(t.parent_span_id, root.span_id, "{ctx}");
        let under = spans
            .iter()
            .filter(|s| s.parent_span_id == t.span_id && s.str("file.path").is_some_and(|p| p.starts_with(&dir.join("t-"))))
            .count();
        assert_eq!(under, 1, "each tick's stat under its task\n{ctx}");
    }
}

fn cli_run_in(topology: Topology) {
    require_root();
    let dir = TempDir::new("tasks-cli");
    let script = fixture("cli_run.js");
    let (out, spans) = traced(topology, &[], &["node", &script, &dir.str()]);
    let ctx = format!("{topology:?}\n{}", out.context());
    check_cli_run(&out, &spans, &dir, (topology == Topology::AppAlone).then_some(1), false, &ctx);
    if topology == Topology::Host {
        let (out, spans) = traced(topology, &["--startup-ops", "summary"], &["node", &script, &dir.str()]);
        check_cli_run(&out, &spans, &dir, None, true, &out.context());
    }
}

#[test]
fn a_cli_run_is_one_trace_per_process_on_the_host() {
    cli_run_in(Topology::Host);
}

#[test]
fn a_cli_run_is_one_trace_per_process_with_uvspan_and_the_app_in_one_pid_namespace() {
    cli_run_in(Topology::BothInOne);
}

#[test]
fn a_cli_run_is_one_trace_per_process_with_the_app_alone_in_its_pid_namespace() {
    cli_run_in(Topology::AppAlone);
}

#[test]
fn trace_per_task_for_a_command_and_a_bad_value_refused() {
    require_root();
    let dir = TempDir::new("tasks-cli-per-task");
    let script = fixture("cli_run.js");
    let (out, spans) = traced(Topology::Host, &["--trace-per", "task"], &["node", &script, &dir.str()]);
    let ctx = out.context();
    assert_eq!(out.code(), Some(3), "{ctx}");
    assert!(!spans.iter().any(|s| s.name == "node"), "no process trace\n{ctx}");
    // The module loading outside tasks: one span of its own trace, with the counts.
    let startup: Vec<&Span> = spans.iter().filter(|s| s.name == "startup").collect();
    assert_eq!(startup.len(), 1, "{ctx}");
    assert!(startup[0].parent_span_id.is_empty() && startup[0].int("uvspan.module_load.count").is_some_and(|n| n > 0), "{ctx}");
    let timers: Vec<&Span> = spans.iter().filter(|s| s.name == "timers").collect();
    assert_eq!(timers.len(), 3, "{ctx}");
    assert!(timers.iter().all(|t| t.parent_span_id.is_empty()), "tasks are roots\n{ctx}");
    // Work outside tasks: a trace per operation, as before.
    let stats = spans.iter().filter(|s| s.str("file.path").is_some_and(|p| p.starts_with(&dir.join("s-")))).collect::<Vec<_>>();
    assert_eq!(stats.len(), 50, "{ctx}");
    assert!(stats.iter().all(|s| s.parent_span_id.is_empty()), "{ctx}");

    let out = run(uvspan_cmd(["--trace-per", "request", "--", "node", "-e", "0"]));
    assert_eq!(out.code(), Some(2), "{}", out.context());
    assert!(out.stderr.contains("--trace-per") && out.stderr.contains("one of task, process"), "{}", out.context());
}

/// Three local packages packed into tarballs, and an app that depends on them.
fn npm_project(dir: &TempDir) -> String {
    require_tool("npm", "it installs the test's local packages (Debian's npm; scripts/setup.sh installs it)");
    for p in ["alpha", "beta", "gamma"] {
        let src = dir.join(&format!("src/{p}"));
        std::fs::create_dir_all(&src).expect("package dir");
        std::fs::write(format!("{src}/package.json"), format!("{{\"name\":\"{p}\",\"version\":\"1.0.0\",\"main\":\"index.js\"}}"))
            .expect("write");
        std::fs::write(format!("{src}/index.js"), format!("module.exports = '{p}';\n")).expect("write");
        for i in 0..5 {
            std::fs::write(format!("{src}/f{i}.js"), format!("module.exports = {i};\n")).expect("write");
        }
        let mut c = Command::new("npm");
        c.args(["pack", "--silent", "--pack-destination", &dir.str()]).current_dir(&src);
        let out = run(c);
        assert_eq!(out.code(), Some(0), "npm pack {p}\n{}", out.context());
    }
    let app = dir.join("app");
    std::fs::create_dir_all(&app).expect("app dir");
    let deps: Vec<String> = ["alpha", "beta", "gamma"].iter().map(|p| format!("\"{p}\":\"file:../{p}-1.0.0.tgz\"")).collect();
    std::fs::write(
        format!("{app}/package.json"),
        format!("{{\"name\":\"app\",\"version\":\"1.0.0\",\"dependencies\":{{{}}}}}", deps.join(",")),
    )
    .expect("write");
    app
}

#[test]
fn npm_install_leaves_no_more_traces_than_processes() {
    require_root();
    let dir = TempDir::new("tasks-npm");
    let app = npm_project(&dir);
    let rx = Receiver::start(Protocol::Grpc);
    let mut c =
        uvspan_cmd(["--status-interval", "0", "--loop-threshold", "10m", "--startup-ops", "summary", "--otlp-endpoint", &rx.endpoint()]);
    c.args(["--", "npm", "install", "--offline", "--no-audit", "--no-fund", "--no-update-notifier"]).current_dir(&app);
    let out = run(c);
    let spans = rx.spans();
    let ctx = out.context();
    assert_eq!(out.code(), Some(0), "{ctx}");
    check_summary(&out, spans.len());
    assert!(std::path::Path::new(&format!("{app}/node_modules/gamma/index.js")).exists(), "npm installed\n{ctx}");
    let processes: BTreeSet<i64> = spans.iter().filter_map(|s| s.res_int("process.pid")).collect();
    let traces: BTreeSet<&str> = spans.iter().map(|s| s.trace_id.as_str()).collect();
    let tasks = spans.iter().filter(|s| matches!(s.name.as_str(), "timers" | "immediate" | "io")).count();
    let counted: i64 = spans.iter().filter_map(|s| s.int("uvspan.sync_fs.count")).sum();
    println!(
        "npm install: {} spans, {} processes, {} tasks, {} traces; {counted} sync fs calls counted on start-up/main spans",
        spans.len(),
        processes.len(),
        tasks,
        traces.len()
    );
    assert!(!processes.is_empty() && spans.len() > 100, "npm's work was traced\n{ctx}");
    assert!(traces.len() <= processes.len(), "{} traces for {} processes\n{ctx}", traces.len(), processes.len());
    parents_exported(&spans, &ctx);
}

/// The callbacks that run after a request's own (tests/fixtures/
/// close_and_immediate.js): its setImmediate's work is an `immediate`
/// task, its socket's 'close' handler's work an `io` task; neither joins
/// the request (whose own stat is under its SERVER span), none is in a
/// request's trace.
fn close_and_immediate_in(topology: Topology) {
    require_root();
    const N: usize = 8;
    let dir = TempDir::new("tasks-close");
    let script = fixture("close_and_immediate.js");
    let (out, spans) = traced(topology, &["--trace-per", "task"], &["node", &script, &dir.str(), &N.to_string()]);
    let ctx = format!("{topology:?}\n{}\n{}", out.context(), dump_all(&spans));
    assert_eq!(out.code(), Some(0), "{ctx}");
    let ids = by_id(&spans);
    let servers: Vec<&Span> = spans.iter().filter(|s| s.kind == 2).collect();
    assert_eq!(servers.len(), N, "a SERVER span per request\n{ctx}");
    for i in 1..=N {
        let stat = |name: &str| -> &Span {
            let file = dir.join(&format!("{name}-{i}"));
            let found: Vec<&Span> = spans.iter().filter(|s| s.str("file.path") == Some(file.as_str())).collect();
            assert_eq!(found.len(), 1, "one span of {file}\n{ctx}");
            found[0]
        };
        let parent = |s: &Span| ids.get(s.parent_span_id.as_str()).copied();
        let req = stat("req");
        assert_eq!(parent(req).map(|p| p.kind), Some(2), "request {i}'s stat under its SERVER span\n{ctx}");
        for (name, kind) in [("imm", "immediate"), ("close", "io")] {
            let s = stat(name);
            let p = parent(s).unwrap_or_else(|| panic!("{name}-{i} has no exported parent\n{ctx}"));
            assert_eq!(p.name, kind, "{name}-{i}'s parent is an {kind} task\n{ctx}");
            assert!(servers.iter().all(|srv| srv.trace_id != s.trace_id), "{name}-{i} is in no request's trace\n{ctx}");
        }
    }
}

#[test]
fn close_and_immediate_callbacks_are_tasks_on_the_host() {
    close_and_immediate_in(Topology::Host);
}

#[test]
fn close_and_immediate_callbacks_are_tasks_with_uvspan_and_the_app_in_one_pid_namespace() {
    close_and_immediate_in(Topology::BothInOne);
}

#[test]
fn close_and_immediate_callbacks_are_tasks_with_the_app_alone_in_its_pid_namespace() {
    close_and_immediate_in(Topology::AppAlone);
}

/// HTTP calls a background task makes (tests/fixtures/task_calls.js: a
/// timer calls the process's own server each tick, every third answered
/// 503, and stats a file in the response's 'end' handler): a CLIENT span
/// each under its `timers` task with its own status (503: ERROR), the
/// response handler's stat under the same task, the server's side a request
/// of its own, and `http.client.request.duration` counting every call.
/// Over HTTP, HTTPS (an HTTPS call's socket is learned from the ciphertext
/// written right after its SSL_write) and HTTP/2 (h2c, streams of one
/// session).
fn task_calls_in(topology: Topology) {
    require_root();
    let certs = TempDir::new("tasks-calls-certs");
    let (key, cert) = self_signed(&certs);
    task_calls_over(topology, &[]);
    task_calls_over(topology, &[&key, &cert]);
    task_calls_over(topology, &["h2"]);
}

fn task_calls_over(topology: Topology, how: &[&str]) {
    const N: usize = 6;
    let col = Collector::start(Listen::Plain);
    let ep = format!("http://127.0.0.1:{}", col.port());
    let dir = TempDir::new("tasks-calls");
    let script = fixture("task_calls.js");
    let uv = ["--status-interval", "0", "--loop-threshold", "10m", "--otlp-endpoint", ep.as_str()];
    let (d, n) = (dir.str(), N.to_string());
    let mut app = vec!["node", &script, &d, &n];
    app.extend(how);
    let scheme = if how.len() == 2 { "https" } else { "http" };
    let version = (how == ["h2"]).then_some("2");
    let label = match how.len() {
        0 => "HTTP",
        2 => "HTTPS",
        _ => "h2c",
    };
    let mut cmd = topology.command(&uv, &app);
    cmd.env("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta");
    let out = run(cmd);
    let spans = col.spans();
    check_summary(&out, spans.len());
    let ctx = format!("{topology:?} {label}\n{}\n{}", out.context(), dump_all(&spans));
    assert_eq!(out.code(), Some(0), "{ctx}");
    assert_eq!(out.stdout.matches("\"marker\":\"tick\"").count(), N, "{ctx}");
    let ids = by_id(&spans);
    let clients: Vec<&Span> = spans.iter().filter(|s| s.kind == 3).collect();
    assert_eq!(clients.len(), N, "a CLIENT span per call\n{ctx}");
    for i in 0..N {
        let path = format!("/t/{i}");
        let c =
            clients.iter().find(|c| c.str("url.path") == Some(path.as_str())).unwrap_or_else(|| panic!("no CLIENT span of {path}\n{ctx}"));
        let want = if i % 3 == 2 { 503 } else { 200 };
        assert_eq!(c.int("http.response.status_code"), Some(want), "{}\n{ctx}", c.brief());
        assert_eq!(c.status == StatusCode::Error, want >= 400, "{}", c.brief());
        assert_eq!(c.str("url.scheme"), Some(scheme), "{}", c.brief());
        assert_eq!(c.str("network.protocol.version"), version, "{}", c.brief());
        let task = ids.get(c.parent_span_id.as_str()).unwrap_or_else(|| panic!("{path}'s parent not exported\n{ctx}"));
        assert_eq!(task.name, "timers", "{path} under its timer's task\n{ctx}");
        let file = dir.join(&format!("t-{i}"));
        let stat = spans.iter().find(|s| s.str("file.path") == Some(file.as_str())).unwrap_or_else(|| panic!("no stat of {file}\n{ctx}"));
        assert_eq!(stat.parent_span_id, task.span_id, "the response handler's stat under the same task\n{ctx}");
        let srv = spans
            .iter()
            .find(|s| s.kind == 2 && s.str("url.path") == Some(path.as_str()))
            .unwrap_or_else(|| panic!("no SERVER span of {path}\n{ctx}"));
        assert_ne!(srv.parent_span_id, task.span_id, "{ctx}");
    }
    assert_eq!(histogram_count(&col, "http.client.request.duration", &[]), N as u64, "{ctx}");
    assert_eq!(histogram_count(&col, "http.client.request.duration", &[("http.response.status_code", "503")]), 2, "{ctx}");
    eprintln!("task calls ({topology:?}, {label}): {N} CLIENT spans under their timers tasks, each with its status and its response handler's work");
}

#[test]
fn a_tasks_http_calls_are_its_client_spans_on_the_host() {
    task_calls_in(Topology::Host);
}

#[test]
fn a_tasks_http_calls_with_uvspan_and_the_app_in_one_pid_namespace() {
    task_calls_in(Topology::BothInOne);
}

#[test]
fn a_tasks_http_calls_with_the_app_alone_in_its_pid_namespace() {
    task_calls_in(Topology::AppAlone);
}
