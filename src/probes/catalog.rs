//! The probe catalog: every libuv function uvspan attaches to, which BPF
//! handler fires there, and what it captures. Adding an fs operation is a
//! row in [`FS_OPS`]; a loop phase, a row in [`PHASES`]; any other probe, a
//! row in [`OTHER`] (its handler is a case of `enum probe_kind` in
//! bpf/uvspan.h, dispatched in bpf/uvspan.bpf.c).

use crate::kernel::skel::types::{cause_kind, cookie_layout as cookie, loop_phase, probe_kind, work_batch_layout as batch};
use crate::symbols::point::WorkBatch;

/// Which file a probe's symbol lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageKind {
    /// The node executable, libnode.so or libuv.so: wherever libuv is.
    Libuv,
    /// The C library (for getaddrinfo).
    Libc,
    /// Where V8 is: the node executable, or the libnode.so of a node
    /// built with a shared libuv (Debian's).
    V8,
}

/// An optional group of probes: more detail for more probe hits. Each hit
/// is a trap into the kernel (about 1 µs on the benchmark machine), so the
/// default set is the cheapest one that still gives every fs and DNS span
/// and every slow loop iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum DetailKind {
    /// Threadpool queue/run/callback-wait split of fs and DNS spans
    /// (uv__fs_work, uv__getaddrinfo_work, uv_async_send: +2 hits per job).
    Threadpool,
    /// Loop phase spans under slow iterations (uv__io_poll, uv__run_*: +5
    /// hits per loop iteration). Without them, iterations come from the
    /// loop thread's epoll waits, with no extra probe hits.
    Phases,
    /// Both.
    All,
    /// Request context: HTTP request spans, fs/DNS spans joined to the
    /// request that caused them (on unless `--requests off`; not a
    /// `--detail` value).
    #[value(skip)]
    Requests,
}

impl DetailKind {
    pub fn name(self) -> &'static str {
        match self {
            DetailKind::Threadpool => "threadpool",
            DetailKind::Phases => "phases",
            DetailKind::All => "all",
            DetailKind::Requests => "requests",
        }
    }

    /// How a user turns this group on.
    pub fn how_to_enable(self) -> String {
        match self {
            DetailKind::Requests => "with --requests on".into(),
            k => format!("with --detail {}", k.name()),
        }
    }
}

/// Which optional groups are on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Detail {
    pub threadpool: bool,
    pub phases: bool,
    pub requests: bool,
}

impl Detail {
    /// The `--detail` groups asked for, with request context on.
    pub fn from_kinds(kinds: &[DetailKind]) -> Detail {
        let has = |k| kinds.contains(&k) || kinds.contains(&DetailKind::All);
        Detail { threadpool: has(DetailKind::Threadpool), phases: has(DetailKind::Phases), requests: true }
    }

    pub fn all() -> Detail {
        Detail { threadpool: true, phases: true, requests: true }
    }

    pub fn with_requests(self, requests: bool) -> Detail {
        Detail { requests, ..self }
    }

    pub fn enables(self, k: DetailKind) -> bool {
        match k {
            DetailKind::Threadpool => self.threadpool,
            DetailKind::Phases => self.phases,
            DetailKind::All => self.threadpool && self.phases,
            DetailKind::Requests => self.requests,
        }
    }
}

/// One attach point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub symbol: &'static str,
    pub image: ImageKind,
    /// The BPF handler that runs there (the generated `enum probe_kind`).
    pub kind: probe_kind,
    /// The handler's own cookie; [`Probe::attach_cookie`] adds the handler.
    pub cookie: u64,
    /// Shown when the symbol is missing: what is lost, or what takes over.
    pub if_missing: &'static str,
    /// A fallback: attached only when this (libuv) symbol is missing.
    pub fallback_for: Option<&'static str>,
    /// Useful only with this symbol: not attached without it.
    pub requires: Option<&'static str>,
    /// Attached only with `--detail` of this group.
    pub detail: Option<DetailKind>,
    /// The handler copes with argument registers changed by the
    /// instructions a moved probe point skips (symbols::point).
    pub args_may_change: bool,
    /// Left out, though found, when what it ends always ends elsewhere.
    pub only_for: Option<Needed>,
}

/// When a probe found in the file is attached after all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needed {
    /// Only while something is left for `uv_fs_req_cleanup` to end: sync
    /// fs calls where the kernel cannot end them at their return (no
    /// session uprobes), async requests where `uv__fs_done` is missing or
    /// io_uring may complete them (see [`super::io_uring`]).
    FsEnds,
    /// Only where the loop's epoll waits are seen by uprobes in libc (the
    /// kernel refuses fentry programs, has session uprobes, and the process
    /// was attached by itself: see `kernel::tracer`).
    LoopWaits,
    /// Only where finished jobs are not ended in batches ([`WORK_BATCH`]
    /// not found, or the batch of this kind of job not told apart).
    JobDone,
    /// Only where finished jobs are ended in batches (not turned off for
    /// a comparison: `UVSPAN_BENCH_PER_JOB_DONE=1`).
    Batches,
}

impl Probe {
    /// The defaults of a row: in libuv, no cookie, no fallback, always on.
    const ROW: Probe = Probe {
        symbol: "",
        image: ImageKind::Libuv,
        kind: probe_kind::PROBE_FS_SUBMIT,
        cookie: 0,
        if_missing: "",
        fallback_for: None,
        requires: None,
        detail: None,
        args_may_change: false,
        only_for: None,
    };

    /// The full attach cookie: handler in the top byte, handler cookie below.
    pub fn attach_cookie(&self) -> u64 {
        (u64::from(self.kind.0) << cookie::COOKIE_KIND_SHIFT.0) | self.cookie
    }
}

