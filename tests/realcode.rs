//! Request context on code nobody here wrote: an Express service
//! (tests/realcode/app.js, npm packages pinned by tests/realcode/package-lock.json)
//! whose routes each use one pattern real services use — `http.get` through a
//! keep-alive agent, `fetch()`, npm undici, async crypto (pbkdf2, scrypt,
//! WebCrypto), zlib, the compression middleware, a worker thread's reply, a
//! timer, an immediate, a child process, a `pg` pool logging in with
//! scram-sha-256 (Debian's PostgreSQL), ioredis (redis-server) — then read a file named after the
//! request and answer with a status that tells requests apart. Load comes
//! from another, untraced process (tests/realcode/driver.js: sequential, then
//! concurrent requests on keep-alive connections), and so does the upstream
//! the clients call. Checked from the spans on the wire, in every topology:
//!
//! - every request has a SERVER span with the status it answered and a
//!   duration covering its work (its end at or after its file read's end);
//! - where uvspan follows the hand-off (the threadpool's generic work, an
//!   HTTP client on its own connection, a worker's reply, a child process),
//!   the file read after the pattern is under its own request's SERVER span;
//! - every outgoing call is a CLIENT span with the upstream's status, fetch
//!   and undici included;
//! - no work is ever under another request's SERVER span, and none of the
//!   background interval's;
//! - the share under the request is printed per pattern (the README's
//!   limits quote it).
//!
//! Root only; never skipped.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use common::*;

/// Requests per route one at a time, then as many again this many at a time.
const N: usize = 10;
const C: &str = "4";

/// Patterns whose hand-off uvspan follows: the work after them is under
/// their request (at least 95% of it).
const FOLLOWED: [&str; 9] = ["http", "pbkdf2", "scrypt", "subtle", "gzip", "compress", "worker", "exec", "pg"];
/// Patterns whose work after them is not followed yet (README, limits): a
/// task of its own, never another request's.
/// (redis: one connection shares every request's commands, the concurrent
/// half's replies are read for several requests at once.)
const NOT_FOLLOWED: [&str; 5] = ["fetch", "undici", "timeout", "immediate", "redis"];
/// Patterns whose outgoing call is a CLIENT span with the upstream's status
/// (fetch and undici parse responses in WebAssembly: read at the socket).
const CALLS: [&str; 3] = ["http", "fetch", "undici"];

fn realcode_dir() -> String {
    format!("{}/tests/realcode", env!("CARGO_MANIFEST_DIR"))
}

/// The untraced upstream server of the app's clients; its port.
fn upstream() -> (Child, u16) {
    let mut c = Command::new("node");
    c.arg(format!("{}/driver.js", realcode_dir())).arg("upstream");
    c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = c.spawn().expect("start the upstream driver");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("upstream port");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("upstream said {line:?}: {e}"));
    let port = v["port"].as_u64().expect("port") as u16;
    (child, port)
}

/// What the driver says of each request: (route, i) → status.
fn sent(stdout: &str) -> BTreeMap<(String, usize), i64> {
    stdout
        .lines()
        .filter(|l| l.starts_with("{\"marker\":\"req\""))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("req marker");
            ((v["route"].as_str().expect("route").to_string(), v["i"].as_u64().expect("i") as usize), v["status"].as_i64().expect("status"))
        })
        .collect()
}

fn realcode_in(topology: Topology) {
    require_root();
    require_node();
    let routes: Vec<&str> = FOLLOWED.iter().chain(NOT_FOLLOWED.iter()).copied().collect();
    realcode_with(topology, "node", &routes);
}

/// The app on `node`, loaded on `routes` only.
fn realcode_with(topology: Topology, node: &str, routes: &[&str]) {
    realcode_run(topology, node, routes, &[], &FOLLOWED);
}

