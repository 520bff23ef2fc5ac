//! End-to-end tests: the real uvspan binary attaches eBPF uprobes to a real
//! Node.js running the fixtures in tests/fixtures/, and exports to an OTLP
//! receiver running inside the test (tests/common/otlp.rs). Nothing is mocked.
//!
//! They need root (BPF) and `node` on PATH; without root they fail with a
//! message saying so, they are never skipped. Each test has its own receiver
//! port and temp dir, so they run in parallel.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::collector::{metric_values, Collector, Listen};
use common::*;

// ===========================================================================
// Exact fs expectations for tests/fixtures/fs_ops.js
// ===========================================================================

/// Where an expected span's fd comes from.
#[derive(Clone, Debug)]
enum Fd {
    /// The fixture printed it.
    Known(i64),
    /// The fd the (single) earlier fs.open of this path returned; on an
    /// fs.open it names the path under which to remember the result.
    OpenedAs(String),
}

#[derive(Clone, Debug)]
struct Want {
    name: &'static str,
    sync: bool,
    path: Option<String>,
    new_path: Option<String>,
    fd: Option<Fd>,
    bytes: Option<i64>,
    entries: Option<i64>,
    error: Option<&'static str>,
}

fn want(name: &'static str, sync: bool) -> Want {
    Want { name, sync, path: None, new_path: None, fd: None, bytes: None, entries: None, error: None }
}

impl Want {
    fn path(mut self, p: &str) -> Self {
        self.path = Some(p.to_string());
        self
    }
    fn new_path(mut self, p: &str) -> Self {
        self.new_path = Some(p.to_string());
        self
    }
    fn fd(mut self, fd: i64) -> Self {
        self.fd = Some(Fd::Known(fd));
        self
    }
    fn fd_of(mut self, path: &str) -> Self {
        self.fd = Some(Fd::OpenedAs(path.to_string()));
        self
    }
    fn bytes(mut self, n: i64) -> Self {
        self.bytes = Some(n);
        self
    }
    fn entries(mut self, n: i64) -> Self {
        self.entries = Some(n);
        self
    }
    fn error(mut self, e: &'static str) -> Self {
        self.error = Some(e);
        self
    }
}

/// The message uvspan gives an errno (its status description).
fn errno_message(name: &str) -> &'static str {
    match name {
        "ENOENT" => "no such file or directory",
        other => panic!("no message known for {other}"),
    }
}

/// Every uv_fs_* request fs_ops.js makes between its 'fs_begin' and 'fs_end'
/// markers, in order.
fn fs_ops_expected(dir: &TempDir, m: &Markers) -> Vec<Want> {
    let (a, b, c) = (dir.join("a.txt"), dir.join("b.txt"), dir.join("c.txt"));
    let (d1, x, link) = (dir.join("d1"), dir.join("d1/x"), dir.join("link"));
    let (missing, missing_async) = (dir.join("missing"), dir.join("missing-async"));
    let fd_a = m.i64("fd_a", "fd");
    let fd_r = m.i64("fd_a_read", "fd");
    vec![
        // open/write/fsync/ftruncate/close, then open/read/close
        want("fs.open", true).path(&a).fd(fd_a),
        want("fs.write", true).fd(fd_a).bytes(11),
        want("fs.fsync", true).fd(fd_a),
        want("fs.ftruncate", true).fd(fd_a),
        want("fs.close", true).fd(fd_a),
        want("fs.open", true).path(&a).fd(fd_r),
        want("fs.read", true).fd(fd_r).bytes(m.i64("read_a", "bytes")),
        want("fs.close", true).fd(fd_r),
        want("fs.stat", true).path(&a),
        want("fs.lstat", true).path(&a),
        want("fs.rename", true).path(&a).new_path(&b),
        want("fs.mkdir", true).path(&d1),
        // writeFileSync(d1/x, ''): open + close, no write for empty data
        want("fs.open", true).path(&x).fd_of(&x),
        want("fs.close", true).fd_of(&x),
        want("fs.unlink", true).path(&x),
        want("fs.scandir", true).path(&dir.str()).entries(m.i64("readdir", "entries")),
        want("fs.rmdir", true).path(&d1),
        want("fs.realpath", true).path(&b),
        want("fs.access", true).path(&b),
        want("fs.copyfile", true).path(&b).new_path(&c),
        // uv_fs_symlink(target, linkpath): file.path is the target
        want("fs.symlink", true).path(&b).new_path(&link),
        want("fs.readlink", true).path(&link),
        want("fs.chmod", true).path(&c),
        want("fs.utime", true).path(&c),
        want("fs.unlink", true).path(&c),
        want("fs.stat", true).path(&missing).error("ENOENT"),
        // fs.readFile (callback): open, fstat, one read of the whole 5 bytes, close
        want("fs.open", false).path(&b).fd_of(&b),
        want("fs.fstat", false).fd_of(&b),
        want("fs.read", false).fd_of(&b).bytes(5),
        want("fs.close", false).fd_of(&b),
        want("fs.stat", false).path(&missing_async).error("ENOENT"),
    ]
}

/// fs_ops.js's fs spans are exactly the expected ones, in order, with exact attributes.
/// `detail`: uvspan ran with `--detail all` (threadpool split and phases);
/// without it, the default probe set.
fn check_fs_ops(spans: &[Span], dir: &TempDir, m: &Markers, pid: i64, detail: bool) {
    let mut fs: Vec<&Span> = spans.iter().filter(|s| s.name.starts_with("fs.")).collect();
    fs.sort_by_key(|s| s.start_unix_nano);
    let under_dir = |s: &Span| {
        let prefix = format!("{}/", dir.str());
        let p = |k: &str| s.str(k).is_some_and(|p| p == dir.str() || p.starts_with(&prefix));
        p("file.path") || p("uvspan.file.new_path")
    };
    let a = dir.join("a.txt");
    let first = fs
        .iter()
        .position(|s| s.name == "fs.open" && s.str("file.path") == Some(a.as_str()))
        .unwrap_or_else(|| panic!("no fs.open of {a}; fs spans:\n{}", dump(&fs)));
    let last_path = dir.join("missing-async");
    let last = fs
        .iter()
        .position(|s| s.str("file.path") == Some(last_path.as_str()))
        .unwrap_or_else(|| panic!("no span for {last_path}; fs spans:\n{}", dump(&fs)));
    assert!(first < last, "spans out of order:\n{}", dump(&fs));
    let got = &fs[first..=last];
    for (i, s) in fs.iter().enumerate() {
        if (i < first || i > last) && under_dir(s) {
            panic!("unexpected fs span on the fixture's dir outside its fs section: {}\nall:\n{}", s.brief(), dump(&fs));
        }
    }

    let wants = fs_ops_expected(dir, m);
    let listing = || {
        let w: Vec<String> = wants.iter().map(|w| format!("  {} {:?} {:?}", w.name, w.path, w.fd)).collect();
        format!("expected:\n{}\ngot:\n{}", w.join("\n"), dump(got))
    };
    assert_eq!(got.len(), wants.len(), "wrong number of fs spans in the fixture's fs section\n{}", listing());

    let mut opened: BTreeMap<String, i64> = BTreeMap::new();
    for (s, w) in got.iter().zip(&wants) {
        let ctx = format!("span {}\nwanted {w:?}\n{}", s.brief(), listing());
        assert_eq!(s.name, w.name, "{ctx}");
        assert_eq!(s.kind, 1, "fs spans are INTERNAL: {ctx}");
        assert!(outside_requests(spans, s), "fs spans are no request's work: {ctx}");
        assert_eq!(s.str("file.path"), w.path.as_deref(), "file.path: {ctx}");
        assert_eq!(s.str("uvspan.file.new_path"), w.new_path.as_deref(), "uvspan.file.new_path: {ctx}");
        assert_eq!(s.bool("uvspan.sync"), Some(w.sync), "uvspan.sync: {ctx}");
        assert_eq!(s.int("thread.id"), Some(pid), "requests are made on the loop (main) thread: {ctx}");
        assert_eq!(s.int("uvspan.fs.bytes"), w.bytes, "uvspan.fs.bytes: {ctx}");
        assert_eq!(s.int("uvspan.fs.entries"), w.entries, "uvspan.fs.entries: {ctx}");
        let fd = s.int("uvspan.fs.fd");
        match &w.fd {
            None => assert_eq!(fd, None, "uvspan.fs.fd: {ctx}"),
            Some(Fd::Known(n)) => assert_eq!(fd, Some(*n), "uvspan.fs.fd: {ctx}"),
            Some(Fd::OpenedAs(p)) if s.name == "fs.open" => {
                let fd = fd.unwrap_or_else(|| panic!("fs.open without uvspan.fs.fd: {ctx}"));
                assert!(fd >= 0, "{ctx}");
                opened.insert(p.clone(), fd);
            }
            Some(Fd::OpenedAs(p)) => assert_eq!(fd, opened.get(p).copied(), "uvspan.fs.fd (fd of {p}): {ctx}"),
        }
        match w.error {
            None => {
                assert_eq!(s.status, StatusCode::Unset, "{ctx}");
                assert_eq!(s.str("error.type"), None, "{ctx}");
            }
            // An existence check's ENOENT is an answer: error.type, no ERROR status.
            Some("ENOENT") if ["fs.stat", "fs.lstat", "fs.access"].contains(&w.name) => {
                assert_eq!(s.status, StatusCode::Unset, "{ctx}");
                assert_eq!(s.str("error.type"), Some("ENOENT"), "{ctx}");
            }
            Some(e) => {
                assert_eq!(s.status, StatusCode::Error, "{ctx}");
                assert_eq!(s.status_message, format!("{e}: {}", errno_message(e)), "{ctx}");
                assert_eq!(s.str("error.type"), Some(e), "{ctx}");
            }
        }
        // The attribute set is exact: nothing more than what is checked above.
        let mut keys: BTreeSet<&str> = ["thread.id", "uvspan.sync"].into();
        for (k, present) in [
            ("file.path", w.path.is_some()),
            ("uvspan.file.new_path", w.new_path.is_some()),
            ("uvspan.fs.fd", w.fd.is_some()),
            ("uvspan.fs.bytes", w.bytes.is_some()),
            ("uvspan.fs.entries", w.entries.is_some()),
            ("error.type", w.error.is_some()),
        ] {
            if present {
                keys.insert(k);
            }
        }
        if !w.sync && detail {
            keys.extend(THREADPOOL_SPLIT_KEYS);
        }
        let got_keys: BTreeSet<&str> = s.attributes.keys().map(String::as_str).collect();
        assert_eq!(got_keys, keys, "attribute keys: {ctx}");
        if w.sync || !detail {
            assert!(s.events.is_empty(), "no threadpool events (sync, or no --detail threadpool): {ctx}");
        } else {
            check_threadpool_split(s, pid);
        }
    }

    // Span times agree with the fixture's own clock.
    let within = |path: &str, marker: &str| {
        let s = got.iter().find(|s| s.name == "fs.stat" && s.str("file.path") == Some(path)).expect("stat span");
        let (before, after) = (m.f64(marker, "before"), m.f64(marker, "after"));
        assert!(
            s.start_ms() >= before - CLOCK_SLACK_MS && s.end_ms() <= after + CLOCK_SLACK_MS,
            "{} [{:.3}, {:.3}] is not within the fixture's markers [{before:.3}, {after:.3}] ± {CLOCK_SLACK_MS} ms",
            s.brief(),
            s.start_ms(),
            s.end_ms()
        );
    };
    within(&a, "stat_a");
    within(&dir.join("missing"), "stat_missing");
    assert_eq!(m.str("stat_missing", "code"), "ENOENT");
}

