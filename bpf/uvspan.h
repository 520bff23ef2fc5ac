/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Records shared by the BPF program (bpf/uvspan.bpf.c) and the Rust side.
 * The Rust types are generated from this file by libbpf-cargo (skeleton
 * `types` module); nothing is copied by hand.
 *
 * Every record in the ring buffer starts with `struct ev_header`.
 * Operations are paired in the kernel: one record per finished operation.
 */
#ifndef UVSPAN_H
#define UVSPAN_H

/* Every constant shared with Rust is an enum: enums reach the generated
 * skeleton through BTF (a #define would not), so there is one source. */

enum uvspan_sizes {
	UVSPAN_PATH_MAX = 256,
	UVSPAN_HOST_MAX = 256,
	UVSPAN_MAX_ANSWERS = 8,
	UVSPAN_PHASES = 5,
	UVSPAN_HTTP_CAPTURE = 1024, /* bytes of an HTTP call kept (request line, headers) */
	UVSPAN_WRITE_BUFS = 8,      /* uv_buf_t entries of a write whose lengths are summed */
	UVSPAN_STACK_FRAMES = 64,   /* frames of a sampled loop-thread stack (--stacks) */
	UVSPAN_FN_WORDS = 6,        /* words of a frame's function object kept with the sample */
	UVSPAN_STACK_SAMPLES_MAX = 20000, /* samples sent per iteration at most (20 s at ~1 kHz) */
	/* Bytes of a loop sample's user stack copied from its stack pointer up:
	 * user space unwinds leaf functions without a frame pointer (libc's)
	 * over them by their .eh_frame. */
	UVSPAN_STACK_COPY = 8192,
	UVSPAN_STACK_CHUNK = 512,   /* ... read in chunks of this many */
	/* The loop-iteration histogram's bucket bounds (busy time, inclusive):
	 * UVSPAN_ITER_BASE_NS doubled UVSPAN_ITER_BOUNDS - 1 times (0.1 ms … 3.3 s). */
	UVSPAN_ITER_BASE_NS = 100000,
	UVSPAN_ITER_BOUNDS = 16,
	UVSPAN_GC_TYPES = 5,        /* v8::GCType bits: scavenge, minor mark-sweep, mark-compact, incremental, weak callbacks */
	UVSPAN_H2_NAME = 64,        /* HTTP/2 header record: the name's bytes (NUL-padded), the value after */
	UVSPAN_HIST_BOUNDS = 16,    /* bucket bounds of a kernel-side operation histogram (op_hist) at most */
	UVSPAN_BATCH = 256,         /* finished threadpool jobs of one uv__work_done whose callbacks' causes are kept */
	UVSPAN_BATCH_WALK = 1024,   /* the most jobs of one uv__work_done ended there (the rest: at their cleanup) */
};

/* The attach cookie: the handler (enum probe_kind) in the top byte; for fs
 * submits, below it the operation id (bits 0..7, the catalog row) and the
 * integer argument positions of the callback, path, second path and fd. */
enum cookie_layout {
	COOKIE_KIND_SHIFT = 56,
	/* Set by the tracer on links attached for one process (a pid filter):
	 * the kernel runs them for that process only, so the traced-set
	 * lookup is skipped. */
	COOKIE_ONE_PROCESS_SHIFT = 55,
	COOKIE_CB_SHIFT = 8,
	COOKIE_PATH_SHIFT = 12,
	COOKIE_PATH2_SHIFT = 16,
	COOKIE_FD_SHIFT = 20,
	COOKIE_NONE = 0xF, /* the operation has no such argument */
};

/* Values of the `traced` map. */
enum traced_flags {
	TRACED = 1,
	TRACED_EPOLL_ONLY = 2, /* no phase probes: epoll waits delimit iterations */
	/* its epoll waits are seen by uprobes on its libc (PROBE_EPOLL_WAIT):
	 * the system call tracepoints leave it alone */
	TRACED_WAITS_BY_UPROBE = 4,
	/* V8's GC callbacks are probed (PROBE_GC): its iterations' GC time is measured */
	TRACED_GC = 8,
};

