// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * uvspan kernel side: uprobes on libuv functions inside Node.js, paired in the
 * kernel into one ring-buffer record per finished operation.
 *
 * Which program serves which libuv symbol, and the attach cookie each one
 * gets, is decided by the probe catalog in src/probes/catalog.rs. The
 * programs here are generic: they read the cookie to know what fired.
 *
 * Entry probes end most operations: the end of an async operation is the
 * entry of the function that completes it (uv__fs_done, uv__getaddrinfo_done,
 * or uv_fs_req_cleanup where those are missing), and the end of a threadpool
 * job is the worker's uv_async_send that wakes the loop. A sync fs call ends
 * at the return of its uv_fs_* function where the kernel has session uprobes
 * (Linux >= 6.13: the entry program asks for the return only for sync calls,
 * so async requests pay no return trap); elsewhere at uv_fs_req_cleanup.
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "uvspan.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* ---- settings, written by user space before load ---- */
const volatile unsigned long long loop_threshold_ns = 10000000ULL;
const volatile unsigned long long wakeup_bytes = 256 * 1024;
const volatile unsigned int follow_forks = 0;
/* --all: report every exec, so user space can pick up new Node processes */
const volatile unsigned int discover = 0;
/* Benchmark only (UVSPAN_BENCH_TRAP_ONLY=1): uprobes and epoll tracepoints
 * fire, their programs return at once (no spans). Measures what the kernel
 * charges for the probes alone. */
const volatile unsigned int trap_only = 0;
/* Request context (--requests): off, the hot paths skip the thread's cause. */
const volatile unsigned int requests = 0;
/* --sample-time: user space attaches the uprobes only during sampling
 * windows. It sets window_closed before detaching and bumps window_gen
 * before attaching again, so an operation that crosses a window edge is
 * dropped and counted (STAT_STRADDLED), never paired with a wrong end. */
const volatile unsigned int sampling = 0;
volatile __u32 window_closed = 0;
volatile __u32 window_gen = 0;
/* --stacks all-ops: the user stack at each fs/DNS submit. */
const volatile unsigned int stacks_all_ops = 0;
/* uvspan's own PID namespace (nsfs device and inode of /proc/self/ns/pid)
 * when it is not the initial one; 0: the initial namespace. Every pid and
 * tid the programs key maps by or send is the one uvspan sees, as its /proc,
 * perf_event_open and the uprobe pid filters do (see current_ids). */
const volatile __u64 pidns_dev = 0;
const volatile __u64 pidns_ino = 0;

/* Kernel types (CO-RE: only the fields used). */
struct files_struct;
struct pid;
struct task_struct {
	int pid;
	int tgid;
	struct files_struct *files;
	struct pid *thread_pid;
	struct task_struct *group_leader;
} __attribute__((preserve_access_index));

struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));

struct pid_namespace {
	struct ns_common ns;
} __attribute__((preserve_access_index));

struct upid {
	int nr;
	struct pid_namespace *ns;
} __attribute__((preserve_access_index));

struct pid {
	unsigned int level;
	struct upid numbers[1];
} __attribute__((preserve_access_index));

struct file;
struct fdtable {
	struct file **fd;
	unsigned int max_fds;
} __attribute__((preserve_access_index));

struct files_struct {
	struct fdtable *fdt;
} __attribute__((preserve_access_index));

struct file {
	void *private_data;
} __attribute__((preserve_access_index));

struct in6_addr___k {
	unsigned char s6_addr[16];
};

struct sock_common {
	unsigned int skc_daddr;
	unsigned short skc_dport;
	unsigned short skc_num;
	unsigned short skc_family;
	struct in6_addr___k skc_v6_daddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
} __attribute__((preserve_access_index));

struct socket {
	struct file *file;
	struct sock *sk;
} __attribute__((preserve_access_index));

/* ---- maps ---- */
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
	__u8 op;
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
};

/* Everything uvspan keeps per thread, in one task-local storage: an fs
 * submit needs both the sync slot and the cause, and each lookup is a
 * cache miss on a busy machine. */
struct thread_state {
	struct sync_slot sync; /* first: a slot pointer is the state's own (no
				* arithmetic on a maybe-NULL pointer for the verifier) */
	struct thread_ctx ctx;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_state);
} threads SEC(".maps");

/* The request in progress on a server parser (keep-alive connections get a
 * new one per request), and the cause of a stream's last write (its
 * replies belong to it: an outgoing call's response, a database answer). */
struct conn_key {
	__u32 pid;
	__u32 _pad;
	__u64 ptr;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct conn_key);
	__type(value, __u64);
} parser_cause SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct conn_key);
	__type(value, __u64);
} stream_cause SEC(".maps");

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
};

/* libuv's two waits of one poll phase (idle-time metrics: a timeout-0 wait,
 * then the real one) follow each other within microseconds; a longer gap
 * means callbacks ran in between (a timeout-0 poll because immediates are
 * pending): a new iteration. */
#define SAME_POLL_GAP_NS 250000ULL

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct loop_state);
} loops SEC(".maps");

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
		} enums; /* likewise, for the enums */
	};
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch_buf SEC(".maps");

/* ---- helpers ---- */
/* --stacks: walks the frame-pointer chain of the user stack from (pc, fp)
 * into e->frames. */
static __always_inline void walk_user_stack(struct stack_event *e, __u64 pc, __u64 fp)
{
	__u32 n = 0;
	for (int i = 0; i < UVSPAN_STACK_FRAMES; i++) {
		/* fp-16, fp-8, saved fp, return address */
		__u64 w[4] = {};
		e->frames[i].pc = pc;
		n = i + 1;
		/* No frame pointer, or a failed read (which leaves zeros): a
		 * frame with nothing above it, the chain's end. */
		if (fp)
			bpf_probe_read_user(w, sizeof(w), (void *)(fp - 16));
		e->frames[i].fp_m16 = w[0];
		e->frames[i].fp_m8 = w[1];
		/* A JS frame: a heap object (tag 01) at fp-16, a context (also a
		 * heap object) at fp-8 where typed frames keep a small marker. */
		if ((w[0] & 3) == 1 && (w[1] & 1) == 1)
			bpf_probe_read_user(e->frames[i].obj, sizeof(e->frames[i].obj), (void *)(w[0] - 1));
		else
			__builtin_memset(e->frames[i].obj, 0, sizeof(e->frames[i].obj));
		/* The caller's frame is higher on the stack; anything else ends the chain. */
		if (w[2] <= fp || !w[3])
			break;
		pc = w[3];
		fp = w[2];
	}
	e->n_frames = n;
}

static __always_inline void stat_inc(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);
	if (v)
		*v += 1;
}

/* How deep PID namespaces nest (the kernel's MAX_PID_NS_LEVEL). */
#define PIDNS_LEVELS 32

/* A task's number in uvspan's PID namespace (0: not visible there). */
static __always_inline __u32 pid_nr_ours(struct pid *p)
{
	if (!p)
		return 0;
	unsigned int level = BPF_CORE_READ(p, level);
	for (int i = 0; i < PIDNS_LEVELS; i++) {
		if (i > level)
			break;
		struct upid u = {};
		if (bpf_core_read(&u, sizeof(u), &p->numbers[i]))
			break;
		if (BPF_CORE_READ(u.ns, ns.inum) == pidns_ino)
			return u.nr;
	}
	return 0;
}

/* (tgid << 32 | pid) of a task as uvspan sees them. */
static __always_inline __u64 task_ids(struct task_struct *t)
{
	if (!pidns_ino)
		return ((__u64)BPF_CORE_READ(t, tgid) << 32) | (__u32)BPF_CORE_READ(t, pid);
	__u64 tgid = pid_nr_ours(BPF_CORE_READ(t, group_leader, thread_pid));
	return (tgid << 32) | pid_nr_ours(BPF_CORE_READ(t, thread_pid));
}

/* (tgid << 32 | pid) of the current task as uvspan sees them: the kernel's
 * own ids where uvspan runs in the initial PID namespace; else the ids in
 * uvspan's namespace (one helper call for a task of that namespace, a walk
 * of the task's pid numbers for one nested below it), 0 for a task that
 * uvspan cannot see (never traced). */