/// What a successful fs operation's result (`req->result`) is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsResult {
    /// 0, nothing to say.
    Nothing,
    /// Bytes read, written or sent: `uvspan.fs.bytes`.
    Bytes,
    /// The new file descriptor: `uvspan.fs.fd`.
    Fd,
    /// Directory entries returned: `uvspan.fs.entries`.
    Entries,
}

/// An fs operation: libuv function, span name, where its arguments are and
/// what its result means. Argument indices count integer/pointer arguments
/// only (System V: doubles travel in xmm registers and do not shift them);
/// 6 and 7 are on the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsOp {
    pub symbol: &'static str,
    pub span: &'static str,
    pub cb: u8,
    pub path: Option<u8>,
    pub path2: Option<u8>,
    pub fd: Option<u8>,
    pub result: FsResult,
    /// An existence check (`existsSync`, `throwIfNoEntry: false`, module
    /// resolution): ENOENT is an answer, not a failure: the span keeps
    /// `error.type` but not the ERROR status.
    pub missing_ok: bool,
}

const fn op(symbol: &'static str, span: &'static str, cb: u8, path: Option<u8>, path2: Option<u8>, fd: Option<u8>) -> FsOp {
    FsOp { symbol, span, cb, path, path2, fd, result: FsResult::Nothing, missing_ok: false }
}

impl FsOp {
    /// The operation's name: its span's without `fs.` (`stat`).
    pub fn op(&self) -> &'static str {
        self.span.strip_prefix("fs.").unwrap_or(self.span)
    }

    const fn gives(self, result: FsResult) -> FsOp {
        FsOp { result, ..self }
    }

    const fn checks_existence(self) -> FsOp {
        FsOp { missing_ok: true, ..self }
    }
}

const P: Option<u8> = Some(2); // path / fd argument right after (loop, req)
const N: Option<u8> = None;
use FsResult::{Bytes, Entries, Fd};

/// Every `uv_fs_*` request function (libuv 1.x `include/uv.h`).
/// The row index is the operation id carried in the cookie and the record.
pub const FS_OPS: &[FsOp] = &[
    op("uv_fs_open", "fs.open", 5, P, N, N).gives(Fd),
    op("uv_fs_close", "fs.close", 3, N, N, P),
    op("uv_fs_read", "fs.read", 6, N, N, P).gives(Bytes),
    op("uv_fs_write", "fs.write", 6, N, N, P).gives(Bytes),
    op("uv_fs_stat", "fs.stat", 3, P, N, N).checks_existence(),
    op("uv_fs_fstat", "fs.fstat", 3, N, N, P),
    op("uv_fs_lstat", "fs.lstat", 3, P, N, N).checks_existence(),
    op("uv_fs_statfs", "fs.statfs", 3, P, N, N),
    op("uv_fs_unlink", "fs.unlink", 3, P, N, N),
    op("uv_fs_rename", "fs.rename", 4, P, Some(3), N),
    op("uv_fs_mkdir", "fs.mkdir", 4, P, N, N),
    op("uv_fs_mkdtemp", "fs.mkdtemp", 3, P, N, N),
    op("uv_fs_mkstemp", "fs.mkstemp", 3, P, N, N).gives(Fd),
    op("uv_fs_rmdir", "fs.rmdir", 3, P, N, N),
    op("uv_fs_scandir", "fs.scandir", 4, P, N, N).gives(Entries),
    op("uv_fs_opendir", "fs.opendir", 3, P, N, N),
    op("uv_fs_readdir", "fs.readdir", 3, N, N, N).gives(Entries),
    op("uv_fs_closedir", "fs.closedir", 3, N, N, N),
    op("uv_fs_realpath", "fs.realpath", 3, P, N, N),
    op("uv_fs_readlink", "fs.readlink", 3, P, N, N),
    op("uv_fs_access", "fs.access", 4, P, N, N).checks_existence(),
    op("uv_fs_chmod", "fs.chmod", 4, P, N, N),
    op("uv_fs_fchmod", "fs.fchmod", 4, N, N, P),
    op("uv_fs_chown", "fs.chown", 5, P, N, N),
    op("uv_fs_fchown", "fs.fchown", 5, N, N, P),
    op("uv_fs_lchown", "fs.lchown", 5, P, N, N),
    op("uv_fs_fsync", "fs.fsync", 3, N, N, P),
    op("uv_fs_fdatasync", "fs.fdatasync", 3, N, N, P),
    op("uv_fs_ftruncate", "fs.ftruncate", 4, N, N, P),
    op("uv_fs_copyfile", "fs.copyfile", 5, P, Some(3), N),
    op("uv_fs_sendfile", "fs.sendfile", 6, N, N, P).gives(Bytes),
    op("uv_fs_symlink", "fs.symlink", 5, P, Some(3), N),
    op("uv_fs_link", "fs.link", 4, P, Some(3), N),
    op("uv_fs_utime", "fs.utime", 3, P, N, N),
    op("uv_fs_futime", "fs.futime", 3, N, N, P),
    op("uv_fs_lutime", "fs.lutime", 3, P, N, N),
];

/// The attach cookie of an fs submit probe (layout: enum cookie_layout in
/// bpf/uvspan.h).
pub fn fs_cookie(id: usize, op: &FsOp) -> u64 {
    let none = u64::from(cookie::COOKIE_NONE.0);
    let idx = |a: Option<u8>, shift: cookie| a.map_or(none, u64::from) << shift.0;
    (id as u64 & 0xFF)
        | idx(Some(op.cb), cookie::COOKIE_CB_SHIFT)
        | idx(op.path, cookie::COOKIE_PATH_SHIFT)
        | idx(op.path2, cookie::COOKIE_PATH2_SHIFT)
        | idx(op.fd, cookie::COOKIE_FD_SHIFT)
}