/* Address families of DNS answers (linux/socket.h). */
enum answer_family {
	FAMILY_INET = 2,
	FAMILY_INET6 = 10,
};

/* libuv's request layout: x86_64, libuv 1.x ABI, measured from DWARF and
 * identical in Node 18-26 (libuv 1.44-1.52) and Debian's libuv 1.44; the
 * build matrix (tests/matrix.rs) checks every build end to end. */
enum libuv_layout {
	FS_RESULT_OFF = 88,     /* offsetof(uv_fs_t, result) */
	FS_PATH_OFF = 104,      /* offsetof(uv_fs_t, path) */
	FS_NEW_PATH_OFF = 272,  /* offsetof(uv_fs_t, new_path) */
	FS_FILE_OFF = 280,      /* offsetof(uv_fs_t, file) */
	FS_WORK_OFF = 336,      /* offsetof(uv_fs_t, work_req) */
	GAI_WORK_OFF = 72,      /* offsetof(uv_getaddrinfo_t, work_req) */
	GAI_ADDRINFO_OFF = 144, /* offsetof(uv_getaddrinfo_t, addrinfo) */
	GAI_RETCODE_OFF = 152,  /* offsetof(uv_getaddrinfo_t, retcode) */
	STREAM_IO_OFF = 136,    /* offsetof(uv_stream_t, io_watcher) */
	STREAM_FD_OFF = 184,    /* offsetof(uv_stream_t, io_watcher.fd) */
};

/* nghttp2's public structs (nghttp2.h, x86_64), statically linked in every
 * official Node build: the same in nghttp2 1.x. */
enum nghttp2_layout {
	H2_FRAME_STREAM_OFF = 8,   /* offsetof(nghttp2_frame_hd, stream_id) */
	H2_FRAME_TYPE_OFF = 12,    /* offsetof(nghttp2_frame_hd, type), then flags */
	H2_HEADERS_CAT_OFF = 56,   /* offsetof(nghttp2_headers, cat) */
	H2_RCBUF_BASE_OFF = 16,    /* offsetof(nghttp2_rcbuf, base), then len */
	H2_NV_SIZE = 40,           /* sizeof(nghttp2_nv): name, value, namelen, valuelen, flags */
	H2_TYPE_DATA = 0,
	H2_TYPE_HEADERS = 1,
	H2_FLAG_END_STREAM = 1,
	H2_HCAT_REQUEST = 0,       /* nghttp2_headers_category: a request's headers */
	H2_HCAT_RESPONSE = 1,      /* a response's headers (a client stream's) */
	H2_HCAT_HEADERS = 3,       /* trailers (or a response's headers after a 1xx); 2 is a pushed response's */
};

enum ev_kind {
	EV_FS = 1,
	EV_DNS = 2,
	EV_LOOP = 3,
	EV_PROC_FORK = 4,
	EV_PROC_EXEC = 5,
	EV_PROC_EXIT = 6,
	EV_HTTP = 7,
	EV_STACK = 8,
	EV_GC = 9,
};