static __always_inline __u64 current_ids(void)
{
	if (!pidns_ino)
		return bpf_get_current_pid_tgid();
	struct bpf_pidns_info ns;
	if (!bpf_get_ns_current_pid_tgid(pidns_dev, pidns_ino, &ns, sizeof(ns)))
		return ((__u64)ns.tgid << 32) | ns.pid;
	return task_ids(bpf_get_current_task_btf());
}

static __always_inline int is_traced(__u32 pid)
{
	return bpf_map_lookup_elem(&traced, &pid) != NULL;
}


static __always_inline struct scratch *get_scratch(void)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_buf, &zero);
	if (!s)
		stat_inc(STAT_SCRATCH_MISS);
	return s;
}

/* Bytes this CPU sent since it last looked at the ring buffer's fill. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} sent_bytes SEC(".maps");

/* Looked at once per this many bytes sent from a CPU: the fill is read
 * from the ring buffer's consumer position, a cache line user space
 * writes from another CPU. */
#define WAKE_CHECK_BYTES (16 * 1024)

/* Batch wakeups: wake the reader only once a good amount is waiting
 * (user space also reads on a timer, so nothing waits for long). */
static __always_inline __u64 wake_flags_after(__u64 size)
{
	__u32 zero = 0;
	__u64 *sent = bpf_map_lookup_elem(&sent_bytes, &zero);
	if (sent) {
		*sent += size;
		if (*sent < WAKE_CHECK_BYTES)
			return BPF_RB_NO_WAKEUP;
		*sent = 0;
	}
	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
		return BPF_RB_FORCE_WAKEUP;
	return BPF_RB_NO_WAKEUP;
}

static __always_inline void emit_flags(void *data, __u64 size, __u64 flags)
{
	if (bpf_ringbuf_output(&events, data, size, flags))
		stat_inc(STAT_RINGBUF_LOST);
}

static __always_inline void emit(void *data, __u64 size)
{
	emit_flags(data, size, wake_flags_after(size));
}

/* The integer arguments of a function at its entry (System V x86_64):
 * 0-5 in registers, 6 and 7 on the stack above the return address (read
 * only when asked: `stack`). One array indexed by the cookie's argument
 * positions keeps the verifier's work small (a switch per lookup multiplied
 * its states). */
struct args {
	__u64 v[8];
};

static __always_inline void read_args(struct pt_regs *ctx, struct args *a, int stack)
{
	a->v[0] = PT_REGS_PARM1(ctx);
	a->v[1] = PT_REGS_PARM2(ctx);
	a->v[2] = PT_REGS_PARM3(ctx);
	a->v[3] = PT_REGS_PARM4(ctx);
	a->v[4] = PT_REGS_PARM5(ctx);
	a->v[5] = PT_REGS_PARM6(ctx);
	a->v[6] = 0;
	a->v[7] = 0;
	if (stack)
		bpf_probe_read_user(&a->v[6], 2 * sizeof(__u64), (void *)(PT_REGS_SP(ctx) + 8));
}

/* A 4-bit argument position of an fs submit cookie (enum cookie_layout in
 * uvspan.h; the cookies are built by src/probes/catalog.rs). */
#define cookie_field(c, shift) ((__u32)(((c) >> (shift)) & COOKIE_NONE))

/* ---- fs ----
 * Sync calls (cb == NULL) are per thread: their state lives in task-local
 * storage (no hash update, freed with the thread) and is filled in place.
 * Async requests keep a small record in inflight_fs, keyed by request; the
 * rest (fd, paths, result) is read from the request when it ends: libuv
 * keeps its own copy of an async request's paths until uv_fs_req_cleanup. */
static __always_inline __u32 fs_record_size(const struct fs_event *e)
{
	if (e->has_path2)
		return sizeof(*e);
	/* Most paths are far shorter than their buffer: less to copy here,
	 * less ring buffer to fill and for uvspan to read. */
	__u32 n = (e->path_len + 7) & ~7U;
	if (n > UVSPAN_PATH_MAX)
		n = UVSPAN_PATH_MAX;
	return __builtin_offsetof(struct fs_event, path) + n;
}

/* Reads a path into `dst` (empty when it cannot be read): its length with
 * the NUL, 0 for none. */
static __always_inline __u32 read_path(char *dst, __u32 size, const void *src)
{
	dst[0] = 0;
	long n = bpf_probe_read_user_str(dst, size, src);
	return n > 0 ? (__u32)n : 0;
}

static __always_inline struct thread_state *thread_state_of(int create)
{
	struct task_struct *task = bpf_get_current_task_btf();
	return bpf_task_storage_get(&threads, task, 0, create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
}

static __always_inline struct sync_slot *sync_slot_of(int create)
{
	return (struct sync_slot *)thread_state_of(create);
}

/* Ends the thread's sync call: result from the request, one record. */
static __always_inline void sync_finish(struct sync_slot *slot, __u8 end_kind)
{
	struct fs_event *e = &slot->ev;
	e->end_ns = bpf_ktime_get_ns();
	e->end_kind = end_kind;
	bpf_probe_read_user(&e->result, sizeof(e->result), (void *)(slot->req + FS_RESULT_OFF));
	emit(e, fs_record_size(e));
	slot->req = 0;
}

/* --sample-time: the sync call began in an earlier window, or the window
 * closed while it ran (its end probe is gone): its end would be wrong. */
static __always_inline int sync_straddles(struct sync_slot *slot)
{
	return sampling && (window_closed || slot->gen != window_gen);
}

/* Ends the thread's pending sync call, or drops it (counted) if it
 * straddles a sampling window's edge. */
static __always_inline void sync_end(struct sync_slot *slot, __u8 end_kind)
{
	if (sync_straddles(slot)) {
		slot->req = 0;
		stat_inc(STAT_STRADDLED);
		return;
	}
	sync_finish(slot, end_kind);
}

/* Ends the thread's pending sync call, if any: a sync call has returned by
 * the time its thread does anything else in libuv (see sync_slot). */
static __always_inline void end_pending_sync(void)
{
	struct sync_slot *slot = sync_slot_of(0);
	if (slot && slot->req)
		sync_end(slot, END_NEXT);
}

/* ---- request context ----
 * A cause is a request uvspan saw start (llhttp_execute on a server
 * parser). Each thread has a current cause; fs and DNS requests submitted
 * while it is set carry it, and their completion callbacks restore it, so
 * chains of callbacks (and the promise continuations Node drains before
 * returning to libuv) keep their request. Timers and immediates clear it. */

static __always_inline __u64 current_cause(void)
{
	if (!requests)
		return 0;
	struct thread_state *t = thread_state_of(0);
	return t ? t->ctx.cause : 0;
}

static __always_inline void set_cause(__u64 cause)
{
	if (!requests)
		return;
	struct thread_state *t = thread_state_of(cause != 0);
	if (t)
		t->ctx.cause = cause;
}

/* Ends an async request: reads what it needs from the request, one record. */
static __always_inline int fs_finish_async(__u32 pid, __u64 req, __u8 end_kind)
{
	struct req_key key = { .pid = pid, .req = req };
	struct fs_async *a = bpf_map_lookup_elem(&inflight_fs, &key);
	if (!a) {
		/* Its start fell before this sampling window. (Without
		 * uv__fs_done, uv_fs_req_cleanup ends async requests and also
		 * sees every sync one: not counted there.) */
		if (sampling && end_kind == END_DONE)
			stat_inc(STAT_STRADDLED);
		return 0;
	}
	struct scratch *s = get_scratch();
	if (!s)
		return 0;
	struct fs_event *e = &s->fs;
	e->hdr.kind = EV_FS;
	e->hdr.pid = pid;
	e->hdr.tid = a->tid;
	e->hdr._pad = 0;
	e->req = req;
	e->cause = a->cause;
	e->start_ns = a->start_ns;
	e->work_start_ns = a->work_start_ns;
	e->work_end_ns = a->work_end_ns;
	e->end_ns = bpf_ktime_get_ns();
	e->worker_tid = a->worker_tid;
	e->op = a->op;
	e->sync = 0;
	e->end_kind = end_kind;
	e->path_len = 0;
	/* Neighbouring fields in one read each (each read is a helper call):
	 * result .. path, and new_path .. file. */
	__u64 head[(FS_PATH_OFF - FS_RESULT_OFF) / 8 + 1] = {};
	bpf_probe_read_user(head, sizeof(head), (void *)(req + FS_RESULT_OFF));
	e->result = (long long)head[0];
	__u64 tail[(FS_FILE_OFF - FS_NEW_PATH_OFF) / 8 + 1] = {};
	if (a->has_fd || a->has_path2)
		bpf_probe_read_user(tail, sizeof(tail), (void *)(req + FS_NEW_PATH_OFF));
	e->fd = a->has_fd ? (int)tail[(FS_FILE_OFF - FS_NEW_PATH_OFF) / 8] : -1;
	e->path[0] = 0;
	e->has_path2 = a->has_path2;
	if (a->has_path)
		e->path_len = read_path(e->path, sizeof(e->path), (void *)head[(FS_PATH_OFF - FS_RESULT_OFF) / 8]);
	if (a->has_path2) {
		e->path2[0] = 0;
		bpf_probe_read_user_str(e->path2, sizeof(e->path2), (void *)tail[0]);
	}
	/* Its callback runs next, on behalf of the same request. */
	if (end_kind == END_DONE)
		set_cause(e->cause);
	bpf_map_delete_elem(&inflight_fs, &key);
	emit(e, fs_record_size(e));
	return 0;
}

/* --stacks all-ops: the stack of the thread submitting fs/DNS request
 * `req`, sent before the request's own record. */
static __always_inline void op_stack(struct pt_regs *ctx, __u64 req)
{
	struct stack_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		stat_inc(STAT_RINGBUF_LOST);
		return;
	}
	__u64 id = current_ids();
	e->hdr.kind = EV_STACK;
	e->hdr.pid = id >> 32;
	e->hdr.tid = (__u32)id;
	e->hdr._pad = 0;
	e->iter_start_ns = 0;
	e->ts_ns = bpf_ktime_get_ns();
	e->sp = PT_REGS_SP(ctx);
	e->req = req;
	e->_pad = 0;
	walk_user_stack(e, PT_REGS_IP(ctx), PT_REGS_FP(ctx));
	bpf_ringbuf_submit(e, wake_flags_after(sizeof(*e)));
}

