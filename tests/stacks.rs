//! Who blocked the loop (--stacks, on by default): node processes started
//! with no flags run tests/fixtures/blocker.js, whose timers block the loop
//! inside named nested functions (onTimer → handleRequest →
//! parseBigPayload, ~180 ms) and inside a warmed-up, optimized function
//! (hotChecksum). The slow iterations' spans, received over OTLP, must name
//! those functions and their file, on every official build 18–26 (from the
//! matrix cache, tests/common/node_builds.rs), Debian's (libnode) and a
//! stripped node; `--stacks all-ops` names the submitter of fs/DNS operations.
//!
//! Nothing here bounds a duration: the fixture's blocks are long compared
//! with the 50 ms threshold, and the checks are about names.

mod common;

use std::path::Path;

use common::*;

/// One run of blocker.js under uvspan: its output and the iteration spans.
fn run_blocker(node: &Path, extra: &[&str]) -> (Output, Vec<Span>) {
    run_blocker_env(node, extra, &[])
}

fn run_blocker_env(node: &Path, extra: &[&str], env: &[(&str, &str)]) -> (Output, Vec<Span>) {
    run_fixture(node, "blocker.js", extra, env)
}

/// One run of a fixture under uvspan (--loop-threshold 50ms): its output
/// and the iteration spans.
fn run_fixture(node: &Path, name: &str, extra: &[&str], env: &[(&str, &str)]) -> (Output, Vec<Span>) {
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let script = fixture(name);
    let node = node.to_string_lossy().into_owned();
    let mut args = vec!["--loop-threshold", "50ms", "--otlp-endpoint", &ep, "--otlp-protocol", "grpc"];
    args.extend_from_slice(extra);
    args.extend(["--", &node, &script]);
    let mut cmd = uvspan_cmd(args);
    cmd.envs(env.iter().copied());
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let m = Markers::parse(&out.stdout);
    let _ = m.get("done");
    let spans = rx.spans().into_iter().filter(|s| s.name == "uv.loop.iteration").collect();
    (out, spans)
}

fn stacktrace(s: &Span) -> &str {
    s.str("code.stacktrace").unwrap_or("")
}

/// Every sampled stack of every iteration, for failure messages.
fn stacks_of(spans: &[Span]) -> String {
    let mut t = String::new();
    for s in spans {
        t += &format!("iteration {}\n", s.brief().lines().next().unwrap_or(""));
        for e in &s.events {
            let n = e.attributes.get("uvspan.stack.samples").map(|a| a.to_string()).unwrap_or_default();
            let st = e.attributes.get("code.stacktrace").map(|a| a.to_string()).unwrap_or_default();
            t += &format!("  {n} samples:\n    {}\n", st.replace('\n', "\n    "));
        }
    }
    t
}

/// The iteration whose heaviest stack runs `leaf`.
fn blocked_in<'a>(spans: &'a [Span], leaf: &str, out: &Output) -> &'a Span {
    spans
        .iter()
        .find(|s| s.str("uvspan.loop.blocked_by").is_some_and(|b| b.starts_with(&format!("{leaf} ("))))
        .unwrap_or_else(|| panic!("no slow iteration blocked in {leaf}\n{}\n{}", stacks_of(spans), out.context()))
}

/// The checks every build with V8 metadata passes.
fn names_the_blockers(node: &Path, label: &str) {
    require_root();
    let (out, spans) = run_blocker(node, &[]);
    let parse = blocked_in(&spans, "parseBigPayload", &out);
    let trace = stacktrace(parse);
    let lines: Vec<&str> = trace.lines().collect();
    // Innermost first: the parser, its caller, the timer callback.
    let pos = |name: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(&format!("{name} (")))
            .unwrap_or_else(|| panic!("{label}: {name} is not on the heaviest stack:\n{trace}"))
    };
    assert!(pos("parseBigPayload") < pos("handleRequest") && pos("handleRequest") < pos("onTimer"), "{label}:\n{trace}");
    for name in ["parseBigPayload", "handleRequest", "onTimer"] {
        let line = lines[pos(name)];
        assert!(line.contains("blocker.js:"), "{label}: {name} without its file and line: {line}");
    }
    // parseBigPayload is declared on line 9 of the fixture.
    assert!(lines[pos("parseBigPayload")].contains("blocker.js:9:"), "{label}: {}", lines[pos("parseBigPayload")]);
    // The native frames below the JS ones are named, down to libuv's loop.
    assert!(lines.iter().any(|l| l.starts_with("uv_run (")), "{label}: no uv_run frame:\n{trace}");
    let samples = parse.int("uvspan.loop.stack_samples").expect("stack_samples");
    assert!(samples > 0, "{label}");
    // One event per distinct stack, their counts within the total.
    let events: Vec<&Event> = parse.events.iter().filter(|e| e.name == "uvspan.loop.stack").collect();
    assert!(!events.is_empty(), "{label}: no stack events");
    let counted: i64 = events
        .iter()
        .map(|e| match e.attributes.get("uvspan.stack.samples") {
            Some(Attr::Int(n)) => *n,
            other => panic!("{label}: stack event without a sample count: {other:?}"),
        })
        .sum();
    assert!(counted > 0 && counted <= samples, "{label}: events count {counted} of {samples} samples");
    assert!(events.iter().all(|e| matches!(e.attributes.get("code.stacktrace"), Some(Attr::Str(_)))), "{label}");

    // The optimized function: warmed up before the timer, then run hot.
    let hot = blocked_in(&spans, "hotChecksum", &out);
    assert!(stacktrace(hot).contains("onHotTimer (") && stacktrace(hot).contains("blocker.js:"), "{label}:\n{}", stacktrace(hot));
    (out, spans).0.stderr.lines().for_each(|l| assert!(!l.contains("panicked"), "{label}: {l}"));
}

