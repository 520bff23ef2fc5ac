//! Configuration: command-line flag > environment variable > file
//! (`--config`, YAML) > built-in default.
//!
//! Every option is declared once, as a clap argument of [`Cli`]. Its key in
//! the file is its argument id (`loop_threshold`, `otlp_listen`, `pids`)
//! (the OTLP settings are the `otlp:` section's, [`NOT_IN_FILE`]); its value is written as on the command line (a YAML list
//! for an option that takes several). What the environment and the file say
//! is installed as the arguments' default values before the command line is
//! parsed ([`layered`]), so clap parses it with the flag's own value parser
//! and a flag wins. The file also has sections no flag sets ([`SECTIONS`]).
//! See otel-config/uvspan.yaml for a documented example.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::builder::Resettable;
use clap::{Arg, ArgAction, ArgMatches, Command};
use serde::Deserialize;
use serde_yaml_ng::Value;

use crate::cli::{parse_duration, Cli};
use crate::export::BatchConfig;

/// Options with no key of their own in the file: `--otlp-endpoint` and
/// `--otlp-protocol` are over the `otlp:` section, which is read with the
/// OTEL_EXPORTER_OTLP_* variables, per signal
/// ([`crate::export::client::settings`]).
const NOT_IN_FILE: [&str; 4] = ["config", "command", "otlp_endpoint", "otlp_protocol"];

/// File keys that are not options: `otlp` (the OTLP client's settings, as
/// the OTEL_EXPORTER_OTLP_* variables), `batch` (no flag, only OTEL_BSP_*),
/// `budgets` (`uvspan run`'s, joined with its --budget flags).
const SECTIONS: [&str; 3] = ["otlp", "batch", "budgets"];