/* Returns 1 when a sync call was recorded (its end is the function's
 * return, where session uprobes exist). */
static __always_inline int fs_submit(struct pt_regs *ctx, __u64 cookie)
{
	__u64 id = current_ids();
	__u32 pid = id >> 32;
	__u64 req = PT_REGS_PARM2(ctx);
	if (stacks_all_ops)
		op_stack(ctx, req);
	__u64 now = bpf_ktime_get_ns();
	__u32 idx;
	struct args args;
	/* Only the callback can be on the stack (uv_fs_read/write/sendfile). */
	read_args(ctx, &args, cookie_field(cookie, COOKIE_CB_SHIFT) >= 6);
	int sync = args.v[cookie_field(cookie, COOKIE_CB_SHIFT) & 7] == 0;

	/* One lookup for the pending sync call and the cause. */
	struct thread_state *ts = thread_state_of(sync);
	struct sync_slot *slot = (struct sync_slot *)ts;
	__u64 cause = requests && ts ? ts->ctx.cause : 0;
	if (slot && slot->req)
		sync_end(slot, END_NEXT);

	if (!sync) {
		struct fs_async a = {
			.start_ns = now,
			.cause = cause,
			.tid = (__u32)id,
			.op = cookie & 0xFF,
			.has_path = cookie_field(cookie, COOKIE_PATH_SHIFT) != COOKIE_NONE,
			.has_path2 = cookie_field(cookie, COOKIE_PATH2_SHIFT) != COOKIE_NONE,
			.has_fd = cookie_field(cookie, COOKIE_FD_SHIFT) != COOKIE_NONE,
		};
		struct req_key key = { .pid = pid, .req = req };
		if (bpf_map_update_elem(&inflight_fs, &key, &a, BPF_NOEXIST)) {
			if (bpf_map_update_elem(&inflight_fs, &key, &a, BPF_ANY))
				stat_inc(STAT_INFLIGHT_FULL); /* this span is lost, and counted */
			else
				stat_inc(STAT_INFLIGHT_REPLACED);
		}
		return 0;
	}
	if (!slot)
		return 0;

	/* A sync call: its arguments are only valid now, so read them now. */
	struct fs_event *e = &slot->ev;
	slot->req = req;
	slot->gen = window_gen;
	e->hdr.kind = EV_FS;
	e->hdr.pid = pid;
	e->hdr.tid = (__u32)id;
	e->hdr._pad = 0;
	e->req = req;
	e->cause = cause;
	e->start_ns = now;
	e->work_start_ns = 0;
	e->work_end_ns = 0;
	e->end_ns = 0;
	e->result = 0;
	e->worker_tid = 0;
	e->end_kind = 0;
	e->path_len = 0;
	e->op = cookie & 0xFF;
	e->sync = 1;

	idx = cookie_field(cookie, COOKIE_FD_SHIFT);
	e->fd = idx == COOKIE_NONE ? -1 : (int)args.v[idx & 7];

	e->path[0] = 0;
	idx = cookie_field(cookie, COOKIE_PATH_SHIFT);
	if (idx != COOKIE_NONE)
		e->path_len = read_path(e->path, sizeof(e->path), (void *)args.v[idx & 7]);
	e->has_path2 = 0;
	idx = cookie_field(cookie, COOKIE_PATH2_SHIFT);
	if (idx != COOKIE_NONE) {
		e->path2[0] = 0;
		bpf_probe_read_user_str(e->path2, sizeof(e->path2), (void *)args.v[idx & 7]);
		e->has_path2 = 1;
	}
	return 1;
}

/* The return of a sync call's uv_fs_* function (session uprobes): the call
 * is over. `req` is the request its entry recorded. */
static __always_inline int fs_sync_return(__u64 req)
{
	struct sync_slot *slot = sync_slot_of(0);
	if (slot && slot->req == req)
		sync_end(slot, END_RETURN);
	return 0;
}

/* uv__fs_work(struct uv__work *w): a pool thread starts an async request
 * (sync calls run it inline on the calling thread: not in inflight_fs).
 * Attached with --detail threadpool. */
static __always_inline int fs_work(struct pt_regs *ctx, __u64 cookie)
{
	__u64 id = current_ids();
	__u32 pid = id >> 32, tid = (__u32)id;
	struct worker_job job = { .key = { .pid = pid, .req = PT_REGS_PARM1(ctx) - FS_WORK_OFF }, .kind = EV_FS };
	struct fs_async *a = bpf_map_lookup_elem(&inflight_fs, &job.key);
	if (!a)
		return 0;
	a->work_start_ns = bpf_ktime_get_ns();
	a->worker_tid = tid;
	bpf_map_update_elem(&worker_jobs, &tid, &job, BPF_ANY);
	return 0;
}

/* uv__fs_done(struct uv__work *w, int status): completion on the loop thread,
 * just before the callback runs. */
static __always_inline int fs_done(struct pt_regs *ctx, __u64 cookie)
{
	return fs_finish_async(current_ids() >> 32, PT_REGS_PARM1(ctx) - FS_WORK_OFF, END_DONE);
}

/* uv_fs_req_cleanup(uv_fs_t *req): Node calls it once it has used the result.
 * Ends sync calls, and async requests in builds where uv__fs_done is absent. */
static __always_inline int fs_cleanup(struct pt_regs *ctx, __u64 cookie)
{
	__u64 req = PT_REGS_PARM1(ctx);
	struct sync_slot *slot = sync_slot_of(0);
	if (slot && slot->req == req) {
		sync_end(slot, END_CLEANUP);
		return 0;
	}
	return fs_finish_async(current_ids() >> 32, req, END_CLEANUP);
}

