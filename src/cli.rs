//! Command line.

use std::time::Duration;

use clap::Parser;

use crate::export::client::OtlpProtocol;
use crate::probes::catalog::DetailKind;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "uvspan",
    version,
    about = "Trace libuv inside unmodified Node.js processes with eBPF and export OpenTelemetry spans",
    args_conflicts_with_subcommands = true,
    after_help = "Examples:\n  uvspan --pid 4242\n  uvspan -- node app.js\n  \
                  OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4317 uvspan --pid 4242\n  \
                  uvspan probes --pid 4242"
)]
pub struct Cli {
    #[command(subcommand)]
    pub sub: Option<Sub>,

    /// Trace this running Node.js process (repeatable), and the Node.js
    /// processes below it, running now or started later (see
    /// --no-follow-children).
    #[arg(short, long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// With --pid: trace only the processes given, not their descendants (by
    /// default the Node.js processes below them, running now or started
    /// later: cluster workers, child_process.fork, a node a shell starts,
    /// are traced too).
    #[arg(long)]
    pub no_follow_children: bool,

    /// Trace every Node.js process in uvspan's PID namespace, including ones
    /// started later (found at exec).
    #[arg(long)]
    pub all: bool,

    /// With --all (implied): only processes whose cgroup path starts with this.
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,

    /// With --all (implied): only processes in this container (id or prefix).
    #[arg(long, value_name = "ID")]
    pub container: Option<String>,

    /// With --all: skip processes started with the OpenTelemetry JS SDK
    /// (an @opentelemetry/ module in --require/--import or NODE_OPTIONS).
    #[arg(long)]
    pub exclude_already_instrumented: bool,

    /// YAML file with any of these options (flags > environment > file).
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,

    /// OTLP endpoint (over OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT); without
    /// one anywhere, spans are printed to stdout.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// OTLP protocol: grpc or http/protobuf (over
    /// OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL; default grpc).
    #[arg(long, value_name = "PROTOCOL")]
    pub otlp_protocol: Option<OtlpProtocol>,

    /// Report a loop iteration as a span when its busy time (all but the time
    /// blocked waiting for I/O) reaches this; 0 reports every iteration.
    #[arg(long, value_name = "DURATION", default_value = "10ms", value_parser = parse_duration)]
    pub loop_threshold: Duration,

    /// More detail, for more probe hits (comma-separated): `threadpool`
    /// splits fs and DNS spans into queue/run/callback wait (+2 probe hits
    /// per threadpool job), `phases` adds loop phase spans under slow
    /// iterations (+5 per loop iteration), `all` both. The default traces
    /// every fs/DNS operation and slow iteration at the lowest cost.
    #[arg(long, value_name = "LIST", value_delimiter = ',', env = "UVSPAN_DETAIL")]
    pub detail: Vec<DetailKind>,

    /// Request context: a SERVER span per HTTP request the process serves,
    /// with the fs and DNS work it caused and its outgoing HTTP calls under
    /// it, in the caller's trace when the request carries a traceparent.
    /// `on`: no SERVER span for processes that run the OpenTelemetry JS SDK
    /// (its own SERVER span stands for the request; uvspan's work joins the
    /// trace); `always`: a SERVER span there too; `off`: every operation its
    /// own trace (fewer probe hits).
    #[arg(long, value_name = "MODE", env = "UVSPAN_REQUESTS", default_value = "on")]
    pub requests: RequestsMode,

    /// Below the per-probe cost: the fs/DNS/request probes are live only
    /// this share of the time (`10%`: 100 ms of every second, at a random
    /// point of it), and detached otherwise. Operations that cross a window
    /// edge are dropped and counted; slow loop iterations are always seen.
    /// Spans carry the share (`uvspan.sample_time`) so counts can be scaled.
    #[arg(long, value_name = "PERCENT", env = "UVSPAN_SAMPLE_TIME", value_parser = parse_percent)]
    pub sample_time: Option<f64>,

    /// A budget for the CPU the probes add to each traced process, as a
    /// share of its own (`5%`): uvspan measures it (CPU per byte of I/O
    /// while the probes are live against the time off right after) and sets
    /// the live share of each period so that the most expensive process
    /// stays within it (from 10%, or --sample-time's share as the most,
    /// between 2% and 90%). Exported as `uvspan.overhead*`, and said at exit.
    #[arg(long, value_name = "PERCENT", env = "UVSPAN_MAX_OVERHEAD", value_parser = parse_percent)]
    pub max_overhead: Option<f64>,

    /// Background noise: fs and DNS operations outside requests shorter
    /// than this are not exported (counted; the metrics still count them).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub min_duration: Option<Duration>,

