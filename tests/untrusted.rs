//! A traced process is untrusted input (in a DaemonSet every container on
//! the node is traced): what it writes for uvspan to read must not take
//! uvspan down or make it grow without bound. Real uvspan, real node, real
//! OTLP. The parsers themselves have property tests beside them (src/).
//!
//! Root only; never skipped.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// uvspan's peak memory while it names the frames of a process whose perf
/// map is 3M lines (~170 MB): the README documents the bound.
const PEAK_RSS_MAX_KIB: u64 = 100 * 1024;

/// A node whose perf map holds 3M lines it wrote itself (and garbage): its
/// slow iteration is still named (the frames uvspan kept name it), uvspan's
/// peak memory stays under the documented bound, and it says once that the
/// map was larger than it reads.
#[test]
fn a_3m_line_perf_map_keeps_uvspan_bounded() {
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    // node --perf-basic-prof also writes isolate-*-v8.log where it runs.
    let cwd = TempDir::new("untrusted-perf-map");
    let mut c = Command::new("node");
    scrub_env(&mut c);
    c.args(["--perf-basic-prof", &fixture("perf_map_flood.js"), "3000000"]).stdin(Stdio::piped()).current_dir(cwd.path());
    let mut app = Running::spawn(c);
    let mut stdin = app.child.stdin.take().expect("piped stdin");
    app.wait_stdout(Duration::from_secs(120), "the app's ready marker", |o| o.contains("\"ready\""));
    let map = format!("/tmp/perf-{}.map", app.pid);
    let bytes = std::fs::metadata(&map).map(|m| m.len()).unwrap_or(0);
    assert!(bytes > 150_000_000, "the perf map holds 3M lines: {bytes} bytes");

    let mut uv = uvspan_cmd(["--pid", &app.pid.to_string(), "--loop-threshold", "100ms", "--status-interval", "0"]);
    uv.args(["--otlp-endpoint", &rx.endpoint(), "--otlp-protocol", "grpc"]);
    let mut uv = Running::spawn(uv);
    uv.wait_stderr(RUN_TIMEOUT, "tracing", |e| e.contains("tracing process"));
    stdin.write_all(b"go\n").expect("go");
    drop(stdin);
    app.wait_stdout(RUN_TIMEOUT, "done", |o| o.contains("\"done\""));
    let spans = wait_spans(&rx, Duration::from_secs(15), |s| {
        s.iter().any(|s| s.name == "uv.loop.iteration" && s.str("uvspan.loop.blocked_by").is_some())
    });
    let peak = status_kib(uv.pid, "VmHWM");
    app.kill_group();
    let app_out = app.finish(RUN_TIMEOUT);
    let uv = uv.finish(RUN_TIMEOUT);
    let _ = std::fs::remove_file(&map);
    eprintln!("untrusted: uvspan peak RSS {peak} KiB naming the frames of a process with a {bytes}-byte perf map");
    let ctx = format!("{}\n--- uvspan ---\n{}", app_out.context(), uv.context());
    assert_eq!(uv.code(), Some(0), "{ctx}");
    let slow = spans.iter().find(|s| s.name == "uv.loop.iteration" && s.str("uvspan.loop.blocked_by").is_some());
    let slow = slow.unwrap_or_else(|| panic!("no named slow iteration\n{}\n{ctx}", dump(&spans.iter().collect::<Vec<_>>())));
    // The busy JS function is named in the heaviest stack (from V8's heap,
    // or the perf map's entries kept; the innermost frame may be what it calls).
    let stack = slow.str("code.stacktrace").unwrap_or_default();
    assert!(stack.lines().any(|l| l.contains("hot ") && l.contains("perf_map_flood.js")), "the busy JS function is named: {stack}");
    assert!(peak <= PEAK_RSS_MAX_KIB, "uvspan's peak RSS {peak} KiB is over {PEAK_RSS_MAX_KIB} KiB\n{ctx}");
    assert_eq!(uv.stderr.matches("perf map is larger than uvspan reads").count(), 1, "said once\n{ctx}");
}

