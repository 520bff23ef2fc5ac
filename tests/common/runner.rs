//! Running uvspan and node: preconditions, fixtures, uvspan commands with a
//! clean environment, processes under a timeout with their output captured,
//! the fixtures' JSON markers, temp dirs and wait helpers.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long any single uvspan run may take before the test kills it and fails.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// Preconditions
// ---------------------------------------------------------------------------

/// The end-to-end tests load eBPF programs: without root they must fail
/// loudly, never pass by skipping.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "uvspan's end-to-end tests attach eBPF uprobes and need root (effective uid is {euid}); \
         run them as root, e.g. `sudo -E cargo test --test e2e`. They are not skipped on purpose."
    );
    require_node();
}

/// `node` on PATH, as the fixtures need it.
pub fn require_node() {
    assert!(on_path("node"), "the end-to-end tests need `node` (Node.js) on PATH");
}

pub fn uvspan_bin() -> &'static str {
    env!("CARGO_BIN_EXE_uvspan")
}

pub fn fixture(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures").join(name);
    assert!(p.is_file(), "fixture {} is missing", p.display());
    p.to_string_lossy().into_owned()
}

/// Whether an executable `name` is on PATH.
pub fn on_path(name: &str) -> bool {
    std::env::var("PATH").unwrap_or_default().split(':').any(|d| !d.is_empty() && Path::new(d).join(name).is_file())
}

pub fn require_tool(name: &str, why: &str) {
    assert!(on_path(name), "`{name}` is not on PATH; this test needs it: {why}");
}

/// setpriv (util-linux), to run a process as another user or with fewer
/// capabilities.
pub fn setpriv() -> &'static str {
    ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .expect("setpriv (util-linux) is needed for this test: it runs processes as another user or with fewer capabilities")
}

// ---------------------------------------------------------------------------
// Running uvspan
// ---------------------------------------------------------------------------

/// A uvspan command with a clean environment: no OTEL_* or UVSPAN_* variable
/// of the caller leaks in (an OTEL_EXPORTER_OTLP_ENDPOINT in the developer's
/// shell would otherwise redirect every test).
pub fn uvspan_cmd<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut c = Command::new(uvspan_bin());
    scrub_env(&mut c);
    c.args(args);
    c.stdin(Stdio::null());
    c
}

/// Where uvspan and the traced command run: both in the host's namespaces,
/// both in one new PID+mount namespace (a pod sidecar, `docker run`), or
/// uvspan on the host and the command alone in its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    Host,
    BothInOne,
    AppAlone,
}

impl Topology {
    pub const ALL: [Topology; 3] = [Topology::Host, Topology::BothInOne, Topology::AppAlone];

    /// uvspan with `uv` (its options) tracing `command`, placed as the
    /// topology says, with a clean environment (see [`uvspan_cmd`]).
    pub fn command(self, uv: &[&str], command: &[&str]) -> Command {
        let ns = ["--pid", "--fork", "--mount", "--mount-proc"];
        if self != Topology::Host {
            require_tool("unshare", "it makes the PID and mount namespaces (util-linux; scripts/setup.sh installs it)");
        }
        let mut c = match self {
            Topology::Host => Command::new(uvspan_bin()),
            Topology::BothInOne => {
                let mut c = Command::new("unshare");
                c.args(ns).arg(uvspan_bin());
                c
            }
            Topology::AppAlone => Command::new(uvspan_bin()),
        };
        c.args(uv).arg("--");
        if self == Topology::AppAlone {
            c.arg("unshare").args(ns);
        }
        c.args(command);
        scrub_env(&mut c);
        c.stdin(Stdio::null());
        c
    }
}

/// Removes the caller's OTEL_*, UVSPAN_* and RUST_*BACKTRACE variables from `c`.
pub fn scrub_env(c: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("OTEL_") || k.starts_with("UVSPAN_") || k == "RUST_BACKTRACE" || k == "RUST_LIB_BACKTRACE" {
            c.env_remove(&k);
        }
    }
}

/// What a finished process left.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub pid: u32,
}

impl Output {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
    pub fn context(&self) -> String {
        format!("exit status: {}\n--- stdout ---\n{}\n--- stderr ---\n{}", self.status, self.stdout, self.stderr)
    }
}

/// A running process with its stdout/stderr captured in the background. It
/// runs in its own process group so a hang can be cleaned up completely
/// (uvspan and the command it started).
pub struct Running {
    pub child: Child,
    pub pid: u32,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    what: String,
}

fn pump(mut r: impl Read + Send + 'static, buf: Arc<Mutex<String>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(&mut r);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => buf.lock().unwrap_or_else(|e| e.into_inner()).push_str(&String::from_utf8_lossy(&line)),
            }
        }
    })
}

impl Running {
    /// Spawns `cmd` with stdout and stderr captured (stdin as configured on
    /// `cmd`; [`uvspan_cmd`] sets it to null).
    pub fn spawn(mut cmd: Command) -> Running {
        let what = format!("{cmd:?}");
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.process_group(0);
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let stdout: Arc<Mutex<String>> = Arc::default();
        let stderr: Arc<Mutex<String>> = Arc::default();
        let readers = vec![
            pump(child.stdout.take().expect("piped stdout"), stdout.clone()),
            pump(child.stderr.take().expect("piped stderr"), stderr.clone()),
        ];
        let pid = child.id();
        Running { child, pid, stdout, stderr, readers, what }
    }

    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Kills the whole process group (the run and what it started).
    pub fn kill_group(&mut self) {
        // SAFETY: kill(2) on the process group we created for this child.
        unsafe { libc::kill(-(self.pid as i32), libc::SIGKILL) };
        let _ = self.child.kill();
    }

