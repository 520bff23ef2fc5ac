//! Containers without a container engine: uvspan and node in the PID and
//! mount namespaces a sidecar, a CI job container and a DaemonSet give them,
//! made with `unshare` (util-linux). Real uvspan, real eBPF, real node, real
//! OTLP on the wire. The work is tests/fixtures/ns_app.js (exact counts of
//! accessSync, async readdir, one failed lookup, one slow iteration); every
//! topology must see all of it, with `process.pid` the pid the app sees.
//!
//! - sidecar: `uvspan --all` and node in one new PID + mount namespace;
//! - CI job container: `uvspan -- node …` and `uvspan run --report` inside one;
//! - DaemonSet: uvspan on the host, node in its own PID + mount namespace with
//!   its own root filesystem (a copy of node and its libraries), selected by
//!   `--container` from its cgroup;
//! - an unsupported setup (a /proc of another PID namespace): one line, non-zero exit.
//!
//! Root only; never skipped.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// What tests/fixtures/ns_app.js does.
const ACCESS: usize = 9;
const READDIRS: usize = 3;
const BURST: usize = 100;
const BUSY_MS: f64 = 250.0;

fn unshare() -> Command {
    require_tool("unshare", "it makes the PID and mount namespaces (util-linux; scripts/setup.sh installs it)");
    let mut c = Command::new("unshare");
    c.args(["--pid", "--fork", "--mount-proc"]);
    scrub_env(&mut c);
    c
}

/// The fixture's work among `spans`, checked exactly: `ACCESS` fs.access and
/// `READDIRS` fs.scandir of the fixture's own file and folder, `BURST` fs.stat
/// in flight together (most wait in uvspan's overflow table), one lookup of
/// nonexistent.invalid, one iteration busy for the timer's spin (its stack
/// sampled); all with
/// `process.pid` = `pid` (as the app sees itself) and the loop's spans on
/// the thread the app knows as its main thread.
fn check_work(spans: &[Span], pid: i64, script: &str, ctx: &str) {
    let mine: Vec<&Span> = spans.iter().filter(|s| s.res_int("process.pid") == Some(pid)).collect();
    let named = |n: &str| mine.iter().filter(|s| s.name == n).count();
    let access = mine.iter().filter(|s| s.name == "fs.access" && s.str("file.path") == Some(script)).count();
    assert_eq!(access, ACCESS, "fs.access of {script} by pid {pid}\n{}\n{ctx}", dump(&mine));
    assert_eq!(named("fs.scandir"), READDIRS, "fs.scandir by pid {pid}\n{}\n{ctx}", dump(&mine));
    let folder = script.rsplit_once('/').map_or("", |(d, _)| d);
    let burst = mine
        .iter()
        .filter(|s| s.name == "fs.stat" && s.str("file.path").is_some_and(|p| p.starts_with(&format!("{folder}/burst-"))))
        .count();
    assert_eq!(burst, BURST, "async fs.stat in flight together by pid {pid}\n{ctx}");
    let dns: Vec<&&Span> = mine.iter().filter(|s| s.name == "dns.getaddrinfo").collect();
    assert_eq!(dns.len(), 1, "one lookup\n{}\n{ctx}", dump(&mine));
    assert_eq!(dns[0].str("dns.question.name"), Some("nonexistent.invalid"));
    let busy: Vec<&&Span> =
        mine.iter().filter(|s| s.name == "uv.loop.iteration" && s.double("uvspan.loop.busy_ms").unwrap_or(0.0) >= BUSY_MS).collect();
    assert_eq!(busy.len(), 1, "one iteration busy >= {BUSY_MS} ms\n{}\n{ctx}", dump(&mine));
    assert_eq!(busy[0].int("thread.id"), Some(pid), "the loop thread as the app sees it\n{ctx}");
    // The stack sampler went on for it (it is on only while an iteration
    // is slow) and sampled the loop thread.
    assert!(busy[0].int("uvspan.loop.stack_samples").unwrap_or(0) > 0, "the slow iteration's stack sampled\n{}\n{ctx}", busy[0].brief());
    for s in mine.iter().filter(|s| s.name == "fs.access") {
        assert_eq!(s.int("thread.id"), Some(pid), "a sync call on the loop thread, as the app sees it\n{ctx}");
    }
}

