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
fn pg_simple_extended_prepared_error_transaction_with_scram_login() {
    assert_eq!(
        golden("pg_scram", System::Postgres),
        [
            "SELECT | coll=- | ns=uvspan | q=SELECT ? AS one, ? AS s | status=- - | rows=1 | 6..7",
            "SELECT | coll=- | ns=uvspan | q=SELECT $1::int + $2::int AS sum | status=- - | rows=1 | 8..9",
            "SELECT | coll=- | ns=uvspan | q=SELECT $1::text AS v | status=- - | rows=1 | 10..11",
            // The prepared statement reused by name: Bind/Execute only.
            "SELECT | coll=- | ns=uvspan | q=SELECT $1::text AS v | status=- - | rows=1 | 12..13",
            "SELECT | coll=missing_table | ns=uvspan | q=SELECT * FROM missing_table WHERE id = ? | status=42P01 relation \"missing_table\" does not exist | rows=- | 14..15",
            "BEGIN | coll=- | ns=uvspan | q=BEGIN | status=- - | rows=- | 16..17",
            "CREATE TABLE | coll=- | ns=uvspan | q=CREATE TEMP TABLE items (id int, name text) | status=- - | rows=- | 18..19",
            "INSERT | coll=items | ns=uvspan | q=INSERT INTO items VALUES (?, ?), (?, ?) | status=- - | rows=2 | 20..21",
            "UPDATE | coll=items | ns=uvspan | q=UPDATE items SET name = $1 WHERE id > $2 | status=- - | rows=2 | 22..23",
            "COMMIT | coll=- | ns=uvspan | q=COMMIT | status=- - | rows=- | 24..25",
            "SELECT | coll=- | ns=uvspan | q=SELECT pg_sleep(?) | status=- - | rows=1 | 26..27",
        ]
    );
}

#[test]
fn pg_porsager_describes_then_executes_named_statements() {
    // Its Execute's operation starts at the Parse/Describe round trip
    // (chunk 4), not at the Bind (6).
    assert_eq!(
        golden("porsager_trust", System::Postgres),
        [
            "SELECT | coll=- | ns=uvspan | q=SELECT ? AS one | status=- - | rows=1 | 2..3",
            "SELECT | coll=- | ns=uvspan | q=SELECT $1::int AS a | status=- - | rows=1 | 4..7",
            "SELECT | coll=- | ns=uvspan | q=SELECT $1::text AS b | status=- - | rows=1 | 8..11",
            "SELECT | coll=- | ns=uvspan | q=SELECT $1::int AS a | status=- - | rows=1 | 12..13",
            "SELECT | coll=missing_table | ns=uvspan | q=SELECT * FROM missing_table | status=42P01 relation \"missing_table\" does not exist | rows=- | 14..15",
        ]
    );
}

#[test]
fn mysql2_query_prepare_execute_error_ok() {
    let (_, c) = replay(System::Mysql, &recording("mysql2"), Options::default());
    assert!(c.is_mariadb(), "the greeting says MariaDB");
    assert_eq!(
        golden("mysql2", System::Mysql),
        [
            "SELECT | coll=- | ns=uvspan | q=SELECT ? + ? AS two, ? AS s | status=- - | rows=1 | 3..4",
            "PREPARE | coll=- | ns=uvspan | q=SELECT ? + ? AS sum | status=- - | rows=- | 5..6",
            "SELECT | coll=- | ns=uvspan | q=SELECT ? + ? AS sum | status=- - | rows=1 | 7..8",
            "SELECT | coll=- | ns=uvspan | q=SELECT ? + ? AS sum | status=- - | rows=1 | 9..10",
            "SELECT | coll=missing_table | ns=uvspan | q=SELECT * FROM missing_table WHERE id = ? | status=1146 Table 'uvspan.missing_table' doesn't exist | rows=- | 11..12",
            "CREATE | coll=- | ns=uvspan | q=CREATE TEMPORARY TABLE items (id INT, name VARCHAR(?)) | status=- - | rows=0 | 13..14",
            "INSERT | coll=items | ns=uvspan | q=INSERT INTO items VALUES (?, ?), (?, ?) | status=- - | rows=2 | 15..16",
        ]
    );
}