/// Where the loop takes its batch of finished threadpool jobs: one probe
/// hit per batch (bpf/batch.h ends each fs and DNS job in it) instead of one
/// per job at `uv__fs_done` and `uv__getaddrinfo_done`. Its probe point is
/// inside the function ([`crate::symbols::point::work_batch`]).
pub const WORK_BATCH: &str = "uv__work_done";

/// The symbols whose addresses the batch point needs.
pub const WORK_BATCH_SYMBOLS: [&str; 4] = [WORK_BATCH, "uv_mutex_unlock", "uv__fs_done", "uv__getaddrinfo_done"];

/// The batch probe's cookie (enum work_batch_layout in bpf/uvspan.h): the
/// byte distances from its point to `uv__fs_done` and (if known)
/// `uv__getaddrinfo_done`, and where the job queue's head is. None when a
/// distance does not fit.
pub fn work_batch_cookie(fs_done: i64, dns_done: Option<i64>, at: WorkBatch) -> Option<u64> {
    let bits = batch::BATCH_FIELD_BITS.0;
    let field = |v: i64, bits: u32| {
        let half = 1i64 << (bits - 1);
        (v != 0 && (-half..half).contains(&v)).then_some(v as u64 & ((1u64 << bits) - 1))
    };
    let dns = match dns_done {
        Some(d) => field(d, bits)?,
        None => 0,
    };
    let disp = (i64::from(at.disp) as u64) & ((1u64 << batch::BATCH_DISP_BITS.0) - 1);
    let disp_fits = (-(1i64 << (batch::BATCH_DISP_BITS.0 - 1))..(1i64 << (batch::BATCH_DISP_BITS.0 - 1))).contains(&i64::from(at.disp));
    disp_fits.then_some(())?;
    Some(
        field(fs_done, bits)?
            | dns << batch::BATCH_DNS_SHIFT.0
            | disp << batch::BATCH_DISP_SHIFT.0
            | u64::from(at.frame) << batch::BATCH_FRAME_SHIFT.0,
    )
}

/// A loop phase function (`--detail phases`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Phase {
    pub symbol: &'static str,
    /// The span is `uv.loop.<name>`.
    pub name: &'static str,
    pub phase: loop_phase,
    pub if_missing: &'static str,
}

/// Loop phases, in the order an iteration (poll entry to poll entry) sees them.
pub const PHASES: &[Phase] = &[
    Phase {
        symbol: "uv__io_poll",
        name: "poll",
        phase: loop_phase::PHASE_POLL,
        if_missing: "loop iterations are delimited by the loop thread's epoll waits, without phases",
    },
    Phase {
        symbol: "uv__run_check",
        name: "check",
        phase: loop_phase::PHASE_CHECK,
        if_missing: "no check phase span (its time joins the phase before)",
    },
    Phase {
        symbol: "uv__run_timers",
        name: "timers",
        phase: loop_phase::PHASE_TIMERS,
        if_missing: "no timers phase span (its time joins the phase before)",
    },
    Phase {
        symbol: "uv__run_idle",
        name: "idle",
        phase: loop_phase::PHASE_IDLE,
        if_missing: "no idle phase span (its time joins the phase before)",
    },
    Phase {
        symbol: "uv__run_prepare",
        name: "prepare",
        phase: loop_phase::PHASE_PREPARE,
        if_missing: "no prepare phase span (its time joins the phase before)",
    },
];

const TP: Option<DetailKind> = Some(DetailKind::Threadpool);
const PH: Option<DetailKind> = Some(DetailKind::Phases);
const RQ: Option<DetailKind> = Some(DetailKind::Requests);

/// llhttp's `llhttp__on_message_begin(parser, p, endp)`: where HTTP/1
/// requests start (the other request probes are useful only with it).
pub const HTTP_MESSAGE: &str = "llhttp__on_message_begin";

/// V8's `Heap::CallGCPrologueCallbacks(GCType, GCCallbackFlags,
/// GCTracer::Scope::ScopeId)` (Node 20-26).
pub const GC_PROLOGUE: &str = "_ZN2v88internal4Heap23CallGCPrologueCallbacksENS_6GCTypeENS_15GCCallbackFlagsENS0_8GCTracer5Scope7ScopeIdE";
/// Its epilogue twin.
pub const GC_EPILOGUE: &str = "_ZN2v88internal4Heap23CallGCEpilogueCallbacksENS_6GCTypeENS_15GCCallbackFlagsENS0_8GCTracer5Scope7ScopeIdE";
/// V8 10.2's (Node 18) two-argument `Heap::CallGCPrologueCallbacks(GCType,
/// GCCallbackFlags)`: called out of line for weak callbacks alone in the
/// official builds (inlined into the collections), for every collection in
/// Debian's libnode.
pub const GC_PROLOGUE_V10: &str = "_ZN2v88internal4Heap23CallGCPrologueCallbacksENS_6GCTypeENS_15GCCallbackFlagsE";
/// Its epilogue twin.
pub const GC_EPILOGUE_V10: &str = "_ZN2v88internal4Heap23CallGCEpilogueCallbacksENS_6GCTypeENS_15GCCallbackFlagsE";
/// V8's `Heap::GarbageCollectionPrologue(GarbageCollectionReason,
/// GCCallbackFlags)`: a minor or major collection starts.
pub const GC_PAUSE_START: &str = "_ZN2v88internal4Heap25GarbageCollectionPrologueENS0_23GarbageCollectionReasonENS_15GCCallbackFlagsE";
/// V8's `Heap::GarbageCollectionEpilogue(GarbageCollector)`: it ends.
pub const GC_PAUSE_END: &str = "_ZN2v88internal4Heap25GarbageCollectionEpilogueENS0_16GarbageCollectorE";
/// V8's `Heap::InvokeIncrementalMarkingPrologueCallbacks()`: incremental
/// marking starts.
pub const GC_INCREMENTAL_START: &str = "_ZN2v88internal4Heap41InvokeIncrementalMarkingPrologueCallbacksEv";
/// Its epilogue twin.
pub const GC_INCREMENTAL_END: &str = "_ZN2v88internal4Heap41InvokeIncrementalMarkingEpilogueCallbacksEv";
/// V8 10.2's GC points: all of them, or no collection is seen there.
pub const GC_V10: [&str; 6] = [GC_PROLOGUE_V10, GC_EPILOGUE_V10, GC_PAUSE_START, GC_PAUSE_END, GC_INCREMENTAL_START, GC_INCREMENTAL_END];
/// What is lost without V8's GC points.
const NO_GC: &str = "no V8 garbage collections: no v8js.gc events, uvspan.loop.gc_ms or v8js.gc.duration";
/// node's public `MakeCallback(Isolate*, Local<Object>, Local<Function>, int,
/// Local<Value>*, async_context)`: the call that runs a batch of JS immediates.
pub const MAKE_CALLBACK: &str =
    "_ZN4node12MakeCallbackEPN2v87IsolateENS0_5LocalINS0_6ObjectEEENS3_INS0_8FunctionEEEiPNS3_INS0_5ValueEEENS_13async_contextE";