/// A uvspan --all (or -- COMMAND) line "tracing process PID (" for `pid`.
fn traced_line(stderr: &str, pid: u32) -> bool {
    stderr.contains(&format!("tracing process {pid} (")) || stderr.contains(&format!("tracing process {pid}:"))
}

// ---------------------------------------------------------------------------
// Sidecar: uvspan --all and node in one PID + mount namespace
// ---------------------------------------------------------------------------

/// The pod of a sidecar with `shareProcessNamespace`, or `docker run --pid
/// container:app`: uvspan and the app in one PID namespace that is not the
/// host's. A shell in the namespace starts uvspan, waits until it watches,
/// starts node with its stdin on a FIFO, waits until uvspan traces it, and
/// says "go".
#[test]
fn sidecar_all_and_node_in_one_pid_and_mount_namespace() {
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    let dir = TempDir::new("ns-sidecar");
    let script = dir.join("ns_app.js");
    std::fs::copy(fixture("ns_app.js"), &script).expect("copy the fixture");
    let log = dir.join("uvspan.log");
    let fifo = dir.join("go");
    // Every wait is bounded (600 x 0.05 s); a failed one exits 9 saying which.
    let sh = r#"
        set -u
        uv="$1"; ep="$2"; log="$3"; fifo="$4"; script="$5"
        wait_for() { i=0; until grep -q "$1" "$log"; do i=$((i+1)); [ $i -gt 600 ] && { echo "no '$1' in uvspan's log" >&2; cat "$log" >&2; exit 9; }; sleep 0.05; done; }
        "$uv" --all --otlp-endpoint "$ep" --otlp-protocol grpc --loop-threshold 100ms --status-interval 0 2>"$log" &
        uvpid=$!
        wait_for 'watching for Node.js processes'
        mkfifo "$fifo"
        exec 3<>"$fifo"
        node "$script" <&3 &
        nodepid=$!
        wait_for "tracing process $nodepid ("
        echo go >&3
        wait $nodepid
        kill -TERM $uvpid
        wait $uvpid
        echo "uvspan exited $?" >&2
        cat "$log" >&2
    "#;
    let mut c = unshare();
    c.args(["sh", "-c", sh, "sh", uvspan_bin(), &rx.endpoint(), &log, &fifo, &script]);
    c.stdin(Stdio::null());
    let out = Running::spawn(c).finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    assert!(out.stderr.contains("uvspan exited 0"), "{}", out.context());
    let m = Markers::parse(&out.stdout);
    let pid = m.i64("done", "pid");
    assert!(pid > 1 && pid < 100, "node's pid in the new namespace is small: {pid}");
    let spans = rx.spans();
    check_work(&spans, pid, &script, &out.context());
    let s = spans.iter().find(|s| s.res_int("process.pid") == Some(pid)).expect("a span of the app");
    assert_eq!(s.res_int("uvspan.process.host_pid"), None, "uvspan and the app share the namespace: one pid");
}

// ---------------------------------------------------------------------------
// CI job container: -- COMMAND and uvspan run inside a PID namespace
// ---------------------------------------------------------------------------

/// `docker run image uvspan -- node app.js` (GitHub Actions `container:`,
/// GitLab's docker executor): uvspan is the namespace's first process.
#[test]
fn command_in_a_pid_namespace_sees_everything() {
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    let mut c = unshare();
    c.arg(uvspan_bin());
    c.args(["--otlp-endpoint", &rx.endpoint(), "--otlp-protocol", "grpc", "--loop-threshold", "100ms", "--status-interval", "0"]);
    c.args(["--", "node", &fixture("ns_app.js"), "now"]);
    c.stdin(Stdio::null());
    let out = Running::spawn(c).finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let pid = Markers::parse(&out.stdout).i64("done", "pid");
    assert!(pid > 1 && pid < 100, "node's pid in the new namespace is small: {pid}");
    check_work(&rx.spans(), pid, &fixture("ns_app.js"), &out.context());
}

