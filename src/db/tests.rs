//! The parsers on real drivers' traffic (tests/golden/db, recorded by
//! tests/db/record.js), on hand-built bytes, and on any bytes in any
//! chunking.

use super::*;

/// A recording's chunks: (direction, bytes).
pub(crate) fn recording(name: &str) -> Vec<(Dir, Vec<u8>)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/db").join(format!("{name}.rec"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (d, hex) = l.split_once(' ').expect("direction and hex");
            let dir = match d {
                "c" => Dir::Request,
                "s" => Dir::Response,
                _ => panic!("bad direction {d:?}"),
            };
            let bytes = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
            (dir, bytes)
        })
        .collect()
}

/// An op on one line, every field that matters shown.
pub(crate) fn render(op: &Op) -> String {
    let o = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    format!(
        "{} | coll={} | ns={} | q={}{} | status={} {} | rows={} | {}..{}",
        op.operation,
        o(&op.collection),
        o(&op.namespace),
        o(&op.query),
        if op.query_truncated { " (cut)" } else { "" },
        o(&op.status),
        o(&op.error),
        op.rows.map_or("-".into(), |r| r.to_string()),
        op.start_chunk,
        op.end_chunk
    )
}

pub(crate) fn replay(system: System, chunks: &[(Dir, Vec<u8>)], options: Options) -> (Vec<Op>, Conn) {
    let mut c = Conn::new(system, options);
    let mut ops = Vec::new();
    for (d, b) in chunks {
        c.feed(*d, b, b.len());
        ops.extend(c.take_ops());
    }
    (ops, c)
}

fn golden(name: &str, system: System) -> Vec<String> {
    let (ops, c) = replay(system, &recording(name), Options::default());
    assert_eq!(c.stopped(), None, "{name}: parsing stopped");
    assert_eq!(c.dropped(), 0, "{name}: requests dropped");
    ops.iter().map(render).collect()
}

#[test]
fn print_all() {
    for (n, s) in [("pg_scram", System::Postgres), ("porsager_trust", System::Postgres), ("mysql2", System::Mysql), ("ioredis", System::Redis), ("node_redis", System::Redis)] {
        let (ops, c) = replay(s, &recording(n), Options::default());
        eprintln!("== {n} stopped={:?} dropped={}", c.stopped(), c.dropped());
        for o in &ops { eprintln!("{:?},", render(o)); }
    }
}
