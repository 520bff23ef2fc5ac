//! Decoding tests: layouts, cut records, and any bytes (proptest).

use super::*;

fn set_str(dst: &mut [i8], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes()) {
        *d = b as i8;
    }
}

#[test]
fn paths_that_are_not_utf8_are_shown_lossily() {
    let mut raw = [0i8; 16];
    for (d, b) in raw.iter_mut().zip(b"/tmp/a\xffb\0junk") {
        *d = *b as i8;
    }
    assert_eq!(cstr(&raw), "/tmp/a\u{fffd}b");
    let mut raw = [0i8; 16];
    set_str(&mut raw, "/tmp/caf\u{e9}");
    assert_eq!(cstr(&raw), "/tmp/caf\u{e9}");
}

/// The kernel sends an fs record up to its path's NUL in whole words
/// (none at all without a path).
#[test]
fn fs_record_cut_after_its_path() {
    let head = std::mem::offset_of!(fs_event, path);
    for (len, want) in [(head + 8, Some("/a/b/c")), (head + 16, Some("/a/b/c")), (head, None)] {
        let bytes = record_bytes(len, |e: &mut fs_event| {
            e.op.hdr.kind = ev_kind::EV_FS;
            e.op.hdr.pid = 10;
            e.fd = 3;
            e.result = 4096;
            e.path_len = 7;
            set_str(&mut e.path, "/a/b/c");
        });
        let Record::Fs(r) = decode(&bytes).unwrap() else { panic!("not fs") };
        assert_eq!(r.path.as_deref(), want, "{len} bytes");
        assert_eq!((r.fd, r.result), (Some(3), 4096));
    }
    assert!(decode(&record_bytes(head - 8, |e: &mut fs_event| e.op.hdr.kind = ev_kind::EV_FS)).is_err(), "shorter than the fixed part");
}

/// An HTTP record is sent up to what was captured (in whole words).
#[test]
fn http_record_keeps_the_bytes_captured_and_sent() {
    let at = std::mem::offset_of!(http_event, data);
    let head = b"GET /x HTTP/1.1\r\n";
    for (len, captured, want) in [(at + 24, head.len(), &head[..]), (at + 8, head.len(), &head[..8]), (at, 0, &b""[..])] {
        let bytes = record_bytes(len, |e: &mut http_event| {
            e.hdr.kind = ev_kind::EV_HTTP;
            e.hdr.pid = 10;
            e.what = http_what::HTTP_REQUEST.0;
            e.captured = captured as u32;
            e.len = 300;
            for (d, b) in e.data.iter_mut().zip(head) {
                *d = *b as _;
            }
        });
        let Record::Http(r) = decode(&bytes).unwrap() else { panic!("not http") };
        assert_eq!(r.data, want, "{len} bytes sent");
        assert_eq!((r.what, r.len), (HttpWhat::Request, 300));
    }
}

/// An HTTP/2 header record (name NUL-padded to its slot, value after)
/// comes out as `name\0value`; a close carries no bytes.
#[test]
fn http2_records() {
    let slot = uvspan_sizes::UVSPAN_H2_NAME.0 as usize;
    let head = std::mem::size_of::<http_event>() - uvspan_sizes::UVSPAN_HTTP_CAPTURE.0 as usize;
    let bytes = record_bytes(head + slot + 8, |e: &mut http_event| {
        e.hdr.kind = ev_kind::EV_HTTP;
        e.what = http_what::HTTP2_HEADER.0;
        e.captured = (slot + 3) as u32;
        e.len = 3;
        for (d, b) in e.data.iter_mut().zip(b":status") {
            *d = *b as _;
        }
        for (d, b) in e.data[slot..].iter_mut().zip(b"503") {
            *d = *b as _;
        }
    });
    let Record::Http(r) = decode(&bytes).unwrap() else { panic!("not http") };
    assert_eq!((r.what, r.data.as_slice()), (HttpWhat::Http2Header, b":status\x00503".as_slice()));
    let bytes = record_bytes(head, |e: &mut http_event| {
        e.hdr.kind = ev_kind::EV_HTTP;
        e.what = http_what::HTTP2_CLOSE.0;
    });
    let Record::Http(r) = decode(&bytes).unwrap() else { panic!("not http") };
    assert_eq!((r.what, r.data.len()), (HttpWhat::Http2Close, 0));
}