    /// Waits until `pred` holds for the stderr captured so far; on timeout
    /// or if the process exits first, kills it and fails.
    pub fn wait_stderr(&mut self, timeout: Duration, what: &str, pred: impl Fn(&str) -> bool) {
        self.wait_output(timeout, what, |r| pred(&r.stderr()))
    }

    /// The same for stdout.
    pub fn wait_stdout(&mut self, timeout: Duration, what: &str, pred: impl Fn(&str) -> bool) {
        self.wait_output(timeout, what, |r| pred(&r.stdout()))
    }

    fn wait_output(&mut self, timeout: Duration, what: &str, pred: impl Fn(&Running) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            if pred(self) {
                return;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(100));
                panic!("{} exited ({st}) before {what}\n--- stdout ---\n{}\n--- stderr ---\n{}", self.what, self.stdout(), self.stderr());
            }
            if Instant::now() > deadline {
                self.kill_group();
                panic!(
                    "timed out after {timeout:?} waiting for {what} from {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                    self.what,
                    self.stdout(),
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the process to exit by itself; kills it and fails on timeout.
    pub fn finish(mut self, timeout: Duration) -> Output {
        let deadline = Instant::now() + timeout;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if Instant::now() > deadline => {
                    self.kill_group();
                    let _ = self.child.wait();
                    for r in self.readers.drain(..) {
                        let _ = r.join();
                    }
                    panic!(
                        "{} did not finish within {timeout:?}; killed it\n--- stdout ---\n{}\n--- stderr ---\n{}",
                        self.what,
                        self.stdout(),
                        self.stderr()
                    );
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => panic!("waiting for {}: {e}", self.what),
            }
        };
        // The pipes close once every process holding them is gone; a
        // leftover grandchild must not hang the test either.
        let drain_deadline = Instant::now() + Duration::from_secs(10);
        while self.readers.iter().any(|r| !r.is_finished()) {
            if Instant::now() > drain_deadline {
                // SAFETY: kill(2) on the process group we created.
                unsafe { libc::kill(-(self.pid as i32), libc::SIGKILL) };
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        Output { status, stdout: self.stdout(), stderr: self.stderr(), pid: self.pid }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // A test that panicked half-way must not leave processes behind.
        if let Ok(None) = self.child.try_wait() {
            self.kill_group();
            let _ = self.child.wait();
        }
    }
}

/// Runs a command to completion under [`RUN_TIMEOUT`].
pub fn run(cmd: Command) -> Output {
    Running::spawn(cmd).finish(RUN_TIMEOUT)
}

/// Polls `cond` until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// Fixture markers
// ---------------------------------------------------------------------------

/// The JSON lines `{"marker": NAME, ...}` a fixture printed, by name.
pub struct Markers(pub BTreeMap<String, serde_json::Value>);

impl Markers {
    pub fn parse(stdout: &str) -> Markers {
        let mut m = BTreeMap::new();
        for line in stdout.lines().filter(|l| l.starts_with("{\"marker\"")) {
            let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("bad marker line {line:?}: {e}"));
            let name = v["marker"].as_str().expect("marker name").to_string();
            assert!(m.insert(name.clone(), v).is_none(), "marker {name} printed twice");
        }
        Markers(m)
    }
    pub fn get(&self, name: &str) -> &serde_json::Value {
        self.0.get(name).unwrap_or_else(|| panic!("the fixture printed no {name:?} marker; got {:?}", self.0.keys()))
    }
    pub fn f64(&self, name: &str, field: &str) -> f64 {
        self.get(name)[field].as_f64().unwrap_or_else(|| panic!("marker {name}.{field} is not a number"))
    }
    pub fn i64(&self, name: &str, field: &str) -> i64 {
        self.get(name)[field].as_i64().unwrap_or_else(|| panic!("marker {name}.{field} is not an integer"))
    }
    pub fn str(&self, name: &str, field: &str) -> String {
        self.get(name)[field].as_str().unwrap_or_else(|| panic!("marker {name}.{field} is not a string")).to_string()
    }
}

// ---------------------------------------------------------------------------
// Temp dirs
// ---------------------------------------------------------------------------

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
        let p = std::env::temp_dir().join(format!("uvspan-e2e-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("cannot create {}: {e}", p.display()));
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
    pub fn str(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A self-signed certificate for localhost in `certs` (openssl): the paths
/// of its key and certificate, for a test's TLS server.
pub fn self_signed(certs: &TempDir) -> (String, String) {
    require_tool("openssl", "makes the test server's certificate");
    let (key, cert) = (certs.join("key.pem"), certs.join("cert.pem"));
    let st = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-days", "1", "-keyout", &key, "-out", &cert])
        .output()
        .expect("run openssl");
    assert!(st.status.success(), "openssl: {}", String::from_utf8_lossy(&st.stderr));
    (key, cert)
}
