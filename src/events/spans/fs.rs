//! `fs.<op>` spans: one per finished fs request.

use super::{fail, keys, threadpool, Builder, Family, KeyValue, Span};
use crate::events::decode::FsRecord;
use crate::probes::catalog::{self, FsResult};

pub(super) fn span(b: &Builder<'_>, mut r: FsRecord) -> Span {
    let row = catalog::fs_op(r.op_id);
    let name = row.map_or("fs.unknown", |o| o.span);
    let family = Family::Fs(row.map_or("unknown", |o| o.op()));
    // Sized for what this span gets: one allocation, no spare.
    let n = 3
        + usize::from(r.path.is_some())
        + usize::from(r.path2.is_some())
        + usize::from(r.fd.is_some())
        + usize::from(r.op.stack.is_some())
        + usize::from(r.op.ended_at.is_some())
        + if r.op.work_start_ns.is_some() { 3 } else { 0 }
        + usize::from(r.op.worker_tid.is_some());
    let mut attrs = Vec::with_capacity(n);
    if let Some(p) = r.path {
        attrs.push(KeyValue::new(keys::FILE_PATH, p));
    }
    if let Some(p) = r.path2 {
        attrs.push(KeyValue::new(keys::NEW_PATH, p));
    }
    if let Some(fd) = r.fd {
        attrs.push(KeyValue::new(keys::FD, i64::from(fd)));
    }
    attrs.push(KeyValue::new(keys::THREAD_ID, i64::from(r.op.tid)));
    attrs.push(KeyValue::new(keys::SYNC, r.op.sync));
    if let Some(st) = r.op.stack.take() {
        attrs.push(KeyValue::new(keys::STACKTRACE, st));
    }
    if r.result >= 0 {
        // What the result means is said on the operation's catalog row.
        let key = match row.map_or(FsResult::Nothing, |o| o.result) {
            FsResult::Nothing => None,
            FsResult::Bytes => Some(keys::BYTES),
            FsResult::Fd => Some(keys::FD),
            FsResult::Entries => Some(keys::ENTRIES),
        };
        if let Some(key) = key {
            attrs.push(KeyValue::new(key, r.result));
        }
    }
    // Said only when the end is not the usual one: sync calls end at their
    // return (or uv_fs_req_cleanup right after it, on kernels without
    // session uprobes), async ones at libuv's completion.
    let usual = |at| if r.op.sync { at == "return" || at == "uv_fs_req_cleanup" } else { at == "libuv_done" };
    if let Some(at) = r.op.ended_at.filter(|&at| !usual(at)) {
        attrs.push(KeyValue::new(keys::ENDED_AT, at));
    }
    let mut span = b.span(family, name, b.parent, r.op.start_ns, r.op.end_ns, attrs);
    threadpool(b, &mut span, &r.op);
    if r.result < 0 {
        if row.is_some_and(|o| o.missing_ok) && r.result == -i64::from(libc::ENOENT) {
            span.attributes.push(KeyValue::new(keys::ERROR_TYPE, "ENOENT"));
        } else {
            fail(&mut span, r.result);
        }
    }
    span
}

#[cfg(test)]
mod tests {
    use super::super::testing::{attr, build_one};
    use super::super::Value;
    use crate::events::decode::{FsRecord, OpRecord, Record};
    use crate::probes::catalog::FS_OPS;
    use opentelemetry::trace::Status;

    fn rec(symbol: &str) -> FsRecord {
        FsRecord {
            op: OpRecord::test(10, 11, 1_000, 5_000),
            op_id: FS_OPS.iter().position(|o| o.symbol == symbol).unwrap() as u8,
            result: 0,
            fd: None,
            path: None,
            path2: None,
        }
    }

    /// `rec(symbol)`, sync or not, ended at `at`.
    fn ended(symbol: &str, sync: bool, at: &'static str) -> FsRecord {
        let mut r = rec(symbol);
        (r.op.sync, r.op.ended_at) = (sync, Some(at));
        r
    }

