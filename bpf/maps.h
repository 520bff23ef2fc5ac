/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Every map of the BPF side and what its entries hold: the state the
 * programs keep between probes (per request, per thread, per loop thread,
 * per connection), the ring buffer, the counters and per-CPU scratch space.
 * One place because several families share them (a threadpool job's end
 * touches fs and DNS requests; the stack sampler reads the loop's state) and
 * user space reads and cleans some of them by name (src/kernel/tracer.rs).
 */
#ifndef UVSPAN_MAPS_H
#define UVSPAN_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "uvspan.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 * 1024 * 1024);
} events SEC(".maps");

/* Processes being traced (tgid -> flags: TRACED_*). Every program checks it first. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} traced SEC(".maps");

/* Benchmark only (count_hits): uprobe hits by attach cookie (without
 * COOKIE_ONE_PROCESS; a session probe's returns with HIT_RETURN set). */
#define HIT_RETURN (1ULL << 54)
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 512);
	__type(key, __u64);
	__type(value, __u64);
} hit_counts SEC(".maps");

/* Benchmark only (UVSPAN_BENCH_TIME_HITS=1): the time inside uvspan's
 * program at each attach point, measured by two programs on the same
 * points that the kernel runs just before it and just after it
 * (bench_enter, bench_leave in uvspan.bpf.c). */
struct hit_stamp {
	__u64 cookie;
	__u64 ts;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct hit_stamp);
} hit_stamps SEC(".maps");

/* By attach cookie as hit_counts: hits timed, their ns, and hits not
 * timed (`unordered`: no stamp of the same point before it, the kernel
 * ran the programs in another order; `outliers`: over 1 ms, the thread
 * was preempted in between). */
struct hit_time {
	__u64 n;
	__u64 ns;
	__u64 unordered;
	__u64 outliers;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 512);
	__type(key, __u64);
	__type(value, struct hit_time);
} hit_times SEC(".maps");

struct req_key {
	__u32 pid;
	__u32 _pad;
	__u64 req;
};

/* An async fs request between submit and completion (what the request
 * itself no longer says by then). */
struct fs_async {
	__u64 start_ns;
	__u64 cause;
	__u64 work_start_ns; /* --detail threadpool */
	__u64 work_end_ns;
	__u32 tid;
	__u32 worker_tid;
	__u8 op_id;
	__u8 has_path;
	__u8 has_path2;
	__u8 has_fd;
	__u32 _pad;
};

/* A plain (preallocated) hash, not LRU: cheaper per operation. Entries of
 * processes that exit are removed by user space; a full table counts the
 * spans it cannot hold as lost. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct req_key);
	__type(value, struct fs_async);
} inflight_fs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct req_key);
	__type(value, struct dns_event);
} inflight_dns SEC(".maps");

/* Threadpool thread -> the job it is running (so uv_async_send can end it). */
struct worker_job {
	struct req_key key;
	__u32 kind; /* EV_FS or EV_DNS */
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct worker_job);
} worker_jobs SEC(".maps");

/* Per thread: its sync fs call in progress (req != 0). Some Node code
 * (ReadFileUtf8: module loading, readFileSync(path, 'utf8')) reuses one
 * request for several sync calls without uv_fs_req_cleanup between them;
 * the thread's next libuv call (or loop poll) ends it then, since a sync
 * call has returned by the time its thread does anything else. */
struct sync_slot {
	__u64 req;
	__u64 gen; /* window_gen at its start (--sample-time) */
	struct fs_event ev;
};

/* Per thread: the request (cause) whose callback runs now, and the stream
 * whose I/O callback runs (request context, --requests). */
struct thread_ctx {
	__u64 cause;
	__u64 stream;
	/* callbacks begun on this thread (uv__stream_io, a task's start): two
	 * requests a parser begins in the same one were pipelined */
	__u64 callbacks;
	/* a task's HTTPS call was just written (SSL_write): the thread's next
	 * socket write is its ciphertext, sent up for its socket */
	__u64 tls_call;
	/* where the response head a client stream's read reported starts (its
	 * parser's begin there is not reported again: http_message) */
	__u64 read_head;
	/* the thread's stream's reads are sent up as wire records (its
	 * protocol is a database's, or not decided and its server may speak
	 * first: http.h stream_io) */
	__u64 wire;
	/* --publish-trace-context: the cause whose ids traces_ctx_v1 holds
	 * for this thread (0: none), and whether ctx_threads has the thread */
	__u64 published;
	__u64 ctx_noted;
	/* the batch walk runs (batch.h): each job's end puts its cause, the
	 * batch's is published once at its end */
	__u64 walking;
};