#[test]
fn ioredis_resp3_pipeline_multi_exec_and_errors() {
    assert_eq!(
        golden("ioredis", System::Redis),
        [
            "HELLO | coll=- | ns=- | q=HELLO ? | status=- - | rows=- | 0..1",
            "CLIENT | coll=- | ns=- | q=CLIENT SETINFO ? ? | status=ERR ERR unknown subcommand 'SETINFO'. Try CLIENT HELP. | rows=- | 0..1",
            "CLIENT | coll=- | ns=- | q=CLIENT SETINFO ? ? | status=ERR ERR unknown subcommand 'SETINFO'. Try CLIENT HELP. | rows=- | 0..1",
            "INFO | coll=- | ns=- | q=INFO | status=- - | rows=- | 2..3",
            "SET | coll=- | ns=- | q=SET user:1 ? | status=- - | rows=- | 4..5",
            "GET | coll=- | ns=- | q=GET user:1 | status=- - | rows=- | 6..7",
            "GET | coll=- | ns=- | q=GET user:missing | status=- - | rows=- | 8..9",
            // A pipeline: one operation per command, replies in order.
            "SET | coll=- | ns=- | q=SET n ? | status=- - | rows=- | 10..11",
            "INCR | coll=- | ns=- | q=INCR n | status=- - | rows=- | 10..11",
            "GET | coll=- | ns=- | q=GET n | status=- - | rows=- | 10..11",
            "MULTI | coll=- | ns=- | q=MULTI | status=- - | rows=- | 12..13",
            "SET | coll=- | ns=- | q=SET m ? | status=- - | rows=- | 12..13",
            "GET | coll=- | ns=- | q=GET m | status=- - | rows=- | 12..13",
            "EXEC | coll=- | ns=- | q=EXEC | status=- - | rows=- | 12..13",
            "INCR | coll=- | ns=- | q=INCR user:1 | status=ERR ERR value is not an integer or out of range | rows=- | 14..15",
            "QUIT | coll=- | ns=- | q=QUIT | status=- - | rows=- | 16..17",
        ]
    );
}

#[test]
fn node_redis_resp3_map_reply_and_error() {
    assert_eq!(
        golden("node_redis", System::Redis),
        [
            "HELLO | coll=- | ns=- | q=HELLO ? | status=- - | rows=- | 0..1",
            "CLIENT | coll=- | ns=- | q=CLIENT SETINFO ? ? | status=ERR ERR unknown subcommand 'SETINFO'. Try CLIENT HELP. | rows=- | 0..1",
            "CLIENT | coll=- | ns=- | q=CLIENT SETINFO ? ? | status=ERR ERR unknown subcommand 'SETINFO'. Try CLIENT HELP. | rows=- | 0..1",
            "CLIENT | coll=- | ns=- | q=CLIENT MAINT_NOTIFICATIONS ? ? ? | status=ERR ERR unknown subcommand 'MAINT_NOTIFICATIONS'. Try CLIENT HELP. | rows=- | 0..1",
            "SET | coll=- | ns=- | q=SET user:2 ? | status=- - | rows=- | 2..3",
            "GET | coll=- | ns=- | q=GET user:2 | status=- - | rows=- | 4..5",
            "HSET | coll=- | ns=- | q=HSET h ? ? ? ? | status=- - | rows=- | 6..7",
            "HGETALL | coll=- | ns=- | q=HGETALL h | status=- - | rows=- | 8..9",
            "INCR | coll=- | ns=- | q=INCR user:2 | status=ERR ERR value is not an integer or out of range | rows=- | 10..11",
        ]
    );
}