/* ---- threadpool job end: the worker wakes the loop right after w->work(w) ---- */
static __always_inline int work_end(struct pt_regs *ctx, __u64 cookie)
{
	__u32 tid = (__u32)current_ids();
	struct worker_job *job = bpf_map_lookup_elem(&worker_jobs, &tid);
	if (!job)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (job->kind == EV_FS) {
		struct fs_async *a = bpf_map_lookup_elem(&inflight_fs, &job->key);
		if (a && a->worker_tid == tid && !a->work_end_ns)
			a->work_end_ns = now;
	} else {
		struct dns_event *e = bpf_map_lookup_elem(&inflight_dns, &job->key);
		if (e && e->worker_tid == tid && !e->work_end_ns)
			e->work_end_ns = now;
	}
	bpf_map_delete_elem(&worker_jobs, &tid);
	return 0;
}

/* ---- DNS ---- */
/* uv_getaddrinfo(loop, req, cb, node, service, hints) */
static __always_inline int dns_submit(struct pt_regs *ctx, __u64 cookie)
{
	__u64 id = current_ids();
	__u32 pid = id >> 32;
	struct scratch *s = get_scratch();
	if (!s)
		return 0;
	if (stacks_all_ops)
		op_stack(ctx, PT_REGS_PARM2(ctx));
	struct dns_event *e = &s->dns;
	__builtin_memset(e, 0, sizeof(*e) - UVSPAN_HOST_MAX);
	e->hdr.kind = EV_DNS;
	e->hdr.pid = pid;
	e->hdr.tid = (__u32)id;
	e->req = PT_REGS_PARM2(ctx);
	e->cause = current_cause();
	e->start_ns = bpf_ktime_get_ns();
	e->sync = PT_REGS_PARM3(ctx) == 0;
	e->host[0] = 0;
	bpf_probe_read_user_str(e->host, sizeof(e->host), (void *)PT_REGS_PARM4(ctx));
	struct req_key key = { .pid = pid, .req = e->req };
	if (bpf_map_update_elem(&inflight_dns, &key, e, BPF_NOEXIST)) {
		stat_inc(STAT_INFLIGHT_REPLACED);
		bpf_map_update_elem(&inflight_dns, &key, e, BPF_ANY);
	}
	return 0;
}

/* uv__getaddrinfo_work(struct uv__work *w) */
static __always_inline int dns_work(struct pt_regs *ctx, __u64 cookie)
{
	__u64 id = current_ids();
	__u32 pid = id >> 32, tid = (__u32)id;
	struct worker_job job = { .key = { .pid = pid, .req = PT_REGS_PARM1(ctx) - GAI_WORK_OFF }, .kind = EV_DNS };
	struct dns_event *e = bpf_map_lookup_elem(&inflight_dns, &job.key);
	if (!e || e->sync)
		return 0;
	e->work_start_ns = bpf_ktime_get_ns();
	e->worker_tid = tid;
	bpf_map_update_elem(&worker_jobs, &tid, &job, BPF_ANY);
	return 0;
}

/* struct addrinfo (glibc, x86_64) */
#define AI_FAMILY_OFF 4
#define AI_ADDR_OFF 24
#define AI_NEXT_OFF 40

/* uv__getaddrinfo_done(struct uv__work *w, int status) */
/* Ends a DNS request: result code, the addresses it returned, one record. */
static __always_inline int dns_finish(struct req_key *key, int status, __u8 end_kind)
{
	struct dns_event *e = bpf_map_lookup_elem(&inflight_dns, key);
	if (!e) {
		if (sampling && end_kind == END_DONE)
			stat_inc(STAT_STRADDLED); /* started before this window */
		return 0;
	}
	__u64 req = key->req;
	e->end_ns = bpf_ktime_get_ns();
	e->end_kind = end_kind;
	/* addrinfo and retcode in one read */
	__u64 r[(GAI_RETCODE_OFF - GAI_ADDRINFO_OFF) / 8 + 1] = {};
	bpf_probe_read_user(r, sizeof(r), (void *)(req + GAI_ADDRINFO_OFF));
	e->retcode = (int)r[(GAI_RETCODE_OFF - GAI_ADDRINFO_OFF) / 8];
	if (status == -125 /* UV_ECANCELED */)
		e->retcode = -3003; /* UV_EAI_CANCELED, as libuv reports it */

	__u64 ai = r[0];
	/* The count lives in the record, not in a local: read back from map
	 * memory it is a value the verifier does not follow, so the paths
	 * through the loop (an answer kept or not, at each step) meet again
	 * instead of being verified once per count (this loop was ~40% of
	 * the uprobe program's verification, and of uvspan's start-up). */
	e->n_answers = 0;
	for (int i = 0; i < UVSPAN_MAX_ANSWERS; i++) {
		if (!ai)
			break;
		/* struct addrinfo in one read: family, addr, next */
		__u64 w[AI_NEXT_OFF / 8 + 1] = {};
		bpf_probe_read_user(w, sizeof(w), (void *)ai);
		int family = (int)(w[AI_FAMILY_OFF / 8] >> ((AI_FAMILY_OFF % 8) * 8));
		__u64 sa = w[AI_ADDR_OFF / 8];
		if (sa && (family == FAMILY_INET || family == FAMILY_INET6)) {
			__u8 n = e->n_answers;
			struct dns_answer *a = &e->answers[n & (UVSPAN_MAX_ANSWERS - 1)];
			a->family = family;
			if (family == FAMILY_INET)
				bpf_probe_read_user(a->addr, 4, (void *)(sa + 4));
			else
				bpf_probe_read_user(a->addr, 16, (void *)(sa + 8));
			e->n_answers = n + 1;
		}
		ai = w[AI_NEXT_OFF / 8];
	}
	/* uv__getaddrinfo_done runs the callback next, for the same request. */
	if (end_kind == END_DONE)
		set_cause(e->cause);
	emit(e, sizeof(*e));
	bpf_map_delete_elem(&inflight_dns, key);
	return 0;
}

/* uv__getaddrinfo_done(struct uv__work *w, int status) */
static __always_inline int dns_done(struct pt_regs *ctx, __u64 cookie)
{
	struct req_key key = { .pid = current_ids() >> 32, .req = PT_REGS_PARM1(ctx) - GAI_WORK_OFF };
	return dns_finish(&key, (int)PT_REGS_PARM2(ctx), END_DONE);
}

/* Fallback for builds without uv__getaddrinfo_work (stripped): libc's
 * getaddrinfo(node, service, hints, &req->addrinfo) on the pool thread. */
static __always_inline int dns_work_libc(struct pt_regs *ctx, __u64 cookie)
{
	__u64 id = current_ids();
	__u32 pid = id >> 32, tid = (__u32)id;
	struct worker_job job = { .key = { .pid = pid, .req = PT_REGS_PARM4(ctx) - GAI_ADDRINFO_OFF }, .kind = EV_DNS };
	struct dns_event *e = bpf_map_lookup_elem(&inflight_dns, &job.key);
	if (!e || e->sync || e->work_start_ns)
		return 0; /* not a libuv request (another getaddrinfo caller) */
	e->work_start_ns = bpf_ktime_get_ns();
	e->worker_tid = tid;
	bpf_map_update_elem(&worker_jobs, &tid, &job, BPF_ANY);
	return 0;
}

struct bpf_map;

struct gai_match {
	__u64 ai;
	__u64 best;
	struct req_key key;
	__u32 pid;
	__u32 found;
};

static long match_gai(struct bpf_map *map, struct req_key *key, struct dns_event *e, struct gai_match *m)
{
	if (key->pid != m->pid)
		return 0;
	__u64 ai = 1;
	bpf_probe_read_user(&ai, sizeof(ai), (void *)(key->req + GAI_ADDRINFO_OFF));
	if (ai != m->ai)
		return 0;
	/* Results reach the loop in the order the pool finished them. */
	__u64 when = e->work_end_ns ? e->work_end_ns : ~0ULL - 1;
	if (!m->found || when < m->best) {
		m->found = 1;
		m->best = when;
		m->key = *key;
	}
	return 0;
}

/* Fallback for builds without uv__getaddrinfo_done (stripped): Node frees the
 * result with uv_freeaddrinfo(req->addrinfo) once its callback has run (also
 * on failure, with NULL). Find the request whose result this is. */