/// node's `LibuvStreamWrap::OnUvRead(ssize_t, const uv_buf_t*)`: the bytes
/// a stream read, inside its `uv__stream_io`.
pub const STREAM_READ: &str = "_ZN4node15LibuvStreamWrap8OnUvReadElPK8uv_buf_t";
/// node's `ProcessWrap::OnExit(uv_process_t*, int64_t, int)`: a child
/// process's exit callback (in `.symtab` only).
pub const PROCESS_EXIT: &str = "_ZN4node12_GLOBAL__N_111ProcessWrap6OnExitEP12uv_process_sli";
/// node's `MessagePortData::AddToIncomingQueue(std::shared_ptr<Message>)`:
/// a worker_threads message queued on its receiving port (the sender's thread).
pub const PORT_POST: &str = "_ZN4node6worker15MessagePortData18AddToIncomingQueueESt10shared_ptrINS0_7MessageEE";
/// node's `Message::Deserialize(Environment*, Local<Context>, Local<Value>*)`:
/// a queued message about to reach its 'message' handlers (the receiver's loop thread).
pub const PORT_RECEIVE: &str = "_ZN4node6worker7Message11DeserializeEPNS_11EnvironmentEN2v85LocalINS4_7ContextEEEPNS5_INS4_5ValueEEE";
/// nghttp2's `nghttp2_submit_request`: an outgoing HTTP/2 stream.
pub const H2_SUBMIT: &str = "nghttp2_submit_request";
/// node's `Http2Session::OnHeaderCallback`: HTTP/2 request context needs it.
const H2_HEADER: &str = "_ZN4node5http212Http2Session16OnHeaderCallbackEP15nghttp2_sessionPK13nghttp2_frameP13nghttp2_rcbufS8_hPv";

/// libc's epoll wait wrappers (one row each).
const LOOP_WAIT: Probe = Probe {
    image: ImageKind::Libc,
    kind: probe_kind::PROBE_EPOLL_WAIT,
    if_missing: "loop iterations come from the system call tracepoints (every system call on the host pays)",
    only_for: Some(Needed::LoopWaits),
    ..Probe::ROW
};