/// An HTTP/2 client record (each header in its slot, :path last, cut at
/// the record's end) comes out as `name\0value` pairs, empty slots left
/// out, with its stream id.
#[test]
fn http2_client_records() {
    use crate::kernel::skel::types::h2_client_slot as slot;
    let head = std::mem::size_of::<http_event>() - uvspan_sizes::UVSPAN_HTTP_CAPTURE.0 as usize;
    let path = slot::H2C_PATH.0 as usize;
    let bytes = record_bytes(head + path + 8, |e: &mut http_event| {
        e.hdr.kind = ev_kind::EV_HTTP;
        e.what = http_what::HTTP2_CLIENT.0;
        e.stream_id = 7;
        e.captured = (path + 6) as u32;
        for (at, v) in [(slot::H2C_METHOD.0, &b"GET"[..]), (slot::H2C_AUTHORITY.0, b"up:80"), (slot::H2C_PATH.0, b"/a?b=c")] {
            for (d, b) in e.data[at as usize..].iter_mut().zip(v) {
                *d = *b as _;
            }
        }
    });
    let Record::Http(r) = decode(&bytes).unwrap() else { panic!("not http") };
    assert_eq!((r.what, r.stream), (HttpWhat::Http2Client, 7));
    assert_eq!(r.data, b":method\x00GET\x00:authority\x00up:80\x00:path\x00/a?b=c");
}

#[test]
fn fs_record_without_second_path() {
    let bytes = record_bytes(std::mem::size_of::<fs_event>() - 256, |e: &mut fs_event| {
        e.op.hdr.kind = ev_kind::EV_FS;
        e.op.hdr.pid = 10;
        e.op.hdr.tid = 11;
        e.op_id = 0;
        e.op.start_ns = 100;
        e.op.end_ns = 200;
        e.result = -2;
        e.fd = -1;
        e.op.end_kind = ev_end::END_DONE.0 as u8;
        set_str(&mut e.path, "/no/such");
    });
    let Record::Fs(r) = decode(&bytes).unwrap() else { panic!("not fs") };
    assert_eq!(r.path.as_deref(), Some("/no/such"));
    assert_eq!(r.path2, None);
    assert_eq!(r.fd, None);
    assert_eq!(r.result, -2);
    assert_eq!(r.op.ended_at, Some("libuv_done"));
}

/// fs and DNS records start with the same `op_event`, decoded the same.
#[test]
fn fs_and_dns_records_share_their_first_part() {
    assert_eq!((std::mem::offset_of!(fs_event, op), std::mem::offset_of!(dns_event, op)), (0, 0));
    let op = |o: &mut op_event| {
        o.hdr.pid = 10;
        o.hdr.tid = 11;
        o.req = 0x7f00_0000_1000;
        o.cause = 42;
        o.start_ns = 100;
        o.work_start_ns = 150;
        o.work_end_ns = 0;
        o.end_ns = 200;
        o.worker_tid = 12;
        o.sync = 0;
        o.end_kind = ev_end::END_CLEANUP.0 as u8;
    };
    let fs = record_bytes(usize::MAX, |e: &mut fs_event| {
        op(&mut e.op);
        e.op.hdr.kind = ev_kind::EV_FS;
    });
    let dns = record_bytes(usize::MAX, |e: &mut dns_event| {
        op(&mut e.op);
        e.op.hdr.kind = ev_kind::EV_DNS;
    });
    let (Record::Fs(fs), Record::Dns(dns)) = (decode(&fs).unwrap(), decode(&dns).unwrap()) else { panic!("not fs and dns") };
    assert_eq!(fs.op, dns.op);
    let want = OpRecord {
        pid: 10,
        tid: 11,
        req: 0x7f00_0000_1000,
        stack: None,
        cause: 42,
        dropped: false,
        counted: false,
        sync: false,
        start_ns: 100,
        work_start_ns: Some(150),
        work_end_ns: None,
        end_ns: 200,
        worker_tid: Some(12),
        ended_at: Some("uv_fs_req_cleanup"),
    };
    assert_eq!(fs.op, want);
    // The kernel's sampler bit is taken off the cause, kept apart.
    let dropped = record_bytes(usize::MAX, |e: &mut fs_event| {
        op(&mut e.op);
        e.op.cause = 42 | crate::events::sampler::CAUSE_DROP;
        e.op.hdr.kind = ev_kind::EV_FS;
    });
    let Record::Fs(fs) = decode(&dropped).unwrap() else { panic!("not fs") };
    assert_eq!((fs.op.cause, fs.op.dropped, fs.op.counted), (42, true, false));
    // Held for the tail exceptions, already counted in the kernel.
    let counted = record_bytes(usize::MAX, |e: &mut fs_event| {
        op(&mut e.op);
        e.op.cause = 42 | crate::events::sampler::CAUSE_DROP;
        e.op.flags = crate::kernel::skel::types::op_flags::OP_COUNTED.0 as u16;
        e.op.hdr.kind = ev_kind::EV_FS;
    });
    let Record::Fs(fs) = decode(&counted).unwrap() else { panic!("not fs") };
    assert_eq!((fs.op.cause, fs.op.dropped, fs.op.counted), (42, true, true));
}

