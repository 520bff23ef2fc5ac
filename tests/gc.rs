//! V8 garbage collections on real node processes under uvspan
//! (tests/fixtures/gc.js: ~1 s of allocation in one timer callback), with
//! Node's own perf_hooks 'gc' entries as the oracle:
//! - the slow iteration's `v8js.gc` span events are the collections Node
//!   saw in it, type by type; `uvspan.loop.gc_ms` is within the busy time,
//!   and the busy time's split still adds up;
//! - `v8js.gc.duration` counts every collection of the run, type by type,
//!   as many as Node saw (the fixture observes from its first line and
//!   allocates nothing after it prints its count);
//! - on the official builds 20-26 and the stripped copy of /usr/bin/node;
//!   where V8's GC callbacks cannot be probed (Node 18 inlines them,
//!   Debian's libnode is not where uvspan looks), it is said, and no
//!   iteration carries a GC time;
//! - with uvspan and the app in one PID + mount namespace, and with the app
//!   alone in its own (uvspan on the host, by --pid).
//!
//! No duration is bounded: the checks are counts and types against Node's.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use common::collector::{histogram_points, Collector, Listen};
use common::*;

/// How far on + off + run queue may be from the busy time (a share of it).
const SUM_SLACK: f64 = 0.03;
const TYPES: [&str; 4] = ["minor", "major", "incremental", "weakcb"];

/// One collection test at a time: each runs ~1 s of allocation, and two at
/// once on a two-CPU machine would wait for each other's CPU.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// uvspan's arguments before `--`, exporting to `col` (delta metrics every 500 ms).
fn exporting(col: &Collector) -> Vec<String> {
    let ep = format!("http://127.0.0.1:{}", col.port());
    ["--status-interval", "0", "--loop-threshold", "50ms", "--otlp-endpoint", &ep, "--otlp-protocol", "http/protobuf"]
        .map(String::from)
        .to_vec()
}

fn metrics_env(c: &mut Command) {
    c.envs([("OTEL_METRIC_EXPORT_INTERVAL", "500"), ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")]);
}

/// Node's count per type (a `gcs` or `gcs_in_slow` marker).
/// The fixture started with `wait` (`c`), once it has printed its info
/// marker: it collects when told to go on its stdin.
fn spawn_waiting(mut c: Command) -> (Running, std::process::ChildStdin) {
    c.stdin(Stdio::piped());
    let mut app = Running::spawn(c);
    let stdin = app.child.stdin.take().expect("piped stdin");
    app.wait_stdout(RUN_TIMEOUT, "the app's info marker", |o| o.contains("\"info\""));
    (app, stdin)
}

/// uvspan attached by --pid to `pid` (the waiting app, as uvspan sees it),
/// exporting to `col`; then the app is told to go. The app's output,
/// uvspan's, and both as a failure's context; both exited 0.
fn trace_then_go(col: &Collector, pid: u32, app: Running, mut stdin: std::process::ChildStdin) -> (Output, Output, String) {
    let mut args = exporting(col);
    // The fallbacks in use are named with --verbose.
    args.extend(["--verbose".into(), "--pid".into(), pid.to_string()]);
    let mut uv = uvspan_cmd(args);
    metrics_env(&mut uv);
    let mut uv = Running::spawn(uv);
    uv.wait_stderr(RUN_TIMEOUT, "uvspan tracing the app", |e| e.contains(&format!("tracing process {pid}")));
    stdin.write_all(b"go\n").expect("tell the app to go");
    drop(stdin);
    let out = app.finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let uv = uv.finish(RUN_TIMEOUT);
    let ctx = format!("{}\n--- uvspan ---\n{}", out.context(), uv.context());
    assert_eq!(uv.code(), Some(0), "{ctx}");
    (out, uv, ctx)
}

fn oracle(m: &Markers, marker: &str) -> BTreeMap<&'static str, u64> {
    assert_eq!(m.i64(marker, "other"), 0, "Node reported a kind of collection it has no constant for: {:?}", m.get(marker));
    TYPES.iter().map(|t| (*t, m.i64(marker, t) as u64)).filter(|(_, n)| *n > 0).collect()
}

fn event_str<'a>(e: &'a Event, k: &str) -> Option<&'a str> {
    match e.attributes.get(k) {
        Some(Attr::Str(s)) => Some(s),
        _ => None,
    }
}