const RECORDINGS: [(&str, System); 5] = [
    ("pg_scram", System::Postgres),
    ("porsager_trust", System::Postgres),
    ("mysql2", System::Mysql),
    ("ioredis", System::Redis),
    ("node_redis", System::Redis),
];

#[test]
fn recordings_guess_their_protocol_on_any_port() {
    for (name, system) in RECORDINGS {
        let rec = recording(name);
        let first = |d: Dir| rec.iter().find(|(x, _)| *x == d).map(|(_, b)| b.clone()).unwrap_or_default();
        // MySQL's server speaks first: its client's first bytes come after.
        let req = if system == System::Mysql { Vec::new() } else { first(Dir::Request) };
        assert_eq!(guess(&req, &first(Dir::Response), 40_000), Some(system), "{name}");
    }
}

#[test]
fn mid_stream_messages_guess_only_on_the_default_port() {
    let q = b"Q\x00\x00\x00\x0dSELECT 1\x00";
    assert_eq!(guess(q, b"", 5432), Some(System::Postgres));
    assert_eq!(guess(q, b"", 8080), None);
    let my = b"\x09\x00\x00\x00\x03SELECT 1";
    assert_eq!(guess(my, b"", 3306), Some(System::Mysql));
    assert_eq!(guess(my, b"", 5432), None);
    assert_eq!(guess(b"PING\r\n", b"", 6379), Some(System::Redis));
    assert_eq!(guess(b"GET / HTTP/1.1\r\n", b"", 8080), None);
    assert_eq!(guess(b"", b"", 5432), None);
}

#[test]
fn raw_query_keeps_literals_but_never_parameters() {
    let (ops, _) = replay(System::Postgres, &recording("pg_scram"), Options { raw_query: true });
    assert_eq!(ops[0].query.as_deref(), Some("SELECT 1 AS one, 'it''s' AS s"));
    assert_eq!(ops[2].query.as_deref(), Some("SELECT $1::text AS v"));
    assert!(ops.iter().all(|o| !o.query.as_deref().unwrap_or("").contains("secret")), "a bound parameter in query text");
    let (ops, _) = replay(System::Redis, &recording("ioredis"), Options { raw_query: true });
    assert!(ops.iter().any(|o| o.query.as_deref() == Some("SET user:1 alice")));
    let (ops, _) = replay(System::Redis, &recording("ioredis"), Options::default());
    assert!(ops.iter().all(|o| !o.query.as_deref().unwrap_or("").contains("alice")), "a value in sanitized Redis text");
}

/// `chunks` split again at `cuts` (positions in each chunk's bytes), each
/// piece remembering the chunk it came from.
fn rechunk(chunks: &[(Dir, Vec<u8>)], cuts: &[usize]) -> Vec<(Dir, Vec<u8>, u64)> {
    let mut out = Vec::new();
    let mut cut = cuts.iter().cycle();
    for (i, (d, b)) in chunks.iter().enumerate() {
        let mut rest = &b[..];
        while !rest.is_empty() {
            let n = if cuts.is_empty() { rest.len() } else { (*cut.next().unwrap_or(&1)).clamp(1, rest.len()) };
            out.push((*d, rest[..n].to_vec(), i as u64));
            rest = &rest[n..];
        }
    }
    out
}

/// Replays re-chunked pieces; the ops' chunks mapped back to the
/// original chunks.
fn replay_pieces(system: System, pieces: &[(Dir, Vec<u8>, u64)]) -> (Vec<Op>, Option<Stop>) {
    let mut c = Conn::new(system, Options::default());
    let mut ops = Vec::new();
    for (d, b, _) in pieces {
        c.feed(*d, b, b.len());
        ops.extend(c.take_ops());
    }
    for op in &mut ops {
        op.start_chunk = pieces[op.start_chunk as usize].2;
        op.end_chunk = pieces[op.end_chunk as usize].2;
    }
    (ops, c.stopped())
}

