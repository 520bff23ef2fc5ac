//! Export to the backends people use: TLS with a private CA, mutual TLS,
//! certificate problems named, gzip on the wire, per-signal endpoints,
//! OTEL_TRACES_EXPORTER=none, the standard samplers and their tail
//! exceptions, --min-duration, the metrics of everything uvspan sees, and
//! the --otlp-listen forwarder over TLS — against a collector of the test's
//! own that speaks OTLP over rustls (tests/common/collector.rs).

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::collector::{histogram_buckets, histogram_count, histogram_points, metric_values, Ca, Collector, Issued, Listen};
use common::*;

/// A node app whose work uvspan sees: fs and a DNS lookup, then exit.
const APP: &str = "const fs=require('fs');for(let i=0;i<5;i++)fs.statSync('/');\
                   require('dns').lookup('localhost',()=>fs.stat('/',()=>{}))";

/// Runs `uvspan -- node -e APP` with these variables.
fn traced(vars: &[(&str, &str)]) -> Output {
    let mut c = uvspan_cmd(["--status-interval", "0", "--loop-threshold", "10m", "--", "node", "-e", APP]);
    c.envs(vars.iter().copied());
    run(c)
}

struct Pki {
    dir: TempDir,
    ca: Ca,
    ca_file: String,
}

impl Pki {
    fn new(tag: &str) -> Pki {
        let dir = TempDir::new(tag);
        let ca = Ca::new("uvspan test CA");
        let ca_file = ca.write(dir.path(), "ca.pem").display().to_string();
        Pki { dir, ca, ca_file }
    }

    fn server(&self, names: &[&str], expired: bool) -> Issued {
        self.ca.issue(self.dir.path(), if expired { "expired" } else { "server" }, names, expired)
    }
}

fn proto_of(p: Protocol) -> &'static str {
    p.flag()
}

/// Every span the collector got, and the fs spans among them.
fn fs_spans(c: &Collector) -> usize {
    c.spans().iter().filter(|s| s.name.starts_with("fs.")).count()
}

fn tls_with_a_private_ca(p: Protocol) {
    require_root();
    let pki = Pki::new("tls-ca");
    let server = pki.server(&["localhost", "127.0.0.1"], false);
    let col = Collector::start(Listen::Tls { server: &server, clients: None });
    for host in ["127.0.0.1", "localhost"] {
        let before = col.spans().len();
        let ep = format!("https://{host}:{}", col.port());
        let out = traced(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &ep),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", proto_of(p)),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &pki.ca_file),
        ]);
        assert_eq!(out.code(), Some(0), "{}", out.context());
        let got = col.spans().len() - before;
        assert!(fs_spans(&col) >= 6, "the app's fs spans arrived over TLS ({host})\n{}", out.context());
        check_summary(&out, got);
    }
    // uvspan's own metrics go the same way (exported at exit).
    assert!(col.metric_names().iter().any(|m| m == "uvspan.spans.exported"), "metrics over TLS: {:?}", col.metric_names());
    let paths: BTreeSet<String> = col.requests().iter().map(|g| g.path.clone()).collect();
    let want = match p {
        Protocol::Grpc => "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        Protocol::HttpProtobuf => "/v1/traces",
    };
    assert!(paths.contains(want), "{paths:?}");
}

#[test]
fn grpc_over_tls_with_a_private_ca() {
    tls_with_a_private_ca(Protocol::Grpc);
}

#[test]
fn http_over_tls_with_a_private_ca() {
    tls_with_a_private_ca(Protocol::HttpProtobuf);
}

#[test]
fn mutual_tls_and_the_refusal_without_a_client_certificate() {
    require_root();
    let pki = Pki::new("mtls");
    let server = pki.server(&["127.0.0.1"], false);
    let client_ca = Ca::new("uvspan test client CA");
    let client = client_ca.issue(pki.dir.path(), "client", &["uvspan-client"], false);
    let col = Collector::start(Listen::Tls { server: &server, clients: Some(&client_ca) });
    let ep = format!("https://127.0.0.1:{}", col.port());
    for p in [Protocol::Grpc, Protocol::HttpProtobuf] {
        let before = col.spans().len();
        let (cert, key) = (client.cert.display().to_string(), client.key.display().to_string());
        let out = traced(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &ep),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", p.flag()),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &pki.ca_file),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &cert),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &key),
        ]);
        assert_eq!(out.code(), Some(0), "{}", out.context());
        check_summary(&out, col.spans().len() - before);
        assert!(col.spans().len() - before >= 6, "{:?}: spans over mutual TLS\n{}", p, out.context());

        // Without a client certificate: refused, said in one line, counted.
        let before = col.spans().len();
        let out = traced(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &ep),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", p.flag()),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &pki.ca_file),
        ]);
        assert_eq!(out.code(), Some(0), "tracing goes on: the app's exit code\n{}", out.context());
        assert_eq!(col.spans().len(), before, "nothing arrived without a client certificate");
        let line = export_failure(&out);
        assert!(line.contains("client certificate"), "{p:?}: {line}\n{}", out.context());
        let sum = summary(&out.stderr);
        assert!(sum.failed >= 6 && sum.exported == 0, "{p:?}: the spans are counted failed\n{}", out.context());
        assert!(!out.stderr.contains("panicked"), "{}", out.context());
    }
}

/// uvspan's one line about a failed export.
fn export_failure(out: &Output) -> String {
    let lines: Vec<&str> = out.stderr.lines().filter(|l| l.contains("export failed")).collect();
    assert_eq!(lines.len(), 1, "one line about the failure\n{}", out.context());
    lines[0].to_string()
}