static __always_inline int dns_free(struct pt_regs *ctx, __u64 cookie)
{
	struct gai_match m = { .ai = PT_REGS_PARM1(ctx), .pid = current_ids() >> 32 };
	bpf_for_each_map_elem(&inflight_dns, match_gai, &m, 0);
	if (!m.found)
		return 0;
	struct req_key key = m.key;
	return dns_finish(&key, 0, END_FREE);
}

/* ---- event loop ---- */
static __always_inline void loop_finish_iteration(struct loop_state *st, __u64 now)
{
	struct loop_event *ev = &st->ev;
	__u64 total = now - ev->start_ns;
	__u64 busy = total > ev->poll_wait_ns ? total - ev->poll_wait_ns : 0;
	stat_inc(STAT_LOOP_ITERATIONS);
	if (busy < loop_threshold_ns) {
		ev->skipped++;
		return;
	}
	stat_inc(STAT_LOOP_EMITTED);
	ev->end_ns = now;
	emit(ev, sizeof(*ev));
	ev->skipped = 0;
}

/* Phase function entry (uv__io_poll, uv__run_check, uv__run_timers,
 * uv__run_idle, uv__run_prepare); the cookie is the enum loop_phase.
 * A phase ends when the next one starts; an iteration runs from one
 * uv__io_poll entry to the next. */
static __always_inline struct loop_state *loop_state_of(__u32 pid, __u32 tid)
{
	struct loop_state *st = bpf_map_lookup_elem(&loops, &tid);
	if (st)
		return st;
	struct scratch *s = get_scratch();
	if (!s)
		return NULL;
	__builtin_memset(&s->loop, 0, sizeof(s->loop));
	s->loop.cur_phase = UVSPAN_PHASES;
	s->loop.ev.hdr.kind = EV_LOOP;
	s->loop.ev.hdr.pid = pid;
	s->loop.ev.hdr.tid = tid;
	bpf_map_update_elem(&loops, &tid, &s->loop, BPF_ANY);
	return bpf_map_lookup_elem(&loops, &tid);
}

/* A phase starts (and the current one ends). Entering poll closes the
 * iteration. `phase` is 64-bit on purpose: a 32-bit copy would lose the
 * verifier's bounds on it. */
static __always_inline void loop_enter_phase(struct loop_state *st, __u64 phase, __u64 now)
{
	if (phase >= UVSPAN_PHASES)
		return;
	__u32 cur = st->cur_phase;
	if (cur < UVSPAN_PHASES)
		st->ev.phases[cur].end_ns = now;
	if (phase == PHASE_POLL) {
		if (st->ev.start_ns)
			loop_finish_iteration(st, now);
		st->ev.start_ns = now;
		st->ev.wake_ns = 0;
		st->ev.end_ns = 0;
		st->ev.poll_wait_ns = 0;
		st->wake_frozen = 0;
		st->samples = 0;
		__builtin_memset(st->ev.phases, 0, sizeof(st->ev.phases));
	}
	if (st->ev.start_ns && !st->ev.phases[phase].start_ns)
		st->ev.phases[phase].start_ns = now;
	st->cur_phase = phase;
	st->epoll_enter = 0;
}

/* Phase function entry (uv__io_poll, uv__run_check, uv__run_timers,
 * uv__run_idle, uv__run_prepare); the cookie's low byte is the enum
 * loop_phase. A phase ends when the next one starts; an iteration runs from
 * one uv__io_poll entry to the next. */
static __always_inline int loop_phase(struct pt_regs *ctx, __u64 cookie)
{
	__u64 id = current_ids();
	end_pending_sync();
	struct loop_state *st = loop_state_of(id >> 32, (__u32)id);
	if (st)
		loop_enter_phase(st, cookie & 0xFF, bpf_ktime_get_ns());
	return 0;
}

/* Fallback for builds without the phase functions (stripped): uv_run marks
 * the thread as running a loop; its epoll waits then delimit iterations. */
static __always_inline int loop_run(struct pt_regs *ctx, __u64 cookie)
{
	__u64 id = current_ids();
	struct loop_state *st = loop_state_of(id >> 32, (__u32)id);
	if (st) {
		st->epoll_only = 1;
		st->ev.epoll_only = 1;
	}
	return 0;
}

/* ---- HTTP: where requests start, and what is written on their behalf ---- */

/* The first bytes of an HTTP/1.x request line or status line. */
static __always_inline int is_response(const char *h)
{
	return h[0] == 'H' && h[1] == 'T' && h[2] == 'T' && h[3] == 'P' && h[4] == '/';
}

static __always_inline int is_request(const char *h)
{
	__u32 w = (__u8)h[0] | (__u8)h[1] << 8 | (__u8)h[2] << 16 | (__u32)(__u8)h[3] << 24;
	switch (w) {
	case 0x20544547: /* "GET " */
	case 0x54534f50: /* "POST" */
	case 0x20545550: /* "PUT " */
	case 0x44414548: /* "HEAD" */
	case 0x454c4544: /* "DELE" */
	case 0x43544150: /* "PATC" */
	case 0x4954504f: /* "OPTI" */
	case 0x4e4e4f43: /* "CONN" */
	case 0x43415254: /* "TRAC" */
		return 1;
	}
	return 0;
}

/* A new cause: unique per request on this host (time, then CPU). */
static __always_inline __u64 new_cause(void)
{
	return (bpf_ktime_get_ns() << 8) | (bpf_get_smp_processor_id() & 0xFF);
}

/* The peer and local address of the socket behind a stream's fd. */
static __always_inline void peer_of(struct http_event *e, __u64 stream)
{
	int fd = -1;
	bpf_probe_read_user(&fd, sizeof(fd), (void *)(stream + STREAM_FD_OFF));
	if (fd < 0)
		return;
	struct task_struct *task = bpf_get_current_task_btf();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt || (unsigned int)fd >= BPF_CORE_READ(fdt, max_fds))
		return;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = NULL;
	bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]);
	if (!f)
		return;
	struct socket *sock = BPF_CORE_READ(f, private_data);
	if (!sock || BPF_CORE_READ(sock, file) != f)
		return; /* not a socket */
	struct sock *sk = BPF_CORE_READ(sock, sk);
	if (!sk)
		return;
	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);
	if (family == FAMILY_INET) {
		__u32 a = BPF_CORE_READ(sk, __sk_common.skc_daddr);
		__builtin_memcpy(e->peer_addr, &a, 4);
	} else if (family == FAMILY_INET6) {
		BPF_CORE_READ_INTO(&e->peer_addr, sk, __sk_common.skc_v6_daddr);
	} else {
		return;
	}
	e->family = family;
	e->peer_port = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
	e->local_port = BPF_CORE_READ(sk, __sk_common.skc_num);
}

#define HTTP_SHORT_HEAD 256

/* One HTTP record: `total` bytes in the call; with `capture`, the first
 * UVSPAN_HTTP_CAPTURE bytes at `data` (of which `avail` are the call's). */
static __always_inline void emit_http(__u32 what, __u64 cause, __u64 conn, __u64 data, __u64 avail, __u64 total,
				      int capture, __u8 tls)
{
	struct scratch *s = get_scratch();
	if (!s)
		return;
	struct http_event *e = &s->http;
	__u64 id = current_ids();
	__builtin_memset(e, 0, sizeof(*e) - UVSPAN_HTTP_CAPTURE);
	e->hdr.kind = EV_HTTP;
	e->hdr.pid = id >> 32;
	e->hdr.tid = (__u32)id;
	e->ts_ns = bpf_ktime_get_ns();
	e->cause = cause;
	e->conn = conn;
	e->what = what;
	e->len = total > 0xFFFFFFFF ? 0xFFFFFFFF : total;
	e->tls = tls;
	/* Fixed-size reads (a short head: 256 bytes) keep the verifier's
	 * bounds simple; `captured` says how much of it is the call's. A read
	 * that fails (the bytes end at a mapping's end) keeps nothing. */
	__u32 n = 0;
	if (capture && avail <= HTTP_SHORT_HEAD) {
		if (!bpf_probe_read_user(e->data, HTTP_SHORT_HEAD, (void *)data))
			n = avail;
	} else if (capture && !bpf_probe_read_user(e->data, UVSPAN_HTTP_CAPTURE, (void *)data)) {
		n = avail < UVSPAN_HTTP_CAPTURE ? avail : UVSPAN_HTTP_CAPTURE;
	}
	e->captured = n;
	if (what == HTTP_REQUEST)
		peer_of(e, conn);
	/* Sent with what was captured only (8-byte aligned). */
	__u64 size = sizeof(*e) - UVSPAN_HTTP_CAPTURE + (((__u64)n + 7) & ~7ULL);
	if (size > sizeof(*e))
		size = sizeof(*e);
	emit(e, size);
}

