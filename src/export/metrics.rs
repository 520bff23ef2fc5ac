//! Metrics leave uvspan here: the SDK's periodic reader hands its collected
//! metrics to [`Push`], which sends them through the one OTLP client
//! (`OTEL_METRICS_EXPORTER=otlp`) or writes them to stderr (`console`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point::Value, NumberDataPoint};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::Temporality;
use prost::Message;

use super::client::settings::Output;
use super::client::{Backoff, Body, Client, Settings};

/// How many times one collection is tried before it is given up (the next
/// collection carries cumulative values anyway).
const TRIES: usize = 3;

/// Where metrics go.
// One per run.
#[allow(clippy::large_enum_variant)]
pub enum Sink {
    Otlp(Client),
    Console,
}

pub struct Push {
    sink: Sink,
    temporality: Temporality,
    said_failure: AtomicBool,
    /// Nothing is exported before this is set.
    armed: Arc<AtomicBool>,
}

impl Push {
    /// Inside the tokio runtime (the client is built there).
    pub fn otlp(s: &Settings, temporality: Temporality) -> Result<Push> {
        Ok(Push { sink: Sink::Otlp(Client::new(s)?), temporality, said_failure: AtomicBool::new(false), armed: Arc::default() })
    }

    pub fn console(temporality: Temporality) -> Push {
        Push { sink: Sink::Console, temporality, said_failure: AtomicBool::new(false), armed: Arc::default() }
    }

    /// The switch that lets exports through.
    pub fn armed(&self) -> Arc<AtomicBool> {
        self.armed.clone()
    }
}

/// `OTEL_METRIC_EXPORT_INTERVAL` (ms, at least 100), default 60 s.
pub fn interval() -> Duration {
    std::env::var("OTEL_METRIC_EXPORT_INTERVAL")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(60), |ms| Duration::from_millis(ms.max(100)))
}

/// `OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`: cumulative (the
/// default), delta or lowmemory, as the specification names them.
pub fn temporality(value: Option<&str>) -> Result<Temporality> {
    Ok(match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("cumulative") => Temporality::Cumulative,
        Some("delta") => Temporality::Delta,
        Some("lowmemory") => Temporality::LowMemory,
        Some(other) => bail!("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE={other:?}: use cumulative, delta or lowmemory"),
    })
}

impl PushMetricExporter for Push {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        if !self.armed.load(Ordering::Relaxed) {
            return Ok(());
        }
        let req = ExportMetricsServiceRequest::from(metrics);
        let client = match &self.sink {
            Sink::Console => {
                eprint!("{}", console_lines(&req));
                return Ok(());
            }
            Sink::Otlp(c) => c,
        };
        let body = bytes::Bytes::from(req.encode_to_vec());
        let mut backoff = Backoff::default();
        let mut tries = 0;
        loop {
            tries += 1;
            let f = match client.send(Body::from(body.clone())).await {
                Ok(answer) => {
                    let rejected = ExportMetricsServiceResponse::decode(answer.as_ref()).ok().and_then(|r| r.partial_success);
                    if let Some(p) = rejected.filter(|p| p.rejected_data_points > 0) {
                        self.say(&format!("the collector rejected {} data points: {}", p.rejected_data_points, p.error_message));
                    }
                    return Ok(());
                }
                Err(f) => f,
            };
            if !f.retryable || tries >= TRIES {
                self.say(&f.message);
                return Err(OTelSdkError::InternalFailure(f.message));
            }
            tokio::time::sleep(backoff.wait(&f)).await;
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }

    fn temporality(&self) -> Temporality {
        self.temporality
    }
}

impl Push {
    fn say(&self, what: &str) {
        if !self.said_failure.swap(true, Ordering::Relaxed) {
            eprintln!("uvspan: exporting metrics: {what} (said once)");
        }
    }
}

/// One line per data point: `metric NAME{attributes} VALUE`.
pub fn console_lines(req: &ExportMetricsServiceRequest) -> String {
    let mut out = String::new();
    let value = |p: &NumberDataPoint| match p.value {
        Some(Value::AsInt(i)) => i.to_string(),
        Some(Value::AsDouble(d)) => d.to_string(),
        None => "-".into(),
    };
    for m in req.resource_metrics.iter().flat_map(|r| &r.scope_metrics).flat_map(|s| &s.metrics) {
        let points: Vec<(String, String)> = match &m.data {
            Some(Data::Sum(s)) => s.data_points.iter().map(|p| (attrs(&p.attributes), value(p))).collect(),
            Some(Data::Gauge(g)) => g.data_points.iter().map(|p| (attrs(&p.attributes), value(p))).collect(),
            Some(Data::Histogram(h)) => {
                h.data_points.iter().map(|p| (attrs(&p.attributes), format!("count={} sum={}", p.count, p.sum.unwrap_or(0.0)))).collect()
            }
            _ => Vec::new(),
        };
        for (a, v) in points {
            out.push_str(&format!("metric {}{a} {v}\n", m.name));
        }
    }
    out
}