/// `uvspan run --report` in a job container: the report counts the job's
/// work exactly as on the host, and its pids are the job's.
#[test]
fn uvspan_run_in_a_pid_namespace_reports_the_job() {
    require_root();
    let dir = TempDir::new("ns-run");
    let report = dir.join("report.json");
    let mut c = unshare();
    c.arg(uvspan_bin());
    c.args(["run", "--report", &report, "--budget", "fs.by_op.access.count==9", "--", "node", &fixture("ns_app.js"), "now"]);
    c.stdin(Stdio::null());
    let out = Running::spawn(c).finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let pid = Markers::parse(&out.stdout).i64("done", "pid");
    let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).expect("the report")).expect("JSON");
    let p = j["processes"].as_array().unwrap().iter().find(|p| p["pid"].as_i64() == Some(pid)).unwrap_or_else(|| panic!("{j:#}"));
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"));
    assert_eq!(n(&p["fs"]["by_op"]["access"]["count"]), ACCESS as u64, "{p:#}");
    assert_eq!(n(&p["fs"]["by_op"]["scandir"]["count"]), READDIRS as u64, "{p:#}");
    assert_eq!((n(&p["dns"]["count"]), n(&p["dns"]["errors"])), (1, 1), "{p:#}");
    assert!(p["loop"]["blocked"]["max_ms"].as_f64().unwrap_or(0.0) >= BUSY_MS, "{p:#}");
    assert_eq!(j["loop"]["blocked"]["worst"]["thread_id"].as_i64(), Some(pid), "{j:#}");
    // Counted as the table lists it.
    assert_eq!(n(&j["processes_traced"]), 1, "{j:#}");
    assert_eq!(summary_number(&out.stderr, " Node.js"), 1, "{}", out.context());
}

// ---------------------------------------------------------------------------
// DaemonSet: uvspan on the host, the app in its own namespaces and root
// ---------------------------------------------------------------------------

/// A container's root filesystem: a copy of this host's node and the
/// libraries it links (a libc that is not the host's file), the fixture in
/// /app, and what node and glibc look for.
fn rootfs(dir: &TempDir) -> PathBuf {
    let root = dir.path().join("root");
    let node = Command::new("sh").args(["-c", "command -v node"]).output().expect("sh");
    let node = String::from_utf8_lossy(&node.stdout).trim().to_string();
    let node = std::fs::canonicalize(&node).unwrap_or_else(|e| panic!("node on PATH ({node}): {e}"));
    copy_with_libs(&node, &root, "/usr/bin/node");
    for d in ["proc", "tmp", "etc", "app"] {
        std::fs::create_dir_all(root.join(d)).expect("mkdir");
    }
    std::fs::write(root.join("etc/hosts"), "127.0.0.1 localhost\n").expect("hosts");
    std::fs::copy(fixture("ns_app.js"), root.join("app/ns_app.js")).expect("the fixture");
    root
}

/// The first child of `pid` (unshare --fork's child: the container's pid 1).
fn child_of(pid: u32) -> Option<u32> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    t.split_whitespace().next()?.parse().ok()
}

