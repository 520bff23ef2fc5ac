//! The OpenTelemetry configuration file (`OTEL_CONFIG_FILE`, or `--config` with a
//! `file_format` key): the standard keys uvspan has a use for translated into its own file's
//! (`otlp:` per signal, `batch:`, `service_name`) and into the variables its sampler, metric
//! reader and exporters read; uvspan's own options under `extensions.uvspan`, with the keys of its
//! YAML file. `${VAR}` and `${VAR:-default}` are replaced with the environment's values first.
//! A key uvspan does not know, or a value it cannot honour, is one line naming it.

use anyhow::{anyhow, bail, Result};
use serde_yaml_ng::{Mapping, Value};

/// What the file says, in uvspan's terms.
#[derive(Debug, Default, PartialEq)]
pub struct Translated {
    /// A mapping with the keys of uvspan's own YAML file.
    pub file: Mapping,
    /// Variables the file sets (the sampler, the metric reader), for what reads them.
    pub env: Vec<(&'static str, String)>,
}

/// Whether a parsed YAML document is an OpenTelemetry configuration file.
pub fn is_otel(text: &str) -> bool {
    serde_yaml_ng::from_str::<Mapping>(text).is_ok_and(|m| m.contains_key("file_format"))
}

/// `${NAME}`, `${env:NAME}` and `${NAME:-default}` replaced by the environment's values (unset:
/// the default, or empty); `$$` is a `$`.
pub fn substitute(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body.find('}').ok_or_else(|| anyhow!("an unclosed `${{` in the file"))?;
            let inner = &body[..end];
            let (name, default) = match inner.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (inner, None),
            };
            let name = name.strip_prefix("env:").unwrap_or(name);
            if name.is_empty() || !name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
                bail!("`${{{inner}}}` is not a variable: write ${{NAME}} or ${{NAME:-default}}");
            }
            out.push_str(&env(name).filter(|v| !v.is_empty()).or(default.map(str::to_string)).unwrap_or_default());
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn map<'a>(v: &'a Value, at: &str) -> Result<Option<&'a Mapping>> {
    match v {
        Value::Null => Ok(None),
        Value::Mapping(m) => Ok(Some(m)),
        other => bail!("{at}: a mapping, not {}", super::plain(other)),
    }
}

fn keys_of<'a>(m: &'a Mapping, at: &str, known: &[&str]) -> Result<Vec<(&'a str, &'a Value)>> {
    let mut out = Vec::new();
    for (k, v) in m {
        let k = k.as_str().ok_or_else(|| anyhow!("{at}: {} is not a key", super::plain(k)))?;
        if !known.contains(&k) {
            let place = if at.is_empty() { String::new() } else { format!(" in {at}") };
            bail!("unknown key `{k}`{place} of the OpenTelemetry configuration file: uvspan reads {}", known.join(", "));
        }
        out.push((k, v));
    }
    Ok(out)
}

/// A number of milliseconds as uvspan's duration.
fn ms(v: &Value, at: &str) -> Result<String> {
    v.as_u64().map(|n| format!("{n}ms")).ok_or_else(|| anyhow!("{at}: a number of milliseconds, not {}", super::plain(v)))
}

fn string(v: &Value, at: &str) -> Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => bail!("{at}: a string, not {}", super::plain(other)),
    }
}