#[test]
fn byte_by_byte_gives_the_same_ops() {
    for (name, system) in RECORDINGS {
        let rec = recording(name);
        let (want, _) = replay(system, &rec, Options::default());
        let (got, stop) = replay_pieces(system, &rechunk(&rec, &[1]));
        assert_eq!(stop, None, "{name}");
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn a_capture_cut_inside_a_message_cuts_the_query_not_the_op() {
    // A 10 kB simple query of which the capture got 300 bytes.
    let sql = format!("SELECT '{}' AS big", "x".repeat(10_000));
    let mut q = vec![b'Q'];
    q.extend_from_slice(&((sql.len() + 5) as u32).to_be_bytes());
    q.extend_from_slice(sql.as_bytes());
    q.push(0);
    let mut c = Conn::new(System::Postgres, Options::default());
    c.feed(Dir::Request, &q[..300], q.len());
    c.feed(Dir::Response, b"C\x00\x00\x00\x0dSELECT 1\x00Z\x00\x00\x00\x05I", 20);
    let ops = c.take_ops();
    assert_eq!(c.stopped(), None);
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].query.as_deref(), Some("SELECT ?"), "the literal was cut: replaced to the end");
    assert!(ops[0].query_truncated);
    assert_eq!((ops[0].start_chunk, ops[0].end_chunk, ops[0].rows), (0, 1, Some(1)));
    // A cut that crosses into the next message cannot be framed.
    let mut c = Conn::new(System::Postgres, Options::default());
    c.feed(Dir::Request, &q[..10], q.len() + 20);
    assert_eq!(c.stopped(), Some(Stop::Gap));
    // Query text longer than KEEP is cut at KEEP.
    let mut c = Conn::new(System::Postgres, Options { raw_query: true });
    c.feed(Dir::Request, &q, q.len());
    c.feed(Dir::Response, b"C\x00\x00\x00\x0dSELECT 1\x00Z\x00\x00\x00\x05I", 20);
    let ops = c.take_ops();
    assert!(ops[0].query.as_ref().unwrap().len() <= KEEP && ops[0].query_truncated);
}

#[test]
fn pg_extended_batch_after_an_error_drops_the_skipped_executes() {
    // Parse+Bind+Execute twice, one Sync: the first fails, the server skips
    // the second.
    fn msg(t: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![t];
        m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }
    let mut req = Vec::new();
    for sql in ["SELECT * FROM nope", "SELECT 2"] {
        req.extend(msg(b'P', format!("\0{sql}\0\0\0").as_bytes()));
        req.extend(msg(b'B', b"\0\0\0\0\0\0\0\0"));
        req.extend(msg(b'E', b"\0\0\0\0\0"));
    }
    req.extend(msg(b'S', b""));
    let mut resp = msg(b'E', b"SERROR\0C42P01\0Mrelation \"nope\" does not exist\0\0");
    resp.extend(msg(b'Z', b"I"));
    let mut c = Conn::new(System::Postgres, Options::default());
    c.feed(Dir::Request, &req, req.len());
    c.feed(Dir::Response, &resp, resp.len());
    let ops: Vec<String> = c.take_ops().iter().map(render).collect();
    assert_eq!(ops, ["SELECT | coll=nope | ns=- | q=SELECT * FROM nope | status=42P01 relation \"nope\" does not exist | rows=- | 0..1"]);
    assert_eq!(c.dropped(), 1, "the skipped Execute is counted, not made an op");
    assert_eq!(c.stopped(), None);
}