#[test]
fn daemonset_traces_an_app_in_its_own_namespaces_and_root() {
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    let dir = TempDir::new("ns-daemonset");
    let root = rootfs(&dir);
    let top = unique("uvspan-ns-ds");
    let _top = TopCgroup(cgroup_mount().join(&top));
    let id = container_hex("ns-app");
    let cg = Cgroup::create(&format!("{top}/docker/{id}"));

    let mut uv = uvspan_cmd(["--container", &id[..12], "--loop-threshold", "100ms", "--status-interval", "0"]);
    uv.args(["--otlp-endpoint", &rx.endpoint(), "--otlp-protocol", "grpc"]);
    let mut uv = Running::spawn(uv);
    uv.wait_stderr(RUN_TIMEOUT, "the 'watching' line", |e| e.contains("uvspan: watching for Node.js processes"));

    // The app: pid 1 of its own PID namespace, its own mount namespace and
    // root, in its container's cgroup; started and then told "go" on stdin.
    let mut c = unshare();
    c.arg(format!("--root={}", root.display())).args(["/usr/bin/node", "/app/ns_app.js"]);
    cg.enter_before_exec(&mut c);
    c.stdin(Stdio::piped());
    let mut app = Running::spawn(c);
    let mut stdin = app.child.stdin.take().expect("piped stdin");
    app.wait_stdout(RUN_TIMEOUT, "the app's ready marker", |o| o.contains("\"ready\""));
    let host_pid = child_of(app.pid).expect("unshare's child, the app");
    uv.wait_stderr(RUN_TIMEOUT, "uvspan tracing the app", |e| traced_line(e, host_pid));
    stdin.write_all(b"go\n").expect("tell the app to go");
    drop(stdin);
    let out = app.finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let m = Markers::parse(&out.stdout);
    assert_eq!(m.i64("done", "pid"), 1, "the app is its namespace's first process");
    let spans = wait_spans(&rx, Duration::from_secs(15), |s| {
        s.iter().any(|s| s.res_int("process.pid") == Some(1) && s.name == "uv.loop.iteration")
    });
    // SAFETY: kill(2) on the uvspan this test started.
    unsafe { libc::kill(uv.pid as i32, libc::SIGTERM) };
    let uv = uv.finish(RUN_TIMEOUT);
    let ctx = format!("{}\n--- uvspan ---\n{}", out.context(), uv.context());
    assert_eq!(uv.code(), Some(0), "{ctx}");
    // The app's own file names; the host's pid beside its own.
    check_work(&spans, 1, "/app/ns_app.js", &ctx);
    let s = spans.iter().find(|s| s.res_int("process.pid") == Some(1)).expect("a span of the app");
    assert_eq!(s.res_int("uvspan.process.host_pid"), Some(i64::from(host_pid)), "{ctx}");
    assert_eq!(s.res_str("container.id"), Some(id.as_str()), "{ctx}");
    // Its epoll waits were read in its own libc (the copy in its root).
    assert!(!uv.stderr.contains("epoll_wait not found"), "{ctx}");
    // Only the container was traced.
    assert_eq!(uv.stderr.matches("tracing process ").count(), 1, "--container traced more than its container\n{ctx}");
    drop(cg);
}

// ---------------------------------------------------------------------------
// Unsupported: never silent
// ---------------------------------------------------------------------------

/// `unshare --pid --fork` without `--mount-proc`: uvspan's /proc is the
/// host's, its pid namespace is not. No probe filter or record could match:
/// one line saying so, exit 1, and the command never runs.
#[test]
fn a_proc_of_another_pid_namespace_is_refused_before_the_command_runs() {
    require_root();
    let dir = TempDir::new("ns-unsupported");
    let marker = dir.join("ran");
    let mut c = Command::new("unshare");
    scrub_env(&mut c);
    c.args(["--pid", "--fork", uvspan_bin(), "--", "sh", "-c", &format!("touch {marker}")]);
    c.stdin(Stdio::null());
    let out = Running::spawn(c).finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(1), "{}", out.context());
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {}", out.context());
    assert!(lines[0].contains("/proc belongs to another PID namespace") && lines[0].contains("--mount-proc"), "{}", out.context());
    assert!(!Path::new(&marker).exists(), "the command ran");
}