/// The phase the samples fell in, from the libuv frames under the JS ones:
/// both blockers run in timer callbacks.
fn timers_phase(node: &Path, label: &str) {
    require_root();
    let (out, spans) = run_blocker(node, &[]);
    let parse = blocked_in(&spans, "parseBigPayload", &out);
    let timers = parse.double("uvspan.loop.phase.timers_ms").unwrap_or_else(|| panic!("{label}: no timers phase: {}", parse.brief()));
    assert!(timers > 0.0, "{label}");
    assert_eq!(parse.double("uvspan.loop.phase.poll_ms"), None, "{label}: {}", parse.brief());
}

#[test]
fn node_20_names_the_js_functions_that_blocked_the_loop() {
    names_the_blockers(&official_node(20), "node 20");
}

#[test]
fn node_18_names_the_js_functions_that_blocked_the_loop() {
    names_the_blockers(&official_node(18), "node 18");
}

#[test]
fn node_22_names_the_js_functions_that_blocked_the_loop() {
    names_the_blockers(&official_node(22), "node 22");
}

#[test]
fn node_24_names_the_js_functions_that_blocked_the_loop() {
    names_the_blockers(&official_node(24), "node 24");
}

#[test]
fn node_26_names_the_js_functions_that_blocked_the_loop() {
    names_the_blockers(&official_node(26), "node 26");
}

#[test]
fn the_blocked_phase_comes_from_the_native_frames() {
    timers_phase(&official_node(20), "node 20");
}

/// A stripped node keeps V8's metadata in .dynsym: JS frames are still
/// named; native frames it no longer names show module+offset.
#[test]
fn stripped_node_still_names_js_frames() {
    require_root();
    let node = stripped_node();
    let (out, spans) = run_blocker(&node, &[]);
    let parse = blocked_in(&spans, "parseBigPayload", &out);
    let trace = stacktrace(parse);
    assert!(trace.contains("handleRequest (") && trace.contains("onTimer ("), "{trace}");
    assert!(trace.lines().any(|l| l.contains("node+0x")), "unnamed native frames show module+offset:\n{trace}");
    assert_eq!(parse.str("uvspan.loop.stacks_notice"), None, "{}", parse.brief());
}

/// Debian's nodejs keeps V8 (and its metadata) in libnode.so.108, its
/// libuv stripped and shared: JS frames are named from libnode's metadata,
/// native ones from its exported symbols.
#[test]
fn debian_node_names_js_frames_from_libnode() {
    require_root();
    let d = debian_node();
    let lib = d.lib_dir.to_string_lossy().into_owned();
    let (out, spans) = run_blocker_env(&d.node, &[], &[("LD_LIBRARY_PATH", lib.as_str())]);
    let parse = blocked_in(&spans, "parseBigPayload", &out);
    let trace = stacktrace(parse);
    assert!(trace.contains("handleRequest (") && trace.contains("onTimer (") && trace.contains("blocker.js:"), "{trace}");
    assert!(trace.contains("(libnode.so.108"), "native frames in libnode are named after it:\n{trace}");
}

#[test]
fn stacks_off_opens_no_sampler() {
    require_root();
    let (out, spans) = run_blocker(&official_node(20), &["--stacks", "off"]);
    assert!(spans.len() >= 2, "the slow iterations are still reported\n{}", out.context());
    for s in &spans {
        assert_eq!(s.str("code.stacktrace"), None, "{}", s.brief());
        assert!(s.events.iter().all(|e| e.name != "uvspan.loop.stack"), "{}", s.brief());
    }
}