/* Per thread: the V8 garbage collections in progress (gc.h): when each
 * type's started, and the outermost one's start (they can nest: weak
 * callbacks inside a forced mark-compact). */
struct gc_state {
	__u64 start[UVSPAN_GC_TYPES]; /* 0: none of that type in progress */
	__u64 outer_start;
	/* V8 10.2's points (gc.h cookies 2-5): a minor/major collection and an
	 * incremental marking start in progress */
	__u64 pause_start;
	__u64 incremental_start;
	__u32 depth;
	__u32 _pad;
};

/* An async fs request kept with the thread that submitted it (ops_local):
 * libuv completes a request on the loop thread that submitted it. */
struct fs_slot {
	__u64 req; /* 0: free */
	struct fs_async a;
};

/* Slots per thread: two-way (a request's pair, see slot_at), ~2 KiB.
 * A request that finds both taken goes to inflight_fs. */
#define UVSPAN_FS_SLOTS 32

/* A DNS lookup of an unsampled trace kept with its thread (ops_local): what
 * its count needs (its record is never sent: lean). */
struct dns_slot {
	__u64 req; /* 0: free */
	__u64 start_ns;
	__u64 cause;
};

/* Two-way, as the fs slots; one that finds both taken goes to inflight_dns. */
#define UVSPAN_DNS_SLOTS 16

/* Everything uvspan keeps per thread, in one task-local storage: an fs
 * submit needs both the sync slot and the cause, and each lookup is a
 * cache miss on a busy machine. */
/* Per loop thread: the finished threadpool jobs uv__work_done took last
 * (batch.h), whose callbacks run one after the other now: each one's node
 * in libuv's queue on uv__work_done's stack, and the cause its callback
 * runs for. n: how many are kept (0: no batch, the thread's cause is
 * ctx.cause); more: the batch had more jobs than are kept. */
struct work_batch {
	__u64 head;
	__u32 n;
	__u32 more;
	__u32 paused; /* n while a cause is current for a while (cause_enter) */
	__u32 hint;   /* the job whose callback ran when last asked (thread_cause) */
	__u64 q[UVSPAN_BATCH];
	__u64 cause[UVSPAN_BATCH];
};

struct thread_state {
	struct sync_slot sync; /* first: a slot pointer is the state's own (no
				* arithmetic on a maybe-NULL pointer for the verifier) */
	struct thread_ctx ctx;
	struct work_batch batch;
	struct gc_state gc;
	struct fs_slot fs[UVSPAN_FS_SLOTS];
	struct dns_slot dns[UVSPAN_DNS_SLOTS];
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_state);
} threads SEC(".maps");

/* The cause of a stream's last write (its replies belong to it: an outgoing
 * call's response, a database answer), or of the request last begun on it
 * (its body's reads belong to it). */
struct conn_key {
	__u32 pid;
	__u32 _pad;
	__u64 ptr;
};

/* A stream's causes: `cause`, what its callbacks run under (its last
 * writer's, or the request begun on it); `server`, on a server connection,
 * the request its parser began last. A server connection's writes are that
 * request's response whatever callback writes them (a threadpool job's, a
 * worker's reply, a timer's), and never change its causes. */
struct stream_owner {
	__u64 cause;
	__u64 server;
	/* A client connection: written since its last read (its writer waits
	 * for a reply), and written by two causes since then (`mixed` 1: the
	 * replies' order is the protocol's, so the next read is a task of its
	 * own, never one of the two), or its reply came after its writer's
	 * request answered (`mixed` 2: a task too, see reply_orphaned). */
	__u16 pending;
	__u8 mixed;
	/* a child process's pipe (uv_spawn): its close is its spawner's */
	__u8 child;
	/* A client connection's protocol, decided at its first write (enum
	 * wire_state), and the number of its next wire record (user space
	 * sees a lost record, or a new connection at the same address, by
	 * it). */
	__u8 wire;
	/* A server connection: its request's response has been written (the
	 * request is in `answered`). */
	__u8 answer;
	__u16 wire_seq;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct conn_key);
	__type(value, struct stream_owner);
} stream_cause SEC(".maps");

