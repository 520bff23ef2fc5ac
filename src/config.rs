//! The configuration file (`--config`, YAML). Every command-line option can
//! be set there; precedence is flag > environment variable > file > default.
//! See otel-config/uvspan.yaml for a documented example.

use std::path::Path;

use anyhow::{Context, Result};
use clap::parser::ValueSource;
use clap::ArgMatches;
use serde::Deserialize;

use crate::cli::{parse_duration, Cli};
use crate::export::BatchConfig;

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct FileConfig {
    pub pids: Option<Vec<u32>>,
    pub all: Option<bool>,
    pub cgroup: Option<String>,
    pub container: Option<String>,
    pub exclude_already_instrumented: Option<bool>,
    pub service_name: Option<String>,
    pub loop_threshold: Option<String>,
    pub flush_timeout: Option<String>,
    pub status_interval: Option<String>,
    pub ring_buffer_size: Option<String>,
    pub symbol_cache: Option<String>,
    /// Request context: on or off.
    pub requests: Option<String>,
    /// Loop-thread stacks on slow iterations: slow-iterations, all-ops or off.
    pub stacks: Option<String>,
    /// Optional probe groups: [threadpool, phases] or [all].
    pub detail: Option<Vec<String>>,
    /// --sample-time, e.g. "10%".
    pub sample_time: Option<String>,
    pub otlp: Option<OtlpSection>,
    /// --otlp-listen addresses and --join-window.
    pub otlp_listen: Option<Vec<String>>,
    pub join_window: Option<String>,
    pub otlp_listen_queue: Option<String>,
    pub batch: Option<BatchSection>,
    /// `uvspan run`: budgets on its report (with the --budget flags).
    pub budgets: Option<Vec<String>>,
}

/// `otlp:`, read with the OTEL_EXPORTER_OTLP_* variables (see
/// [`crate::export::client::settings`]).
pub use crate::export::client::settings::OtlpSection;

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct BatchSection {
    pub max_queue_size: Option<u64>,
    pub max_export_batch_size: Option<usize>,
    pub schedule_delay: Option<String>,
}

impl FileConfig {
    pub fn parse(text: &str) -> Result<FileConfig> {
        Ok(serde_yaml_ng::from_str::<Option<FileConfig>>(text)?.unwrap_or_default())
    }

