//! OTLP metrics of everything uvspan sees, per traced process (its resource
//! is the spans'): HTTP server and client request durations, DNS lookups,
//! fs operations, the event loop's active and idle time and its active
//! time's split (on-CPU, off-CPU, run queue), V8's garbage collections. Every record passes here before the trace sampler, so the
//! counts are exact whatever is sampled. Aggregated in memory as explicit
//! bucket histograms with bounded attribute sets (pure; [`encode`] writes
//! the OTLP message).

pub mod encode;

use std::borrow::Cow;
use std::collections::BTreeMap;

use opentelemetry_sdk::Resource;
use rustc_hash::FxHashMap;

use crate::events::decode::{DnsRecord, FsRecord, GcRecord};
pub use crate::events::loop_time::{BusySplit, Iterations, LoopTime, ITER_BUCKETS};
use crate::kernel::tracer::{FollowedRequest, HTTP_METHODS};
use crate::requests::{Finished, FinishedCall};
use crate::semconv;

/// The metrics uvspan makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Metric {
    HttpServer,
    HttpClient,
    /// gRPC calls served (instead of `HttpServer`).
    RpcServer,
    /// gRPC calls made (instead of `HttpClient`).
    RpcClient,
    Dns,
    Fs,
    /// Threadpool work's wait in libuv's queue (fs and DNS).
    QueueWait,
    /// Every loop iteration's busy time (counted in the kernel).
    LoopIteration,
    Gc,
    /// Database operations, from their connections' bytes.
    Db,
}

/// The semantic conventions' advice for HTTP and DNS durations (s).
const REQUEST_BOUNDS: [f64; 14] = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0];
/// The semantic conventions' advice for `db.client.operation.duration` (s).
const DB_BOUNDS: [f64; 9] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0];
/// The semantic conventions' advice for `v8js.gc.duration` (s).
const GC_BOUNDS: [f64; 4] = [0.01, 0.1, 1.0, 10.0];
/// fs operations take microseconds to seconds.
const FS_BOUNDS: [f64; 16] =
    [0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
/// The kernel's loop-iteration buckets (bpf/uvspan.h: 0.1 ms doubling, 16
/// bounds; a unit test holds them to the enum).
const ITER_BOUNDS: [f64; 16] =
    [0.0001, 0.0002, 0.0004, 0.0008, 0.0016, 0.0032, 0.0064, 0.0128, 0.0256, 0.0512, 0.1024, 0.2048, 0.4096, 0.8192, 1.6384, 3.2768];

impl Metric {
    pub fn name(self) -> &'static str {
        match self {
            Metric::HttpServer => semconv::HTTP_SERVER_REQUEST_DURATION,
            Metric::HttpClient => semconv::HTTP_CLIENT_REQUEST_DURATION,
            Metric::RpcServer => semconv::RPC_SERVER_CALL_DURATION,
            Metric::RpcClient => semconv::RPC_CLIENT_CALL_DURATION,
            Metric::Dns => semconv::DNS_LOOKUP_DURATION,
            Metric::Fs => "uvspan.fs.duration",
            Metric::QueueWait => "uvspan.threadpool.queue.duration",
            Metric::LoopIteration => "uvspan.eventloop.iteration.duration",
            Metric::Gc => semconv::V8JS_GC_DURATION,
            Metric::Db => crate::db::spans::DURATION_METRIC,
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Metric::HttpServer => "Duration of HTTP server requests",
            Metric::HttpClient => "Duration of HTTP client requests",
            Metric::RpcServer => "Duration of RPC calls served (gRPC)",
            Metric::RpcClient => "Duration of RPC calls made (gRPC)",
            Metric::Dns => "Duration of DNS lookups (getaddrinfo)",
            Metric::Fs => "Duration of fs operations (libuv uv_fs_*), async from submit to callback, sync as the call",
            Metric::QueueWait => "Time threadpool work (fs, DNS) waited in libuv's queue for a free threadpool thread",
            Metric::LoopIteration => "Busy time of every event loop iteration: from its start to the next, less its waits for I/O",
            Metric::Gc => "Garbage collection duration (V8's GC prologue to epilogue callbacks, as perf_hooks measures it)",
            Metric::Db => "Duration of database client operations: from the write of the command to the read of its response's end",
        }
    }

    pub fn bounds(self) -> &'static [f64] {
        match self {
            Metric::Fs | Metric::QueueWait => &FS_BOUNDS,
            Metric::LoopIteration => &ITER_BOUNDS,
            Metric::Gc => &GC_BOUNDS,
            Metric::Db => &DB_BOUNDS,
            _ => &REQUEST_BOUNDS,
        }
    }
}