/* Requests whose response has been written (a value of 1), by cause: a
 * client connection's reply read after its writer's request answered was
 * asked for by someone else (a pooled connection handed to the next
 * request in the answer's callback: stream_io). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct conn_key);
	__type(value, __u8);
} answered SEC(".maps");

/* The cause under which a uv_queue_work job was queued, by its struct
 * uv__work (the job's node in the batch walk: batch.h), until its
 * callback's batch takes it; and under which a child process was spawned,
 * by its uv_process_t, until its exit callback. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct conn_key);
	__type(value, __u64);
} work_cause SEC(".maps");

/* The cause under which a worker_threads message was posted, by its
 * node::worker::Message, until it is received (ports.h). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct conn_key);
	__type(value, __u64);
} port_msgs SEC(".maps");

/* The stream callback (thread_ctx.callbacks) in which a server parser last
 * began a request (llhttp__on_message_begin): a second one begun in the
 * same callback was pipelined behind it (http_message). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct conn_key);
	__type(value, __u64);
} parser_begun SEC(".maps");

/* An HTTP/2 stream's cause: (process, nghttp2 session, stream id). A
 * server stream's is its request, made at its first request header; a
 * client stream's (an outgoing one, `client`) is its caller's, kept at
 * nghttp2_submit_request's return. Gone at its close. */
struct h2_key {
	__u32 pid;
	__s32 stream_id;
	__u64 session;
};

/* A pending server stream's kept request header: nghttp2_rcbuf pointers
 * (node holds a reference to each header until it has handled the frame). */
#define H2_SAVED 10
struct h2_saved {
	__u64 name;
	__u64 value;
};

struct h2_stream {
	__u64 cause;
	__u8 client;    /* 0: a server stream; H2_CLIENT_OPEN, H2_CLIENT_ENDED (its response's end seen) */
	__u8 state;     /* a server stream under the kernel's sampler (h2_defers): enum h2_state */
	__u8 method;    /* H2_FOLLOWED: enum http_method */
	__u8 tls;       /* H2_FOLLOWED: its :scheme is https */
	__u16 status;   /* H2_FOLLOWED: its response's :status (0: none yet) */
	__u8 nsaved;    /* H2_PENDING: kept headers seen (the first H2_SAVED in `saved`) */
	__u8 _pad;
	__u64 start_ns; /* a server stream's first header */
	__u64 peer;     /* H2_PENDING: the libuv stream whose read brought its first header */
	struct h2_saved saved[H2_SAVED]; /* H2_PENDING: its kept request headers, in order */
};

#define H2_CLIENT_OPEN 1
#define H2_CLIENT_ENDED 2

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct h2_key);
	__type(value, struct h2_stream);
} h2_stream_cause SEC(".maps");

/* nghttp2_submit_request's arguments from its entry to its return (the
 * stream id), per thread (process << 32 | thread). */
struct h2_submit {
	__u64 session;
	__u64 nva;
	__u64 nvlen;
	__u64 cause;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, struct h2_submit);
} h2_submits SEC(".maps");

/* Per loop thread: the scheduler's counters where the current busy part
 * (outside epoll waits) started (loop.h). */
struct loop_sched {
	__u64 at;          /* when (0: no busy part open) */
	__u64 on_cpu;      /* se.sum_exec_runtime, caught up */
	__u64 run_delay;   /* sched_info.run_delay */
	__u64 throttled;   /* the cgroup's cfs_bandwidth.throttled_time */
	__u64 clk_off;     /* ktime - sched_clock mod 2^64, at a wake-up (0: not yet) */
	__u64 nvcsw;       /* voluntary switches when the current wait started */
};

/* Per loop thread: the iteration in progress. */
struct loop_state {
	struct loop_event ev;
	__u64 phase_start;
	__u64 epoll_enter;
	__u32 cur_phase; /* UVSPAN_PHASES = none yet */
	__u32 epoll_only; /* no phase probes: epoll waits delimit iterations */
	__u32 wake_frozen; /* an epoll wait in this poll phase returned events */
	__u8 poll_timeout_zero; /* epoll-only: the current wait has timeout 0 */
	__u8 last_poll_empty;   /* epoll-only: the last wait had timeout 0 and no events */
	__u16 _pad;
	__u64 last_exit_ns; /* when the last epoll wait returned */
	__u32 samples;          /* --stacks: stack samples sent in this iteration */
	__u32 _pad2;
	struct loop_time time;
	struct loop_sched sched;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct loop_state);
} loops SEC(".maps");