/// A traced process whose loop keeps a CPU busy while no probe sees it (here
/// made with the benchmark's trap-only switch: the programs return at once)
/// is said in one line within seconds; the same process traced normally is
/// not (both run side by side for the same time).
#[test]
fn a_busy_loop_no_probe_sees_is_said() {
    require_root();
    let spin = "process.stdout.write('ready\\n'); \
                function spin() { const t = Date.now(); while (Date.now() - t < 5) {} setImmediate(spin); } spin(); \
                setTimeout(() => process.exit(0), 20000);";
    let start_node = || {
        let mut c = Command::new("node");
        scrub_env(&mut c);
        c.args(["-e", spin]).stdin(Stdio::null());
        let mut n = Running::spawn(c);
        n.wait_stdout(RUN_TIMEOUT, "ready", |o| o.contains("ready"));
        n
    };
    let (mut blind_app, mut seen_app) = (start_node(), start_node());
    let trace = |pid: u32, blind: bool| {
        let mut c = uvspan_cmd(["--pid", &pid.to_string(), "--status-interval", "0", "--loop-threshold", "1s"]);
        if blind {
            c.env("UVSPAN_BENCH_TRAP_ONLY", "1");
        }
        c.stdout(Stdio::null());
        Running::spawn(c)
    };
    let (mut blind, seen) = (trace(blind_app.pid, true), trace(seen_app.pid, false));
    let said = "no probe has seen its event loop";
    blind.wait_stderr(RUN_TIMEOUT, "the silent-loop line", |e| e.contains(said));
    // The normally traced one has had as long: nothing said.
    std::thread::sleep(Duration::from_secs(1));
    blind_app.kill_group();
    seen_app.kill_group();
    let (blind, seen) = (blind.finish(RUN_TIMEOUT), seen.finish(RUN_TIMEOUT));
    let line = blind.stderr.lines().find(|l| l.contains(said)).expect("the line");
    assert!(line.contains(&format!("process {} ", blind_app.pid)), "{line}");
    assert_eq!(blind.stderr.matches(said).count(), 1, "said once\n{}", blind.context());
    assert!(!seen.stderr.contains(said), "a traced loop was called silent\n{}", seen.context());
}

// ---------------------------------------------------------------------------
// A real OCI runtime: podman + runc, uvspan's container beside the app's
// ---------------------------------------------------------------------------

/// An image made from a root filesystem directory (no registry is needed).
struct Image(String);

impl Image {
    fn import(root: &Path, name: &str) -> Image {
        let tar = root.with_extension("tar");
        let ok = Command::new("tar").arg("-C").arg(root).arg("-cf").arg(&tar).arg(".").status().expect("tar");
        assert!(ok.success(), "tar {}", root.display());
        let out = Command::new("podman").arg("import").arg(&tar).arg(name).output().expect("podman import");
        assert!(out.status.success(), "podman import: {}", String::from_utf8_lossy(&out.stderr));
        Image(name.to_string())
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("podman").args(["rmi", "-f", &self.0]).output();
    }
}

/// `podman run` with what this machine's runtime needs: runc (crun refuses
/// this host's hybrid cgroups), the cgroupfs manager (no systemd), and
/// limits at or under the host's hard limits (podman's defaults are over).
fn podman_run(name: &str) -> Command {
    let mut c = Command::new("podman");
    c.args(["--runtime", "runc", "--cgroup-manager", "cgroupfs", "run", "--name", name, "--network", "host"]);
    c.args(["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000"]);
    c
}

fn podman_rm(name: &str) {
    let _ = Command::new("podman").args(["rm", "-f", "-t", "2", name]).output();
}