/// The app on `node` with `env`, loaded on `routes`; `followed`: the
/// patterns whose work after them must be under their own request. The
/// checks' counts per route, and uvspan's output.
fn realcode_run(
    topology: Topology,
    node: &str,
    routes: &[&str],
    env: &[(&str, &str)],
    followed: &[&str],
) -> (BTreeMap<String, Counts>, Output) {
    let rx = Receiver::start(Protocol::Grpc);
    let dir = TempDir::new("realcode");
    let (mut up, up_port) = upstream();
    let app = format!("{}/app.js", realcode_dir());
    let ep = rx.endpoint();
    let port_arg = up_port.to_string();
    let uv = ["--loop-threshold", "10m", "--status-interval", "0", "--otlp-endpoint", ep.as_str()];
    // The database routes' servers, the test's own.
    let pg = routes.contains(&"pg").then(|| postgres(PgAuth::Scram));
    let cache = routes.contains(&"redis").then(redis);
    let mut cmd = topology.command(&uv, &[node, &app, &dir.str(), &port_arg]);
    if let Some(pg) = &pg {
        cmd.env("PG_URL", pg.pg_url());
    }
    if let Some(r) = &cache {
        cmd.env("REDIS_PORT", r.port.to_string());
    }
    cmd.envs(env.iter().copied());
    let mut app_run = Running::spawn(cmd);
    app_run.wait_stdout(RUN_TIMEOUT, "the app listening", |o| o.contains("\"listening\""));
    let port = app_run
        .stdout()
        .lines()
        .find_map(|l| l.contains("\"listening\"").then(|| serde_json::from_str::<serde_json::Value>(l).ok()).flatten())
        .and_then(|v| v["port"].as_u64())
        .expect("the app's port");
    let mut load = Command::new("node");
    load.arg(format!("{}/driver.js", realcode_dir())).args(["load", &port.to_string(), &N.to_string(), C]).args(routes);
    let load = run(load);
    assert_eq!(load.code(), Some(0), "the load\n{}", load.context());
    let out = app_run.finish(RUN_TIMEOUT);
    drop(up.stdin.take());
    let _ = up.wait();
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let spans = rx.spans();
    check_summary(&out, spans.len());
    let sent = sent(&load.stdout);
    assert_eq!(sent.len(), routes.len() * 2 * N, "every request answered\n{}", load.context());
    let counts = check(&spans, &sent, routes, followed, &dir.str(), &out.context());
    (counts, out)
}

/// A route's requests: their SERVER spans right, their file reads under
/// their own request, and under another.
#[derive(Debug, Default)]
struct Counts {
    right: usize,
    under: usize,
    wrong: usize,
}

/// The checks of the module's doc.
fn check<'a>(
    spans: &'a [Span],
    sent: &BTreeMap<(String, usize), i64>,
    routes: &[&str],
    followed: &[&str],
    dir: &str,
    ctx: &str,
) -> BTreeMap<String, Counts> {
    let by_id: HashMap<(&'a str, &'a str), &'a Span> = spans.iter().map(|s| ((s.trace_id.as_str(), s.span_id.as_str()), s)).collect();
    // The SERVER span of each request, by (route, i).
    let mut server: HashMap<(String, usize), &Span> = HashMap::new();
    for s in spans.iter().filter(|s| s.kind == 2) {
        let Some(path) = s.str("url.path") else { continue };
        let mut parts = path.trim_start_matches('/').splitn(2, '/');
        let (Some(route), Some(i)) = (parts.next(), parts.next().and_then(|i| i.parse::<usize>().ok())) else { continue };
        assert!(server.insert((route.to_string(), i), s).is_none(), "one SERVER span per request: {path}\n{ctx}");
    }
    let request_of = |s: &'a Span| request_of(&by_id, s);
    let mut report = Vec::new();
    let mut failures = Vec::new();
    let mut counts = BTreeMap::new();
    for route in routes {
        let mine: Vec<(usize, i64)> = sent.iter().filter(|((r, _), _)| r == route).map(|((_, i), st)| (*i, *st)).collect();
        let (mut right, mut under, mut wrong) = (0, 0, 0);
        for (i, status) in &mine {
            let Some(srv) = server.get(&(route.to_string(), *i)) else {
                failures.push(format!("{route}/{i}: no SERVER span"));
                continue;
            };
            let after = format!("{dir}/after-{route}-{i}");
            let read: Vec<&Span> = spans.iter().filter(|s| s.name == "fs.open" && s.str("file.path") == Some(after.as_str())).collect();
            let read_end = read.iter().map(|s| s.end_unix_nano).max().unwrap_or(0);
            if srv.int("http.response.status_code") == Some(*status)
                && srv.bool("uvspan.http.response_seen") != Some(false)
                && srv.end_unix_nano >= read_end
                && srv.duration_ns() > 0
            {
                right += 1;
            } else {
                failures.push(format!("{route}/{i}: sent {status}, SERVER span {} (its file read ends at {read_end})", srv.brief()));
            }
            for r in &read {
                match request_of(r) {
                    Some(q) if std::ptr::eq(q, *srv) => under += 1,
                    Some(q) => {
                        wrong += 1;
                        failures.push(format!("{route}/{i}: its file read is under another request: {}", q.brief()));
                    }
                    None => {}
                }
            }
        }
        let n = mine.len();
        if CALLS.contains(route) {
            let answered = mine
                .iter()
                .filter(|(i, _)| {
                    let up = format!("/x/{i}");
                    spans
                        .iter()
                        .any(|s| s.kind == 3 && s.str("url.path") == Some(up.as_str()) && s.int("http.response.status_code") == Some(200))
                })
                .count();
            report.push(format!("{route:10} {answered}/{n} CLIENT spans with the upstream's status"));
            if answered < n {
                failures.push(format!("{route}: {answered} of {n} outgoing calls a CLIENT span with status 200"));
            }
        }
        report
            .push(format!("{route:10} {right}/{n} SERVER spans right, {under}/{n} file reads under their request, {wrong} under another"));
        if right * 100 < n * 99 {
            failures.push(format!("{route}: {right} of {n} SERVER spans with their status and duration (want >= 99%)"));
        }
        if followed.contains(route) && under * 100 < n * 95 {
            failures.push(format!("{route}: {under} of {n} file reads under their own request (want >= 95%)"));
        }
        counts.insert(route.to_string(), Counts { right, under, wrong });
    }
    let bg = format!("{dir}/bg");
    let background: Vec<&Span> = spans.iter().filter(|s| s.str("file.path") == Some(bg.as_str())).collect();
    let bg_in_requests = background.iter().filter(|s| request_of(s).is_some()).count();
    report.push(format!("background: {} operations, {bg_in_requests} in request traces", background.len()));
    eprintln!("{}", report.join("\n"));
    if background.is_empty() {
        failures.push("the background interval's operations were not seen".into());
    }
    if bg_in_requests > 0 {
        failures.push(format!("{bg_in_requests} background operations in request traces"));
    }
    assert!(failures.is_empty(), "{}\n{}\n{ctx}", failures.join("\n"), report.join("\n"));
    counts
}

