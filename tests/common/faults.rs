//! Collector faults (tests/deploy.rs): a gRPC receiver on a fixed port that
//! can be stopped and started again, and made slow.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};

use super::otlp::{flatten, Received, Span, Store};

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
                    let serve = tonic::transport::Server::builder().add_service(TraceServiceServer::new(svc)).serve_with_incoming(incoming);
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
