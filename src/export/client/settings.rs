//! Where and how each signal is exported: the `OTEL_EXPORTER_OTLP_*`,
//! `OTEL_{TRACES,METRICS}_EXPORTER` and `OTEL_SDK_DISABLED` variables of the
//! OpenTelemetry SDK environment specification, the config file's `otlp:`
//! section and the command line, resolved once (pure: the environment is a
//! function, so every rule has a table test).
//!
//! Precedence per setting: command-line flag (endpoint, protocol) >
//! per-signal variable (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) > generic
//! variable (`OTEL_EXPORTER_OTLP_ENDPOINT`) > the file's per-signal section
//! (`otlp.traces.endpoint`) > the file's `otlp` keys > default. A per-signal
//! endpoint is used exactly as given; a generic one gets the signal's path
//! (`/v1/traces`) for HTTP/protobuf.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

use super::Signal;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
    HttpProtobuf,
}

impl OtlpProtocol {
    /// As OTEL_EXPORTER_OTLP_PROTOCOL spells it.
    pub fn name(self) -> &'static str {
        match self {
            OtlpProtocol::Grpc => "grpc",
            OtlpProtocol::HttpProtobuf => "http/protobuf",
        }
    }
}

impl std::str::FromStr for OtlpProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "grpc" => Ok(OtlpProtocol::Grpc),
            "http/protobuf" => Ok(OtlpProtocol::HttpProtobuf),
            other => Err(format!("unsupported OTLP protocol {other:?}: use grpc or http/protobuf (http/json is not supported)")),
        }
    }
}

/// The config file's `otlp:` section: the same settings as the variables,
/// and per-signal sections (`traces:`, `metrics:`, `logs:`) over them.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct OtlpSection {
    #[serde(flatten)]
    pub common: OtlpKeys,
    pub traces: Option<OtlpKeys>,
    pub metrics: Option<OtlpKeys>,
    pub logs: Option<OtlpKeys>,
}

/// One level of the `otlp:` section.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub struct OtlpKeys {
    pub endpoint: Option<String>,
    pub protocol: Option<String>,
    /// Sent with every export, like OTEL_EXPORTER_OTLP_HEADERS.
    pub headers: Option<BTreeMap<String, String>>,
    /// A duration (`10s`, `500ms`).
    pub timeout: Option<String>,
    /// `gzip` or `none`.
    pub compression: Option<String>,
    /// PEM file of the CA(s) to trust instead of the system's.
    pub certificate: Option<String>,
    /// Mutual TLS: this client's certificate chain and key (PEM files).
    pub client_certificate: Option<String>,
    pub client_key: Option<String>,
    /// gRPC endpoint without a scheme: plain text instead of TLS.
    pub insecure: Option<bool>,
}

/// A file path and where it was named (for errors).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub path: PathBuf,
    pub from: String,
}

/// TLS settings of an `https://` endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tls {
    /// Trusted CAs instead of the system's roots.
    pub ca: Option<Named>,
    pub client_cert: Option<Named>,
    pub client_key: Option<Named>,
}

/// Everything one signal's OTLP client needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub signal: Signal,
    /// HTTP/protobuf: the URL posted to; gRPC: the server's origin.
    pub url: String,
    pub protocol: OtlpProtocol,
    /// Where the protocol was set: `--otlp-protocol`, the variable's name,
    /// the config file's key, or the default.
    pub protocol_from: String,
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
    pub gzip: bool,
    pub tls: Tls,
}

impl Settings {
    pub fn is_tls(&self) -> bool {
        self.url.starts_with("https://")
    }
}

/// Where one signal goes.
// Built once per run: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    Off,
    Console,
    Otlp(Settings),
}

/// What the run exports: uvspan's spans and metrics, and where the app's
/// own OTLP (`--otlp-listen`) is forwarded, per signal (None: nowhere set).
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub traces: Output,
    pub metrics: Output,
    pub forward: [Option<Settings>; 3],
}

/// What the settings are made from.
pub struct Sources<'a> {
    pub env: &'a dyn Fn(&str) -> Option<String>,
    pub file: Option<&'a OtlpSection>,
    /// `--otlp-endpoint` / `--otlp-protocol` given on the command line.
    pub flag_endpoint: Option<&'a str>,
    pub flag_protocol: Option<OtlpProtocol>,
}

