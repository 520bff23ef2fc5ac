use super::*;
use crate::events::decode::OpRecord;
use crate::requests::FinishedCall;
use opentelemetry::KeyValue;

fn op(pid: u32, start: u64, end: u64, sync: bool) -> OpRecord {
    OpRecord { sync, ..OpRecord::test(pid, pid, start, end) }
}

fn fs(pid: u32, dur_ns: u64, result: i64, sync: bool) -> FsRecord {
    let stat = (0..=255u8).find(|i| crate::probes::catalog::fs_op(*i).is_some_and(|o| o.span == "fs.stat")).expect("fs.stat");
    FsRecord { op: op(pid, 1_000, 1_000 + dur_ns, sync), op_id: stat, result, fd: None, path: None, path2: None }
}

fn resource(pid: u32) -> Resource {
    Resource::builder_empty().with_attributes([KeyValue::new("process.pid", i64::from(pid))]).build()
}

#[test]
fn buckets_take_a_value_on_their_upper_bound_and_count_everything() {
    let mut h = Hist::new(&REQUEST_BOUNDS);
    for v in [0.001, 0.005, 0.0051, 10.0, 99.0] {
        h.record(&REQUEST_BOUNDS, v);
    }
    assert_eq!(h.buckets[0], 2, "0.001 and 0.005 (inclusive upper bound)");
    assert_eq!(h.buckets[1], 1);
    assert_eq!(h.buckets[13], 1, "10.0 closes the last bounded bucket");
    assert_eq!(h.buckets[14], 1, "above every bound");
    assert_eq!((h.count, h.min, h.max), (5, 0.001, 99.0));
    assert_eq!(h.buckets.iter().sum::<u64>(), h.count);
}

/// Work the kernel already counted (sent for a kept request's span) is
/// not counted again.
#[test]
fn records_the_kernel_counted_are_not_counted_again() {
    let mut m = Metrics::default();
    m.resource(7, &resource(7));
    let mut counted = fs(7, 20_000, 0, false);
    counted.op.counted = true;
    m.fs(&counted);
    m.dns(&DnsRecord { op: OpRecord { counted: true, ..op(7, 0, 1_000, false) }, retcode: 0, host: "h".into(), answers: vec![] });
    assert!(m.collect(false).iter().all(|c| c.series.is_empty()), "nothing counted");
    m.fs(&fs(7, 20_000, 0, false));
    assert_eq!(m.collect(false).iter().map(|c| c.series.len()).sum::<usize>(), 1);
}