/* Which handler an attach point runs: the top byte of its cookie. */
enum probe_kind {
	PROBE_FS_SUBMIT = 1, /* uv_fs_* entry; low bits: see fs_submit */
	PROBE_FS_WORK = 2,
	PROBE_FS_DONE = 3,
	PROBE_FS_CLEANUP = 4,
	PROBE_WORK_END = 5,
	PROBE_DNS_SUBMIT = 6,
	PROBE_DNS_WORK = 7,
	PROBE_DNS_DONE = 8,
	PROBE_LOOP_PHASE = 9, /* low byte: enum loop_phase */
	/* fallbacks for builds without libuv's internal symbols */
	PROBE_DNS_WORK_LIBC = 10, /* libc getaddrinfo on a pool thread */
	PROBE_DNS_FREE = 11,      /* uv_freeaddrinfo: DNS completion */
	PROBE_LOOP_RUN = 12,      /* uv_run: epoll waits delimit iterations */
	/* request context (--requests) */
	PROBE_STREAM_IO = 14,     /* uv__stream_io: a stream's callback is about to run */
	PROBE_STREAM_WRITE = 15,  /* uv_try_write / uv_write2; low bits: see stream_write */
	PROBE_TLS_WRITE = 16,     /* SSL_write: plaintext of a TLS write */
	PROBE_CAUSE_CLEAR = 17,   /* node's timers / immediates run: a task (cookie: enum cause_kind) */
	PROBE_STREAM_CONNECT = 18, /* uv_tcp_connect: the stream's callbacks belong to the connecting cause */
	/* libc's epoll_wait / epoll_pwait, session uprobe: the loop's waits
	 * where the kernel refuses fentry; low bit: the timeout is a struct
	 * timespec pointer (epoll_pwait2), not milliseconds */
	PROBE_EPOLL_WAIT = 19,
	/* V8's garbage collections start / end (gc.h). Cookie 0 / 1:
	 * Heap::CallGCPrologueCallbacks / CallGCEpilogueCallbacks (the GCType
	 * is argument 2); V8 10.2 (Node 18), where those are inlined:
	 * 2 / 3 Heap::GarbageCollectionPrologue / GarbageCollectionEpilogue
	 * (a minor or major collection; its GarbageCollector is argument 2 of
	 * the epilogue), 4 / 5 Heap::InvokeIncrementalMarkingPrologueCallbacks
	 * / InvokeIncrementalMarkingEpilogueCallbacks (incremental marking) */
	PROBE_GC = 20,
	/* HTTP/2 server streams (node's nghttp2 callbacks; request context) */
	PROBE_H2_HEADER = 21,   /* Http2Session::OnHeaderCallback: a request header of a stream */
	PROBE_H2_FRAME = 22,    /* Http2Session::OnFrameReceive: a stream's handlers run (session uprobe: its cause restored at the return) */
	PROBE_H2_RESPONSE = 23, /* nghttp2_submit_response / _trailer: a stream's :status, grpc-status */
	PROBE_H2_CLOSE = 24,    /* Http2Session::OnStreamClose: a stream is over (session uprobe: a client stream's cause current while its close handlers run) */
	PROBE_H2_DATA = 25,     /* Http2Session::OnDataChunkReceived: its 'data' handlers run (session uprobe, as PROBE_H2_FRAME) */
	PROBE_HTTP_MESSAGE = 26, /* llhttp__on_message_begin: a message starts in a parser's bytes (a request: a new cause; a response: an outgoing call's) */
	PROBE_H2_SUBMIT = 27,   /* nghttp2_submit_request: an outgoing HTTP/2 stream (session uprobe: its id is the return value) */
	PROBE_WORK_BATCH = 28,  /* uv__work_done has taken the loop's finished threadpool jobs (cookie: see work_batch_layout) */
	PROBE_QUEUE_WORK = 29,  /* uv_queue_work: a threadpool job (crypto, zlib, an addon's) queued under a cause */
	PROBE_PORT_POST = 30,   /* MessagePortData::AddToIncomingQueue: a worker_threads message posted under a cause */
	PROBE_PORT_RECEIVE = 31, /* Message::Deserialize: a message about to reach its handlers (its cause current) */
	PROBE_STREAM_READ = 32, /* LibuvStreamWrap::OnUvRead: bytes a stream read (a response head for a client whose parser is not node's: fetch, undici) */
	PROBE_SPAWN = 33,       /* uv_spawn: a child process (its exit and pipes) under a cause */
	PROBE_PROCESS_EXIT = 34, /* ProcessWrap::OnExit: a child's exit handlers run (its spawner's cause) */
	PROBE_QUEUE_WORK_RUN = 35, /* uv__queue_work: a uv_queue_work job's work runs on a threadpool thread (its cause current there) */
};

/* PROBE_WORK_BATCH's cookie: where uv__fs_done and uv__getaddrinfo_done are
 * (signed byte distances from the probe point: bits 0..19 and 20..39; 0:
 * not known), and where the stack queue of jobs is (its head at %rbp, bit
 * 52 set, or %rsp, plus a signed displacement in bits 40..51). */
