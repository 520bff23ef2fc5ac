//! `--publish-trace-context`, end to end: a Node HTTP server whose handler is
//! busy on the loop thread for ~30 ms (tests/fixtures/trace_ctx.js) gets
//! sequential requests while this test reads the pinned map a profiler reads
//! (/sys/fs/bpf/otel/traces_ctx_v1, libbpf's own map calls) every 2 ms, at
//! the node process's key as the kernel's initial PID namespace sees it.
//! Samples taken while a request's handler runs (its reply says when) carry that request's
//! exported trace id and a span id of its trace (at least 90%); samples
//! between requests carry none (at least 90%). Run in the three topologies;
//! the map is left as found (made and removed by uvspan, with the BPF
//! filesystem it mounted; or a map made beforehand with the same layout
//! reused and left empty); a map of another layout is refused in one line;
//! requests the sampler drops are never published.
//! Root only, never skipped.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

const PIN: &str = "/sys/fs/bpf/otel/traces_ctx_v1";
const REQUESTS: usize = 20;
const GAP: Duration = Duration::from_millis(40);

/// The tests share the pinned path and the BPF filesystem's mount.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn bpffs_mounted() -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf") && l.split_whitespace().nth(2) == Some("bpf"))
}

fn sh(args: &[&str]) {
    let st = std::process::Command::new(args[0]).args(&args[1..]).status().expect(args[0]);
    assert!(st.success(), "{args:?}: {st}");
}

/// The BPF filesystem mounted for the test's length (unmounted after if the
/// test mounted it).
struct Bpffs(bool);

impl Bpffs {
    fn mount() -> Bpffs {
        if bpffs_mounted() {
            return Bpffs(false);
        }
        sh(&["mount", "-t", "bpf", "bpf", "/sys/fs/bpf"]);
        Bpffs(true)
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        if self.0 {
            let _ = std::process::Command::new("umount").arg("/sys/fs/bpf").status();
        }
    }
}

/// What a test made beforehand at the pinned path.
enum Before {
    Nothing,
    /// A map of the profiler's layout (reused, left empty).
    SameLayout,
}

/// The node process running `script` (its pid in this test's, the
/// initial, PID namespace).
fn node_pid(script: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (comm.trim() == "node" && String::from_utf8_lossy(&cmdline).contains(script)).then_some(pid)
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One read of the map: when (CLOCK_MONOTONIC ns), and the (trace id,
/// span id) there (None: no entry).
type Sample = (u64, Option<(String, String)>);

/// CLOCK_MONOTONIC in ns: node's process.hrtime's clock.
fn mono_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The handler's start and end (CLOCK_MONOTONIC ns) from its reply's body.
fn handler_window(reply: &str) -> (u64, u64) {
    let body = reply.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {reply}"));
    let ns = |k: &str| v[k].as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{k} in {reply}"));
    (ns("start"), ns("end"))
}

fn get(port: u16, path: &str, traceparent: Option<&str>) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let tp = traceparent.map(|t| format!("traceparent: {t}\r\n")).unwrap_or_default();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n{tp}\r\n").expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    out
}

fn premade(ty: MapType, key: u32, value: u32) -> MapHandle {
    let _ = std::fs::create_dir_all("/sys/fs/bpf/otel");
    let opts = libbpf_rs::libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>() as _,
        ..Default::default()
    };
    let mut m = MapHandle::create(ty, Some("traces_ctx_v1"), key, value, 16384, &opts).expect("a map");
    m.pin(PIN).expect("pinned");
    m
}