fn event_f64(e: &Event, k: &str) -> Option<f64> {
    match e.attributes.get(k) {
        Some(Attr::Double(v)) => Some(*v),
        _ => None,
    }
}

/// Everything checked of one run: the fixture's stdout, the spans and
/// metrics of the process `pid` (as the app sees itself), `ctx` for
/// failures; `whole`: Node's marker of the run's collections the metric
/// must count (`gcs`: all, uvspan attached at exec; `gcs_since_start`:
/// those since the app started its run, uvspan attached by then).
fn check_run(label: &str, stdout: &str, col: &Collector, pid: i64, ctx: &str, whole: &str) {
    let m = Markers::parse(stdout);
    let (before, after) = (m.f64("slow", "before"), m.f64("slow", "after"));
    let in_slow = oracle(&m, "gcs_in_slow");
    let all = oracle(&m, whole);
    assert!(in_slow.values().sum::<u64>() > 0, "{label}: Node saw no collection in the allocating callback: {:?}\n{ctx}", m.0);

    // The slow iteration: its collections, type by type.
    let spans = col.spans();
    let iters: Vec<&Span> = spans.iter().filter(|s| s.name == "uv.loop.iteration" && s.res_int("process.pid") == Some(pid)).collect();
    let it = iters
        .iter()
        .find(|s| s.start_ms() <= before + CLOCK_SLACK_MS && s.end_ms() >= after - CLOCK_SLACK_MS)
        .unwrap_or_else(|| panic!("{label}: no uv.loop.iteration covers [{before:.3}, {after:.3}]:\n{}\n{ctx}", dump(&iters)));
    let events: Vec<&Event> = it.events.iter().filter(|e| e.name == "v8js.gc").collect();
    let mut seen: BTreeMap<&'static str, u64> = BTreeMap::new();
    for e in &events {
        let t = event_str(e, "v8js.gc.type").unwrap_or_else(|| panic!("{label}: a v8js.gc event without its type: {e:?}"));
        let t = TYPES.iter().find(|k| **k == t).unwrap_or_else(|| panic!("{label}: v8js.gc.type {t:?} is none of {TYPES:?}"));
        *seen.entry(t).or_default() += 1;
        let d = event_f64(e, "uvspan.gc.duration_ms").unwrap_or_else(|| panic!("{label}: a v8js.gc event without its duration: {e:?}"));
        assert!(d >= 0.0, "{label}: {e:?}");
        let at = e.time_unix_nano as f64 / 1e6;
        assert!(at >= it.start_ms() - CLOCK_SLACK_MS && at <= it.end_ms() + CLOCK_SLACK_MS, "{label}: {e:?} outside {}", it.brief());
    }
    // The iteration holds the callback: each of Node's collections in it,
    // and at most a scavenge or two besides (one can land in the same
    // iteration outside the callback, the observer's own allocations).
    for (t, n) in &in_slow {
        assert!(
            seen.get(t).copied().unwrap_or(0) >= *n,
            "{label}: the iteration's v8js.gc events {seen:?} miss Node's gc entries in the callback {in_slow:?}\n{}",
            it.brief()
        );
    }
    let (got_n, want_n) = (seen.values().sum::<u64>(), in_slow.values().sum::<u64>());
    assert!(got_n <= want_n + 2, "{label}: the iteration's v8js.gc events {seen:?} vs Node's in the callback {in_slow:?}\n{}", it.brief());
    assert_eq!(seen.get("major"), in_slow.get("major"), "{label}: major collections {seen:?} vs {in_slow:?}");
    assert_eq!(it.int("uvspan.loop.gc_count"), Some(events.len() as i64), "{label}: {}", it.brief());

    // Its GC time: some, within the busy time, and no less than the longest
    // collection (nested ones count once, so no more than their sum).
    let get = |k: &str| it.double(k).unwrap_or_else(|| panic!("{label}: no {k}: {}", it.brief()));
    let (gc, busy) = (get("uvspan.loop.gc_ms"), get("uvspan.loop.busy_ms"));
    let durations: Vec<f64> = events.iter().filter_map(|e| event_f64(e, "uvspan.gc.duration_ms")).collect();
    let (longest, sum) = (durations.iter().copied().fold(0.0, f64::max), durations.iter().sum::<f64>());
    assert!(gc > 0.0 && gc <= busy, "{label}: gc {gc:.3} ms of busy {busy:.3} ms: {}", it.brief());
    assert!(gc >= longest - 0.001 && gc <= sum + 0.001, "{label}: gc {gc:.3} ms, longest {longest:.3}, sum {sum:.3}: {}", it.brief());
    // The busy time's split still adds up.
    let (on, off, rq) = (get("uvspan.loop.on_cpu_ms"), get("uvspan.loop.off_cpu_ms"), get("uvspan.loop.runqueue_ms"));
    assert!((on + off + rq - busy).abs() <= SUM_SLACK * busy, "{label}: on {on} + off {off} + rq {rq} vs busy {busy}: {}", it.brief());
    eprintln!("{label}: slow iteration busy {busy:.1} ms, gc {gc:.1} ms in {} collections {seen:?}", events.len());

    // The metric: every collection of the run, as Node counted them.
    let mut counted: BTreeMap<&'static str, u64> = BTreeMap::new();
    for (attrs, n, res) in histogram_points(col, "v8js.gc.duration") {
        if res.get("process.pid").map(String::as_str) != Some(format!("Some(IntValue({pid}))").as_str()) {
            continue;
        }
        let t = attrs.get("v8js.gc.type").unwrap_or_else(|| panic!("{label}: a v8js.gc.duration point without v8js.gc.type: {attrs:?}"));
        let t = TYPES.iter().find(|k| format!("Some(StringValue({:?}))", k) == *t).unwrap_or_else(|| panic!("{label}: type {t}"));
        *counted.entry(t).or_default() += n;
    }
    assert_eq!(counted, all, "{label}: v8js.gc.duration counts by type vs Node's gc entries of the whole run\n{ctx}");
}