/// One exporter (`otlp_grpc`, `otlp_http`, `console`) → the `otlp:` keys of its signal.
fn exporter(v: &Value, at: &str, env: &mut Vec<(&'static str, String)>, console_var: &'static str) -> Result<Mapping> {
    let m = map(v, at)?.ok_or_else(|| anyhow!("{at}: name an exporter (otlp_grpc, otlp_http, console)"))?;
    let entries = keys_of(m, at, &["otlp_grpc", "otlp_http", "console", "otlp_file/development"])?;
    let [(kind, body)] = entries[..] else { bail!("{at}: one exporter") };
    let mut out = Mapping::new();
    match kind {
        "console" => {
            env.push((console_var, "console".into()));
            return Ok(out);
        }
        "otlp_file/development" => bail!("{at}.{kind}: uvspan exports over OTLP/gRPC, OTLP/HTTP or to the console"),
        "otlp_grpc" => out.insert("protocol".into(), "grpc".into()),
        _ => out.insert("protocol".into(), "http/protobuf".into()),
    };
    let at = format!("{at}.{kind}");
    let Some(body) = map(body, &at)? else { return Ok(out) };
    let known = [
        "endpoint",
        "headers",
        "headers_list",
        "compression",
        "timeout",
        "tls",
        "insecure",
        "certificate_file",
        "client_key_file",
        "client_certificate_file",
        "encoding",
        "temporality_preference",
        "default_histogram_aggregation",
    ];
    for (k, v) in keys_of(body, &at, &known)? {
        let here = format!("{at}.{k}");
        match k {
            "endpoint" => _ = out.insert("endpoint".into(), string(v, &here)?.into()),
            "compression" => _ = out.insert("compression".into(), string(v, &here)?.into()),
            "timeout" => _ = out.insert("timeout".into(), ms(v, &here)?.into()),
            "insecure" => _ = out.insert("insecure".into(), v.clone()),
            "certificate_file" => _ = out.insert("certificate".into(), string(v, &here)?.into()),
            "client_key_file" => _ = out.insert("client_key".into(), string(v, &here)?.into()),
            "client_certificate_file" => _ = out.insert("client_certificate".into(), string(v, &here)?.into()),
            "tls" => {
                for (tk, tv) in map(v, &here)?
                    .map(|m| {
                        keys_of(
                            m,
                            &here,
                            &[
                                "certificate_file",
                                "client_key_file",
                                "client_certificate_file",
                                "insecure",
                                "ca_file",
                                "cert_file",
                                "key_file",
                            ],
                        )
                    })
                    .transpose()?
                    .unwrap_or_default()
                {
                    if tv.is_null() {
                        continue;
                    }
                    let key = match tk {
                        "certificate_file" | "ca_file" => "certificate",
                        "client_key_file" | "key_file" => "client_key",
                        "client_certificate_file" | "cert_file" => "client_certificate",
                        _ => "insecure",
                    };
                    let value = if key == "insecure" { tv.clone() } else { string(tv, &format!("{here}.{tk}"))?.into() };
                    out.insert(key.into(), value);
                }
            }
            "headers" => {
                let mut h = match out.remove("headers") {
                    Some(Value::Mapping(m)) => m,
                    _ => Mapping::new(),
                };
                for e in v.as_sequence().map(Vec::as_slice).unwrap_or_default() {
                    let (Some(n), Some(val)) = (e.get("name"), e.get("value")) else {
                        bail!("{here}: a list of {{name, value}}");
                    };
                    h.insert(string(n, &here)?.into(), string(val, &here)?.into());
                }
                out.insert("headers".into(), Value::Mapping(h));
            }
            "headers_list" => {
                let mut h = match out.remove("headers") {
                    Some(Value::Mapping(m)) => m,
                    _ => Mapping::new(),
                };
                for pair in string(v, &here)?.split(',').filter(|p| !p.trim().is_empty()) {
                    let (n, val) = pair.split_once('=').ok_or_else(|| anyhow!("{here}: `name=value` pairs, not {pair:?}"))?;
                    // Headers already in `headers` win, as the schema says.
                    let n: Value = n.trim().to_string().into();
                    if !h.contains_key(&n) {
                        h.insert(n, val.trim().to_string().into());
                    }
                }
                out.insert("headers".into(), Value::Mapping(h));
            }
            "encoding" if v.as_str().is_some_and(|e| e != "protobuf") => bail!("{here}: uvspan sends protobuf only"),
            "temporality_preference" if !v.is_null() => {
                env.push(("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", string(v, &here)?));
            }
            "default_histogram_aggregation" if v.as_str().is_some_and(|a| a != "explicit_bucket_histogram") => {
                bail!("{here}: uvspan's histograms have explicit buckets")
            }
            _ => {}
        }
    }
    Ok(out)
}

/// A sampler → `OTEL_TRACES_SAMPLER` (and its argument).
fn sampler(v: &Value, at: &str, env: &mut Vec<(&'static str, String)>) -> Result<()> {
    let m = map(v, at)?.ok_or_else(|| anyhow!("{at}: name a sampler"))?;
    let entries = keys_of(m, at, &["always_on", "always_off", "trace_id_ratio_based", "parent_based"])?;
    let [(kind, body)] = entries[..] else { bail!("{at}: one sampler") };
    let ratio = |body: &Value, at: &str| -> Result<String> {
        let r = body.get("ratio").map(|r| r.as_f64().ok_or_else(|| anyhow!("{at}.ratio: a number from 0 to 1"))).transpose()?;
        Ok(r.unwrap_or(1.0).to_string())
    };
    match kind {
        "always_on" | "always_off" => env.push(("OTEL_TRACES_SAMPLER", kind.into())),
        "trace_id_ratio_based" => {
            env.push(("OTEL_TRACES_SAMPLER", "traceidratio".into()));
            env.push(("OTEL_TRACES_SAMPLER_ARG", ratio(body, &format!("{at}.{kind}"))?));
        }
        _ => {
            let at = format!("{at}.parent_based");
            let known = ["root", "remote_parent_sampled", "remote_parent_not_sampled", "local_parent_sampled", "local_parent_not_sampled"];
            let mut root = ("always_on", None);
            for (k, v) in map(body, &at)?.map(|m| keys_of(m, &at, &known)).transpose()?.unwrap_or_default() {
                let inner = map(v, &format!("{at}.{k}"))?.and_then(|m| m.iter().next()).and_then(|(k, v)| k.as_str().map(|k| (k, v)));
                let Some((name, arg)) = inner else { continue };
                match k {
                    "root" if matches!(name, "always_on" | "always_off") => root = (name, None),
                    "root" if name == "trace_id_ratio_based" => root = ("traceidratio", Some(ratio(arg, &format!("{at}.root.{name}"))?)),
                    "remote_parent_sampled" | "local_parent_sampled" if name == "always_on" => {}
                    "remote_parent_not_sampled" | "local_parent_not_sampled" if name == "always_off" => {}
                    _ => bail!("{at}.{k}: {name} is not supported: uvspan follows the parent's decision (root: always_on, always_off or trace_id_ratio_based)"),
                }
            }
            env.push(("OTEL_TRACES_SAMPLER", format!("parentbased_{}", root.0)));
            if let Some(r) = root.1 {
                env.push(("OTEL_TRACES_SAMPLER_ARG", r));
            }
        }
    }
    Ok(())
}

/// The only processor or reader of a provider: its body.
fn the_one<'a>(v: &'a Value, at: &str, kinds: &[&str]) -> Result<Option<(&'a str, &'a Value)>> {
    let Some(list) = v.as_sequence() else { return Ok(None) };
    match list.as_slice() {
        [] => Ok(None),
        [one] => {
            let m = map(one, at)?.ok_or_else(|| anyhow!("{at}: name one of {}", kinds.join(", ")))?;
            let entries = keys_of(m, at, kinds)?;
            let [(k, body)] = entries[..] else { bail!("{at}: one of {}", kinds.join(", ")) };
            Ok(Some((k, body)))
        }
        _ => bail!("{at}: uvspan exports each signal to one place; give one"),
    }
}

/// Translates an OpenTelemetry configuration file (after substitution).
pub fn translate(text: &str) -> Result<Translated> {
    let doc: Mapping = serde_yaml_ng::from_str(text)?;
    let mut t = Translated::default();
    let mut otlp = Mapping::new();
    let mut batch = Mapping::new();
    let top = [
        "file_format",
        "disabled",
        "log_level",
        "resource",
        "attribute_limits",
        "propagator",
        "tracer_provider",
        "meter_provider",
        "logger_provider",
        "instrumentation/development",
        "extensions",
    ];
    for (k, v) in keys_of(&doc, "", &top)? {
        match k {
            "file_format" => {
                let f = string(v, k)?;
                if f != "1.0" && !f.starts_with("1.0-") {
                    bail!("file_format {f:?}: uvspan reads the configuration file format 1.0");
                }
            }
            "disabled" if v.as_bool() == Some(true) => t.env.push(("OTEL_SDK_DISABLED", "true".into())),
            "resource" => {
                let at = "resource";
                for (rk, rv) in map(v, at)?
                    .map(|m| keys_of(m, at, &["attributes", "attributes_list", "detection/development", "schema_url"]))
                    .transpose()?
                    .unwrap_or_default()
                {
                    let mut pairs: Vec<(String, String)> = Vec::new();
                    match rk {
                        "attributes" => {
                            for a in rv.as_sequence().map(Vec::as_slice).unwrap_or_default() {
                                let (Some(n), Some(val)) = (a.get("name"), a.get("value")) else {
                                    bail!("resource.attributes: a list of {{name, value}}")
                                };
                                pairs.push((string(n, "resource.attributes")?, string(val, "resource.attributes")?));
                            }
                        }
                        "attributes_list" => {
                            for p in string(rv, "resource.attributes_list")?.split(',').filter(|p| !p.trim().is_empty()) {
                                let (n, val) = p.split_once('=').ok_or_else(|| anyhow!("resource.attributes_list: `name=value` pairs"))?;
                                pairs.push((n.trim().to_string(), val.trim().to_string()));
                            }
                        }
                        _ => {}
                    }
                    for (n, val) in pairs {
                        if n != "service.name" {
                            bail!("resource attribute {n}: uvspan gives each traced process its own resource (its OTEL_RESOURCE_ATTRIBUTES, container, Kubernetes); only service.name is read from the file");
                        }
                        t.file.entry("service_name".into()).or_insert(val.into());
                    }
                }
            }
            "propagator" => {
                let mut names = Vec::new();
                for (pk, pv) in map(v, k)?.map(|m| keys_of(m, k, &["composite", "composite_list"])).transpose()?.unwrap_or_default() {
                    match pk {
                        "composite" => {
                            for p in pv.as_sequence().map(Vec::as_slice).unwrap_or_default() {
                                names.extend(
                                    p.as_mapping().into_iter().flat_map(|m| m.keys()).filter_map(|k| k.as_str().map(str::to_string)),
                                );
                            }
                        }
                        _ => names.extend(
                            string(pv, "propagator.composite_list")?.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()),
                        ),
                    }
                }
                if let Some(other) = names.iter().find(|n| !matches!(n.as_str(), "tracecontext" | "baggage")) {
                    bail!("propagator {other}: uvspan reads and writes W3C tracecontext only");
                }
            }
            "tracer_provider" => {
                for (pk, pv) in map(v, k)?.map(|m| keys_of(m, k, &["processors", "sampler", "limits"])).transpose()?.unwrap_or_default() {
                    match pk {
                        "sampler" => sampler(pv, "tracer_provider.sampler", &mut t.env)?,
                        "processors" => {
                            let at = "tracer_provider.processors";
                            let Some((kind, body)) = the_one(pv, at, &["batch", "simple"])? else { continue };
                            let at = format!("{at}[0].{kind}");
                            let known = ["exporter", "schedule_delay", "export_timeout", "max_queue_size", "max_export_batch_size"];
                            for (bk, bv) in map(body, &at)?.map(|m| keys_of(m, &at, &known)).transpose()?.unwrap_or_default() {
                                let here = format!("{at}.{bk}");
                                match bk {
                                    "exporter" => {
                                        otlp.insert(
                                            "traces".into(),
                                            Value::Mapping(exporter(bv, &here, &mut t.env, "OTEL_TRACES_EXPORTER")?),
                                        );
                                    }
                                    "schedule_delay" => _ = batch.insert(bk.into(), ms(bv, &here)?.into()),
                                    "max_queue_size" | "max_export_batch_size" => _ = batch.insert(bk.into(), bv.clone()),
                                    _ => {}
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            "meter_provider" => {
                for (pk, pv) in map(v, k)?.map(|m| keys_of(m, k, &["readers", "views", "exemplar_filter"])).transpose()?.unwrap_or_default()
                {
                    if pk != "readers" {
                        continue;
                    }
                    let at = "meter_provider.readers";
                    let Some((kind, body)) = the_one(pv, at, &["periodic", "pull"])? else { continue };
                    if kind == "pull" {
                        bail!("{at}[0].pull: uvspan pushes its metrics over OTLP (no Prometheus endpoint)");
                    }
                    let at = format!("{at}[0].periodic");
                    for (rk, rv) in map(body, &at)?
                        .map(|m| keys_of(m, &at, &["exporter", "interval", "timeout", "producers", "cardinality_limits"]))
                        .transpose()?
                        .unwrap_or_default()
                    {
                        let here = format!("{at}.{rk}");
                        match rk {
                            "exporter" => {
                                otlp.insert("metrics".into(), Value::Mapping(exporter(rv, &here, &mut t.env, "OTEL_METRICS_EXPORTER")?));
                            }
                            "interval" => t.env.push((
                                "OTEL_METRIC_EXPORT_INTERVAL",
                                rv.as_u64().ok_or_else(|| anyhow!("{here}: milliseconds"))?.to_string(),
                            )),
                            _ => {}
                        }
                    }
                }
            }
            "extensions" => {
                if let Some(u) = map(v, k)?.and_then(|m| m.get("uvspan")) {
                    let own = map(u, "extensions.uvspan")?.cloned().unwrap_or_default();
                    for (ok, ov) in own {
                        if t.file.contains_key(&ok) {
                            bail!("extensions.uvspan.{}: set it in one place", super::plain(&ok));
                        }
                        t.file.insert(ok, ov);
                    }
                }
            }
            // Known, with nothing for uvspan: its spans' attributes are fixed and bounded where
            // they are read, it makes no logs of its own, it detects each process's resource.
            _ => {}
        }
    }
    for (key, section) in [("otlp", otlp), ("batch", batch)] {
        if section.is_empty() {
            continue;
        }
        if t.file.contains_key(key) {
            bail!("extensions.uvspan.{key}: set by the file's standard keys; set it in one place");
        }
        t.file.insert(key.into(), Value::Mapping(section));
    }
    Ok(t)
}