#[test]
fn certificate_problems_are_named_and_counted() {
    require_root();
    let pki = Pki::new("badcert");
    let good = pki.server(&["127.0.0.1"], false);
    let expired = pki.server(&["127.0.0.1"], true);
    let other = Ca::new("somebody else's CA");
    let other_file = other.write(pki.dir.path(), "other.pem").display().to_string();
    let wrong_name = pki.ca.issue(pki.dir.path(), "elsewhere", &["collector.example"], false);
    let cases: [(&Issued, &str, &str); 3] = [
        (&good, &other_file, "CA uvspan does not trust"),
        (&expired, &pki.ca_file, "expired"),
        (&wrong_name, &pki.ca_file, "not for the endpoint's host name"),
    ];
    for (server, ca, says) in cases {
        let col = Collector::start(Listen::Tls { server, clients: None });
        for p in [Protocol::Grpc, Protocol::HttpProtobuf] {
            let ep = format!("https://127.0.0.1:{}", col.port());
            let out = traced(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", &ep),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", p.flag()),
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca),
            ]);
            assert_eq!(out.code(), Some(0), "{}", out.context());
            let line = export_failure(&out);
            assert!(line.contains(says), "{p:?} expected {says:?}: {line}");
            let sum = summary(&out.stderr);
            assert!(sum.failed >= 6 && sum.unflushed == 0, "{p:?}: counted failed at once, not left queued\n{}", out.context());
            assert!(col.spans().is_empty());
        }
    }
}

#[test]
fn gzip_on_the_wire_for_both_protocols() {
    require_root();
    for p in [Protocol::Grpc, Protocol::HttpProtobuf] {
        let col = Collector::start(Listen::Plain);
        let ep = format!("http://127.0.0.1:{}", col.port());
        let out = traced(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &ep),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", p.flag()),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ]);
        assert_eq!(out.code(), Some(0), "{}", out.context());
        check_summary(&out, col.spans().len());
        let reqs = col.requests();
        assert!(reqs.iter().any(|g| g.is_traces()) && reqs.iter().any(|g| g.is_metrics()), "{p:?}: traces and metrics arrived");
        for g in &reqs {
            assert!(g.gzip, "{p:?} {}: compressed on the wire ({:?})", g.path, g.headers);
            let (name, value) = if p == Protocol::Grpc { ("grpc-encoding", "gzip") } else { ("content-encoding", "gzip") };
            assert_eq!(g.header(name), Some(value), "{p:?} {}", g.path);
        }
        // Per signal: traces compressed, metrics not.
        let col = Collector::start(Listen::Plain);
        let ep = format!("http://127.0.0.1:{}", col.port());
        let out = traced(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &ep),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", p.flag()),
            ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip"),
        ]);
        assert_eq!(out.code(), Some(0), "{}", out.context());
        for g in col.requests() {
            assert_eq!(g.gzip, g.is_traces(), "{p:?} {}", g.path);
        }
    }
}

#[test]
fn per_signal_endpoints_are_used_as_given() {
    require_root();
    let col = Collector::start(Listen::Plain);
    let base = format!("http://127.0.0.1:{}", col.port());
    let out = traced(&[
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &format!("{base}/ingest/spans")),
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", &format!("{base}/ingest/metrics")),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-tenant=traces%20team"),
    ]);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let reqs = col.requests();
    let paths: BTreeSet<&str> = reqs.iter().map(|g| g.path.as_str()).collect();
    assert_eq!(paths, BTreeSet::from(["/ingest/spans", "/ingest/metrics"]), "no /v1/... appended to a per-signal endpoint");
    for g in &reqs {
        let tenant = if g.path == "/ingest/spans" { Some("traces team") } else { None };
        assert_eq!(g.header("x-tenant"), tenant, "{}: per-signal headers", g.path);
    }
    check_summary(&out, count_spans(&reqs, "/ingest/spans"));
}

fn count_spans(reqs: &[common::collector::Got], path: &str) -> usize {
    reqs.iter()
        .filter(|g| g.path == path)
        .map(|g| {
            let r =
                <opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest as prost::Message>::decode(g.body.as_ref())
                    .expect("traces");
            flatten(&r.resource_spans).len()
        })
        .sum()
}

#[test]
fn traces_exporter_none_exports_no_span_and_says_so() {
    require_root();
    let col = Collector::start(Listen::Plain);
    let ep = format!("http://127.0.0.1:{}", col.port());
    let out = traced(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &ep), ("OTEL_TRACES_EXPORTER", "none")]);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    assert!(col.requests().iter().all(|g| !g.is_traces()), "no traces request");
    assert!(col.metric_names().iter().any(|m| m == "uvspan.loop.iterations"), "the collector was there: metrics arrived");
    assert!(out.stderr.contains("no span is sent anywhere (OTEL_TRACES_EXPORTER=none)"), "{}", out.context());
    assert!(!out.stdout.contains("fs.stat"), "nor printed\n{}", out.context());
    let out = traced(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &ep), ("OTEL_SDK_DISABLED", "true")]);
    assert!(out.stderr.contains("(OTEL_SDK_DISABLED=true)"), "{}", out.context());
    assert!(col.requests().iter().all(|g| !g.is_traces()));
    let out = traced(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &ep), ("OTEL_TRACES_EXPORTER", "zipkin")]);
    assert_eq!(out.code(), Some(2), "{}", out.context());
    assert!(out.stderr.trim().lines().count() == 1 && out.stderr.contains("use otlp, console or none"), "{}", out.context());
}

// ---------------------------------------------------------------------------
// Samplers
// ---------------------------------------------------------------------------

const N: usize = 200;

/// The requests fixture (tests/fixtures/requests_server.js) under a sampler:
/// request i has no traceparent when i % 4 == 0, else one flagged sampled —
/// or, with `odd_unsampled`, flagged not sampled when i is odd.
fn sampled_run(tag: &str, sampler: &str, arg: &str, odd_unsampled: bool) -> (Output, Vec<Span>, BTreeMap<usize, Option<String>>) {
    let mut env = vec![("OTEL_TRACES_SAMPLER", sampler), ("OTEL_TRACES_SAMPLER_ARG", arg)];
    if odd_unsampled {
        env.push(("FIXTURE_UNSAMPLED_ODD", "1"));
    }
    requests_run(tag, &[], &env)
}

