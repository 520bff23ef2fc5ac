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
        let deadline = Instant::now() + timeout;
        loop {
            if pred(&self.stderr()) {
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
    let lines: Vec<&str> = proc_cgroup.lines().filter(|l| !l.is_empty()).collect();
    lines
        .iter()
        .find_map(|l| l.strip_prefix("0::"))
        .or_else(|| lines.first().and_then(|l| l.splitn(3, ':').nth(2)))
        .unwrap_or_else(|| panic!("cannot read a cgroup path from {proc_cgroup:?}"))
        .to_string()
}
