//! Ring-buffer records (bytes, laid out by bpf/uvspan.h) to owned Rust values.
//! Pure: no kernel needed, so recorded bytes can be replayed in tests.

use crate::events::sampler::CAUSE_DROP;
use crate::kernel::skel::types::{
    answer_family, dns_event, ev_end, ev_header, ev_kind, fs_event, gc_event, hdr_flags, http_event, http_what, loop_event, loop_split,
    op_event, op_flags, proc_event, stack_event, uvspan_sizes,
};

/// What fs and DNS records share (`struct op_event`): the libuv request,
/// the thread that made it, its times, where it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpRecord {
    pub pid: u32,
    pub tid: u32,
    /// The request's address in the process (pairs it with its submit stack).
    pub req: u64,
    /// --stacks all-ops: the stack that submitted it, innermost first, one frame per line.
    pub stack: Option<String>,
    /// The request that caused it (0: none known), without the sampler's
    /// bit (the kernel keeps it in the cause: see `dropped`).
    pub cause: u64,
    /// The kernel's sampler dropped its trace (`CAUSE_DROP`): sent as a
    /// record only for the tail exceptions (its request may be kept), or
    /// because the kernel's histograms were full.
    pub dropped: bool,
    /// Already counted in the kernel's histograms (`OP_COUNTED`): the
    /// metrics do not count it again.
    pub counted: bool,
    pub sync: bool,
    pub start_ns: u64,
    pub work_start_ns: Option<u64>,
    pub work_end_ns: Option<u64>,
    pub end_ns: u64,
    pub worker_tid: Option<u32>,
    /// Where it was seen to end (see [`ended_at`]).
    pub ended_at: Option<&'static str>,
}

#[cfg(test)]
impl LoopRecord {
    /// An iteration of thread `tid` of `pid` from `start_ns` to `end_ns`, no
    /// wait, phase, split or GC (for the tests of what reads records).
    pub(crate) fn test(pid: u32, tid: u32, start_ns: u64, end_ns: u64) -> LoopRecord {
        LoopRecord {
            pid,
            tid,
            start_ns,
            wake_ns: None,
            end_ns,
            poll_wait_ns: 0,
            skipped: 0,
            phases: vec![],
            stacks: None,
            split: None,
            gc_ns: None,
            gc_count: 0,
            gcs: vec![],
        }
    }
}

#[cfg(test)]
impl OpRecord {
    /// An async operation of `pid` (its loop thread `tid`) from `start_ns` to
    /// `end_ns`, ended by libuv's completion (for the tests of what reads records).
    pub(crate) fn test(pid: u32, tid: u32, start_ns: u64, end_ns: u64) -> OpRecord {
        OpRecord {
            pid,
            tid,
            req: 0,
            stack: None,
            cause: 0,
            dropped: false,
            counted: false,
            sync: false,
            start_ns,
            work_start_ns: None,
            work_end_ns: None,
            end_ns,
            worker_tid: None,
            ended_at: Some("libuv_done"),
        }
    }
}

impl From<&op_event> for OpRecord {
    fn from(e: &op_event) -> OpRecord {
        OpRecord {
            pid: e.hdr.pid,
            tid: e.hdr.tid,
            req: e.req,
            stack: None,
            cause: e.cause & !CAUSE_DROP,
            dropped: e.cause & CAUSE_DROP != 0,
            counted: e.flags & op_flags::OP_COUNTED.0 as u16 != 0,
            sync: e.sync != 0,
            start_ns: e.start_ns,
            work_start_ns: nonzero(e.work_start_ns),
            work_end_ns: nonzero(e.work_end_ns),
            end_ns: e.end_ns,
            worker_tid: (e.worker_tid != 0).then_some(e.worker_tid),
            ended_at: ended_at(e.end_kind),
        }
    }
}

/// A finished fs request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsRecord {
    pub op: OpRecord,
    /// The operation's row in the catalog (`FS_OPS`).
    pub op_id: u8,
    pub result: i64,
    pub fd: Option<i32>,
    pub path: Option<String>,
    pub path2: Option<String>,
}

/// A finished getaddrinfo request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsRecord {
    pub op: OpRecord,
    pub retcode: i32,
    pub host: String,
    pub answers: Vec<std::net::IpAddr>,
}

