//! The aggregates as one OTLP metrics request: a ResourceMetrics per
//! process (its resource as on its spans), histograms with explicit bounds.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric as PbMetric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource as PbResource;
use opentelemetry_sdk::Resource;

use super::{Collected, EventLoop, Hist, Key, Metric, Val};

/// When the aggregation started and now (wall-clock ns), and whether the
/// series are deltas since `start_ns`.
pub struct Window {
    pub start_ns: u64,
    pub now_ns: u64,
    pub delta: bool,
}

pub fn request(collected: Vec<Collected>, w: &Window) -> ExportMetricsServiceRequest {
    let resource_metrics = collected
        .into_iter()
        .map(|c| ResourceMetrics {
            resource: Some(resource(&c.resource)),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: crate::events::spans::SCOPE_NAME.into(),
                    version: crate::events::spans::SCOPE_VERSION.into(),
                    ..Default::default()
                }),
                metrics: {
                    let mut m = metrics(c.series, w);
                    m.extend(c.eventloop.map(|e| eventloop(&e, w)).into_iter().flatten());
                    m
                },
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        })
        .collect();
    ExportMetricsServiceRequest { resource_metrics }
}

fn metrics(series: Vec<(Key, Hist)>, w: &Window) -> Vec<PbMetric> {
    let mut out: Vec<PbMetric> = Vec::new();
    let temporality = if w.delta { AggregationTemporality::Delta } else { AggregationTemporality::Cumulative };
    for ((m, attrs), h) in series {
        let point = HistogramDataPoint {
            attributes: attrs.into_iter().map(|(k, v)| kv(k, v)).collect(),
            start_time_unix_nano: w.start_ns,
            time_unix_nano: w.now_ns,
            count: h.count,
            sum: Some(h.sum),
            bucket_counts: h.buckets,
            explicit_bounds: m.bounds().to_vec(),
            min: (h.count > 0 && !h.partial && h.min.is_finite()).then_some(h.min),
            max: (h.count > 0 && !h.partial && h.max.is_finite()).then_some(h.max),
            ..Default::default()
        };
        match out.last_mut() {
            Some(PbMetric { name, data: Some(metric::Data::Histogram(hist)), .. }) if name == m.name() => hist.data_points.push(point),
            _ => out.push(new_metric(m, point, temporality)),
        }
    }
    out
}

/// `nodejs.eventloop.time` by state, `nodejs.eventloop.utilization`, and
/// `uvspan.eventloop.time`: the active time by what the loop thread did
/// (a metric of its own: the conventions' `nodejs.eventloop.state` has
/// active and idle only, which these add up to the first of).
fn eventloop(e: &EventLoop, w: &Window) -> [PbMetric; 3] {
    let temporality = if w.delta { AggregationTemporality::Delta } else { AggregationTemporality::Cumulative };
    let point = |v: f64, state: Option<&'static str>, start: u64| NumberDataPoint {
        attributes: state.map(|s| kv("nodejs.eventloop.state", Val::Str(s.into()))).into_iter().collect(),
        start_time_unix_nano: start,
        time_unix_nano: w.now_ns,
        value: Some(number_data_point::Value::AsDouble(v)),
        ..Default::default()
    };
    [
        PbMetric {
            name: "nodejs.eventloop.time".into(),
            description: "Time the event loop spent in each state (idle: blocked waiting for I/O)".into(),
            unit: "s".into(),
            data: Some(metric::Data::Sum(Sum {
                data_points: vec![point(e.active_s, Some("active"), w.start_ns), point(e.idle_s, Some("idle"), w.start_ns)],
                aggregation_temporality: temporality as i32,
                is_monotonic: true,
            })),
            ..Default::default()
        },
        PbMetric {
            name: "nodejs.eventloop.utilization".into(),
            description: "Share of the time the event loop was active, since the last export".into(),
            unit: "1".into(),
            data: Some(metric::Data::Gauge(Gauge { data_points: vec![point(e.utilization, None, 0)] })),
            ..Default::default()
        },
        PbMetric {
            name: "uvspan.eventloop.time".into(),
            description: "Active time of the event loop by what its thread did: on_cpu (running), runqueue (runnable, waiting for a CPU), \
                          off_cpu (sleeping or blocked outside the loop's epoll waits)"
                .into(),
            unit: "s".into(),
            data: Some(metric::Data::Sum(Sum {
                data_points: [("on_cpu", e.on_cpu_s), ("off_cpu", e.off_cpu_s), ("runqueue", e.runqueue_s)]
                    .into_iter()
                    .map(|(state, v)| NumberDataPoint {
                        attributes: vec![kv("uvspan.eventloop.state", Val::Str(state.into()))],
                        ..point(v, None, w.start_ns)
                    })
                    .collect(),
                aggregation_temporality: temporality as i32,
                is_monotonic: true,
            })),
            ..Default::default()
        },
    ]
}

fn new_metric(m: Metric, point: HistogramDataPoint, t: AggregationTemporality) -> PbMetric {
    PbMetric {
        name: m.name().into(),
        description: m.description().into(),
        unit: "s".into(),
        data: Some(metric::Data::Histogram(Histogram { data_points: vec![point], aggregation_temporality: t as i32 })),
        ..Default::default()
    }
}

fn kv(k: &str, v: Val) -> KeyValue {
    let value = match v {
        Val::Str(s) => any_value::Value::StringValue(s.into_owned()),
        Val::Int(i) => any_value::Value::IntValue(i),
        Val::Bool(b) => any_value::Value::BoolValue(b),
    };
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(value) }), ..Default::default() }
}

fn resource(r: &Resource) -> PbResource {
    PbResource { attributes: r.iter().map(KeyValue::from).collect(), ..Default::default() }
}