/// The sidecar with a real container runtime: uvspan in a container of the
/// image's runtime shape (the binary and its libraries, nothing else), the
/// app in another container with its own root joining uvspan's PID
/// namespace (`--pid container:…`, what `shareProcessNamespace` does), with
/// the capability set of deploy/k8s/ and no seccomp filter (this podman's
/// default profile refuses bpf()).
#[test]
fn oci_sidecar_container_traces_the_app_container() {
    require_root();
    require_tool("podman", "the OCI test runs real containers (scripts/setup.sh installs podman and runc)");
    require_tool("runc", "the OCI runtime (scripts/setup.sh installs it)");
    let rx = Receiver::start(Protocol::Grpc);
    let dir = TempDir::new("ns-oci");
    let tag = unique("oci").to_ascii_lowercase();
    let app_image = Image::import(&rootfs(&dir), &format!("localhost/uvspan-test-app:{tag}"));
    let uv_root = dir.path().join("uvspan-root");
    copy_with_libs(Path::new(uvspan_bin()), &uv_root, "/usr/local/bin/uvspan");
    for d in ["tmp", "proc", "sys"] {
        std::fs::create_dir_all(uv_root.join(d)).expect("mkdir");
    }
    let uv_image = Image::import(&uv_root, &format!("localhost/uvspan-test-uvspan:{tag}"));
    let (app_name, uv_name) = (format!("app-{tag}"), format!("uvspan-{tag}"));
    podman_rm(&app_name);
    podman_rm(&uv_name);

    // uvspan's container first: it owns the shared PID namespace, as a pod's
    // pause container does (the namespace dies with its first process).
    let mut uv = podman_run(&uv_name);
    uv.args(["--security-opt", "seccomp=unconfined"]);
    for cap in ["BPF", "PERFMON", "SYS_PTRACE", "DAC_READ_SEARCH"] {
        uv.args(["--cap-add", cap]);
    }
    uv.args([&uv_image.0, "/usr/local/bin/uvspan", "--all", "--loop-threshold", "100ms", "--status-interval", "0"]);
    uv.args(["--otlp-endpoint", &rx.endpoint(), "--otlp-protocol", "grpc"]).stdin(Stdio::null());
    let mut uv = Running::spawn(uv);
    uv.wait_stderr(RUN_TIMEOUT, "the 'watching' line", |e| e.contains("uvspan: watching for Node.js processes"));

    let mut app = podman_run(&app_name);
    app.args(["--pid", &format!("container:{uv_name}"), "-i", &app_image.0, "/usr/bin/node", "/app/ns_app.js"]).stdin(Stdio::piped());
    let mut app = Running::spawn(app);
    let mut stdin = app.child.stdin.take().expect("piped stdin");
    app.wait_stdout(RUN_TIMEOUT, "the app's ready marker", |o| o.contains("\"ready\""));
    let pid = Markers::parse(&app.stdout()).i64("ready", "pid");
    uv.wait_stderr(RUN_TIMEOUT, "uvspan tracing the app container's node", |e| traced_line(e, pid as u32));
    stdin.write_all(b"go\n").expect("go");
    drop(stdin);
    let out = app.finish(RUN_TIMEOUT);
    let stopped = Command::new("podman").args(["stop", "-t", "10", &uv_name]).output().expect("podman stop");
    let uv = uv.finish(RUN_TIMEOUT);
    podman_rm(&app_name);
    podman_rm(&uv_name);
    let ctx = format!("{}\n--- uvspan ---\n{}\n{}", out.context(), uv.context(), String::from_utf8_lossy(&stopped.stderr));
    assert_eq!(out.code(), Some(0), "{ctx}");
    assert!(pid > 1 && pid < 100, "the app's pid in the pod's namespace: {pid}\n{ctx}");
    assert_eq!(uv.code(), Some(0), "uvspan stopped cleanly\n{ctx}");
    assert!(uv.stderr.contains(" 0 failed to export, 0 not flushed"), "uvspan flushed at stop\n{ctx}");
    check_work(&rx.spans(), pid, "/app/ns_app.js", &ctx);
}

/// A command's process that is not node (a shell burning CPU, as a build
/// step does) has no loop to see: nothing is said of it.
#[test]
fn a_busy_process_without_libuv_is_not_called_silent() {
    require_root();
    // The shell itself busy (no child does the work) for ~8-10 s here:
    // longer than the 5 s after which a silent loop is said.
    let busy = "i=0; while [ $i -lt 6000000 ]; do i=$((i+1)); done";
    let mut c = uvspan_cmd(["--status-interval", "0", "--", "sh", "-c", busy]);
    c.stdout(Stdio::null());
    let out = Running::spawn(c).finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    assert!(!out.stderr.contains("no probe has seen its event loop"), "{}", out.context());
}