    #[test]
    fn async_read_with_threadpool_split() {
        let mut r = FsRecord { result: 4096, fd: Some(7), ..rec("uv_fs_read") };
        (r.op.work_start_ns, r.op.work_end_ns, r.op.worker_tid) = (Some(2_000), Some(3_000), Some(12));
        let spans = build_one(&Record::Fs(r));
        assert_eq!(spans.len(), 1);
        let s = &spans[0];
        assert_eq!(s.name, "fs.read");
        assert_eq!((s.start_ns, s.end_ns), (1_000, 5_000));
        assert_eq!(attr(s, "uvspan.fs.bytes"), Some(&Value::I64(4096)));
        assert_eq!(attr(s, "uvspan.fs.fd"), Some(&Value::I64(7)));
        assert_eq!(attr(s, "uvspan.sync"), Some(&Value::Bool(false)));
        assert_eq!(attr(s, "thread.id"), Some(&Value::I64(11)));
        assert_eq!(attr(s, "uvspan.threadpool.queue_wait_ms"), Some(&Value::F64(0.001)));
        assert_eq!(attr(s, "uvspan.threadpool.run_ms"), Some(&Value::F64(0.001)));
        assert_eq!(attr(s, "uvspan.loop.callback_wait_ms"), Some(&Value::F64(0.002)));
        assert_eq!(attr(s, "uvspan.threadpool.thread.id"), Some(&Value::I64(12)));
        let events: Vec<&str> = s.events.iter().map(|e| e.name).collect();
        assert_eq!(events, ["threadpool.start", "threadpool.end"]);
        assert_eq!(attr(s, "uvspan.ended_at"), None, "the usual end is not said");
        assert_eq!(s.status, Status::Unset);
    }

    #[test]
    fn result_meaning_comes_from_the_row() {
        let open = build_one(&Record::Fs(FsRecord { result: 23, path: Some("/a".into()), ..rec("uv_fs_open") }));
        assert_eq!(attr(&open[0], "uvspan.fs.fd"), Some(&Value::I64(23)));
        assert_eq!(attr(&open[0], "file.path"), Some(&Value::from("/a")));
        let scandir = build_one(&Record::Fs(FsRecord { result: 3, ..rec("uv_fs_scandir") }));
        assert_eq!(attr(&scandir[0], "uvspan.fs.entries"), Some(&Value::I64(3)));
        let stat = build_one(&Record::Fs(FsRecord { result: 0, ..rec("uv_fs_stat") }));
        assert!(["uvspan.fs.bytes", "uvspan.fs.fd", "uvspan.fs.entries"].iter().all(|k| attr(&stat[0], k).is_none()));
    }

    #[test]
    fn a_sync_call_ending_at_its_return_or_cleanup_is_the_usual_end() {
        for at in ["return", "uv_fs_req_cleanup"] {
            let s = &build_one(&Record::Fs(ended("uv_fs_stat", true, at)))[0];
            assert_eq!(attr(s, "uvspan.ended_at"), None, "{at}");
        }
        let s = &build_one(&Record::Fs(ended("uv_fs_stat", false, "uv_fs_req_cleanup")))[0];
        assert_eq!(attr(s, "uvspan.ended_at"), Some(&Value::from("uv_fs_req_cleanup")), "an async request's late end is said");
    }

    #[test]
    fn sync_failure_with_two_paths() {
        let r = FsRecord {
            result: -2,
            path: Some("/from".into()),
            path2: Some("/to".into()),
            ..ended("uv_fs_rename", true, "next_libuv_call")
        };
        let s = &build_one(&Record::Fs(r))[0];
        assert_eq!(s.name, "fs.rename");
        assert_eq!(attr(s, "uvspan.file.new_path"), Some(&Value::from("/to")));
        assert_eq!(attr(s, "error.type"), Some(&Value::from("ENOENT")));
        assert_eq!(s.status, Status::error("ENOENT: no such file or directory"));
        assert_eq!(attr(s, "uvspan.ended_at"), Some(&Value::from("next_libuv_call")));
        assert_eq!(s.parent_span_id, opentelemetry::trace::SpanId::INVALID);
    }

    #[test]
    fn enoent_of_an_existence_check_is_an_answer_not_an_error() {
        use crate::probes::catalog::FS_OPS;
        // Every op: ENOENT is an ERROR span unless its catalog row says it checks existence.
        for o in FS_OPS {
            let r = FsRecord { result: -2, ..ended(o.symbol, true, "return") };
            let s = &build_one(&Record::Fs(r))[0];
            assert_eq!(attr(s, "error.type"), Some(&Value::from("ENOENT")), "{}", o.span);
            let want = if o.missing_ok { Status::Unset } else { Status::error("ENOENT: no such file or directory") };
            assert_eq!(s.status, want, "{}", o.span);
        }
        let rows: Vec<&str> = FS_OPS.iter().filter(|o| o.missing_ok).map(|o| o.span).collect();
        assert_eq!(rows, ["fs.stat", "fs.lstat", "fs.access"]);
        // Another failure of a check stays an error.
        let r = FsRecord { result: -13, ..ended("uv_fs_stat", true, "return") };
        assert!(matches!(build_one(&Record::Fs(r))[0].status, Status::Error { .. }), "EACCES");
    }
}