fn publishes_in(topology: Topology, tag: &str, before: Before) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // uvspan on the host mounts the BPF filesystem itself where it is not;
    // one in its own mount namespace sees the host's (a container with
    // /sys/fs/bpf mounted in), which this test mounts then.
    let mounted_before = bpffs_mounted();
    let _fs = (topology == Topology::BothInOne || matches!(before, Before::SameLayout)).then(Bpffs::mount);
    let theirs = match before {
        Before::Nothing => {
            assert!(!Path::new(PIN).exists(), "{PIN} is there before the test: remove it");
            None
        }
        Before::SameLayout => Some(premade(MapType::LruHash, 8, 24)),
    };
    let theirs_id = theirs.as_ref().map(|m| m.info().expect("info").info.id);
    let found_mounted = bpffs_mounted();

    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let script = fixture("trace_ctx.js");
    let uv = ["--publish-trace-context", "--loop-threshold", "10m", "--status-interval", "0", "--otlp-endpoint", ep.as_str()];
    let mut run = Running::spawn(topology.command(&uv, &["node", &script]));
    run.wait_stdout(Duration::from_secs(60), "the server's port", |s| s.contains("\"marker\":\"listening\""));
    let port = Markers::parse(&run.stdout()).i64("listening", "port") as u16;
    let pid = node_pid(&script).unwrap_or_else(|| panic!("no node process running {script}\n{}", run.stderr()));
    let key = (u64::from(pid) << 32) | u64::from(pid);
    let map = MapHandle::from_pinned_path(PIN).unwrap_or_else(|e| panic!("{PIN} not pinned while uvspan runs: {e}\n{}", run.stderr()));
    if let Some(id) = theirs_id {
        assert_eq!(map.info().expect("info").info.id, id, "the map made beforehand is the one pinned (reused)");
    }

    // The reader: every 2 ms, the node loop thread's entry.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut out: Vec<Sample> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let v = map.lookup(&key.to_ne_bytes(), MapFlags::ANY).expect("lookup");
                out.push((mono_ns(), v.map(|v| (hex(&v[..16]), hex(&v[16..24])))));
                std::thread::sleep(Duration::from_millis(2));
            }
            out
        })
    };
    std::thread::sleep(GAP);
    let mut windows = Vec::new();
    // Every third request comes with a caller's traceparent: its trace is
    // the caller's, in the map too.
    let callers: BTreeMap<usize, String> = (0..REQUESTS)
        .filter(|i| i % 3 == 1)
        .map(|i| (i, format!("{:032x}", 0x5eed_0000_0000_0000_0000_0000_0000_0000u128 + i as u128)))
        .collect();
    for i in 0..REQUESTS {
        let tp = callers.get(&i).map(|t| format!("00-{t}-00f067aa0ba902b7-01"));
        let t0 = mono_ns();
        let reply = get(port, &format!("/busy/{i}"), tp.as_deref());
        let t1 = mono_ns();
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        let (start, end) = handler_window(&reply);
        windows.push((i, t0, t1, start, end));
        std::thread::sleep(GAP);
    }
    stop.store(true, Ordering::Relaxed);
    let samples = reader.join().expect("reader");
    let _ = get(port, "/exit", None);
    let out = run.finish(Duration::from_secs(60));
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let spans = wait_spans(&rx, Duration::from_secs(10), |s| s.iter().filter(|s| s.kind == 2).count() >= REQUESTS);

    // Each request's exported trace and the span ids in it.
    let mut trace_of: BTreeMap<usize, String> = BTreeMap::new();
    let mut server_of: BTreeMap<usize, String> = BTreeMap::new();
    for s in spans.iter().filter(|s| s.kind == 2) {
        if let Some(i) = s.str("url.path").and_then(|p| p.strip_prefix("/busy/")).and_then(|i| i.parse().ok()) {
            trace_of.insert(i, s.trace_id.clone());
            server_of.insert(i, s.span_id.clone());
        }
    }
    assert_eq!(trace_of.len(), REQUESTS, "a SERVER span per request\n{}", out.context());
    for (i, t) in &callers {
        assert_eq!(&trace_of[i], t, "request {i} came with a traceparent: its SERVER span is in the caller's trace");
    }
    let mut in_trace: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for s in &spans {
        in_trace.entry(&s.trace_id).or_default().insert(&s.span_id);
    }

    // Inside: while its handler runs, as the server's clock says (from
    // the request's head on the entry is the request's; under load the
    // head can reach the server well after it was sent). Between: from 2 ms
    // after a response arrived to the next request's sending.
    const MS: u64 = 1_000_000;
    let (mut inside, mut inside_ok, mut inside_server) = (0usize, 0usize, 0usize);
    let (mut between, mut between_none) = (0usize, 0usize);
    let mut wrong = Vec::new();
    for (t, v) in &samples {
        if let Some((i, t0, ..)) = windows.iter().find(|w| *t >= w.3 && *t <= w.4) {
            inside += 1;
            let trace = &trace_of[i];
            match v {
                Some((tr, sp)) if tr == trace && in_trace.get(tr.as_str()).is_some_and(|ids| ids.contains(sp.as_str())) => {
                    inside_ok += 1;
                    inside_server += usize::from(*sp == server_of[i]);
                }
                other => wrong.push(format!("request {i} (trace {trace}), {} µs after it was sent: {other:?}", (t - t0) / 1000)),
            }
        } else if windows.iter().any(|w| *t >= w.2 + 2 * MS) && !windows.iter().any(|w| *t >= w.1 && *t <= w.2 + 2 * MS) {
            between += 1;
            between_none += usize::from(v.is_none());
        }
    }
    eprintln!(
        "{tag}: {} samples; inside requests {inside_ok}/{inside} carry the request's ids ({inside_server} its SERVER span's); \
         between requests {between_none}/{between} none",
        samples.len()
    );
    wrong.truncate(20);
    assert!(inside >= REQUESTS * 5, "{inside} samples inside requests: the reader did not run\n{}", out.context());
    assert!(between >= REQUESTS * 5, "{between} samples between requests: the reader did not run\n{}", out.context());
    assert!(
        inside_ok * 10 >= inside * 9,
        "{inside_ok}/{inside} samples inside requests carry their ids; e.g.\n{}\n{}",
        wrong.join("\n"),
        out.context()
    );
    assert!(between_none * 10 >= between * 9, "{between_none}/{between} samples between requests carry none\n{}", out.context());

    // Left as found.
    match theirs {
        None => {
            assert!(!Path::new(PIN).exists(), "uvspan made {PIN}: it is gone after its exit");
            assert!(!Path::new("/sys/fs/bpf/otel").exists(), "uvspan made /sys/fs/bpf/otel: it is gone after its exit");
            assert_eq!(bpffs_mounted(), found_mounted, "the BPF filesystem's mount as it was before uvspan ran");
            if !mounted_before && topology == Topology::Host {
                assert!(out.stderr.contains("mounted the BPF filesystem at /sys/fs/bpf"), "said so\n{}", out.stderr);
            }
        }
        Some(m) => {
            let again = MapHandle::from_pinned_path(PIN).expect("the map made beforehand is still pinned");
            assert_eq!(again.info().expect("info").info.id, theirs_id.unwrap_or_default(), "the same map");
            let left: Vec<Vec<u8>> = m.keys().collect();
            assert!(left.is_empty(), "{} entries left in a map uvspan reused (it was empty)", left.len());
            let _ = std::fs::remove_file(PIN);
            let _ = std::fs::remove_dir("/sys/fs/bpf/otel");
        }
    }
}

