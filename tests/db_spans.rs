//! Database spans from the wire, on real drivers and servers: an HTTP app
//! (tests/db/app.js) whose routes run `pg` (simple and parameterized
//! queries, `pg_sleep`, a missing table, a transaction), `mysql2` (a query,
//! a prepared statement) and `ioredis` (SET/GET, a pipeline, an error reply)
//! against the test's own PostgreSQL (scram-sha-256), MariaDB and
//! redis-server, one pooled connection per server shared by concurrent
//! requests. Each operation must be a CLIENT span under the SERVER span of
//! the request whose write sent it (its query names the request), with the
//! semantic conventions' attributes, ERROR on a server error, lasting at
//! least the server's own wait; every operation counted in
//! `db.client.operation.duration`. In the three topologies.

mod common;

use std::collections::HashMap;
use std::process::Command;

use common::collector::{histogram_points, Collector, Listen};
use common::*;

/// Requests per route, and at once.
const N: usize = 12;
const C: &str = "4";

/// Route, and the spans each of its requests must have under it: (span
/// name, `db.query.text` with `{i}` for the request's number, status code).
type Want = (&'static str, &'static [(&'static str, &'static str, Option<&'static str>)]);
const ROUTES: [Want; 10] = [
    ("pg", &[("SELECT uvspan", "SELECT ? AS r{i}", None)]),
    ("pgparam", &[("SELECT uvspan", "SELECT $1::int AS p{i}", None)]),
    ("pgsleep", &[("SELECT uvspan", "SELECT pg_sleep(?), ? AS s{i}", None)]),
    ("pgmissing", &[("SELECT missing_table_{i}", "SELECT * FROM missing_table_{i}", Some("42P01"))]),
    ("pgtx", &[("BEGIN uvspan", "BEGIN", None), ("SELECT uvspan", "SELECT ? AS t{i}", None), ("COMMIT uvspan", "COMMIT", None)]),
    ("mysql", &[("SELECT uvspan", "SELECT ? AS m{i}", None)]),
    ("mysqlprep", &[("PREPARE uvspan", "SELECT ? AS e{i}", None), ("SELECT uvspan", "SELECT ? AS e{i}", None)]),
    ("redis", &[("SET", "SET k{i} ?", None), ("GET", "GET k{i}", None)]),
    ("redispipe", &[("SET", "SET q{i} ?", None), ("GET", "GET q{i}", None)]),
    ("rediserr", &[("SET", "SET z{i} ?", None), ("INCR", "INCR z{i}", Some("ERR"))]),
];

fn db_dir() -> String {
    format!("{}/tests/db", env!("CARGO_MANIFEST_DIR"))
}

fn db_spans_in(topology: Topology) {
    require_root();
    require_node();
    let col = Collector::start(Listen::Plain);
    let pg = postgres(PgAuth::Scram);
    let my = mariadb();
    let cache = redis();
    let ep = format!("http://127.0.0.1:{}", col.port());
    let uv = ["--loop-threshold", "10m", "--status-interval", "0", "--otlp-endpoint", ep.as_str()];
    let app = format!("{}/app.js", db_dir());
    let mut cmd = topology.command(&uv, &["node", &app]);
    cmd.env("PG_URL", pg.pg_url())
        .env("MYSQL_PORT", my.port.to_string())
        .env("REDIS_PORT", cache.port.to_string())
        .env("DB_USER", DB_USER)
        .env("DB_PASSWORD", DB_PASSWORD)
        .env("DB_NAME", DB_NAME)
        .env("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta");
    let mut app_run = Running::spawn(cmd);
    app_run.wait_stdout(RUN_TIMEOUT, "the app listening", |o| o.contains("\"listening\""));
    let port = Markers::parse(&app_run.stdout()).i64("listening", "port");
    // SQL routes concurrently (one pooled connection each: hand-offs);
    // Redis's one at a time (ioredis pipelines concurrent requests'
    // commands into one write and their replies into one read: those
    // operations cannot be told apart, and are then no request's).
    let load = |routes: Vec<&str>, c: &str, quit: bool| {
        let mut l = Command::new("node");
        l.arg(format!("{}/load.js", db_dir())).args([&port.to_string(), &N.to_string(), c]).args(routes);
        l.env("QUIT", if quit { "1" } else { "0" });
        let l = run(l);
        assert_eq!(l.code(), Some(0), "the load\n{}", l.context());
        l.stdout
    };
    let sql: Vec<&str> = ROUTES.iter().map(|r| r.0).filter(|r| !r.starts_with("redis")).collect();
    let kv: Vec<&str> = ROUTES.iter().map(|r| r.0).filter(|r| r.starts_with("redis")).collect();
    let sent = load(sql, C, false) + &load(kv, "1", true);
    let out = app_run.finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let spans = col.spans();
    let ctx = out.context();
    check(&spans, &sent, &ctx, [pg.port, my.port, cache.port]);
    // Every operation in the metric, sampled or not.
    let want: usize = ROUTES.iter().map(|r| r.1.len() * N).sum();
    let counted: u64 = histogram_points(&col, "db.client.operation.duration").iter().map(|p| p.1).sum();
    assert!(counted >= want as u64, "db.client.operation.duration counted {counted} operations, the routes made at least {want}\n{ctx}");
    assert!(out.stderr.contains("database operations"), "the summary names the database operations\n{ctx}");
}

fn check(spans: &[Span], sent: &str, ctx: &str, ports: [u16; 3]) {
    let by_id: HashMap<(&str, &str), &Span> = spans.iter().map(|s| ((s.trace_id.as_str(), s.span_id.as_str()), s)).collect();
    let mut server: HashMap<String, &Span> = HashMap::new();
    for s in spans.iter().filter(|s| s.kind == 2) {
        if let Some(p) = s.str("url.path") {
            server.insert(p.to_string(), s);
        }
    }
    let answered = sent.lines().filter(|l| l.contains("\"sent\"") && l.contains("\"status\":200")).count();
    assert_eq!(answered, ROUTES.len() * N, "every request answered 200\n{sent}");
    let dbs: Vec<&Span> = spans.iter().filter(|s| s.str("db.system.name").is_some()).collect();
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for (route, want) in ROUTES {
        let mut right = 0;
        for i in 0..N {
            let path = format!("/{route}/{i}");
            let Some(srv) = server.get(&path) else {
                failures.push(format!("{path}: no SERVER span"));
                continue;
            };
            let mine: Vec<&Span> =
                dbs.iter().copied().filter(|s| s.trace_id == srv.trace_id && s.parent_span_id == srv.span_id && s.kind == 3).collect();
            let mut ok = true;
            for (name, text, status) in want {
                let name = name.replace("{i}", &i.to_string());
                let text = text.replace("{i}", &i.to_string());
                // Redis has no namespace or collection: the server is its target.
                let named = |s: &Span| s.name == name || s.name.starts_with(&format!("{name} 127.0.0.1:"));
                let Some(s) = mine.iter().find(|s| s.str("db.query.text") == Some(text.as_str()) && named(s)) else {
                    let elsewhere: Vec<String> =
                        dbs.iter().filter(|s| s.str("db.query.text") == Some(text.as_str())).map(|s| under(&by_id, s)).collect();
                    failures.push(format!("{path}: no span `{text}` under its SERVER span (elsewhere: {elsewhere:?})"));
                    ok = false;
                    continue;
                };
                let port = s.int("server.port").unwrap_or(0) as u16;
                let fine = s.str("server.address") == Some("127.0.0.1")
                    && ports.contains(&port)
                    && s.str("db.response.status_code") == *status
                    && (status.is_some() == (s.status == StatusCode::Error))
                    && s.start_unix_nano >= srv.start_unix_nano
                    // (an error's operation ends at the server's ReadyForQuery, maybe after the answer)
                    && (status.is_some() || s.end_unix_nano <= srv.end_unix_nano)
                    && (route != "pgsleep" || s.duration_ns() >= 20_000_000);
                if !fine {
                    failures.push(format!("{path}: `{text}`: {} (its request: {})", s.brief(), srv.brief()));
                    ok = false;
                }
            }
            right += usize::from(ok);
        }
        report.push(format!("{route:10} {right}/{N} requests with their database spans"));
    }
    // No operation of one request under another's SERVER span.
    for s in &dbs {
        let Some(text) = s.str("db.query.text") else { continue };
        let Some(parent) = by_id.get(&(s.trace_id.as_str(), s.parent_span_id.as_str())) else { continue };
        let Some(path) = parent.str("url.path") else { continue };
        let n = path.rsplit('/').next().unwrap_or("");
        let named: Option<String> = text
            .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .find_map(|w| {
                w.strip_prefix(|c: char| "rpstmekqz".contains(c))
                    .filter(|d| d.chars().all(|c| c.is_ascii_digit()) && !d.is_empty())
                    .map(str::to_string)
            })
            .or_else(|| text.strip_prefix("SELECT * FROM missing_table_").map(str::to_string));
        if let Some(num) = named {
            if num != n {
                failures.push(format!("`{text}` is under {path}"));
            }
        }
    }
    let mut systems: std::collections::BTreeMap<&str, usize> = Default::default();
    for s in &dbs {
        *systems.entry(s.str("db.system.name").unwrap_or("")).or_default() += 1;
    }
    report.push(format!("database spans by system: {systems:?}"));
    eprintln!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}\n{}\n{ctx}", failures.join("\n"), report.join("\n"));
}

fn under(by_id: &HashMap<(&str, &str), &Span>, s: &Span) -> String {
    match by_id.get(&(s.trace_id.as_str(), s.parent_span_id.as_str())) {
        Some(p) => p.brief(),
        None => format!("parent {} not exported", s.parent_span_id),
    }
}

#[test]
fn database_operations_are_spans_under_their_request_on_the_host() {
    db_spans_in(Topology::Host);
}

#[test]
fn database_operations_are_spans_under_their_request_in_one_pid_namespace() {
    db_spans_in(Topology::BothInOne);
}

#[test]
fn database_operations_are_spans_under_their_request_with_the_app_alone_in_its_own() {
    db_spans_in(Topology::AppAlone);
}