/// A loop iteration whose busy time crossed the threshold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopRecord {
    pub pid: u32,
    pub tid: u32,
    pub start_ns: u64,
    pub wake_ns: Option<u64>,
    pub end_ns: u64,
    pub poll_wait_ns: u64,
    /// Fast iterations on this thread since the previous record.
    pub skipped: u64,
    /// (phase index, start, end) for the phases seen, in catalog order;
    /// empty when the build has no phase probes (epoll waits only).
    pub phases: Vec<(usize, u64, u64)>,
    /// --stacks: the loop thread's stacks while it was blocked (filled in by
    /// the agent from the samples that came before this record).
    pub stacks: Option<crate::stacks::fold::Blocked>,
    /// Of the busy time, on a CPU and waiting for one (None: not measured
    /// for every busy part, or a record of an older version).
    pub split: Option<LoopSplit>,
    /// Time in V8 garbage collections (nested ones counted once; None: the
    /// process's GC callbacks are not probed).
    pub gc_ns: Option<u64>,
    /// How many collections started in the iteration, as the kernel counted
    /// them (with `gc_ns`; 0 in records of older versions).
    pub gc_count: u64,
    /// The collections that started in the iteration (filled in by the
    /// agent from the GC records that came before this one).
    pub gcs: Vec<GcRecord>,
}

/// What kind of collection (`v8js.gc.type`, as Node's perf_hooks tells them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GcType {
    /// Scavenge or minor mark-sweep (young generation).
    Minor,
    /// Mark-compact (whole heap).
    Major,
    /// An incremental marking step.
    Incremental,
    /// Weak callbacks processed.
    WeakCb,
}

impl GcType {
    /// Of a v8::GCType bit (None: none V8 has).
    pub fn of_bit(bit: u32) -> Option<GcType> {
        match bit {
            1 | 2 => Some(GcType::Minor),
            4 => Some(GcType::Major),
            8 => Some(GcType::Incremental),
            16 => Some(GcType::WeakCb),
            _ => None,
        }
    }

    /// The `v8js.gc.type` value.
    pub fn name(self) -> &'static str {
        match self {
            GcType::Minor => "minor",
            GcType::Major => "major",
            GcType::Incremental => "incremental",
            GcType::WeakCb => "weakcb",
        }
    }
}

/// A V8 garbage collection on a traced thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcRecord {
    pub pid: u32,
    pub tid: u32,
    pub gc_type: GcType,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// The loop thread's scheduler accounting over an iteration's busy parts
/// (bpf/loop.h); the rest of the busy time was off-CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoopSplit {
    pub on_cpu_ns: u64,
    pub runqueue_ns: u64,
    /// The process's cgroup's CFS throttled time over the busy parts (None:
    /// no CFS quota on its cgroup or an ancestor).
    pub throttled_ns: Option<u64>,
}

impl LoopSplit {
    /// The rest of `busy_ns`: sleeping or blocked. The parts are measured at
    /// the same instants as the busy time, so on + off + run queue is the
    /// busy time (on and run queue over it, by a measuring error, leave 0).
    pub fn off_cpu_ns(&self, busy_ns: u64) -> u64 {
        busy_ns.saturating_sub(self.on_cpu_ns.saturating_add(self.runqueue_ns))
    }
}

/// One frame of a sampled stack, as the kernel saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawFrame {
    pub pc: u64,
    /// The word at the frame pointer - 16: a JS frame's JSFunction.
    pub fp_m16: u64,
    /// The word at the frame pointer - 8: context or frame-type marker.
    pub fp_m8: u64,
    /// The first words of the object at `fp_m16`, read at the sample (zeros
    /// when it did not look like a JS frame's function).
    pub obj: [u64; 6],
}

/// A sample of a loop thread's user stack during a slow iteration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackRecord {
    pub pid: u32,
    pub tid: u32,
    /// The iteration's `LoopRecord::start_ns` (0: the stack of an fs/DNS submit).
    pub iter_start_ns: u64,
    /// --stacks all-ops: the request submitted (0: a loop sample).
    pub req: u64,
    pub ts_ns: u64,
    /// Innermost first.
    pub frames: Vec<RawFrame>,
    /// The user stack pointer and frame pointer register at the sample.
    pub sp: u64,
    pub fp: u64,
    /// The user stack from `sp` up, as copied at the sample (empty for a
    /// submit stack or when it could not be read).
    pub stack: Vec<u8>,
}

