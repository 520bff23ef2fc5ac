//! `--all`: which processes to trace. Every Node.js process on the host (in
//! uvspan's PID namespace), optionally only those in a cgroup or container,
//! optionally not those already instrumented in-process by OpenTelemetry JS.
//! New processes are reported by the kernel at exec (bpf `proc_exec`), not
//! found by polling /proc.

use crate::enrich::resource::{self, ProcFacts};

pub mod pidns;
pub mod target;
pub mod tree;
pub mod watcher;

#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only processes whose cgroup path starts with this.
    pub cgroup: Option<String>,
    /// Only processes whose container id starts with this.
    pub container: Option<String>,
    /// Skip processes that load the OpenTelemetry JS SDK.
    pub exclude_instrumented: bool,
}

/// What /proc says about a candidate, read once.
pub type Candidate = ProcFacts;

impl Filter {
    /// Whether the filter keeps this candidate (pure).
    pub fn admits(&self, c: &Candidate) -> bool {
        if let Some(want) = &self.cgroup {
            let want = want.trim_end_matches('/');
            if !c.cgroups.iter().any(|p| p == want || p.starts_with(&format!("{want}/")) || want.is_empty()) {
                return false;
            }
        }
        if let Some(want) = &self.container {
            let id = c.cgroups.iter().find_map(|p| resource::container_id(p));
            if !id.is_some_and(|id| !want.is_empty() && id.starts_with(want.as_str())) {
                return false;
            }
        }
        !(self.exclude_instrumented && instrumented(&c.argv, &c.env))
    }
}

/// Signs that a process loads the OpenTelemetry JS SDK at start: a
/// `--require`/`--import` of an `@opentelemetry/` module (in argv or
/// NODE_OPTIONS), or the auto-instrumentation's own switch. An app that
/// imports the SDK from its own code is not recognised.
pub fn instrumented(argv: &[String], env: &[(String, String)]) -> bool {
    let otel_module = |s: &str| s.contains("@opentelemetry/");
    argv.iter().any(|a| otel_module(a))
        || env.iter().any(|(k, v)| (k == "NODE_OPTIONS" && otel_module(v)) || k == "OTEL_NODE_ENABLED_INSTRUMENTATIONS")
}

/// Every process visible in /proc, in PID order.
pub fn all_pids() -> Vec<u32> {
    let mut pids: Vec<u32> =
        procfs::process::all_processes().map(|it| it.flatten().filter_map(|p| u32::try_from(p.pid).ok()).collect()).unwrap_or_default();
    pids.sort_unstable();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(cg: &[&str], argv: &[&str], env: &[&str]) -> Candidate {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
        let env = env.iter().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Candidate { cgroups: v(cg), argv: v(argv), env, ..Candidate::default() }
    }

    fn env(kvs: &[&str]) -> Vec<(String, String)> {
        kvs.iter().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn cgroup_filter_matches_prefix_on_boundaries() {
        let f = Filter { cgroup: Some("/kubepods/pod1".into()), ..Default::default() };
        assert!(f.admits(&cand(&["/kubepods/pod1/abc"], &[], &[])));
        assert!(f.admits(&cand(&["/kubepods/pod1"], &[], &[])));
        assert!(!f.admits(&cand(&["/kubepods/pod12/abc"], &[], &[])));
    }

    #[test]
    fn container_filter_takes_short_ids() {
        let id = "0123456789abcdef".repeat(4);
        let f = Filter { container: Some("0123456789ab".into()), ..Default::default() };
        assert!(f.admits(&cand(&[&format!("/system.slice/docker-{id}.scope")], &[], &[])));
        assert!(!f.admits(&cand(&["/user.slice"], &[], &[])));
    }

    #[test]
    fn recognises_otel_js() {
        assert!(instrumented(&["node".into(), "--require".into(), "@opentelemetry/auto-instrumentations-node/register".into()], &[]));
        assert!(instrumented(&[], &env(&["NODE_OPTIONS=--import @opentelemetry/x"])));
        assert!(!instrumented(&["node".into(), "app.js".into()], &env(&["NODE_OPTIONS=--max-old-space-size=100"])));
        let f = Filter { exclude_instrumented: true, ..Default::default() };
        assert!(!f.admits(&cand(&["/"], &["node", "-r", "@opentelemetry/api"], &[])));
        assert!(f.admits(&cand(&["/"], &["node", "app.js"], &[])));
    }
}
