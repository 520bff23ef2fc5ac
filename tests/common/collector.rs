//! A collector of the test's own that speaks OTLP as a real one does: gRPC
//! and HTTP/protobuf on one port (HTTP/1.1 and HTTP/2), plain or TLS
//! (rustls; certificates made by the test with rcgen, optionally demanding
//! a client certificate), gzip understood. Every request is kept with its
//! path and headers as they came over the wire.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::otlp::{flatten, Span};

/// One request as it came: path, headers (names lower-cased), the body
/// after gzip was undone, and whether it was compressed on the wire.
#[derive(Clone, Debug)]
pub struct Got {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    pub gzip: bool,
}

impl Got {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
    pub fn is_traces(&self) -> bool {
        self.path.contains("trace")
    }
    pub fn is_metrics(&self) -> bool {
        self.path.contains("metrics")
    }
}

/// A certificate authority made by the test, and what it signs.
pub struct Ca {
    key: KeyPair,
    params: CertificateParams,
    pub pem: String,
}

/// A certificate and its key, as PEM files in `dir`.
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).expect("self-signed CA").pem();
        Ca { key, params, pem }
    }

    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, &self.pem).expect("write the CA");
        p
    }

    /// A leaf certificate for `names` (DNS names or IP addresses); `expired`
    /// makes it one that ended in 2021.
    pub fn issue(&self, dir: &Path, stem: &str, names: &[&str], expired: bool) -> Issued {
        let key = KeyPair::generate().expect("leaf key");
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, stem);
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("sign the leaf");
        let (c, k) = (dir.join(format!("{stem}.pem")), dir.join(format!("{stem}.key")));
        std::fs::write(&c, cert.pem()).expect("write the certificate");
        std::fs::write(&k, key.serialize_pem()).expect("write the key");
        Issued { cert: c, key: k }
    }
}

/// How the collector listens.
pub enum Listen<'a> {
    Plain,
    /// TLS with this certificate; with `clients`, a client certificate signed
    /// by that CA is required.
    Tls {
        server: &'a Issued,
        clients: Option<&'a Ca>,
    },
}

pub struct Collector {
    pub addr: SocketAddr,
    got: Arc<Mutex<Vec<Got>>>,
    /// How long each traces request waits before it is answered.
    delay: Arc<Mutex<std::time::Duration>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Collector {
    pub fn start(listen: Listen<'_>) -> Collector {
        let acceptor = match listen {
            Listen::Plain => None,
            Listen::Tls { server, clients } => Some(tokio_rustls::TlsAcceptor::from(Arc::new(server_config(server, clients)))),
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the collector");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("address");
        let got: Arc<Mutex<Vec<Got>>> = Arc::default();
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let store = got.clone();
        let delay: Arc<Mutex<std::time::Duration>> = Arc::default();
        let wait = delay.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                loop {
                    let (tcp, _) = tokio::select! {
                        a = l.accept() => match a { Ok(a) => a, Err(_) => continue },
                        _ = &mut rx => return,
                    };
                    let (store, acceptor, wait) = (store.clone(), acceptor.clone(), wait.clone());
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req| handle(req, store.clone(), wait.clone()));
                        let builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
                        match acceptor {
                            // A refused handshake (no client certificate, say) ends here.
                            Some(a) => {
                                if let Ok(tls) = a.accept(tcp).await {
                                    let _ = builder.serve_connection(hyper_util::rt::TokioIo::new(tls), svc).await;
                                }
                            }
                            None => {
                                let _ = builder.serve_connection(hyper_util::rt::TokioIo::new(tcp), svc).await;
                            }
                        }
                    });
                }
            });
        });
        Collector { addr, got, delay, stop: Some(tx), thread: Some(thread) }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Makes every traces request wait `d` before it is answered (a slow
    /// collector; metrics are answered at once).
    pub fn set_delay(&self, d: std::time::Duration) {
        *self.delay.lock().unwrap_or_else(|e| e.into_inner()) = d;
    }

    pub fn requests(&self) -> Vec<Got> {
        self.got.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every span of every traces request.
    pub fn spans(&self) -> Vec<Span> {
        self.requests()
            .iter()
            .filter(|g| g.is_traces())
            .flat_map(|g| flatten(&ExportTraceServiceRequest::decode(g.body.as_ref()).expect("a traces request").resource_spans))
            .collect()
    }

    /// The names of the metrics received.
    pub fn metric_names(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter(|g| g.is_metrics())
            .flat_map(|g| ExportMetricsServiceRequest::decode(g.body.as_ref()).expect("a metrics request").resource_metrics)
            .flat_map(|r| r.scope_metrics)
            .flat_map(|s| s.metrics)
            .map(|m| m.name)
            .collect()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn server_config(server: &Issued, clients: Option<&Ca>) -> rustls::ServerConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(&server.cert).expect("read the certificate").collect::<Result<_, _>>().expect("PEM");
    let key = PrivateKeyDer::from_pem_file(&server.key).expect("read the key");
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions().expect("versions");
    let builder = match clients {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).expect("client CA")).expect("add the client CA");
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build().expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).expect("server certificate");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

type Reply = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

async fn handle(
    req: hyper::Request<Incoming>,
    store: Arc<Mutex<Vec<Got>>>,
    delay: Arc<Mutex<std::time::Duration>>,
) -> Result<hyper::Response<Reply>, hyper::Error> {
    let path = req.uri().path().to_string();
    let headers: Vec<(String, String)> =
        req.headers().iter().map(|(k, v)| (k.as_str().to_ascii_lowercase(), v.to_str().unwrap_or("").to_string())).collect();
    let grpc = headers.iter().any(|(k, v)| k == "content-type" && v.starts_with("application/grpc"));
    let raw = req.into_body().collect().await?.to_bytes();
    let (body, gzip) = if grpc {
        // One length-prefixed message: flag (1 = compressed), length, bytes.
        let mut b = raw.clone();
        let compressed = b.len() >= 5 && b[0] == 1;
        b.advance(5.min(b.len()));
        if compressed {
            (gunzip(&b), true)
        } else {
            (b, false)
        }
    } else if headers.iter().any(|(k, v)| k == "content-encoding" && v == "gzip") {
        (gunzip(&raw), true)
    } else {
        (raw, false)
    };
    let wait = *delay.lock().unwrap_or_else(|e| e.into_inner());
    if path.contains("trace") && !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
    store.lock().unwrap_or_else(|e| e.into_inner()).push(Got { path, headers, body, gzip });
    // An empty export response: no partial success.
    Ok(if grpc {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let body = Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])).with_trailers(async move { Some(Ok(trailers)) });
        hyper::Response::builder().header("content-type", "application/grpc").body(body.boxed()).expect("response")
    } else {
        hyper::Response::builder().header("content-type", "application/x-protobuf").body(Full::new(Bytes::new()).boxed()).expect("response")
    })
}