#[test]
fn series_per_process_with_bounded_attributes() {
    let mut m = Metrics::default();
    m.resource(7, &resource(7));
    m.fs(&fs(7, 20_000, 0, false));
    m.fs(&fs(7, 30_000, 0, false));
    m.fs(&fs(7, 10_000, -2, true));
    let f = Finished {
        pid: 7,
        method: "BREW".into(),
        status: Some(503),
        tls: true,
        version: "1.1",
        template: Some("/items/{id}".into()),
        rpc: None,
        start_ns: 0,
        end_ns: 2_000_000,
        calls: vec![FinishedCall {
            method: "GET".into(),
            status: Some(200),
            tls: false,
            server: Some(("api".into(), 8080)),
            template: Some("/stock/{id}".into()),
            rpc: None,
            start_ns: 10,
            end_ns: 1_000_010,
        }],
    };
    m.request(&f);
    m.request(&Finished { status: Some(200), method: "GET".into(), ..f.clone() });
    m.request(&Finished { status: Some(200), method: "GET".into(), template: Some("/health".into()), calls: vec![], ..f.clone() });
    // A process whose resource is not known is not kept.
    m.fs(&fs(8, 1, 0, false));
    let got = m.collect(false);
    assert_eq!(got.len(), 1, "only the process with a resource");
    let series = &got[0].series;
    let fs_ok = series.iter().find(|((m, a), _)| *m == Metric::Fs && !a.iter().any(|(k, _)| *k == "error.type")).expect("fs ok");
    assert_eq!(fs_ok.1.count, 2);
    assert!((fs_ok.1.sum - 0.00005).abs() < 1e-12);
    let fs_err =
        series.iter().find(|((m, a), _)| *m == Metric::Fs && a.contains(&("error.type", Val::Str("ENOENT".into())))).expect("ENOENT");
    assert!(fs_err.0 .1.contains(&("uvspan.fs.sync", Val::Bool(true))));
    let servers: Vec<_> = series.iter().filter(|((m, _), _)| *m == Metric::HttpServer).collect();
    assert_eq!(servers.len(), 2, "503 and 200 are two series (not by url.template: followed requests have no path)");
    assert!(servers.iter().any(|((_, a), _)| a.contains(&("http.request.method", Val::Str("_OTHER".into())))
        && a.contains(&("error.type", Val::Str("503".into())))));
    assert!(servers.iter().all(|((_, a), _)| !a.iter().any(|(k, _)| *k == "url.template")));
    let clients: Vec<_> = series.iter().filter(|((m, _), _)| *m == Metric::HttpClient).collect();
    assert_eq!(clients.iter().map(|(_, h)| h.count).sum::<u64>(), 2);
    assert!(clients.iter().all(|((_, a), _)| a.contains(&("url.template", Val::Str("/stock/{id}".into())))));
    // Cumulative: the same again; delta: reset.
    assert_eq!(m.collect(false)[0].series, *series);
    assert_eq!(m.collect(true)[0].series, *series);
    assert!(m.collect(true).is_empty());
    // An exited process goes out once more, then is gone.
    m.fs(&fs(7, 5, 0, false));
    m.exited(7);
    assert_eq!(m.collect(false).len(), 1);
    assert!(m.collect(false).is_empty());
}

#[test]
fn encoded_as_otlp_histograms_under_each_process_resource() {
    let mut m = Metrics::default();
    m.resource(7, &resource(7));
    m.dns(&DnsRecord { op: op(7, 0, 3_000_000, false), retcode: 0, host: "h".into(), answers: vec![] });
    m.dns(&DnsRecord { op: op(7, 0, 1_000_000, false), retcode: -3008, host: "h".into(), answers: vec![] });
    let w = encode::Window { start_ns: 5, now_ns: 9, delta: false };
    let req = encode::request(m.collect(false), &w);
    assert_eq!(req.resource_metrics.len(), 1);
    let rm = &req.resource_metrics[0];
    assert_eq!(rm.resource.as_ref().unwrap().attributes[0].key, "process.pid");
    let metrics = &rm.scope_metrics[0].metrics;
    assert_eq!(metrics.len(), 1, "one metric, two data points");
    assert_eq!((metrics[0].name.as_str(), metrics[0].unit.as_str()), ("dns.lookup.duration", "s"));
    let Some(opentelemetry_proto::tonic::metrics::v1::metric::Data::Histogram(h)) = &metrics[0].data else { panic!("a histogram") };
    assert_eq!(h.aggregation_temporality, 2, "cumulative");
    assert_eq!(h.data_points.len(), 2);
    for p in &h.data_points {
        assert_eq!((p.start_time_unix_nano, p.time_unix_nano, p.count), (5, 9, 1));
        assert_eq!(p.bucket_counts.len(), p.explicit_bounds.len() + 1);
    }
    assert!(h.data_points.iter().any(|p| p.attributes.iter().any(|a| a.key == "error.type")));
}