/// The probes besides the fs submits and the loop phases.
pub const OTHER: &[Probe] = &[
    // One hit per batch of finished jobs where the build allows (its
    // point found: symbols::point::work_batch); else one per job at
    // uv__fs_done and uv__getaddrinfo_done.
    Probe {
        symbol: WORK_BATCH,
        kind: probe_kind::PROBE_WORK_BATCH,
        if_missing: "each finished fs and DNS job is a probe hit of its own (uv__fs_done, uv__getaddrinfo_done)",
        only_for: Some(Needed::Batches),
        ..Probe::ROW
    },
    Probe {
        symbol: "uv__fs_done",
        kind: probe_kind::PROBE_FS_DONE,
        if_missing: "async fs spans end at uv_fs_req_cleanup, after the JS callback ran",
        only_for: Some(Needed::JobDone),
        ..Probe::ROW
    },
    Probe {
        symbol: "uv_fs_req_cleanup",
        kind: probe_kind::PROBE_FS_CLEANUP,
        if_missing: "sync fs calls are not seen to end: no spans for them",
        only_for: Some(Needed::FsEnds),
        ..Probe::ROW
    },
    Probe { symbol: "uv_getaddrinfo", kind: probe_kind::PROBE_DNS_SUBMIT, if_missing: "no DNS spans", ..Probe::ROW },
    Probe {
        symbol: "uv__getaddrinfo_done",
        kind: probe_kind::PROBE_DNS_DONE,
        if_missing: "DNS spans end at uv_freeaddrinfo, after the JS callback ran",
        only_for: Some(Needed::JobDone),
        ..Probe::ROW
    },
    // --detail threadpool
    Probe {
        symbol: "uv__fs_work",
        kind: probe_kind::PROBE_FS_WORK,
        if_missing: "async fs spans have no threadpool queue/run split",
        detail: TP,
        ..Probe::ROW
    },
    Probe {
        symbol: "uv_async_send",
        kind: probe_kind::PROBE_WORK_END,
        if_missing: "threadpool run time is not split from the wait for the loop",
        detail: TP,
        ..Probe::ROW
    },
    Probe {
        symbol: "uv__getaddrinfo_work",
        kind: probe_kind::PROBE_DNS_WORK,
        if_missing: "DNS threadpool start is taken from libc getaddrinfo",
        detail: TP,
        ..Probe::ROW
    },
    // Request context (--requests, on by default): where requests start,
    // where callbacks run, what is written on their behalf.
    // Where requests start: llhttp's message callback, once per HTTP/1
    // message (a request, or the response to an outgoing call), however
    // the bytes came (one read, several messages: pipelined). Exported
    // (.dynsym) by every official build 18-26: stripped copies keep it.
    Probe {
        symbol: HTTP_MESSAGE,
        kind: probe_kind::PROBE_HTTP_MESSAGE,
        if_missing: "no HTTP request spans: fs and DNS spans are not joined to the requests that caused them",
        detail: RQ,
        ..Probe::ROW
    },
    Probe {
        symbol: "uv__stream_io",
        kind: probe_kind::PROBE_STREAM_IO,
        if_missing: "replies on a stream (an outgoing call's response, a database answer) do not keep their request",
        detail: RQ,
        requires: Some(HTTP_MESSAGE),
        ..Probe::ROW
    },
    Probe {
        symbol: "uv_try_write",
        kind: probe_kind::PROBE_STREAM_WRITE,
        cookie: 0, // uv_try_write(stream, bufs, nbufs)
        if_missing: "responses written at once are not seen: no status, the request span ends at its last callback",
        detail: RQ,
        requires: Some(HTTP_MESSAGE),
        ..Probe::ROW
    },
    Probe {
        symbol: "uv_write2",
        kind: probe_kind::PROBE_STREAM_WRITE,
        cookie: 1, // uv_write2(req, stream, bufs, nbufs, send_handle, cb)
        if_missing: "queued writes are not seen: long responses may end early",
        detail: RQ,
        requires: Some(HTTP_MESSAGE),
        ..Probe::ROW
    },
    Probe {
        symbol: "uv_queue_work",
        kind: probe_kind::PROBE_QUEUE_WORK,
        if_missing: "callbacks of other threadpool work (crypto, zlib, addons) are tasks of their own, not their request's",
        detail: RQ,
        requires: Some(HTTP_MESSAGE),
        ..Probe::ROW
    },
    Probe {
        symbol: STREAM_READ,
        kind: probe_kind::PROBE_STREAM_READ,
        if_missing: "outgoing calls of clients that parse HTTP themselves (fetch, undici) have no response status",
        detail: RQ,
        requires: Some(HTTP_MESSAGE),
        ..Probe::ROW
    },
    Probe {
        symbol: "uv__queue_work",
        kind: probe_kind::PROBE_QUEUE_WORK_RUN,
        if_missing: "sync fs calls a threadpool job makes on its thread (node 24+'s fs.readFile) join no request",
        detail: RQ,
        requires: Some("uv_queue_work"),
        ..Probe::ROW
    },
    Probe {
        symbol: "uv_spawn",
        kind: probe_kind::PROBE_SPAWN,
        if_missing: "a child process's exit and output callbacks are tasks of their own, not the request's that spawned it",
        detail: RQ,
        requires: Some(HTTP_MESSAGE),
        ..Probe::ROW
    },
    Probe {
        symbol: PROCESS_EXIT,
        kind: probe_kind::PROBE_PROCESS_EXIT,
        if_missing: "a child process's exit callback runs under the cause of the callback before it",
        detail: RQ,
        requires: Some("uv_spawn"),
        ..Probe::ROW
    },
    Probe {
        symbol: PORT_POST,
        kind: probe_kind::PROBE_PORT_POST,
        if_missing: "worker_threads messages carry no request context: their handlers are tasks of their own",
        detail: RQ,
        requires: Some(HTTP_MESSAGE),
        ..Probe::ROW
    },
    Probe {
        symbol: PORT_RECEIVE,
        kind: probe_kind::PROBE_PORT_RECEIVE,
        if_missing: "worker_threads messages carry no request context: their handlers are tasks of their own",
        detail: RQ,
        requires: Some(PORT_POST),
        ..Probe::ROW
    },
    Probe {
        symbol: "uv_tcp_connect",
        kind: probe_kind::PROBE_STREAM_CONNECT,
        if_missing: "outgoing calls on new connections are not seen: no CLIENT spans for them",
        detail: RQ,
        requires: Some(HTTP_MESSAGE),
        // Node 18-24 start with `cmpl $0xc,0x10(%rsi); mov %rcx,%r8; jne`:
        // the handler reads only the handle (%rsi), which those leave alone.
        args_may_change: true,
        ..Probe::ROW
    },
    Probe {
        symbol: "SSL_write",
        kind: probe_kind::PROBE_TLS_WRITE,
        if_missing: "HTTPS responses have no status (their bytes are encrypted on the socket)",
        detail: RQ,
        requires: Some(HTTP_MESSAGE),
        ..Probe::ROW
    },
    Probe {
        symbol: "_ZN4node11Environment9RunTimersEP10uv_timer_s",
        kind: probe_kind::PROBE_CAUSE_CLEAR,
        cookie: cause_kind::CAUSE_TIMERS.0 as u64,
        if_missing: "work started by JS timers is no task of its own and can be joined to the request whose callback ran just before",
        detail: RQ,
        requires: Some(HTTP_MESSAGE),
        ..Probe::ROW
    },
    // The one call that runs JS immediates (node::Environment::CheckImmediate
    // calls this public node::MakeCallback overload once per batch of
    // immediates; within node, nothing else calls it: native addons do,
    // through napi_make_callback and node::AsyncResource, and their
    // callbacks are then a task too). Node runs its check phase on every
    // loop iteration, immediates or not: CheckImmediate itself would cost a
    // trap per iteration.
    Probe {
        symbol: MAKE_CALLBACK,
        kind: probe_kind::PROBE_CAUSE_CLEAR,
        cookie: cause_kind::CAUSE_IMMEDIATE.0 as u64,
        if_missing: "work started by setImmediate is no task of its own and can be joined to the request whose callback ran just before",
        detail: RQ,
        requires: Some(HTTP_MESSAGE),
        ..Probe::ROW
    },
    // A handle's close callback (the closing-handles phase, after the check
    // phase: a socket's 'close' handlers): a task of its own, not the cause
    // of the callback that ran before it. One hit per closed handle.
    Probe {
        symbol: "_ZN4node10HandleWrap7OnCloseEP11uv_handle_s",
        kind: probe_kind::PROBE_CAUSE_CLEAR,
        cookie: (cause_kind::CAUSE_IO.0 | cause_kind::CAUSE_CLOSE_FLAG.0) as u64,
        if_missing: "work started by a handle's close callback (a socket's 'close' handlers) can be joined to the request whose callback ran just before",
        detail: RQ,
        requires: Some(HTTP_MESSAGE),
        ..Probe::ROW
    },
    // V8's garbage collections: the embedder GC callbacks V8 calls around
    // each one (bpf/gc.h), as Node 20-26 name them. Official 20 and 22
    // export them (.dynsym: a stripped copy keeps them); 24 and 26 have
    // them in .symtab only.
    Probe {
        symbol: GC_PROLOGUE,
        image: ImageKind::V8,
        kind: probe_kind::PROBE_GC,
        cookie: 0,
        if_missing: "V8 10.2's GC points stand in (Node 18), if present",
        ..Probe::ROW
    },
    Probe {
        symbol: GC_EPILOGUE,
        image: ImageKind::V8,
        kind: probe_kind::PROBE_GC,
        cookie: 1,
        if_missing: "V8 10.2's GC points stand in (Node 18), if present",
        ..Probe::ROW
    },
    // HTTP/2 servers (node:http2): a request per stream. node's nghttp2
    // callbacks (static members, their addresses given to nghttp2: never
    // inlined, exported in .dynsym too) and nghttp2 itself.
    Probe {
        symbol: H2_HEADER,
        kind: probe_kind::PROBE_H2_HEADER,
        if_missing: "no HTTP/2 request spans: work of HTTP/2 requests joins no request",
        detail: RQ,
        requires: Some(HTTP_MESSAGE),
        ..Probe::ROW
    },
    Probe {
        symbol: "_ZN4node5http212Http2Session14OnFrameReceiveEP15nghttp2_sessionPK13nghttp2_framePv",
        kind: probe_kind::PROBE_H2_FRAME,
        if_missing: "work of HTTP/2 requests joins no request (their SERVER spans stay)",
        detail: RQ,
        requires: Some(H2_HEADER),
        ..Probe::ROW
    },
    Probe {
        symbol: "_ZN4node5http212Http2Session19OnDataChunkReceivedEP15nghttp2_sessionhiPKhmPv",
        kind: probe_kind::PROBE_H2_DATA,
        if_missing: "work started by an HTTP/2 stream's 'data' handlers (a gRPC call's) joins no request",
        detail: RQ,
        requires: Some(H2_HEADER),
        ..Probe::ROW
    },
    Probe {
        symbol: "nghttp2_submit_response",
        kind: probe_kind::PROBE_H2_RESPONSE,
        if_missing: "HTTP/2 request spans have no status code",
        detail: RQ,
        requires: Some(H2_HEADER),
        ..Probe::ROW
    },
    Probe {
        symbol: "nghttp2_submit_trailer",
        kind: probe_kind::PROBE_H2_RESPONSE,
        if_missing: "gRPC calls have no rpc.response.status_code when it is sent in trailers",
        detail: RQ,
        requires: Some(H2_HEADER),
        ..Probe::ROW
    },
    Probe {
        symbol: "_ZN4node5http212Http2Session13OnStreamCloseEP15nghttp2_sessionijPv",
        kind: probe_kind::PROBE_H2_CLOSE,
        if_missing: "HTTP/2 request spans end after a quiet second, at their last work",
        detail: RQ,
        requires: Some(H2_HEADER),
        ..Probe::ROW
    },
    // HTTP/2 clients: the stream node submits for an outgoing request
    // (node's Http2Session::SubmitRequest calls it in every official build;
    // a session uprobe: the stream id is its return value). Its response
    // comes through the callbacks above.
    Probe {
        symbol: H2_SUBMIT,
        kind: probe_kind::PROBE_H2_SUBMIT,
        if_missing: "no HTTP/2 CLIENT spans (outgoing HTTP/2 streams, gRPC calls); their response handlers' work joins no request",
        detail: RQ,
        requires: Some(H2_HEADER),
        ..Probe::ROW
    },
    // The loop's epoll waits, where the kernel refuses fentry programs on
    // the system calls (see Needed::LoopWaits).
    Probe { symbol: "epoll_wait", ..LOOP_WAIT },
    Probe { symbol: "epoll_pwait", ..LOOP_WAIT },
    // Fallbacks, for builds that only export libuv's public API.
    Probe {
        symbol: "getaddrinfo",
        image: ImageKind::Libc,
        kind: probe_kind::PROBE_DNS_WORK_LIBC,
        if_missing: "DNS spans have no threadpool queue/run split",
        fallback_for: Some("uv__getaddrinfo_work"),
        detail: TP,
        ..Probe::ROW
    },
    Probe {
        symbol: "uv_freeaddrinfo",
        kind: probe_kind::PROBE_DNS_FREE,
        if_missing: "DNS lookups are not seen to end: no DNS spans",
        fallback_for: Some("uv__getaddrinfo_done"),
        ..Probe::ROW
    },
    Probe {
        symbol: "uv_run",
        kind: probe_kind::PROBE_LOOP_RUN,
        if_missing: "no loop iterations",
        fallback_for: Some("uv__io_poll"),
        detail: PH,
        ..Probe::ROW
    },
    // V8 10.2 (Node 18, exported in .dynsym): its two-argument callbacks
    // (weak callbacks; every collection where they are out of line, as in
    // Debian's libnode), and around the collections that inline them the
    // functions just inside: a minor/major collection (its kind known at
    // its end), incremental marking's start. A collection whose callbacks
    // are probed too is recorded once (bpf/gc.h).
    Probe {
        symbol: GC_PROLOGUE_V10,
        image: ImageKind::V8,
        kind: probe_kind::PROBE_GC,
        cookie: 0,
        if_missing: NO_GC,
        fallback_for: Some(GC_PROLOGUE),
        ..Probe::ROW
    },
    Probe {
        symbol: GC_EPILOGUE_V10,
        image: ImageKind::V8,
        kind: probe_kind::PROBE_GC,
        cookie: 1,
        if_missing: NO_GC,
        fallback_for: Some(GC_PROLOGUE),
        ..Probe::ROW
    },
    Probe {
        symbol: GC_PAUSE_START,
        image: ImageKind::V8,
        kind: probe_kind::PROBE_GC,
        cookie: 2,
        if_missing: NO_GC,
        fallback_for: Some(GC_PROLOGUE),
        ..Probe::ROW
    },
    Probe {
        symbol: GC_PAUSE_END,
        image: ImageKind::V8,
        kind: probe_kind::PROBE_GC,
        cookie: 3,
        if_missing: NO_GC,
        fallback_for: Some(GC_PROLOGUE),
        ..Probe::ROW
    },
    Probe {
        symbol: GC_INCREMENTAL_START,
        image: ImageKind::V8,
        kind: probe_kind::PROBE_GC,
        cookie: 4,
        if_missing: NO_GC,
        fallback_for: Some(GC_PROLOGUE),
        ..Probe::ROW
    },
    Probe {
        symbol: GC_INCREMENTAL_END,
        image: ImageKind::V8,
        kind: probe_kind::PROBE_GC,
        cookie: 5,
        if_missing: NO_GC,
        fallback_for: Some(GC_PROLOGUE),
        ..Probe::ROW
    },
];

