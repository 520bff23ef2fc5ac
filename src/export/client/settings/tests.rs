use super::*;

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: BTreeMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |k: &str| m.get(k).cloned()
}

fn file(yaml: &str) -> OtlpSection {
    serde_yaml_ng::from_str(yaml).expect("a valid otlp section")
}

fn plan_of(vars: &[(&str, &str)], f: Option<&OtlpSection>, flag: Option<&str>) -> Result<Plan> {
    let e = env(vars);
    plan(&Sources { env: &e, file: f, flag_endpoint: flag, flag_protocol: None })
}

fn traces(p: &Plan) -> &Settings {
    match &p.traces {
        Output::Otlp(s) => s,
        other => panic!("traces go to {other:?}"),
    }
}

fn metrics(p: &Plan) -> &Settings {
    match &p.metrics {
        Output::Otlp(s) => s,
        other => panic!("metrics go to {other:?}"),
    }
}

#[test]
fn endpoint_precedence_flag_signal_generic_file() {
    let f = file("endpoint: http://file:1\ntraces: {endpoint: 'http://file-traces:2/t'}\nprotocol: http/protobuf");
    let all = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:3"), ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4/custom")];
    // (variables, file, flag) → traces URL, metrics URL
    type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a OtlpSection>, Option<&'a str>, &'a str, &'a str);
    let cases: &[Case<'_>] = &[
        (&all, Some(&f), Some("http://flag:5"), "http://flag:5/v1/traces", "http://flag:5/v1/metrics"),
        (&all, Some(&f), None, "http://traces:4/custom", "http://generic:3/v1/metrics"),
        (&all[..1], Some(&f), None, "http://generic:3/v1/traces", "http://generic:3/v1/metrics"),
        (&[], Some(&f), None, "http://file-traces:2/t", "http://file:1/v1/metrics"),
    ];
    for (vars, f, flag, t, m) in cases {
        let p = plan_of(vars, *f, *flag).unwrap();
        assert_eq!(traces(&p).url, *t, "{vars:?} {flag:?}");
        assert_eq!(metrics(&p).url, *m, "{vars:?} {flag:?}");
    }
}

#[test]
fn http_urls_per_signal_exact_generic_appended() {
    let u = |e, exact| url(Signal::Traces, OtlpProtocol::HttpProtobuf, e, exact, false).unwrap();
    assert_eq!(u("http://h:4318", false), "http://h:4318/v1/traces");
    assert_eq!(u("http://h:4318/", false), "http://h:4318/v1/traces");
    assert_eq!(u("http://h:4318/base", false), "http://h:4318/base/v1/traces");
    assert_eq!(u("http://h:4318/v1/traces", false), "http://h:4318/v1/traces");
    assert_eq!(u("http://h:4318/ingest/spans", true), "http://h:4318/ingest/spans", "a per-signal endpoint is used as given");
    assert_eq!(u("http://h:4318", true), "http://h:4318");
    let m = url(Signal::Metrics, OtlpProtocol::HttpProtobuf, "http://h:4318/v1/traces", false, false).unwrap();
    assert_eq!(m, "http://h:4318/v1/metrics");
    assert!(url(Signal::Traces, OtlpProtocol::HttpProtobuf, "h:4318", false, false).is_err());
    assert!(url(Signal::Traces, OtlpProtocol::Grpc, "ftp://h:1", false, false).is_err());
    assert!(url(Signal::Traces, OtlpProtocol::Grpc, "http://:1", false, false).is_err());
}

#[test]
fn grpc_urls_origin_only_and_schemeless_tls_unless_insecure() {
    let g = |e, insecure| url(Signal::Logs, OtlpProtocol::Grpc, e, true, insecure).unwrap();
    assert_eq!(g("http://h:4317/", false), "http://h:4317");
    assert_eq!(g("https://h:4317/x", false), "https://h:4317");
    assert_eq!(g("h:4317", false), "https://h:4317");
    assert_eq!(g("h:4317", true), "http://h:4317");
    let p = plan_of(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"), ("OTEL_EXPORTER_OTLP_INSECURE", "true")], None, None).unwrap();
    assert_eq!(traces(&p).url, "http://collector:4317");
    let p = plan_of(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"), ("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "false")], None, None);
    assert_eq!(traces(&p.unwrap()).url, "https://collector:4317");
}