/* llhttp_execute(parser, data, len): HTTP bytes reach a parser. A request
 * line starts a new cause (the request; on keep-alive connections one per
 * request), its bytes sent up for the method, path and trace context; a
 * status line is the response to an outgoing call; anything else continues
 * the parser's request. The 'request' handler runs inside this call. */
static __always_inline int http_parse(struct pt_regs *ctx)
{
	__u64 parser = PT_REGS_PARM1(ctx), data = PT_REGS_PARM2(ctx), len = PT_REGS_PARM3(ctx);
	/* The probe point is past llhttp_execute's `add %rsi,%rdx` (the first
	 * instruction the kernel can emulate is the jmp after it): the third
	 * register then holds data + len. A length is never a user address. */
	if (len >= data && data > 0xFFFFFFFF)
		len -= data;
	char head[8] = {};
	if (len < 5 || bpf_probe_read_user(head, sizeof(head), (void *)data))
		return 0;
	struct thread_state *t = thread_state_of(1);
	if (!t)
		return 0;
	struct conn_key key = { .pid = current_ids() >> 32, .ptr = parser };
	if (is_response(head)) {
		/* the stream's writer's cause, restored by uv__stream_io */
		emit_http(HTTP_RESPONSE, t->ctx.cause, t->ctx.stream, data, len, len, 1, 0);
		return 0;
	}
	if (is_request(head)) {
		__u64 cause = new_cause();
		bpf_map_update_elem(&parser_cause, &key, &cause, BPF_ANY);
		t->ctx.cause = cause;
		emit_http(HTTP_REQUEST, cause, t->ctx.stream, data, len, len, 1, 0);
		return 0;
	}
	__u64 *c = bpf_map_lookup_elem(&parser_cause, &key);
	if (c)
		t->ctx.cause = *c;
	return 0;
}

/* uv__stream_io(loop, w, events): a stream's callback is about to run; it
 * belongs to the cause of the stream's last write (or to none). */
static __always_inline int stream_io(struct pt_regs *ctx)
{
	__u64 stream = PT_REGS_PARM2(ctx) - STREAM_IO_OFF;
	struct conn_key key = { .pid = current_ids() >> 32, .ptr = stream };
	__u64 *c = bpf_map_lookup_elem(&stream_cause, &key);
	struct thread_state *t = thread_state_of(1);
	if (!t)
		return 0;
	t->ctx.stream = stream;
	t->ctx.cause = c ? *c : 0;
	return 0;
}

/* uv_try_write(stream, bufs, nbufs) / uv_write2(req, stream, bufs, nbufs,
 * ...): the cookie is the stream's argument index. Written while a cause is
 * current: the stream's replies belong to it, and the bytes (the response's
 * status line, an outgoing request with its traceparent) are sent up. */
static __always_inline int stream_write(struct pt_regs *ctx, __u64 cookie)
{
	struct args args;
	read_args(ctx, &args, 0);
	__u32 i = cookie & 3;
	__u64 stream = args.v[i];
	__u64 bufs = args.v[(i + 1) & 7];
	__u32 nbufs = args.v[(i + 2) & 7];
	struct conn_key key = { .pid = current_ids() >> 32, .ptr = stream };
	__u64 cause = current_cause();
	if (!cause) {
		bpf_map_delete_elem(&stream_cause, &key);
		return 0;
	}
	bpf_map_update_elem(&stream_cause, &key, &cause, BPF_ANY);
	/* struct uv_buf_t { char *base; size_t len; } */
	__u64 total = 0, first = 0, first_len = 0;
	for (int b = 0; b < UVSPAN_WRITE_BUFS; b++) {
		if (b >= nbufs)
			break;
		__u64 buf[2] = {};
		bpf_probe_read_user(buf, sizeof(buf), (void *)(bufs + b * 16));
		if (b == 0) {
			first = buf[0];
			first_len = buf[1];
		}
		total += buf[1];
	}
	char head[8] = {};
	bpf_probe_read_user(head, sizeof(head), (void *)first);
	/* Only a head (status line, request line) is worth its bytes. */
	emit_http(HTTP_WRITE, cause, stream, first, first_len, total, is_response(head) || is_request(head), 0);
	return 0;
}

/* uv_tcp_connect(req, handle, addr, cb): an outgoing connection made under
 * a cause; its connect callback (where Node writes the request) and its
 * replies belong to it. */
static __always_inline int stream_connect(struct pt_regs *ctx)
{
	__u64 cause = current_cause();
	if (!cause)
		return 0;
	struct conn_key key = { .pid = current_ids() >> 32, .ptr = PT_REGS_PARM2(ctx) };
	bpf_map_update_elem(&stream_cause, &key, &cause, BPF_ANY);
	return 0;
}

/* SSL_write(ssl, buf, num): the plaintext of a TLS write (the stream then
 * only sees ciphertext). */
static __always_inline int tls_write(struct pt_regs *ctx)
{
	__u64 cause = current_cause();
	if (!cause)
		return 0;
	__u64 buf = PT_REGS_PARM2(ctx);
	__u64 len = (int)PT_REGS_PARM3(ctx);
	char head[8] = {};
	bpf_probe_read_user(head, sizeof(head), (void *)buf);
	emit_http(HTTP_WRITE, cause, PT_REGS_PARM1(ctx), buf, len, len, is_response(head) || is_request(head), 1);
	return 0;
}

/* node's timers and immediates run (Environment::RunTimers,
 * CheckImmediate): all due JS timers in one scope, so none of them can be
 * told apart per request: they belong to no cause. */
static __always_inline int cause_clear(struct pt_regs *ctx)
{
	struct thread_state *t = thread_state_of(0);
	if (t) {
		t->ctx.cause = 0;
		t->ctx.stream = 0;
	}
	return 0;
}

/* ---- the uprobe entry point ----
 * One program serves every libuv attach point: the cookie's top byte says
 * which handler (enum probe_kind), the rest is the handler's own cookie.
 * It exists twice only because multi-uprobe links (one link per image,
 * cheap to attach and detach) need their own program type; uv_single is the
 * fallback for kernels without them (< 6.6). */
/* Links attached for every process of a file (--all, cgroups, forks of a
 * traced command) fire in processes not traced: those are filtered here. */
static __always_inline int for_traced(__u64 cookie)
{
	return (cookie & (1ULL << COOKIE_ONE_PROCESS_SHIFT)) || is_traced(current_ids() >> 32);
}

static __always_inline int dispatch(struct pt_regs *ctx)
{
	if (trap_only)
		return 0;
	__u64 cookie = bpf_get_attach_cookie(ctx);
	if (!for_traced(cookie))
		return 0;
	switch (cookie >> COOKIE_KIND_SHIFT) {
	case PROBE_FS_SUBMIT: fs_submit(ctx, cookie); return 0;
	case PROBE_FS_WORK: return fs_work(ctx, cookie);
	case PROBE_FS_DONE: return fs_done(ctx, cookie);
	case PROBE_FS_CLEANUP: return fs_cleanup(ctx, cookie);
	case PROBE_WORK_END: return work_end(ctx, cookie);
	case PROBE_DNS_SUBMIT: return dns_submit(ctx, cookie);
	case PROBE_DNS_WORK: return dns_work(ctx, cookie);
	case PROBE_DNS_DONE: return dns_done(ctx, cookie);
	case PROBE_LOOP_PHASE: return loop_phase(ctx, cookie);
	case PROBE_DNS_WORK_LIBC: return dns_work_libc(ctx, cookie);
	case PROBE_DNS_FREE: return dns_free(ctx, cookie);
	case PROBE_LOOP_RUN: return loop_run(ctx, cookie);
	case PROBE_HTTP_PARSE: return http_parse(ctx);
	case PROBE_STREAM_IO: return stream_io(ctx);
	case PROBE_STREAM_WRITE: return stream_write(ctx, cookie);
	case PROBE_TLS_WRITE: return tls_write(ctx);
	case PROBE_CAUSE_CLEAR: return cause_clear(ctx);
	case PROBE_STREAM_CONNECT: return stream_connect(ctx);
	}
	return 0;
}