/// The configuration file.
#[derive(Debug, Default, PartialEq)]
pub struct FileConfig {
    pub otlp: Option<OtlpSection>,
    pub batch: Option<BatchSection>,
    /// `uvspan run`: budgets on its report (with the --budget flags).
    pub budgets: Option<Vec<String>>,
    /// The options the file sets, by argument id, as they would be written
    /// on the command line (checked with their value parsers).
    options: BTreeMap<String, Vec<String>>,
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
        let map: Option<serde_yaml_ng::Mapping> = serde_yaml_ng::from_str(text)?;
        let cmd = crate::cli::command();
        let mut file = FileConfig::default();
        for (key, value) in map.unwrap_or_default() {
            let Some(key) = key.as_str() else {
                bail!("{} is not a key: the keys are {}", plain(&key), keys(&cmd).join(", "));
            };
            match key {
                "otlp" => {
                    file.otlp = section(key, value)?;
                    if let Some(o) = &file.otlp {
                        crate::export::client::settings::check_file(o)?;
                    }
                }
                "batch" => file.batch = section(key, value)?,
                "budgets" => file.budgets = section(key, value)?,
                _ => {
                    let arg = cmd.get_arguments().find(|a| a.get_id() == key && has_key(a));
                    let arg = arg.ok_or_else(|| anyhow!("unknown key `{key}`: the keys are {}", keys(&cmd).join(", ")))?;
                    if let Some(words) = words(arg, value).map_err(|why| anyhow!("{key}: {why}"))? {
                        file.options.insert(key.to_string(), words);
                    }
                }
            }
        }
        for arg in cmd.get_arguments() {
            if let Some(values) = file.values(arg.get_id().as_str()) {
                check(arg, &values).map_err(|why| anyhow!("{}: {why}", key_of(arg.get_id().as_str())))?;
            }
        }
        Ok(file)
    }

    /// `--config`: uvspan's YAML file, or an OpenTelemetry configuration file (`file_format`).
    fn load_any(path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<(FileConfig, Vec<(&'static str, String)>)> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config file {}", path.display()))?;
        if otel_file::is_otel(&text) {
            return FileConfig::from_otel(&text, env)
                .with_context(|| format!("invalid OpenTelemetry configuration file {}", path.display()));
        }
        let file = FileConfig::parse(&text).with_context(|| format!("invalid config file {}", path.display()))?;
        Ok((file, Vec::new()))
    }

    /// `OTEL_CONFIG_FILE`.
    fn load_otel(path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<(FileConfig, Vec<(&'static str, String)>)> {
        let text = std::fs::read_to_string(path).with_context(|| format!("OTEL_CONFIG_FILE: cannot read {}", path.display()))?;
        FileConfig::from_otel(&text, env).with_context(|| format!("invalid OpenTelemetry configuration file {}", path.display()))
    }

    /// An OpenTelemetry configuration file: uvspan's file and the variables it sets.
    pub fn from_otel(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<(FileConfig, Vec<(&'static str, String)>)> {
        let t = otel_file::translate(&otel_file::substitute(text, env)?)?;
        let file = FileConfig::parse(&serde_yaml_ng::to_string(&t.file)?)?;
        Ok((file, t.env))
    }

    pub fn load(path: &Path) -> Result<FileConfig> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config file {}", path.display()))?;
        FileConfig::parse(&text).with_context(|| format!("invalid config file {}", path.display()))
    }

    /// What the file says for the option `id`, as on the command line.
    fn values(&self, id: &str) -> Option<Vec<String>> {
        self.options.get(id).cloned()
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

/// Whether the option `a` has a key of its own in the file.
fn has_key(a: &Arg) -> bool {
    let id = a.get_id().as_str();
    let builtin = matches!(a.get_action(), ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version);
    !builtin && !NOT_IN_FILE.contains(&id)
}

/// The file key of the option `id`.
fn key_of(id: &str) -> String {
    id.to_string()
}

/// The file's top-level keys: the options' and the sections'.
fn keys(cmd: &Command) -> Vec<String> {
    cmd.get_arguments().filter(|a| has_key(a)).map(|a| a.get_id().to_string()).chain(SECTIONS.map(String::from)).collect()
}

/// A YAML value as it was written, on one line.
fn plain(v: &Value) -> String {
    serde_yaml_ng::to_string(v).map(|s| s.trim().replace('\n', " ")).unwrap_or_else(|_| format!("{v:?}"))
}

/// A section of the file, typed.
fn section<T: serde::de::DeserializeOwned>(key: &str, value: Value) -> Result<Option<T>> {
    serde_yaml_ng::from_value(value).map_err(|e| anyhow!("{key}: {e}"))
}

/// A YAML value as the word(s) clap would see on the command line: a
/// scalar, or a list for an option that takes several; None for no value.
fn words(arg: &Arg, value: Value) -> Result<Option<Vec<String>>, String> {
    let word = |v: Value| match v {
        Value::String(s) => Ok(s),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(format!("{} is not a value as on the command line (a word, a number, true or false)", plain(&other))),
    };
    match value {
        Value::Null => Ok(None),
        Value::Sequence(items) if matches!(arg.get_action(), ArgAction::Append) => {
            let words = items.into_iter().map(word).collect::<Result<Vec<_>, _>>()?;
            Ok(Some(words).filter(|w| !w.is_empty()))
        }
        Value::Sequence(_) => Err("takes one value, not a list".to_string()),
        v => word(v).map(|w| Some(vec![w])),
    }
}

/// Parses `values` as clap will parse them as the default values of `arg`:
/// with its own value parser (split at its delimiter); the error says why.
fn check(arg: &Arg, values: &[impl AsRef<std::ffi::OsStr>]) -> Result<(), String> {
    let arg = arg.clone().env(Resettable::Reset).default_values(values.iter().map(|v| OsString::from(v.as_ref())));
    let probe = Command::new("uvspan").no_binary_name(true).arg(arg);
    probe.try_get_matches_from(std::iter::empty::<OsString>()).map(drop).map_err(|e| why(&e))
}

/// A value parser's error, on one line, without the flag it names.
fn why(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue};
    let value = match e.get(ContextKind::InvalidValue) {
        Some(ContextValue::String(v)) => v.clone(),
        _ => String::new(),
    };
    if let Some(ContextValue::Strings(valid)) = e.get(ContextKind::ValidValue) {
        return format!("{value:?} is not one of {}", valid.join(", "));
    }
    match std::error::Error::source(e).map(|s| s.to_string()) {
        Some(s) if s.contains(&format!("{value:?}")) => s,
        Some(s) => format!("{value:?}: {s}"),
        None => e.to_string().lines().next().unwrap_or("invalid value").trim_start_matches("error: ").to_string(),
    }
}

/// The command line with what the environment (`env`) and then the file say
/// installed as the options' default values, and clap's own reading of the
/// process environment off: a flag > its environment variable > the file >
/// its built-in default. A bad value in the environment is an error naming
/// the variable (the file's were checked when it was read).
fn layered(env: &dyn Fn(&str) -> Option<OsString>, file: &FileConfig) -> Result<Command> {
    let cmd = crate::cli::command();
    let mut defaults: BTreeMap<String, Vec<OsString>> = BTreeMap::new();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().to_string();
        let name = arg.get_env().and_then(|n| n.to_str());
        if let Some((name, v)) = name.and_then(|n| Some((n, env(n)?))) {
            check(arg, std::slice::from_ref(&v)).map_err(|why| anyhow!("environment variable {name}: {why}"))?;
            defaults.insert(id, vec![v]);
        } else if let Some(v) = file.values(&id) {
            defaults.insert(id, v.into_iter().map(OsString::from).collect());
        }
    }
    let install = |a: Arg| {
        let a = if a.get_env().is_some() { a.env(Resettable::Reset) } else { a };
        match defaults.get(a.get_id().as_str()) {
            Some(v) => a.default_values(v),
            None => a,
        }
    };
    // `uvspan run` has the tracing options too.
    Ok(cmd.mut_args(install).mut_subcommand("run", |run| run.mut_args(install)))
}

/// What uvspan runs with: the command line `argv`, the environment `env`
/// (a variable's value by name) and the file named by --config. A usage
/// error, --help and --version are a [`clap::Error`] in the error.
pub fn parse(argv: &[OsString], env: &dyn Fn(&str) -> Option<OsString>) -> Result<(Cli, FileConfig)> {
    // A first parse: --help, --version, usage errors, and which file.
    let first = crate::cli::command().try_get_matches_from(argv)?;
    let m = first.subcommand_matches("run").unwrap_or(&first);
    let env_str = |name: &str| env(name).and_then(|v| v.into_string().ok());
    let (file, set) = match m.get_one::<PathBuf>("config") {
        Some(p) => FileConfig::load_any(p, &env_str)?,
        None => match env_str("OTEL_CONFIG_FILE").filter(|p| !p.is_empty()) {
            Some(p) => FileConfig::load_otel(Path::new(&p), &env_str)?,
            None => (FileConfig::default(), Vec::new()),
        },
    };
    // What the OpenTelemetry configuration file sets for what reads the environment (the
    // sampler, the metric reader), unless the environment sets it: still one thread here.
    for (name, value) in set {
        if env(name).is_none() {
            std::env::set_var(name, value);
        }
    }
    let m = layered(env, &file)?.try_get_matches_from(argv)?;
    cli_with_file(&m, file)
}

/// The options of a parse of [`layered`], checked across options; `uvspan
/// run`'s budgets are the file's and the flags'.
fn cli_with_file(m: &ArgMatches, file: FileConfig) -> Result<(Cli, FileConfig)> {
    use clap::FromArgMatches;
    let mut cli = Cli::from_arg_matches(m).map_err(|e| anyhow::anyhow!("{e}"))?;
    // `uvspan run`: the tracing options are the subcommand's.
    if let (Some(crate::cli::Sub::Run(opts)), Some((_, sub))) = (&cli.sub, m.subcommand()) {
        let opts = opts.clone();
        cli = Cli::from_arg_matches(sub).map_err(|e| anyhow::anyhow!("{e}"))?;
        cli.sub = Some(crate::cli::Sub::Run(opts));
    }
    let phases = crate::probes::catalog::Detail::from_kinds(&cli.detail).phases;
    if cli.max_overhead.is_some() && phases {
        anyhow::bail!(
            "--max-overhead cannot be combined with --detail phases: phase spans need probes in every loop iteration, \
             and a budget switches them off part of the time; drop one of them"
        );
    }
    if cli.sample_time.is_some_and(|f| f < 1.0) && phases {
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
        if cli.max_overhead.is_some() {
            anyhow::bail!(
                "uvspan run cannot be combined with --max-overhead: its report and budgets count every operation, \
                 a budget switches the probes off part of the time; drop --max-overhead"
            );
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

mod otel_file;

#[cfg(test)]
mod tests;
