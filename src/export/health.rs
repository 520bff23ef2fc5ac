//! uvspan's own health: the counters behind the status line, also exported
//! as OTLP metrics (`uvspan.*`) to the same endpoint as the spans, under the
//! resource `service.name=uvspan`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::Resource;

use super::client::settings::Output;
use super::metrics::{temporality, Push};
use super::Counters;

/// Counters published by the tracer thread (the kernel's and the run's).
#[derive(Debug, Default)]
pub struct Health {
    pub processes_traced: AtomicU64,
    pub records_lost: AtomicU64,
    pub unfinished_at_exit: AtomicU64,
    pub loop_iterations: AtomicU64,
    /// HTTP requests seen (request context).
    pub requests: AtomicU64,
    /// Requests whose traceparent was malformed (ignored).
    pub requests_bad_traceparent: AtomicU64,
    /// Requests the trace sampler dropped (not exported).
    pub requests_unsampled: AtomicU64,
    /// Operations and loop iterations outside requests it dropped.
    pub operations_unsampled: AtomicU64,
    /// --min-duration: operations outside requests too short to export.
    pub operations_short: AtomicU64,
    /// --sample-time: operations dropped because they crossed a window edge
    /// (or their request did).
    pub straddled: AtomicU64,
    /// --sample-time: requests dropped because their end fell past a
    /// window's close.
    pub requests_straddled: AtomicU64,
    /// --sample-time share in millionths (1_000_000 = probes always live).
    pub sample_time_ppm: AtomicU64,
    /// --sample-time: share of the traced processes' I/O bytes moved while
    /// the probes were live, in millionths.
    pub sample_work_ppm: AtomicU64,
    /// --otlp-listen: the app's OTLP forwarded, and the joins.
    pub listen: Arc<crate::listen::ListenCounters>,
    /// The probes' cost per process with an estimate.
    pub cost: std::sync::Mutex<Vec<CostPoint>>,
}

/// One process's estimated cost (`uvspan.overhead*`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CostPoint {
    pub pid: u32,
    /// CPU per byte live ÷ off, and its ≈95% interval.
    pub ratio: f64,
    pub low: f64,
    pub high: f64,
    /// CPU added at the share in force, as a share of the app's own.
    pub added: f64,
}

/// Keeps the metrics pipeline alive; flushes on drop.
pub struct HealthMetrics {
    provider: SdkMeterProvider,
    armed: Arc<std::sync::atomic::AtomicBool>,
}