SEC("uprobe.multi")
int uv_multi(struct pt_regs *ctx) { return dispatch(ctx); }

SEC("uprobe")
int uv_single(struct pt_regs *ctx) { return dispatch(ctx); }

/* Session uprobes (Linux >= 6.13) on the uv_fs_* submit functions: the
 * entry records the call; returning 0 asks the kernel for the function's
 * return too, which only sync calls do (their end, exact). Async requests
 * return 1: no return trap. The session cookie carries the request from
 * entry to return. The same program serves libc's epoll waits (see
 * epoll_wait_probe; it is defined after them). User space loads this
 * program only where the kernel has session uprobes, so the weak kfuncs
 * are always there when it runs. */
extern _Bool bpf_session_is_return(void) __ksym __weak;
extern __u64 *bpf_session_cookie(void) __ksym __weak;

/* ---- the loop thread's epoll waits ----
 * Three ways in, none needing tracefs:
 * - fentry/fexit on the x86_64 entry points __x64_sys_epoll_{wait,pwait,
 *   pwait2}: BPF trampolines, only the epoll calls pay;
 * - for kernels that refuse trampoline programs (lockdown refuses them with
 *   EPERM), a session uprobe on the traced process's libc epoll_wait and
 *   epoll_pwait (epoll_wait_probe): only that process's waits pay, two
 *   traps each on a loop thread;
 * - where neither fits (no session uprobes; a process whose libc was not
 *   found; `-- COMMAND`, whose descendants start after attach): BTF raw
 *   tracepoints on system call entry and exit. Every system call on the
 *   host then takes the traced slow path and runs these programs; anything
 *   but the three epoll waits returns at the first comparison, and
 *   processes whose waits the uprobes see at the second.
 * The syscall's own arguments are in the pt_regs it was given; the 4th (the
 * timeout) is in r10. regs is a BTF pointer: its fields are read directly
 * (no helper call). */
#define NR_EPOLL_WAIT 232
#define NR_EPOLL_PWAIT 281
#define NR_EPOLL_PWAIT2 441

struct pt_regs___k {
	unsigned long r10;
	unsigned long orig_ax;
} __attribute__((preserve_access_index));

/* A traced loop thread's epoll wait returned `ret` (`known`: 0 for a wait
 * whose return was not trapped, taken as returning when it started). */
static __always_inline void wait_done(struct loop_state *st, __u64 now, long ret, int known)
{
	/* The I/O callbacks that follow set their own cause (or none). */
	set_cause(0);
	st->ev.poll_wait_ns += now - st->epoll_enter;
	st->last_poll_empty = st->poll_timeout_zero && (!known || ret == 0);
	st->last_exit_ns = now;
	if (!st->wake_frozen) {
		st->ev.wake_ns = now;
		st->wake_frozen = known && ret > 0;
	}
	st->epoll_enter = 0;
}

/* An epoll wait starts on a thread; 1 if its end is wanted (a traced loop
 * thread's wait that can block). `by_uprobe`: seen by the libc uprobe, not by the
 * system call programs (which leave processes with such probes alone). */
static __always_inline int epoll_enter(int timeout_zero, int by_uprobe)
{
	if (trap_only)
		return 0;
	__u64 id = current_ids();
	__u32 pid = id >> 32, tid = (__u32)id;
	__u8 *flags = bpf_map_lookup_elem(&traced, &pid);
	if (!flags || (!by_uprobe && (*flags & TRACED_WAITS_BY_UPROBE)))
		return 0;
	struct loop_state *st = bpf_map_lookup_elem(&loops, &tid);
	if (!st && (*flags & TRACED_EPOLL_ONLY)) {
		/* A process already running when it was attached: its threads
		 * entered uv_run long ago, so the fallback probe never fired. */
		st = loop_state_of(pid, tid);
		if (st) {
			st->epoll_only = 1;
			st->ev.epoll_only = 1;
		}
	}
	if (!st)
		return 0;
	end_pending_sync();
	__u64 now = bpf_ktime_get_ns();
	if (st->epoll_only) {
		/* libuv with idle-time metrics (Node) first polls with timeout 0;
		 * a blocking wait right after an empty one belongs to the same
		 * iteration (libuv makes no second timeout-0 wait after an empty
		 * one: a timeout-0 wait always starts an iteration). */
		if (!st->last_poll_empty || timeout_zero || now - st->last_exit_ns > SAME_POLL_GAP_NS)
			loop_enter_phase(st, PHASE_POLL, now);
		st->poll_timeout_zero = timeout_zero;
	}
	if (st->cur_phase != PHASE_POLL)
		return 0;
	st->epoll_enter = now;
	if (by_uprobe && timeout_zero) {
		/* A wait that cannot block is not worth its return trap: it ends
		 * as it starts (its few microseconds count as busy). Whether it
		 * found events is told by what follows: a blocking wait within
		 * the gap means it found none. */
		wait_done(st, now, 0, 0);
		return 0;
	}
	return 1;
}

/* The loop woke up when an epoll wait returned events (or, if none did, when
 * the last one returned: a timeout). libuv with idle-time metrics (Node)
 * first polls with timeout 0, so the first return is not the wake-up. */
static __always_inline int epoll_exit(long ret, int by_uprobe)
{
	if (trap_only)
		return 0;
	__u64 id = current_ids();
	__u32 pid = id >> 32, tid = (__u32)id;
	__u8 *flags = bpf_map_lookup_elem(&traced, &pid);
	if (!flags || (!by_uprobe && (*flags & TRACED_WAITS_BY_UPROBE)))
		return 0;
	struct loop_state *st = bpf_map_lookup_elem(&loops, &tid);
	if (!st || !st->epoll_enter || st->cur_phase != PHASE_POLL)
		return 0;
	wait_done(st, bpf_ktime_get_ns(), ret, 1);
	return 0;
}

/* Whether the wait does not block: epoll_wait / epoll_pwait take a timeout
 * in ms, epoll_pwait2 a struct __kernel_timespec pointer (NULL: forever). */
static __always_inline int timespec_zero(unsigned long t)
{
	long long ts[2] = { 1, 1 };
	if (!t || bpf_probe_read_user(ts, sizeof(ts), (void *)t))
		return 0;
	return ts[0] == 0 && ts[1] == 0;
}

static __always_inline int epoll_timeout_zero(struct pt_regs___k *regs, long nr)
{
	unsigned long t = regs->r10;
	return nr == NR_EPOLL_PWAIT2 ? timespec_zero(t) : (int)t == 0;
}

static __always_inline int is_epoll_wait(long nr)
{
	return nr == NR_EPOLL_WAIT || nr == NR_EPOLL_PWAIT || nr == NR_EPOLL_PWAIT2;
}

SEC("fentry/__x64_sys_epoll_wait")
int BPF_PROG(fentry_epoll_wait, struct pt_regs___k *regs) { return epoll_enter(epoll_timeout_zero(regs, NR_EPOLL_WAIT), 0); }
SEC("fexit/__x64_sys_epoll_wait")
int BPF_PROG(fexit_epoll_wait, struct pt_regs___k *regs, long ret) { return epoll_exit(ret, 0); }
SEC("fentry/__x64_sys_epoll_pwait")
int BPF_PROG(fentry_epoll_pwait, struct pt_regs___k *regs) { return epoll_enter(epoll_timeout_zero(regs, NR_EPOLL_PWAIT), 0); }
SEC("fexit/__x64_sys_epoll_pwait")
int BPF_PROG(fexit_epoll_pwait, struct pt_regs___k *regs, long ret) { return epoll_exit(ret, 0); }
SEC("fentry/__x64_sys_epoll_pwait2")
int BPF_PROG(fentry_epoll_pwait2, struct pt_regs___k *regs) { return epoll_enter(epoll_timeout_zero(regs, NR_EPOLL_PWAIT2), 0); }
SEC("fexit/__x64_sys_epoll_pwait2")
int BPF_PROG(fexit_epoll_pwait2, struct pt_regs___k *regs, long ret) { return epoll_exit(ret, 0); }