    /// What a trace is for work no request caused: `process` (each traced
    /// process one trace: its life, start-up and tasks under its root span;
    /// the default for `-- COMMAND` and `uvspan run`) or `task` (each timer
    /// batch, immediate batch or I/O callback that did traced work its own
    /// trace; the default for --pid and --all). Requests keep their own
    /// traces either way.
    #[arg(long, value_name = "UNIT", value_enum)]
    pub trace_per: Option<crate::tasks::TracePer>,

    /// Which fs operations are counted on the span they ran under (their
    /// count, time, failures and the slowest, as attributes; the metrics
    /// still count each) instead of a span each: `modules` (module loading
    /// — `require` and the ES module loader resolving, statting and
    /// reading module files — wherever it runs: the start-up, `main`, any
    /// task), `summary` (that, and with a trace per process every other
    /// sync fs call of the start-up and `main`) or `spans` (none). Default:
    /// `modules`; under `uvspan run`, `spans` (its report counts every
    /// operation, module loading included).
    #[arg(long, value_name = "WHAT", value_enum)]
    pub startup_ops: Option<crate::tasks::StartupOps>,

    /// Export a request the trace sampler dropped anyway, with all of its
    /// work, when it failed (HTTP 5xx).
    #[arg(long)]
    pub keep_errors: bool,

    /// Publish each traced loop thread's current request (its trace id and
    /// SERVER span id) in the pinned BPF map profilers read
    /// (/sys/fs/bpf/otel/traces_ctx_v1: the OpenTelemetry eBPF profiler's
    /// -obi-process-ctx), so CPU profiles carry the trace they ran for.
    #[arg(long)]
    pub publish_trace_context: bool,

    /// Export a request the trace sampler dropped anyway, with all of its
    /// work, when it took longer than this.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub keep_slower_than: Option<Duration>,
    /// Who blocked the loop: `slow-iterations` samples the loop thread's
    /// stack (~1 kHz of its CPU time, kept only while an iteration is
    /// already over --loop-threshold) and puts the JS and native frames on
    /// the slow iteration's span; `all-ops` also puts the stack of each fs
    /// and DNS submit on its span (a user-stack walk per operation); `off`
    /// opens no sampling event.
    #[arg(long, value_name = "MODE", env = "UVSPAN_STACKS", default_value = "slow-iterations")]
    pub stacks: StacksMode,

    /// service.name of the spans (default: the target's OTEL_SERVICE_NAME,
    /// else derived from its command line).
    #[arg(long, value_name = "NAME")]
    pub service_name: Option<String>,

    /// How long to keep exporting at exit before giving up on what is left.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub flush_timeout: Duration,

    /// Kernel ring buffer size (a power of two, at least 4096): room for
    /// bursts while uvspan is not reading. Records that do not fit are
    /// dropped and counted.
    #[arg(long, value_name = "BYTES", default_value = "8MiB", value_parser = parse_size)]
    pub ring_buffer_size: u32,

    /// At start, name every probe missing or replaced (by its symbol), the
    /// fallbacks in use and the probes the kernel single-steps; by default,
    /// one line per capability a build lacks.
    #[arg(long, short = 'v')]
    pub verbose: bool,

    /// Print a status line (processes, spans exported, dropped, lost, export
    /// errors) this often; 0 = only at exit.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub status_interval: Duration,

    /// Where the symbol offsets read from each Node build are kept between
    /// runs (one small file per build-id), so the next start reads no ELF
    /// symbol table; `off` keeps them in memory only.
    #[arg(long, value_name = "DIR", env = "UVSPAN_SYMBOL_CACHE", default_value = crate::symbols::DEFAULT_CACHE_DIR)]
    pub symbol_cache: String,

    /// Local OTLP agent: serve OTLP here (repeatable, or comma-separated;
    /// gRPC and HTTP/protobuf on the same port) for the traced app to export
    /// its own traces, metrics and logs through uvspan, which forwards them
    /// unchanged to --otlp-endpoint and puts its request spans under the
    /// app's SERVER span. E.g. 127.0.0.1:4317.
    #[arg(long, value_name = "ADDR", env = "UVSPAN_OTLP_LISTEN", value_delimiter = ',')]
    pub otlp_listen: Vec<std::net::SocketAddr>,

    /// With --otlp-listen: where the app's OTLP goes on. `endpoint`: to
    /// --otlp-endpoint (the app exports through uvspan). `none`: nowhere (a
    /// collector tee: the app exports to its collector, which sends its
    /// traces on to its backend and a copy to this listener; uvspan reads
    /// the SERVER spans for the join and forwards nothing).
    #[arg(long, value_name = "WHERE", value_enum, default_value = "endpoint")]
    pub otlp_listen_forward: ListenForward,