#[test]
fn publishes_requests_on_the_host() {
    require_root();
    publishes_in(Topology::Host, "host", Before::Nothing);
}

#[test]
fn publishes_requests_in_one_namespace() {
    require_root();
    publishes_in(Topology::BothInOne, "both", Before::Nothing);
}

#[test]
fn publishes_requests_of_an_app_alone_in_a_map_made_before() {
    require_root();
    publishes_in(Topology::AppAlone, "alone", Before::SameLayout);
}

#[test]
fn a_map_of_another_layout_is_refused_in_one_line() {
    require_root();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let _fs = Bpffs::mount();
    for (ty, k, v) in [(MapType::Hash, 8, 24), (MapType::LruHash, 4, 24), (MapType::LruHash, 8, 32)] {
        let theirs = premade(ty, k, v);
        let id = theirs.info().expect("info").info.id;
        let out = run(uvspan_cmd(["--publish-trace-context", "--status-interval", "0", "--", "node", "-e", "0"]));
        let still = MapHandle::from_pinned_path(PIN).map(|m| m.info().expect("info").info.id);
        let _ = std::fs::remove_file(PIN);
        assert_eq!(still.ok(), Some(id), "the map of another layout is left pinned, untouched");
        assert_ne!(out.code(), Some(0), "{}", out.context());
        let lines: Vec<&str> = out.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line\n{}", out.context());
        assert!(lines[0].contains(PIN) && lines[0].contains("another layout"), "{}", out.context());
        assert!(!out.stderr.contains("panicked"), "{}", out.context());
        drop(theirs);
    }
    let _ = std::fs::remove_dir("/sys/fs/bpf/otel");
}