enum work_batch_layout {
	BATCH_DNS_SHIFT = 20,
	BATCH_DISP_SHIFT = 40,
	BATCH_FRAME_SHIFT = 52,
	BATCH_FIELD_BITS = 20,
	BATCH_DISP_BITS = 12,
	WORK_WQ_OFF = 24, /* offsetof(struct uv__work, wq): work, done, loop before it */
	WORK_REQ_OFF = 88, /* offsetof(uv_work_t, work_req): UV_REQ_FIELDS (64), loop, work_cb, after_work_cb */
};

/* What an HTTP record says. */
enum http_what {
	HTTP_REQUEST = 1,  /* a request's first bytes reached a server parser: a new cause */
	HTTP_RESPONSE = 2, /* a response's first bytes reached a client parser */
	HTTP_WRITE = 3,    /* bytes written while a cause was current */
	/* An HTTP/2 server stream's header (a request header, or the response's
	 * :status or grpc-status, in its headers or trailers): its name in data[0, UVSPAN_H2_NAME), NUL-padded, its value
	 * after; `len` is the value's length. The first of a stream's records
	 * starts its request (a new cause) and carries the peer. */
	HTTP2_HEADER = 4,
	HTTP2_CLOSE = 5,   /* an HTTP/2 stream is over (`len`: its error code) */
	HTTP_PIPELINED = 6, /* a request begun in the bytes of an earlier one (pipelined, one read): a new cause; the connection's responses come in its order */
	/* An outgoing HTTP/2 stream (a client's) is submitted: its request
	 * headers in data's slots (enum h2_client_slot); `cause` is the
	 * caller's, `stream_id` the stream's. That stream's response :status
	 * and grpc-status come as HTTP2_HEADER, its end (the response's
	 * END_STREAM, or a reset) as HTTP2_CLOSE, both with its `stream_id` (a
	 * server stream's records have none, 0). */
	HTTP2_CLIENT = 7,
	/* Tail exceptions: a followed request whose records were sent held
	 * (HDR_HELD) is over for the kernel: `len` 1, they go on (kept, or
	 * handed over: user space decides); 0, they are dropped. */
	HTTP_TAIL = 8,
	/* A database client connection's bytes (enum wire_state: WIRE_DB), as
	 * the app wrote them (one record per buffer of a write) or read them:
	 * `stream_id` is the connection's wire sequence number (from 0 at its
	 * first), the first record carries the peer. `len` is what the
	 * operation moved, `captured` the bytes in data. */
	HTTP_WIRE_WRITE = 9,
	HTTP_WIRE_READ = 10,
};

/* A client connection's protocol (struct stream_owner's `wire`), decided
 * from the first bytes it is written. */
enum wire_state {
	WIRE_UNDECIDED = 0,
	WIRE_DB = 1,    /* a database's (PostgreSQL, MySQL, Redis, MongoDB): its bytes sent up */
	WIRE_OTHER = 2, /* HTTP, TLS, anything else: not sent up */
};

/* An HTTP2_CLIENT record's data: each request header uvspan reads in a
 * slot of its own at a fixed offset, its value NUL-padded (cut to the
 * slot's size less one); :path last, the record's bytes end with it. */
enum h2_client_slot {
	H2C_METHOD = 0,         /* :method, 16 bytes */
	H2C_SCHEME = 16,        /* :scheme, 16 */
	H2C_CONTENT_TYPE = 32,  /* content-type, 64 */
	H2C_TRACEPARENT = 96,   /* traceparent, 64 */
	H2C_AUTHORITY = 160,    /* :authority, 128 */
	H2C_PATH = 288,         /* :path, to the end of data */
};

/* What caused an operation: the bits of a cause under its time (a cause is
 * ktime << 8 | kind << CAUSE_KIND_SHIFT | CPU). A request (HTTP) starts a
 * trace of its own; a task is a callback no request caused that started
 * traced work: a batch of JS timers, of immediates, a socket's I/O callback
 * (a queue consumer, a database reply). */