/// `node` (with `env`) running the fixture under `uvspan -- …`.
fn run_build(label: &str, node: &Path, env: &[(&str, &str)]) {
    require_root();
    let _one = one_at_a_time();
    let col = Collector::start(Listen::Plain);
    let node = node.to_string_lossy().into_owned();
    let mut args = exporting(&col);
    args.extend(["--".into(), node, fixture("gc.js")]);
    let mut c = uvspan_cmd(args);
    metrics_env(&mut c);
    c.envs(env.iter().copied());
    let out = run(c);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let pid = Markers::parse(&out.stdout).i64("info", "pid");
    check_run(label, &out.stdout, &col, pid, &out.context(), "gcs");
}

#[test]
fn node_20_on_the_host() {
    run_build("node 20", Path::new("/usr/bin/node"), &[]);
}

#[test]
fn official_node_22() {
    run_build("node 22", &official_node(22), &[]);
}

#[test]
fn official_node_24() {
    run_build("node 24", &official_node(24), &[]);
}

#[test]
fn official_node_26() {
    run_build("node 26", &official_node(26), &[]);
}

/// The stripped copy of /usr/bin/node: V8's GC callbacks are exported, so
/// they survive in .dynsym (the loop has no phases there, the GC is whole).
#[test]
fn stripped_node() {
    run_build("stripped", &common::stripped_node(), &[]);
}

/// A build where uvspan sees no collection: the notice says so, and no
/// iteration carries a GC time (not a 0) or events, no metric is made.
fn no_gc_seen(label: &str, node: &Path, env: &[(&str, &str)]) {
    require_root();
    let _one = one_at_a_time();
    let col = Collector::start(Listen::Plain);
    let mut args = exporting(&col);
    // the fallbacks' notices are details: --verbose
    args.extend(["--verbose".into(), "--".into(), node.to_string_lossy().into_owned(), fixture("gc.js")]);
    let mut c = uvspan_cmd(args);
    metrics_env(&mut c);
    c.envs(env.iter().copied());
    let out = run(c);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    for sym in GC_V10 {
        let line = format!("fallback {sym} unavailable: {GC_LOST}");
        assert!(out.stderr.contains(&line), "{label}: no notice {line:?}\n{}", out.context());
    }
    let m = Markers::parse(&out.stdout);
    assert!(m.i64("gcs_in_slow", "total") > 0, "{label}: Node saw collections: {:?}", m.0);
    let spans = col.spans();
    let iters: Vec<&Span> = spans.iter().filter(|s| s.name == "uv.loop.iteration").collect();
    assert!(!iters.is_empty(), "{label}: {}", out.context());
    for it in iters {
        assert_eq!(it.double("uvspan.loop.gc_ms"), None, "{label}: no GC time where no GC is seen: {}", it.brief());
        assert!(it.events.iter().all(|e| e.name != "v8js.gc"), "{label}: {}", it.brief());
    }
    assert!(histogram_points(&col, "v8js.gc.duration").is_empty(), "{label}: no GC metric where no GC is seen");
}