/// Every probe uvspan knows: fs submits, then [`OTHER`] with the loop
/// phases after the DNS rows (the order `uvspan probes` lists them in).
pub fn all_probes() -> Vec<Probe> {
    let fs = FS_OPS.iter().enumerate().map(|(i, op)| Probe {
        symbol: op.symbol,
        kind: probe_kind::PROBE_FS_SUBMIT,
        cookie: fs_cookie(i, op),
        if_missing: "no spans for this fs operation",
        ..Probe::ROW
    });
    let phases = PHASES.iter().map(|p| Probe {
        symbol: p.symbol,
        kind: probe_kind::PROBE_LOOP_PHASE,
        cookie: u64::from(p.phase.0),
        if_missing: p.if_missing,
        detail: PH,
        ..Probe::ROW
    });
    let (before, after) = OTHER.split_at(OTHER.iter().position(|p| p.fallback_for.is_some()).unwrap_or(OTHER.len()));
    fs.chain(before.iter().copied()).chain(phases).chain(after.iter().copied()).collect()
}

/// Every symbol the catalog looks for in an image (sorted, unique).
pub fn symbols() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = all_probes().iter().map(|p| p.symbol).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Whether a symbol's handler copes with moved probe points changing its
/// argument registers.
pub fn args_may_change(symbol: &str) -> bool {
    all_probes().iter().any(|p| p.symbol == symbol && p.args_may_change)
}