/* The stack sampler's gate (stacks.h: gate_tick): its wake-ups, and
 * whether it is awake (set here as it is woken, cleared by it). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} gate_wake SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} gate_awake SEC(".maps");

/* Operations of unsampled traces (no record sent): their durations per
 * process and attribute set. User space reads and sums the CPUs' into the
 * metrics and removes a process's entries once it is gone. Full: the
 * operation is lost to the metrics and counted (STAT_HIST_FULL). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	/* entries made when first used: preallocated, the map took ~13 ms of
	 * start-up */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 8192);
	__type(key, struct op_hist_key);
	__type(value, struct op_hist);
} op_hists SEC(".maps");

/* Unsampled HTTP/1 requests followed in the kernel (khttp), by (process,
 * cause): gone at their end. Full: a request is sent up as before. User
 * space ends the ones that stay (no response, or not all of it: a quiet
 * period; their process gone), as it does its own. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct conn_key);
	__type(value, struct http_req);
} http_reqs SEC(".maps");

/* Requests the kernel ended (http_reqs): their later writes (a TLS
 * record's ciphertext) are not sent either. Forgotten: such a write is
 * sent, and user space, which never saw its request, passes it by. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct conn_key);
	__type(value, __u8);
} http_done SEC(".maps");

/* --publish-trace-context: what a profiler reads (the OpenTelemetry eBPF
 * profiler's -obi-process-ctx), pinned by user space at
 * /sys/fs/bpf/otel/traces_ctx_v1: per loop thread (its ids as the
 * kernel's initial PID namespace sees them, tgid << 32 | tid), the trace
 * id and span id of the request it runs now; no entry while it runs none.
 * Its size and layout are the reader's: user space makes it (or reuses a
 * pinned one of this layout); off, one entry. */
struct trace_ctx_v1 {
	__u8 trace_id[16];
	__u8 span_id[8];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct trace_ctx_v1);
} traces_ctx_v1 SEC(".maps");

/* The ids of a request that came with a traceparent (its caller's trace
 * id, its SERVER span's own id), by (process as the initial namespace sees
 * it, cause): made at its head. A request without one has ids that are a
 * function of its cause (ctx_ids, ops.h): no entry. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct conn_key);
	__type(value, struct trace_ctx_v1);
} ctx_parent SEC(".maps");

/* The threads that have had an entry in traces_ctx_v1 (key as there):
 * user space removes their entries at exit, leaving a map it reused as it
 * found it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u8);
} ctx_threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

/* Scratch space: records are larger than the 512-byte BPF stack. */
struct scratch {
	union {
		struct fs_event fs;
		struct dns_event dns;
		struct loop_state loop;
		struct proc_event proc; /* listed so the skeleton generates its type */
		struct http_event http;
		struct stack_event stack; /* listed so the skeleton generates its type */
		struct gc_event gc;       /* likewise */
		struct op_hist hist;      /* likewise */
		struct {
			enum probe_kind probe;
			enum ev_end end;
			enum loop_phase phase;
			enum stat_idx stat;
			enum uvspan_sizes sizes;
			enum cookie_layout cookie;
			enum traced_flags traced;
			enum answer_family family;
			enum libuv_layout layout;
			enum http_what http;
			enum cause_kind cause;
			enum loop_split split;
			enum hist_family hist;
			enum h2_client_slot h2c;
			enum op_flags op_flags;
			enum hdr_flags hdr_flags;
			enum work_batch_layout batch;
			enum h2_state h2_state;
		} enums; /* likewise, for the enums */
	};
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch_buf SEC(".maps");

/* A finished threadpool job's bytes, read once by the batch walk
 * (batch.h): an fs request's from its result to its queue node, the
 * uv__work (work, done, loop, wq.next) at their end; fs_job_end takes its
 * fields from here instead of reading them again. */
#define JOB_BYTES (FS_WORK_OFF + WORK_WQ_OFF + 8 - FS_RESULT_OFF)
struct job_bytes {
	__u64 w[JOB_BYTES / 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct job_bytes);
} job_buf SEC(".maps");

/* Bytes this CPU sent since it last looked at the ring buffer's fill. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} sent_bytes SEC(".maps");

#endif /* UVSPAN_MAPS_H */