    /// With --otlp-listen: how long uvspan's spans of a request wait for the
    /// app's SERVER span before they go out as they are. Default: per
    /// process, its SDK's batch delay (OTEL_BSP_SCHEDULE_DELAY in its
    /// environment, 5 s when unset) plus 2 s for the export and a
    /// collector tee.
    #[arg(long, value_name = "DURATION", env = "UVSPAN_JOIN_WINDOW", value_parser = parse_duration)]
    pub join_window: Option<Duration>,

    /// With --otlp-listen: bytes of the app's requests queued for the
    /// endpoint at most (a power of two); when full, the app is told to retry.
    #[arg(long, value_name = "BYTES", default_value = "64MiB", value_parser = parse_size)]
    pub otlp_listen_queue: u32,

    /// Command to start and trace (after `--`); uvspan exits with its status.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `--otlp-listen-forward`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ListenForward {
    Endpoint,
    None,
}

/// `--requests`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RequestsMode {
    On,
    Always,
    Off,
}

/// `--stacks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StacksMode {
    SlowIterations,
    AllOps,
    Off,
}

impl Cli {
    /// The probes are live only part of the time (--sample-time under
    /// 100%, or a --max-overhead budget).
    pub fn samples_time(&self) -> bool {
        self.sample_time.is_some_and(|s| s < 1.0) || self.max_overhead.is_some()
    }

    /// The persistent symbol cache directory, or None for `off`.
    pub fn symbol_cache_dir(&self) -> Option<std::path::PathBuf> {
        (self.symbol_cache != "off" && !self.symbol_cache.is_empty()).then(|| self.symbol_cache.clone().into())
    }

    /// --pid: the targets' descendants are traced too (not with --all, which
    /// traces every Node.js process anyway, nor beside a command, whose
    /// probes cover every process of its node binary).
    pub fn follow_children(&self) -> bool {
        !self.pids.is_empty() && !self.no_follow_children && !self.discover() && self.command.is_empty()
    }

    /// Discovery mode: --all, or a scope that implies it.
    pub fn discover(&self) -> bool {
        self.all || self.cgroup.is_some() || self.container.is_some()
    }
}

#[derive(clap::Subcommand, Debug, Clone)]
pub enum Sub {
    /// List where libuv is and which probes uvspan can use there (attaches nothing).
    Probes {
        /// A running process.
        #[arg(short, long, conflicts_with = "path")]
        pid: Option<u32>,
        /// A node binary, libnode.so or libuv.so.
        #[arg(value_name = "PATH", required_unless_present = "pid")]
        path: Option<std::path::PathBuf>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Show the plan with these optional probe groups on (see uvspan --help).
        #[arg(long, value_name = "LIST", value_delimiter = ',')]
        detail: Vec<DetailKind>,
        /// Show the plan with request context on or off (see uvspan --help).
        #[arg(long, value_name = "MODE", default_value = "on")]
        requests: RequestsMode,
    },
    /// Run a command as a CI performance gate: trace it and every Node.js
    /// process it starts, print a summary, write reports, check budgets
    /// (exit 3 when one is broken). Takes the tracing options too.
    Run(RunOpts),
}

/// `uvspan run`'s own options; the tracing options are added by [`command`].
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct RunOpts {
    /// Write the report as JSON here.
    #[arg(long, value_name = "FILE.json")]
    pub report: Option<std::path::PathBuf>,
    /// Write a self-contained HTML report here (timeline, histograms, budgets).
    #[arg(long, value_name = "FILE.html")]
    pub html: Option<std::path::PathBuf>,
    /// Write JUnit XML here: one test case per budget.
    #[arg(long, value_name = "FILE.xml")]
    pub junit: Option<std::path::PathBuf>,
    /// A budget on the report: a key, an optional process selector, a
    /// number: 'loop.blocked.max_ms<=100' (the command's own processes, not
    /// npm/npx/yarn/pnpm), 'loop.blocked.max_ms[vitest]<=200' (processes
    /// whose command line holds "vitest"; a glob with * or ?),
    /// 'loop.blocked.max_ms[*]<=200' (every process). Repeatable; added to
    /// the config file's `budgets:`. Exit 3 when one is broken.
    #[arg(long = "budget", value_name = "EXPR")]
    pub budgets: Vec<String>,
}

/// The command line: [`Cli`] with the tracing options also under `run`
/// (`uvspan run [run options] [tracing options] -- COMMAND`).
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    let top = Cli::command();
    // The discovery options do not apply (hidden, refused by config::cli_with_file).
    let not_for_run = ["pids", "no_follow_children", "all", "cgroup", "container", "exclude_already_instrumented"];
    let tracing: Vec<clap::Arg> =
        top.get_arguments().map(|a| a.clone().help_heading("Tracing options").hide(not_for_run.contains(&a.get_id().as_str()))).collect();
    top.mut_subcommand("run", |run| {
        run.args(tracing).after_help(
            "Examples:\n  uvspan run --budget 'loop.blocked.max_ms<=100' --html uvspan.html -- npm test\n  \
             uvspan run --budget 'loop.blocked.max_ms[vitest]<=200' --budget 'fs.by_op.stat.p99_ms[*]<=2' -- npx vitest run\n  \
             uvspan run --report uvspan.json --junit uvspan.xml --config uvspan.yaml -- node bench.js",
        )
    })
}

