//! What the request stage's tests share: records, a run of the tracker,
//! and heads as the traced process may write them.

use proptest::prelude::*;

use super::{Ready, Requests};
use crate::events::clock::Clock;
use crate::events::decode::{FsRecord, HttpRecord, HttpWhat, OpRecord, Record};
use crate::events::spans::{SequentialIds, Span, SpanContextSource, Value};

/// A span's attribute.
pub(super) fn attr<'a>(s: &'a Span, k: &str) -> Option<&'a Value> {
    s.attr(k)
}

/// An HTTP record of process 7 on connection `conn` from 10.0.0.2 to port 8080.
pub(crate) fn http(what: HttpWhat, cause: u64, conn: u64, ts: u64, data: &str) -> HttpRecord {
    HttpRecord {
        pid: 7,
        tid: 7,
        ts_ns: ts,
        cause,
        dropped: false,
        conn,
        stream: 0,
        what,
        len: data.len() as u32,
        tls: false,
        peer: Some("10.0.0.2:51000".parse().unwrap()),
        local_port: Some(8080),
        data: data.as_bytes().to_vec(),
        callback: 0,
    }
}

/// An fs record (a stat) of process 7 caused by request `cause`.
pub(super) fn fs(cause: u64, start: u64, end: u64) -> Record {
    Record::Fs(FsRecord {
        op: OpRecord {
            pid: 7,
            tid: 7,
            req: 0,
            stack: None,
            cause,
            dropped: false,
            counted: false,
            sync: false,
            start_ns: start,
            work_start_ns: None,
            work_end_ns: None,
            end_ns: end,
            worker_tid: None,
            ended_at: Some("libuv_done"),
        },
        op_id: 4, // uv_fs_stat
        result: 0,
        fd: None,
        path: Some("/x".into()),
        path2: None,
    })
}

/// A sampled traceparent.
pub(super) const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// `steps` on a tracker (no joining): the spans they made ready.
pub(super) fn run(steps: impl FnOnce(&mut Requests, &SpanContextSource<'_>, &mut Ready)) -> Vec<Span> {
    let ids = SequentialIds::default();
    let src = SpanContextSource { clock: Clock::with_offset(0), ids: &ids, sampler: Default::default() };
    let mut r = Requests::new(false);
    let mut ready = Ready::default();
    steps(&mut r, &src, &mut ready);
    ready.into_values().flatten().collect()
}

/// A request or status head, often well-formed, cut anywhere.
fn head() -> impl Strategy<Value = Vec<u8>> {
    let line = prop_oneof![
        "(GET|POST|PATCH|PROPFIND|[A-Z]{1,8}) /[ -~]{0,40} HTTP/1\\.[01]",
        "HTTP/1\\.[01] [0-9]{3} [ -~]{0,12}",
        "[ -~]{0,40}",
    ];
    let header = prop_oneof![
        "(traceparent|tracestate|user-agent|host|content-length|transfer-encoding|TraceParent|x-[a-z]{1,5}) ?: ?[ -~]{0,60}",
        "traceparent: 0[0-9a-f]-[0-9a-f]{32}-[0-9a-f]{16}-0[01]",
        "[ -~]{0,30}",
    ];
    // More than httparse's 64 headers sometimes (then read line by line).
    let many = prop_oneof![3 => Just(0usize), 1 => 60usize..70];
    (
        line,
        prop::collection::vec(header, 0..8),
        many,
        any::<bool>(),
        prop::option::of(any::<prop::sample::Index>()),
        prop::collection::vec(any::<u8>(), 0..8),
    )
        .prop_map(|(line, headers, many, end, cut, junk)| {
            let mut b = line.into_bytes();
            for h in headers.iter().map(String::as_str).chain(std::iter::repeat_n("x-a: b", many)) {
                b.extend_from_slice(b"\r\n");
                b.extend_from_slice(h.as_bytes());
            }
            if end {
                b.extend_from_slice(b"\r\n\r\n");
            }
            b.extend_from_slice(&junk);
            if let Some(cut) = cut {
                b.truncate(cut.index(b.len() + 1));
            }
            b
        })
}

/// An HTTP/2 header record's `name\0value`, often one uvspan reads.
fn h2_field() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![Just(":method"), Just(":path"), Just(":status"), Just(":authority"), Just(":scheme"), Just("traceparent"), Just("x")],
        "[ -~]{0,40}",
    )
        .prop_map(|(n, v)| format!("{n}\0{v}").into_bytes())
}

/// A head ([`head`]), an HTTP/2 header or any bytes.
pub(super) fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![head(), h2_field(), prop::collection::vec(any::<u8>(), 0..300)]
}
