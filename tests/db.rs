//! Database and cache clients: the private servers the tests run (Debian's
//! PostgreSQL, MariaDB and redis-server) start, answer their own clients,
//! and stop.

mod common;

use std::process::Command;

use common::*;

#[test]
fn postgres_with_scram_answers_the_right_password_only() {
    require_root();
    let pg = postgres(PgAuth::Scram);
    assert_eq!(psql(&pg, DB_NAME, "SELECT 40 + 2").as_deref(), Ok("42"), "log: {}", pg.log());
    assert_eq!(psql(&pg, DB_NAME, "SHOW password_encryption").as_deref(), Ok("scram-sha-256"));
    let mut wrong = Command::new("psql");
    wrong.args(["-X", "-w", "-d", &format!("postgresql://{DB_USER}@127.0.0.1:{}/{DB_NAME}", pg.port), "-c", "SELECT 1"]);
    wrong.env("PGPASSWORD", "not-the-password");
    let out = wrong.output().expect("run psql");
    assert!(!out.status.success(), "a wrong password was accepted: the server does not ask for one");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("password authentication failed"), "{err}");
}

#[test]
fn postgres_with_trust_asks_no_password() {
    require_root();
    let pg = postgres(PgAuth::Trust);
    let mut c = Command::new("psql");
    c.args(["-X", "-w", "-A", "-t", "-d", &format!("postgresql://{DB_USER}@127.0.0.1:{}/{DB_NAME}", pg.port), "-c", "SELECT current_user"]);
    c.env_remove("PGPASSWORD");
    let out = c.output().expect("run psql");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), DB_USER);
}

#[test]
fn postgres_stops_when_dropped() {
    require_root();
    let pg = postgres(PgAuth::Trust);
    let (addr, dir) = (pg.addr(), pg.dir().to_path_buf());
    drop(pg);
    assert!(std::net::TcpStream::connect(addr).is_err(), "PostgreSQL still listens on {addr} after its handle was dropped");
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn mariadb_answers_its_user() {
    require_root();
    let db = mariadb();
    assert_eq!(mariadb_sql(&db, "SELECT 40 + 2").as_deref(), Ok("42"), "log: {}", db.log());
    let v = mariadb_sql(&db, "SELECT VERSION()").unwrap();
    assert!(v.contains("MariaDB"), "{v}");
    assert_eq!(mariadb_sql(&db, "SELECT DATABASE()").as_deref(), Ok(DB_NAME));
}

#[test]
fn redis_answers_and_stops_when_dropped() {
    require_root();
    let r = redis();
    assert_eq!(redis_cli(&r, &["SET", "k", "v"]).as_deref(), Ok("OK"));
    assert_eq!(redis_cli(&r, &["GET", "k"]).as_deref(), Ok("v"), "log: {}", r.log());
    let addr = r.addr();
    drop(r);
    assert!(std::net::TcpStream::connect(addr).is_err(), "redis-server still listens on {addr}");
}

/// The recorded driver traffic of `scenario` (tests/db/record.js through
/// its proxy) into `out`: the files it wrote.
fn record(scenario: &str, out: &std::path::Path, pg: &DbServer, pg_trust: &DbServer, my: &DbServer, redis: &DbServer) -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/db");
    assert!(dir.join("node_modules/pg").is_dir(), "tests/db/node_modules is missing: run `npm ci` in tests/db (scripts/test.sh does it)");
    let mut c = Command::new("node");
    c.current_dir(&dir).arg("record.js").arg(scenario).arg(out);
    c.env("PG_PORT", pg.port.to_string())
        .env("PG_TRUST_PORT", pg_trust.port.to_string())
        .env("MYSQL_PORT", my.port.to_string())
        .env("REDIS_PORT", redis.port.to_string())
        .env("DB_USER", DB_USER)
        .env("DB_PASSWORD", DB_PASSWORD)
        .env("DB_NAME", DB_NAME);
    let o = run(c);
    assert_eq!(o.code(), Some(0), "record.js {scenario}: {}", o.context());
    let m = Markers::parse(&o.stdout);
    m.get("recorded")["files"].as_array().expect("files").iter().map(|f| f.as_str().unwrap().to_string()).collect()
}

/// The recorded scenarios (tests/golden/db/<name>.rec).
const SCENARIOS: [&str; 5] = ["pg_scram", "porsager_trust", "mysql2", "ioredis", "node_redis"];

/// Regenerates tests/golden/db/*.rec from the real drivers and servers
/// (`UVSPAN_RECORD_DB=1 cargo test --release --test db -- record_golden
/// --ignored`). Not a test: a tool, kept beside the tests that use its
/// output.
#[test]
#[ignore = "regenerates the recordings (UVSPAN_RECORD_DB=1)"]
fn record_golden() {
    require_root();
    assert_eq!(std::env::var("UVSPAN_RECORD_DB").as_deref(), Ok("1"), "set UVSPAN_RECORD_DB=1 to overwrite tests/golden/db");
    let (pg, pg_trust, my, redis) = (postgres(PgAuth::Scram), postgres(PgAuth::Trust), mariadb(), self::redis());
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/db");
    std::fs::create_dir_all(&out).unwrap();
    for s in SCENARIOS {
        let files = record(s, &out, &pg, &pg_trust, &my, &redis);
        eprintln!("{s}: {files:?}");
    }
}

/// A recording's operations through uvspan's parser, without their chunk
/// numbers (a proxy's reads split the bytes differently every run).
fn ops_of(path: &std::path::Path, system: uvspan::db::System) -> (Vec<uvspan::db::Op>, Option<uvspan::db::Stop>) {
    use uvspan::db::{Conn, Dir, Options};
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut c = Conn::new(system, Options::default());
    let mut ops = Vec::new();
    for l in text.lines().filter(|l| !l.is_empty()) {
        let (d, hex) = l.split_once(' ').expect("direction and hex");
        let b: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
        c.feed(if d == "c" { Dir::Request } else { Dir::Response }, &b, b.len());
        ops.extend(c.take_ops());
    }
    for op in &mut ops {
        (op.start_chunk, op.end_chunk) = (0, 0);
    }
    (ops, c.stopped())
}

/// Today's drivers against today's servers give the operations the
/// committed recordings give: the golden tests' bytes are still what the
/// pinned drivers send.
#[test]
fn live_driver_traffic_parses_as_the_recordings_do() {
    require_root();
    use uvspan::db::System;
    let (pg, pg_trust, my, redis) = (postgres(PgAuth::Scram), postgres(PgAuth::Trust), mariadb(), self::redis());
    let out = TempDir::new("db-record");
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/db");
    let systems = [System::Postgres, System::Postgres, System::Mysql, System::Redis, System::Redis];
    for (s, system) in SCENARIOS.iter().zip(systems) {
        let files = record(s, out.path(), &pg, &pg_trust, &my, &redis);
        assert_eq!(files, [format!("{s}.rec")], "{s}: one connection");
        let (live, stop) = ops_of(&out.path().join(&files[0]), system);
        assert_eq!(stop, None, "{s}: the live traffic stopped the parser");
        let (want, _) = ops_of(&golden.join(&files[0]), system);
        assert!(!want.is_empty(), "{s}: the recording has no operations");
        assert_eq!(live, want, "{s}");
    }
}
