//! The kernel verifies a BPF program by walking its paths, and refuses it
//! (E2BIG) past 1,000,000 instructions processed. uvspan's uprobe
//! dispatcher is one program for every probe point, and the session
//! program another: as they grow, a kernel whose verifier prunes less than
//! this one could refuse them, and uvspan would trace nothing there. Each
//! configuration that changes what the verifier walks (the constants uvspan
//! sets at load) must stay under a budget that leaves room. The walk is
//! also start-up time: both programs together stay under a smaller one.
//!
//! Root only; never skipped.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use common::*;

/// The kernel's limit (BPF_COMPLEXITY_LIMIT_INSNS).
const LIMIT: u32 = 1_000_000;
/// What the programs may take of it: the rest is for verifiers that prune
/// less.
const BUDGET: u32 = 850_000;

/// A load configuration: its name, uvspan's options, its environment.
type Config = (&'static str, &'static [&'static str], &'static [(&'static str, &'static str)]);

/// What both programs together may take in any configuration: the
/// verifier's walk is start-up time (~2 µs an instruction on the benchmark
/// machine; the walk past a second once went unnoticed by [`BUDGET`]).
const START_BUDGET: u32 = 75_000;

/// The programs checked: the uprobe dispatcher and the session program.
const PROGRAMS: [&str; 2] = ["uv_multi", "uv_session"];

/// The ids of the BPF programs process `pid` holds open.
fn prog_ids_of(pid: u32) -> BTreeSet<u32> {
    let dir = format!("/proc/{pid}/fdinfo");
    let mut ids = BTreeSet::new();
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir}: {e}")).flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else { continue };
        ids.extend(text.lines().filter_map(|l| l.strip_prefix("prog_id:")).filter_map(|v| v.trim().parse::<u32>().ok()));
    }
    ids
}

/// Instructions the verifier processed for each of [`PROGRAMS`], loaded by
/// uvspan with `args` and `env`, tracing an idle node by --pid.
fn verified(args: &[&str], env: &[(&str, &str)]) -> BTreeMap<String, u32> {
    let mut node = Command::new("node");
    node.args(["-e", "setInterval(() => {}, 1000)"]);
    let app = Running::spawn(node);
    let pid = app.pid.to_string();
    let mut all: Vec<&str> = vec!["--status-interval", "0"];
    all.extend_from_slice(args);
    all.extend(["--pid", pid.as_str()]);
    let mut c = uvspan_cmd(all);
    c.envs(env.iter().copied());
    let mut uv = Running::spawn(c);
    uv.wait_stderr(RUN_TIMEOUT, "uvspan tracing the app", |e| e.contains(&format!("tracing process {pid}")));
    let ids = prog_ids_of(uv.pid);
    let mut out = BTreeMap::new();
    for p in libbpf_rs::query::ProgInfoIter::default().filter(|p| ids.contains(&p.id)) {
        let name = p.name.to_string_lossy().into_owned();
        if PROGRAMS.contains(&name.as_str()) {
            out.insert(name, p.verified_insns);
        }
    }
    // SAFETY: kill(2) on the uvspan this test started: SIGINT, its clean stop.
    unsafe { libc::kill(uv.pid as i32, libc::SIGINT) };
    let done = uv.finish(RUN_TIMEOUT);
    assert_eq!(done.code(), Some(0), "{}", done.context());
    drop(app);
    out
}