/// `--stacks all-ops`: each fs and DNS operation's span carries the stack
/// that submitted it, JS functions named; the default mode adds none.
#[test]
fn all_ops_names_the_js_function_that_submitted_each_operation() {
    require_root();
    let script = fixture("submit_stacks.js");
    let dir = TempDir::new("submit-stacks");
    let data = dir.join("data.txt");
    std::fs::write(&data, "a data file\n").expect("write the data file");
    let run_with = |mode: &str| {
        let rx = Receiver::start(Protocol::Grpc);
        let ep = rx.endpoint();
        let out = run(uvspan_cmd(["--stacks", mode, "--otlp-endpoint", &ep, "--otlp-protocol", "grpc", "--", "node", &script, &data]));
        assert_eq!(out.code(), Some(0), "{}", out.context());
        let _ = Markers::parse(&out.stdout).get("done");
        (out, rx.spans())
    };
    let (out, spans) = run_with("all-ops");
    let find = |name: &str, pred: &dyn Fn(&Span) -> bool| {
        spans.iter().find(|s| s.name == name && pred(s)).unwrap_or_else(|| panic!("no {name} span\n{}", out.context()))
    };
    let mine = |s: &Span| s.str("file.path") == Some(data.as_str());
    let stat = find("fs.stat", &|s| mine(s) && s.bool("uvspan.sync") == Some(true) && stacktrace(s).contains("statTheFile ("));
    assert!(stacktrace(stat).contains("submit_stacks.js:11:"), "{}", stacktrace(stat));
    let open = find("fs.open", &|s| mine(s) && s.bool("uvspan.sync") == Some(false));
    assert!(stacktrace(open).contains("readIt (") && stacktrace(open).contains("submit_stacks.js:"), "{}", stacktrace(open));
    let dns = find("dns.getaddrinfo", &|s| s.str("dns.question.name") == Some("localhost"));
    assert!(stacktrace(dns).contains("lookItUp ("), "{}", stacktrace(dns));
    let (_, spans) = run_with("slow-iterations");
    assert!(spans.iter().any(|s| s.name.starts_with("fs.")), "fs spans are still there");
    assert!(spans.iter().all(|s| !s.name.starts_with("fs.") || s.str("code.stacktrace").is_none()), "no submit stacks by default");
}

/// The sampler's per-CPU events are on only while an iteration is slow: a
/// process that iterates fast for 1.5 s (~4,500 iterations) and then blocks
/// its loop twice turns them on at least twice (not once from the start and
/// left on) and not for each fast iteration (a preemption of the app longer
/// than half the threshold on a loaded machine may add one), and both slow
/// iterations are still named. The gate woken by the timer tracepoint, and
/// the gate that looks every half threshold (where the tracepoint cannot
/// be attached).
#[test]
fn the_sampler_is_on_only_while_an_iteration_is_slow() {
    require_root();
    sampler_gate_run(&[]);
}

#[test]
fn the_polling_sampler_gate_is_on_only_while_an_iteration_is_slow() {
    require_root();
    sampler_gate_run(&[("UVSPAN_BENCH_GATE_POLL", "1")]);
}

fn sampler_gate_run(env: &[(&str, &str)]) {
    let (out, spans) = run_fixture(&official_node(20), "sampler_gate.js", &[], env);
    // The polling gate says so; the woken one is the default.
    let polls = out.stderr.contains("the stack sampler looks at the loops every");
    assert_eq!(polls, !env.is_empty(), "the gate polls: {polls}\n{}", out.context());
    let m = Markers::parse(&out.stdout);
    assert!(m.get("done")["fast"].as_u64().unwrap_or(0) > 1000, "the fast part iterated\n{}", out.context());
    let summary =
        out.stderr.lines().find(|l| l.contains("loop-thread stack samples")).unwrap_or_else(|| panic!("no summary\n{}", out.context()));
    let times = summary
        .split("(the sampler on ")
        .nth(1)
        .and_then(|r| r.split(" times").next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no count of the sampler going on: {summary}"));
    assert!((2..20).contains(&times), "the sampler went on {times} times for 2 slow iterations: {summary}");
    let slow: Vec<&Span> =
        spans.iter().filter(|s| s.str("uvspan.loop.blocked_by").is_some_and(|b| b.starts_with("spinSlowly ("))).collect();
    assert_eq!(slow.len(), 2, "both slow iterations named\n{}\n{}", stacks_of(&spans), out.context());
}

/// A loop blocked in `readFileSync` over many files: most samples land in
/// libc (open64 keeps the path it opens in rbp, where a frame-pointer walk
/// would read the path's text as a return address). The slow iteration
/// names the user's function, and no sampled frame lies outside the
/// process's code: a walk that leaves it ends with `[truncated]`.
#[test]
fn a_loop_blocked_in_libc_names_the_js_function_and_no_frame_outside_the_code() {
    require_root();
    // Its ~160,000 sync fs calls are not exported (--min-duration): they
    // would fill the export queue, which may then drop the iteration's span.
    let (out, spans) = run_fixture(&official_node(20), "read_files_sync.js", &["--min-duration", "10ms"], &[]);
    let blocked = blocked_in(&spans, "readAllConfigs", &out);
    assert!(stacktrace(blocked).contains("read_files_sync.js:"), "{}", stacks_of(&spans));
    let all = stacks_of(&spans);
    assert!(!all.contains("[unknown] (0x"), "a frame outside the process's code:\n{all}");
    // Samples in libc are unwound through it to node's frames.
    let through = all.lines().collect::<Vec<_>>().windows(2).any(|w| w[0].contains("(libc.so") && w[1].trim().ends_with("(node)"));
    assert!(through, "no libc leaf unwound to its caller:\n{all}");
}