/// An attribute value (ordered, so a series is a map key).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Val {
    Str(Cow<'static, str>),
    Int(i64),
    Bool(bool),
}

/// One series: a metric and its attributes.
pub type Key = (Metric, Vec<(&'static str, Val)>);

/// An explicit-bucket histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct Hist {
    pub buckets: Vec<u64>,
    pub count: u64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
    /// Some values were counted in the kernel (buckets and sum only): min
    /// and max are not known.
    pub partial: bool,
}

impl Hist {
    fn new(bounds: &[f64]) -> Hist {
        Hist { buckets: vec![0; bounds.len() + 1], count: 0, sum: 0.0, min: f64::INFINITY, max: f64::NEG_INFINITY, partial: false }
    }

    /// Values counted elsewhere (the kernel): their buckets and sum.
    fn merge(&mut self, buckets: &[u64], count: u64, sum: f64) {
        for (a, b) in self.buckets.iter_mut().zip(buckets) {
            *a += b;
        }
        self.count += count;
        self.sum += sum;
        self.partial = true;
    }

    fn record(&mut self, bounds: &[f64], v: f64) {
        // A value on a bound falls in the bucket it closes (OTLP: upper bound inclusive).
        let i = bounds.partition_point(|b| *b < v);
        self.buckets[i] += 1;
        self.count += 1;
        self.sum += v;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
}

/// A kernel histogram entry's identity (`struct op_hist_key`).
type KernelKey = (u32, u8, u8, bool, u8, i32);

#[derive(Default)]
struct Process {
    resource: Option<Resource>,
    series: BTreeMap<Key, Hist>,
    exited: bool,
    /// The loop thread's time, latest, and as of the last collection.
    loop_now: Option<LoopTime>,
    loop_reported: Option<LoopTime>,
}

impl Iterations {
    /// The iterations since `base` as a histogram (None: none). Min and max
    /// are not known (the kernel keeps buckets only). The count is the
    /// buckets' sum: user space reads the kernel's counters while they move.
    fn since(&self, base: &Iterations) -> Option<Hist> {
        let buckets: Vec<u64> = self.buckets.iter().zip(base.buckets).map(|(a, b)| a.saturating_sub(b)).collect();
        let count = buckets.iter().sum();
        (count > 0).then(|| Hist {
            buckets,
            count,
            sum: self.busy_ns.saturating_sub(base.busy_ns) as f64 / 1e9,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            partial: true,
        })
    }
}

/// `nodejs.eventloop.time` (active, idle; s) and
/// `nodejs.eventloop.utilization` (of the time since the last collection);
/// `uvspan.eventloop.time`: the active time split (s; busy parts ended).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EventLoop {
    pub active_s: f64,
    pub idle_s: f64,
    pub utilization: f64,
    pub on_cpu_s: f64,
    pub off_cpu_s: f64,
    pub runqueue_s: f64,
}

/// One process's metrics, collected.
#[derive(Clone, Debug, PartialEq)]
pub struct Collected {
    pub resource: Resource,
    pub series: Vec<(Key, Hist)>,
    pub eventloop: Option<EventLoop>,
}

impl EventLoop {
    /// From the loop's time at the last collection (`from`; None: none yet)
    /// to `to`: the time in each state (since the start when cumulative),
    /// and the utilization over the interval.
    fn between(from: Option<LoopTime>, to: LoopTime, delta: bool) -> Option<EventLoop> {
        let base = from.filter(|f| f.since_ns == to.since_ns).unwrap_or(LoopTime {
            since_ns: to.since_ns,
            idle_ns: 0,
            now_ns: to.since_ns,
            split: BusySplit::default(),
            iterations: Iterations::default(),
        });
        let elapsed = to.now_ns.checked_sub(base.now_ns)?;
        let idle = to.idle_ns.saturating_sub(base.idle_ns).min(elapsed);
        if elapsed == 0 {
            return None;
        }
        let utilization = (elapsed - idle) as f64 / elapsed as f64;
        let (all, all_idle) = if delta { (elapsed, idle) } else { (to.now_ns.saturating_sub(to.since_ns), to.idle_ns) };
        let all_idle = all_idle.min(all);
        let from_split = if delta { base.split } else { BusySplit::default() };
        let busy = to.split.busy_ns.saturating_sub(from_split.busy_ns);
        let on = to.split.on_cpu_ns.saturating_sub(from_split.on_cpu_ns);
        let rq = to.split.runqueue_ns.saturating_sub(from_split.runqueue_ns);
        let s = |ns: u64| ns as f64 / 1e9;
        Some(EventLoop {
            active_s: s(all - all_idle),
            idle_s: s(all_idle),
            utilization,
            on_cpu_s: s(on),
            off_cpu_s: s(busy.saturating_sub(on.saturating_add(rq))),
            runqueue_s: s(rq),
        })
    }
}

/// Everything aggregated since the start (cumulative) or the last
/// collection (delta).
#[derive(Default)]
pub struct Metrics {
    procs: FxHashMap<u32, Process>,
    /// The kernel's histograms of unsampled operations as last read
    /// (cumulative there): what was added since is new.
    kernel_seen: FxHashMap<KernelKey, (u64, u64, Vec<u64>)>,
}

/// `uvspan.fs.duration`'s attributes.
fn fs_attrs(op_id: u8, sync: bool, result: i64) -> Vec<(&'static str, Val)> {
    let name = crate::probes::catalog::fs_op(op_id).map_or("fs.unknown", |o| o.span);
    let mut attrs = vec![("uvspan.fs.operation", Val::Str(Cow::Borrowed(name))), ("uvspan.fs.sync", Val::Bool(sync))];
    if result < 0 {
        attrs.push(("error.type", Val::Str(crate::events::errno::error_type(result).into())));
    }
    attrs
}

/// `dns.lookup.duration`'s attributes.
fn dns_attrs(retcode: i32) -> Vec<(&'static str, Val)> {
    if retcode != 0 {
        vec![("error.type", Val::Str(crate::events::errno::error_type(i64::from(retcode)).into()))]
    } else {
        vec![]
    }
}

/// `uvspan.threadpool.queue.duration`'s attributes.
fn queue_attrs(work: &'static str) -> Vec<(&'static str, Val)> {
    vec![("uvspan.threadpool.work", Val::Str(Cow::Borrowed(work)))]
}

/// An HTTP server request's attributes (the bounded ones of its SERVER
/// span; its version left out where its request line was not read whole).
fn server_attrs(m: &str, tls: bool, version: &'static str, status: Option<u16>) -> Vec<(&'static str, Val)> {
    let mut attrs = vec![
        ("http.request.method", Val::Str(Cow::Borrowed(method(m)))),
        ("url.scheme", Val::Str(Cow::Borrowed(if tls { "https" } else { "http" }))),
    ];
    if !version.is_empty() {
        attrs.push(("network.protocol.version", Val::Str(Cow::Borrowed(version))));
    }
    if let Some(code) = status {
        attrs.push(("http.response.status_code", Val::Int(i64::from(code))));
        if code >= 500 {
            attrs.push(("error.type", Val::Str(code.to_string().into())));
        }
    }
    attrs.sort();
    attrs
}

/// A gRPC call's attributes: `rpc.system.name`, `rpc.method`, `rpc.response.status_code` (the
/// status's name) and `error.type` where `error` says the code is one.
fn rpc_attrs(method: &str, code: Option<u8>, error: fn(u8) -> bool) -> Vec<(&'static str, Val)> {
    let mut attrs = vec![
        (semconv::RPC_SYSTEM_NAME, Val::Str(Cow::Borrowed(semconv::RPC_SYSTEM_NAME_GRPC))),
        (semconv::RPC_METHOD, Val::Str(method.to_string().into())),
    ];
    if let Some(code) = code {
        let name = semconv::grpc_status_name(u32::from(code));
        if error(code) {
            attrs.push((semconv::ERROR_TYPE, Val::Str(name.clone())));
        }
        attrs.push((semconv::RPC_RESPONSE_STATUS_CODE, Val::Str(name)));
    }
    attrs.sort();
    attrs
}

/// The kernel's `enum http_method`.
fn followed_method(m: u8) -> &'static str {
    HTTP_METHODS.get(usize::from(m)).copied().unwrap_or("_OTHER")
}

