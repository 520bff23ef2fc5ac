//! A database operation's CLIENT span and its `db.client.operation.duration`
//! attributes, with the semantic conventions' names (database spans, v1.33+:
//! `db.system.name`, `db.operation.name`, `db.collection.name`,
//! `db.namespace`, `db.query.text`, `db.response.status_code`,
//! `db.response.returned_rows`, `error.type`, `server.address`,
//! `server.port`). Pure.

use std::borrow::Cow;

use opentelemetry::trace::{SpanId, SpanKind, Status};

use super::{Op, System};
use crate::events::spans::{span_under, Family, KeyValue, Parent, Span, SpanContextSource};
use crate::metrics::Val;

/// The histogram of operation durations (seconds), recorded for every
/// operation seen whatever is sampled.
pub const DURATION_METRIC: &str = "db.client.operation.duration";

/// Set when the query text was cut ([`Op::query_truncated`]).
pub const QUERY_TRUNCATED: &str = "uvspan.db.query_truncated";

/// One operation with what the caller knows of its connection.
pub struct Call<'a> {
    pub op: &'a Op,
    pub system: System,
    /// The MySQL server said it is MariaDB ([`super::Conn::is_mariadb`]).
    pub mariadb: bool,
    /// The server's address and port (the socket's peer).
    pub server: Option<(String, u16)>,
    /// Kernel ns: the start of the write that sent the request, the end of
    /// the read that took the response's last byte.
    pub times: (u64, u64),
}

/// `db.system.name`.
pub fn system_name(system: System, mariadb: bool) -> &'static str {
    match system {
        System::Postgres => "postgresql",
        System::Mysql if mariadb => "mariadb",
        System::Mysql => "mysql",
        System::Redis => "redis",
        System::Mongo => "mongodb",
    }
}

/// The span's name: `{db.operation.name} {target}`, the target being the
/// collection, else the namespace, else `server.address:server.port`; the
/// target alone without an operation; `db.system.name` without either.
pub fn span_name(c: &Call<'_>) -> String {
    let op = &c.op.operation;
    let target = c.op.collection.clone().or_else(|| c.op.namespace.clone()).or_else(|| c.server.as_ref().map(|(a, p)| format!("{a}:{p}")));
    match (op.is_empty(), target) {
        (false, Some(t)) => format!("{op} {t}"),
        (false, None) => op.clone(),
        (true, Some(t)) => t,
        (true, None) => system_name(c.system, c.mariadb).to_string(),
    }
}

/// The span's attributes.
pub fn attributes(c: &Call<'_>) -> Vec<KeyValue> {
    let op = c.op;
    let mut a = Vec::with_capacity(11);
    a.push(KeyValue::new("db.system.name", system_name(c.system, c.mariadb)));
    if !op.operation.is_empty() {
        a.push(KeyValue::new("db.operation.name", op.operation.clone()));
    }
    if let Some(v) = &op.collection {
        a.push(KeyValue::new("db.collection.name", v.clone()));
    }
    if let Some(v) = &op.namespace {
        a.push(KeyValue::new("db.namespace", v.clone()));
    }
    if let Some(v) = &op.query {
        a.push(KeyValue::new("db.query.text", v.clone()));
        if op.query_truncated {
            a.push(KeyValue::new(QUERY_TRUNCATED, true));
        }
    }
    if let Some(v) = &op.status {
        a.push(KeyValue::new("db.response.status_code", v.clone()));
        a.push(KeyValue::new("error.type", v.clone()));
    }
    if let Some(n) = op.rows {
        a.push(KeyValue::new("db.response.returned_rows", i64::try_from(n).unwrap_or(i64::MAX)));
    }
    if let Some((addr, port)) = &c.server {
        a.push(KeyValue::new("server.address", addr.clone()));
        a.push(KeyValue::new("server.port", i64::from(*port)));
    }
    a
}

/// The CLIENT span of `c` under `parent` with `span_id`: ERROR when the
/// server answered with an error (its message the status's description).
pub fn db_span(c: &Call<'_>, span_id: SpanId, parent: &Parent, src: &SpanContextSource<'_>) -> Span {
    let name = Cow::Owned(span_name(c));
    let mut s = span_under(src, parent, span_id, name, (SpanKind::Client, Family::Db), c.times, attributes(c));
    if let Some(code) = &c.op.status {
        let msg = c.op.error.as_deref().filter(|m| !m.is_empty()).unwrap_or(code);
        s.status = Status::error(msg.to_string());
    }
    s
}

/// The `db.client.operation.duration` series' attributes (sorted; no query
/// text: its values would be unbounded).
pub fn metric_attributes(c: &Call<'_>) -> Vec<(&'static str, Val)> {
    let op = c.op;
    let mut a = vec![("db.system.name", Val::Str(Cow::Borrowed(system_name(c.system, c.mariadb))))];
    if !op.operation.is_empty() {
        a.push(("db.operation.name", Val::Str(op.operation.clone().into())));
    }
    if let Some(v) = &op.collection {
        a.push(("db.collection.name", Val::Str(v.clone().into())));
    }
    if let Some(v) = &op.namespace {
        a.push(("db.namespace", Val::Str(v.clone().into())));
    }
    if let Some(v) = &op.status {
        a.push(("db.response.status_code", Val::Str(v.clone().into())));
        a.push(("error.type", Val::Str(v.clone().into())));
    }
    if let Some((addr, port)) = &c.server {
        a.push(("server.address", Val::Str(addr.clone().into())));
        a.push(("server.port", Val::Int(i64::from(*port))));
    }
    a.sort();
    a
}