impl HealthMetrics {
    /// Starts exporting every `interval` (OTEL_METRIC_EXPORT_INTERVAL, ms,
    /// default 60 s). Must be called inside the tokio runtime.
    pub fn start(out: &Output, health: Arc<Health>, export: Arc<Counters>) -> Result<Option<HealthMetrics>> {
        let temporality = temporality(std::env::var("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE").ok().as_deref())?;
        let exporter = match out {
            Output::Off => return Ok(None),
            Output::Console => Push::console(temporality),
            Output::Otlp(s) => Push::otlp(s, temporality).context("cannot set up the OTLP metrics exporter")?,
        };
        let armed = exporter.armed();
        let interval = super::metrics::interval();
        let reader = PeriodicReader::builder(exporter, opentelemetry_sdk::runtime::Tokio).with_interval(interval).build();
        let resource = Resource::builder_empty()
            .with_attributes([
                KeyValue::new("service.name", "uvspan"),
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                KeyValue::new("host.name", crate::enrich::resource::host_name()),
                KeyValue::new("process.pid", i64::from(std::process::id())),
            ])
            .build();
        let provider = SdkMeterProvider::builder().with_reader(reader).with_resource(resource).build();
        let meter = provider.meter("uvspan");

        type Read = Box<dyn Fn() -> u64 + Send + Sync>;
        let (e, h) = (export, health);
        let read_e = |f: fn(&Counters) -> &AtomicU64| -> Read {
            let e = e.clone();
            Box::new(move || f(&e).load(Ordering::Relaxed))
        };
        let read_h = |f: fn(&Health) -> &AtomicU64| -> Read {
            let h = h.clone();
            Box::new(move || f(&h).load(Ordering::Relaxed))
        };
        let counters: [(&'static str, &'static str, Read); 13] = [
            ("uvspan.spans.exported", "Spans exported", read_e(|c| &c.exported)),
            ("uvspan.spans.failed", "Spans lost in failed exports", read_e(|c| &c.failed)),
            ("uvspan.export.errors", "Failed export requests", read_e(|c| &c.export_errors)),
            ("uvspan.records.lost", "Kernel records lost: ring buffer or in-flight table full", read_h(|h| &h.records_lost)),
            ("uvspan.operations.unfinished", "Requests in flight when their process exited", read_h(|h| &h.unfinished_at_exit)),
            ("uvspan.loop.iterations", "Event-loop iterations seen", read_h(|h| &h.loop_iterations)),
            ("uvspan.requests", "HTTP requests seen", read_h(|h| &h.requests)),
            (
                "uvspan.requests.bad_traceparent",
                "Requests whose traceparent was malformed (ignored)",
                read_h(|h| &h.requests_bad_traceparent),
            ),
            ("uvspan.requests.unsampled", "Requests the trace sampler dropped (not exported)", read_h(|h| &h.requests_unsampled)),
            (
                "uvspan.operations.unsampled",
                "Operations and loop iterations the trace sampler dropped: outside requests, and those of unsampled requests and tasks the kernel counted without a record",
                read_h(|h| &h.operations_unsampled),
            ),
            (
                "uvspan.operations.short",
                "fs and DNS operations outside requests shorter than --min-duration (not exported)",
                read_h(|h| &h.operations_short),
            ),
            (
                "uvspan.operations.straddled",
                "Operations dropped: they (or the request holding them) crossed a --sample-time window edge",
                read_h(|h| &h.straddled),
            ),
            (
                "uvspan.requests.straddled",
                "Requests dropped with their operations: their end fell past a --sample-time window's close",
                read_h(|h| &h.requests_straddled),
            ),
        ];
        for (name, desc, read) in counters {
            // The callback stays registered with the provider; the handle is not needed.
            let _ = meter.u64_observable_counter(name).with_description(desc).with_callback(move |o| o.observe(read(), &[])).build();
        }
        register_dropped(&meter, e.clone());
        register_listen(&meter, h.listen.clone());
        let traced = read_h(|h| &h.processes_traced);
        let _ = meter
            .u64_observable_gauge("uvspan.processes.traced")
            .with_description("Processes being traced")
            .with_callback(move |o| o.observe(traced(), &[]))
            .build();
        let share = read_h(|h| &h.sample_time_ppm);
        let _ = meter
            .f64_observable_gauge("uvspan.sample_time")
            .with_description("Share of the time the fs/DNS/request probes are live (--sample-time; 1 = always)")
            .with_callback(move |o| o.observe(share() as f64 / 1e6, &[]))
            .build();
        let work = read_h(|h| &h.sample_work_ppm);
        let _ = meter
            .f64_observable_gauge("uvspan.sample_time.work")
            .with_description(
                "Share of the bytes the traced processes read and wrote while the probes were live \
                 (--sample-time; 1 = always): the share to scale sampled counts by",
            )
            .with_callback(move |o| o.observe(work() as f64 / 1e6, &[]))
            .build();
        register_cost(&meter, h.clone());
        Ok(Some(HealthMetrics { provider, armed }))
    }

    /// uvspan is set up: export from now on (a start that fails exports
    /// nothing when the provider is dropped).
    pub fn arm(&self) {
        self.armed.store(true, Ordering::Relaxed);
    }

    /// Exports the final values.
    pub fn finish(self) {
        let _ = self.provider.force_flush();
        let _ = self.provider.shutdown();
    }
}

/// `uvspan.spans.dropped`: a point per process that lost spans
/// (`process.pid`, `process.command_line`; the first
/// [`NAMED`](super::dropped::NAMED) of them), and one without attributes for
/// the rest; they add up to every span dropped.
fn register_dropped(meter: &opentelemetry::metrics::Meter, e: Arc<Counters>) {
    let _ = meter
        .u64_observable_counter("uvspan.spans.dropped")
        .with_description("Spans dropped: export queue full (per process that lost spans, the rest without process attributes)")
        .with_callback(move |o| {
            let d = e.by_process.lock().unwrap_or_else(|e| e.into_inner());
            for x in d.named() {
                o.observe(
                    x.spans,
                    &[KeyValue::new("process.pid", i64::from(x.pid)), KeyValue::new("process.command_line", x.command.clone())],
                );
            }
            o.observe(d.others, &[]);
        })
        .build();
}

