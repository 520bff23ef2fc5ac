//! Tail exceptions decided in the kernel: the records of an unsampled
//! request the kernel follows are sent marked held, and uvspan keeps their
//! bytes, unread, until the kernel ends the request: they go on (kept, or
//! handed over to user space) or are dropped. One uvspan ends itself (not
//! answered whole, its process gone) goes to the tracker with those
//! records and, once it answered, its response's status as a write at its
//! last activity: the tracker decides and counts it as any other.

use rustc_hash::FxHashMap;

use crate::events::decode::{decode, HeldRecord, HttpRecord, HttpWhat, Record};
use crate::events::sampler::CAUSE_DROP;
use crate::kernel::tracer::FollowedRequest;

/// The most bytes held at once (all requests): beyond, records are lost
/// (counted) and a kept request lacks them.
const HELD_BYTES_MAX: usize = 64 << 20;
/// The most records one request holds (as the tracker: 512 operations).
const HELD_RECORDS_MAX: usize = 512;
/// Held longer than this without an end (a verdict lost with the ring
/// buffer full), a request's bytes are dropped (counted): uvspan ends a
/// request the kernel follows within 30 s of its last activity.
const HELD_FOR_MAX_NS: u64 = 120_000_000_000;

/// A request's held records: when the first came, and their bytes.
type Records = (u64, Vec<Vec<u8>>);

/// The held records' bytes, per (process, cause).
#[derive(Debug, Default)]
pub struct Held {
    by: FxHashMap<(u32, u64), Records>,
    bytes: usize,
    /// Records not held (over a bound) or dropped unreleased (too old).
    pub lost: u64,
}

impl Held {
    /// A held record (`now_ns`: the time, read for a request's first, for
    /// the age bound).
    pub fn hold(&mut self, r: HeldRecord, now_ns: impl FnOnce() -> u64) {
        if self.bytes + r.bytes.len() > HELD_BYTES_MAX {
            self.lost += 1;
            return;
        }
        let (_, recs) = self.by.entry((r.pid, r.cause)).or_insert_with(|| (now_ns(), Vec::new()));
        if recs.len() >= HELD_RECORDS_MAX {
            self.lost += 1;
            return;
        }
        self.bytes += r.bytes.len();
        recs.push(r.bytes);
    }

    /// A request's held records, taken (in the order they came).
    pub fn take(&mut self, pid: u32, cause: u64) -> Vec<Vec<u8>> {
        let recs = self.by.remove(&(pid, cause & !CAUSE_DROP)).map(|(_, r)| r).unwrap_or_default();
        self.bytes -= recs.iter().map(Vec::len).sum::<usize>();
        recs
    }

    /// Requests held too long (their end lost): dropped, counted.
    pub fn sweep(&mut self, now_ns: u64) {
        let old: Vec<(u32, u64)> =
            self.by.iter().filter(|(_, (since, _))| now_ns.saturating_sub(*since) > HELD_FOR_MAX_NS).map(|(k, _)| *k).collect();
        for (pid, cause) in old {
            self.lost += self.take(pid, cause).len() as u64;
        }
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.by.is_empty()
    }
}

/// Held bytes decoded, in order; one that does not decode is counted in
/// `undecodable` and left out.
pub fn released(held: &[Vec<u8>], undecodable: &std::cell::Cell<u64>) -> Vec<Record> {
    held.iter().filter_map(|b| decode(b).map_err(|_| undecodable.set(undecodable.get() + 1)).ok()).collect()
}