/// The operation's duration in seconds (the histogram's unit).
pub fn duration_secs(c: &Call<'_>) -> f64 {
    c.times.1.saturating_sub(c.times.0) as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TraceId;

    use super::*;
    use crate::db::tests::{recording, replay};
    use crate::db::Options;
    use crate::events::clock::Clock;
    use crate::events::spans::{SequentialIds, Value};

    fn spans_of(name: &str, system: System) -> Vec<Span> {
        let (ops, conn) = replay(system, &recording(name), Options::default());
        let ids = SequentialIds::default();
        let src = SpanContextSource { clock: Clock::with_offset(0), ids: &ids, sampler: Default::default() };
        let parent = Parent { trace_id: TraceId::from(7u128), span_id: SpanId::from(9u64), remote: false, state: Default::default() };
        ops.iter()
            .enumerate()
            .map(|(i, op)| {
                let call = Call {
                    op,
                    system,
                    mariadb: conn.is_mariadb(),
                    server: Some(("127.0.0.1".into(), system.default_port())),
                    times: (op.start_chunk * 1000, op.end_chunk * 1000 + 500),
                };
                db_span(&call, SpanId::from(100 + i as u64), &parent, &src)
            })
            .collect()
    }

    fn attr<'a>(s: &'a Span, k: &str) -> Option<&'a Value> {
        s.attr(k)
    }

    #[test]
    fn a_missing_table_is_an_error_span_with_its_sqlstate() {
        let spans = spans_of("pg_scram", System::Postgres);
        let s = &spans[4];
        assert_eq!(s.name, "SELECT missing_table");
        assert_eq!(s.span_kind, SpanKind::Client);
        assert_eq!(s.family, Family::Db);
        assert_eq!(s.parent_span_id, SpanId::from(9u64));
        assert_eq!(s.status, Status::error("relation \"missing_table\" does not exist"));
        assert_eq!(attr(s, "db.system.name"), Some(&Value::from("postgresql")));
        assert_eq!(attr(s, "db.response.status_code"), Some(&Value::from("42P01".to_string())));
        assert_eq!(attr(s, "error.type"), Some(&Value::from("42P01".to_string())));
        assert_eq!(attr(s, "db.collection.name"), Some(&Value::from("missing_table".to_string())));
        assert_eq!(attr(s, "db.query.text"), Some(&Value::from("SELECT * FROM missing_table WHERE id = ?".to_string())));
        assert_eq!(attr(s, "server.port"), Some(&Value::I64(5432)));
        // A success: no status, its namespace as the target.
        let ok = &spans[0];
        assert_eq!(ok.name, "SELECT uvspan");
        assert_eq!(ok.status, Status::Unset);
        assert_eq!(attr(ok, "db.response.returned_rows"), Some(&Value::I64(1)));
        assert_eq!(attr(ok, "error.type"), None);
        assert_eq!((ok.start_ns, ok.end_ns), (6000, 7500), "from the request's write to the response's read");
    }

    #[test]
    fn mariadb_and_redis_spans_are_named_after_their_system() {
        let my = spans_of("mysql2", System::Mysql);
        assert_eq!(attr(&my[0], "db.system.name"), Some(&Value::from("mariadb")));
        assert_eq!(my[4].name, "SELECT missing_table");
        assert_eq!(attr(&my[4], "db.response.status_code"), Some(&Value::from("1146".to_string())));
        let r = spans_of("ioredis", System::Redis);
        let get = r.iter().find(|s| attr(s, "db.query.text") == Some(&Value::from("GET user:1".to_string()))).unwrap();
        assert_eq!(get.name, "GET 127.0.0.1:6379");
        assert_eq!(attr(get, "db.system.name"), Some(&Value::from("redis")));
        let err =
            r.iter().find(|s| s.status != Status::Unset && attr(s, "db.operation.name") == Some(&Value::from("INCR".to_string()))).unwrap();
        assert_eq!(attr(err, "error.type"), Some(&Value::from("ERR".to_string())));
    }

    #[test]
    fn the_metric_has_no_query_text_and_sorted_attributes() {
        let op = Op {
            operation: "SELECT".into(),
            collection: Some("t".into()),
            namespace: Some("db".into()),
            query: Some("SELECT * FROM t WHERE a = ?".into()),
            status: Some("42P01".into()),
            ..Op::default()
        };
        let c =
            Call { op: &op, system: System::Postgres, mariadb: false, server: Some(("db.local".into(), 5432)), times: (1_000, 21_000_000) };
        let a = metric_attributes(&c);
        let keys: Vec<&str> = a.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            [
                "db.collection.name",
                "db.namespace",
                "db.operation.name",
                "db.response.status_code",
                "db.system.name",
                "error.type",
                "server.address",
                "server.port"
            ]
        );
        assert!((duration_secs(&c) - 0.020999).abs() < 1e-9);
        assert_eq!(span_name(&c), "SELECT t");
        let none = Op::default();
        let c = Call { op: &none, system: System::Mongo, mariadb: false, server: None, times: (0, 0) };
        assert_eq!(span_name(&c), "mongodb");
    }
}