#[test]
fn event_loop_time_cumulative_and_delta_utilization_per_interval() {
    let t = |now: u64, idle: u64| LoopTime {
        since_ns: 1_000,
        idle_ns: idle,
        now_ns: 1_000 + now,
        split: BusySplit::default(),
        iterations: Iterations::default(),
    };
    // First collection: 1 s, 0.25 s of it idle.
    let e = EventLoop::between(None, t(1_000_000_000, 250_000_000), false).unwrap();
    assert_eq!((e.active_s, e.idle_s, e.utilization), (0.75, 0.25, 0.75));
    // Next second all idle: cumulative totals, utilization of that second.
    let e = EventLoop::between(Some(t(1_000_000_000, 250_000_000)), t(2_000_000_000, 1_250_000_000), false).unwrap();
    assert_eq!((e.active_s, e.idle_s, e.utilization), (0.75, 1.25, 0.0));
    let d = EventLoop::between(Some(t(1_000_000_000, 250_000_000)), t(2_000_000_000, 1_250_000_000), true).unwrap();
    assert_eq!((d.active_s, d.idle_s), (0.0, 1.0), "delta: that second only");
    // Nothing new: nothing to say; a new loop (another since): from its start.
    assert_eq!(EventLoop::between(Some(t(5, 1)), t(5, 1), false), None);
    let other = LoopTime { since_ns: 9, idle_ns: 0, now_ns: 9 + 1_000, split: BusySplit::default(), iterations: Iterations::default() };
    assert_eq!(EventLoop::between(Some(t(5, 1)), other, false).unwrap().utilization, 1.0);
    // Idle never over elapsed (a wait counted up to a later "now").
    assert!(
        EventLoop::between(
            None,
            LoopTime { since_ns: 0, idle_ns: 50, now_ns: 10, split: BusySplit::default(), iterations: Iterations::default() },
            false
        )
        .unwrap()
        .idle_s
            <= 10e-9
    );
}