/// Two getaddrinfo spans: localhost (answers as Node got them) and
/// nothing.invalid (failed the way Node saw it fail).
fn check_dns(spans: &[Span], m: &Markers, pid: i64, detail: bool) {
    let mut dns: Vec<&Span> = spans.iter().filter(|s| s.name == "dns.getaddrinfo").collect();
    dns.sort_by_key(|s| s.start_unix_nano);
    assert_eq!(dns.len(), 2, "one getaddrinfo span per dns.lookup:\n{}", dump(&dns));
    for s in &dns {
        let ctx = s.brief();
        assert_eq!(s.kind, 3, "getaddrinfo spans are CLIENT: {ctx}");
        assert!(outside_requests(spans, s), "{ctx}");
        assert_eq!(s.bool("uvspan.sync"), Some(false), "{ctx}");
        assert_eq!(s.int("thread.id"), Some(pid), "{ctx}");
        if detail {
            check_threadpool_split(s, pid);
        } else {
            assert!(s.events.is_empty(), "no threadpool events without --detail threadpool: {ctx}");
            assert_eq!(s.attr("uvspan.threadpool.queue_wait_ms"), None, "{ctx}");
        }
    }

    let ok = dns[0];
    assert_eq!(ok.str("dns.question.name"), Some("localhost"), "{}", ok.brief());
    assert_eq!(ok.status, StatusCode::Unset, "{}", ok.brief());
    assert_eq!(ok.str("error.type"), None, "{}", ok.brief());
    let answers = ok.strings("dns.answers").unwrap_or_else(|| panic!("no dns.answers string array: {}", ok.brief()));
    let node_saw: BTreeSet<String> = m.get("lookup_localhost")["addresses"]
        .as_array()
        .expect("addresses")
        .iter()
        .map(|v| v.as_str().expect("address").to_string())
        .collect();
    let answers_set: BTreeSet<String> = answers.iter().cloned().collect();
    assert_eq!(answers.len(), answers_set.len(), "dns.answers has duplicates: {answers:?}");
    assert_eq!(answers_set, node_saw, "dns.answers vs what dns.lookup('localhost', {{all: true}}) returned");
    assert!(
        answers_set.contains("127.0.0.1") || answers_set.contains("::1"),
        "localhost resolved to neither 127.0.0.1 nor ::1: {answers:?}"
    );

    let bad = dns[1];
    let errname = m.str("lookup_invalid", "errname");
    assert!(
        errname == "EAI_NONAME" || errname == "EAI_AGAIN",
        "nothing.invalid failed in Node with {errname} (expected EAI_NONAME, or EAI_AGAIN without a resolver)"
    );
    assert_eq!(bad.str("dns.question.name"), Some("nothing.invalid"), "{}", bad.brief());
    assert_eq!(bad.status, StatusCode::Error, "{}", bad.brief());
    assert_eq!(bad.str("error.type"), Some(errname.as_str()), "{}", bad.brief());
    assert!(bad.status_message.starts_with(&format!("{errname}: ")), "{}", bad.brief());
    assert_eq!(bad.attr("dns.answers"), None, "a failed lookup has no answers: {}", bad.brief());
}

/// A lookup with more answers than a record holds, of both families (a
/// private /etc/hosts, bind-mounted in a mount namespace of the traced
/// command's own): the span keeps the first eight, in the order Node got
/// them, IPv6 and IPv4 alike.
#[test]
fn dns_answers_of_both_families_in_order_up_to_eight() {
    require_root();
    let dir = TempDir::new("dns-answers");
    let hosts = dir.path().join("hosts");
    let mut lines = String::from("::1 uvspan-many.test\n");
    for i in 2..=10 {
        lines.push_str(&format!("127.0.0.{i} uvspan-many.test\n"));
    }
    std::fs::write(&hosts, lines).expect("write hosts");
    let js = "require('dns').lookup('uvspan-many.test', { all: true }, (e, a) => \
              console.log(JSON.stringify({ marker: 'done', error: e && e.code, addresses: (a || []).map((x) => x.address) })))";
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let inner = format!("mount --bind {} /etc/hosts && exec node -e \"$0\"", hosts.display());
    let args = ["--status-interval", "0", "--otlp-endpoint", ep.as_str(), "--", "unshare", "-m", "sh", "-c", inner.as_str(), js];
    let out = Running::spawn(uvspan_cmd(args)).finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let m = Markers::parse(&out.stdout);
    let done = m.get("done");
    assert!(done["error"].is_null(), "the lookup failed in Node: {done}");
    let node_got: Vec<String> =
        done["addresses"].as_array().expect("addresses").iter().map(|v| v.as_str().expect("address").to_string()).collect();
    assert_eq!(node_got.len(), 10, "the private hosts file was not used: {node_got:?}");
    check_summary(&out, rx.spans().len());
    let spans = rx.spans();
    let dns: Vec<&Span> = spans.iter().filter(|s| s.name == "dns.getaddrinfo").collect();
    assert_eq!(dns.len(), 1, "{}", dump(&dns));
    assert_eq!(dns[0].str("dns.question.name"), Some("uvspan-many.test"), "{}", dns[0].brief());
    let answers = dns[0].strings("dns.answers").unwrap_or_else(|| panic!("no dns.answers: {}", dns[0].brief()));
    assert_eq!(answers, node_got[..8], "the first eight answers, in Node's order");
    assert!(answers.iter().any(|a| a.contains(':')) && answers.iter().any(|a| a.contains('.')), "{answers:?}");
}

/// The loop iteration in which the fixture's 100 ms timer callback ran, and
/// (with `phases`) its timers phase.
fn check_busy_iteration(spans: &[Span], m: &Markers, pid: i64, threshold_ms: f64, phases: bool) {
    let (before, after) = (m.f64("busy", "before"), m.f64("busy", "after"));
    let iters: Vec<&Span> = spans.iter().filter(|s| s.name == "uv.loop.iteration").collect();
    for it in &iters {
        let busy = it.double("uvspan.loop.busy_ms").unwrap_or_else(|| panic!("no busy_ms: {}", it.brief()));
        assert!(busy >= threshold_ms, "an iteration under --loop-threshold was reported: {}", it.brief());
        assert!(it.double("uvspan.loop.poll_wait_ms").is_some_and(|w| w >= 0.0), "{}", it.brief());
        assert!(it.int("uvspan.loop.fast_iterations_before").is_some_and(|n| n >= 0), "{}", it.brief());
        assert_eq!(it.int("thread.id"), Some(pid), "{}", it.brief());
        assert!(outside_requests(spans, it), "{}", it.brief());
    }
    let it = iters.iter().find(|s| s.start_ms() <= before + CLOCK_SLACK_MS && s.end_ms() >= after - CLOCK_SLACK_MS).unwrap_or_else(|| {
        panic!("no uv.loop.iteration covers the busy callback [{before:.3}, {after:.3}]; iterations:\n{}", dump(&iters))
    });
    assert!(it.duration_ms() >= 100.0, "the busy iteration lasted < 100 ms: {}", it.brief());
    assert!(it.double("uvspan.loop.busy_ms").is_some_and(|b| b >= 100.0), "{}", it.brief());

    let children: Vec<&Span> = spans.iter().filter(|s| s.parent_span_id == it.span_id).collect();
    if !phases {
        assert!(children.is_empty(), "phase spans without --detail phases:\n{}", dump(&children));
        return;
    }
    assert!(!children.is_empty(), "the iteration has no phase children");
    for c in &children {
        let ctx = format!("{} (parent {})", c.brief(), it.brief());
        let phase = c.name.strip_prefix("uv.loop.").unwrap_or_else(|| panic!("child is not a phase: {ctx}"));
        assert!(["poll", "check", "timers", "idle", "prepare"].contains(&phase), "{ctx}");
        assert_eq!(c.str("uvspan.loop.phase"), Some(phase), "{ctx}");
        assert_eq!(c.trace_id, it.trace_id, "{ctx}");
        assert!(c.start_unix_nano >= it.start_unix_nano && c.end_unix_nano <= it.end_unix_nano, "child outside parent: {ctx}");
    }
    let timers = children
        .iter()
        .find(|c| c.name == "uv.loop.timers")
        .unwrap_or_else(|| panic!("no uv.loop.timers child under {}:\n{}", it.brief(), dump(&children)));
    assert!(timers.duration_ms() >= 100.0, "the timers phase ran the 100 ms callback: {}", timers.brief());
    assert!(
        timers.start_ms() <= before + CLOCK_SLACK_MS && timers.end_ms() >= after - CLOCK_SLACK_MS,
        "the timers phase [{:.3}, {:.3}] does not cover the callback's markers [{before:.3}, {after:.3}]",
        timers.start_ms(),
        timers.end_ms()
    );
}