/// `uvspan.overhead*`: a point per process with an estimate (`process.pid`).
fn register_cost(meter: &opentelemetry::metrics::Meter, h: Arc<Health>) {
    type Field = fn(&CostPoint) -> f64;
    let gauges: [(&'static str, &'static str, Field); 4] = [
        (
            "uvspan.overhead.ratio",
            "The traced process's CPU per byte of I/O while the probes are live over that in the time off after (the median of the last window pairs; 1 = free)",
            |p| p.ratio,
        ),
        ("uvspan.overhead.ratio.low", "Low end of uvspan.overhead.ratio's ≈95% interval", |p| p.low),
        ("uvspan.overhead.ratio.high", "High end of uvspan.overhead.ratio's ≈95% interval", |p| p.high),
        (
            "uvspan.overhead",
            "CPU the probes add to the traced process at the live share in force, as a share of its own (0.05 = +5%)",
            |p| p.added,
        ),
    ];
    for (name, desc, field) in gauges {
        let h = h.clone();
        let _ = meter
            .f64_observable_gauge(name)
            .with_description(desc)
            .with_callback(move |o| {
                for p in h.cost.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                    o.observe(field(p), &[KeyValue::new("process.pid", i64::from(p.pid))]);
                }
            })
            .build();
    }
}

/// `uvspan.otlp.*` (per `signal`) and the join counters, observed only while
/// the listener runs.
fn register_listen(meter: &opentelemetry::metrics::Meter, l: Arc<crate::listen::ListenCounters>) {
    use crate::listen::{ListenCounters, Signal};
    type Field = fn(&ListenCounters) -> &[AtomicU64; 3];
    let per_signal: [(&'static str, &'static str, Field); 5] = [
        ("uvspan.otlp.received", "Spans, data points, log records the app sent to --otlp-listen", |c| &c.received),
        ("uvspan.otlp.forwarded", "Items of the app forwarded to the endpoint", |c| &c.forwarded),
        ("uvspan.otlp.dropped", "Items of the app accepted, then lost (refused for good, or unflushed)", |c| &c.dropped),
        ("uvspan.otlp.refused", "Items of the app refused while the forwarding queue was full (the app retries)", |c| &c.refused),
        ("uvspan.otlp.rejected", "Items of the app the endpoint rejected (partial success)", |c| &c.rejected),
    ];
    for (name, desc, field) in per_signal {
        let l = l.clone();
        let _ = meter
            .u64_observable_counter(name)
            .with_description(desc)
            .with_callback(move |o| {
                if l.on.load(Ordering::Relaxed) {
                    for s in Signal::ALL {
                        o.observe(ListenCounters::get(field(&l), s), &[KeyValue::new("signal", s.name())]);
                    }
                }
            })
            .build();
    }
    type One = fn(&ListenCounters) -> &AtomicU64;
    let single: [(&'static str, &'static str, One); 4] = [
        ("uvspan.otlp.malformed", "Malformed OTLP requests to --otlp-listen", |c| &c.malformed),
        ("uvspan.spans.joined", "uvspan spans put under the app's SERVER span of their request", |c| &c.joined),
        ("uvspan.spans.unjoined", "uvspan request spans sent without the app's SERVER span (window passed)", |c| &c.unjoined),
        ("uvspan.spans.twins", "uvspan spans not sent: the app's own span of the same operation stood for them", |c| &c.twins),
    ];
    for (name, desc, field) in single {
        let l = l.clone();
        let _ = meter
            .u64_observable_counter(name)
            .with_description(desc)
            .with_callback(move |o| {
                if l.on.load(Ordering::Relaxed) {
                    o.observe(field(&l).load(Ordering::Relaxed), &[]);
                }
            })
            .build();
    }
}