enum cause_kind {
	CAUSE_REQUEST = 0,
	CAUSE_TIMERS = 1,
	CAUSE_IMMEDIATE = 2,
	CAUSE_IO = 3,
	CAUSE_KIND_SHIFT = 5,
	CAUSE_KIND_MASK = 3,
	CAUSE_CPU_MASK = 0x1F,
	/* The trace sampler, decided in the kernel (ksample_*, common.h): the
	 * cause's trace is not sampled; its fs and DNS work updates the
	 * kernel's histograms (op_hist) and sends no record. */
	CAUSE_DROP = 0x80,
	/* PROBE_CAUSE_CLEAR's cookie: a handle closes (its first argument):
	 * what uvspan kept of it goes (a stream's causes) */
	CAUSE_CLOSE_FLAG = 0x100,
};

/* An HTTP/2 server stream under the kernel's sampler (struct h2_stream's
 * state, bpf/maps.h). */
enum h2_state {
	H2_PENDING = 1,  /* its request headers saved, not sent: decided at its HEADERS frame's end */
	H2_FOLLOWED = 2, /* not sampled: no record; its duration counted in op_hist at its close */
};

/* ev_header.flags */
enum hdr_flags {
	/* tail exceptions: a record of an unsampled request the kernel
	 * follows, for user space to hold (not read) until the request's
	 * HTTP_TAIL record says whether it goes on or is dropped */
	HDR_HELD = 1,
};

/* op_event.flags */
enum op_flags {
	/* of an unsampled request, already counted in op_hist: sent (held
	 * for its request's tail exceptions) for its span only */
	OP_COUNTED = 1,
};

/* Where an operation was seen to finish. */
enum ev_end {
	END_DONE = 1,    /* libuv completion function (uv__fs_done / uv__getaddrinfo_done) */
	END_CLEANUP = 2, /* uv_fs_req_cleanup: sync calls, or builds without uv__fs_done */
	END_FREE = 3,    /* uv_freeaddrinfo: builds without uv__getaddrinfo_done */
	END_NEXT = 4,    /* sync call with no cleanup: the thread's next libuv call */
	END_RETURN = 5,  /* sync call: the return of its uv_fs_* function (session uprobe) */
};

/* Loop phases, in the order an iteration (poll entry to next poll entry) sees them. */
enum loop_phase {
	PHASE_POLL = 0,
	PHASE_CHECK = 1,
	PHASE_TIMERS = 2,
	PHASE_IDLE = 3,
	PHASE_PREPARE = 4,
};

/* What a loop record's split says (loop_event.split, bits). */
enum loop_split {
	/* on_cpu_ns and runqueue_ns cover every busy part of the iteration
	 * (none of its epoll waits' ends was missed) */
	SPLIT_MEASURED = 1,
	/* the process's cgroup (or the nearest ancestor with one) has a CFS
	 * quota: throttled_ns is its throttled time over the busy parts */
	SPLIT_THROTTLE = 2,
	/* V8's GC callbacks are probed in the process: gc_ns is its GC time */
	SPLIT_GC = 4,
};