/// What an HTTP record says (enum http_what in bpf/uvspan.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpWhat {
    /// A request's first bytes reached a server parser: a new cause.
    Request,
    /// A request begun in the bytes of an earlier one on its connection
    /// (pipelined): a new cause; the connection's responses come in order.
    Pipelined,
    /// A response's first bytes reached a client parser.
    Response,
    /// Bytes written while a cause was current.
    Write,
    /// An HTTP/2 server stream's header (a request header, or the
    /// response's `:status`): `data` is `name\0value`. A stream's first
    /// starts its request (a new cause).
    Http2Header,
    /// An HTTP/2 stream is over (`len`: its error code); a client stream's
    /// (`stream` set): its response ended, or it was reset.
    Http2Close,
    /// An outgoing HTTP/2 stream (`stream`) was submitted: `data` is its
    /// request headers uvspan reads, `name\0value` pairs joined by `\0`;
    /// `cause` is its caller's. That stream's response `:status` and
    /// `grpc-status` come as `Http2Header`, its end as `Http2Close`, with
    /// its `stream`.
    Http2Client,
    /// Tail exceptions: a request whose records were sent held is over
    /// for the kernel: `len` 1, they go on (kept, or handed over to user
    /// space, which decides); 0, they are dropped.
    Tail,
    /// A database client connection's bytes the app wrote (one buffer of
    /// a write) or read: `stream` is the connection's wire sequence number
    /// (0 at its first record, which carries the peer). Decoded as
    /// [`Record::Wire`].
    WireWrite,
    WireRead,
}

/// HTTP bytes seen at a parser or written on behalf of a cause.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRecord {
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    /// Without the sampler's bit (see `dropped`).
    pub cause: u64,
    /// The kernel's sampler dropped the request's trace (`CAUSE_DROP`; an
    /// HTTP/2 stream's decision can change at its traceparent header).
    pub dropped: bool,
    /// The stream (or TLS connection) the bytes are on; HTTP/2: the session.
    pub conn: u64,
    /// An outgoing HTTP/2 stream's id (0: a server stream's record, or not
    /// HTTP/2).
    pub stream: i32,
    pub what: HttpWhat,
    /// Bytes in the call (all buffers of a write).
    pub len: u32,
    pub tls: bool,
    /// The connection's peer and local port (requests only, when known).
    pub peer: Option<std::net::SocketAddr>,
    pub local_port: Option<u16>,
    /// The first bytes (request or status line and headers).
    pub data: Vec<u8>,
    /// Writes and wire reads: the thread's callback number (records of
    /// one callback share it; 0: not known).
    pub callback: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// Tail exceptions: a record of an unsampled request the kernel
    /// follows, its bytes kept unread until the request's end says
    /// whether it goes on ([`HttpWhat::Tail`]).
    Held(HeldRecord),
    Fs(FsRecord),
    Dns(DnsRecord),
    Loop(LoopRecord),
    Http(HttpRecord),
    /// A database connection's bytes ([`HttpWhat::WireWrite`],
    /// [`HttpWhat::WireRead`]): the wire stage (`db::live`) makes
    /// [`Record::Db`] of them.
    Wire(HttpRecord),
    /// A database operation, from its connection's bytes.
    Db(Box<crate::db::live::DbRecord>),
    Stack(StackRecord),
    Gc(GcRecord),
    Fork {
        pid: u32,
        ppid: u32,
        ts_ns: u64,
    },
    Exec {
        pid: u32,
        ts_ns: u64,
    },
    /// `fast_iterations`: the main thread's loop iterations under the
    /// threshold since its last reported one. `code`: the kernel's exit
    /// code (the status << 8, or the signal that ended it). `loop_since_ns`:
    /// when its main thread's loop first ran, if it was seen.
    Exit {
        pid: u32,
        fast_iterations: u64,
        ts_ns: u64,
        code: i32,
        loop_since_ns: Option<u64>,
        /// Its main thread's loop time up to the exit, if its loop was seen.
        loop_time: Option<crate::events::loop_time::LoopTime>,
    },
}