/// A BSON document of (name, value bytes with their type first).
fn bson(elems: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut body = Vec::new();
    for (k, v) in elems {
        body.push(v[0]);
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(&v[1..]);
    }
    let mut d = ((body.len() + 5) as u32).to_le_bytes().to_vec();
    d.extend(body);
    d.push(0);
    d
}
fn bstr(s: &str) -> Vec<u8> {
    let mut v = vec![0x02];
    v.extend_from_slice(&((s.len() + 1) as u32).to_le_bytes());
    v.extend_from_slice(s.as_bytes());
    v.push(0);
    v
}
fn bdouble(f: f64) -> Vec<u8> {
    let mut v = vec![0x01];
    v.extend_from_slice(&f.to_le_bytes());
    v
}
fn bint(i: i32) -> Vec<u8> {
    let mut v = vec![0x10];
    v.extend_from_slice(&i.to_le_bytes());
    v
}
fn bdoc(t: u8, d: Vec<u8>) -> Vec<u8> {
    let mut v = vec![t];
    v.extend(d);
    v
}
/// An OP_MSG with one body section.
fn op_msg(id: u32, to: u32, flags: u32, doc: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&((16 + 4 + 1 + doc.len()) as u32).to_le_bytes());
    m.extend_from_slice(&id.to_le_bytes());
    m.extend_from_slice(&to.to_le_bytes());
    m.extend_from_slice(&2013u32.to_le_bytes());
    m.extend_from_slice(&flags.to_le_bytes());
    m.push(0);
    m.extend_from_slice(doc);
    m
}

#[test]
fn mongo_op_msg_command_collection_rows_and_error() {
    let find = op_msg(7, 0, 0, &bson(&[("find", bstr("users")), ("filter", bdoc(0x03, bson(&[("age", bint(30))]))), ("$db", bstr("app"))]));
    let batch = bson(&[("0", bdoc(0x03, bson(&[("a", bint(1))]))), ("1", bdoc(0x03, bson(&[("a", bint(2))])))]);
    let cursor = bson(&[("firstBatch", bdoc(0x04, batch)), ("id", bint(0)), ("ns", bstr("app.users"))]);
    let reply = op_msg(99, 7, 0, &bson(&[("cursor", bdoc(0x03, cursor)), ("ok", bdouble(1.0))]));
    let insert = op_msg(8, 0, 0, &bson(&[("insert", bstr("users")), ("$db", bstr("app"))]));
    let err = op_msg(
        100,
        8,
        0,
        &bson(&[("ok", bdouble(0.0)), ("errmsg", bstr("E11000 duplicate key")), ("code", bint(11000)), ("codeName", bstr("DuplicateKey"))]),
    );
    assert_eq!(guess(&find, b"", 1), Some(System::Mongo));
    let mut c = Conn::new(System::Mongo, Options::default());
    // Two requests in flight, answered out of order.
    c.feed(Dir::Request, &find, find.len());
    c.feed(Dir::Request, &insert, insert.len());
    c.feed(Dir::Response, &err, err.len());
    // The first reply split in two reads.
    c.feed(Dir::Response, &reply[..10], 10);
    c.feed(Dir::Response, &reply[10..], reply.len() - 10);
    let ops: Vec<String> = c.take_ops().iter().map(render).collect();
    assert_eq!(
        ops,
        [
            "insert | coll=users | ns=app | q=- | status=11000 E11000 duplicate key | rows=- | 1..2",
            "find | coll=users | ns=app | q=- | status=- - | rows=2 | 0..4",
        ]
    );
    assert_eq!(c.stopped(), None);
}

#[test]
fn mongo_long_reply_finds_ok_in_its_tail() {
    let find = op_msg(1, 0, 0, &bson(&[("find", bstr("big")), ("$db", bstr("app"))]));
    let big = bson(&[("pad", bstr(&"x".repeat(3 * KEEP))), ("ok", bdouble(0.0)), ("x", bint(1))]);
    let reply = op_msg(2, 1, 0, &big);
    let mut c = Conn::new(System::Mongo, Options::default());
    c.feed(Dir::Request, &find, find.len());
    c.feed(Dir::Response, &reply, reply.len());
    let ops = c.take_ops();
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].status.as_deref(), Some("ERROR"), "ok: 0 read from the reply's last bytes");
}