/// Resource attributes of the fixture's process.
fn check_resource(s: &Span, m: &Markers, service: &str, command_line: &str, uvspan_pid: u32) {
    let r = &s.resource;
    let ctx = format!("resource {r:?}");
    assert_eq!(s.res_str("service.name"), Some(service), "{ctx}");
    assert_eq!(s.res_int("process.pid"), Some(m.i64("info", "pid")), "{ctx}");
    assert_eq!(s.res_int("process.parent_pid"), Some(i64::from(uvspan_pid)), "node's parent is uvspan: {ctx}");
    assert_eq!(s.res_int("process.parent_pid"), Some(m.i64("info", "ppid")), "{ctx}");
    assert_eq!(s.res_str("process.executable.path"), Some(m.str("info", "exec_path").as_str()), "{ctx}");
    assert_eq!(s.res_str("process.executable.name"), Some("node"), "{ctx}");
    assert_eq!(s.res_str("process.command_line"), Some(command_line), "{ctx}");
    assert_eq!(s.res_str("process.runtime.name"), Some("nodejs"), "{ctx}");
    assert_eq!(s.res_str("process.runtime.version"), Some(m.str("info", "node_version").as_str()), "{ctx}");
    assert_eq!(s.res_str("host.name"), Some(host_name().as_str()), "{ctx}");
    let cgroup = cgroup_of(&m.str("info", "cgroup"));
    assert_eq!(s.res_str("process.linux.cgroup"), Some(cgroup.as_str()), "{ctx}");
    assert_eq!(s.scope, "uvspan", "instrumentation scope");
}

/// Runs fs_ops.js under uvspan exporting to `rx`, checks everything the
/// fixture does. `env` goes to uvspan (and so to node).
fn run_fs_ops(rx: &Receiver, tag: &str, args: &[&str], env: &[(&str, &str)]) -> (Output, Vec<Span>) {
    let dir = TempDir::new(tag);
    let script = fixture("fs_ops.js");
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.extend(["--".into(), "node".into(), script.clone(), dir.str()]);
    let mut cmd = uvspan_cmd(&all);
    cmd.envs(env.iter().copied());
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "uvspan's exit status is node's (0)\n{}", out.context());
    let m = Markers::parse(&out.stdout);
    let pid = m.i64("info", "pid");
    let spans = rx.spans();
    assert!(!spans.is_empty(), "no spans received\n{}", out.context());
    check_summary(&out, spans.len());

    let ids: BTreeSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    assert_eq!(ids.len(), spans.len(), "span ids are unique");
    for s in &spans {
        assert_eq!(s.res_int("process.pid"), Some(pid), "a span from another process: {}", s.brief());
        assert!(s.end_unix_nano >= s.start_unix_nano, "{}", s.brief());
        assert_eq!(s.trace_id.len(), 32, "{}", s.brief());
        assert_eq!(s.span_id.len(), 16, "{}", s.brief());
    }
    let detail = args.contains(&"--detail");
    check_fs_ops(&spans, &dir, &m, pid, detail);
    check_dns(&spans, &m, pid, detail);
    check_busy_iteration(&spans, &m, pid, 50.0, detail);
    let command_line = format!("node {script} {}", dir.str());
    for s in &spans {
        check_resource(s, &m, "fs_ops", &command_line, out.pid);
    }
    (out, spans)
}

// ===========================================================================
// OTLP export
// ===========================================================================

#[test]
fn grpc_export_of_fs_dns_loop_and_resource() {
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let args = ["--loop-threshold", "50ms", "--detail", "all", "--otlp-endpoint", ep.as_str(), "--otlp-protocol", "grpc"];
    run_fs_ops(&rx, "grpc", &args, &[("OTEL_EXPORTER_OTLP_HEADERS", "x-test-token=grpc456")]);
    let reqs = rx.requests();
    assert!(!reqs.is_empty());
    for r in &reqs {
        assert_eq!(r.header("x-test-token"), Some("grpc456"), "OTEL_EXPORTER_OTLP_HEADERS as gRPC metadata: {:?}", r.headers);
        assert!(r.header("content-type").is_some_and(|c| c.starts_with("application/grpc")), "{:?}", r.headers);
    }
}

#[test]
fn http_protobuf_export_configured_from_env() {
    require_root();
    let rx = Receiver::start(Protocol::HttpProtobuf);
    let ep = rx.endpoint();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", ep.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-test-token=abc123"),
    ];
    run_fs_ops(&rx, "http", &["--loop-threshold", "50ms"], &env);
    let reqs = rx.requests();
    assert!(!reqs.is_empty());
    for r in &reqs {
        assert_eq!(r.path, "/v1/traces");
        assert_eq!(r.header("x-test-token"), Some("abc123"), "OTEL_EXPORTER_OTLP_HEADERS was not honored: {:?}", r.headers);
        assert_eq!(r.header("content-type"), Some("application/x-protobuf"), "{:?}", r.headers);
    }
}

/// Runs stat_once.js under uvspan (gRPC) with `command` prefix and returns the
/// service.name of its spans.
fn service_name_of(tag: &str, uvspan_args: &[&str], command: &[&str]) -> String {
    let rx = Receiver::start(Protocol::Grpc);
    let dir = TempDir::new(tag);
    let target = dir.join("stat-me");
    std::fs::write(&target, "x").expect("write the stat target");
    let script = fixture("stat_once.js");
    let ep = rx.endpoint();
    let mut args: Vec<&str> = vec!["--otlp-endpoint", &ep, "--otlp-protocol", "grpc"];
    args.extend_from_slice(uvspan_args);
    args.push("--");
    args.extend_from_slice(command);
    args.extend(["node", script.as_str(), target.as_str()]);
    let out = run(uvspan_cmd(&args));
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let m = Markers::parse(&out.stdout);
    let spans = rx.spans();
    check_summary(&out, spans.len());
    let stat = spans
        .iter()
        .find(|s| s.name == "fs.stat" && s.str("file.path") == Some(target.as_str()))
        .unwrap_or_else(|| panic!("no fs.stat of {target}\n{}", out.context()));
    assert!(
        stat.start_ms() >= m.f64("stat", "before") - CLOCK_SLACK_MS && stat.end_ms() <= m.f64("stat", "after") + CLOCK_SLACK_MS,
        "{}",
        stat.brief()
    );
    assert_eq!(stat.res_int("process.pid"), Some(m.i64("info", "pid")));
    let names: BTreeSet<String> = spans.iter().filter_map(|s| s.res_str("service.name")).map(str::to_string).collect();
    assert_eq!(names.len(), 1, "one service.name for one process: {names:?}");
    names.into_iter().next().expect("a name")
}

#[test]
fn service_name_is_derived_from_the_script() {
    require_root();
    assert_eq!(service_name_of("svc-derived", &[], &[]), "stat_once");
}

#[test]
fn service_name_comes_from_the_targets_otel_service_name() {
    require_root();
    // Only the target has OTEL_SERVICE_NAME (env(1) sets it and execs node).
    assert_eq!(service_name_of("svc-env", &[], &["env", "OTEL_SERVICE_NAME=xyz"]), "xyz");
}

#[test]
fn service_name_flag_overrides_the_targets_env() {
    require_root();
    assert_eq!(service_name_of("svc-flag", &["--service-name", "abc"], &["env", "OTEL_SERVICE_NAME=xyz"]), "abc");
}

// ===========================================================================
// --pid: attach to a running process
// ===========================================================================