#[test]
fn stack_samples_keep_their_frames_in_order() {
    let bytes = record_bytes(usize::MAX, |e: &mut stack_event| {
        e.hdr.kind = ev_kind::EV_STACK;
        e.hdr.pid = 10;
        e.hdr.tid = 10;
        e.iter_start_ns = 1_000;
        e.ts_ns = 60_000_000;
        e.n_frames = 3;
        for (i, f) in e.frames.iter_mut().enumerate() {
            f.pc = 0x1000 + i as u64;
            f.fp_m16 = 0x2001;
            f.obj[0] = 0x3001;
        }
    });
    let Record::Stack(r) = decode(&bytes).unwrap() else { panic!("not a stack") };
    assert_eq!((r.pid, r.iter_start_ns, r.ts_ns), (10, 1_000, 60_000_000));
    let pcs: Vec<u64> = r.frames.iter().map(|f| f.pc).collect();
    assert_eq!(pcs, [0x1000, 0x1001, 0x1002], "n_frames of them, innermost first");
    assert_eq!((r.frames[0].fp_m16, r.frames[0].obj[0]), (0x2001, 0x3001));
    // A frame count beyond the array is clamped, a short record refused.
    let over = record_bytes(usize::MAX, |e: &mut stack_event| {
        e.hdr.kind = ev_kind::EV_STACK;
        e.n_frames = 1_000;
    });
    let Record::Stack(r) = decode(&over).unwrap() else { panic!("not a stack") };
    assert_eq!(r.frames.len(), uvspan_sizes::UVSPAN_STACK_FRAMES.0 as usize);
    assert!(decode(&over[..100]).is_err());
}

/// Loop records of versions before the split end with their phases: they
/// decode, without a split; a split is there only when measured.
#[test]
fn loop_records_with_and_without_the_split() {
    let fill = |split: u32| {
        move |e: &mut loop_event| {
            e.hdr.kind = ev_kind::EV_LOOP;
            e.start_ns = 1_000;
            e.end_ns = 200_000;
            e.split = split;
            e.on_cpu_ns = 150_000;
            e.runqueue_ns = 20_000;
            e.throttled_ns = 5_000;
        }
    };
    let old = record_bytes(std::mem::offset_of!(loop_event, on_cpu_ns), fill(0));
    let Record::Loop(r) = decode(&old).unwrap() else { panic!("not a loop record") };
    assert_eq!((r.end_ns, r.split), (200_000, None));
    let measured = loop_split::SPLIT_MEASURED.0;
    let Record::Loop(r) = decode(&record_bytes(usize::MAX, fill(measured))).unwrap() else { panic!() };
    assert_eq!(r.split, Some(LoopSplit { on_cpu_ns: 150_000, runqueue_ns: 20_000, throttled_ns: None }));
    let Record::Loop(r) = decode(&record_bytes(usize::MAX, fill(measured | loop_split::SPLIT_THROTTLE.0))).unwrap() else { panic!() };
    assert_eq!(r.split.unwrap().throttled_ns, Some(5_000));
    let Record::Loop(r) = decode(&record_bytes(usize::MAX, fill(loop_split::SPLIT_THROTTLE.0))).unwrap() else { panic!() };
    assert_eq!(r.split, None, "throttling alone is no split");
}

#[test]
fn dns_answers_are_decoded() {
    let bytes = record_bytes(usize::MAX, |e: &mut dns_event| {
        e.op.hdr.kind = ev_kind::EV_DNS;
        e.n_answers = 2;
        e.answers[0].family = 2;
        e.answers[0].addr[..4].copy_from_slice(&[127, 0, 0, 1]);
        e.answers[1].family = 10;
        e.answers[1].addr[15] = 1;
        set_str(&mut e.host, "localhost");
    });
    let Record::Dns(r) = decode(&bytes).unwrap() else { panic!("not dns") };
    assert_eq!(r.host, "localhost");
    assert_eq!(r.answers, vec!["127.0.0.1".parse::<std::net::IpAddr>().unwrap(), "::1".parse().unwrap()]);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    assert!(matches!(decode(&[1, 2]), Err(DecodeError::Short { .. })));
    let h = record_bytes(usize::MAX, |h: &mut ev_header| h.kind = ev_kind(99));
    assert_eq!(decode(&h), Err(DecodeError::UnknownKind(99)));
    let f = record_bytes(40, |f: &mut fs_event| f.op.hdr.kind = ev_kind::EV_FS);
    assert!(matches!(decode(&f), Err(DecodeError::Short { kind: 1, len: 40 })));
}