/// A request whose trace the sampler drops (in the kernel, at its head)
/// exports no span: no profile may point at it, so nothing is published.
#[test]
fn requests_the_sampler_drops_are_not_published() {
    require_root();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    assert!(!Path::new(PIN).exists(), "{PIN} is there before the test: remove it");
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let script = fixture("trace_ctx.js");
    let uv = ["--publish-trace-context", "--loop-threshold", "10m", "--status-interval", "0", "--otlp-endpoint", ep.as_str()];
    let mut c = Topology::Host.command(&uv, &["node", &script]);
    c.env("OTEL_TRACES_SAMPLER", "always_off");
    let mut run = Running::spawn(c);
    run.wait_stdout(Duration::from_secs(60), "the server's port", |s| s.contains("\"marker\":\"listening\""));
    let port = Markers::parse(&run.stdout()).i64("listening", "port") as u16;
    let pid = node_pid(&script).unwrap_or_else(|| panic!("no node process running {script}\n{}", run.stderr()));
    let key = (u64::from(pid) << 32) | u64::from(pid);
    let map = MapHandle::from_pinned_path(PIN).unwrap_or_else(|e| panic!("{PIN} not pinned while uvspan runs: {e}\n{}", run.stderr()));
    let (mut inside, mut published) = (0usize, 0usize);
    for i in 0..8 {
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (stop, map) = (stop.clone(), MapHandle::try_from(&map).expect("a second handle"));
            std::thread::spawn(move || {
                let mut out: Vec<Sample> = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let v = map.lookup(&key.to_ne_bytes(), MapFlags::ANY).expect("lookup");
                    out.push((mono_ns(), v.map(|v| (hex(&v[..16]), hex(&v[16..24])))));
                    std::thread::sleep(Duration::from_millis(2));
                }
                out
            })
        };
        let reply = get(port, &format!("/busy/{i}"), None);
        stop.store(true, Ordering::Relaxed);
        let (start, end) = handler_window(&reply);
        for (t, v) in reader.join().expect("reader") {
            if t >= start && t <= end {
                inside += 1;
                published += usize::from(v.is_some());
            }
        }
    }
    let _ = get(port, "/exit", None);
    let out = run.finish(Duration::from_secs(60));
    assert_eq!(out.code(), Some(0), "{}", out.context());
    eprintln!("always_off: {published}/{inside} samples inside requests carry ids");
    assert!(inside >= 8 * 5, "{inside} samples inside requests: the reader did not run\n{}", out.context());
    assert_eq!(published, 0, "requests the sampler dropped are never published\n{}", out.context());
    assert!(rx.spans().iter().all(|s| s.kind != 2), "no SERVER span exported under always_off\n{}", out.context());
    assert!(!Path::new(PIN).exists(), "uvspan made {PIN}: it is gone after its exit\n{}", out.context());
}