#[test]
fn attach_to_running_process_by_pid() {
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    let dir = TempDir::new("pid");
    let script = fixture("wait_stdin.js");
    let mut node_cmd = Command::new("node");
    node_cmd.args([script.as_str(), &dir.str()]).stdin(Stdio::piped());
    let mut node = Running::spawn(node_cmd);
    let mut node_stdin = node.child.stdin.take().expect("node's stdin");
    let ready = Instant::now() + RUN_TIMEOUT;
    while !node.stdout().contains("{\"marker\":\"ready\"}") {
        assert!(Instant::now() < ready, "node never printed ready\n{}\n{}", node.stdout(), node.stderr());
        if let Ok(Some(st)) = node.child.try_wait() {
            panic!("node exited early ({st})\n{}\n{}", node.stdout(), node.stderr());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let node_pid = node.pid;

    let ep = rx.endpoint();
    let pid_arg = node_pid.to_string();
    let mut uv =
        Running::spawn(uvspan_cmd(["--pid", &pid_arg, "--detail", "threadpool", "--otlp-endpoint", &ep, "--otlp-protocol", "grpc"]));
    wait_traced(&mut uv, node_pid);

    node_stdin.write_all(b"go\n").expect("poke node");
    drop(node_stdin);
    let node_out = node.finish(RUN_TIMEOUT);
    assert_eq!(node_out.code(), Some(0), "{}", node_out.context());
    let m = Markers::parse(&node_out.stdout);
    assert_eq!(m.i64("info", "pid"), i64::from(node_pid));

    // uvspan notices the target is gone and exits 0 by itself.
    let node_gone = Instant::now();
    let out = uv.finish(RUN_TIMEOUT);
    let took = node_gone.elapsed();
    assert_eq!(out.code(), Some(0), "uvspan --pid exits 0 after its target exits\n{}", out.context());
    let spans = rx.spans();
    check_summary(&out, spans.len());
    eprintln!("uvspan --pid exited {took:?} after the target");

    let (before, after) = (dir.join("before-attach"), dir.join("after-attach"));
    let fs: Vec<&Span> = {
        let mut v: Vec<&Span> = spans.iter().filter(|s| s.name.starts_with("fs.")).collect();
        v.sort_by_key(|s| s.start_unix_nano);
        v
    };
    // Before attaching: writeFileSync + statSync of before-attach, not traced.
    // After: statSync(before-attach), writeFileSync(after-attach) = open/write/close,
    // readFile(after-attach) = open/fstat/read/close (async).
    let on = |name: &str, path: &str| fs.iter().filter(|s| s.name == name && s.str("file.path") == Some(path)).count();
    assert_eq!(on("fs.stat", &before), 1, "only the stat after attaching:\n{}", dump(&fs));
    assert_eq!(on("fs.open", &before), 0, "the write before attaching was not traced:\n{}", dump(&fs));
    let opens: Vec<&&Span> = fs.iter().filter(|s| s.name == "fs.open" && s.str("file.path") == Some(after.as_str())).collect();
    assert_eq!(opens.len(), 2, "writeFileSync + readFile:\n{}", dump(&fs));
    assert_eq!(opens[0].bool("uvspan.sync"), Some(true));
    assert_eq!(opens[1].bool("uvspan.sync"), Some(false));
    check_threadpool_split(opens[1], i64::from(node_pid));
    let (wfd, rfd) = (opens[0].int("uvspan.fs.fd").expect("fd"), opens[1].int("uvspan.fs.fd").expect("fd"));
    let has = |name: &str, fd: i64, sync: bool, bytes: Option<i64>| {
        fs.iter().any(|s| {
            s.name == name
                && s.int("uvspan.fs.fd") == Some(fd)
                && s.bool("uvspan.sync") == Some(sync)
                && (bytes.is_none() || s.int("uvspan.fs.bytes") == bytes)
        })
    };
    assert!(has("fs.write", wfd, true, Some(5)), "{}", dump(&fs));
    assert!(has("fs.close", wfd, true, None), "{}", dump(&fs));
    assert!(has("fs.fstat", rfd, false, None), "{}", dump(&fs));
    assert!(has("fs.read", rfd, false, Some(5)), "{}", dump(&fs));
    assert!(has("fs.close", rfd, false, None), "{}", dump(&fs));
    let dns: Vec<&Span> = spans.iter().filter(|s| s.name == "dns.getaddrinfo").collect();
    assert_eq!(dns.len(), 1, "{}", dump(&dns));
    assert_eq!(dns[0].str("dns.question.name"), Some("localhost"));
    let address = m.str("done", "address");
    assert!(dns[0].strings("dns.answers").is_some_and(|a| a.contains(&address)), "{}", dns[0].brief());

    for s in &spans {
        assert_eq!(s.res_int("process.pid"), Some(i64::from(node_pid)), "{}", s.brief());
        assert_eq!(s.res_int("process.parent_pid"), Some(i64::from(std::process::id())), "node's parent is this test");
        assert_eq!(s.res_str("service.name"), Some("wait_stdin"));
        assert_eq!(s.res_str("process.runtime.version"), Some(m.str("info", "node_version").as_str()));
        assert_eq!(s.res_str("process.command_line"), Some(format!("node {script} {}", dir.str()).as_str()));
    }
}

// ===========================================================================
// Console output
// ===========================================================================

/// ENOENT of an existence check (`existsSync`, `throwIfNoEntry: false`,
/// an access or lstat callback) is not an ERROR span; a missing file that
/// `readFile` tries to open is.
#[test]
fn enoent_is_an_error_only_where_it_reaches_the_app_as_one() {
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    let dir = TempDir::new("enoent");
    let m = dir.join("missing");
    let app = format!(
        "const fs=require('fs');const m={m:?};fs.existsSync(m);fs.statSync(m,{{throwIfNoEntry:false}});\
         fs.lstat(m,()=>fs.access(m,()=>fs.readFile(m,e=>{{if(!e)process.exit(3)}})))"
    );
    let out = run(uvspan_cmd(["--otlp-endpoint", &rx.endpoint(), "--status-interval", "0", "--", "node", "-e", &app]));
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let spans: Vec<Span> = rx.spans().into_iter().filter(|s| s.str("file.path") == Some(m.as_str())).collect();
    let by =
        |name: &str, sync: bool| -> Vec<&Span> { spans.iter().filter(|s| s.name == name && s.bool("uvspan.sync") == Some(sync)).collect() };
    for (name, sync, error) in [
        ("fs.access", true, false),
        ("fs.stat", true, false),
        ("fs.lstat", false, false),
        ("fs.access", false, false),
        ("fs.open", false, true),
    ] {
        let found = by(name, sync);
        assert_eq!(found.len(), 1, "one {name} (sync {sync}) of the missing path\n{}", out.context());
        let s = found[0];
        assert_eq!(s.str("error.type"), Some("ENOENT"), "{}", s.brief());
        let want = if error { StatusCode::Error } else { StatusCode::Unset };
        assert_eq!(s.status, want, "{name} (sync {sync}): {}", s.brief());
    }
}

#[test]
fn console_output_without_endpoint() {
    require_root();
    let dir = TempDir::new("console");
    let target = dir.join("console-target");
    std::fs::write(&target, "x").expect("write the stat target");
    let script = fixture("stat_once.js");
    // --quiet: the fixture prints nothing, so stdout is uvspan's alone.
    // A trace per task: the spans' own lines, iterations as roots (the
    // process trees are tests/tasks.rs's).
    let out = run(uvspan_cmd([
        "--loop-threshold",
        "0",
        "--detail",
        "phases",
        "--trace-per",
        "task",
        "--",
        "node",
        script.as_str(),
        target.as_str(),
        "--quiet",
    ]));
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let sum = summary(&out.stderr);
    assert!(sum.exported > 0 && sum.failed == 0 && sum.lost == 0, "{}", out.context());
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(!lines.is_empty(), "nothing on stdout\n{}", out.context());

    // "<HH:MM:SS.micro> stat_once[<pid>] <indent><name> <dur>ms k=v ..."
    let label = lines[0].split(' ').nth(1).unwrap_or_default().to_string();
    let pid = label
        .strip_prefix("stat_once[")
        .and_then(|r| r.strip_suffix(']'))
        .and_then(|p| p.parse::<u32>().ok())
        .unwrap_or_else(|| panic!("no stat_once[PID] label in {:?}\n{}", lines[0], out.context()));
    assert!(pid > 0);
    let body = |l: &str| -> Option<String> {
        let (clock, rest) = l.split_once(' ')?;
        let b = clock.as_bytes();
        let clock_ok =
            b.len() == 15 && b[2] == b':' && b[5] == b':' && b[8] == b'.' && clock.bytes().filter(|c| c.is_ascii_digit()).count() == 12;
        if !clock_ok {
            return None;
        }
        rest.strip_prefix(&format!("{label} ")).map(str::to_string)
    };
    for l in &lines {
        let b = body(l).unwrap_or_else(|| panic!("not a span line of {label}: {l:?}\n{}", out.context()));
        let name_and_dur: Vec<&str> = b.trim_start().splitn(3, ' ').collect();
        assert!(name_and_dur.len() >= 2, "{l:?}");
        let dur = name_and_dur[1];
        assert!(dur.ends_with("ms") && dur.trim_end_matches("ms").parse::<f64>().is_ok(), "duration in {l:?}");
    }
    let want_path = format!("file.path={target}");
    let stat = lines
        .iter()
        .filter_map(|l| body(l))
        .map(|b| b.trim_start().to_string())
        .find(|b| b.starts_with("fs.stat ") && b.split(' ').any(|w| w == want_path))
        .unwrap_or_else(|| panic!("no fs.stat line with {want_path}\n{}", out.stdout));
    let words: Vec<&str> = stat.split(' ').collect();
    assert!(words.contains(&"uvspan.sync=true"), "{stat}");
    assert!(words.contains(&format!("thread.id={pid}").as_str()), "{stat}");

    let mut nested = 0;
    for (i, l) in lines.iter().enumerate() {
        let b = body(l).expect("checked above");
        if b.starts_with("uv.loop.iteration ") {
            let next = lines.get(i + 1).and_then(|n| body(n)).unwrap_or_default();
            assert!(next.starts_with("  uv.loop."), "the line after an iteration is an indented phase: {next:?}\n{}", out.stdout);
            assert!(!next.starts_with("   "), "one level of indent: {next:?}");
            nested += 1;
        } else if b.starts_with("  ") {
            assert!(b.starts_with("  uv.loop."), "only loop phases are indented: {l:?}");
        }
    }
    assert!(nested > 0, "no uv.loop.iteration line with --loop-threshold 0\n{}", out.stdout);
}

// ===========================================================================
// Exit status
// ===========================================================================

#[test]
fn exit_status_is_the_commands() {
    require_root();
    let out = run(uvspan_cmd(["--", "node", "-e", "process.exit(7)"]));
    assert_eq!(out.code(), Some(7), "{}", out.context());
    summary(&out.stderr);
    let out = run(uvspan_cmd(["--", "node", "-e", "process.kill(process.pid, 'SIGKILL')"]));
    assert_eq!(out.code(), Some(128 + 9), "killed by SIGKILL: 128 + 9\n{}", out.context());
    assert!(!out.stderr.contains("panicked"), "{}", out.context());
}

// ===========================================================================
// Bad input: one line, no panic
// ===========================================================================

/// Fails unless uvspan exited with `code` and printed exactly one stderr
/// line, starting with "uvspan: " and containing every one of `needles`.
fn assert_one_line_error(out: &Output, code: i32, needles: &[&str]) -> String {
    assert_eq!(out.code(), Some(code), "{}", out.context());
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one line on stderr\n{}", out.context());
    let line = lines[0];
    assert!(line.starts_with("uvspan: "), "{}", out.context());
    for n in needles {
        assert!(line.contains(n), "the error does not mention {n:?}: {line}");
    }
    assert!(!out.stderr.contains("panicked") && !out.stderr.contains("backtrace"), "{}", out.context());
    assert!(out.stdout.is_empty(), "nothing on stdout\n{}", out.context());
    line.to_string()
}

/// A bad flag value: one "uvspan: invalid value ..." line, exit status 2.
fn assert_clap_value_error(out: &Output, flag: &str, value: &str, reason: &str) {
    let line = assert_one_line_error(out, 2, &[reason, "see uvspan --help"]);
    assert!(line.starts_with(&format!("uvspan: invalid value '{value}' for '{flag} ")), "{line}");
}

fn free_pid() -> u32 {
    (999_999..).find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()).expect("a free pid")
}

#[test]
fn bad_input_nonexistent_pid() {
    let pid = free_pid().to_string();
    let out = run(uvspan_cmd(["--pid", &pid]));
    assert_one_line_error(&out, 1, &[&format!("no process with PID {pid}")]);
}

#[test]
fn bad_input_pid_of_a_non_node_process() {
    require_root();
    let mut sleep = Command::new("sleep").arg("30").stdin(Stdio::null()).spawn().expect("start sleep");
    let pid = sleep.id().to_string();
    let out = run(uvspan_cmd(["--pid", &pid]));
    let _ = sleep.kill();
    let _ = sleep.wait();
    assert_one_line_error(&out, 1, &[&format!("cannot trace process {pid}"), "not a Node.js process"]);
}

#[test]
fn bad_input_command_not_found() {
    let out = run(uvspan_cmd(["--", "/no/such/command"]));
    assert_one_line_error(&out, 127, &["command not found: /no/such/command"]);
}

#[test]
fn bad_input_nothing_to_trace() {
    let out = run(uvspan_cmd(Vec::<&str>::new()));
    assert_one_line_error(&out, 1, &["nothing to trace", "--pid"]);
}

#[test]
fn bad_input_loop_threshold() {
    let out = run(uvspan_cmd(["--loop-threshold", "ten", "--", "node", "-e", "1"]));
    assert_clap_value_error(&out, "--loop-threshold", "ten", "invalid duration");
    let out = run(uvspan_cmd(["--loop-threshold", "5 parsecs", "--", "node", "-e", "1"]));
    assert_clap_value_error(&out, "--loop-threshold", "5 parsecs", "invalid duration unit");
}

#[test]
fn bad_input_otlp_protocol() {
    let out = run(uvspan_cmd(["--otlp-protocol", "http/json", "--otlp-endpoint", "http://127.0.0.1:9", "--", "node", "-e", "1"]));
    assert_clap_value_error(&out, "--otlp-protocol", "http/json", "use grpc or http/protobuf");
}

#[test]
fn unprivileged_run_explains_what_is_needed() {
    require_root();
    let mut drop_privs = Command::new(setpriv());
    drop_privs.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]);
    drop_privs.args([uvspan_bin(), "--", "node", "-e", "1"]).stdin(Stdio::null());
    scrub_env(&mut drop_privs);
    let out = run(drop_privs);
    let line = assert_one_line_error(&out, 1, &["permission denied", "root", "CAP_BPF"]);
    assert!(line.contains("capabilities"), "{line}");
}