/// The requests fixture (N requests) under uvspan with these flags and
/// variables, exporting to a collector of its own: the output, the spans,
/// and each request's traceparent as the fixture sent it.
fn requests_run(tag: &str, flags: &[&str], env: &[(&str, &str)]) -> (Output, Vec<Span>, BTreeMap<usize, Option<String>>) {
    let col = Collector::start(Listen::Plain);
    let dir = TempDir::new(tag);
    let ep = format!("http://127.0.0.1:{}", col.port());
    let (script, d, n) = (fixture("requests_server.js"), dir.str(), N.to_string());
    let mut args = vec!["--loop-threshold", "10m", "--status-interval", "0"];
    args.extend(flags);
    args.extend(["--", "node", &script, &d, &n, "8"]);
    let mut c = uvspan_cmd(&args);
    c.env("OTEL_EXPORTER_OTLP_ENDPOINT", &ep).envs(env.iter().copied());
    let out = run(c);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let spans = col.spans();
    check_summary(&out, spans.len());
    let sent = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("{\"marker\":\"req\""))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("req marker");
            (v["i"].as_u64().expect("i") as usize, v["traceparent"].as_str().map(str::to_string))
        })
        .collect::<BTreeMap<_, _>>();
    assert_eq!(sent.len(), N, "{}", out.context());
    (out, spans, sent)
}

/// The requests kept (by SERVER span), each checked complete (its five
/// operations under it), and no span without its parent.
fn kept_requests(spans: &[Span], sent: &BTreeMap<usize, Option<String>>) -> BTreeSet<usize> {
    let ids: BTreeSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let remote: BTreeSet<String> = sent.values().flatten().map(|tp| tp.split('-').nth(2).expect("parent id").to_string()).collect();
    for s in spans {
        assert!(
            s.parent_span_id.is_empty() || ids.contains(s.parent_span_id.as_str()) || remote.contains(&s.parent_span_id),
            "an orphan: {}",
            s.brief()
        );
    }
    let mut kept = BTreeSet::new();
    for srv in spans.iter().filter(|s| s.kind == 2) {
        let i: usize = srv.str("url.path").and_then(|p| p.trim_start_matches("/r/").parse().ok()).expect("/r/<i>");
        let work = spans.iter().filter(|s| s.parent_span_id == srv.span_id && s.trace_id == srv.trace_id).count();
        assert!(work >= 5, "request {i} kept whole: {work} operations under it\n{}", srv.brief());
        kept.insert(i);
    }
    kept
}

#[test]
fn traceidratio_keeps_its_share_of_requests_whole() {
    require_root();
    let (out, spans, sent) = sampled_run("ratio", "traceidratio", "0.25", true);
    let kept = kept_requests(&spans, &sent);
    // Binomial(200, 0.25): mean 50, sd 6.1; ±4 sd.
    assert!((26..=74).contains(&kept.len()), "{} of {N} requests kept at 0.25\n{}", kept.len(), out.context());
    // Not parent-based: requests whose caller did not sample are kept too.
    assert!(kept.iter().any(|i| i % 2 == 1), "the caller's flag is ignored by traceidratio");
    assert_eq!(summary_number(&out.stderr, " not sampled, not exported"), (N - kept.len()) as u64, "{}", out.context());
    assert!(out.stderr.contains("sampler traceidratio 0.25:"), "{}", out.context());
}

#[test]
fn parent_based_follows_the_callers_flag() {
    require_root();
    // Roots dropped (ratio 0): only requests whose caller sampled them are kept.
    let (out, spans, sent) = sampled_run("parent", "parentbased_traceidratio", "0", true);
    let kept = kept_requests(&spans, &sent);
    let want: BTreeSet<usize> = (0..N).filter(|i| i % 4 == 2).collect();
    assert_eq!(kept, want, "kept: the requests flagged sampled by their caller\n{}", out.context());
    assert!(spans.iter().all(|s| s.kind == 2 || kept_trace(&spans, s)), "no work outside the kept requests (background work: ratio 0)");
    // always_on keeps even what the caller did not sample.
    let (out, spans, sent) = sampled_run("always", "always_on", "", true);
    assert_eq!(kept_requests(&spans, &sent).len(), N, "{}", out.context());
    // always_off: nothing.
    let (out, spans, _) = sampled_run("off", "always_off", "", false);
    assert!(spans.is_empty(), "{}", out.context());
}

fn kept_trace(spans: &[Span], s: &Span) -> bool {
    spans.iter().any(|srv| srv.kind == 2 && srv.trace_id == s.trace_id)
}

// ---------------------------------------------------------------------------
// The forwarder
// ---------------------------------------------------------------------------

/// A free port below the kernel's ephemeral range (32768 up): no outgoing
/// connection of a test running beside this one takes it meanwhile.
fn port_outside_the_ephemeral_range(offset: u16) -> u16 {
    let start = 20_000 + (std::process::id() % 5_000) as u16 + offset;
    (start..32_000).find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok()).expect("a free port")
}

#[test]
fn the_otlp_listen_forwarder_goes_over_tls_too() {
    require_root();
    let pki = Pki::new("fwd-tls");
    let server = pki.server(&["127.0.0.1"], false);
    let col = Collector::start(Listen::Tls { server: &server, clients: None });
    let ep = format!("https://127.0.0.1:{}", col.port());
    // The app posts one OTLP span to uvspan's listener, then exits.
    let body = {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span as PbSpan};
        let span = PbSpan { trace_id: vec![9; 16], span_id: vec![9; 8], name: "app-span".into(), kind: 2, ..Default::default() };
        let rs = ResourceSpans { scope_spans: vec![ScopeSpans { spans: vec![span], ..Default::default() }], ..Default::default() };
        prost::Message::encode_to_vec(&ExportTraceServiceRequest { resource_spans: vec![rs] })
    };
    let dir = TempDir::new("fwd-tls-body");
    let file = dir.path().join("body.bin");
    std::fs::write(&file, &body).expect("write the body");
    let app = |listen: u16| {
        format!(
        "const b=require('fs').readFileSync({:?});const r=require('http').request({{host:'127.0.0.1',port:{listen},path:'/v1/traces',method:'POST',\
         headers:{{'content-type':'application/x-protobuf'}}}},res=>{{res.resume();res.on('end',()=>console.log('status',res.statusCode))}});r.end(b)",
        file.display().to_string()
    )
    };
    for (p, offset) in [(Protocol::Grpc, 0), (Protocol::HttpProtobuf, 1)] {
        // A port of its own per run (the last run's socket may close late).
        let listen = port_outside_the_ephemeral_range(offset * 100);
        let listen_addr = format!("127.0.0.1:{listen}");
        let before = col.spans().iter().filter(|s| s.name == "app-span").count();
        let mut c = uvspan_cmd(["--status-interval", "0", "--otlp-listen", &listen_addr, "--", "node", "-e", &app(listen)]);
        c.envs([
            ("OTEL_EXPORTER_OTLP_ENDPOINT", ep.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", p.flag()),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", pki.ca_file.as_str()),
        ]);
        let out = run(c);
        assert_eq!(out.code(), Some(0), "{}", out.context());
        assert!(out.stdout.contains("status 200"), "the listener took the app's request\n{}", out.context());
        let after = col.spans().iter().filter(|s| s.name == "app-span").count();
        assert_eq!(after - before, 1, "{p:?}: the app's span forwarded over TLS\n{}", out.context());
    }
}