#[test]
fn real_packages_keep_their_request_context_on_the_host() {
    realcode_in(Topology::Host);
}

#[test]
fn real_packages_keep_their_request_context_in_one_pid_namespace() {
    realcode_in(Topology::BothInOne);
}

#[test]
fn real_packages_keep_their_request_context_with_the_app_alone_in_its_own() {
    realcode_in(Topology::AppAlone);
}

/// A `pg` pool of 2 clients under 4 concurrent requests: a reply releases
/// its client, and the pool hands it to a waiting request in that reply's
/// callback (or opens a new one for it when an idle one closes), so the
/// next query is written while the first request is current. Its reply
/// (each query sleeps 100 ms in the server, so it comes after the first
/// request answered) is a task of its own, counted in the summary: never
/// the first request's, whose trace it is not. The sequential half (no one
/// waits for a client) stays under its requests.
fn pool_hand_off_in(topology: Topology) {
    require_root();
    require_node();
    let env = [("PG_POOL_MAX", "2"), ("PG_SLEEP", "0.1")];
    let (counts, out) = realcode_run(topology, "node", &["pg"], &env, &[]);
    let pg = &counts["pg"];
    assert_eq!((pg.right, pg.wrong), (2 * N, 0), "{pg:?}\n{}", out.context());
    assert!(pg.under >= N, "the sequential half under their requests: {pg:?}\n{}", out.context());
    let after = summary_number(&out.stderr, " replies on client connections read after the request that wrote there had answered");
    assert!(after > 0, "the handed-on replies counted: {pg:?}\n{}", out.context());
}

#[test]
fn a_pool_hands_a_connection_on_and_its_reply_joins_no_other_request_on_the_host() {
    pool_hand_off_in(Topology::Host);
}

#[test]
fn a_pool_hands_a_connection_on_and_its_reply_joins_no_other_request_in_one_pid_namespace() {
    pool_hand_off_in(Topology::BothInOne);
}

#[test]
fn a_pool_hands_a_connection_on_and_its_reply_joins_no_other_request_with_the_app_alone_in_its_own() {
    pool_hand_off_in(Topology::AppAlone);
}

/// The request a span sits under: its nearest SERVER ancestor.
fn request_of<'a>(by_id: &HashMap<(&'a str, &'a str), &'a Span>, s: &'a Span) -> Option<&'a Span> {
    let mut cur = s;
    for _ in 0..64 {
        if cur.parent_span_id.is_empty() {
            return None;
        }
        cur = by_id.get(&(cur.trace_id.as_str(), cur.parent_span_id.as_str()))?;
        if cur.kind == 2 {
            return Some(cur);
        }
    }
    None
}

/// The threadpool, client-connection, worker and child-process paths on
/// the official builds of the other Node lines (npm undici needs Node 20).
fn on_official(major: u32) {
    require_root();
    let node = official_node(major);
    realcode_with(Topology::Host, &node.to_string_lossy(), &["http", "fetch", "pbkdf2", "gzip", "compress", "worker", "exec", "timeout"]);
}

#[test]
fn real_packages_keep_their_request_context_on_node_18() {
    on_official(18);
}

#[test]
fn real_packages_keep_their_request_context_on_node_22() {
    on_official(22);
}

#[test]
fn real_packages_keep_their_request_context_on_node_24() {
    on_official(24);
}

#[test]
fn real_packages_keep_their_request_context_on_node_26() {
    on_official(26);
}