// ===========================================================================
// Regressions: src/ bugs found and fixed, reproduced so they stay fixed.
// ===========================================================================

/// src/events/spans/iteration.rs says a uv.loop.iteration span starts "from the moment
/// the loop woke up in poll". Node enables UV_METRICS_IDLE_TIME, so libuv's
/// uv__io_poll first calls epoll_pwait with timeout 0 and only then blocks:
/// the BPF side records wake_ns at the end of that first, non-blocking call,
/// and the iteration span includes the whole idle wait.
#[test]
fn loop_iteration_starts_when_the_loop_wakes() {
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let script = fixture("busy_timer.js");
    let out = run(uvspan_cmd(["--loop-threshold", "50ms", "--otlp-endpoint", &ep, "--otlp-protocol", "grpc", "--", "node", &script]));
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let m = Markers::parse(&out.stdout);
    let spans = rx.spans();
    let (scheduled, delay) = (m.f64("busy", "scheduled"), m.f64("busy", "delay"));
    let (before, after) = (m.f64("busy", "before"), m.f64("busy", "after"));
    let it = spans
        .iter()
        .find(|s| s.name == "uv.loop.iteration" && s.start_ms() <= before + CLOCK_SLACK_MS && s.end_ms() >= after - CLOCK_SLACK_MS)
        .unwrap_or_else(|| panic!("no iteration around the busy callback\n{}", out.context()));
    // The timer cannot fire before `delay` ms (libuv's loop time may be up to
    // 1 ms stale): the loop cannot have woken up for it earlier than this.
    let earliest_wake = scheduled + delay - 1.0 - CLOCK_SLACK_MS;
    assert!(
        it.start_ms() >= earliest_wake,
        "the iteration starts {:.1} ms before the loop could have woken up (it includes the idle wait): {}",
        earliest_wake - it.start_ms(),
        it.brief()
    );
}

/// Node >= 20 serves fs.readFileSync(path, 'utf8') (and CommonJS module
/// loading) from C++ ReadFileUtf8: one uv_fs_t for the open and every read,
/// with uv_fs_req_cleanup only after the open. Each read must still be
/// reported: it ends at its uv_fs_read return (session uprobes) or at the
/// thread's next libuv call.
#[test]
fn sync_reads_without_req_cleanup_are_reported() {
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let dir = TempDir::new("utf8");
    let script = fixture("read_utf8.js");
    let out = run(uvspan_cmd(["--otlp-endpoint", &ep, "--otlp-protocol", "grpc", "--", "node", &script, &dir.str()]));
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let m = Markers::parse(&out.stdout);
    assert_eq!(m.str("info", "text"), "hello");
    let file = m.str("info", "file");
    let spans = rx.spans();
    let mut fs: Vec<&Span> = spans.iter().filter(|s| s.name.starts_with("fs.")).collect();
    fs.sort_by_key(|s| s.start_unix_nano);
    // writeFileSync opens it first, readFileSync second.
    let opens: Vec<&&Span> = fs.iter().filter(|s| s.name == "fs.open" && s.str("file.path") == Some(file.as_str())).collect();
    assert_eq!(opens.len(), 2, "{}", dump(&fs));
    let fd = opens[1].int("uvspan.fs.fd").expect("fd");
    assert!(
        fs.iter().any(|s| s.name == "fs.read"
            && s.int("uvspan.fs.fd") == Some(fd)
            && s.int("uvspan.fs.bytes") == Some(5)
            && s.start_unix_nano > opens[1].start_unix_nano),
        "no fs.read of the 5 bytes readFileSync(…, 'utf8') read:\n{}",
        dump(&fs)
    );
}

/// resource.rs says service.name falls back to "the executable's name" when
/// node runs no script; for `node -e CODE` it takes CODE as the script.
#[test]
fn service_name_of_node_eval_is_the_executable() {
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let out = run(uvspan_cmd(["--otlp-endpoint", &ep, "--otlp-protocol", "grpc", "--", "node", "-e", "require('fs').statSync('/')"]));
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let spans = rx.spans();
    let s = spans.iter().find(|s| s.name == "fs.stat" && s.str("file.path") == Some("/")).expect("the stat");
    assert_eq!(s.res_str("service.name"), Some("node"));
}

/// libuv may complete async fs requests through io_uring (here: Node 20's
/// libuv with UV_USE_IO_URING=1), skipping uv__fs_done: uvspan then keeps
/// uv_fs_req_cleanup probed and those requests still end there. Without it
/// (the default), requests end at uv__fs_done. Sync calls end the same way
/// either way. The third run turns io_uring on only in a node that the
/// command's shell starts: that process gets the probe for itself.
#[test]
fn fs_requests_completed_through_io_uring_still_end() {
    require_root();
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").map(|s| s.trim().to_string()).unwrap_or_default(),
        "0",
        "io_uring is disabled on this host (kernel.io_uring_disabled): this test needs it"
    );
    let dir = TempDir::new("uring");
    let file = dir.join("data.txt");
    std::fs::write(&file, "io_uring or not\n").expect("write");
    let script = "const fs = require('fs'); const f = process.argv[1]; fs.statSync(f); \
                  fs.readFile(f, (e, d) => { if (e) throw e; console.log(d.length); });";
    let in_shell = "UV_USE_IO_URING=1 node -e \"$0\" \"$1\"";
    for (uring, shell, async_end) in [("0", false, None), ("1", false, Some("uv_fs_req_cleanup")), ("0", true, Some("uv_fs_req_cleanup"))] {
        let rx = Receiver::start(Protocol::Grpc);
        let ep = rx.endpoint();
        let mut args = vec!["--otlp-endpoint", &ep, "--otlp-protocol", "grpc", "--"];
        if shell {
            args.extend(["sh", "-c", in_shell, script, &file]);
        } else {
            args.extend(["node", "-e", script, &file]);
        }
        let mut cmd = uvspan_cmd(args);
        cmd.env("UV_USE_IO_URING", uring);
        let uring = if shell { "1 in a node the shell starts" } else { uring };
        let out = run(cmd);
        assert_eq!(out.code(), Some(0), "UV_USE_IO_URING={uring}\n{}", out.context());
        assert_eq!(out.stdout.trim(), "16", "{}", out.context());
        let spans = rx.spans();
        let fs: Vec<&Span> = spans.iter().filter(|s| s.name.starts_with("fs.")).collect();
        let ctx = || format!("UV_USE_IO_URING={uring}\n{}\n{}", dump(&fs), out.stderr);
        let stat = fs.iter().find(|s| s.name == "fs.stat" && s.str("file.path") == Some(file.as_str()));
        let stat = stat.unwrap_or_else(|| panic!("no statSync span: {}", ctx()));
        assert_eq!(stat.bool("uvspan.sync"), Some(true), "{}", ctx());
        assert_eq!(stat.str("uvspan.ended_at"), None, "a sync call ends at its return (or cleanup): {}", ctx());
        let open =
            fs.iter().find(|s| s.name == "fs.open" && s.str("file.path") == Some(file.as_str()) && s.bool("uvspan.sync") == Some(false));
        let open = open.unwrap_or_else(|| panic!("no async open of the file: {}", ctx()));
        let fd = open.int("uvspan.fs.fd").expect("fd");
        let of_file: Vec<&&Span> =
            fs.iter().filter(|s| s.bool("uvspan.sync") == Some(false) && (s.int("uvspan.fs.fd") == Some(fd))).collect();
        let names: BTreeSet<&str> = of_file.iter().map(|s| s.name.as_str()).collect();
        assert!(["fs.open", "fs.read", "fs.close"].iter().all(|n| names.contains(n)), "readFile's open, read and close: {}", ctx());
        for s in &of_file {
            assert_eq!(
                s.str("uvspan.ended_at"),
                async_end,
                "{} (with io_uring, libuv calls back without uv__fs_done: only uv_fs_req_cleanup sees the end): {}",
                s.brief(),
                ctx()
            );
        }
        let read = of_file.iter().find(|s| s.name == "fs.read").expect("read");
        assert_eq!(read.int("uvspan.fs.bytes"), Some(16), "{}", ctx());
    }
}