// ---------------------------------------------------------------------------
// Topologies
// ---------------------------------------------------------------------------

/// TLS export where users run uvspan: uvspan and the app in one PID+mount
/// namespace of their own (a sidecar, a CI job container), and the app alone
/// in its own (uvspan on the host, the app started in a new namespace).
#[test]
fn tls_export_from_non_host_pid_and_mount_namespaces() {
    require_root();
    require_tool("unshare", "it makes the PID and mount namespaces (util-linux; scripts/setup.sh installs it)");
    let pki = Pki::new("tls-ns");
    let server = pki.server(&["127.0.0.1"], false);
    let col = Collector::start(Listen::Tls { server: &server, clients: None });
    let ep = format!("https://127.0.0.1:{}", col.port());
    let ns = ["--pid", "--fork", "--mount", "--mount-proc"];
    let uvspan = [uvspan_bin(), "--status-interval", "0", "--loop-threshold", "10m"];
    // Both inside: unshare … uvspan … -- node; the app alone: uvspan … -- unshare … node.
    let both: Vec<&str> = ns.iter().chain(&uvspan).chain(&["--", "node", "-e", APP]).copied().collect();
    let app_alone: Vec<&str> = uvspan[1..].iter().chain(&["--", "unshare"]).chain(&ns).chain(&["node", "-e", APP]).copied().collect();
    for (name, program, args) in [("both in one namespace", "unshare", both), ("the app alone", uvspan_bin(), app_alone)] {
        let before = col.spans().len();
        let mut c = std::process::Command::new(program);
        scrub_env(&mut c);
        c.args(&args).stdin(std::process::Stdio::null());
        c.envs([("OTEL_EXPORTER_OTLP_ENDPOINT", ep.as_str()), ("OTEL_EXPORTER_OTLP_CERTIFICATE", pki.ca_file.as_str())]);
        let out = run(c);
        assert_eq!(out.code(), Some(0), "{name}\n{}", out.context());
        let got = col.spans().len() - before;
        check_summary(&out, got);
        let fs = col.spans()[before..].iter().filter(|s| s.name.starts_with("fs.")).count();
        assert!(fs >= 6, "{name}: the app's fs spans over TLS ({fs})\n{}", out.context());
    }
}

// ---------------------------------------------------------------------------
// Metrics of everything uvspan sees
// ---------------------------------------------------------------------------

/// Over both protocols: the same counts, decoded by the test's receiver.
#[test]
fn metrics_count_every_request_and_operation_whatever_the_sampler() {
    for protocol in ["grpc", "http/protobuf"] {
        metrics_count_every_request_and_operation_over(protocol);
    }
}