    pub fn load(path: &Path) -> Result<FileConfig> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config file {}", path.display()))?;
        FileConfig::parse(&text).with_context(|| format!("invalid config file {}", path.display()))
    }

    /// Fills the options that neither a flag nor an environment variable set.
    pub fn apply(&self, cli: &mut Cli, m: &ArgMatches) -> Result<()> {
        let unset = |id: &str| !matches!(m.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable));
        let dur = |name: &str, v: &Option<String>| -> Result<Option<std::time::Duration>> {
            v.as_deref().map(parse_duration).transpose().map_err(|e| anyhow::anyhow!("config {name}: {e}"))
        };
        if let (true, Some(v)) = (unset("pids"), &self.pids) {
            cli.pids = v.clone();
        }
        if let (true, Some(v)) = (unset("all"), self.all) {
            cli.all = v;
        }
        if let (true, Some(v)) = (unset("cgroup"), &self.cgroup) {
            cli.cgroup = Some(v.clone());
        }
        if let (true, Some(v)) = (unset("container"), &self.container) {
            cli.container = Some(v.clone());
        }
        if let (true, Some(v)) = (unset("exclude_already_instrumented"), self.exclude_already_instrumented) {
            cli.exclude_already_instrumented = v;
        }
        if let (true, Some(v)) = (unset("service_name"), &self.service_name) {
            cli.service_name = Some(v.clone());
        }
        if let (true, Some(v)) = (unset("loop_threshold"), dur("loop_threshold", &self.loop_threshold)?) {
            cli.loop_threshold = v;
        }
        if let (true, Some(v)) = (unset("flush_timeout"), dur("flush_timeout", &self.flush_timeout)?) {
            cli.flush_timeout = v;
        }
        if let (true, Some(v)) = (unset("status_interval"), dur("status_interval", &self.status_interval)?) {
            cli.status_interval = v;
        }
        if let (true, Some(v)) = (unset("ring_buffer_size"), &self.ring_buffer_size) {
            cli.ring_buffer_size = crate::cli::parse_size(v).map_err(|e| anyhow::anyhow!("config ring_buffer_size: {e}"))?;
        }
        if let (true, Some(v)) = (unset("symbol_cache"), &self.symbol_cache) {
            cli.symbol_cache = v.clone();
        }
        if let (true, Some(v)) = (unset("requests"), &self.requests) {
            use clap::ValueEnum;
            cli.requests = crate::cli::RequestsMode::from_str(v.trim(), true)
                .map_err(|_| anyhow::anyhow!("config requests: {v:?}: use on, always or off"))?;
        }
        if let (true, Some(v)) = (unset("stacks"), &self.stacks) {
            use clap::ValueEnum;
            cli.stacks = crate::cli::StacksMode::from_str(v.trim(), true)
                .map_err(|_| anyhow::anyhow!("config stacks: {v:?}: use slow-iterations, all-ops or off"))?;
        }
        if let (true, Some(v)) = (unset("detail"), &self.detail) {
            use clap::ValueEnum;
            cli.detail = v
                .iter()
                .map(|k| {
                    crate::probes::catalog::DetailKind::from_str(k.trim(), true)
                        .map_err(|_| anyhow::anyhow!("config detail: unknown group {k:?}: use threadpool, phases or all"))
                })
                .collect::<Result<_>>()?;
        }
        if let (true, Some(v)) = (unset("otlp_listen"), &self.otlp_listen) {
            cli.otlp_listen = v
                .iter()
                .map(|a| a.trim().parse().map_err(|_| anyhow::anyhow!("config otlp_listen: {a:?} is not an address like 127.0.0.1:4317")))
                .collect::<Result<_>>()?;
        }
        if let (true, Some(v)) = (unset("join_window"), dur("join_window", &self.join_window)?) {
            cli.join_window = v;
        }
        if let (true, Some(v)) = (unset("otlp_listen_queue"), &self.otlp_listen_queue) {
            cli.otlp_listen_queue = crate::cli::parse_size(v).map_err(|e| anyhow::anyhow!("config otlp_listen_queue: {e}"))?;
        }
        if let (true, Some(v)) = (unset("sample_time"), &self.sample_time) {
            cli.sample_time = Some(crate::cli::parse_percent(v).map_err(|e| anyhow::anyhow!("config sample_time: {e}"))?);
        }
        Ok(())
    }

    /// Batching: OTEL_BSP_* environment > file > default.
    pub fn batch(&self) -> Result<BatchConfig> {
        let mut c = BatchConfig::default();
        if let Some(b) = &self.batch {
            if let Some(v) = b.max_queue_size {
                c.max_queue_spans = v.max(1);
            }
            if let Some(v) = b.max_export_batch_size {
                c.max_batch = v.max(1);
            }
            if let Some(v) = &b.schedule_delay {
                c.schedule_delay = parse_duration(v)
                    .map_err(|e| anyhow::anyhow!("config batch.schedule_delay: {e}"))?
                    .max(std::time::Duration::from_millis(1));
            }
        }
        let env = |k: &str| std::env::var(k).ok().and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(v) = env("OTEL_BSP_MAX_QUEUE_SIZE") {
            c.max_queue_spans = v.max(1);
        }
        if let Some(v) = env("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") {
            c.max_batch = v.max(1) as usize;
        }
        if let Some(v) = env("OTEL_BSP_SCHEDULE_DELAY") {
            c.schedule_delay = std::time::Duration::from_millis(v.max(1));
        }
        Ok(c)
    }
}