/// Node 18 (V8 10.2): its GC callbacks are inlined into the collections
/// (out of line for weak callbacks alone); the functions just inside them
/// are probed instead.
#[test]
fn official_node_18() {
    run_build("node 18", &official_node(18), &[]);
}

/// Debian's nodejs: libuv is a shared libuv.so.1 and V8 lives in the
/// libnode.so beside it (V8 10.2, its callbacks out of line there: the
/// collections are each recorded once). Its startup collects a few times
/// before the app's first line can observe (no startup snapshot), so
/// uvspan attaches by --pid once the app observes.
#[test]
fn debian_node_with_libnode() {
    require_root();
    let _one = one_at_a_time();
    let d = debian_node();
    let lib = d.lib_dir.to_string_lossy().into_owned();
    let col = Collector::start(Listen::Plain);
    let mut c = Command::new(&d.node);
    scrub_env(&mut c);
    c.env("LD_LIBRARY_PATH", &lib).args([fixture("gc.js").as_str(), "wait"]);
    let (app, stdin) = spawn_waiting(c);
    let pid = app.pid;
    let (out, uv, ctx) = trace_then_go(&col, pid, app, stdin);
    // V8 10.2's points, in libnode.so (libuv.so.1 has none).
    let pause = "fallback in use: _ZN2v88internal4Heap25GarbageCollectionPrologueENS0_23GarbageCollectionReasonENS_15GCCallbackFlagsE";
    assert!(uv.stderr.contains(pause), "{ctx}");
    let pid = Markers::parse(&out.stdout).i64("info", "pid");
    check_run("debian 18", &out.stdout, &col, pid, &ctx, "gcs_since_start");
}

/// A stripped copy of official Node 24: its V8 functions are all local
/// (.symtab only), so no GC point survives; it is said, and nothing
/// pretends to be measured.
#[test]
fn stripped_node_24_says_gc_is_not_seen() {
    require_root();
    require_tool("strip", "(binutils) to make a stripped node binary");
    let dir = std::env::temp_dir().join(format!("uvspan-gc-stripped-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a temp dir");
    let node = dir.join("node");
    let mut strip = Command::new("strip");
    strip.arg("-o").arg(&node).arg(official_node(24));
    let out = run(strip);
    assert!(out.status.success(), "strip failed\n{}", out.context());
    no_gc_seen("stripped node 24", &node, &[]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// uvspan and the app in one PID + mount namespace (a job container).
#[test]
fn uvspan_and_node_in_one_pid_namespace() {
    require_root();
    let _one = one_at_a_time();
    require_tool("unshare", "it makes the PID and mount namespaces (util-linux)");
    let col = Collector::start(Listen::Plain);
    let mut c = Command::new("unshare");
    scrub_env(&mut c);
    c.args(["--pid", "--fork", "--mount", "--mount-proc", uvspan_bin()]);
    c.args(exporting(&col)).args(["--", "node", &fixture("gc.js")]);
    metrics_env(&mut c);
    c.stdin(Stdio::null());
    let out = Running::spawn(c).finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let pid = Markers::parse(&out.stdout).i64("info", "pid");
    assert!(pid > 1 && pid < 100, "node's pid in the new namespace is small: {pid}");
    check_run("one namespace", &out.stdout, &col, pid, &out.context(), "gcs");
}

/// The app alone in its own PID + mount namespace, uvspan on the host
/// attaching by --pid (its host pid) before the app starts allocating.
#[test]
fn node_alone_in_its_own_pid_namespace() {
    require_root();
    let _one = one_at_a_time();
    require_tool("unshare", "it makes the PID and mount namespaces (util-linux)");
    let col = Collector::start(Listen::Plain);
    let mut c = Command::new("unshare");
    scrub_env(&mut c);
    c.args(["--pid", "--fork", "--mount", "--mount-proc", "node", &fixture("gc.js"), "wait"]);
    let (app, stdin) = spawn_waiting(c);
    let host_pid = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", app.pid))
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u32>().ok())
        .expect("unshare's child, the app");
    let (out, _uv, ctx) = trace_then_go(&col, host_pid, app, stdin);
    assert_eq!(Markers::parse(&out.stdout).i64("info", "pid"), 1, "the app is its namespace's first process");
    check_run("own namespace", &out.stdout, &col, 1, &ctx, "gcs");
}