impl Record {
    /// The process the record is of (a fork's: the child).
    pub fn pid(&self) -> u32 {
        match self {
            Record::Fs(FsRecord { op, .. }) | Record::Dns(DnsRecord { op, .. }) => op.pid,
            Record::Held(r) => r.pid,
            Record::Loop(r) => r.pid,
            Record::Http(r) | Record::Wire(r) => r.pid,
            Record::Db(r) => r.pid,
            Record::Stack(r) => r.pid,
            Record::Gc(r) => r.pid,
            Record::Fork { pid, .. } | Record::Exec { pid, .. } | Record::Exit { pid, .. } => *pid,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    Short { kind: u32, len: usize },
    UnknownKind(u32),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Short { kind, len } => write!(f, "record of kind {kind} is too short ({len} bytes)"),
            DecodeError::UnknownKind(k) => write!(f, "record of unknown kind {k}"),
        }
    }
}

/// The record of type T in `data`, copied out (ring-buffer records need not
/// be aligned for T). `min` is the shortest valid record: fs records are sent
/// without their second path, whose bytes stay zero.
fn read<T: plain::Plain>(data: &[u8], kind: u32, min: usize) -> Result<T, DecodeError> {
    if data.len() < min {
        return Err(DecodeError::Short { kind, len: data.len() });
    }
    let size = std::mem::size_of::<T>();
    let n = data.len().min(size);
    let mut v = std::mem::MaybeUninit::<T>::uninit();
    // SAFETY: T is Plain (kernel::skel): any bytes make a valid T. Its first
    // n bytes are copied from data (n <= data.len(), n <= size_of::<T>()),
    // the rest are zeroed, so every byte is initialised before assume_init.
    // Only the tail a record was sent without is zeroed (not the whole
    // record and then overwritten: that showed in profiles).
    unsafe {
        let p = v.as_mut_ptr().cast::<u8>();
        std::ptr::copy_nonoverlapping(data.as_ptr(), p, n);
        std::ptr::write_bytes(p.add(n), 0, size - n);
        Ok(v.assume_init())
    }
}

fn nonzero(v: u64) -> Option<u64> {
    (v != 0).then_some(v)
}

/// C string in a fixed array: up to the first NUL, lossy UTF-8, one copy.
fn cstr(buf: &[i8]) -> String {
    // SAFETY: i8 and u8 have the same size and alignment and no padding; the
    // slice is reinterpreted in place for the same length and lifetime.
    let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len()) };
    let bytes = &bytes[..memchr::memchr(0, bytes).unwrap_or(bytes.len())];
    // Checked whole first: std's UTF-8 check has a fast path for ASCII
    // that the lossy decoder's chunking lacks (it showed in profiles).
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// Where an operation was seen to end: where the loop took its result
/// (`libuv_done`: a batch of finished jobs at `uv__work_done`, or one job at
/// `uv__fs_done`, `uv__getaddrinfo_done`), `uv_fs_req_cleanup`,
/// `uv_freeaddrinfo`, `return` (a sync call's uv_fs_* function returned), or
/// `next_libuv_call` (a sync call whose end was not seen).
pub fn ended_at(end_kind: u8) -> Option<&'static str> {
    match u32::from(end_kind) {
        k if k == ev_end::END_DONE.0 => Some("libuv_done"),
        k if k == ev_end::END_CLEANUP.0 => Some("uv_fs_req_cleanup"),
        k if k == ev_end::END_FREE.0 => Some("uv_freeaddrinfo"),
        k if k == ev_end::END_NEXT.0 => Some("next_libuv_call"),
        k if k == ev_end::END_RETURN.0 => Some("return"),
        _ => None,
    }
}

/// A record sent held (`HDR_HELD`): its process, its request's cause
/// (without the sampler's bit) and its bytes, the mark taken off (they
/// decode as the record they are).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldRecord {
    pub pid: u32,
    pub cause: u64,
    pub bytes: Vec<u8>,
}

/// Where fs, DNS and HTTP records keep their cause (after the header and
/// one u64: `op_event.req`, `http_event.ts_ns`).
const CAUSE_AT: usize = 24;
const _: () = assert!(std::mem::offset_of!(op_event, cause) == CAUSE_AT && std::mem::offset_of!(http_event, cause) == CAUSE_AT);