/// Parses the command line, then applies the config file under it.
pub fn cli_with_file(m: &ArgMatches) -> Result<(Cli, FileConfig)> {
    use clap::FromArgMatches;
    let mut cli = Cli::from_arg_matches(m).map_err(|e| anyhow::anyhow!("{e}"))?;
    // `uvspan run`: the tracing options are the subcommand's.
    let m = match (&cli.sub, m.subcommand()) {
        (Some(crate::cli::Sub::Run(opts)), Some((_, sub))) => {
            let opts = opts.clone();
            cli = Cli::from_arg_matches(sub).map_err(|e| anyhow::anyhow!("{e}"))?;
            cli.sub = Some(crate::cli::Sub::Run(opts));
            sub
        }
        _ => m,
    };
    let file = match &cli.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    file.apply(&mut cli, m)?;
    if cli.sample_time.is_some_and(|f| f < 1.0) && crate::probes::catalog::Detail::from_kinds(&cli.detail).phases {
        anyhow::bail!(
            "--sample-time cannot be combined with --detail phases: phase spans need probes in every loop iteration \
             (slow iterations are still reported with --sample-time, without phase children); drop one of them"
        );
    }
    let misused = cli.command.is_empty() || !cli.pids.is_empty() || cli.discover();
    if let Some(crate::cli::Sub::Run(opts)) = &mut cli.sub {
        if misused {
            anyhow::bail!("uvspan run traces a command it starts: give -- COMMAND [ARGS...] (not --pid or --all); see uvspan run --help");
        }
        if cli.sample_time.is_some_and(|f| f < 1.0) {
            anyhow::bail!(
                "uvspan run cannot be combined with --sample-time: its report and budgets count every operation, \
                 sampling windows would count a share of them; drop --sample-time"
            );
        }
        // The file's budgets and the flags' all apply; a bad one stops here (exit 2).
        let flags = std::mem::take(&mut opts.budgets);
        opts.budgets = file.budgets.clone().unwrap_or_default().into_iter().chain(flags).collect();
        for b in &opts.budgets {
            crate::report::budget::Budget::parse(b)?;
        }
    }
    Ok((cli, file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn with(args: &[&str], yaml: &str) -> Cli {
        let m = Cli::command().try_get_matches_from(args).unwrap();
        use clap::FromArgMatches;
        let mut cli = Cli::from_arg_matches(&m).unwrap();
        FileConfig::parse(yaml).unwrap().apply(&mut cli, &m).unwrap();
        cli
    }

    #[test]
    fn file_fills_what_flags_do_not_set() {
        let yaml = "all: true\nloop_threshold: 50ms\nservice_name: shop\notlp:\n  endpoint: http://c:4317\n  protocol: http/protobuf\n";
        let c = with(&["uvspan"], yaml);
        assert!(c.all);
        assert_eq!(c.loop_threshold, std::time::Duration::from_millis(50));
        assert_eq!(c.service_name.as_deref(), Some("shop"));
        assert_eq!(FileConfig::parse(yaml).unwrap().otlp.unwrap().common.protocol.as_deref(), Some("http/protobuf"));
        // A flag wins over the file.
        let c = with(&["uvspan", "--loop-threshold", "5ms", "--service-name", "cli"], yaml);
        assert_eq!(c.loop_threshold, std::time::Duration::from_millis(5));
        assert_eq!(c.service_name.as_deref(), Some("cli"));
    }

    #[test]
    fn bad_files_are_errors() {
        assert!(FileConfig::parse("bogus_key: 1").is_err());
        assert!(FileConfig::parse("all: maybe").is_err());
        assert_eq!(FileConfig::parse("").unwrap(), FileConfig::default());
        let m = Cli::command().try_get_matches_from(["uvspan"]).unwrap();
        use clap::FromArgMatches;
        let mut cli = Cli::from_arg_matches(&m).unwrap();
        assert!(FileConfig::parse("loop_threshold: soon").unwrap().apply(&mut cli, &m).is_err());
        let e = FileConfig::parse("detail: [threadpool, everything]").unwrap().apply(&mut cli, &m).unwrap_err();
        assert!(e.to_string().contains("unknown group \"everything\""), "{e}");
    }

    #[test]
    fn detail_from_file_flag_and_env() {
        use crate::probes::catalog::{Detail, DetailKind};
        use clap::FromArgMatches;
        let get = |args: &[&str], yaml: &str| {
            let m = Cli::command().try_get_matches_from(args).unwrap();
            let mut cli = Cli::from_arg_matches(&m).unwrap();
            FileConfig::parse(yaml).unwrap().apply(&mut cli, &m).unwrap();
            Detail::from_kinds(&cli.detail)
        };
        assert_eq!(get(&["uvspan"], ""), Detail { threadpool: false, phases: false, requests: true });
        assert_eq!(get(&["uvspan"], "detail: [threadpool]"), Detail { threadpool: true, phases: false, requests: true });
        assert_eq!(get(&["uvspan"], "detail: [all]"), Detail::all());
        // the flag wins over the file
        assert_eq!(
            get(&["uvspan", "--detail", "phases"], "detail: [threadpool]"),
            Detail { threadpool: false, phases: true, requests: true }
        );
        assert_eq!(get(&["uvspan", "--detail", "threadpool,phases"], ""), Detail::all());
        assert_eq!(Detail::from_kinds(&[DetailKind::All]), Detail::all());
        assert!(Cli::command().try_get_matches_from(["uvspan", "--detail", "loop"]).is_err());
        assert!(Cli::command().try_get_matches_from(["uvspan", "--detail", "requests"]).is_err(), "not a --detail group");
        let req = |args: &[&str], yaml: &str| {
            let m = Cli::command().try_get_matches_from(args).unwrap();
            let mut cli = Cli::from_arg_matches(&m).unwrap();
            FileConfig::parse(yaml).unwrap().apply(&mut cli, &m).unwrap();
            cli.requests
        };
        use crate::cli::RequestsMode;
        assert_eq!(req(&["uvspan"], ""), RequestsMode::On);
        assert_eq!(req(&["uvspan"], "requests: off"), RequestsMode::Off);
        assert_eq!(req(&["uvspan", "--requests", "on"], "requests: off"), RequestsMode::On);
    }

    #[test]
    fn otlp_listen_from_file_and_flag() {
        let c = with(&["uvspan"], "otlp_listen: [127.0.0.1:4317, '[::1]:4318']\njoin_window: 2s");
        assert_eq!(c.otlp_listen, vec!["127.0.0.1:4317".parse().unwrap(), "[::1]:4318".parse().unwrap()]);
        assert_eq!(c.join_window, std::time::Duration::from_secs(2));
        let c = with(&["uvspan", "--otlp-listen", "127.0.0.1:1,127.0.0.1:2"], "otlp_listen: [127.0.0.1:4317]");
        assert_eq!(c.otlp_listen.len(), 2, "the flag wins");
        assert_eq!(with(&["uvspan"], "").join_window, std::time::Duration::from_secs(6));
        let m = Cli::command().try_get_matches_from(["uvspan"]).unwrap();
        let mut cli = clap::FromArgMatches::from_arg_matches(&m).unwrap();
        assert!(FileConfig::parse("otlp_listen: [nowhere]").unwrap().apply(&mut cli, &m).is_err());
    }

    #[test]
    fn stacks_from_the_file_unless_the_flag_is_given() {
        use crate::cli::StacksMode;
        use clap::FromArgMatches;
        let get = |args: &[&str], yaml: &str| {
            let m = Cli::command().try_get_matches_from(args).unwrap();
            let mut cli = Cli::from_arg_matches(&m).unwrap();
            FileConfig::parse(yaml).and_then(|f| f.apply(&mut cli, &m)).map(|_| cli.stacks)
        };
        assert_eq!(get(&["uvspan"], "").unwrap(), StacksMode::SlowIterations);
        assert_eq!(get(&["uvspan"], "stacks: off").unwrap(), StacksMode::Off);
        assert_eq!(get(&["uvspan"], "stacks: all-ops").unwrap(), StacksMode::AllOps);
        assert_eq!(get(&["uvspan", "--stacks", "slow-iterations"], "stacks: off").unwrap(), StacksMode::SlowIterations);
        let e = get(&["uvspan"], "stacks: sometimes").unwrap_err().to_string();
        assert!(e.contains("config stacks"), "{e}");
    }

    #[test]
    fn shipped_example_parses() {
        let text = include_str!("../otel-config/uvspan.yaml");
        FileConfig::parse(text).unwrap();
    }
}
