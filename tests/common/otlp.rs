//! An OTLP trace receiver inside the test (gRPC and HTTP/protobuf) on an
//! ephemeral 127.0.0.1 port, and the spans it received, flattened into plain
//! types ([`Span`], [`Attr`], [`Event`]) for assertions.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{LogsService, LogsServiceServer};
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{MetricsService, MetricsServiceServer};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as PbValue;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::ResourceSpans;
use prost::Message;

// ---------------------------------------------------------------------------
// Receiver
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

/// What a receiver got so far (shared with its server thread).
pub(super) type Store = Arc<Mutex<Vec<Received>>>;

/// An OTLP trace receiver on 127.0.0.1:<ephemeral port>, stopped on drop.
/// It takes metrics and logs too (counted in `signals`).
pub struct Receiver {
    pub protocol: Protocol,
    pub port: u16,
    pub signals: Arc<SignalCounts>,
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

    /// A gRPC receiver that is also a collector tee: each trace export it
    /// takes (kept, as its backend would) is sent on, as a copy, to the
    /// OTLP/gRPC endpoint `copy_to` (uvspan's --otlp-listen address) without
    /// waiting for it, as a collector's second exporter does. Whatever
    /// exports to it (the app, uvspan) is in the copy.
    pub fn tee(copy_to: &str) -> Receiver {
        Self::grpc_with(Some(copy_to.to_string()))
    }

    fn grpc() -> Receiver {
        Self::grpc_with(None)
    }

    fn grpc_with(tee: Option<String>) -> Receiver {
        let store: Store = Arc::default();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the gRPC receiver");
        listener.set_nonblocking(true).expect("non-blocking listener");
        let port = listener.local_addr().expect("receiver address").port();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let svc = Collector { store: store.clone(), tee };
        let signals = Arc::new(SignalCounts::default());
        let (ms, ls) = (signals.clone(), signals.clone());
        let thread = std::thread::Builder::new()
            .name(format!("otlp-grpc-{port}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("receiver runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                    let incoming = tonic::transport::server::TcpIncoming::from(listener);
                    tonic::transport::Server::builder()
                        .add_service(TraceServiceServer::new(svc))
                        .add_service(MetricsServiceServer::new(MetricsCollector(ms)))
                        .add_service(LogsServiceServer::new(LogsCollector(ls)))
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
            signals,
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
        let signals = Arc::new(SignalCounts::default());
        let sig = signals.clone();
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
                    if path == "/v1/metrics" || path == "/v1/logs" {
                        let ok = read.is_ok() && sig.count(&path, &body);
                        let _ = req.respond(tiny_http::Response::from_data(Vec::new()).with_status_code(if ok { 200 } else { 400 }));
                        continue;
                    }
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
                            tiny_http::Response::from_data(body)
                                .with_header("Content-Type: application/x-protobuf".parse::<tiny_http::Header>().expect("header"))
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
            signals,
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
    /// Where a copy of each trace export goes (a collector tee).
    tee: Option<String>,
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
                tonic::metadata::KeyAndValueRef::Ascii(k, v) => Some((k.as_str().to_ascii_lowercase(), v.to_str().ok()?.to_string())),
                tonic::metadata::KeyAndValueRef::Binary(..) => None,
            })
            .collect();
        let msg = request.into_inner();
        if let Some(to) = &self.tee {
            let (to, copy) = (to.clone(), msg.clone());
            tokio::spawn(async move {
                use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
                // Not there (yet, or any more): the copy is lost, as a collector's would be.
                if let Ok(mut c) = TraceServiceClient::connect(to).await {
                    let _ = c.export(copy).await;
                }
            });
        }
        self.store.lock().unwrap_or_else(|e| e.into_inner()).push(Received {
            path: "/opentelemetry.proto.collector.trace.v1.TraceService/Export".into(),
            headers,
            resource_spans: msg.resource_spans,
        });
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

/// Metric data points and log records a receiver got.
#[derive(Debug, Default)]
pub struct SignalCounts {
    pub metric_points: std::sync::atomic::AtomicU64,
    pub log_records: std::sync::atomic::AtomicU64,
}

impl SignalCounts {
    /// Counts an HTTP request's body by its path; false when it does not decode.
    fn count(&self, path: &str, body: &[u8]) -> bool {
        match path {
            "/v1/metrics" => ExportMetricsServiceRequest::decode(body).map(|r| self.metrics(&r)).is_ok(),
            _ => ExportLogsServiceRequest::decode(body).map(|r| self.logs(&r)).is_ok(),
        }
    }

    fn metrics(&self, r: &ExportMetricsServiceRequest) {
        use opentelemetry_proto::tonic::metrics::v1::metric::Data;
        let n: usize = r
            .resource_metrics
            .iter()
            .flat_map(|rm| &rm.scope_metrics)
            .flat_map(|sm| &sm.metrics)
            .map(|m| match &m.data {
                Some(Data::Gauge(g)) => g.data_points.len(),
                Some(Data::Sum(s)) => s.data_points.len(),
                Some(Data::Histogram(h)) => h.data_points.len(),
                Some(Data::ExponentialHistogram(h)) => h.data_points.len(),
                Some(Data::Summary(s)) => s.data_points.len(),
                None => 0,
            })
            .sum();
        self.metric_points.fetch_add(n as u64, std::sync::atomic::Ordering::SeqCst);
    }

    fn logs(&self, r: &ExportLogsServiceRequest) {
        let n: usize = r.resource_logs.iter().flat_map(|rl| &rl.scope_logs).map(|sl| sl.log_records.len()).sum();
        self.log_records.fetch_add(n as u64, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn points(&self) -> u64 {
        self.metric_points.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn records(&self) -> u64 {
        self.log_records.load(std::sync::atomic::Ordering::SeqCst)
    }
}

struct MetricsCollector(Arc<SignalCounts>);

#[tonic::async_trait]
impl MetricsService for MetricsCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0.metrics(request.get_ref());
        Ok(tonic::Response::new(ExportMetricsServiceResponse { partial_success: None }))
    }
}

struct LogsCollector(Arc<SignalCounts>);

#[tonic::async_trait]
impl LogsService for LogsCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        self.0.logs(request.get_ref());
        Ok(tonic::Response::new(ExportLogsServiceResponse { partial_success: None }))
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
                        .map(|e| Event { name: e.name.clone(), time_unix_nano: e.time_unix_nano, attributes: attrs(&e.attributes) })
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

/// Polls `get` every 100 ms until `pred` holds or the timeout passes;
/// returns the last spans seen.
pub fn wait_for(get: impl Fn() -> Vec<Span>, timeout: Duration, pred: impl Fn(&[Span]) -> bool) -> Vec<Span> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = get();
        if pred(&last) || Instant::now() > deadline {
            return last;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn wait_spans(rx: &Receiver, timeout: Duration, pred: impl Fn(&[Span]) -> bool) -> Vec<Span> {
    wait_for(|| rx.spans(), timeout, pred)
}