// ===========================================================================
// --detail: the optional probe groups
// ===========================================================================

/// `uvspan probes` shows the plan uvspan would attach: the threadpool and
/// phase probes are "off" by default (with the flag that turns them on),
/// attachable with --detail; the default set is the 36 uv_fs_* submits and
/// 3 more (4 without session uprobes).
#[test]
fn probes_listing_follows_detail() {
    require_node();
    let node = String::from_utf8(Command::new("sh").args(["-c", "command -v node"]).output().expect("sh").stdout)
        .expect("utf8")
        .trim()
        .to_string();
    let listing = |extra: &[&str]| {
        let mut args = vec!["probes", "--json"];
        args.extend_from_slice(extra);
        args.push(node.as_str());
        let out = run(uvspan_cmd(&args));
        assert_eq!(out.code(), Some(0), "{}", out.context());
        let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
        v["probes"]
            .as_array()
            .expect("probes")
            .iter()
            .map(|p| (p["symbol"].as_str().unwrap().to_string(), p["status"].as_str().unwrap().to_string()))
            .collect::<BTreeMap<String, String>>()
    };
    let default = listing(&[]);
    for (sym, group) in [
        ("uv__fs_work", "threadpool"),
        ("uv_async_send", "threadpool"),
        ("uv__getaddrinfo_work", "threadpool"),
        ("uv__io_poll", "phases"),
        ("uv__run_timers", "phases"),
    ] {
        assert_eq!(default[sym], format!("off: --detail {group}"), "{sym} by default: {default:?}");
    }
    let usable = |l: &BTreeMap<String, String>| l.values().filter(|s| *s == "usable").count();
    // Request context is on by default: llhttp's message starts, stream
    // callbacks, the two writes, SSL_write, node's timers, immediates
    // and handle closes; HTTP/2 streams' headers, frames, body pieces,
    // response, trailers and close, and outgoing streams (with session
    // uprobes only: the stream id is the return value).
    let requests = [
        "llhttp__on_message_begin",
        "uv__stream_io",
        "uv_try_write",
        "uv_write2",
        "uv_tcp_connect",
        "uv_queue_work",
        "uv__queue_work",
        "uv_spawn",
        "_ZN4node12_GLOBAL__N_111ProcessWrap6OnExitEP12uv_process_sli",
        "_ZN4node15LibuvStreamWrap8OnUvReadElPK8uv_buf_t",
        "_ZN4node6worker15MessagePortData18AddToIncomingQueueESt10shared_ptrINS0_7MessageEE",
        "_ZN4node6worker7Message11DeserializeEPNS_11EnvironmentEN2v85LocalINS4_7ContextEEEPNS5_INS4_5ValueEEE",
        "SSL_write",
        "nghttp2_submit_response",
        "nghttp2_submit_trailer",
    ];
    for sym in requests {
        assert_eq!(default[sym], "usable", "{sym}: {default:?}");
    }
    let h2_client = usize::from(session_uprobes());
    let submit = &default["nghttp2_submit_request"];
    if session_uprobes() {
        assert_eq!(submit, "usable", "{default:?}");
    } else {
        assert!(submit.starts_with("failed: the kernel has no session uprobes"), "{default:?}");
    }
    // uv_fs_req_cleanup only where sync calls cannot end at their return
    // (no session uprobes): async ones end where the loop takes them.
    let cleanup = usize::from(!session_uprobes());
    // libc's epoll_wait and epoll_pwait, both or neither: where the kernel
    // refuses fentry (as uvspan last found on this boot) and has session
    // uprobes.
    assert_eq!(default["epoll_wait"], default["epoll_pwait"], "{default:?}");
    assert!(matches!(default["epoll_wait"].as_str(), "usable" | "not_needed"), "{default:?}");
    let cleanup = cleanup + 2 * usize::from(default["epoll_wait"] == "usable");
    // V8's two GC callbacks, always on.
    let gc = 2;
    assert_eq!(default.iter().filter(|(s, v)| s.contains("CallGC") && *v == "usable").count(), gc, "{default:?}");
    assert_eq!(usable(&default), 36 + 2 + cleanup + gc + 16 + 6 + h2_client, "default set: 36 uv_fs_* submits + uv__work_done (a batch of finished jobs), uv_getaddrinfo (+ uv_fs_req_cleanup, + libc's epoll waits) + 2 GC callbacks + 16 for requests + 6 for HTTP/2 servers (+ 1 for HTTP/2 clients): {default:?}");
    let off = listing(&["--requests", "off"]);
    assert_eq!(usable(&off), 36 + 2 + cleanup + gc, "{off:?}");
    for sym in requests.iter().chain(&["nghttp2_submit_request"]) {
        assert_eq!(off[*sym], "off: --requests on", "{sym}: {off:?}");
    }
    assert_eq!(default["uv__work_done"], "usable");
    assert_eq!((default["uv__fs_done"].as_str(), default["uv__getaddrinfo_done"].as_str()), ("not_needed", "not_needed"));
    assert_eq!(default["uv_fs_req_cleanup"], if session_uprobes() { "not_needed" } else { "usable" });

    let tp = listing(&["--detail", "threadpool"]);
    assert_eq!(tp["uv__fs_work"], "usable");
    assert_eq!(tp["uv__io_poll"], "off: --detail phases");
    let all = listing(&["--detail", "all"]);
    assert_eq!(usable(&all), 36 + 2 + cleanup + gc + 16 + 6 + h2_client + 3 + 5, "{all:?}");
    assert!(all.values().all(|s| !s.starts_with("off")), "{all:?}");
}

// ===========================================================================
// A fresh machine: no tracefs, no debugfs
// ===========================================================================

/// `cmd` run in a private mount namespace from which every tracefs and
/// debugfs mount is removed (the shell exits 99 if one is still visible), as
/// on a fresh machine or in a container without them.
fn without_tracefs(cmd: Command) -> Command {
    let unshare = ["/usr/bin/unshare", "/bin/unshare"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .expect("unshare (util-linux) is needed for this test: scripts/setup.sh installs it");
    // A mountinfo line's type is the field after its "-" (optional fields
    // such as "shared:1" come before it, zero or more).
    let script = r#"
        traces() { awk '{ for (i = 7; i < NF; i++) if ($i == "-") { if ($(i + 1) == "tracefs" || $(i + 1) == "debugfs") print $5; break } }' /proc/self/mountinfo; }
        for m in $(traces | sort -r); do
            umount -l "$m" || exit 98
        done
        if traces | grep -q .; then exit 99; fi
        [ -e /sys/kernel/tracing/events ] && exit 99
        [ -e /sys/kernel/debug/tracing/events ] && exit 99
        exec "$@""#;
    let mut c = Command::new(unshare);
    c.args(["--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"]);
    c.arg(cmd.get_program());
    c.args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.stdin(Stdio::piped());
    c
}

/// What the fresh-machine fixture must produce: a sync and an async stat of
/// its file, a lookup of localhost, and the 150 ms busy iteration.
fn check_fresh_machine_spans(spans: &[Span], dir: &TempDir, pid: i64, mode: &str) {
    let mine: Vec<&Span> = spans.iter().filter(|s| s.res_int("process.pid") == Some(pid)).collect();
    let file = dir.join("file");
    let stats: Vec<&&Span> = mine.iter().filter(|s| s.name == "fs.stat" && s.str("file.path") == Some(file.as_str())).collect();
    assert!(stats.iter().any(|s| s.bool("uvspan.sync") == Some(true)), "{mode}: no sync fs.stat span\n{}", dump(&mine));
    assert!(stats.iter().any(|s| s.bool("uvspan.sync") == Some(false)), "{mode}: no async fs.stat span\n{}", dump(&mine));
    assert!(
        mine.iter().any(|s| s.name == "dns.getaddrinfo" && s.str("dns.question.name") == Some("localhost")),
        "{mode}: no DNS span\n{}",
        dump(&mine)
    );
    assert!(
        mine.iter().any(|s| s.name == "uv.loop.iteration" && s.double("uvspan.loop.busy_ms").is_some_and(|b| b >= 140.0)),
        "{mode}: no slow loop iteration\n{}",
        dump(&mine)
    );
}

/// uvspan needs neither tracefs nor debugfs: in a mount namespace without
/// them, `-- COMMAND`, `--pid` and `--all` all give fs, DNS and loop spans.
#[test]
fn works_without_tracefs_or_debugfs() {
    require_root();
    let script = fixture("fresh_machine.js");
    for mode in ["command", "pid", "all"] {
        let rx = Receiver::start(Protocol::Grpc);
        let ep = rx.endpoint();
        let dir = TempDir::new(&format!("fresh-{mode}"));
        let common = ["--loop-threshold", "100ms", "--status-interval", "0", "--otlp-endpoint", ep.as_str()];
        if mode == "command" {
            let mut args: Vec<String> = common.iter().map(|s| s.to_string()).collect();
            args.extend(["--".into(), "node".into(), script.clone(), dir.str()]);
            let mut uv = Running::spawn(without_tracefs(uvspan_cmd(&args)));
            uv.child.stdin.take().expect("stdin").write_all(b"go\n").expect("write go");
            let out = uv.finish(RUN_TIMEOUT);
            assert_eq!(out.code(), Some(0), "{mode}: {}", out.context());
            let m = Markers::parse(&out.stdout);
            check_summary(&out, rx.spans().len());
            check_fresh_machine_spans(&rx.spans(), &dir, m.i64("ready", "pid"), mode);
            continue;
        }
        let mut node_cmd = Command::new("node");
        node_cmd.args([script.as_str(), &dir.str()]).stdin(Stdio::piped());
        let mut node = Running::spawn(node_cmd);
        node.wait_stdout(RUN_TIMEOUT, "the ready marker", |o| o.contains("\"ready\""));
        let pid = node.pid.to_string();
        let mut args: Vec<&str> = common.to_vec();
        if mode == "pid" {
            args.extend(["--pid", &pid]);
        } else {
            args.push("--all");
        }
        let mut uv = Running::spawn(without_tracefs(uvspan_cmd(&args)));
        wait_traced(&mut uv, node.pid);
        node.child.stdin.take().expect("node's stdin").write_all(b"go\n").expect("poke node");
        let nout = node.finish(RUN_TIMEOUT);
        assert_eq!(nout.code(), Some(0), "{mode}: {}", nout.context());
        let want = |s: &[Span]| s.iter().any(|s| s.name == "uv.loop.iteration" && s.res_int("process.pid") == Some(i64::from(nout.pid)));
        wait_until(RUN_TIMEOUT, || want(&rx.spans()));
        if mode == "all" {
            // --all runs until told to stop.
            // SAFETY: kill(2) with the pid of a child this test started.
            unsafe { libc::kill(uv.pid as i32, libc::SIGTERM) };
        }
        let out = uv.finish(RUN_TIMEOUT);
        assert_eq!(out.code(), Some(0), "{mode}: {}", out.context());
        check_fresh_machine_spans(&rx.spans(), &dir, i64::from(nout.pid), mode);
    }
}

/// How the epoll waits are read is the kernel's choice: fentry/fexit where
/// the kernel accepts trampoline programs, else the syscall tracepoints, with
/// one line saying so. What uvspan remembered for this boot (kernel.json in
/// its cache directory) and what it said must agree, and spans arrive either
/// way (the other tests).
#[test]
fn says_once_when_the_kernel_refuses_fentry() {
    require_root();
    let cache = TempDir::new("kernel-cache");
    let out = run(uvspan_cmd(["--symbol-cache", &cache.str(), "--status-interval", "0", "--", "node", "-e", "0"]));
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let said = out.stderr.lines().filter(|l| l.starts_with(KERNEL_FALLBACK_NOTICE)).count();
    let remembered: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cache.join("kernel.json")).expect("kernel.json written")).expect("json");
    let fentry = remembered["features"]["fentry"].as_bool().expect("features.fentry");
    assert_eq!(said, usize::from(!fentry), "fentry {fentry}, said {said} times\n{}", out.context());
    if !fentry {
        assert!(remembered["fentry_refused"].as_i64().is_some(), "the errno is remembered: {remembered}");
    }
    // A second start reads the decision and says the same.
    let again = run(uvspan_cmd(["--symbol-cache", &cache.str(), "--status-interval", "0", "--", "node", "-e", "0"]));
    assert_eq!(again.stderr.lines().filter(|l| l.starts_with(KERNEL_FALLBACK_NOTICE)).count(), said, "{}", again.context());
}