impl Sources<'_> {
    /// A variable's value, blank counted as unset (as the specification says).
    fn var(&self, name: &str) -> Option<(String, String)> {
        (self.env)(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).map(|v| (v, name.to_string()))
    }

    fn file_keys(&self, signal: Signal) -> [Option<&OtlpKeys>; 2] {
        let s = self.file.and_then(|f| match signal {
            Signal::Traces => f.traces.as_ref(),
            Signal::Metrics => f.metrics.as_ref(),
            Signal::Logs => f.logs.as_ref(),
        });
        [s, self.file.map(|f| &f.common)]
    }

    /// One setting: per-signal variable > generic variable > the file's
    /// per-signal key > the file's key. The value and where it came from.
    fn pick<T: Clone>(&self, signal: Signal, var: &str, key: &str, get: impl Fn(&OtlpKeys) -> Option<T>) -> Option<(Lookup<T>, String)> {
        let sig = signal.name().to_ascii_uppercase();
        if let Some((v, n)) = self.var(&format!("OTEL_EXPORTER_OTLP_{sig}_{var}")) {
            return Some((Lookup::Env(v, true), n));
        }
        if let Some((v, n)) = self.var(&format!("OTEL_EXPORTER_OTLP_{var}")) {
            return Some((Lookup::Env(v, false), n));
        }
        let [per_signal, common] = self.file_keys(signal);
        if let Some(v) = per_signal.and_then(&get) {
            return Some((Lookup::File(v, true), format!("config otlp.{}.{key}", signal.name())));
        }
        common.and_then(&get).map(|v| (Lookup::File(v, false), format!("config otlp.{key}")))
    }
}

/// A setting as found: from a variable (its text) or the file (its value);
/// `true` when it was the signal's own.
enum Lookup<T> {
    Env(String, bool),
    File(T, bool),
}

/// Resolves what the run exports.
pub fn plan(src: &Sources<'_>) -> Result<Plan> {
    let disabled = match src.var("OTEL_SDK_DISABLED") {
        Some((v, _)) => parse_bool(&v).context("OTEL_SDK_DISABLED")?,
        None => false,
    };
    let mut forward: [Option<Settings>; 3] = Default::default();
    for s in Signal::ALL {
        forward[s as usize] = resolve(s, src)?;
    }
    let output = |signal: Signal, var: &str, unset: Output| -> Result<Output> {
        if disabled {
            return Ok(Output::Off);
        }
        let Some((v, _)) = src.var(var) else { return Ok(unset) };
        match v.as_str() {
            "none" => Ok(Output::Off),
            "console" => Ok(Output::Console),
            "otlp" => Ok(Output::Otlp(match resolve(signal, src)? {
                Some(s) => s,
                None => default_settings(signal, src)?,
            })),
            other => bail!("{var}={other:?} is not supported: use otlp, console or none (one exporter per signal)"),
        }
    };
    // Unset exporters: OTLP where an endpoint is set; else spans to the
    // console and no metrics (a person is watching).
    let traces_unset = forward[0].clone().map_or(Output::Console, Output::Otlp);
    let metrics_unset = forward[1].clone().map_or(Output::Off, Output::Otlp);
    Ok(Plan {
        traces: output(Signal::Traces, "OTEL_TRACES_EXPORTER", traces_unset)?,
        metrics: output(Signal::Metrics, "OTEL_METRICS_EXPORTER", metrics_unset)?,
        forward,
    })
}

/// Checks the file's `otlp:` section alone (every key of every signal, as
/// if OTLP export were asked for), so a bad value is found when the file
/// is read.
pub fn check_file(file: &OtlpSection) -> Result<()> {
    let asked = |k: &str| matches!(k, "OTEL_TRACES_EXPORTER" | "OTEL_METRICS_EXPORTER").then(|| "otlp".to_string());
    plan(&Sources { env: &asked, file: Some(file), flag_endpoint: None, flag_protocol: None }).map(|_| ())
}

/// A signal's settings, or None when no endpoint is set for it anywhere.
pub fn resolve(signal: Signal, src: &Sources<'_>) -> Result<Option<Settings>> {
    let endpoint = match src.flag_endpoint.map(str::trim).filter(|e| !e.is_empty()) {
        Some(e) => Some((Lookup::Env(e.to_string(), false), "--otlp-endpoint".to_string())),
        None => src.pick(signal, "ENDPOINT", "endpoint", |k| k.endpoint.clone()),
    };
    let Some((endpoint, from)) = endpoint else { return Ok(None) };
    let (text, exact) = match endpoint {
        Lookup::Env(v, exact) | Lookup::File(v, exact) => (v, exact),
    };
    let mut s = settings_for(signal, src)?;
    s.url = url(signal, s.protocol, &text, exact, insecure(signal, src)?).with_context(|| format!("{from}={text:?}"))?;
    Ok(Some(s))
}

/// `OTEL_*_EXPORTER=otlp` with no endpoint: the specification's defaults.
fn default_settings(signal: Signal, src: &Sources<'_>) -> Result<Settings> {
    let mut s = settings_for(signal, src)?;
    let base = match s.protocol {
        OtlpProtocol::Grpc => "http://localhost:4317",
        OtlpProtocol::HttpProtobuf => "http://localhost:4318",
    };
    s.url = url(signal, s.protocol, base, false, false)?;
    Ok(s)
}

