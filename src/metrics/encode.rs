//! The aggregates as one OTLP metrics request: a ResourceMetrics per
//! process (its resource as on its spans), histograms with explicit bounds.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, AggregationTemporality, Histogram, HistogramDataPoint, Metric as PbMetric, ResourceMetrics, ScopeMetrics,
};
use opentelemetry_proto::tonic::resource::v1::Resource as PbResource;
use opentelemetry_sdk::Resource;

use super::{Hist, Key, Metric, Val};

/// When the aggregation started and now (wall-clock ns), and whether the
/// series are deltas since `start_ns`.
pub struct Window {
    pub start_ns: u64,
    pub now_ns: u64,
    pub delta: bool,
}

pub fn request(collected: Vec<(Resource, Vec<(Key, Hist)>)>, w: &Window) -> ExportMetricsServiceRequest {
    let resource_metrics = collected
        .into_iter()
        .map(|(r, series)| ResourceMetrics {
            resource: Some(resource(&r)),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: crate::events::spans::SCOPE_NAME.into(),
                    version: crate::events::spans::SCOPE_VERSION.into(),
                    ..Default::default()
                }),
                metrics: metrics(series, w),
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
            min: (h.count > 0).then_some(h.min),
            max: (h.count > 0).then_some(h.max),
            ..Default::default()
        };
        match out.last_mut() {
            Some(PbMetric { name, data: Some(metric::Data::Histogram(hist)), .. }) if name == m.name() => hist.data_points.push(point),
            _ => out.push(new_metric(m, point, temporality)),
        }
    }
    out
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