/// Instructions the verifier processed for every program uvspan loads, run
/// with node in a PID namespace of their own (`unshare --pid`: the ids are
/// found by walking the namespace's levels, code the host's namespace never
/// verifies).
fn verified_in_a_pid_namespace() -> BTreeMap<String, u32> {
    require_tool("unshare", "it makes the PID namespace (util-linux; scripts/setup.sh installs it)");
    let mut c = Command::new("unshare");
    scrub_env(&mut c);
    c.args(["--pid", "--fork", "--mount-proc", uvspan_bin(), "--status-interval", "0", "--otlp-endpoint", "http://127.0.0.1:9"]);
    c.args(["--", "node", "-e", "setInterval(() => {}, 1000)"]);
    let mut uv = Running::spawn(c);
    uv.wait_stderr(RUN_TIMEOUT, "uvspan tracing node in the namespace", |e| e.contains("tracing command"));
    // unshare --fork's child: uvspan, the namespace's first process
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", uv.pid)).unwrap_or_default();
    let inner: u32 = children.split_whitespace().next().and_then(|p| p.parse().ok()).expect("unshare's child");
    let ids = prog_ids_of(inner);
    let out: BTreeMap<String, u32> = libbpf_rs::query::ProgInfoIter::default()
        .filter(|p| ids.contains(&p.id))
        .map(|p| (p.name.to_string_lossy().into_owned(), p.verified_insns))
        .collect();
    uv.kill_group();
    out
}

/// Every configuration that sets different constants for the verifier to
/// prune on: the default, each detail, the samplers decided in the kernel,
/// tail exceptions, no request context, --sample-time, the stack walk at
/// submits, the trace context published for profilers, the benchmark's
/// hit count; and every program in a PID namespace
/// of uvspan's own.
#[test]
fn the_programs_stay_within_the_verifiers_budget_in_every_configuration() {
    require_root();
    let configs: [Config; 11] = [
        ("default", &[], &[]),
        ("--detail all", &["--detail", "all"], &[]),
        ("always_off", &[], &[("OTEL_TRACES_SAMPLER", "always_off")]),
        ("traceidratio 0.1", &[], &[("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"), ("OTEL_TRACES_SAMPLER_ARG", "0.1")]),
        ("--keep-errors", &["--keep-errors"], &[("OTEL_TRACES_SAMPLER", "always_off")]),
        ("--requests off", &["--requests", "off"], &[]),
        ("--sample-time 50%", &["--sample-time", "50%"], &[]),
        ("--stacks all-ops", &["--stacks", "all-ops"], &[]),
        ("--publish-trace-context", &["--publish-trace-context"], &[]),
        ("hit count (benchmark)", &[], &[("UVSPAN_BENCH_COUNT_HITS", "1")]),
        ("hit count and timing (benchmark)", &[], &[("UVSPAN_BENCH_COUNT_HITS", "1"), ("UVSPAN_BENCH_TIME_HITS", "1")]),
    ];
    let mut over = Vec::new();
    // In a PID namespace: every program loads (uvspan said it traces), and
    // each stays within the budget.
    let ns = verified_in_a_pid_namespace();
    for p in PROGRAMS.iter().chain(["proc_exit", "proc_fork", "proc_exec"].iter()) {
        let n = *ns.get(*p).unwrap_or_else(|| panic!("in a PID namespace: uvspan loaded no program named {p}: {ns:?}"));
        eprintln!("in a PID namespace: {p} {n} instructions verified");
    }
    let both: u32 = PROGRAMS.iter().filter_map(|p| ns.get(*p)).sum();
    if both > START_BUDGET {
        over.push(format!("in a PID namespace: both programs {both}, over the start-up budget of {START_BUDGET}"));
    }
    over.extend(ns.iter().filter(|(_, n)| **n > BUDGET).map(|(p, n)| format!("in a PID namespace: {p} {n}")));
    for (what, args, env) in configs {
        let got = verified(args, env);
        let both: u32 = got.values().sum();
        if both > START_BUDGET {
            over.push(format!("{what}: both programs {both}, over the start-up budget of {START_BUDGET}"));
        }
        for p in PROGRAMS {
            let n = *got.get(p).unwrap_or_else(|| panic!("{what}: uvspan loaded no program named {p}: {got:?}"));
            assert!(n > 0, "{what}: {p} processed no instruction?");
            eprintln!("{what}: {p} {n} instructions verified ({:.0}% of the limit)", f64::from(n) * 100.0 / f64::from(LIMIT));
            if n > BUDGET {
                over.push(format!("{what}: {p} {n}"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "over the budget of {BUDGET} of the verifier's {LIMIT} instructions a program (other kernels' verifiers may refuse \
         it), or of {START_BUDGET} for both (start-up time): {over:?}"
    );
}