/// Everything but the URL.
fn settings_for(signal: Signal, src: &Sources<'_>) -> Result<Settings> {
    let (protocol, protocol_from) = match src.flag_protocol {
        Some(p) => (p, "--otlp-protocol".to_string()),
        None => match src.pick(signal, "PROTOCOL", "protocol", |k| k.protocol.clone()) {
            Some((Lookup::Env(v, _) | Lookup::File(v, _), from)) => (v.parse().map_err(|e: String| anyhow!("{from}: {e}"))?, from),
            None => (OtlpProtocol::Grpc, "the default".to_string()),
        },
    };
    let headers = match src.pick(signal, "HEADERS", "headers", |k| k.headers.clone()) {
        Some((Lookup::Env(v, _), from)) => parse_headers(&v).with_context(|| format!("invalid {from}"))?,
        Some((Lookup::File(h, _), _)) => h.into_iter().collect(),
        None => Vec::new(),
    };
    let timeout = match src.pick(signal, "TIMEOUT", "timeout", |k| k.timeout.clone()) {
        Some((Lookup::Env(v, _), from)) => {
            Duration::from_millis(v.parse::<u64>().map_err(|_| anyhow!("{from}={v:?}: give milliseconds, like 10000"))?)
        }
        Some((Lookup::File(v, _), from)) => crate::cli::parse_duration(&v).map_err(|e| anyhow!("{from}: {e}"))?,
        None => Duration::from_secs(10),
    };
    let gzip = match src.pick(signal, "COMPRESSION", "compression", |k| k.compression.clone()) {
        Some((Lookup::Env(v, _) | Lookup::File(v, _), from)) => match v.as_str() {
            "gzip" => true,
            "none" => false,
            other => bail!("{from}={other:?}: use gzip or none"),
        },
        None => false,
    };
    let path = |var: &str, key: &str, get: fn(&OtlpKeys) -> Option<String>| {
        src.pick(signal, var, key, get).map(|(l, from)| match l {
            Lookup::Env(v, _) | Lookup::File(v, _) => Named { path: PathBuf::from(v), from },
        })
    };
    let tls = Tls {
        ca: path("CERTIFICATE", "certificate", |k| k.certificate.clone()),
        client_cert: path("CLIENT_CERTIFICATE", "client_certificate", |k| k.client_certificate.clone()),
        client_key: path("CLIENT_KEY", "client_key", |k| k.client_key.clone()),
    };
    if tls.client_cert.is_some() != tls.client_key.is_some() {
        let (have, missing) = match &tls.client_cert {
            Some(c) => (c.from.clone(), "OTEL_EXPORTER_OTLP_CLIENT_KEY"),
            None => (tls.client_key.as_ref().map(|k| k.from.clone()).unwrap_or_default(), "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
        };
        bail!("mutual TLS needs a client certificate and its key: {have} is set, {missing} (or its config key) is not");
    }
    Ok(Settings { signal, url: String::new(), protocol, protocol_from, headers, timeout, gzip, tls })
}

/// `OTEL_EXPORTER_OTLP_[SIGNAL_]INSECURE`: for a gRPC endpoint without a
/// scheme, plain text (true) or TLS (false, the default).
fn insecure(signal: Signal, src: &Sources<'_>) -> Result<bool> {
    match src.pick(signal, "INSECURE", "insecure", |k| k.insecure) {
        Some((Lookup::Env(v, _), from)) => parse_bool(&v).with_context(|| from),
        Some((Lookup::File(v, _), _)) => Ok(v),
        None => Ok(false),
    }
}

/// The URL of a signal's exports. A per-signal endpoint (`exact`) is taken
/// as it is; a generic one gets `/v1/<signal>` for HTTP (after its own
/// path, less a trailing `/v1/traces` that older configurations carry).
pub fn url(signal: Signal, protocol: OtlpProtocol, endpoint: &str, exact: bool, insecure: bool) -> Result<String> {
    let e = endpoint.trim();
    let with_scheme = if e.starts_with("http://") || e.starts_with("https://") {
        e.to_string()
    } else if e.contains("://") {
        bail!("the endpoint's scheme is not http:// or https://");
    } else if protocol == OtlpProtocol::Grpc {
        // The specification: a gRPC endpoint without a scheme is TLS
        // unless OTEL_EXPORTER_OTLP_INSECURE=true.
        format!("{}://{e}", if insecure { "http" } else { "https" })
    } else {
        bail!("an HTTP endpoint must start with http:// or https://");
    };
    let uri: http::Uri = with_scheme.parse().map_err(|e| anyhow!("not a URL: {e}"))?;
    if uri.host().is_none_or(str::is_empty) {
        bail!("the endpoint has no host");
    }
    Ok(match protocol {
        OtlpProtocol::Grpc => format!("{}://{}", uri.scheme_str().unwrap_or("http"), uri.authority().map_or("", |a| a.as_str())),
        OtlpProtocol::HttpProtobuf if exact => with_scheme,
        OtlpProtocol::HttpProtobuf => {
            let base = with_scheme.trim_end_matches('/');
            let base = base.strip_suffix("/v1/traces").unwrap_or(base);
            format!("{base}{}", signal.http_path())
        }
    })
}

fn parse_bool(v: &str) -> Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        other => bail!("{other:?} is not true or false"),
    }
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `k1=v1,k2=v2`, values percent-decoded (W3C
/// baggage format, as the OpenTelemetry specification says).
pub fn parse_headers(s: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((k, v)) = item.split_once('=') else { bail!("{item:?} is not key=value") };
        let k = k.trim();
        if k.is_empty() {
            bail!("{item:?} has no header name");
        }
        out.push((k.to_string(), percent_decode(v.trim())));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests;
