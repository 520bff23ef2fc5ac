use std::time::Duration;

use super::*;
use crate::cli::{RequestsMode, StacksMode};
use crate::probes::catalog::{Detail, DetailKind};

/// uvspan with these arguments, environment variables (the process's are not
/// read) and config file.
fn parse_with(args: &[&str], env: &[(&str, &str)], yaml: &str) -> Result<Cli> {
    let file = FileConfig::parse(yaml)?;
    let lookup = |name: &str| env.iter().find(|(n, _)| *n == name).map(|(_, v)| OsString::from(v));
    let m = layered(&lookup, &file)?.try_get_matches_from(args)?;
    cli_with_file(&m, file).map(|(cli, _)| cli)
}

fn with(args: &[&str], yaml: &str) -> Cli {
    parse_with(args, &[], yaml).unwrap()
}

/// The error of a bad file, which must be one line.
fn file_error(yaml: &str) -> String {
    let e = format!("{:#}", FileConfig::parse(yaml).unwrap_err());
    assert_eq!(e.lines().count(), 1, "one line: {e}");
    e
}

/// The environment variable of each option that had one (they are
/// documented; renaming one breaks deployments). (The OTEL_EXPORTER_OTLP_*
/// variables are the OTLP client's: `export::client::settings` tests them.)
const ENV: [(&str, &str); 8] = [
    ("detail", "UVSPAN_DETAIL"),
    ("requests", "UVSPAN_REQUESTS"),
    ("sample_time", "UVSPAN_SAMPLE_TIME"),
    ("max_overhead", "UVSPAN_MAX_OVERHEAD"),
    ("stacks", "UVSPAN_STACKS"),
    ("symbol_cache", "UVSPAN_SYMBOL_CACHE"),
    ("otlp_listen", "UVSPAN_OTLP_LISTEN"),
    ("join_window", "UVSPAN_JOIN_WINDOW"),
];

/// A valid value for `arg` other than its default.
fn sample(arg: &Arg) -> String {
    if matches!(arg.get_action(), ArgAction::SetTrue) {
        return "true".into();
    }
    let defaults = arg.get_default_values();
    if let Some(p) = arg.get_possible_values().into_iter().find(|p| !defaults.iter().any(|d| d == p.get_name())) {
        return p.get_name().to_string();
    }
    let name = arg.get_value_names().and_then(|n| n.first()).map(|n| n.as_str()).unwrap_or_default();
    match name {
        "DURATION" => "123ms",
        "BYTES" => "16KiB",
        "PERCENT" => "50%",
        "PID" => "4242",
        "ADDR" => "127.0.0.1:9",
        "PROTOCOL" => "http/protobuf",
        // Add a sample here for a new kind of value.
        _ => "x",
    }
    .to_string()
}

/// The file line(s) setting the option `id` to `value`.
fn file_line(id: &str, value: &str) -> String {
    match key_of(id).split_once('.') {
        Some((section, key)) => format!("{section}:\n  {key}: '{value}'"),
        None => format!("{id}: '{value}'"),
    }
}

#[test]
fn every_option_has_a_file_key_and_every_key_an_option() {
    let cmd = crate::cli::command();
    let none = format!("{:?}", with(&["uvspan"], ""));
    for arg in cmd.get_arguments().filter(|a| !NOT_IN_FILE.contains(&a.get_id().as_str())) {
        let yaml = file_line(arg.get_id().as_str(), &sample(arg));
        let flag = arg.get_long().unwrap_or_default();
        let cli = parse_with(&["uvspan"], &[], &yaml).unwrap_or_else(|e| panic!("--{flag}: the file's {yaml:?} is refused: {e:#}"));
        assert_ne!(format!("{cli:?}"), none, "--{flag}: the file's {yaml:?} does not set it");
    }
    for id in NOT_IN_FILE {
        assert!(cmd.get_arguments().any(|a| a.get_id() == id), "{id} is not an option any more");
    }
    // The keys that are not an option's: each is a section of the file.
    let run = cmd.find_subcommand("run").unwrap();
    for key in keys(&cmd) {
        let option = cmd.get_arguments().any(|a| a.get_id() == key.as_str() && has_key(a));
        let section = match key.as_str() {
            // The OTLP client's settings (export::client::settings).
            "otlp" => true,
            "budgets" => run.get_arguments().any(|a| a.get_id() == "budgets"),
            // OTEL_BSP_* only: the OpenTelemetry SDKs have no flags for it.
            "batch" => true,
            _ => false,
        };
        assert!(option || section, "the file key {key} sets no option");
        assert!(FileConfig::parse(&format!("{key}:")).is_ok(), "{key} is not taken");
    }
}