/// "8MiB", "64KiB", "4096": a power of two from 4 KiB to 1 GiB.
pub fn parse_size(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("MiB") {
        (n, 1 << 20)
    } else if let Some(n) = t.strip_suffix("KiB") {
        (n, 1 << 10)
    } else {
        (t, 1)
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("invalid size {s:?}: expected e.g. 8MiB, 256KiB, 65536"))?;
    let v = n * mult;
    if !v.is_power_of_two() || !(4096..=1 << 30).contains(&v) {
        return Err(format!("invalid size {s:?}: must be a power of two from 4KiB to 1024MiB"));
    }
    Ok(v as u32)
}

/// "10%", "10", "2.5%": a share of the time in (0, 100] %, as a fraction;
/// 100% is the same as not sampling (None).
pub fn parse_percent(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let n: f64 =
        t.strip_suffix('%').unwrap_or(t).trim().parse().map_err(|_| format!("invalid share {s:?}: expected a percentage, e.g. 10%"))?;
    if !n.is_finite() || n <= 0.0 || n > 100.0 {
        return Err(format!("invalid share {s:?}: must be more than 0% and at most 100%"));
    }
    Ok(n / 100.0)
}

/// "10ms", "1.5s", "250us", "2m", "0" (a bare number is milliseconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}: expected e.g. 10ms, 1s, 250us"))?;
    let secs = match unit.trim() {
        "" | "ms" => n / 1e3,
        "ns" => n / 1e9,
        "us" | "µs" => n / 1e6,
        "s" => n,
        "m" => n * 60.0,
        other => return Err(format!("invalid duration unit {other:?} in {s:?}: use ns, us, ms, s or m")),
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("invalid duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percents() {
        assert_eq!(parse_percent("10%"), Ok(0.1));
        assert_eq!(parse_percent(" 2.5 % "), Ok(0.025));
        assert_eq!(parse_percent("100"), Ok(1.0));
        for bad in ["0", "0%", "-5%", "101%", "ten", "", "nan%"] {
            assert!(parse_percent(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8MiB"), Ok(8 << 20));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("3MiB").is_err());
        assert!(parse_size("1KiB").is_err());
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10ms"), Ok(Duration::from_millis(10)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn probes_subcommand() {
        let c = Cli::try_parse_from(["uvspan", "probes", "--pid", "7", "--json"]).unwrap();
        assert!(matches!(c.sub, Some(Sub::Probes { pid: Some(7), path: None, json: true, .. })));
        let c = Cli::try_parse_from(["uvspan", "probes", "/usr/bin/node"]).unwrap();
        assert!(matches!(c.sub, Some(Sub::Probes { pid: None, path: Some(_), json: false, .. })));
        assert!(Cli::try_parse_from(["uvspan", "probes"]).is_err());
    }

    #[test]
    fn run_takes_its_options_and_the_tracing_ones() {
        use clap::FromArgMatches;
        let m = command()
            .try_get_matches_from([
                "uvspan",
                "run",
                "--budget",
                "dns.count==0",
                "--loop-threshold",
                "50ms",
                "--html",
                "r.html",
                "--",
                "npm",
                "test",
            ])
            .unwrap();
        let top = Cli::from_arg_matches(&m).unwrap();
        let Some(Sub::Run(opts)) = &top.sub else { panic!("not run: {top:?}") };
        assert_eq!(opts.budgets, ["dns.count==0"]);
        assert_eq!(opts.html.as_deref(), Some(std::path::Path::new("r.html")));
        let (_, sub) = m.subcommand().unwrap();
        let cli = Cli::from_arg_matches(sub).unwrap();
        assert_eq!(cli.command, ["npm", "test"]);
        assert_eq!(cli.loop_threshold, Duration::from_millis(50));
        // The top level is unchanged.
        let c = Cli::from_arg_matches(&command().try_get_matches_from(["uvspan", "--", "node", "x.js"]).unwrap()).unwrap();
        assert_eq!((c.sub.is_none(), c.command.len()), (true, 2));
        assert!(command().try_get_matches_from(["uvspan", "run", "--bogus", "--", "x"]).is_err());
    }

    #[test]
    fn command_after_dashes() {
        let c = Cli::try_parse_from(["uvspan", "--loop-threshold", "0", "--", "node", "-e", "1"]).unwrap();
        assert_eq!(c.command, ["node", "-e", "1"]);
        assert_eq!(c.loop_threshold, Duration::ZERO);
    }
}