#[test]
fn the_active_time_splits_into_on_off_cpu_and_run_queue() {
    let t = |now: u64, busy: u64, on: u64, rq: u64| LoopTime {
        since_ns: 0,
        idle_ns: now - busy,
        now_ns: now,
        split: BusySplit { busy_ns: busy, on_cpu_ns: on, runqueue_ns: rq },
        iterations: Iterations::default(),
    };
    let s = 1_000_000_000;
    // First second: 0.5 s busy, 0.3 on a CPU, 0.05 waiting for one.
    let e = EventLoop::between(None, t(s, s / 2, 3 * s / 10, s / 20), false).unwrap();
    assert_eq!((e.on_cpu_s, e.runqueue_s), (0.3, 0.05));
    assert!((e.off_cpu_s - 0.15).abs() < 1e-12, "{}", e.off_cpu_s);
    // Next second: 0.2 s more busy, all on a CPU.
    let (a, b) = (t(s, s / 2, 3 * s / 10, s / 20), t(2 * s, 7 * s / 10, s / 2, s / 20));
    let c = EventLoop::between(Some(a), b, false).unwrap();
    assert_eq!((c.on_cpu_s, c.runqueue_s), (0.5, 0.05), "cumulative");
    let d = EventLoop::between(Some(a), b, true).unwrap();
    assert_eq!((d.on_cpu_s, d.off_cpu_s, d.runqueue_s), (0.2, 0.0, 0.0), "delta");
    // The request carries the split as its own metric, by state.
    let w = encode::Window { start_ns: 1, now_ns: 2, delta: false };
    let c = Collected { resource: resource(1), series: vec![], eventloop: Some(e) };
    let req = encode::request(vec![c], &w);
    let m = &req.resource_metrics[0].scope_metrics[0].metrics;
    let split = m.iter().find(|m| m.name == "uvspan.eventloop.time").expect("uvspan.eventloop.time");
    let Some(opentelemetry_proto::tonic::metrics::v1::metric::Data::Sum(sum)) = &split.data else { panic!("a sum") };
    let states: Vec<String> = sum
        .data_points
        .iter()
        .map(|p| match &p.attributes[0].value.as_ref().and_then(|v| v.value.clone()) {
            Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => format!("{}={s}", p.attributes[0].key),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(states, ["uvspan.eventloop.state=on_cpu", "uvspan.eventloop.state=off_cpu", "uvspan.eventloop.state=runqueue"]);
    assert!(sum.is_monotonic && split.unit == "s");
}

#[test]
fn iteration_bounds_are_the_kernels() {
    use crate::kernel::skel::types::uvspan_sizes;
    assert_eq!(ITER_BOUNDS.len(), uvspan_sizes::UVSPAN_ITER_BOUNDS.0 as usize);
    let base = uvspan_sizes::UVSPAN_ITER_BASE_NS.0 as f64 / 1e9;
    for (i, b) in ITER_BOUNDS.iter().enumerate() {
        assert!((b - base * f64::from(1u32 << i)).abs() < 1e-12, "bound {i}: {b}");
    }
    assert_eq!(crate::kernel::skel::types::loop_time::default().iter_buckets.len(), ITER_BUCKETS);
}

#[test]
fn every_iteration_is_a_histogram_count_cumulative_or_per_interval() {
    let mut m = Metrics::default();
    m.resource(7, &resource(7));
    let at = |now: u64, first: u64, last: u64, busy_ns: u64| {
        let mut buckets = [0u64; ITER_BUCKETS];
        buckets[0] = first;
        buckets[ITER_BUCKETS - 1] = last;
        LoopTime { since_ns: 100, idle_ns: 0, now_ns: 100 + now, split: BusySplit::default(), iterations: Iterations { buckets, busy_ns } }
    };
    let iterations =
        |c: &[Collected]| -> Option<Hist> { c[0].series.iter().find(|((m, _), _)| *m == Metric::LoopIteration).map(|(_, h)| h.clone()) };
    // 10 fast iterations and one over the last bound (5 s) in the first second.
    m.loop_time(7, at(1_000_000_000, 10, 1, 5_000_500_000));
    let h = iterations(&m.collect(true)).expect("iterations");
    assert_eq!((h.count, h.buckets[0], h.buckets[ITER_BUCKETS - 1]), (11, 10, 1));
    assert!((h.sum - 5.0005).abs() < 1e-9, "{}", h.sum);
    // Delta: the next interval has 5 more fast ones only.
    m.loop_time(7, at(2_000_000_000, 15, 1, 5_001_000_000));
    let h = iterations(&m.collect(true)).expect("iterations");
    assert_eq!((h.count, h.buckets[0], h.buckets[ITER_BUCKETS - 1]), (5, 5, 0));
    // Cumulative: everything since the loop was first seen.
    m.loop_time(7, at(3_000_000_000, 20, 1, 5_001_500_000));
    let c = m.collect(false);
    assert_eq!(iterations(&c).expect("iterations").count, 21);
    // Exported without min and max (the kernel keeps buckets only).
    let w = encode::Window { start_ns: 1, now_ns: 2, delta: false };
    let req = encode::request(c, &w);
    let metric = req.resource_metrics[0].scope_metrics[0].metrics.iter().find(|m| m.name == "uvspan.eventloop.iteration.duration");
    let Some(opentelemetry_proto::tonic::metrics::v1::metric::Data::Histogram(hist)) = metric.and_then(|m| m.data.clone()) else {
        panic!("uvspan.eventloop.iteration.duration is a histogram")
    };
    assert_eq!((hist.data_points[0].min, hist.data_points[0].max), (None, None));
    assert_eq!(hist.data_points[0].explicit_bounds, ITER_BOUNDS);
}

#[test]
fn the_threadpool_queue_wait_counts_async_work_whose_start_was_seen() {
    let mut m = Metrics::default();
    m.resource(3, &resource(3));
    let mut seen = fs(3, 5_000_000, 0, false);
    seen.op.work_start_ns = Some(seen.op.start_ns + 2_000_000);
    m.fs(&seen);
    m.fs(&fs(3, 5_000_000, 0, false)); // no --detail threadpool: its wait is not known
    let mut dns = DnsRecord { op: op(3, 0, 10, false), retcode: 0, host: "x".into(), answers: vec![] };
    dns.op.work_start_ns = Some(4);
    m.dns(&dns);
    let c = m.collect(false);
    let waits: Vec<(String, u64, f64)> =
        c[0].series.iter().filter(|((m, _), _)| *m == Metric::QueueWait).map(|((_, a), h)| (format!("{a:?}"), h.count, h.sum)).collect();
    assert_eq!(waits.len(), 2, "{waits:?}");
    assert!(waits.iter().any(|(a, n, s)| a.contains("fs") && *n == 1 && (s - 0.002).abs() < 1e-12), "{waits:?}");
    assert!(waits.iter().any(|(a, n, s)| a.contains("dns") && *n == 1 && (s - 4e-9).abs() < 1e-15), "{waits:?}");
}

/// A request process 7's request tracker saw, from 0 to `end_ns`, with no call.
fn server_request(method: &str, status: u16, tls: bool, version: &'static str, end_ns: u64) -> Finished {
    Finished {
        pid: 7,
        method: method.into(),
        status: Some(status),
        tls,
        version,
        template: None,
        rpc: None,
        start_ns: 0,
        end_ns,
        calls: vec![],
    }
}

/// A request the kernel followed (counted in its histogram, or ended by
/// uvspan) joins the series of a request the tracker saw with the same
/// method, scheme, version and status.
#[test]
fn followed_requests_join_the_trackers_series() {
    use crate::kernel::tracer::{FollowedRequest, KernelOps};
    let mut m = Metrics::default();
    m.resource(7, &resource(7));
    m.request(&server_request("POST", 503, true, "1.0", 2_000_000));
    // POST is 1 in the kernel's enum http_method; the 16 buckets it
    // writes for the 14 bounds (the 2 past them empty).
    let mut buckets = vec![0; 17];
    buckets[0] = 2;
    let kernel = KernelOps { pid: 7, family: 3, op_id: 1, sync: true, ver: 0, err: 503, count: 2, sum_ns: 4_000_000, buckets };
    m.kernel_ops(std::slice::from_ref(&kernel));
    let ended =
        FollowedRequest { pid: 7, method: 1, ver: 0, tls: true, status: Some(503), start_ns: 0, end_ns: 3_000_000, cause: 1 << 8, conn: 0 };
    m.followed(&ended);
    // Not answered: no status, a series of its own.
    m.followed(&FollowedRequest { status: None, ..ended });
    let got = m.collect(false);
    let servers: Vec<_> = got[0].series.iter().filter(|((m, _), _)| *m == Metric::HttpServer).collect();
    assert_eq!(servers.len(), 2, "{servers:?}");
    let answered = servers.iter().find(|((_, a), _)| a.iter().any(|(k, _)| *k == "http.response.status_code")).expect("503");
    assert_eq!(answered.1.count, 4, "the tracker's, the kernel's two and the one uvspan ended");
    assert_eq!(answered.1.buckets[0], 4);
    assert!(answered.0 .1.contains(&("network.protocol.version", Val::Str("1.0".into()))));
    assert!(answered.0 .1.contains(&("url.scheme", Val::Str("https".into()))));
    // The kernel's histogram read again, unchanged: nothing new.
    m.kernel_ops(&[kernel]);
    assert_eq!(m.collect(false)[0].series.iter().filter(|((m, _), _)| *m == Metric::HttpServer).map(|(_, h)| h.count).sum::<u64>(), 5);
}

/// An HTTP/2 stream the kernel followed (version 2 in its histogram key;
/// a method outside the conventions' list is the kernel's "other", 9)
/// joins the series of a stream the tracker saw with the same attributes.
#[test]
fn followed_http2_streams_join_the_trackers_series() {
    use crate::kernel::tracer::KernelOps;
    let mut m = Metrics::default();
    m.resource(7, &resource(7));
    m.request(&server_request("PROPFIND", 200, false, "2", 1_000_000));
    let mut buckets = vec![0; 17];
    buckets[0] = 3;
    m.kernel_ops(&[KernelOps { pid: 7, family: 3, op_id: 9, sync: false, ver: 2, err: 200, count: 3, sum_ns: 3_000_000, buckets }]);
    let got = m.collect(false);
    let servers: Vec<_> = got[0].series.iter().filter(|((m, _), _)| *m == Metric::HttpServer).collect();
    assert_eq!(servers.len(), 1, "one series: {servers:?}");
    assert_eq!(servers[0].1.count, 4);
    let attrs = &servers[0].0 .1;
    assert!(attrs.contains(&("network.protocol.version", Val::Str("2".into()))), "{attrs:?}");
    assert!(attrs.contains(&("http.request.method", Val::Str("_OTHER".into()))), "{attrs:?}");
    assert!(attrs.contains(&("url.scheme", Val::Str("http".into()))), "{attrs:?}");
}

/// gRPC calls are RPC metrics in seconds, named by the current conventions, not HTTP ones.
#[test]
fn grpc_calls_are_rpc_call_durations() {
    let mut m = Metrics::default();
    m.resource(7, &resource(7));
    let call = |code: Option<u8>| FinishedCall {
        method: "POST".into(),
        status: Some(200),
        tls: false,
        server: None,
        template: None,
        rpc: Some(("test.Echo/Say".into(), code)),
        start_ns: 0,
        end_ns: 3_000_000,
    };
    let served = |code: u8| Finished {
        pid: 7,
        method: "POST".into(),
        status: Some(200),
        tls: false,
        version: "2",
        template: None,
        rpc: Some(("helloworld.Greeter/SayHello".into(), Some(code))),
        start_ns: 0,
        end_ns: 250_000_000,
        calls: vec![],
    };
    m.request(&served(0));
    m.request(&served(13));
    m.request(&Finished { calls: vec![call(Some(5)), call(None)], ..served(0) });
    let got = m.collect(false);
    let series = &got[0].series;
    assert!(series.iter().all(|((m, _), _)| !matches!(m, Metric::HttpServer | Metric::HttpClient)), "{series:?}");
    assert_eq!(Metric::RpcServer.name(), "rpc.server.call.duration");
    assert_eq!(Metric::RpcClient.name(), "rpc.client.call.duration");
    let servers: Vec<_> = series.iter().filter(|((m, _), _)| *m == Metric::RpcServer).collect();
    let of = |code: &str| {
        servers.iter().find(|((_, a), _)| a.contains(&("rpc.response.status_code", Val::Str(code.to_string().into())))).unwrap()
    };
    assert_eq!(of("OK").1.count, 2);
    assert!((of("OK").1.sum - 0.5).abs() < 1e-9, "seconds");
    assert!(of("OK").0 .1.contains(&("rpc.method", Val::Str("helloworld.Greeter/SayHello".into()))));
    assert!(of("OK").0 .1.contains(&("rpc.system.name", Val::Str("grpc".into()))));
    assert!(of("INTERNAL").0 .1.contains(&("error.type", Val::Str("INTERNAL".into()))));
    let clients: Vec<_> = series.iter().filter(|((m, _), _)| *m == Metric::RpcClient).collect();
    assert_eq!(clients.iter().map(|(_, h)| h.count).sum::<u64>(), 2);
    // A client's view: NOT_FOUND is an error; a call without a status has none.
    assert!(clients.iter().any(|((_, a), _)| a.contains(&("error.type", Val::Str("NOT_FOUND".into())))));
    assert!(clients.iter().any(|((_, a), _)| !a.iter().any(|(k, _)| *k == "rpc.response.status_code")));
}