/* Counters in the `stats` per-CPU array. */
enum stat_idx {
	STAT_RINGBUF_LOST = 0,      /* records dropped: ring buffer full */
	STAT_LOOP_ITERATIONS = 1,   /* iterations completed */
	STAT_LOOP_EMITTED = 2,      /* iterations over threshold, sent */
	STAT_INFLIGHT_REPLACED = 3, /* a request started again before its end was seen */
	STAT_SCRATCH_MISS = 4,      /* per-CPU scratch unavailable (never expected) */
	STAT_INFLIGHT_FULL = 5,     /* an async request not tracked: in-flight table full */
	STAT_STRADDLED = 6,         /* --sample-time: an operation crossed a window edge, dropped */
	STAT_STACK_SAMPLES = 7,     /* loop-thread stacks sampled during slow iterations */
	STAT_HIST_FULL = 8,         /* an unsampled operation not counted in op_hist (full): lost to the metrics */
	STAT_UNSAMPLED_OPS = 9,     /* operations of unsampled traces counted in op_hist, no record sent */
	STAT_UNSAMPLED_REQS = 10,   /* unsampled HTTP requests the kernel followed to their end and counted in op_hist */
	STAT_H2_UNSENT = 11,        /* HTTP/2: kept request headers of a stream dropped as a root, then sampled, past the H2_SAVED it saved: not sent */
	STAT_OPS_UNFINISHED = 12,   /* requests in a thread's slots when it exited (ops_local) */
	STAT_BATCH_CUT = 13,        /* a batch of finished threadpool jobs longer than UVSPAN_BATCH_WALK: the rest not ended (spans lost) */
	STAT_MIXED_READS = 14,      /* a client connection read while two causes waited for replies there: a task of its own */
	STAT_AFTER_ANSWER = 15,     /* a client connection's reply read after the request that wrote there answered: a task of its own */
	STAT_MAX = 16,
};

/* What an op_hist entry counts: the operations of one process, family and
 * attribute set (the metrics' attributes, bounded). */
enum hist_family {
	HIST_FS = 0,
	HIST_DNS = 1,
	HIST_QUEUE = 2, /* a threadpool job's wait in the queue; op_id: HIST_FS or HIST_DNS */
	HIST_HTTP = 3,  /* an HTTP server request followed in the kernel (http_follow.h, h2.h) */
	HIST_FAMILIES = 4,
};

struct op_hist_key {
	unsigned int pid;
	unsigned char family; /* enum hist_family */
	unsigned char op_id;  /* fs: the catalog operation id; HTTP: the method (enum http_method) */
	unsigned char sync;   /* HTTP: TLS (HTTP/1: its response went through SSL_write; HTTP/2: its :scheme) */
	unsigned char ver;    /* HTTP: the request's minor version (HTTP/1.ver), or 2 (HTTP/2) */
	int err;              /* fs: the negative errno, DNS: the UV_EAI_* code; 0: success; HTTP: the status (0: none) */
	unsigned int _pad2;
};

/* The methods a request line starts with (is_request), in the order of
 * src/kernel/tracer.rs (HTTP_METHODS). */
enum http_method {
	METHOD_GET = 0,
	METHOD_POST = 1,
	METHOD_PUT = 2,
	METHOD_HEAD = 3,
	METHOD_DELETE = 4,
	METHOD_PATCH = 5,
	METHOD_OPTIONS = 6,
	METHOD_CONNECT = 7,
	METHOD_TRACE = 8,
	METHOD_OTHER = 9, /* HTTP/2: a :method not listed (user space: _OTHER) */
};

/* An unsampled HTTP/1 request the kernel follows to its end without a
 * record (http_follow.h), keyed by (process, cause). */
struct http_req {
	unsigned long long start_ns;
	unsigned long long last_ns;  /* its last write (start_ns: none yet) */
	unsigned long long stream;   /* the connection it was read on */
	unsigned long long conn;     /* where its response's head was written (0: not yet) */
	unsigned long long expect;   /* its response's bytes: head and Content-Length */
	unsigned long long written;  /* bytes written on conn so far */
	unsigned short status;       /* 0: no response head yet */
	unsigned char method;        /* enum http_method */
	unsigned char ver;           /* HTTP/1.ver */
	unsigned char tls;
	unsigned char pipelined;     /* a request was pipelined behind it: what is written after it is that one's */
	unsigned char held;          /* tail exceptions: records of it were sent held (HDR_HELD) */
	unsigned char _pad;
};



/* Durations of the operations of unsampled traces, which send no record:
 * buckets by the bounds user space wrote (hist_bounds_ns), their count and
 * sum. Per CPU; user space adds the CPUs' and the records' counts. */
struct op_hist {
	unsigned long long count;
	unsigned long long sum_ns;
	unsigned long long buckets[UVSPAN_HIST_BOUNDS + 1];
};