/// One ring-buffer record, by the kind its header says.
pub fn decode(data: &[u8]) -> Result<Record, DecodeError> {
    let hdr: ev_header = read(data, 0, std::mem::size_of::<ev_header>())?;
    if hdr.flags & hdr_flags::HDR_HELD.0 != 0 {
        let cause = data.get(CAUSE_AT..CAUSE_AT + 8).ok_or(DecodeError::Short { kind: hdr.kind.0, len: data.len() })?;
        let mut bytes = data.to_vec();
        let at = std::mem::offset_of!(ev_header, flags);
        bytes[at..at + 4].copy_from_slice(&(hdr.flags & !hdr_flags::HDR_HELD.0).to_ne_bytes());
        return Ok(Record::Held(HeldRecord {
            pid: hdr.pid,
            cause: u64::from_ne_bytes(cause.try_into().unwrap_or([0; 8])) & !CAUSE_DROP,
            bytes,
        }));
    }
    match hdr.kind {
        ev_kind::EV_FS => fs(data).map(Record::Fs),
        ev_kind::EV_DNS => dns(data).map(Record::Dns),
        ev_kind::EV_LOOP => iteration(data).map(Record::Loop),
        ev_kind::EV_STACK => stack(data).map(Record::Stack),
        ev_kind::EV_HTTP => http(data).map(|r| match r.what {
            HttpWhat::WireWrite | HttpWhat::WireRead => Record::Wire(r),
            _ => Record::Http(r),
        }),
        ev_kind::EV_GC => gc(data).map(Record::Gc),
        kind @ (ev_kind::EV_PROC_FORK | ev_kind::EV_PROC_EXEC | ev_kind::EV_PROC_EXIT) => process(data, kind),
        other => Err(DecodeError::UnknownKind(other.0)),
    }
}

fn fs(data: &[u8]) -> Result<FsRecord, DecodeError> {
    // Sent up to the path's end (the rest of the buffer reads as NULs).
    let min = std::mem::offset_of!(fs_event, path);
    let e: fs_event = read(data, ev_kind::EV_FS.0, min)?;
    let path = cstr(&e.path);
    Ok(FsRecord {
        op: OpRecord::from(&e.op),
        op_id: e.op_id,
        result: e.result,
        fd: (e.fd >= 0).then_some(e.fd),
        path: (!path.is_empty()).then_some(path),
        path2: (e.has_path2 != 0 && data.len() >= std::mem::size_of::<fs_event>()).then(|| cstr(&e.path2)),
    })
}

fn dns(data: &[u8]) -> Result<DnsRecord, DecodeError> {
    let e: dns_event = read(data, ev_kind::EV_DNS.0, std::mem::size_of::<dns_event>())?;
    let answers = e.answers[..usize::from(e.n_answers).min(e.answers.len())]
        .iter()
        .filter_map(|a| match u32::from(a.family) {
            f if f == answer_family::FAMILY_INET.0 => Some(std::net::IpAddr::from([a.addr[0], a.addr[1], a.addr[2], a.addr[3]])),
            f if f == answer_family::FAMILY_INET6.0 => Some(std::net::IpAddr::from(a.addr)),
            _ => None,
        })
        .collect();
    Ok(DnsRecord { op: OpRecord::from(&e.op), retcode: e.retcode, host: cstr(&e.host), answers })
}

fn iteration(data: &[u8]) -> Result<LoopRecord, DecodeError> {
    // Records of versions before the split end with the phases (their split reads 0: none).
    let e: loop_event = read(data, ev_kind::EV_LOOP.0, std::mem::offset_of!(loop_event, on_cpu_ns))?;
    let split = (e.split & loop_split::SPLIT_MEASURED.0 != 0).then_some(LoopSplit {
        on_cpu_ns: e.on_cpu_ns,
        runqueue_ns: e.runqueue_ns,
        throttled_ns: (e.split & loop_split::SPLIT_THROTTLE.0 != 0).then_some(e.throttled_ns),
    });
    let phases = e
        .phases
        .iter()
        .enumerate()
        .filter(|(_, p)| e.epoll_only == 0 && p.start_ns != 0 && p.end_ns >= p.start_ns)
        .map(|(i, p)| (i, p.start_ns, p.end_ns))
        .collect();
    Ok(LoopRecord {
        pid: e.hdr.pid,
        tid: e.hdr.tid,
        start_ns: e.start_ns,
        wake_ns: nonzero(e.wake_ns),
        end_ns: e.end_ns,
        poll_wait_ns: e.poll_wait_ns,
        skipped: e.skipped,
        phases,
        stacks: None,
        split,
        gc_ns: (e.split & loop_split::SPLIT_GC.0 != 0).then_some(e.gc_ns),
        gc_count: e.gc_count,
        gcs: Vec::new(),
    })
}