/// The fs operation of a record's op id.
pub fn fs_op(id: u8) -> Option<&'static FsOp> {
    FS_OPS.get(usize::from(id))
}

/// The phase of a phase index (the record's `phases` array order).
pub fn phase(i: usize) -> Option<&'static Phase> {
    PHASES.iter().find(|p| p.phase.0 as usize == i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `enum probe_kind` value in bpf/uvspan.h has a catalog row and a
    /// handler in the BPF side: a `case` in `dispatch()`, or (PROBE_EPOLL_WAIT,
    /// a session uprobe of its own) its own check in the session program.
    /// The BPF side is read from the files its object is compiled from
    /// (bpf/uvspan.bpf.c and every header it includes), wherever they are.
    #[test]
    fn every_probe_kind_has_a_catalog_row_and_a_handler() {
        let sources = crate::kernel::skel::sources::SOURCES;
        let paths: Vec<&str> = sources.iter().map(|(path, _)| *path).collect();
        let (_, header) = sources.iter().find(|(path, _)| path.ends_with("/uvspan.h")).expect("bpf/uvspan.h among the sources");
        let body = &header[header.find("enum probe_kind {").expect("enum probe_kind")..];
        let body = &body[..body.find("};").expect("its end")];
        let kinds: Vec<(&str, u64)> = body
            .lines()
            .filter_map(|l| {
                let (name, value) = l.trim().split_once('=')?;
                let value = value.trim().trim_start_matches(|c: char| c.is_whitespace());
                let digits: String = value.chars().take_while(char::is_ascii_digit).collect();
                Some((name.trim(), digits.parse().ok()?))
            })
            .collect();
        assert!(kinds.len() >= 19, "enum probe_kind parsed: {kinds:?}");
        let defined: Vec<(&str, &str)> =
            sources.iter().filter_map(|(path, text)| Some((*path, &text[text.find("static __always_inline int dispatch(")?..]))).collect();
        let [(at, dispatch)] = defined[..] else {
            panic!("dispatch() is defined {} times in {paths:?}", defined.len());
        };
        let dispatch = &dispatch[..dispatch.find("\n}\n").expect("its end")];
        // Its groups (dispatch_ops, _streams, _h2, _rest), each a function of
        // its own, are defined just before it.
        let src = sources.iter().find(|(p, _)| *p == at).map_or("", |(_, t)| *t);
        let groups = src.find("static __noinline int dispatch_ops(").map_or("", |g| &src[g..]);
        let groups = &groups[..groups.find("static __always_inline int dispatch(").unwrap_or(0)];
        let dispatch = format!("{groups}{dispatch}");
        let rows = all_probes();
        for (name, value) in kinds {
            assert!(rows.iter().any(|p| u64::from(p.kind.0) == value), "{name} has no catalog row");
            let session_check = sources.iter().any(|(_, text)| text.contains(&format!("== {name}")));
            let handled = dispatch.contains(&format!("case {name}:")) || (name == "PROBE_EPOLL_WAIT" && session_check);
            assert!(handled, "{name} has no case in dispatch() ({at})");
        }
    }

    #[test]
    fn work_batch_cookie_fields_read_back_as_the_kernel_reads_them() {
        // bpf/batch.h: batch_field sign-extends bits [shift, shift + bits).
        let field = |c: u64, shift: u32, bits: u32| ((c << (64 - shift - bits)) as i64) >> (64 - bits);
        let at = WorkBatch { delta: 0x58, frame: true, disp: -0x30 };
        let c = work_batch_cookie(0x6d38, Some(0xadc8), at).unwrap();
        let bits = batch::BATCH_FIELD_BITS.0;
        assert_eq!(field(c, 0, bits), 0x6d38);
        assert_eq!(field(c, batch::BATCH_DNS_SHIFT.0, bits), 0xadc8);
        assert_eq!(field(c, batch::BATCH_DISP_SHIFT.0, batch::BATCH_DISP_BITS.0), -0x30);
        assert_eq!((c >> batch::BATCH_FRAME_SHIFT.0) & 1, 1);
        assert!(c < 1 << cookie::COOKIE_ONE_PROCESS_SHIFT.0, "below the tracer's and the handler's bits");
        let back = work_batch_cookie(-0x7000, None, WorkBatch { frame: false, disp: 8, ..at }).unwrap();
        assert_eq!((field(back, 0, bits), field(back, batch::BATCH_DNS_SHIFT.0, bits)), (-0x7000, 0));
        assert_eq!((back >> batch::BATCH_FRAME_SHIFT.0) & 1, 0);
        // too far, or no distance at all: no batch point
        assert_eq!(work_batch_cookie(1 << 19, None, at), None);
        assert_eq!(work_batch_cookie(0, None, at), None);
        assert_eq!(work_batch_cookie(0x100, Some(-(1 << 20)), at), None);
        assert_eq!(work_batch_cookie(0x100, None, WorkBatch { disp: 4096, ..at }), None);
    }

    #[test]
    fn cookie_layout_matches_bpf() {
        // uv_fs_rename(loop, req, path, new_path, cb): cb 4, path 2, path2 3, no fd
        let (i, rename) = FS_OPS.iter().enumerate().find(|(_, o)| o.symbol == "uv_fs_rename").unwrap();
        assert_eq!(fs_cookie(i, rename), i as u64 | 4 << 8 | 2 << 12 | 3 << 16 | 0xF << 20);
        // uv_fs_read(loop, req, file, bufs, nbufs, offset, cb): cb on the stack
        let (i, read) = FS_OPS.iter().enumerate().find(|(_, o)| o.symbol == "uv_fs_read").unwrap();
        assert_eq!(fs_cookie(i, read), i as u64 | 6 << 8 | 0xF << 12 | 0xF << 16 | 2 << 20);
    }

    #[test]
    fn phases_are_in_enum_order_and_their_rows_carry_the_phase() {
        for (i, p) in PHASES.iter().enumerate() {
            assert_eq!(p.phase.0 as usize, i, "{}", p.symbol);
            assert_eq!(phase(i), Some(p));
        }
        assert_eq!(PHASES.len(), crate::kernel::skel::types::uvspan_sizes::UVSPAN_PHASES.0 as usize);
        for p in all_probes().iter().filter(|p| p.kind == probe_kind::PROBE_LOOP_PHASE) {
            assert_eq!(PHASES[p.cookie as usize].symbol, p.symbol);
        }
    }

    #[test]
    fn attach_cookie_carries_the_handler() {
        for p in all_probes() {
            assert_eq!(p.attach_cookie() >> 56, u64::from(p.kind.0));
            assert_eq!(p.attach_cookie() & ((1 << 56) - 1), p.cookie);
        }
    }

    #[test]
    fn symbols_and_spans_are_unique_and_ids_fit() {
        let probes = all_probes();
        assert_eq!(symbols().len(), probes.len());
        assert!(FS_OPS.len() < 256);
        for op in FS_OPS {
            assert_eq!(op.span, op.symbol.replacen("uv_fs_", "fs.", 1));
            assert_eq!(op.op(), op.symbol.replacen("uv_fs_", "", 1));
            assert!(op.cb <= 7 && op.path.is_some() != op.fd.is_some() || op.path.is_none());
        }
    }
}
