//! `--pid P` follows where the work goes: P's Node.js descendants, running
//! when uvspan starts or started later, are traced too, unless
//! `--no-follow-children`. The app is tests/fixtures/cluster.js, started
//! untraced: a cluster primary forking 2 HTTP workers (which serve all the
//! traffic), a shell it starts that starts a node, and on a trigger file one
//! more worker and one more shell with its node. Traffic comes from the test
//! itself (not traced). Real uvspan, real eBPF, real node, real OTLP to the
//! in-test receiver; in the three topologies: uvspan and the app on the
//! host, both in one new PID + mount namespace, the app alone in its own.
//!
//! Root only; never skipped.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const TRACING: &str = "uvspan: tracing process ";

/// One GET to the app: the pid (as the app sees it) of the worker that answered.
fn get(port: u16) -> u32 {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the app");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("read timeout");
    write!(s, "GET /work HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").expect("send the request");
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    let body = reply.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    body.trim().parse().unwrap_or_else(|_| panic!("not a worker's pid: {reply:?}"))
}

/// `n` requests, each on a connection of its own (the primary hands them
/// to the workers in turn): the workers that answered.
fn traffic(port: u16, n: usize) -> BTreeSet<u32> {
    (0..n).map(|_| get(port)).collect()
}

/// The cluster app and uvspan --pid on its primary, placed as `topology` says.
struct Cluster {
    topology: Topology,
    /// The app (on the host, or alone in its namespace); with both in one
    /// namespace, the shell there that runs both (`uv`).
    app: Option<Running>,
    /// uvspan, or the shell in the namespace that runs the app and uvspan.
    uv: Running,
    dir: TempDir,
    port: u16,
    /// The primary's pid as uvspan sees it.
    primary: u32,
}

fn node_cmd(port: u16, dir: &TempDir) -> Vec<String> {
    vec!["node".into(), fixture("cluster.js"), port.to_string(), dir.str()]
}

fn unshare() -> Command {
    require_tool("unshare", "it makes the PID and mount namespaces (util-linux; scripts/setup.sh installs it)");
    let mut c = Command::new("unshare");
    c.args(["--pid", "--fork", "--mount", "--mount-proc"]);
    scrub_env(&mut c);
    c.stdin(Stdio::null());
    c
}

/// The first child of `pid` (unshare --fork's child).
fn child_of(pid: u32) -> Option<u32> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    t.split_whitespace().next()?.parse().ok()
}

fn wait_ready(dir: &TempDir) {
    let ready = Path::new(&dir.join("ready")).to_path_buf();
    assert!(wait_until(RUN_TIMEOUT, || ready.exists()), "the app's first 2 workers never listened");
}

