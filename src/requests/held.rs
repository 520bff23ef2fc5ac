//! Tail exceptions decided in the kernel: an unsampled request the kernel
//! followed holds its records there (its head, then its work) until its
//! end. One uvspan ends itself (not answered whole, its process gone)
//! comes to the tracker as those records and, once it answered, its
//! response's status as a write at its last activity: the tracker decides
//! and counts it as any other.

use crate::events::decode::{decode, HttpRecord, HttpWhat, Record};
use crate::events::sampler::CAUSE_DROP;
use crate::kernel::tracer::FollowedRequest;

/// The records of a followed request uvspan ends: those held (raw, as the
/// kernel keeps them) decoded in order, and its status. A record that does
/// not decode is counted in `undecodable` and left out.
pub fn held_records(r: &FollowedRequest, held: &[Vec<u8>], undecodable: &std::cell::Cell<u64>) -> Vec<Record> {
    let mut out: Vec<Record> = held.iter().filter_map(|b| decode(b).map_err(|_| undecodable.set(undecodable.get() + 1)).ok()).collect();
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
        FollowedRequest {
            pid: 7,
            method: 0,
            ver: 1,
            tls: false,
            status,
            start_ns: 1_000,
            end_ns,
            cause: 5 << 8 | CAUSE_DROP,
            conn: 0x55,
            held: 2,
        }
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
            r.finish_all(&src, &mut ready);
            let spans: Vec<_> = ready.into_values().flatten().collect();
            assert_eq!(spans.len(), if kept { 2 } else { 0 }, "status {status}: {spans:?}");
            let f = &r.finished.as_ref().unwrap()[0];
            assert_eq!((f.status, f.start_ns, f.end_ns), (Some(status), 1_000, 9_000));
            assert_eq!(r.stats.tail_kept, u64::from(kept));
        }
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