#[test]
fn garbled_streams_stop_with_a_reason_and_no_op() {
    for system in [System::Postgres, System::Mysql, System::Redis, System::Mongo] {
        let mut c = Conn::new(system, Options::default());
        // Framed as each protocol frames (a short length), but nothing it
        // would send: an unknown type, command or opcode.
        let garbage = b"\x03\x00\x00\x00\xee\xee\xee\r\n\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff";
        c.feed(Dir::Request, garbage, garbage.len());
        c.feed(Dir::Response, garbage, garbage.len());
        assert!(c.take_ops().is_empty(), "{system:?}");
        assert!(c.stopped().is_some(), "{system:?}: garbage parsed without a stop");
        // Later bytes are counted as chunks, not parsed.
        assert_eq!(c.feed(Dir::Request, b"*1\r\n$4\r\nPING\r\n", 14), 2);
    }
}

#[test]
fn redis_subscribe_stops_following() {
    let mut c = Conn::new(System::Redis, Options::default());
    c.feed(Dir::Request, b"*2\r\n$9\r\nSUBSCRIBE\r\n$1\r\nc\r\n", 29);
    assert_eq!(c.stopped(), Some(Stop::Unfollowed));
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    fn system() -> impl Strategy<Value = System> {
        prop_oneof![Just(System::Postgres), Just(System::Mysql), Just(System::Redis), Just(System::Mongo)]
    }

    fn chunks() -> impl Strategy<Value = Vec<(bool, Vec<u8>, usize)>> {
        prop::collection::vec((any::<bool>(), prop::collection::vec(any::<u8>(), 0..200), 0usize..64), 0..24)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        /// Any bytes, in any chunking and either direction, with capture
        /// cuts: no panic, and every op bounded by what was fed.
        #[test]
        fn any_bytes_give_a_bounded_result(system in system(), raw in any::<bool>(), chunks in chunks()) {
            let mut c = Conn::new(system, Options { raw_query: raw });
            let mut ops = Vec::new();
            let total: usize = chunks.iter().map(|(_, b, _)| b.len()).sum();
            for (req, b, extra) in &chunks {
                c.feed(if *req { Dir::Request } else { Dir::Response }, b, b.len() + extra);
                ops.extend(c.take_ops());
            }
            prop_assert!(ops.len() <= total + 1);
            for op in &ops {
                prop_assert!(op.start_chunk <= op.end_chunk);
                prop_assert!(op.end_chunk < chunks.len() as u64);
                prop_assert!(op.query.as_ref().map_or(0, String::len) <= 3 * KEEP + 8 * 1024);
                prop_assert!(op.error.as_ref().map_or(0, String::len) <= 3 * KEEP);
            }
        }

        /// A real recording split anywhere gives the same ops.
        #[test]
        fn any_chunking_of_a_recording_gives_the_same_ops(which in 0usize..RECORDINGS.len(), cuts in prop::collection::vec(1usize..40, 1..8)) {
            let (name, system) = RECORDINGS[which];
            let rec = recording(name);
            let (want, _) = replay(system, &rec, Options::default());
            let (got, stop) = replay_pieces(system, &rechunk(&rec, &cuts));
            prop_assert_eq!(stop, None);
            prop_assert_eq!(got, want);
        }

        /// A real recording with one byte changed: no panic, and if the
        /// parsing goes on, no more ops than the recording has requests.
        #[test]
        fn a_corrupted_recording_never_panics(which in 0usize..RECORDINGS.len(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let (name, system) = RECORDINGS[which];
            let mut rec = recording(name);
            let (want, _) = replay(system, &rec, Options::default());
            let total: usize = rec.iter().map(|(_, b)| b.len()).sum();
            let mut i = at.index(total);
            for (_, b) in &mut rec {
                if i < b.len() {
                    b[i] = byte;
                    break;
                }
                i -= b.len();
            }
            let (got, _) = replay(system, &rec, Options::default());
            prop_assert!(got.len() <= want.len() + 2);
        }

        #[test]
        fn sanitized_sql_is_never_longer(sql in ".{0,300}") {
            prop_assert!(sql::sanitize(&sql).len() <= sql.len());
            let _ = (sql::operation(&sql), sql::collection(&sql));
        }
    }
}