impl Cluster {
    fn start(topology: Topology, rx: &Receiver, extra: &[&str]) -> Cluster {
        require_root();
        let dir = TempDir::new("follow");
        let port = free_port();
        let node = node_cmd(port, &dir);
        let mut uv_args: Vec<String> = ["--otlp-endpoint", &rx.endpoint(), "--otlp-protocol", "grpc", "--status-interval", "0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        uv_args.extend(["--loop-threshold", "1s"].map(String::from));
        uv_args.extend(extra.iter().map(|s| s.to_string()));
        match topology {
            Topology::Host | Topology::AppAlone => {
                let mut c = if topology == Topology::Host {
                    let mut c = Command::new(&node[0]);
                    scrub_env(&mut c);
                    c.stdin(Stdio::null());
                    c
                } else {
                    let mut c = unshare();
                    c.arg(&node[0]);
                    c
                };
                c.args(&node[1..]);
                let app = Running::spawn(c);
                wait_ready(&dir);
                let primary = if topology == Topology::Host { app.pid } else { child_of(app.pid).expect("unshare's child, the primary") };
                let mut c = uvspan_cmd(["--pid", &primary.to_string()]);
                c.args(&uv_args);
                Cluster { topology, app: Some(app), uv: Running::spawn(c), dir, port, primary }
            }
            Topology::BothInOne => {
                // The namespace's first process is a shell: it starts the app,
                // waits until it is ready, then runs uvspan on its primary.
                let sh = r#"
                    set -u
                    uv="$1"; dir="$2"; shift 2
                    node "$@" &
                    i=0; until [ -e "$dir/ready" ]; do i=$((i+1)); [ $i -gt 1200 ] && { echo "the app never got ready" >&2; exit 9; }; sleep 0.05; done
                    "$uv" --pid "$(cat "$dir/primary.pid")" $UV_ARGS
                "#;
                let mut c = unshare();
                c.args(["sh", "-c", sh, "sh", uvspan_bin(), &dir.str()]).args(&node[1..]);
                c.env("UV_ARGS", uv_args.join(" "));
                let uv = Running::spawn(c);
                wait_ready(&dir);
                let primary: u32 = std::fs::read_to_string(dir.join("primary.pid")).expect("primary.pid").trim().parse().expect("a pid");
                Cluster { topology, app: None, uv, dir, port, primary }
            }
        }
    }

    fn tracing_lines(&self) -> Vec<String> {
        self.uv.stderr().lines().filter(|l| l.starts_with(TRACING)).map(String::from).collect()
    }

    /// Waits until uvspan has said it traces `n` processes.
    fn wait_tracing(&mut self, n: usize) {
        self.uv.wait_stderr(RUN_TIMEOUT, &format!("{n} 'tracing process' lines"), |e| {
            e.lines().filter(|l| l.starts_with(TRACING)).count() >= n
        });
    }

    fn app_stdout(&self) -> String {
        self.app.as_ref().unwrap_or(&self.uv).stdout()
    }

    /// The app as it sees itself: the pid of each marker.
    fn markers(&self) -> Markers {
        Markers::parse(&self.app_stdout())
    }

    fn touch(&self, name: &str) {
        std::fs::write(self.dir.join(name), "").expect("the trigger file");
    }

    /// The app told to stop; uvspan's run ends by itself once the primary
    /// and the processes followed below it have exited.
    fn stop(mut self) -> (Output, Markers) {
        self.touch("stop");
        let markers;
        let uv = if let Some(app) = self.app.take() {
            let app = app.finish(RUN_TIMEOUT);
            assert_eq!(app.code(), Some(0), "the app\n{}", app.context());
            markers = Markers::parse(&app.stdout);
            self.uv.finish(RUN_TIMEOUT)
        } else {
            let uv = self.uv.finish(RUN_TIMEOUT);
            markers = Markers::parse(&uv.stdout);
            uv
        };
        (uv, markers)
    }
}

/// The summary's "uvspan: traced N Node.js process(es): …" line.
fn traced_line(stderr: &str) -> &str {
    stderr.lines().find(|l| l.starts_with("uvspan: traced ")).unwrap_or_else(|| panic!("no 'uvspan: traced' line:\n{stderr}"))
}

/// One process the traced line names: its pid as uvspan sees it, as it
/// sees itself (when that differs), and the --pid target it is under.
#[derive(Debug, PartialEq)]
struct Listed {
    pid: i64,
    own: Option<i64>,
    under: Option<i64>,
}

/// The processes "uvspan: traced N Node.js process(es): PID (COMMAND[, OWN
/// in its PID namespace][, under TARGET]), …" names.
fn listed(line: &str) -> Vec<Listed> {
    let Some((_, list)) = line.split_once(" process(es): ") else { return Vec::new() };
    let list = list.split("; ").next().unwrap_or("");
    list.split("), ")
        .filter_map(|e| {
            let (pid, rest) = e.split_once(" (")?;
            let rest = rest.trim_end_matches(')');
            let own = rest.split(", ").find_map(|p| p.strip_suffix(" in its PID namespace")?.parse().ok());
            let under = rest.split(", ").find_map(|p| p.strip_prefix("under ")?.parse().ok());
            Some(Listed { pid: pid.parse().ok()?, own, under })
        })
        .collect()
}

/// Whether `line` names the process the app knows as `own`, under `under`
/// (the primary as uvspan sees it).
fn names(line: &str, topology: Topology, own: i64, under: Option<u32>) -> bool {
    let under = under.map(i64::from);
    listed(line).iter().any(|l| {
        let same = match topology {
            // uvspan sees the app's pids as the app does.
            Topology::Host | Topology::BothInOne => l.pid == own && l.own.is_none(),
            Topology::AppAlone => l.own == Some(own),
        };
        same && l.under == under
    })
}

/// The pids (as the app sees them) of the SERVER spans received.
fn server_pids(spans: &[Span]) -> BTreeSet<i64> {
    spans.iter().filter(|s| s.kind == 2).filter_map(|s| s.res_int("process.pid")).collect()
}

/// fs.stat spans of `path` by the process the app knows as `pid`.
fn stats_of(spans: &[Span], pid: i64, path: &str) -> usize {
    spans.iter().filter(|s| s.res_int("process.pid") == Some(pid) && s.name == "fs.stat" && s.str("file.path") == Some(path)).count()
}

/// The primary, its 2 workers and the node its shell started are traced
/// from the start; a worker and a shell's node started later too; the
/// shells are not announced. SERVER spans come from every worker, none
/// from the primary; the summary names each traced process.
fn follows(topology: Topology) {
    let rx = Receiver::start(Protocol::Grpc);
    let mut c = Cluster::start(topology, &rx, &[]);
    // The primary, 2 workers and sidekick-a.
    c.wait_tracing(4);
    let m = c.markers();
    let (w1, w2) = (m.i64("worker-1", "pid"), m.i64("worker-2", "pid"));
    let served = traffic(c.port, 20);
    assert_eq!(served, BTreeSet::from([w1 as u32, w2 as u32]), "{topology:?}: both workers serve");
    // A worker forked, and a shell started, after uvspan did.
    c.touch("more");
    c.wait_tracing(6);
    assert!(wait_until(RUN_TIMEOUT, || c.markers().0.contains_key("worker-3")), "{topology:?}: the new worker never listened");
    let m = c.markers();
    let w3 = m.i64("worker-3", "pid");
    let served = traffic(c.port, 30);
    assert!(served.contains(&(w3 as u32)), "{topology:?}: the new worker serves: {served:?}");
    let lines = c.tracing_lines();
    let (topo, primary, dir) = (c.topology, c.primary, c.dir.str());
    let (out, m) = c.stop();
    let ctx = format!("{topo:?}\n{}", out.context());
    assert_eq!(out.code(), Some(0), "uvspan ends by itself once the app has\n{ctx}");
    let spans = rx.spans();
    let servers = server_pids(&spans);
    for (name, w) in [("worker-1", w1), ("worker-2", w2), ("worker-3", w3)] {
        assert!(servers.contains(&w), "SERVER spans of {name} (pid {w}): {servers:?}\n{ctx}");
    }
    let own_primary = m.i64("primary", "pid");
    assert!(!servers.contains(&own_primary), "the primary serves nothing: {servers:?}\n{ctx}");
    // The nodes the shells started: their work.
    let stop = format!("{dir}/stop");
    for name in ["sidekick-a", "sidekick-b"] {
        let pid = m.i64(name, "pid");
        assert!(stats_of(&spans, pid, &stop) > 0, "fs.stat spans of {name} (pid {pid})\n{ctx}");
    }
    // Six Node.js processes said and listed; the shells are neither.
    assert_eq!(lines.len(), 6, "{lines:#?}\n{ctx}");
    let line = traced_line(&out.stderr);
    assert!(line.starts_with("uvspan: traced 6 Node.js process(es): "), "{line}\n{ctx}");
    assert_eq!(listed(line).len(), 6, "{line}\n{ctx}");
    assert!(names(line, topo, own_primary, None), "the primary: {line}\n{ctx}");
    for name in ["worker-1", "worker-2", "worker-3", "sidekick-a", "sidekick-b"] {
        let pid = m.i64(name, "pid");
        assert!(names(line, topo, pid, Some(primary)), "{name} (pid {pid}) under {primary}: {line}\n{ctx}");
    }
    for name in ["shell-a", "shell-b"] {
        let pid = m.i64(name, "pid");
        assert!(!names(line, topo, pid, None) && !names(line, topo, pid, Some(primary)), "{name} (pid {pid}) listed: {line}\n{ctx}");
    }
    let under = lines.iter().filter(|l| l.contains(&format!(" under {primary} ("))).count();
    assert_eq!(under, 5, "the followed ones said under the primary: {lines:#?}\n{ctx}");
}

#[test]
fn pid_follows_the_cluster_workers() {
    follows(Topology::Host);
}

#[test]
fn pid_follows_the_cluster_workers_in_one_namespace() {
    follows(Topology::BothInOne);
}

#[test]
fn pid_follows_the_cluster_workers_app_alone() {
    follows(Topology::AppAlone);
}

/// `--no-follow-children`: only the primary is traced (the workers serve,
/// no span of theirs comes), and the summary says the processes below it
/// were not followed.
fn does_not_follow(topology: Topology) {
    let rx = Receiver::start(Protocol::Grpc);
    let mut c = Cluster::start(topology, &rx, &["--no-follow-children"]);
    c.wait_tracing(1);
    let m = c.markers();
    let (w1, w2) = (m.i64("worker-1", "pid"), m.i64("worker-2", "pid"));
    let served = traffic(c.port, 20);
    assert_eq!(served, BTreeSet::from([w1 as u32, w2 as u32]), "{topology:?}: both workers serve");
    c.touch("more");
    let more = c.dir.join("more");
    assert!(wait_until(RUN_TIMEOUT, || c.markers().0.contains_key("sidekick-b") && c.markers().0.contains_key("worker-3")), "{more}");
    traffic(c.port, 30);
    let lines = c.tracing_lines();
    let (topo, primary) = (c.topology, c.primary);
    let (out, m) = c.stop();
    let ctx = format!("{topo:?}\n{}", out.context());
    assert_eq!(out.code(), Some(0), "{ctx}");
    assert_eq!(lines.len(), 1, "the primary alone: {lines:#?}\n{ctx}");
    assert!(lines[0].starts_with(&format!("{TRACING}{primary} (")), "{lines:#?}\n{ctx}");
    let spans = rx.spans();
    let own_primary = m.i64("primary", "pid");
    let pids: BTreeSet<i64> = spans.iter().filter_map(|s| s.res_int("process.pid")).collect();
    assert!(pids.iter().all(|&p| p == own_primary), "spans of processes other than the primary: {pids:?}\n{ctx}");
    let line = traced_line(&out.stderr);
    assert!(line.starts_with("uvspan: traced 1 Node.js process(es): "), "{line}\n{ctx}");
    assert_eq!(listed(line).len(), 1, "{line}\n{ctx}");
    assert!(names(line, topo, own_primary, None), "{line}\n{ctx}");
    // Below the primary at the start: 2 workers, the shell and its node.
    assert!(line.ends_with("were not followed (--no-follow-children: 4 ran below them at the start)"), "{line}\n{ctx}");
}

#[test]
fn no_follow_children_traces_the_pid_alone() {
    does_not_follow(Topology::Host);
}

#[test]
fn no_follow_children_traces_the_pid_alone_in_one_namespace() {
    does_not_follow(Topology::BothInOne);
}

#[test]
fn no_follow_children_traces_the_pid_alone_app_alone() {
    does_not_follow(Topology::AppAlone);
}

/// The flag is for --pid: with a command, one line and exit 2.
#[test]
fn the_traced_line_parses() {
    let line = "uvspan: traced 3 Node.js process(es): 40 (node a.js 1, 1 in its PID namespace), 41 (/usr/bin/node a.js, 2 in its PID \
                namespace, under 40), 42 (sh -c x, under 40); the processes below";
    let l = listed(line);
    assert_eq!(l.len(), 3, "{l:?}");
    assert_eq!(l[0], Listed { pid: 40, own: Some(1), under: None });
    assert_eq!(l[1], Listed { pid: 41, own: Some(2), under: Some(40) });
    assert_eq!(l[2], Listed { pid: 42, own: None, under: Some(40) });
    assert!(names(line, Topology::AppAlone, 2, Some(40)) && !names(line, Topology::Host, 2, Some(40)));
    assert!(names(line, Topology::Host, 42, Some(40)) && !names(line, Topology::Host, 42, None));
}

#[test]
fn no_follow_children_without_pid_is_refused() {
    let out = run(uvspan_cmd(["--no-follow-children", "--", "true"]));
    assert_eq!(out.code(), Some(2), "{}", out.context());
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", out.context());
    assert!(lines[0].starts_with("uvspan: --no-follow-children is for --pid"), "{}", out.context());
}