#[test]
fn every_setting_per_signal_over_generic_over_file() {
    let f = file(
        "endpoint: http://f:1\nheaders: {a: file}\ntimeout: 3s\ncompression: none\ncertificate: /file/ca.pem\n\
         metrics: {headers: {a: file-metrics}, timeout: 4s}",
    );
    let vars = [
        ("OTEL_EXPORTER_OTLP_HEADERS", "a=generic"),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "a=traces%20only"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip"),
        ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/env/ca.pem"),
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/env/client.pem"),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/env/client.key"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
    ];
    let p = plan_of(&vars, Some(&f), None).unwrap();
    let (t, m) = (traces(&p), metrics(&p));
    assert_eq!(t.headers, [("a".to_string(), "traces only".to_string())]);
    assert_eq!(m.headers, [("a".to_string(), "generic".to_string())]);
    assert_eq!((t.timeout, m.timeout), (Duration::from_millis(2500), Duration::from_millis(2500)));
    assert!(t.gzip && !m.gzip);
    assert_eq!(t.tls.ca.as_ref().unwrap().path, PathBuf::from("/env/ca.pem"));
    assert_eq!(t.tls.ca.as_ref().unwrap().from, "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE");
    assert_eq!(m.tls.ca.as_ref().unwrap().from, "config otlp.certificate");
    assert_eq!(m.tls.client_key.as_ref().unwrap().path, PathBuf::from("/env/client.key"));
    assert_eq!((t.protocol, m.protocol), (OtlpProtocol::HttpProtobuf, OtlpProtocol::Grpc));
    // Without the variables: the file's per-signal keys over its own.
    let p = plan_of(&[], Some(&f), None).unwrap();
    assert_eq!(metrics(&p).headers, [("a".to_string(), "file-metrics".to_string())]);
    assert_eq!((traces(&p).timeout, metrics(&p).timeout), (Duration::from_secs(3), Duration::from_secs(4)));
    assert_eq!(traces(&p).timeout, Duration::from_secs(3));
}

#[test]
fn exporters_none_console_otlp_and_sdk_disabled() {
    let ep = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317");
    let p = plan_of(&[ep], None, None).unwrap();
    assert!(matches!((&p.traces, &p.metrics), (Output::Otlp(_), Output::Otlp(_))));
    let p = plan_of(&[], None, None).unwrap();
    assert_eq!((&p.traces, &p.metrics), (&Output::Console, &Output::Off), "no endpoint: spans to the console, no metrics");
    let p = plan_of(&[ep, ("OTEL_TRACES_EXPORTER", "none"), ("OTEL_METRICS_EXPORTER", "console")], None, None).unwrap();
    assert_eq!((&p.traces, &p.metrics), (&Output::Off, &Output::Console));
    let p = plan_of(&[ep, ("OTEL_SDK_DISABLED", "true"), ("OTEL_TRACES_EXPORTER", "otlp")], None, None).unwrap();
    assert_eq!((&p.traces, &p.metrics), (&Output::Off, &Output::Off));
    assert!(p.forward[0].is_some(), "the app's own OTLP is still forwarded");
    let p = plan_of(&[("OTEL_TRACES_EXPORTER", "otlp"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")], None, None).unwrap();
    assert_eq!(traces(&p).url, "http://localhost:4318/v1/traces", "the specification's default endpoint");
    for bad in ["zipkin", "otlp,console"] {
        let e = plan_of(&[("OTEL_TRACES_EXPORTER", bad)], None, None).unwrap_err();
        assert!(e.to_string().contains("use otlp, console or none"), "{e}");
    }
    assert!(plan_of(&[("OTEL_SDK_DISABLED", "yes")], None, None).is_err());
}

#[test]
fn bad_values_are_one_line_naming_their_source() {
    let ep = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317");
    let err = |vars: &[(&str, &str)]| format!("{:#}", plan_of(vars, None, None).unwrap_err());
    assert!(err(&[ep, ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")]).contains("OTEL_EXPORTER_OTLP_TIMEOUT=\"10s\": give milliseconds"));
    assert!(err(&[ep, ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "br")]).contains("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION=\"br\""));
    assert!(err(&[ep, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]).contains("http/json is not supported"));
    assert!(err(&[ep, ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/c.pem")]).contains("mutual TLS needs a client certificate and its key"));
    assert!(err(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4318"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")])
        .contains("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=\"collector:4318\""));
    for e in [err(&[ep, ("OTEL_EXPORTER_OTLP_TIMEOUT", "x")]), err(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://x")])] {
        assert!(!e.contains('\n'), "one line: {e}");
    }
    // Blank is unset.
    let p = plan_of(&[ep, ("OTEL_EXPORTER_OTLP_TIMEOUT", " ")], None, None).unwrap();
    assert_eq!(traces(&p).timeout, Duration::from_secs(10));
}

#[test]
fn headers_from_the_environment_format() {
    assert_eq!(
        parse_headers("api-key=abc%20def, x-tenant = t1 ,,").unwrap(),
        vec![("api-key".to_string(), "abc def".to_string()), ("x-tenant".to_string(), "t1".to_string())]
    );
    assert_eq!(parse_headers("a=100%").unwrap(), vec![("a".to_string(), "100%".to_string())]);
    assert_eq!(parse_headers("a=b=c").unwrap(), vec![("a".to_string(), "b=c".to_string())]);
    assert!(parse_headers("novalue").is_err());
    assert!(parse_headers("=v").is_err());
    assert_eq!(parse_headers("").unwrap(), vec![]);
}
