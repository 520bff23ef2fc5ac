//! Checks shared by several test files.

use super::otlp::Span;
use super::report::{summary, summary_number};
use super::runner::Output;

/// Clock agreement allowed between uvspan's span times and the fixture's own
/// `performance.timeOrigin + performance.now()` markers.
pub const CLOCK_SLACK_MS: f64 = 1.0;

/// uvspan's summary agrees with what the receiver got, and nothing was lost:
/// nothing dropped, failed, unflushed, lost in the kernel, undecodable or
/// left unfinished at process exit, and no panic or failed export on stderr.
pub fn check_summary(out: &Output, received: usize) {
    let sum = summary(&out.stderr);
    assert_eq!(sum.exported, received as u64, "spans exported per uvspan vs received\n{}", out.context());
    assert_eq!(
        (sum.dropped, sum.failed, sum.unflushed, sum.lost, sum.undecodable),
        (0, 0, 0, 0, 0),
        "nothing may be dropped, fail, stay unflushed or get lost\n{}",
        out.context()
    );
    // Requests still in flight when the process exited.
    assert_eq!(summary_number(&out.stderr, " unfinished at process exit"), 0, "requests left unfinished at exit\n{}", out.context());
    assert!(!out.stderr.contains("panicked"), "{}", out.context());
    assert!(!out.stderr.contains("export failed"), "{}", out.context());
}

// ---------------------------------------------------------------------------
// Threadpool attributes
// ---------------------------------------------------------------------------

/// The attribute keys of an async request whose threadpool start and end were seen.
pub const THREADPOOL_SPLIT_KEYS: [&str; 4] =
    ["uvspan.threadpool.queue_wait_ms", "uvspan.threadpool.run_ms", "uvspan.loop.callback_wait_ms", "uvspan.threadpool.thread.id"];

/// An async request's threadpool split: the attributes and the
/// threadpool.start/end events agree with each other, lie inside the span,
/// and the work ran on a thread other than `pid`'s loop thread. Returns
/// that thread's id.
pub fn check_threadpool_split(s: &Span, pid: i64) -> i64 {
    let ctx = s.brief();
    let qw = s.double("uvspan.threadpool.queue_wait_ms").unwrap_or_else(|| panic!("no queue_wait_ms: {ctx}"));
    let run = s.double("uvspan.threadpool.run_ms").unwrap_or_else(|| panic!("no run_ms: {ctx}"));
    let cbw = s.double("uvspan.loop.callback_wait_ms").unwrap_or_else(|| panic!("no callback_wait_ms: {ctx}"));
    let worker = s.int("uvspan.threadpool.thread.id").unwrap_or_else(|| panic!("no worker thread id: {ctx}"));
    assert!(qw >= 0.0 && run >= 0.0 && cbw >= 0.0, "negative threadpool times: {ctx}");
    assert!(worker > 0 && worker != pid, "the work did not run on a threadpool thread: {ctx}");
    let names: Vec<&str> = s.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["threadpool.start", "threadpool.end"], "events of {ctx}");
    let (t1, t2) = (s.events[0].time_unix_nano, s.events[1].time_unix_nano);
    assert!(
        s.start_unix_nano <= t1 && t1 <= t2 && t2 <= s.end_unix_nano,
        "threadpool events not ordered inside the span: start={} work_start={t1} work_end={t2} end={}: {ctx}",
        s.start_unix_nano,
        s.end_unix_nano
    );
    let close = |a: f64, b_ns: u64, what: &str| {
        assert!((a - b_ns as f64 / 1e6).abs() < 0.001, "{what}={a} but the events say {} ms: {ctx}", b_ns as f64 / 1e6)
    };
    close(qw, t1 - s.start_unix_nano, "queue_wait_ms");
    close(run, t2 - t1, "run_ms");
    close(cbw, s.end_unix_nano - t2, "callback_wait_ms");
    worker
}

/// Whether `s` is work no request caused: a root, or under its process's
/// start-up span, a task's span or its process's root span (with
/// `--trace-per process`, the default for `-- COMMAND`), never under a
/// request's span.
pub fn outside_requests(spans: &[Span], s: &Span) -> bool {
    if s.parent_span_id.is_empty() {
        return true;
    }
    spans.iter().any(|p| {
        p.span_id == s.parent_span_id
            && p.kind == 1
            && (matches!(p.name.as_str(), "startup" | "main" | "timers" | "immediate" | "io") || p.str("process.command_line").is_some())
    })
}

/// V8 10.2's GC points (Node 18; Debian's libnode.so), in catalog order:
/// fallbacks for V8's GC callbacks of Node 20–26.
pub const GC_V10: [&str; 6] = [
    "_ZN2v88internal4Heap23CallGCPrologueCallbacksENS_6GCTypeENS_15GCCallbackFlagsE",
    "_ZN2v88internal4Heap23CallGCEpilogueCallbacksENS_6GCTypeENS_15GCCallbackFlagsE",
    "_ZN2v88internal4Heap25GarbageCollectionPrologueENS0_23GarbageCollectionReasonENS_15GCCallbackFlagsE",
    "_ZN2v88internal4Heap25GarbageCollectionEpilogueENS0_16GarbageCollectorE",
    "_ZN2v88internal4Heap41InvokeIncrementalMarkingPrologueCallbacksEv",
    "_ZN2v88internal4Heap41InvokeIncrementalMarkingEpilogueCallbacksEv",
];
/// What uvspan says is lost without them.
pub const GC_LOST: &str = "no V8 garbage collections: no v8js.gc events, uvspan.loop.gc_ms or v8js.gc.duration";