fn attrs(kv: &[opentelemetry_proto::tonic::common::v1::KeyValue]) -> String {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    if kv.is_empty() {
        return String::new();
    }
    let items: Vec<String> = kv
        .iter()
        .map(|k| {
            let v = match k.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(V::StringValue(s)) => s.clone(),
                Some(V::IntValue(i)) => i.to_string(),
                Some(V::BoolValue(b)) => b.to_string(),
                Some(V::DoubleValue(d)) => d.to_string(),
                _ => "?".into(),
            };
            format!("{}={v}", k.key)
        })
        .collect();
    format!("{{{}}}", items.join(","))
}

/// The metrics of what uvspan sees ([`crate::metrics`]), collected and
/// sent every `interval` by a task of the runtime, and once more at the end.
pub struct Periodic {
    shared: Arc<std::sync::Mutex<crate::metrics::Metrics>>,
    /// Rung when processes exited: their last values go out within a
    /// quarter of a second, and their resources are not held until the
    /// next interval.
    soon: Arc<tokio::sync::Notify>,
    sink: Arc<Sink>,
    delta: bool,
    start_ns: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
    rt: tokio::runtime::Handle,
}

impl Periodic {
    /// Inside the runtime. `temporality`: Delta and LowMemory send deltas.
    pub fn start(
        out: &Output,
        shared: Arc<std::sync::Mutex<crate::metrics::Metrics>>,
        interval: Duration,
        temporality: Temporality,
    ) -> Result<Option<Periodic>> {
        let sink = Arc::new(match out {
            Output::Off => return Ok(None),
            Output::Console => Sink::Console,
            Output::Otlp(s) => Sink::Otlp(Client::new(s)?),
        });
        let delta = temporality != Temporality::Cumulative;
        let start_ns = Arc::new(std::sync::atomic::AtomicU64::new(wall_ns()));
        let (m, s, st) = (shared.clone(), sink.clone(), start_ns.clone());
        let soon = Arc::new(tokio::sync::Notify::new());
        let rung = soon.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            let said = AtomicBool::new(false);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = rung.notified() => {
                        // At most four early exports a second, whatever the churn.
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                }
                send_once(&m, &s, delta, &st, &said).await;
            }
        });
        Ok(Some(Periodic { shared, soon, sink, delta, start_ns, task, rt: tokio::runtime::Handle::current() }))
    }

    /// Processes exited: export soon (and forget them).
    pub fn exited(&self) {
        self.soon.notify_one();
    }

    /// The last collection, sent within `deadline`.
    pub fn finish(self, deadline: Duration) {
        self.task.abort();
        let said = AtomicBool::new(false);
        let send = send_once(&self.shared, &self.sink, self.delta, &self.start_ns, &said);
        let _ = self.rt.block_on(async { tokio::time::timeout(deadline, send).await });
    }
}

fn wall_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

async fn send_once(
    shared: &std::sync::Mutex<crate::metrics::Metrics>,
    sink: &Sink,
    delta: bool,
    start_ns: &std::sync::atomic::AtomicU64,
    said: &AtomicBool,
) {
    let now = wall_ns();
    let (collected, forgot) = {
        let mut m = shared.lock().unwrap_or_else(|e| e.into_inner());
        let exited = m.has_exited();
        (m.collect(delta), exited)
    };
    send_collected(collected, sink, delta, start_ns, now, said).await;
    if forgot {
        // The exited processes' resources (their command lines), dropped
        // with what was sent, go back to the system, not kept by the
        // allocator.
        // SAFETY: malloc_trim only walks and releases the allocator's free
        // memory; it takes no pointers of ours.
        unsafe { libc::malloc_trim(0) };
    }
}

async fn send_collected(
    collected: Vec<crate::metrics::Collected>,
    sink: &Sink,
    delta: bool,
    start_ns: &std::sync::atomic::AtomicU64,
    now: u64,
    said: &AtomicBool,
) {
    let start = if delta { start_ns.swap(now, Ordering::Relaxed) } else { start_ns.load(Ordering::Relaxed) };
    if collected.is_empty() {
        return;
    }
    let req = crate::metrics::encode::request(collected, &crate::metrics::encode::Window { start_ns: start, now_ns: now, delta });
    match sink {
        Sink::Console => eprint!("{}", console_lines(&req)),
        Sink::Otlp(c) => {
            let body = Body::from(bytes::Bytes::from(req.encode_to_vec()));
            if let Err(f) = c.send(body).await {
                if !said.swap(true, Ordering::Relaxed) {
                    eprintln!("uvspan: exporting metrics: {} (said once)", f.message);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporality_preference_as_the_specification_names_it() {
        assert_eq!(temporality(None).unwrap(), Temporality::Cumulative);
        assert_eq!(temporality(Some("Delta")).unwrap(), Temporality::Delta);
        assert_eq!(temporality(Some("lowmemory")).unwrap(), Temporality::LowMemory);
        assert!(temporality(Some("sometimes")).unwrap_err().to_string().contains("use cumulative, delta or lowmemory"));
    }
}