#[test]
fn options_keep_their_environment_variables() {
    let cmd = crate::cli::command();
    let run = cmd.find_subcommand("run").unwrap();
    let none = format!("{:?}", with(&["uvspan"], ""));
    for (id, name) in ENV {
        for c in [&cmd, run] {
            let arg = c.get_arguments().find(|a| a.get_id() == id).unwrap_or_else(|| panic!("no option {id}"));
            assert_eq!(arg.get_env().and_then(|e| e.to_str()), Some(name), "{id}");
        }
        let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
        let cli = parse_with(&["uvspan"], &[(name, &sample(arg))], "").unwrap();
        assert_ne!(format!("{cli:?}"), none, "{name} does not set {id}");
    }
}

/// One option, set at each level in turn.
struct Layers {
    /// The option's value as `show` says it, with nothing set.
    default: &'static str,
    /// The file, and the value with it.
    file: (&'static str, &'static str),
    /// The variable, and the value with it and the file.
    env: Option<((&'static str, &'static str), &'static str)>,
    /// The flags, and the value with them, the variable and the file.
    flag: (&'static [&'static str], &'static str),
    show: fn(&Cli) -> String,
}

/// An option of each kind (a few twice: with and without a variable).
fn layers() -> Vec<Layers> {
    number_layers().into_iter().chain(word_layers()).collect()
}

/// Durations, sizes, percents.
fn number_layers() -> Vec<Layers> {
    vec![
        // duration
        Layers {
            default: "7s",
            file: ("join_window: 3s", "3s"),
            env: Some((("UVSPAN_JOIN_WINDOW", "2s"), "2s")),
            flag: (&["--join-window", "1s"], "1s"),
            // Unset: per process, from its OTEL_BSP_SCHEDULE_DELAY (7 s without one).
            show: |c| c.join_window.map_or_else(|| "7s".into(), |d| format!("{d:?}")),
        },
        Layers {
            default: "10ms",
            file: ("loop_threshold: 0", "0ns"),
            env: None,
            flag: (&["--loop-threshold", "1.5s"], "1.5s"),
            show: |c| format!("{:?}", c.loop_threshold),
        },
        // size
        Layers {
            default: "8388608",
            file: ("ring_buffer_size: 65536", "65536"),
            env: None,
            flag: (&["--ring-buffer-size", "16KiB"], "16384"),
            show: |c| c.ring_buffer_size.to_string(),
        },
        // percent
        Layers {
            default: "None",
            file: ("sample_time: 10%", "Some(0.1)"),
            env: Some((("UVSPAN_SAMPLE_TIME", "20"), "Some(0.2)")),
            flag: (&["--sample-time", "50%"], "Some(0.5)"),
            show: |c| format!("{:?}", c.sample_time),
        },
    ]
}

/// Enums, lists, bools, strings.
fn word_layers() -> Vec<Layers> {
    vec![
        // enum
        Layers {
            default: "SlowIterations",
            file: ("stacks: off", "Off"),
            env: Some((("UVSPAN_STACKS", "all-ops"), "AllOps")),
            flag: (&["--stacks", "slow-iterations"], "SlowIterations"),
            show: |c| format!("{:?}", c.stacks),
        },
        // list
        Layers {
            default: "[]",
            file: ("detail: [threadpool]", "[Threadpool]"),
            env: Some((("UVSPAN_DETAIL", "phases,threadpool"), "[Phases, Threadpool]")),
            flag: (&["--detail", "all"], "[All]"),
            show: |c| format!("{:?}", c.detail),
        },
        Layers {
            default: "[]",
            file: ("otlp_listen: [127.0.0.1:1, '[::1]:2']", "[127.0.0.1:1, [::1]:2]"),
            env: Some((("UVSPAN_OTLP_LISTEN", "127.0.0.1:3"), "[127.0.0.1:3]")),
            flag: (&["--otlp-listen", "127.0.0.1:4", "--otlp-listen", "127.0.0.1:5"], "[127.0.0.1:4, 127.0.0.1:5]"),
            show: |c| format!("{:?}", c.otlp_listen),
        },
        Layers {
            default: "[]",
            file: ("pids: [1, 2]", "[1, 2]"),
            env: None,
            flag: (&["-p", "3"], "[3]"),
            show: |c| format!("{:?}", c.pids),
        },
        // bool: a flag can only say true
        Layers { default: "false", file: ("all: true", "true"), env: None, flag: (&["--all"], "true"), show: |c| c.all.to_string() },
        Layers {
            default: "false",
            file: ("exclude_already_instrumented: false", "false"),
            env: None,
            flag: (&["--exclude-already-instrumented"], "true"),
            show: |c| c.exclude_already_instrumented.to_string(),
        },
        // string
        Layers {
            default: "/var/cache/uvspan",
            file: ("symbol_cache: /tmp/f", "/tmp/f"),
            env: Some((("UVSPAN_SYMBOL_CACHE", "/tmp/e"), "/tmp/e")),
            flag: (&["--symbol-cache", "off"], "off"),
            show: |c| c.symbol_cache.clone(),
        },
        Layers {
            default: "None",
            file: ("service_name: shop", "Some(\"shop\")"),
            env: None,
            flag: (&["--service-name", "cli"], "Some(\"cli\")"),
            show: |c| format!("{:?}", c.service_name),
        },
    ]
}

#[test]
fn flag_beats_environment_beats_file_beats_default() {
    for r in layers() {
        let get = |flags: &[&str], env: &[(&str, &str)], yaml: &str| {
            let args: Vec<&str> = ["uvspan"].into_iter().chain(flags.iter().copied()).collect();
            (r.show)(&parse_with(&args, env, yaml).unwrap_or_else(|e| panic!("{args:?} {env:?} {yaml:?}: {e:#}")))
        };
        let env: Vec<(&str, &str)> = r.env.iter().map(|(e, _)| *e).collect();
        let (file, flags) = (r.file.0, r.flag.0);
        assert_eq!(get(&[], &[], ""), r.default, "default of {flags:?}");
        assert_eq!(get(&[], &[], file), r.file.1, "{file:?}");
        if let Some((e, want)) = r.env {
            assert_eq!(get(&[], &env, file), want, "{e:?} over {file:?}");
            assert_eq!(get(&[], &env, ""), want, "{e:?}");
        }
        assert_eq!(get(flags, &env, file), r.flag.1, "{flags:?} over {env:?} and {file:?}");
        assert_eq!(get(flags, &[], ""), r.flag.1, "{flags:?}");
    }
}

#[test]
fn run_takes_the_file_and_the_environment_too() {
    let yaml = "loop_threshold: 20ms\nbudgets: [dns.count==0]\n";
    let c = parse_with(&["uvspan", "run", "--budget", "fs.count<=1", "--", "true"], &[("UVSPAN_STACKS", "off")], yaml).unwrap();
    assert_eq!((c.loop_threshold, c.stacks), (Duration::from_millis(20), StacksMode::Off));
    let Some(crate::cli::Sub::Run(opts)) = &c.sub else { panic!("not run: {c:?}") };
    assert_eq!(opts.budgets, ["dns.count==0", "fs.count<=1"], "the file's, then the flags'");
    // The file's discovery options are refused there like the flags.
    let e = parse_with(&["uvspan", "run", "--", "true"], &[], "all: true").unwrap_err().to_string();
    assert!(e.starts_with("uvspan run traces a command it starts"), "{e}");
}

/// A budget switches the probes off part of the time: not with phase spans
/// nor `uvspan run`; from the file and the environment like the flag.
#[test]
fn max_overhead_layers_and_its_refusals() {
    assert_eq!(with(&["uvspan"], "max_overhead: 5%").max_overhead, Some(0.05));
    assert_eq!(parse_with(&["uvspan"], &[("UVSPAN_MAX_OVERHEAD", "2.5")], "").unwrap().max_overhead, Some(0.025));
    let c = with(&["uvspan", "--max-overhead", "10%", "--sample-time", "30%"], "");
    assert_eq!((c.max_overhead, c.sample_time), (Some(0.1), Some(0.3)));
    let e = parse_with(&["uvspan", "--max-overhead", "5%", "--detail", "phases"], &[], "").unwrap_err().to_string();
    assert!(e.starts_with("--max-overhead cannot be combined with --detail phases") && !e.contains('\n'), "{e}");
    let e = parse_with(&["uvspan", "run", "--max-overhead", "5%", "--", "true"], &[], "").unwrap_err().to_string();
    assert!(e.starts_with("uvspan run cannot be combined with --max-overhead") && !e.contains('\n'), "{e}");
    let e = parse_with(&["uvspan", "--max-overhead", "0"], &[], "").unwrap_err().to_string();
    assert!(e.contains("must be more than 0%"), "{e}");
}

#[test]
fn file_fills_what_flags_do_not_set() {
    let yaml = "all: true\nloop_threshold: 50ms\nservice_name: shop\notlp:\n  endpoint: http://c:4317\n  protocol: http/protobuf\n";
    let c = with(&["uvspan"], yaml);
    assert!(c.all);
    assert_eq!(c.loop_threshold, Duration::from_millis(50));
    assert_eq!(c.service_name.as_deref(), Some("shop"));
    let otlp = FileConfig::parse(yaml).unwrap().otlp.unwrap().common;
    assert_eq!((otlp.endpoint.as_deref(), otlp.protocol.as_deref()), (Some("http://c:4317"), Some("http/protobuf")));
    assert_eq!(c.otlp_endpoint, None, "the file's endpoint is the OTLP client's, under the variables");
    // A flag wins over the file.
    let c = with(&["uvspan", "--loop-threshold", "5ms", "--service-name", "cli"], yaml);
    assert_eq!(c.loop_threshold, Duration::from_millis(5));
    assert_eq!(c.service_name.as_deref(), Some("cli"));
    // Empty values are no values.
    assert_eq!(FileConfig::parse("loop_threshold:\ndetail: []\notlp:\n").unwrap(), FileConfig::default());
    // Written as on the command line: a list as one comma-separated word too.
    assert_eq!(with(&["uvspan"], "detail: threadpool,phases").detail, [DetailKind::Threadpool, DetailKind::Phases]);
}

#[test]
fn bad_files_are_one_line_errors_naming_the_key() {
    let e = file_error("bogus_key: 1");
    assert!(e.starts_with("unknown key `bogus_key`: the keys are pids, no_follow_children, all, "), "{e}");
    assert!(e.contains("otlp_listen_queue, otlp, batch, budgets"), "{e}");
    assert!(file_error("otlp_endpoint: x").starts_with("unknown key `otlp_endpoint`"), "under otlp:");
    assert!(file_error("config: other.yaml").starts_with("unknown key `config`"));
    assert_eq!(file_error("all: maybe"), "all: \"maybe\" is not one of true, false");
    assert_eq!(file_error("loop_threshold: soon"), "loop_threshold: invalid duration \"soon\": expected e.g. 10ms, 1s, 250us");
    assert_eq!(file_error("loop_threshold: [1ms, 2ms]"), "loop_threshold: takes one value, not a list");
    assert_eq!(file_error("detail: [threadpool, everything]"), "detail: \"everything\" is not one of threadpool, phases, all");
    assert_eq!(file_error("stacks: sometimes"), "stacks: \"sometimes\" is not one of slow-iterations, all-ops, off");
    assert_eq!(file_error("otlp_listen: [nowhere]"), "otlp_listen: \"nowhere\": invalid socket address syntax");
    assert_eq!(
        file_error("ring_buffer_size: 3MiB"),
        "ring_buffer_size: invalid size \"3MiB\": must be a power of two from 4KiB to 1024MiB"
    );
    assert!(file_error("pids: [-1]").starts_with("pids: \"-1\": "));
    assert_eq!(
        file_error("otlp:\n  protocol: http/json"),
        "config otlp.protocol: unsupported OTLP protocol \"http/json\": use grpc or http/protobuf (http/json is not supported)"
    );
    assert!(file_error("otlp:\n  tls: true").starts_with("otlp: unknown field `tls`"));
    assert!(file_error("batch:\n  max_queue_size: lots").starts_with("batch: "));
    assert!(file_error("service_name: {a: 1}").starts_with("service_name: a: 1 is not a value as on the command line"));
    assert!(file_error("[all]").contains("expected a YAML mapping"));
    assert_eq!(FileConfig::parse("").unwrap(), FileConfig::default());
    assert_eq!(FileConfig::parse("# nothing\n").unwrap(), FileConfig::default());
    // A bad environment variable names itself.
    let e = parse_with(&["uvspan"], &[("UVSPAN_STACKS", "never")], "").unwrap_err().to_string();
    assert_eq!(e, "environment variable UVSPAN_STACKS: \"never\" is not one of slow-iterations, all-ops, off");
}

#[test]
fn the_file_is_named_on_the_command_line() {
    let dir = std::env::temp_dir().join(format!("uvspan-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.yaml");
    std::fs::write(&good, "loop_threshold: 20ms\n").unwrap();
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "loop_threshold: 20 ms\nrequests: sometimes\n").unwrap();
    let no_env = |_: &str| None;
    let argv = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
    let g = good.to_str().unwrap();
    for args in [&["uvspan", "--config", g, "--pid", "1"][..], &["uvspan", "run", "--config", g, "--", "true"]] {
        let (cli, _) = parse(&argv(args), &no_env).unwrap();
        assert_eq!(cli.loop_threshold, Duration::from_millis(20), "{args:?}");
    }
    let e = parse(&argv(&["uvspan", "--config", bad.to_str().unwrap()]), &no_env).unwrap_err();
    assert_eq!(format!("{e:#}"), format!("invalid config file {}: requests: \"sometimes\" is not one of on, always, off", bad.display()));
    let e = parse(&argv(&["uvspan", "--config", "/no/such.yaml"]), &no_env).unwrap_err();
    assert!(format!("{e:#}").starts_with("cannot read config file /no/such.yaml: "), "{e:#}");
    // Usage errors and --help are clap's.
    for args in [&["uvspan", "--bogus"][..], &["uvspan", "--help"]] {
        let e = parse(&argv(args), &no_env).unwrap_err();
        assert!(e.downcast_ref::<clap::Error>().is_some(), "{args:?}: {e:#}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn detail_from_file_flag_and_env() {
    let get = |args: &[&str], yaml: &str| Detail::from_kinds(&with(args, yaml).detail);
    assert_eq!(get(&["uvspan"], ""), Detail { threadpool: false, phases: false, requests: true });
    assert_eq!(get(&["uvspan"], "detail: [threadpool]"), Detail { threadpool: true, phases: false, requests: true });
    assert_eq!(get(&["uvspan"], "detail: [all]"), Detail::all());
    // the flag wins over the file
    assert_eq!(get(&["uvspan", "--detail", "phases"], "detail: [threadpool]"), Detail { threadpool: false, phases: true, requests: true });
    assert_eq!(get(&["uvspan", "--detail", "threadpool,phases"], ""), Detail::all());
    assert_eq!(Detail::from_kinds(&[DetailKind::All]), Detail::all());
    assert!(crate::cli::command().try_get_matches_from(["uvspan", "--detail", "loop"]).is_err());
    assert!(crate::cli::command().try_get_matches_from(["uvspan", "--detail", "requests"]).is_err(), "not a --detail group");
    let req = |args: &[&str], yaml: &str| with(args, yaml).requests;
    assert_eq!(req(&["uvspan"], ""), RequestsMode::On);
    assert_eq!(req(&["uvspan"], "requests: off"), RequestsMode::Off);
    assert_eq!(req(&["uvspan", "--requests", "on"], "requests: off"), RequestsMode::On);
}

#[test]
fn otlp_listen_from_file_and_flag() {
    let c = with(&["uvspan"], "otlp_listen: [127.0.0.1:4317, '[::1]:4318']\njoin_window: 2s");
    assert_eq!(c.otlp_listen, vec!["127.0.0.1:4317".parse().unwrap(), "[::1]:4318".parse().unwrap()]);
    assert_eq!(c.join_window, Some(Duration::from_secs(2)));
    let c = with(&["uvspan", "--otlp-listen", "127.0.0.1:1,127.0.0.1:2"], "otlp_listen: [127.0.0.1:4317]");
    assert_eq!(c.otlp_listen.len(), 2, "the flag wins");
    assert_eq!(with(&["uvspan"], "").join_window, None, "unset: each process's own, from its SDK's batch delay");
}

#[test]
fn stacks_from_the_file_unless_the_flag_is_given() {
    let get = |args: &[&str], yaml: &str| with(args, yaml).stacks;
    assert_eq!(get(&["uvspan"], ""), StacksMode::SlowIterations);
    assert_eq!(get(&["uvspan"], "stacks: off"), StacksMode::Off);
    assert_eq!(get(&["uvspan"], "stacks: all-ops"), StacksMode::AllOps);
    assert_eq!(get(&["uvspan", "--stacks", "slow-iterations"], "stacks: off"), StacksMode::SlowIterations);
}

#[test]
fn shipped_example_parses() {
    let text = include_str!("../../otel-config/uvspan.yaml");
    let file = FileConfig::parse(text).unwrap();
    assert_eq!(file.otlp.as_ref().and_then(|o| o.common.headers.as_ref()).map(|h| h.len()), Some(1));
    assert_eq!(file.batch().unwrap().max_batch, 2048);
    let c = parse_with(&["uvspan"], &[], text).unwrap();
    assert!(c.all && file.otlp.as_ref().is_some_and(|o| o.common.endpoint.is_some()));
    // The keys it shows commented out are keys too.
    let shown: String = text
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(k) if k.split_once(": ").is_some_and(|(k, _)| k.chars().all(|c| c.is_ascii_lowercase() || c == '_')) => k,
            _ => l,
        })
        .fold(String::new(), |t, l| t + l + "\n");
    assert!(shown.contains("\npids: [4242]\n"), "{shown}");
    FileConfig::parse(&shown).unwrap_or_else(|e| panic!("{e:#}\n{shown}"));
}

/// An OpenTelemetry configuration file in the schema's 1.0 shape: exporters per signal,
/// batching, the sampler, the resource's service.name, the propagators, uvspan's own options
/// under `extensions.uvspan`, and `${VAR:-default}` substitution.
const OTEL_FILE: &str = r#"
file_format: "1.0"
disabled: false
log_level: info
resource:
  attributes:
    - name: service.name
      value: checkout
  detection/development:
    detectors:
      - process:
attribute_limits:
  attribute_count_limit: 128
propagator:
  composite:
    - tracecontext:
    - baggage:
tracer_provider:
  processors:
    - batch:
        schedule_delay: 500
        export_timeout: 30000
        max_queue_size: 4096
        max_export_batch_size: 256
        exporter:
          otlp_grpc:
            endpoint: ${COLLECTOR:-http://localhost:4317}
            tls:
              certificate_file: /etc/otel/ca.pem
            compression: gzip
            timeout: 2500
            headers:
              - name: api-key
                value: s3cret
            headers_list: "api-key=ignored,tenant=blue"
  limits:
    attribute_count_limit: 128
  sampler:
    parent_based:
      root:
        trace_id_ratio_based:
          ratio: 0.25
      remote_parent_sampled:
        always_on:
      remote_parent_not_sampled:
        always_off:
meter_provider:
  readers:
    - periodic:
        interval: 15000
        exporter:
          otlp_http:
            endpoint: http://metrics:4318/v1/metrics
            temporality_preference: delta
logger_provider:
  processors:
    - batch:
        exporter:
          otlp_http:
            endpoint: http://localhost:4318/v1/logs
extensions:
  obi:
    discovery: {}
  uvspan:
    loop_threshold: 25ms
    requests: always
"#;

fn otel(text: &str, env: &[(&str, &str)]) -> Result<(FileConfig, Vec<(&'static str, String)>)> {
    FileConfig::from_otel(text, &|n| env.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string()))
}

#[test]
fn an_opentelemetry_configuration_file_sets_export_sampler_resource_and_options() {
    let (file, set) = otel(OTEL_FILE, &[("COLLECTOR", "https://gateway:4317")]).unwrap();
    let o = file.otlp.as_ref().expect("otlp");
    let traces = o.traces.as_ref().expect("traces");
    assert_eq!(traces.endpoint.as_deref(), Some("https://gateway:4317"), "substituted");
    assert_eq!(traces.protocol.as_deref(), Some("grpc"));
    assert_eq!(traces.compression.as_deref(), Some("gzip"));
    assert_eq!(traces.timeout.as_deref(), Some("2500ms"));
    assert_eq!(traces.certificate.as_deref(), Some("/etc/otel/ca.pem"));
    let headers = traces.headers.as_ref().unwrap();
    assert_eq!((headers["api-key"].as_str(), headers["tenant"].as_str()), ("s3cret", "blue"), "headers win over headers_list");
    let metrics = o.metrics.as_ref().expect("metrics");
    assert_eq!(metrics.endpoint.as_deref(), Some("http://metrics:4318/v1/metrics"));
    assert_eq!(metrics.protocol.as_deref(), Some("http/protobuf"));
    let b = file.batch().unwrap();
    assert_eq!((b.max_queue_spans, b.max_batch, b.schedule_delay), (4096, 256, Duration::from_millis(500)));
    for want in [
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "15000"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
    ] {
        assert!(set.iter().any(|(k, v)| (*k, v.as_str()) == want), "{want:?} in {set:?}");
    }
    // uvspan's own options, and the resource's service.name, as if from its YAML file.
    let m = layered(&|_| None, &file).unwrap().try_get_matches_from(["uvspan", "--pid", "1"]).unwrap();
    let (cli, _) = cli_with_file(&m, file).unwrap();
    assert_eq!(cli.loop_threshold, Duration::from_millis(25));
    assert_eq!(cli.requests, RequestsMode::Always);
    assert_eq!(cli.service_name.as_deref(), Some("checkout"));
}

#[test]
fn the_schemas_getting_started_shape_works() {
    // The schema's smallest example: a batch OTLP/HTTP exporter per signal from the environment.
    let text = "file_format: '1.0'\npropagator:\n  composite_list: tracecontext,baggage\ntracer_provider:\n  processors:\n    - batch:\n        exporter:\n          otlp_http:\n            endpoint: ${OTEL_EXPORTER_OTLP_ENDPOINT:-http://localhost:4318}/v1/traces\n  sampler:\n    parent_based:\n      root:\n        always_on:\n";
    let (file, set) = otel(text, &[]).unwrap();
    assert_eq!(file.otlp.unwrap().traces.unwrap().endpoint.as_deref(), Some("http://localhost:4318/v1/traces"));
    assert_eq!(set, vec![("OTEL_TRACES_SAMPLER", "parentbased_always_on".to_string())]);
    assert!(otel_file::is_otel(text) && !otel_file::is_otel("loop_threshold: 5ms\n"));
}

#[test]
fn what_uvspan_cannot_honour_is_one_line() {
    let err = |text: &str| {
        let e = format!("{:#}", otel(text, &[]).unwrap_err());
        assert_eq!(e.lines().count(), 1, "one line: {e}");
        e
    };
    assert!(err("file_format: '1.0'\ntracer_providr: {}\n").contains("unknown key `tracer_providr`"));
    assert!(err("file_format: '0.3'\n").contains("format 1.0"));
    assert!(err("file_format: '1.0'\npropagator:\n  composite:\n    - b3:\n").contains("propagator b3"));
    assert!(err("file_format: '1.0'\nresource:\n  attributes:\n    - name: team\n      value: x\n").contains("resource attribute team"));
    let two = "file_format: '1.0'\ntracer_provider:\n  processors:\n    - batch: {exporter: {console: {}}}\n    - batch: {exporter: {console: {}}}\n";
    assert!(err(two).contains("one place"));
    assert!(err("file_format: '1.0'\ntracer_provider:\n  processors:\n    - batch:\n        exporter:\n          otlp_grpc:\n            endpont: x\n").contains("unknown key `endpont`"));
    assert!(err("file_format: '1.0'\nextensions:\n  uvspan:\n    loop_treshold: 5ms\n").contains("unknown key `loop_treshold`"));
    assert!(err(
        "file_format: '1.0'\ntracer_provider:\n  sampler:\n    parent_based:\n      remote_parent_not_sampled:\n        always_on:\n"
    )
    .contains("not supported"));
    assert!(err("file_format: '1.0'\nx: ${unclosed\n").contains("unclosed"));
}

#[test]
fn substitution() {
    let env = |n: &str| (n == "A").then(|| "1".to_string());
    assert_eq!(otel_file::substitute("a=${A} b=${B:-2} c=${env:A} d=$$ e=${B}.", &env).unwrap(), "a=1 b=2 c=1 d=$ e=.");
    assert!(otel_file::substitute("${a b}", &env).is_err());
}