SEC("tp_btf/sys_enter")
int BPF_PROG(syscall_enter, struct pt_regs___k *regs, long nr)
{
	if (!is_epoll_wait(nr))
		return 0;
	return epoll_enter(epoll_timeout_zero(regs, nr), 0);
}

SEC("tp_btf/sys_exit")
int BPF_PROG(syscall_exit, struct pt_regs___k *regs, long ret)
{
	if (!is_epoll_wait(regs->orig_ax))
		return 0;
	return epoll_exit(ret, 0);
}

/* libc's epoll_wait / epoll_pwait (session uprobe, one per traced process):
 * the entry starts the wait; the return probe is asked for only when the
 * wait can block on a traced loop thread (other threads, and waits with
 * timeout 0, pay one trap, not two).
 * glibc's x86_64 wrappers each make their own system call: one wait is
 * one entry. Arguments: (epfd, events, maxevents, timeout, ...). */
static __always_inline int libc_wait_timeout_zero(struct pt_regs *ctx, __u64 cookie)
{
	unsigned long t = PT_REGS_PARM4(ctx);
	return (cookie & 1) ? timespec_zero(t) : (int)t == 0;
}

static __always_inline int epoll_wait_probe(struct pt_regs *ctx, __u64 cookie)
{
	if (bpf_session_is_return())
		return epoll_exit((int)PT_REGS_RC(ctx), 1);
	return !epoll_enter(libc_wait_timeout_zero(ctx, cookie), 1);
}

SEC("uprobe.session")
int uv_session(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	int epoll = cookie >> COOKIE_KIND_SHIFT == PROBE_EPOLL_WAIT;
	/* The benchmark's trap floor: an epoll wait that can block traps at
	 * its return too, so it does here. */
	if (trap_only)
		return !epoll || libc_wait_timeout_zero(ctx, cookie);
	if (epoll)
		return epoll_wait_probe(ctx, cookie);
	__u64 *req = bpf_session_cookie();
	if (!req)
		return 1;
	if (bpf_session_is_return())
		return fs_sync_return(*req);
	if (!for_traced(cookie) || !fs_submit(ctx, cookie))
		return 1;
	*req = PT_REGS_PARM2(ctx);
	return 0;
}

/* ---- --stacks: the loop thread's stack while an iteration is slow ----
 * A CPU-clock perf event per CPU (user space opens them with the first
 * traced process) runs this at ~1 kHz on whatever runs there. A sample is
 * kept only on a traced loop thread whose iteration in progress has already
 * been busy for the loop threshold: otherwise one map lookup and out. The frame-pointer chain is
 * walked here (V8's JIT code keeps frame pointers); user space names the
 * frames (ELF symbols, V8 heap objects) while the process still runs. */
struct pt_regs___s {
	unsigned long ip;
	unsigned long sp;
	unsigned long bp;
} __attribute__((preserve_access_index));

SEC("perf_event")
int loop_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = current_ids();
	__u32 tid = (__u32)id;
	struct loop_state *st = bpf_map_lookup_elem(&loops, &tid);
	/* The event is per CPU: whatever runs here. Loop threads of traced
	 * processes only (a stale entry's tid may belong to another process). */
	if (!st || !st->ev.start_ns || !is_traced(id >> 32))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 idle = st->ev.poll_wait_ns;
	if (st->epoll_enter)
		idle += now - st->epoll_enter;
	__u64 total = now - st->ev.start_ns;
	if (total < idle + loop_threshold_ns)
		return 0;
	if (st->samples >= UVSPAN_STACK_SAMPLES_MAX)
		return 0;
	/* The user registers, also when the sample hit kernel code (a syscall,
	 * a page fault): the ones saved at kernel entry. */
	struct pt_regs___s *regs = (struct pt_regs___s *)bpf_task_pt_regs(bpf_get_current_task_btf());
	if (!regs)
		return 0;
	struct stack_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		stat_inc(STAT_RINGBUF_LOST);
		return 0;
	}
	st->samples++;
	e->hdr.kind = EV_STACK;
	e->hdr.pid = id >> 32;
	e->hdr.tid = tid;
	e->hdr._pad = 0;
	e->iter_start_ns = st->ev.start_ns;
	e->ts_ns = now;
	e->sp = BPF_CORE_READ(regs, sp);
	e->req = 0;
	e->_pad = 0;
	walk_user_stack(e, BPF_CORE_READ(regs, ip), BPF_CORE_READ(regs, bp));
	stat_inc(STAT_STACK_SAMPLES);
	/* The frames are named from the live process (V8's heap, its maps):
	 * wake the reader at the first sample of a slow iteration and every 32
	 * after, while the loop is still blocked, not at its next tick — a
	 * process that exits right after would leave them unnamed. */
	bpf_ringbuf_submit(e, (st->samples & 31) == 1 ? BPF_RB_FORCE_WAKEUP : wake_flags_after(sizeof(*e)));
	return 0;
}

/* ---- process lifecycle ---- */
static __always_inline void emit_proc(__u32 kind, __u32 pid, __u32 tid, __u32 ppid, __u32 fast)
{
	struct proc_event ev = {};
	ev.hdr.kind = kind;
	ev.hdr.pid = pid;
	ev.hdr.tid = tid;
	ev.ppid = ppid;
	ev.fast_iterations = fast;
	ev.ts_ns = bpf_ktime_get_ns();
	emit_flags(&ev, sizeof(ev), BPF_RB_FORCE_WAKEUP);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(proc_fork, struct task_struct *parent, struct task_struct *child)
{
	if (!follow_forks)
		return 0;
	__u32 ppid = task_ids(parent) >> 32;
	__u64 child_ids = task_ids(child);
	__u32 cpid = child_ids >> 32;
	if (ppid == cpid || !cpid || !is_traced(ppid))
		return 0;
	/* the child inherits how its parent is traced, but not its parent's
	 * libc uprobes (attached for the parent alone) */
	__u8 *flags = bpf_map_lookup_elem(&traced, &ppid);
	__u8 f = (flags ? *flags : TRACED) & ~TRACED_WAITS_BY_UPROBE;
	bpf_map_update_elem(&traced, &cpid, &f, BPF_ANY);
	emit_proc(EV_PROC_FORK, cpid, (__u32)child_ids, ppid, 0);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(proc_exec, struct task_struct *p)
{
	__u64 id = current_ids();
	__u32 pid = id >> 32;
	/* pid 0: a process uvspan's PID namespace does not see */
	if (!pid || (!discover && !is_traced(pid)))
		return 0;
	emit_proc(EV_PROC_EXEC, pid, (__u32)id, 0, 0);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(proc_exit, struct task_struct *p)
{
	__u64 id = current_ids();
	__u32 pid = id >> 32, tid = (__u32)id;
	/* A sync call still waiting for the thread's next libuv call (END_NEXT)
	 * has returned: end it now, before its storage goes with the thread. */
	end_pending_sync();
	/* The main thread's fast iterations after its last record, for the exit
	 * record (uvspan run's per-process iteration count). */
	struct loop_state *st = bpf_map_lookup_elem(&loops, &tid);
	__u32 fast = st ? (__u32)st->ev.skipped : 0;
	/* Per-thread state goes whatever the order of exits: in exit_group the
	 * main thread may exit (and leave the traced set) before the others. */
	bpf_map_delete_elem(&loops, &tid);
	bpf_map_delete_elem(&worker_jobs, &tid);
	if (pid != tid || !is_traced(pid))
		return 0;
	bpf_map_delete_elem(&traced, &pid);
	emit_proc(EV_PROC_EXIT, pid, tid, 0, fast);
	return 0;
}