/// Each `busy<N>` marker (N = 1..=n: the loop blocked from `before` to
/// `after`) lies inside a reported iteration.
fn check_busy_markers_covered(iters: &[&Span], m: &Markers, n: usize) {
    for n in 1..=n {
        let name = format!("busy{n}");
        let (before, after) = (m.f64(&name, "before"), m.f64(&name, "after"));
        assert!(
            iters.iter().any(|s| s.start_ms() <= before + CLOCK_SLACK_MS && s.end_ms() >= after - CLOCK_SLACK_MS),
            "no iteration covers {name} [{before:.3}, {after:.3}]:\n{}",
            dump(iters)
        );
    }
}

/// Where the kernel refuses fentry and has session uprobes, a process
/// traced by pid has its loop's epoll waits seen by uprobes on its own libc
/// (a link for that pid alone), not by the system call tracepoints every
/// process on the host would pass; with `-- COMMAND` (descendants start
/// after attach) the tracepoints are used. Either way every slow iteration
/// is reported, also with `--sample-time` (the epoll path stays on while
/// the other probes are detached).
#[test]
fn epoll_waits_of_a_pid_are_seen_in_its_own_libc() {
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    let cache = TempDir::new("waits-cache");
    let mut node_cmd = Command::new("node");
    node_cmd.arg(fixture("blocks_after_go.js")).stdin(Stdio::piped());
    let mut node = Running::spawn(node_cmd);
    let mut node_stdin = node.child.stdin.take().expect("node's stdin");
    node.wait_stdout(RUN_TIMEOUT, "the ready marker", |o| o.contains("{\"marker\":\"ready\"}"));
    let (ep, pid) = (rx.endpoint(), node.pid.to_string());
    let mut uv = Running::spawn(uvspan_cmd([
        "--pid",
        &pid,
        "--sample-time",
        "10%",
        "--loop-threshold",
        "50ms",
        "--symbol-cache",
        &cache.str(),
        "--otlp-endpoint",
        &ep,
    ]));
    wait_traced(&mut uv, node.pid);
    let known: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cache.join("kernel.json")).expect("kernel.json written")).expect("json");
    let (fentry, session) =
        (known["features"]["fentry"].as_bool().expect("fentry"), known["features"]["session"].as_bool().expect("session"));
    let links = bpf_links(uv.pid);
    let syscall_tps = links
        .iter()
        .filter(|l| l.get("link_type").map(String::as_str) == Some("raw_tracepoint"))
        .filter(|l| matches!(l.get("tp_name").map(String::as_str), Some("sys_enter" | "sys_exit")))
        .count();
    let libc_waits: Vec<_> = links
        .iter()
        .filter(|l| l.get("link_type").map(String::as_str) == Some("uprobe_multi"))
        .filter(|l| l.get("path").is_some_and(|p| p.contains("/libc.so")))
        .collect();
    if !fentry && session {
        assert_eq!(syscall_tps, 0, "no system call tracepoint while the pid's libc is probed: {links:#?}");
        assert_eq!(libc_waits.len(), 1, "one libc link: {links:#?}");
        assert_eq!(libc_waits[0].get("pid"), Some(&pid), "for the traced process alone: {links:#?}");
        assert_eq!(libc_waits[0].get("uprobe_cnt").map(String::as_str), Some("2"), "epoll_wait and epoll_pwait: {links:#?}");
        assert!(uv.stderr().contains("libc epoll_wait uprobes"), "the notice says how: {}", uv.stderr());
    } else {
        assert!(libc_waits.is_empty(), "fentry {fentry}, session {session}: {links:#?}");
        assert_eq!(syscall_tps, if fentry { 0 } else { 2 }, "fentry {fentry}: {links:#?}");
    }

    node_stdin.write_all(b"go\n").expect("poke node");
    drop(node_stdin);
    let node_out = node.finish(RUN_TIMEOUT);
    assert_eq!(node_out.code(), Some(0), "{}", node_out.context());
    let out = uv.finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let spans = rx.spans();
    let iters: Vec<&Span> = spans.iter().filter(|s| s.name == "uv.loop.iteration").collect();
    let m = Markers::parse(&node_out.stdout);
    check_busy_markers_covered(&iters, &m, 4);
    // Waits were measured: the 300 ms timers between blocks are waits.
    assert!(iters.iter().any(|s| s.double("uvspan.loop.poll_wait_ms").is_some_and(|w| w > 100.0)), "{}", dump(&iters));
    // Each block's iteration starts when the loop woke for its timer, not
    // at Node's timeout-0 poll right after the block before (that poll's
    // return is not trapped on this path: the blocking wait that follows
    // says it found nothing). The timer was set 300 ms after libuv's loop
    // time of the iteration that ran the block before, which is taken just
    // before its callback starts; 100 ms is left for that gap on a busy
    // machine. Starting at that poll would put the start ~120 ms after the
    // block before started.
    for n in 2..=4 {
        let prev_before = m.f64(&format!("busy{}", n - 1), "before");
        let (before, after) = (m.f64(&format!("busy{n}"), "before"), m.f64(&format!("busy{n}"), "after"));
        let it = iters
            .iter()
            .find(|s| s.start_ms() <= before + CLOCK_SLACK_MS && s.end_ms() >= after - CLOCK_SLACK_MS)
            .unwrap_or_else(|| panic!("no iteration covers busy{n}: {}", dump(&iters)));
        let earliest_wake = prev_before + 300.0 - 1.0 - 100.0;
        assert!(
            it.start_ms() >= earliest_wake,
            "busy{n}'s iteration starts {:.1} ms before its timer could fire: {}",
            earliest_wake - it.start_ms(),
            it.brief()
        );
    }

    // `-- COMMAND`: the processes it starts later cannot have their libc
    // probed before they run; the tracepoints see their waits.
    let mut cmd = Running::spawn(uvspan_cmd(["--symbol-cache", &cache.str(), "--", "node", "-e", "setTimeout(() => {}, 3000)"]));
    cmd.wait_stderr(RUN_TIMEOUT, "'tracing'", |e| e.contains("uvspan: tracing"));
    let links = bpf_links(cmd.pid);
    let tps = links.iter().filter(|l| matches!(l.get("tp_name").map(String::as_str), Some("sys_enter" | "sys_exit"))).count();
    assert_eq!(tps, if fentry { 0 } else { 2 }, "fentry {fentry}: {links:#?}");
    assert!(!links.iter().any(|l| l.get("path").is_some_and(|p| p.contains("/libc.so"))), "{links:#?}");
    let out = cmd.finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
}

// ===========================================================================
// --sample-time
// ===========================================================================

/// Probes live 20% of the time: fewer fs spans than operations, each marked
/// with the share; every slow iteration still reported (the epoll path is
/// always on); operations cut by a window edge dropped and counted, and the
/// summary says how long the probes were live.
#[test]
fn sample_time_samples_operations_but_sees_every_slow_iteration() {
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let script = fixture("sampled.js");
    // (the fixture stats its own script, a .js file: module loading,
    // summarised by default; a span each here)
    let out = run(uvspan_cmd([
        "--sample-time",
        "20%",
        "--loop-threshold",
        "50ms",
        "--startup-ops",
        "spans",
        "--otlp-endpoint",
        &ep,
        "--",
        "node",
        &script,
    ]));
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let m = Markers::parse(&out.stdout);
    let ops = m.i64("done", "async") + m.i64("done", "sync");
    let spans = rx.spans();
    check_summary(&out, spans.len());
    let fs: Vec<&Span> = spans.iter().filter(|s| s.name.starts_with("fs.")).collect();
    for s in &fs {
        assert_eq!(s.double("uvspan.sample_time"), Some(0.2), "{}", s.brief());
        assert!(s.end_unix_nano >= s.start_unix_nano, "{}", s.brief());
    }
    // The fixture's own stats (module loading is fs work too).
    let stats = fs.iter().filter(|s| s.name == "fs.stat" && s.str("file.path") == Some(script.as_str())).count();
    assert!(stats > 0, "no fs.stat of the fixture in the sampling windows\n{}", out.context());
    assert!((stats as i64) < ops, "{stats} fs.stat spans for {ops} operations: probes were not switched off\n{}", out.context());
    let iters: Vec<&Span> = spans.iter().filter(|s| s.name == "uv.loop.iteration").collect();
    for it in &iters {
        assert_eq!(it.double("uvspan.sample_time"), Some(1.0), "iterations are not sampled: {}", it.brief());
    }
    check_busy_markers_covered(&iters, &m, 4);
    // (the summary line; the probes' cost follows it)
    assert!(out.stderr.lines().any(|l| l.contains("--sample-time 20%: probes live ")), "{}", out.stderr);
    // Crossing a window edge is counted (it happens: async stats are in
    // flight nearly all the time), so it cannot be lost silently.
    assert!(summary_number(&out.stderr, " operations crossing a window edge dropped") > 0, "{}", out.context());
}