/// The records of a followed request uvspan ends: those held, decoded in
/// order, and its status.
pub fn held_records(r: &FollowedRequest, held: &[Vec<u8>], undecodable: &std::cell::Cell<u64>) -> Vec<Record> {
    let mut out = released(held, undecodable);
    if let Some(status) = r.status {
        out.push(Record::Http(HttpRecord {
            pid: r.pid,
            tid: 0,
            ts_ns: r.end_ns,
            cause: r.cause & !CAUSE_DROP,
            dropped: r.cause & CAUSE_DROP != 0,
            conn: r.conn,
            stream: 0,
            what: HttpWhat::Write,
            len: 0,
            tls: r.tls,
            peer: None,
            local_port: None,
            // No length: the tracker ends it once quiet, at this write.
            data: format!("HTTP/1.1 {status:03} \r\n\r\n").into_bytes(),
            callback: 0,
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::clock::Clock;
    use crate::events::decode::record_bytes;
    use crate::events::spans::{SequentialIds, SpanContextSource};
    use crate::kernel::skel::types::{ev_kind, fs_event, http_event, http_what};
    use crate::requests::{Ready, Requests, Tail};

    fn followed(status: Option<u16>, end_ns: u64) -> FollowedRequest {
        FollowedRequest { pid: 7, method: 0, ver: 1, tls: false, status, start_ns: 1_000, end_ns, cause: 5 << 8 | CAUSE_DROP, conn: 0x55 }
    }

    fn held() -> Vec<Vec<u8>> {
        let head = record_bytes(usize::MAX, |e: &mut http_event| {
            e.hdr.kind = ev_kind::EV_HTTP;
            e.hdr.pid = 7;
            e.ts_ns = 1_000;
            e.cause = 5 << 8 | CAUSE_DROP;
            e.conn = 0x44;
            e.what = http_what::HTTP_REQUEST.0;
            let line = b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n";
            for (d, b) in e.data.iter_mut().zip(line) {
                *d = *b as i8;
            }
            e.captured = line.len() as u32;
            e.len = e.captured;
        });
        let work = record_bytes(usize::MAX, |e: &mut fs_event| {
            e.op.hdr.kind = ev_kind::EV_FS;
            e.op.hdr.pid = 7;
            e.op.cause = 5 << 8 | CAUSE_DROP;
            e.op.start_ns = 2_000;
            e.op.end_ns = 3_000;
            e.fd = -1;
        });
        vec![head, work]
    }

    /// A 500 that ended outside the kernel is kept with its work, its end
    /// at its last activity; a 200 is not.
    #[test]
    fn held_records_let_the_tracker_decide() {
        for (status, kept) in [(500, true), (200, false)] {
            let bad = std::cell::Cell::new(0);
            let recs = held_records(&followed(Some(status), 9_000), &held(), &bad);
            assert_eq!((recs.len(), bad.get()), (3, 0));
            let mut r = Requests::new(false);
            r.tail = Tail { errors: true, slower_than_ns: None };
            r.finished = Some(Vec::new());
            let ids = SequentialIds::default();
            let src = SpanContextSource { clock: Clock::with_offset(0), ids: &ids, sampler: Default::default() };
            let mut ready = Ready::default();
            for rec in recs {
                match rec {
                    Record::Http(h) => r.http(&h, false, &src, &mut ready),
                    rec => assert!(r.work(rec, &src, &mut ready).is_none(), "held under its request"),
                }
            }
            r.finish_all(0, &src, &mut ready);
            let spans: Vec<_> = ready.into_values().flatten().collect();
            assert_eq!(spans.len(), if kept { 2 } else { 0 }, "status {status}: {spans:?}");
            let f = &r.finished.as_ref().unwrap()[0];
            assert_eq!((f.status, f.start_ns, f.end_ns), (Some(status), 1_000, 9_000));
            assert_eq!(r.stats.tail_kept, u64::from(kept));
        }
    }

    /// Held bytes are bounded per request and kept per (process, cause)
    /// until taken; what is over a bound, or held too long, is counted.
    #[test]
    fn held_bytes_are_bounded_and_counted() {
        let mut h = Held::default();
        let rec = |cause: u64, n: usize| HeldRecord { pid: 7, cause, bytes: vec![0; n] };
        for _ in 0..HELD_RECORDS_MAX + 3 {
            h.hold(rec(1, 8), || 0);
        }
        h.hold(rec(2, 8), || 10);
        assert_eq!(h.lost, 3);
        assert_eq!(h.take(7, 1 | CAUSE_DROP).len(), HELD_RECORDS_MAX, "taken by its cause, with or without the sampler's bit");
        assert!(h.take(7, 1).is_empty());
        h.sweep(HELD_FOR_MAX_NS);
        assert!(!h.is_empty(), "not yet too old");
        h.sweep(HELD_FOR_MAX_NS + 11);
        assert!(h.is_empty());
        assert_eq!(h.lost, 4);
        h.hold(rec(3, HELD_BYTES_MAX + 1), || 0);
        assert_eq!((h.lost, h.is_empty()), (5, true), "over the bytes bound");
    }

    #[test]
    fn an_unanswered_request_has_no_status_record_and_bad_bytes_are_counted() {
        let bad = std::cell::Cell::new(0);
        let mut raw = held();
        raw.push(vec![1, 2, 3]);
        let recs = held_records(&followed(None, 3_000), &raw, &bad);
        assert_eq!((recs.len(), bad.get()), (2, 1));
    }
}