fn metrics_count_every_request_and_operation_over(protocol: &str) {
    require_root();
    let col = Collector::start(Listen::Plain);
    let dir = TempDir::new("metrics");
    let ep = format!("http://127.0.0.1:{}", col.port());
    let args = [
        "--loop-threshold",
        "10m",
        "--status-interval",
        "0",
        "--detail",
        "threadpool",
        "--",
        "node",
        &fixture("requests_server.js"),
        &dir.str(),
        "200",
        "8",
    ];
    let mut c = uvspan_cmd(args);
    c.envs([
        ("OTEL_EXPORTER_OTLP_ENDPOINT", ep.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        ("OTEL_TRACES_SAMPLER", "always_off"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
    ]);
    let out = run(c);
    assert_eq!(out.code(), Some(0), "{protocol}\n{}", out.context());
    let want_path = if protocol == "grpc" { "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export" } else { "/v1/metrics" };
    assert!(col.requests().iter().filter(|g| g.is_metrics()).all(|g| g.path == want_path), "{protocol}: metrics on {want_path}");
    assert!(col.spans().is_empty(), "always_off: no span");
    let count = |name: &str, want: &[(&str, &str)]| histogram_count(&col, name, want);
    let ok = [("http.request.method", "GET"), ("http.response.status_code", "200"), ("url.scheme", "http")];
    assert_eq!(count("http.server.request.duration", &ok), N as u64, "every request, none sampled ({protocol})\n{}", out.context());
    assert_eq!(count("http.server.request.duration", &[]), N as u64);
    assert_eq!(count("dns.lookup.duration", &[]), N as u64, "one lookup per request");
    assert_eq!(count("uvspan.fs.duration", &[("uvspan.fs.operation", "fs.access")]), N as u64, "one fs.access per request");
    // One fs.statSync per request, and node's own while it loads the script.
    let sync_stats = count("uvspan.fs.duration", &[("uvspan.fs.operation", "fs.stat"), ("uvspan.fs.sync", "true")]);
    assert!((N as u64..=N as u64 + 3).contains(&sync_stats), "{sync_stats} sync fs.stat for {N} requests");
    // With --detail threadpool, each async job's wait in the queue.
    let waits = |work: &str| count("uvspan.threadpool.queue.duration", &[("uvspan.threadpool.work", work)]);
    assert_eq!(waits("dns"), N as u64, "every lookup waited in the threadpool's queue");
    let async_fs = count("uvspan.fs.duration", &[("uvspan.fs.sync", "false")]);
    assert_eq!(waits("fs"), async_fs, "every async fs operation waited in the threadpool's queue");
    let points = histogram_points(&col, "http.server.request.duration");
    assert!(points.iter().all(|(_, _, r)| r.contains_key("process.pid") && r.contains_key("service.name")), "the process's resource");
}

/// The event loop's time and utilization, as the kernel counts it (time
/// blocked in epoll waits is idle), against Node's own
/// performance.eventLoopUtilization() over the same run.
fn event_loop_utilization_in(topology: Topology) {
    require_root();
    // busy: setImmediate callbacks that spin 40 ms each; idle: a timer every 100 ms.
    let app = |busy: bool| {
        format!(
            "const {{performance}}=require('perf_hooks');const t0=Date.now();const busy={busy};\
             function step(){{if(Date.now()-t0>3000){{const e=performance.eventLoopUtilization();\
             console.log(JSON.stringify({{marker:'elu',u:e.utilization}}));return}}\
             if(busy){{const s=Date.now();while(Date.now()-s<40){{}}setImmediate(step)}}else setTimeout(step,100)}}\
             setTimeout(step,1)"
        )
    };
    for busy in [true, false] {
        let col = Collector::start(Listen::Plain);
        let ep = format!("http://127.0.0.1:{}", col.port());
        let script = app(busy);
        let mut c = topology.command(&["--status-interval", "0"], &["node", "-e", &script]);
        c.envs([("OTEL_EXPORTER_OTLP_ENDPOINT", ep.as_str()), ("OTEL_METRIC_EXPORT_INTERVAL", "500")]);
        let out = run(c);
        assert_eq!(out.code(), Some(0), "{topology:?}\n{}", out.context());
        let node_u = Markers::parse(&out.stdout).f64("elu", "u");
        let v = metric_values(&col, &["nodejs.eventloop.time", "nodejs.eventloop.utilization"]);
        let at = |k: &str| v.get(k).copied().unwrap_or(0.0);
        let (active, idle) = (at("nodejs.eventloop.time/active"), at("nodejs.eventloop.time/idle"));
        assert!(active + idle > 0.0, "busy={busy} {topology:?}: the loop's time was exported: {v:?}\n{}", out.context());
        let u = active / (active + idle);
        assert!((u - node_u).abs() < 0.1, "busy={busy} {topology:?}: uvspan's utilization {u:.3} vs node's own {node_u:.3} ({v:?})");
        assert!(if busy { u > 0.8 } else { u < 0.2 }, "busy={busy} {topology:?}: {u:.3}");
        assert!((0.0..=1.0).contains(&v["nodejs.eventloop.utilization"]));
    }
}

#[test]
fn event_loop_utilization_agrees_with_nodes_own() {
    event_loop_utilization_in(Topology::Host);
}

#[test]
fn event_loop_utilization_agrees_with_nodes_own_in_one_namespace() {
    event_loop_utilization_in(Topology::BothInOne);
}

/// The app alone in its namespace: uvspan attaches once it sees node's exec,
/// while node runs; both loops are uniform, so what it missed does not
/// change the share.
#[test]
fn event_loop_utilization_agrees_with_nodes_own_app_alone() {
    event_loop_utilization_in(Topology::AppAlone);
}

/// Every loop iteration, reported as a span or not, is counted in the
/// kernel's histogram of iteration busy times, up to the process's exit
/// (its last interval comes with the exit record); in every topology.
fn iteration_histogram_in(topology: Topology) {
    require_root();
    // 20 iterations that spin 40 ms each (a setImmediate chain), then 40
    // short timer iterations. They start after a second: with the app alone
    // in its namespace, uvspan attaches only once it sees node's exec (under
    // `unshare`), while node runs; what ran before is not seen (here, or in
    // the summary).
    let script = "let n=0;const spin=()=>{const s=Date.now();while(Date.now()-s<40){}if(++n<20)setImmediate(spin);\
                  else{let m=0;const t=()=>{if(++m<40)setTimeout(t,2)};setTimeout(t,2)}};setTimeout(spin,1000)";
    let col = Collector::start(Listen::Plain);
    let ep = format!("http://127.0.0.1:{}", col.port());
    let mut c = topology.command(&["--status-interval", "0"], &["node", "-e", script]);
    c.envs([
        ("OTEL_EXPORTER_OTLP_ENDPOINT", ep.as_str()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
    ]);
    let out = run(c);
    let ctx = format!("{topology:?}\n{}", out.context());
    assert_eq!(out.code(), Some(0), "{ctx}");
    let (buckets, bounds) = histogram_buckets(&col, "uvspan.eventloop.iteration.duration");
    assert_eq!(buckets.len(), bounds.len() + 1, "{buckets:?} {bounds:?}\n{ctx}");
    // The 40 ms spins are the iterations over 25.6 ms (a timer iteration
    // that long would have to wait that long for a CPU).
    let over = bounds.iter().position(|b| *b >= 0.0256).expect("a 25.6 ms bound") + 1;
    let slow: u64 = buckets[over..].iter().sum();
    assert!((20..=22).contains(&slow), "{slow} iterations over 25.6 ms for 20 spins: {buckets:?}\n{ctx}");
    // Every iteration the summary counts, exactly.
    let total: u64 = buckets.iter().sum();
    let counted = summary_number(&out.stderr, " loop iterations");
    assert_eq!(total, counted, "the histogram counts every iteration the summary does: {buckets:?}\n{ctx}");
    assert!(total >= 60, "20 spins and 40 timers are 60 iterations at least: {total}\n{ctx}");
}

#[test]
fn every_loop_iteration_is_in_the_iteration_histogram() {
    iteration_histogram_in(Topology::Host);
}

#[test]
fn every_loop_iteration_is_in_the_iteration_histogram_in_one_namespace() {
    iteration_histogram_in(Topology::BothInOne);
}

#[test]
fn every_loop_iteration_is_in_the_iteration_histogram_app_alone() {
    iteration_histogram_in(Topology::AppAlone);
}

/// Tail exceptions: under always_off, the failed requests (--keep-errors)
/// or the slow ones (--keep-slower-than) are exported whole anyway.
#[test]
fn failed_and_slow_requests_are_kept_whatever_the_sampler() {
    require_root();
    let env = [("OTEL_TRACES_SAMPLER", "always_off"), ("FIXTURE_FAIL_EVERY", "5")];
    let run_with = |tag: &str, flags: &[&str]| requests_run(tag, flags, &env);
    let (out, spans, sent) = run_with("tail-errors", &["--keep-errors"]);
    let kept = kept_requests(&spans, &sent);
    let failed: BTreeSet<usize> = (0..N).filter(|i| i % 5 == 0).collect();
    assert_eq!(kept, failed, "exactly the failed requests, whole\n{}", out.context());
    assert!(out.stderr.contains(&format!("{} not sampled but kept", failed.len())), "{}", out.context());
    // Slower than 0: every request; slower than ten minutes: none.
    let (out, spans, sent) = run_with("tail-slow", &["--keep-slower-than", "0"]);
    assert_eq!(kept_requests(&spans, &sent).len(), N, "{}", out.context());
    let (out, spans, _) = run_with("tail-none", &["--keep-slower-than", "10m"]);
    assert!(spans.is_empty(), "{}", out.context());
}

/// --min-duration: fs and DNS operations outside requests shorter than it
/// are not exported but counted, in the summary and still in the metrics.
#[test]
fn min_duration_drops_short_background_operations_and_counts_them() {
    require_root();
    let col = Collector::start(Listen::Plain);
    let ep = format!("http://127.0.0.1:{}", col.port());
    let mut c = uvspan_cmd(["--status-interval", "0", "--loop-threshold", "10m", "--min-duration", "10m", "--", "node", "-e", APP]);
    c.envs([("OTEL_EXPORTER_OTLP_ENDPOINT", ep.as_str()), ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")]);
    let out = run(c);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let spans = col.spans();
    assert!(spans.iter().all(|s| !s.name.starts_with("fs.") && !s.name.starts_with("dns.")), "none exported\n{}", out.context());
    let short = summary_number(&out.stderr, " operations outside requests shorter than --min-duration not exported");
    let counted: u64 =
        ["uvspan.fs.duration", "dns.lookup.duration"].iter().flat_map(|m| histogram_points(&col, m)).map(|(_, n, _)| n).sum();
    assert!(short >= 7, "the app's 5 statSync, its stat and its lookup at least: {short}\n{}", out.context());
    assert_eq!(short, counted, "what was dropped, the metrics still count");
    // Without it, they are exported.
    let col = Collector::start(Listen::Plain);
    let ep = format!("http://127.0.0.1:{}", col.port());
    let out = traced(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &ep)]);
    assert!(!out.stderr.contains("--min-duration"), "{}", out.context());
    assert!(col.spans().iter().filter(|s| s.name.starts_with("fs.") || s.name.starts_with("dns.")).count() >= 7);
}

// ---------------------------------------------------------------------------
// The sampler in the kernel
// ---------------------------------------------------------------------------

/// Requests of the sampler-in-the-kernel runs: at 0.1, 100 kept on average
/// (sd 9.5), so 5–15% is over ±5 sd.
const KERNEL_N: usize = 1000;

/// tests/fixtures/requests_server.js on `node` serving KERNEL_N requests,
/// each reading a file and resolving a name, traced in `topology` under
/// `sampler`: the collector and the output.
fn ksample_run(node: &str, topology: Topology, sampler: &str, arg: &str) -> (Collector, Output) {
    require_root();
    let col = Collector::start(Listen::Plain);
    let dir = TempDir::new("ksample");
    let ep = format!("http://127.0.0.1:{}", col.port());
    let (script, n) = (fixture("requests_server.js"), KERNEL_N.to_string());
    let mut c = topology.command(&["--loop-threshold", "10m", "--status-interval", "0"], &[node, &script, &dir.str(), &n, "8"]);
    c.envs([
        ("OTEL_EXPORTER_OTLP_ENDPOINT", ep.as_str()),
        ("OTEL_TRACES_SAMPLER", sampler),
        ("OTEL_TRACES_SAMPLER_ARG", arg),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
        ("FIXTURE_WORK", "readfile"),
        // The app alone: uvspan attaches after node's exec, while it runs.
        ("FIXTURE_START_MS", if topology == Topology::AppAlone { "1000" } else { "100" }),
    ]);
    let out = run(c);
    (col, out)
}

/// The operations of ksample_run's KERNEL_N requests, each counted once in
/// the metrics: one lookup and fs.readFile's four async operations.
fn check_op_counts(col: &Collector, ctx: &str) {
    let n = KERNEL_N as u64;
    assert_eq!(histogram_count(col, "dns.lookup.duration", &[]), n, "one lookup per request\n{ctx}");
    for op in ["fs.open", "fs.fstat", "fs.read", "fs.close"] {
        let got = histogram_count(col, "uvspan.fs.duration", &[("uvspan.fs.operation", &format!("\"{op}\"")), ("uvspan.fs.sync", "false")]);
        assert_eq!(got, n, "one async {op} per request (fs.readFile)\n{ctx}");
    }
}

/// KERNEL_N requests, each reading a file (fs.readFile: open, fstat, read, close)
/// and resolving a name, under `sampler`: the metrics count every one of
/// them exactly, while the work of the requests the kernel's sampler dropped
/// sent no record (counted in the summary); the kept requests are whole.
/// Returns the SERVER spans kept.
fn kernel_sampled_in(topology: Topology, sampler: &str, arg: &str) -> Vec<Span> {
    let (col, out) = ksample_run("node", topology, sampler, arg);
    let ctx = format!("{topology:?} {sampler} {arg}\n{}", out.context());
    assert_eq!(out.code(), Some(0), "{ctx}");
    let n = KERNEL_N as u64;
    assert_eq!(histogram_count(&col, "http.server.request.duration", &[("http.response.status_code", "200")]), n, "every request\n{ctx}");
    check_op_counts(&col, &ctx);
    let spans = col.spans();
    let servers: Vec<Span> = spans.iter().filter(|s| s.kind == 2).cloned().collect();
    for srv in &servers {
        let work: Vec<&Span> = spans.iter().filter(|s| s.parent_span_id == srv.span_id && s.trace_id == srv.trace_id).collect();
        assert_eq!(work.len(), 5, "a kept request is whole (4 fs, 1 DNS): {}\n{ctx}", srv.brief());
    }
    // The kernel sent no record of the dropped requests' work, and says so.
    let dropped = n - servers.len() as u64;
    let counted = summary_number(&out.stderr, " operations of unsampled traces counted in the kernel");
    assert_eq!(counted, 5 * dropped, "the work of the {dropped} dropped requests, counted in the kernel\n{ctx}");
    // And the dropped requests themselves: followed in the kernel to their
    // end, no record sent.
    let followed = summary_number(&out.stderr, " of them followed in the kernel");
    assert_eq!(followed, dropped, "the {dropped} dropped requests, followed in the kernel\n{ctx}");
    servers
}

/// The trace id's 56 low bits: what traceidratio decides by.
fn low56(trace_id: &str) -> u64 {
    u64::from_str_radix(&trace_id[18..], 16).expect("hex trace id")
}

fn traceidratio_in_the_kernel(topology: Topology) {
    let servers = kernel_sampled_in(topology, "traceidratio", "0.1");
    let kept = servers.len() as f64 / KERNEL_N as f64;
    assert!((0.05..=0.15).contains(&kept), "{} of {KERNEL_N} requests kept at 0.1 ({topology:?})", servers.len());
    // Kept by the rule the specification gives, whether the trace id came
    // with the request or uvspan made it from the kernel's decision.
    let threshold = ((1.0 - 0.1) * (1u64 << 56) as f64).round() as u64;
    for s in &servers {
        assert!(low56(&s.trace_id) >= threshold, "{} kept against the ratio ({topology:?})", s.brief());
    }
}

#[test]
fn traceidratio_is_decided_in_the_kernel_and_metrics_stay_exact() {
    traceidratio_in_the_kernel(Topology::Host);
}

#[test]
fn traceidratio_is_decided_in_the_kernel_in_one_namespace() {
    traceidratio_in_the_kernel(Topology::BothInOne);
}

#[test]
fn traceidratio_is_decided_in_the_kernel_app_alone() {
    traceidratio_in_the_kernel(Topology::AppAlone);
}

fn always_off_in(topology: Topology) {
    let servers = kernel_sampled_in(topology, "always_off", "");
    assert!(servers.is_empty(), "always_off: no request kept ({topology:?})");
}

#[test]
fn always_off_sends_no_record_of_request_work_and_metrics_stay_exact() {
    always_off_in(Topology::Host);
}

#[test]
fn always_off_sends_no_record_of_request_work_in_one_namespace() {
    always_off_in(Topology::BothInOne);
}

#[test]
fn always_off_sends_no_record_of_request_work_app_alone() {
    always_off_in(Topology::AppAlone);
}

/// A stripped node (libuv's exported API only) under always_off: fs
/// requests end at uv_fs_req_cleanup and lookups at uv_freeaddrinfo, where
/// uvspan finds an unsampled one among those its thread keeps by its
/// result; the operation metrics stay exact.
#[test]
fn always_off_counts_every_operation_on_a_stripped_node() {
    let node = stripped_node().to_string_lossy().into_owned();
    let (col, out) = ksample_run(&node, Topology::Host, "always_off", "");
    let ctx = out.context();
    assert_eq!(out.code(), Some(0), "{ctx}");
    assert!(out.stderr.contains("uvspan:   DNS spans end at uv_freeaddrinfo"), "lookups end at uv_freeaddrinfo\n{ctx}");
    check_op_counts(&col, &ctx);
    assert!(col.spans().iter().all(|s| !s.name.starts_with("fs.") && !s.name.starts_with("dns.")), "always_off: no span\n{ctx}");
}

/// A run of tests/fixtures/followed.js under `sampler` (and `flags`): the
/// (attributes, count) series of `http.server.request.duration` and of the
/// `http.client.request.duration` of the call a request makes (to
/// upstream.test; the fixture's own client calls are not the point), the
/// requests the kernel followed, the spans and the output.
struct Followed {
    servers: BTreeMap<String, u64>,
    clients: BTreeMap<String, u64>,
    followed: u64,
    spans: Vec<Span>,
    out: Output,
}

/// Requests followed.js sends.
const FOLLOWED_N: u64 = 19;

fn followed_run(topology: Topology, sampler: &str, flags: &[&str]) -> Followed {
    require_root();
    let col = Collector::start(Listen::Plain);
    let ep = format!("http://127.0.0.1:{}", col.port());
    let certs = TempDir::new("followed");
    let (key, cert) = self_signed(&certs);
    let mut args = vec!["--loop-threshold", "10m", "--status-interval", "0"];
    args.extend(flags);
    let mut c = topology.command(&args, &["node", &fixture("followed.js"), &key, &cert]);
    c.envs([
        ("OTEL_EXPORTER_OTLP_ENDPOINT", ep.as_str()),
        ("OTEL_TRACES_SAMPLER", sampler),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
    ]);
    let out = run(c);
    let ctx = format!("{topology:?} {sampler}\n{}", out.context());
    assert_eq!(out.code(), Some(0), "{ctx}");
    assert_eq!(Markers::parse(&out.stdout).i64("done", "n"), FOLLOWED_N as i64, "{ctx}");
    let series = |name: &str| {
        let mut m = BTreeMap::new();
        for (attrs, n, _) in histogram_points(&col, name) {
            if name.starts_with("http.server") || attrs.get("server.address").is_some_and(|a| a.contains("upstream.test")) {
                *m.entry(format!("{attrs:?}")).or_default() += n;
            }
        }
        m
    };
    let followed = if out.stderr.contains(" of them followed in the kernel") {
        summary_number(&out.stderr, " of them followed in the kernel")
    } else {
        0
    };
    assert_eq!(summary_number(&out.stderr, " HTTP requests"), FOLLOWED_N, "{ctx}");
    Followed {
        servers: series("http.server.request.duration"),
        clients: series("http.client.request.duration"),
        followed,
        spans: col.spans(),
        out,
    }
}

/// Unsampled requests the kernel follows (no record sent) are in the HTTP
/// metrics exactly as the request tracker counts the requests it sees, one
/// by one: with a Content-Length body, in several writes, chunked, failed,
/// making a call, answered in part, never answered, a POST with a body, a
/// HEAD, HTTP/1.0, pipelined, a request line longer than the capture, over
/// HTTPS (pipelined too). What the kernel cannot end as the tracker does it hands over.
fn followed_requests_in(topology: Topology) {
    let got = followed_run(topology, "always_off", &[]);
    let want = followed_run(Topology::Host, "always_on", &[]);
    assert_eq!(want.followed, 0, "always_on follows no request in the kernel");
    assert_eq!(got.servers, want.servers, "{topology:?}: http.server.request.duration, followed (left) vs seen (right)");
    assert_eq!(got.clients, want.clients, "{topology:?}: http.client.request.duration of the call");
    assert_eq!(got.clients.values().sum::<u64>(), 1, "{:#?}", got.clients);
    assert_eq!(got.servers.values().sum::<u64>(), FOLLOWED_N, "{:#?}", got.servers);
    // /len, /big, /fail, /slow, /up, /partial, /never, the POST and HTTPS
    // /len; the rest are handed over (no Content-Length, a call, pipelined,
    // a long request line).
    assert_eq!(got.followed, 9, "{topology:?}: requests followed in the kernel\n{:#?}", got.servers);
    // The request line longer than the capture: its method from its first
    // word, its version not known (left out, not empty).
    let long = want.spans.iter().find(|s| s.kind == 2 && s.str("url.path").is_some_and(|p| p.starts_with("/longxx"))).expect("/long…");
    assert_eq!(long.str("http.request.method"), Some("GET"), "{}", long.brief());
    assert_eq!(long.str("network.protocol.version"), None, "{}", long.brief());
    assert!(got.servers.keys().any(|k| k.contains("GET") && !k.contains("network.protocol.version")), "{:#?}", got.servers);
}

/// A request's SERVER span as the tail exceptions compare them: its
/// method, path (cut), status, and the names of the spans under it.
fn server_shapes(spans: &[Span]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for srv in spans.iter().filter(|s| s.kind == 2) {
        let mut under: Vec<&str> =
            spans.iter().filter(|s| s.parent_span_id == srv.span_id && s.trace_id == srv.trace_id).map(|s| s.name.as_str()).collect();
        under.sort_unstable();
        let path: String = srv.str("url.path").unwrap_or("").chars().take(12).collect();
        let key = format!("{} {path} {:?} {under:?}", srv.name, srv.int("http.response.status_code"));
        *m.entry(key).or_default() += 1;
    }
    m
}

/// Tail exceptions decided in the kernel: under always_off, the requests
/// the rule keeps are exported whole, as user space keeps them from an
/// always_on run (the oracle, filtered by the same rule): a 500 the kernel
/// ends (a file read under it), a slow one, a 503 answered in part that
/// uvspan ends itself from what the kernel held, a chunked 502 the kernel
/// hands over (over HTTP and HTTPS); the others are followed in the kernel
/// and not exported, and the metrics stay exact. Which requests are slow
/// does not depend on the machine's load: /slow blocks for 400 ms, the
/// others take a few milliseconds, the rule's bound is halfway (200 ms).
fn tail_in_the_kernel(topology: Topology) {
    const SLOW_NS: u64 = 200_000_000;
    let flags = ["--keep-errors", "--keep-slower-than", "200ms"];
    let got = followed_run(topology, "always_off", &flags);
    let all = followed_run(Topology::Host, "always_on", &[]);
    let ctx = format!("{topology:?}\n{}", got.out.context());
    // The rule's duration is the request's last work: an unanswered one's
    // span lasts until it was given up (uvspan.http.ended_by), its rule not.
    let keeps = |s: &Span| {
        s.kind == 2
            && (s.int("http.response.status_code").is_some_and(|c| c >= 500)
                || (s.duration_ns() > SLOW_NS && s.str("uvspan.http.ended_by").is_none()))
    };
    let kept_ids: BTreeSet<(&str, &str)> =
        all.spans.iter().filter(|s| keeps(s)).map(|s| (s.trace_id.as_str(), s.span_id.as_str())).collect();
    let want: Vec<Span> = all
        .spans
        .iter()
        .filter(|s| {
            kept_ids.contains(&(s.trace_id.as_str(), s.span_id.as_str()))
                || kept_ids.iter().any(|k| k.0 == s.trace_id && k.1 == s.parent_span_id)
        })
        .cloned()
        .collect();
    let (got_shapes, want_shapes) = (server_shapes(&got.spans), server_shapes(&want));
    assert_eq!(got_shapes, want_shapes, "{topology:?}: the requests kept, whole (left) vs the rule on always_on (right)\n{ctx}");
    for p in ["/fail", "/slow", "/partial", "/chunked"] {
        assert!(got_shapes.keys().any(|k| k.contains(&format!(" {p} "))), "{p} kept: {got_shapes:#?}\n{ctx}");
    }
    assert!(got_shapes.values().sum::<usize>() >= 5, "{got_shapes:#?}");
    let kept = got_shapes.values().sum::<usize>() as u64;
    assert!(got.out.stderr.contains(&format!("{kept} not sampled but kept")), "{ctx}");
    // Ended in the kernel and not kept, their records never went up: /len,
    // /up, the POST, HTTPS /len and /big (its last writes come from a timer:
    // still its connection's, its request's); /partial and /never are not
    // answered whole: uvspan ends those.
    assert_eq!(got.followed, 5, "{topology:?}: requests followed in the kernel\n{ctx}");
    assert!(!got.out.stderr.contains("not held for the tail exceptions"), "{ctx}");
    assert_eq!(got.servers, all.servers, "{topology:?}: http.server.request.duration");
    assert_eq!(got.clients, all.clients, "{topology:?}: http.client.request.duration of the call");
}

#[test]
fn tail_exceptions_are_decided_in_the_kernel() {
    tail_in_the_kernel(Topology::Host);
}

#[test]
fn tail_exceptions_are_decided_in_the_kernel_in_one_namespace() {
    tail_in_the_kernel(Topology::BothInOne);
}

#[test]
fn tail_exceptions_are_decided_in_the_kernel_app_alone() {
    tail_in_the_kernel(Topology::AppAlone);
}

#[test]
fn followed_requests_count_as_the_tracker_does() {
    followed_requests_in(Topology::Host);
}

#[test]
fn followed_requests_count_as_the_tracker_does_in_one_namespace() {
    followed_requests_in(Topology::BothInOne);
}

#[test]
fn followed_requests_count_as_the_tracker_does_app_alone() {
    followed_requests_in(Topology::AppAlone);
}