struct ev_header {
	enum ev_kind kind;
	unsigned int pid;  /* tgid */
	unsigned int tid;  /* thread that started the operation */
	unsigned int flags; /* enum hdr_flags */
};

/* What an fs and a DNS record start with: the libuv request, the thread
 * that made it, its times, where it ended. */
struct op_event {
	struct ev_header hdr;
	unsigned long long req;   /* the request's address in the process */
	unsigned long long cause; /* the request that caused it (0: none known) */
	unsigned long long start_ns;
	unsigned long long work_start_ns; /* 0 = not seen (sync call, or stripped build) */
	unsigned long long work_end_ns;
	unsigned long long end_ns;
	unsigned int worker_tid; /* the threadpool thread that ran it (0: none seen) */
	unsigned char sync;
	unsigned char end_kind; /* enum ev_end */
	unsigned short flags;   /* enum op_flags */
};

struct fs_event {
	struct op_event op;
	long long result; /* req->result: >= 0 success value, < 0 negative errno */
	int fd;           /* -1 when the operation takes no fd */
	unsigned short path_len; /* bytes of path with its NUL (0: none; at most UVSPAN_PATH_MAX) */
	unsigned char op_id;     /* catalog operation id */
	unsigned char has_path2;
	/* path, then second path (rename/link/symlink/copyfile): without
	 * path2 (has_path2 == 0) the record is sent up to the path's NUL, in
	 * whole 8-byte words. */
	char path[UVSPAN_PATH_MAX];
	char path2[UVSPAN_PATH_MAX];
};

struct dns_answer {
	unsigned short family; /* AF_INET / AF_INET6 */
	unsigned char addr[16];
};

struct dns_event {
	struct op_event op;
	int retcode; /* req->retcode: 0 or a UV_EAI_* code */
	unsigned char n_answers;
	unsigned char _pad[3];
	struct dns_answer answers[UVSPAN_MAX_ANSWERS];
	char host[UVSPAN_HOST_MAX];
};

struct phase_span {
	unsigned long long start_ns; /* 0 = phase not seen in this iteration */
	unsigned long long end_ns;
};

/* A loop thread's time since uvspan first saw it: all of it, and the part
 * blocked in epoll waits (idle), as Node's event-loop utilization counts
 * it; and of its busy parts already ended (busy_ns), the time on a CPU and
 * runnable waiting for one (the rest was off-CPU). Kept in its `loops`
 * entry; user space reads it from there. */
struct loop_time {
	__u64 since_ns;
	__u64 idle_ns;
	__u64 busy_ns;
	__u64 on_cpu_ns;
	__u64 runqueue_ns;
	/* Every finished iteration's busy time (its time less its epoll waits),
	 * counted in buckets of UVSPAN_ITER_BOUNDS bounds, and their sum. */
	__u64 iterations;
	__u64 iter_busy_ns;
	__u64 iter_buckets[UVSPAN_ITER_BOUNDS + 1];
};

struct loop_event {
	struct ev_header hdr;
	unsigned long long start_ns;      /* uv__io_poll entry */
	unsigned long long wake_ns;       /* an epoll wait returned events, or the last one timed out (0 = none seen) */
	unsigned long long end_ns;        /* next uv__io_poll entry */
	unsigned long long poll_wait_ns;  /* time blocked in epoll during the poll phase */
	unsigned long long skipped;       /* fast iterations on this thread since the last record */
	unsigned int epoll_only;          /* no phase probes: bounds from epoll waits, no phases */
	unsigned int split;               /* enum loop_split bits (0: no split, as in records of older versions) */
	struct phase_span phases[UVSPAN_PHASES];
	/* The split of the busy time (outside epoll waits), from the loop
	 * thread's scheduler accounting (loop.h); the rest was off-CPU. */
	unsigned long long on_cpu_ns;
	unsigned long long runqueue_ns;
	unsigned long long throttled_ns;  /* SPLIT_THROTTLE: its cgroup's, see loop_split */
	/* SPLIT_GC: time in V8 garbage collections on the loop thread (nested
	 * ones counted once), a part of the busy time (gc.h) */
	unsigned long long gc_ns;
	unsigned long long gc_count; /* SPLIT_GC: the collections that started in the iteration */
};