/// Under a saturated load (wrk, 16 connections, each request reading a file
/// and resolving a name), every request the probes saw start in a window is
/// exported whole or counted as cut by the window's close, and the shares of
/// requests and of operations exported are within ±15% of the share of the
/// work the summary states (counts only): the share of the bytes the app's
/// threads read and wrote while the probes were live. The share of the time
/// is above both (the probes' traps slow the app in the windows: measured
/// 0.7–0.95× of it), so it must not be the one to scale counts by.
/// One saturated load at a time: two on this machine's two cores starve
/// each other's uvspan, whose windows then open late (seen: probes live
/// 2.4% of the time for 10% asked, and requests 0.34× the work share).
static SATURATED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn sample_time_share_of_a_saturated_load_in(topology: Topology) {
    require_root();
    require_tool("wrk", "it loads the app (scripts/setup.sh installs it)");
    let _alone = SATURATED.lock().unwrap_or_else(|e| e.into_inner());
    let col = Collector::start(Listen::Plain);
    let ep = format!("http://127.0.0.1:{}", col.port());
    let script = fixture("saturated.js");
    let uv = ["--sample-time", "10%", "--status-interval", "0", "--loop-threshold", "10m", "--otlp-endpoint", ep.as_str()];
    // Time for several windows (one a second); nothing is timed.
    let out = run(topology.command(&uv, &["node", &script, "8"]));
    let spans = col.spans();
    check_summary(&out, spans.len());
    assert_eq!(out.code(), Some(0), "{topology:?}\n{}", out.context());
    let n = Markers::parse(&out.stdout).i64("served", "n") as u64;
    let summary = out.stderr.lines().find(|l| is_summary_line(l)).unwrap_or_default().to_string();
    let share = |after: &str| -> f64 {
        summary
            .split(after)
            .nth(1)
            .and_then(|r| r.split('%').next())
            .and_then(|p| p.parse().ok())
            .map(|p: f64| p / 100.0)
            .unwrap_or_else(|| panic!("no '{after}' share in the summary: {summary}"))
    };
    let (time, work) = (share("probes live "), share(" of the time and for "));
    let requests: Vec<&Span> = spans.iter().filter(|s| s.kind == 2).collect();
    let is_op = |s: &Span| s.name.starts_with("fs.") || s.name.starts_with("dns.");
    let ops = spans.iter().filter(|s| is_op(s)).count() as u64;
    // Operations per request: as many as most exported requests hold.
    let mut per: BTreeMap<usize, u64> = BTreeMap::new();
    for r in &requests {
        *per.entry(spans.iter().filter(|s| is_op(s) && s.parent_span_id == r.span_id).count()).or_default() += 1;
    }
    let per_request = per.iter().max_by_key(|(_, n)| **n).map_or(0, |(k, _)| *k as u64);
    let cut = summary_number(&out.stderr, " requests crossing one)");
    let straddled = summary_number(&out.stderr, " operations crossing a window edge dropped");
    let what = format!(
        "{topology:?}: {n} served, {} requests exported, {cut} cut by a window's close, {ops} operations exported \
         ({per_request} a request), {straddled} crossing an edge; probes live {:.1}% of the time, {:.1}% of the work\n{}",
        requests.len(),
        time * 100.0,
        work * 100.0,
        out.context()
    );
    assert!(n > 1000 && per_request >= 2, "a saturated load, each request reading a file and resolving a name: {what}");
    let within = |exported: u64, of: u64| (0.85..=1.15).contains(&(exported as f64 / of as f64 / work));
    assert!(within(requests.len() as u64 + cut, n), "requests seen are not the share of the work: {what}");
    assert!(within(requests.len() as u64, n), "requests exported are not the share of the work: {what}");
    assert!(within(ops, n * per_request), "operations exported are not the share of the work: {what}");
    // Every request seen is exported or counted.
    assert_eq!(requests.len() as u64 + cut, summary_number(&out.stderr, " HTTP requests"), "{what}");
    // With 16 requests in flight at every close, some are cut: counted.
    assert!(cut > 0 && straddled > 0, "{what}");
    // The share to scale by is also a metric.
    let gauge = metric_values(&col, &["uvspan.sample_time.work"]);
    let g = gauge.get("uvspan.sample_time.work").copied().unwrap_or_else(|| panic!("no uvspan.sample_time.work: {gauge:?}\n{what}"));
    assert!((g - work).abs() < 0.001, "gauge {g} vs summary {work}: {what}");
}

#[test]
fn sample_time_share_of_a_saturated_load_on_the_host() {
    sample_time_share_of_a_saturated_load_in(Topology::Host);
}

#[test]
fn sample_time_share_of_a_saturated_load_both_in_one_namespace() {
    sample_time_share_of_a_saturated_load_in(Topology::BothInOne);
}

#[test]
fn sample_time_share_of_a_saturated_load_app_alone_in_its_namespace() {
    sample_time_share_of_a_saturated_load_in(Topology::AppAlone);
}

#[test]
fn bad_input_sample_time() {
    let out = run(uvspan_cmd(["--sample-time", "0%", "--", "node", "-e", "1"]));
    assert_clap_value_error(&out, "--sample-time", "0%", "must be more than 0%");
    let out = run(uvspan_cmd(["--sample-time", "10%", "--detail", "phases", "--", "node", "-e", "1"]));
    assert_one_line_error(&out, 2, &["--sample-time cannot be combined with --detail phases"]);
}

#[test]
fn bad_input_max_overhead() {
    let out = run(uvspan_cmd(["--max-overhead", "0%", "--", "node", "-e", "1"]));
    assert_clap_value_error(&out, "--max-overhead", "0%", "must be more than 0%");
    let out = run(uvspan_cmd(["--max-overhead", "5%", "--detail", "phases", "--", "node", "-e", "1"]));
    assert_one_line_error(&out, 2, &["--max-overhead cannot be combined with --detail phases"]);
}

// ===========================================================================
// The benchmark's hit count (UVSPAN_BENCH_COUNT_HITS=1)
// ===========================================================================

/// With the benchmark's hit count on, uvspan prints at exit how often each
/// probe point fired: every fs.statSync is one hit of `uv_fs_stat` and one
/// `fs.stat` span, so the count equals the spans. With the per-hit timing
/// on too (`UVSPAN_BENCH_TIME_HITS=1`), the timing program counts the
/// entries instead of uvspan's, and times each one.
fn hit_count_in(topology: Topology) {
    require_root();
    for timed in [false, true] {
        let dir = TempDir::new("hits");
        let target = dir.join("hit-target");
        std::fs::write(&target, "x").expect("write the stat target");
        let script = format!("const fs = require('fs'); for (let i = 0; i < 300; i++) fs.statSync({target:?});");
        let mut c = topology.command(&["--loop-threshold", "1s", "--requests", "off"], &["node", "-e", &script]);
        c.env("UVSPAN_BENCH_COUNT_HITS", "1");
        if timed {
            c.env("UVSPAN_BENCH_TIME_HITS", "1");
        }
        let out = run(c);
        let what = format!("{topology:?}, timed: {timed}");
        assert_eq!(out.code(), Some(0), "{what}\n{}", out.context());
        let spans = out.stdout.lines().filter(|l| l.split_whitespace().nth(2) == Some("fs.stat")).count();
        let want_path = format!("file.path={target}");
        let ours = out.stdout.lines().filter(|l| l.split_whitespace().any(|w| w == want_path)).count();
        assert_eq!(ours, 300, "the script's 300 stats are spans ({what})\n{}", out.context());
        let hits: Vec<u64> =
            out.stderr.lines().filter_map(|l| l.strip_prefix("uvspan: hits ")?.strip_suffix(" uv_fs_stat")?.parse().ok()).collect();
        assert_eq!(hits, [spans as u64], "one uv_fs_stat hit per fs.stat span ({what})\n{}", out.context());
        // `uvspan: hit-ns NS_PER_HIT TIMED UNORDERED OUTLIERS uv_fs_stat`
        let times: Vec<Vec<u64>> = out
            .stderr
            .lines()
            .filter_map(|l| l.strip_prefix("uvspan: hit-ns ")?.strip_suffix(" uv_fs_stat"))
            .map(|l| l.split(' ').filter_map(|w| w.parse().ok()).collect())
            .collect();
        if timed {
            assert_eq!(times.len(), 1, "one timing line for uv_fs_stat ({what})\n{}", out.context());
            let t = &times[0];
            assert!(t.len() == 4 && t[0] > 0, "a time per hit ({what}): {t:?}");
            assert_eq!(t[1] + t[2] + t[3], spans as u64, "every hit timed or counted as not ({what})\n{}", out.context());
        } else {
            assert!(times.is_empty(), "no timing without UVSPAN_BENCH_TIME_HITS ({what})");
        }
    }
}

#[test]
fn hit_count_on_the_host() {
    hit_count_in(Topology::Host);
}

#[test]
fn hit_count_with_uvspan_and_the_app_in_one_pid_namespace() {
    hit_count_in(Topology::BothInOne);
}

#[test]
fn hit_count_with_the_app_alone_in_its_pid_namespace() {
    hit_count_in(Topology::AppAlone);
}