fn gunzip(b: &[u8]) -> Bytes {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b).read_to_end(&mut out).expect("a gzip body");
    Bytes::from(out)
}

/// The last value of each point of the sums and gauges named `names` in
/// the metrics requests received, keyed "name/state" by the point's first
/// attribute (a string), or "name" without one.
pub fn metric_values(col: &Collector, names: &[&str]) -> std::collections::BTreeMap<String, f64> {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point::Value};
    let mut out = std::collections::BTreeMap::new();
    for g in col.requests().iter().filter(|g| g.is_metrics()) {
        let req = <ExportMetricsServiceRequest as prost::Message>::decode(g.body.as_ref()).expect("metrics");
        for m in req.resource_metrics.into_iter().flat_map(|r| r.scope_metrics).flat_map(|s| s.metrics) {
            let points = match m.data {
                Some(Data::Sum(s)) if names.contains(&m.name.as_str()) => s.data_points,
                Some(Data::Gauge(g)) if names.contains(&m.name.as_str()) => g.data_points,
                _ => continue,
            };
            for p in points {
                let key = match p.attributes.first().and_then(|a| a.value.as_ref()).and_then(|v| v.value.clone()) {
                    Some(Any::StringValue(s)) => format!("{}/{s}", m.name),
                    _ => m.name.clone(),
                };
                if let Some(Value::AsDouble(v)) = p.value {
                    out.insert(key, v);
                }
            }
        }
    }
    out
}

/// Attributes as text (key -> the value's Debug form).
pub type Attrs = std::collections::BTreeMap<String, String>;

/// Every data point of `name` in the metrics requests received (delta
/// temporality: their counts add up), with its attributes and resource.
pub fn histogram_points(col: &Collector, name: &str) -> Vec<(Attrs, u64, Attrs)> {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let text = |kv: &[opentelemetry_proto::tonic::common::v1::KeyValue]| -> Attrs {
        kv.iter().map(|a| (a.key.clone(), format!("{:?}", a.value.as_ref().and_then(|v| v.value.clone())))).collect()
    };
    let mut out = Vec::new();
    for g in col.requests().iter().filter(|g| g.is_metrics()) {
        let req = <ExportMetricsServiceRequest as prost::Message>::decode(g.body.as_ref()).expect("metrics");
        for rm in req.resource_metrics {
            let res = text(&rm.resource.map(|r| r.attributes).unwrap_or_default());
            for m in rm.scope_metrics.into_iter().flat_map(|s| s.metrics).filter(|m| m.name == name) {
                let Some(Data::Histogram(h)) = m.data else { panic!("{name} is a histogram") };
                assert_eq!(h.aggregation_temporality, 1, "delta, as asked");
                for p in h.data_points {
                    assert_eq!(p.bucket_counts.iter().sum::<u64>(), p.count, "{name}: buckets add up");
                    out.push((text(&p.attributes), p.count, res.clone()));
                }
            }
        }
    }
    out
}

/// How many values `name`'s histogram points counted, over the points whose
/// attributes hold each `(key, text)` of `want` (attribute values as
/// [`histogram_points`] writes them: `x.contains(text)`).
pub fn histogram_count(col: &Collector, name: &str, want: &[(&str, &str)]) -> u64 {
    histogram_points(col, name)
        .iter()
        .filter(|(a, _, _)| want.iter().all(|(k, v)| a.get(*k).is_some_and(|x| x.contains(v))))
        .map(|(_, n, _)| n)
        .sum()
}

/// The bucket counts of `name`'s histogram points, added up (delta
/// temporality), and its bounds.
pub fn histogram_buckets(col: &Collector, name: &str) -> (Vec<u64>, Vec<f64>) {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let (mut sum, mut bounds) = (Vec::<u64>::new(), Vec::new());
    for g in col.requests().iter().filter(|g| g.is_metrics()) {
        let req = <ExportMetricsServiceRequest as prost::Message>::decode(g.body.as_ref()).expect("metrics");
        for m in req.resource_metrics.into_iter().flat_map(|r| r.scope_metrics).flat_map(|s| s.metrics).filter(|m| m.name == name) {
            let Some(Data::Histogram(h)) = m.data else { panic!("{name} is a histogram") };
            assert_eq!(h.aggregation_temporality, 1, "delta, as asked");
            for p in h.data_points {
                sum.resize(p.bucket_counts.len(), 0);
                sum.iter_mut().zip(&p.bucket_counts).for_each(|(a, b)| *a += b);
                bounds = p.explicit_bounds;
            }
        }
    }
    (sum, bounds)
}