/* A V8 garbage collection on a traced thread, from its prologue to its
 * epilogue callbacks (gc.h). Sent for every one (metrics count them all). */
struct gc_event {
	struct ev_header hdr;
	unsigned long long start_ns;
	unsigned long long end_ns;
	unsigned int gc_type;     /* the v8::GCType bit */
	unsigned int _pad;
};

/* HTTP bytes seen at a parser or written, with the cause they belong to. */
struct http_event {
	struct ev_header hdr;
	unsigned long long ts_ns;
	unsigned long long cause;
	unsigned long long conn;  /* the stream (or TLS connection) the bytes are on; HTTP/2: the nghttp2 session */
	unsigned int what;        /* enum http_what */
	unsigned int len;         /* bytes in the call (all buffers of a write) */
	unsigned int captured;    /* bytes in data */
	unsigned short family;    /* HTTP_REQUEST: the connection's address family, 0 = unknown */
	unsigned short peer_port;
	unsigned short local_port;
	unsigned char tls;
	unsigned char _pad;
	int stream_id;            /* HTTP/2 client streams' records: the stream (0: none); wire records: the sequence number */
	/* HTTP_WRITE, wire records: the thread's callback number (struct
	 * thread_ctx's `callbacks`): records of one callback share it */
	unsigned int callback;
	unsigned int _pad2;
	unsigned char peer_addr[16];
	char data[UVSPAN_HTTP_CAPTURE];
};

/* --stacks: one frame of a sampled stack. The words around the frame
 * pointer are kept as they are; user space reads V8's frame layout from the
 * node binary's postmortem metadata (v8dbg_off_fp_function is -16 in every
 * V8 since 2017, v8dbg_off_fp_context_or_frame_type -8). */
struct stack_frame {
	unsigned long long pc;       /* the frame's instruction pointer (a return address above frame 0) */
	unsigned long long fp_m16;   /* word at fp - 16: a JS frame's JSFunction */
	unsigned long long fp_m8;    /* word at fp - 8: context, or a typed frame's marker */
	/* When fp_m16 looks like a heap object: its first words, read at the
	 * sample (map, ..., the JSFunction's `shared` at word 3 or 4). A young
	 * JSFunction moves at the next scavenge; its SharedFunctionInfo and map
	 * live in old space, so naming can wait for user space. */
	unsigned long long obj[UVSPAN_FN_WORDS];
};

/* A sample of the loop thread's user stack, taken while the current
 * iteration had already been busy for at least the loop threshold. Sent
 * before the iteration's loop_event (same ring buffer, same CPU order). */
struct stack_event {
	struct ev_header hdr;
	unsigned long long iter_start_ns; /* the iteration's loop_event.start_ns */
	unsigned long long ts_ns;
	unsigned long long sp;            /* user stack pointer at the sample */
	unsigned long long req;           /* --stacks all-ops: the fs/DNS request submitted (0: a loop sample) */
	unsigned long long fp;            /* user frame pointer register (rbp) at the sample */
	unsigned int n_frames;
	unsigned int stack_bytes;         /* bytes of `stack` copied (0: none; a submit stack is sent without) */
	struct stack_frame frames[UVSPAN_STACK_FRAMES];
	/* The user stack from `sp` up (loop samples only: a submit stack's
	 * record ends before it). */
	unsigned char stack[UVSPAN_STACK_COPY];
};

struct proc_event {
	struct ev_header hdr;
	unsigned int ppid;
	unsigned int fast_iterations; /* exit: the main thread's fast loop iterations since its last record */
	unsigned long long ts_ns;
	int exit_code; /* exit: the task's exit_code (status << 8, or the signal) */
	unsigned int _pad;
	unsigned long long loop_since_ns; /* exit: when its main thread's loop first ran (0: never seen) */
	struct loop_time loop_time; /* exit: its main thread's loop time up to the exit (since_ns 0: none) */
};

#endif /* UVSPAN_H */