fn gc(data: &[u8]) -> Result<GcRecord, DecodeError> {
    let e: gc_event = read(data, ev_kind::EV_GC.0, std::mem::size_of::<gc_event>())?;
    // A type V8 does not have (never sent) reads as the major one.
    Ok(GcRecord {
        pid: e.hdr.pid,
        tid: e.hdr.tid,
        gc_type: GcType::of_bit(e.gc_type).unwrap_or(GcType::Major),
        start_ns: e.start_ns,
        end_ns: e.end_ns,
    })
}

fn stack(data: &[u8]) -> Result<StackRecord, DecodeError> {
    // A submit stack is sent without the stack copy at the record's end.
    let e: stack_event = read(data, ev_kind::EV_STACK.0, std::mem::offset_of!(stack_event, stack))?;
    let n = (e.n_frames as usize).min(e.frames.len());
    let copied = (e.stack_bytes as usize).min(e.stack.len()).min(data.len().saturating_sub(std::mem::offset_of!(stack_event, stack)));
    Ok(StackRecord {
        pid: e.hdr.pid,
        tid: e.hdr.tid,
        iter_start_ns: e.iter_start_ns,
        req: e.req,
        ts_ns: e.ts_ns,
        frames: e.frames[..n].iter().map(|f| RawFrame { pc: f.pc, fp_m16: f.fp_m16, fp_m8: f.fp_m8, obj: f.obj }).collect(),
        sp: e.sp,
        fp: e.fp,
        stack: e.stack[..copied].to_vec(),
    })
}

fn http(data: &[u8]) -> Result<HttpRecord, DecodeError> {
    let head = std::mem::size_of::<http_event>() - uvspan_sizes::UVSPAN_HTTP_CAPTURE.0 as usize;
    let e: http_event = read(data, ev_kind::EV_HTTP.0, head)?;
    let what = match e.what {
        w if w == http_what::HTTP_REQUEST.0 => HttpWhat::Request,
        w if w == http_what::HTTP_PIPELINED.0 => HttpWhat::Pipelined,
        w if w == http_what::HTTP_RESPONSE.0 => HttpWhat::Response,
        w if w == http_what::HTTP2_HEADER.0 => HttpWhat::Http2Header,
        w if w == http_what::HTTP2_CLOSE.0 => HttpWhat::Http2Close,
        w if w == http_what::HTTP2_CLIENT.0 => HttpWhat::Http2Client,
        w if w == http_what::HTTP_TAIL.0 => HttpWhat::Tail,
        w if w == http_what::HTTP_WIRE_WRITE.0 => HttpWhat::WireWrite,
        w if w == http_what::HTTP_WIRE_READ.0 => HttpWhat::WireRead,
        _ => HttpWhat::Write,
    };
    // The captured bytes, straight from the record (one copy).
    let n = (e.captured as usize).min(e.data.len()).min(data.len().saturating_sub(head));
    let at = std::mem::offset_of!(http_event, data);
    let mut bytes = data.get(at..at + n).map_or_else(Vec::new, <[u8]>::to_vec);
    if what == HttpWhat::Http2Client {
        bytes = h2_client_fields(&bytes);
    } else if what == HttpWhat::Http2Header {
        bytes = h2_field(&bytes);
    }
    Ok(HttpRecord {
        pid: e.hdr.pid,
        tid: e.hdr.tid,
        ts_ns: e.ts_ns,
        cause: e.cause & !CAUSE_DROP,
        dropped: e.cause & CAUSE_DROP != 0,
        conn: e.conn,
        stream: e.stream_id,
        what,
        len: e.len,
        tls: e.tls != 0,
        peer: peer_addr(e.family, &e.peer_addr, e.peer_port),
        local_port: (e.family != 0).then_some(e.local_port),
        data: bytes,
        callback: e.callback,
    })
}

/// An HTTP/2 header record's bytes (the name NUL-padded to
/// UVSPAN_H2_NAME, the value after) as `name\0value`.
fn h2_field(bytes: &[u8]) -> Vec<u8> {
    let slot = uvspan_sizes::UVSPAN_H2_NAME.0 as usize;
    let (name, value) = bytes.split_at(slot.min(bytes.len()));
    let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
    let mut out = Vec::with_capacity(name.len() + 1 + value.len());
    out.extend_from_slice(name);
    out.push(0);
    out.extend_from_slice(value);
    out
}