/// Ring-buffer records carry what the traced process wrote (paths,
/// hosts, HTTP bytes, counts): any bytes, of any length, decode to a
/// record within its arrays' bounds or to an error, never a panic.
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::kernel::skel::types::{dns_event, fs_event, http_event, loop_event, proc_event, stack_event};

    /// Lengths where records change meaning: each record's size and its
    /// shortest valid length, one byte either side.
    fn lengths() -> Vec<usize> {
        let sizes = [
            std::mem::size_of::<ev_header>(),
            std::mem::offset_of!(fs_event, path),
            std::mem::size_of::<fs_event>(),
            std::mem::size_of::<dns_event>(),
            std::mem::size_of::<loop_event>(),
            std::mem::offset_of!(http_event, data),
            std::mem::size_of::<http_event>(),
            std::mem::size_of::<stack_event>(),
            std::mem::size_of::<proc_event>(),
        ];
        sizes.iter().flat_map(|&n| [n.saturating_sub(1), n, n + 1]).collect()
    }

    fn record() -> impl Strategy<Value = Vec<u8>> {
        let max = std::mem::size_of::<stack_event>() + 64;
        let len = prop_oneof![0..max, prop::sample::select(lengths())];
        let kind = prop_oneof![4 => 1u32..=8, 1 => any::<u32>()];
        (kind, len, any::<u64>()).prop_map(|(kind, len, seed)| {
            // Cheap pseudo-random bytes (xorshift), then the kind.
            let mut x = seed | 1;
            let mut b: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            if let Some(k) = b.get_mut(..4) {
                k.copy_from_slice(&kind.to_le_bytes());
            }
            b
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn any_bytes_decode_within_bounds_or_fail(data in prop_oneof![record(), prop::collection::vec(any::<u8>(), 0..64)]) {
            match decode(&data) {
                Ok(Record::Fs(r)) => {
                    let most = 3 * std::mem::size_of::<fs_event>();
                    prop_assert!(r.path.as_ref().is_none_or(|p| p.len() <= most) && r.path2.as_ref().is_none_or(|p| p.len() <= most));
                }
                Ok(Record::Dns(r)) => {
                    prop_assert!(r.answers.len() <= uvspan_sizes::UVSPAN_MAX_ANSWERS.0 as usize);
                    prop_assert!(r.host.len() <= 3 * std::mem::size_of::<dns_event>());
                }
                Ok(Record::Loop(r)) => prop_assert!(r.phases.len() <= uvspan_sizes::UVSPAN_PHASES.0 as usize),
                Ok(Record::Http(r)) => {
                    prop_assert!(r.data.len() <= uvspan_sizes::UVSPAN_HTTP_CAPTURE.0 as usize);
                    prop_assert!(r.data.len() <= data.len());
                }
                Ok(Record::Stack(r)) => prop_assert!(r.frames.len() <= uvspan_sizes::UVSPAN_STACK_FRAMES.0 as usize),
                Ok(_) => {}
                Err(DecodeError::Short { len, .. }) => prop_assert_eq!(len, data.len()),
                Err(DecodeError::UnknownKind(k)) => prop_assert!(!(1..=8).contains(&k)),
            }
        }

        #[test]
        fn a_recording_splits_into_what_it_holds(data in prop::collection::vec(any::<u8>(), 0..512), records in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..8)) {
            let total: usize = read_recording(&data).iter().map(|r| 4 + r.len()).sum();
            prop_assert!(total <= data.len());
            let mut rec = Vec::new();
            for r in &records {
                write_recorded(&mut rec, r).unwrap();
            }
            let n = rec.len();
            rec.extend_from_slice(&data[..data.len().min(3)]);
            prop_assert_eq!(read_recording(&rec), records.iter().map(Vec::as_slice).collect::<Vec<_>>(), "{} bytes, a cut tail ignored", n);
        }
    }
}

/// A record sent held keeps its bytes, the mark taken off, with its
/// process and its request's cause (without the sampler's bit): they
/// decode later as the record they are.
#[test]
fn held_records_keep_their_bytes_for_later() {
    use crate::kernel::skel::types::hdr_flags;
    let bytes = record_bytes(usize::MAX, |e: &mut fs_event| {
        e.op.hdr.kind = ev_kind::EV_FS;
        e.op.hdr.pid = 10;
        e.op.hdr.flags = hdr_flags::HDR_HELD.0;
        e.op.cause = 42 | crate::events::sampler::CAUSE_DROP;
        e.op.start_ns = 100;
        e.op.end_ns = 200;
    });
    let Record::Held(h) = decode(&bytes).unwrap() else { panic!("not held") };
    assert_eq!((h.pid, h.cause), (10, 42));
    let Record::Fs(fs) = decode(&h.bytes).unwrap() else { panic!("not fs once released") };
    assert_eq!((fs.op.pid, fs.op.cause, fs.op.dropped, fs.op.end_ns), (10, 42, true, 200));
    // Too short to hold a cause: not decodable.
    assert!(decode(&bytes[..20]).is_err());
}