/// Executables named `node` that are not what they say: another program
/// under that name, and a node copy whose symbol names are garbage. uvspan
/// passes over them or traces them without harm (the copy keeps running),
/// and still traces the real node started after them.
#[test]
fn executables_named_node_that_lie_harm_nothing() {
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    let dir = TempDir::new("untrusted-elf");
    let cg = Cgroup::create(&unique("uvspan-untrusted"));
    let mut uv = uvspan_cmd(["--cgroup", &cg.path, "--loop-threshold", "100ms", "--status-interval", "0"]);
    uv.args(["--otlp-endpoint", &rx.endpoint(), "--otlp-protocol", "grpc", "--symbol-cache", "off"]);
    let mut uv = Running::spawn(uv);
    uv.wait_stderr(RUN_TIMEOUT, "the 'watching' line", |e| e.contains("uvspan: watching for Node.js processes"));

    // Not node at all.
    let sleep_as_node = dir.join("node");
    std::fs::copy("/bin/sleep", &sleep_as_node).expect("copy sleep");
    // node whose string table (every symbol's name) is garbage.
    let liar = dir.join("node-liar");
    let real = String::from_utf8_lossy(&Command::new("sh").args(["-c", "command -v node"]).output().expect("sh").stdout).trim().to_string();
    std::fs::copy(std::fs::canonicalize(&real).expect("node"), &liar).expect("copy node");
    garble_strtab(&liar);
    let start = |prog: &str, args: &[&str]| {
        let mut c = Command::new(prog);
        scrub_env(&mut c);
        c.args(args).stdin(Stdio::null());
        cg.enter_before_exec(&mut c);
        Running::spawn(c)
    };
    let mut fake = start(&sleep_as_node, &["30"]);
    let mut lying = start(&liar, &["-e", "setInterval(() => require('fs').statSync('/'), 50); setTimeout(() => process.exit(0), 30000)"]);
    std::thread::sleep(Duration::from_secs(2));
    assert!(lying.child.try_wait().expect("wait").is_none(), "the node copy with garbage symbols died under uvspan\n{}", lying.stderr());
    assert!(uv.child.try_wait().expect("wait").is_none(), "uvspan died\n{}", uv.stderr());

    // The real one, started afterwards, is traced as usual.
    let mut c = Command::new("node");
    scrub_env(&mut c);
    c.args([&fixture("ns_app.js")]).stdin(Stdio::piped());
    cg.enter_before_exec(&mut c);
    let mut app = Running::spawn(c);
    let mut stdin = app.child.stdin.take().expect("piped stdin");
    app.wait_stdout(RUN_TIMEOUT, "ready", |o| o.contains("\"ready\""));
    let app_pid = app.pid;
    uv.wait_stderr(RUN_TIMEOUT, "uvspan tracing the real node", |e| e.contains(&format!("tracing process {app_pid} (")));
    stdin.write_all(b"go\n").expect("go");
    drop(stdin);
    let out = app.finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let spans = wait_spans(&rx, Duration::from_secs(15), |s| {
        s.iter().filter(|s| s.res_int("process.pid") == Some(i64::from(app_pid)) && s.name == "fs.access").count() >= 9
    });
    fake.kill_group();
    lying.kill_group();
    // SAFETY: kill(2) on the uvspan this test started.
    unsafe { libc::kill(uv.pid as i32, libc::SIGTERM) };
    let uv = uv.finish(RUN_TIMEOUT);
    assert_eq!(uv.code(), Some(0), "{}", uv.context());
    let access = spans.iter().filter(|s| s.res_int("process.pid") == Some(i64::from(app_pid)) && s.name == "fs.access").count();
    assert_eq!(access, 9, "the real node's work\n{}", uv.context());
    assert!(!uv.stderr.contains(&format!("tracing process {} (", fake.pid)), "sleep named node was traced\n{}", uv.stderr);
    drop(cg);
}

/// Overwrites a copy of node's `.strtab` (the names of its symbols) with
/// bytes that name nothing; the code and everything it runs on are intact.
fn garble_strtab(path: &str) {
    use object::{Object, ObjectSection};
    let data = std::fs::read(path).expect("read the copy");
    let (off, size) = {
        let elf = object::File::parse(&*data).expect("an ELF");
        let s = elf.section_by_name(".strtab").expect("node has a .strtab");
        s.file_range().expect("in the file")
    };
    let mut f = std::fs::OpenOptions::new().write(true).open(path).expect("open the copy");
    use std::io::{Seek, SeekFrom};
    f.seek(SeekFrom::Start(off)).expect("seek");
    let junk: Vec<u8> = (0..size).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8 | 1).collect();
    f.write_all(&junk).expect("garble");
}