/// The kernel's HTTP version: HTTP/1's minor version, or 2 (an HTTP/2
/// stream).
fn followed_version(ver: u8) -> &'static str {
    match ver {
        0 => "1.0",
        2 => "2",
        _ => "1.1",
    }
}

/// The HTTP methods the conventions name; any other is `_OTHER` (the
/// attribute stays bounded whatever a client sends).
fn method(m: &str) -> &'static str {
    const KNOWN: [&str; 9] = ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"];
    KNOWN.iter().find(|k| **k == m).copied().unwrap_or("_OTHER")
}

fn secs(start_ns: u64, end_ns: u64) -> f64 {
    end_ns.saturating_sub(start_ns) as f64 / 1e9
}

impl Metrics {
    /// One value, for a process whose resource is known (a record of a
    /// process already forgotten is not kept).
    fn add(&mut self, pid: u32, metric: Metric, attrs: Vec<(&'static str, Val)>, v: f64) {
        let Some(p) = self.procs.get_mut(&pid) else { return };
        p.series.entry((metric, attrs)).or_insert_with(|| Hist::new(metric.bounds())).record(metric.bounds(), v);
    }

    /// The process's resource (the same as its spans').
    pub fn resource(&mut self, pid: u32, r: &Resource) {
        let p = self.procs.entry(pid).or_default();
        p.resource = Some(r.clone());
        p.exited = false;
    }

    /// The process's loop thread as the kernel counted it.
    pub fn loop_time(&mut self, pid: u32, t: LoopTime) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.loop_now = Some(t);
        }
    }

    /// The process is gone: its series go out once more (the exporter is
    /// told to collect soon), then are dropped with its resource.
    pub fn exited(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.exited = true;
        }
    }

    /// Whether a process that exited waits for its last collection.
    pub fn has_exited(&self) -> bool {
        self.procs.values().any(|p| p.exited)
    }

    /// An fs record (not one the kernel already counted: `counted`).
    pub fn fs(&mut self, r: &FsRecord) {
        if r.op.counted {
            return;
        }
        self.add(r.op.pid, Metric::Fs, fs_attrs(r.op_id, r.op.sync, r.result), secs(r.op.start_ns, r.op.end_ns));
        self.queue_wait(&r.op, "fs");
    }

    /// The wait in the threadpool's queue, where the work's start was seen
    /// (`--detail threadpool`).
    fn queue_wait(&mut self, op: &crate::events::decode::OpRecord, work: &'static str) {
        if let (false, Some(start)) = (op.sync, op.work_start_ns) {
            self.add(op.pid, Metric::QueueWait, queue_attrs(work), secs(op.start_ns, start));
        }
    }

    /// A database operation (every one, whatever is sampled).
    pub fn db(&mut self, r: &crate::db::live::DbRecord) {
        let c = r.call();
        self.add(r.pid, Metric::Db, crate::db::spans::metric_attributes(&c), crate::db::spans::duration_secs(&c));
    }

    pub fn dns(&mut self, r: &DnsRecord) {
        if r.op.counted {
            return;
        }
        self.add(r.op.pid, Metric::Dns, dns_attrs(r.retcode), secs(r.op.start_ns, r.op.end_ns));
        self.queue_wait(&r.op, "dns");
    }

    /// The kernel's histograms of the operations of unsampled traces
    /// (which sent no record), as read now: what they counted since the
    /// last read joins the same series as the records' (buckets and sum;
    /// min and max are then not known).
    pub fn kernel_ops(&mut self, entries: &[crate::kernel::tracer::KernelOps]) {
        for e in entries {
            let (metric, attrs) = match e.family {
                0 => (Metric::Fs, fs_attrs(e.op_id, e.sync, i64::from(e.err))),
                1 => (Metric::Dns, dns_attrs(e.err)),
                2 => (Metric::QueueWait, queue_attrs(if e.op_id == 0 { "fs" } else { "dns" })),
                3 => (
                    Metric::HttpServer,
                    server_attrs(followed_method(e.op_id), e.sync, followed_version(e.ver), u16::try_from(e.err).ok().filter(|s| *s != 0)),
                ),
                _ => continue,
            };
            let seen = self.kernel_seen.entry((e.pid, e.family, e.op_id, e.sync, e.ver, e.err)).or_default();
            // An entry made again (its process's were removed): all new.
            if e.count < seen.0 {
                *seen = Default::default();
            }
            let count = e.count - seen.0;
            if count == 0 {
                continue;
            }
            let sum = e.sum_ns.saturating_sub(seen.1) as f64 / 1e9;
            let n = metric.bounds().len() + 1;
            let buckets: Vec<u64> =
                (0..n).map(|i| e.buckets.get(i).copied().unwrap_or(0).saturating_sub(seen.2.get(i).copied().unwrap_or(0))).collect();
            *seen = (e.count, e.sum_ns, e.buckets.clone());
            let Some(p) = self.procs.get_mut(&e.pid) else { continue };
            p.series.entry((metric, attrs)).or_insert_with(|| Hist::new(metric.bounds())).merge(&buckets, count, sum);
        }
    }

    /// A V8 garbage collection (every one, on every thread of the process).
    pub fn gc(&mut self, r: &GcRecord) {
        let attrs = vec![("v8js.gc.type", Val::Str(Cow::Borrowed(r.gc_type.name())))];
        self.add(r.pid, Metric::Gc, attrs, secs(r.start_ns, r.end_ns));
    }

    /// A finished HTTP request (its SERVER span's attributes that are
    /// bounded), and the calls it made.
    pub fn request(&mut self, f: &Finished) {
        if let Some((method, code)) = &f.rpc {
            self.add(f.pid, Metric::RpcServer, rpc_attrs(method, *code, semconv::grpc_server_error), secs(f.start_ns, f.end_ns));
            for c in &f.calls {
                self.call(f.pid, c);
            }
            return;
        }
        // Not by url.template: the requests the kernel follows unsampled
        // (metrics only) have no path, and the histogram is exact whatever
        // is sampled only with the same attributes for every request.
        let attrs = server_attrs(&f.method, f.tls, f.version, f.status);
        self.add(f.pid, Metric::HttpServer, attrs, secs(f.start_ns, f.end_ns));
        for c in &f.calls {
            self.call(f.pid, c);
        }
    }

    /// An unsampled request the kernel followed and uvspan ended (not
    /// answered whole, or its process gone).
    pub fn followed(&mut self, r: &FollowedRequest) {
        let attrs = server_attrs(followed_method(r.method), r.tls, followed_version(r.ver), r.status);
        self.add(r.pid, Metric::HttpServer, attrs, secs(r.start_ns, r.end_ns));
    }

    /// An outgoing HTTP call (a request's or a task's), over.
    pub fn call(&mut self, pid: u32, c: &FinishedCall) {
        if let Some((method, code)) = &c.rpc {
            // A client's view: every code but OK is an error.
            self.add(pid, Metric::RpcClient, rpc_attrs(method, *code, |c| c != 0), secs(c.start_ns, c.end_ns));
            return;
        }
        let mut attrs = vec![
            ("http.request.method", Val::Str(Cow::Borrowed(method(&c.method)))),
            ("url.scheme", Val::Str(Cow::Borrowed(if c.tls { "https" } else { "http" }))),
        ];
        if let Some((host, port)) = &c.server {
            attrs.push(("server.address", Val::Str(host.clone().into())));
            attrs.push(("server.port", Val::Int(i64::from(*port))));
        }
        if let Some(t) = &c.template {
            attrs.push(("url.template", Val::Str(t.clone().into())));
        }
        if let Some(code) = c.status {
            attrs.push(("http.response.status_code", Val::Int(i64::from(code))));
            if code >= 400 {
                attrs.push(("error.type", Val::Str(code.to_string().into())));
            }
        }
        attrs.sort();
        self.add(pid, Metric::HttpClient, attrs, secs(c.start_ns, c.end_ns));
    }

    /// What there is to export: per process with a resource, its series.
    /// `delta`: the series are reset after (and exited processes dropped
    /// either way).
    pub fn collect(&mut self, delta: bool) -> Vec<Collected> {
        let mut out = Vec::new();
        for p in self.procs.values_mut() {
            let Some(r) = &p.resource else { continue };
            let eventloop = p.loop_now.and_then(|now| EventLoop::between(p.loop_reported, now, delta));
            if p.series.is_empty() && eventloop.is_none() {
                continue;
            }
            let iterations = eventloop.and(p.loop_now).and_then(|now| {
                let base = p.loop_reported.filter(|r| delta && r.since_ns == now.since_ns).map(|r| r.iterations).unwrap_or_default();
                now.iterations.since(&base)
            });
            if eventloop.is_some() {
                p.loop_reported = p.loop_now;
            }
            let mut series: Vec<(Key, Hist)> =
                if delta { std::mem::take(&mut p.series).into_iter().collect() } else { p.series.clone().into_iter().collect() };
            series.extend(iterations.map(|h| ((Metric::LoopIteration, Vec::new()), h)));
            out.push(Collected { resource: r.clone(), series, eventloop });
        }
        self.procs.retain(|_, p| !p.exited);
        let procs = &self.procs;
        self.kernel_seen.retain(|k, _| procs.contains_key(&k.0));
        out
    }
}

#[cfg(test)]
mod tests;