/// An HTTP2_CLIENT record's slots (enum h2_client_slot: each value
/// NUL-padded at its offset, :path last) as `name\0value` pairs joined by
/// `\0` (values hold no NUL: the kernel's are cut at one), empty ones left
/// out.
fn h2_client_fields(bytes: &[u8]) -> Vec<u8> {
    use crate::kernel::skel::types::h2_client_slot as slot;
    let slots = [
        (":method", slot::H2C_METHOD.0, slot::H2C_SCHEME.0),
        (":scheme", slot::H2C_SCHEME.0, slot::H2C_CONTENT_TYPE.0),
        ("content-type", slot::H2C_CONTENT_TYPE.0, slot::H2C_TRACEPARENT.0),
        ("traceparent", slot::H2C_TRACEPARENT.0, slot::H2C_AUTHORITY.0),
        (":authority", slot::H2C_AUTHORITY.0, slot::H2C_PATH.0),
        (":path", slot::H2C_PATH.0, u32::MAX),
    ];
    let mut out = Vec::with_capacity(bytes.len().min(256));
    for (name, from, to) in slots {
        let (from, to) = (from as usize, (to as usize).min(bytes.len()));
        let Some(v) = bytes.get(from..to) else { continue };
        let v = &v[..v.iter().position(|&b| b == 0).unwrap_or(v.len())];
        if v.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push(0);
        }
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(v);
    }
    out
}

/// A fork, exec or exit record (`kind`).
fn process(data: &[u8], kind: ev_kind) -> Result<Record, DecodeError> {
    // Recordings made before the exit code was sent end at its time.
    let e: proc_event = read(data, kind.0, std::mem::offset_of!(proc_event, exit_code))?;
    let (pid, ts_ns) = (e.hdr.pid, e.ts_ns);
    Ok(match kind {
        ev_kind::EV_PROC_FORK => Record::Fork { pid, ppid: e.ppid, ts_ns },
        ev_kind::EV_PROC_EXEC => Record::Exec { pid, ts_ns },
        _ => Record::Exit {
            pid,
            fast_iterations: u64::from(e.fast_iterations),
            ts_ns,
            code: e.exit_code,
            loop_since_ns: nonzero(e.loop_since_ns),
            loop_time: (e.loop_time.since_ns != 0).then(|| crate::events::loop_time::LoopTime::of(&e.loop_time, ts_ns)),
        },
    })
}

/// A socket address from the kernel's family, address bytes and port.
fn peer_addr(family: u16, addr: &[u8; 16], port: u16) -> Option<std::net::SocketAddr> {
    let ip = match u32::from(family) {
        f if f == answer_family::FAMILY_INET.0 => std::net::IpAddr::from([addr[0], addr[1], addr[2], addr[3]]),
        f if f == answer_family::FAMILY_INET6.0 => std::net::IpAddr::from(*addr),
        _ => return None,
    };
    Some(std::net::SocketAddr::new(ip, port))
}

/// Appends one record to a recording (UVSPAN_RECORD): u32 LE length, bytes.
pub fn write_recorded(out: &mut impl std::io::Write, data: &[u8]) -> std::io::Result<()> {
    out.write_all(&(data.len() as u32).to_le_bytes())?;
    out.write_all(data)
}

/// Splits a recording back into records; a truncated tail is ignored.
pub fn read_recording(mut b: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if b.len() < 4 + n {
            break;
        }
        out.push(&b[4..4 + n]);
        b = &b[4 + n..];
    }
    out
}

/// The bytes of a record as the kernel sends them: `fill` writes the fields
/// into a zeroed, aligned T; the first `len` bytes are returned. For tests
/// and replay tools.
pub fn record_bytes<T: plain::Plain>(len: usize, fill: impl FnOnce(&mut T)) -> Vec<u8> {
    let size = std::mem::size_of::<T>();
    let mut words = vec![0u64; size.div_ceil(8)];
    // SAFETY: u64 has no padding and any bytes are a valid u64, so viewing
    // the words as bytes (to write and to read them) is sound.
    let bytes = unsafe { plain::as_mut_bytes(words.as_mut_slice()) };
    let rec: &mut T = plain::from_mut_bytes(&mut bytes[..size]).expect("u64-aligned buffer of size_of::<T>() bytes");
    fill(rec);
    bytes[..len.min(size)].to_vec()
}

#[cfg(test)]
mod tests;
