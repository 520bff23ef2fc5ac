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
 *
 * This file is the one compilation unit (one object, one skeleton); the
 * families it is made of are headers it includes:
 *   common.h  settings, kernel types (CO-RE), helpers every family uses
 *   maps.h    every map and what its entries hold
 *   ops.h     what the operation families share: the thread's state, the
 *             request context (cause), the end of a threadpool job
 *   fs.h      fs requests (sync and async)
 *   dns.h     DNS lookups
 *   loop.h    loop iterations and their phases
 *   epoll.h   the loop thread's epoll waits (fentry/fexit, libc session
 *             uprobe, raw syscall tracepoints)
 *   http.h    request context: HTTP heads, writes, a stream's cause
 *   h2.h      request context of HTTP/2 server streams (nghttp2 callbacks)
 *   stacks.h  --stacks: the loop thread's stack sampler, submit stacks
 *   gc.h      V8 garbage collections
 *   procs.h   process lifecycle (fork, exec, exit)
 * Here: the one uprobe dispatcher and the session uprobe program.
 */
#include "common.h"
#include "maps.h"
#include "ops.h"
#include "stacks.h"
#include "fs.h"
#include "dns.h"
#include "batch.h"
#include "loop.h"
#include "epoll.h"
#include "http.h"
#include "ports.h"
#include "gc.h"
#include "h2.h"
#include "procs.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The uprobe entry point: one program serves every libuv attach point. The
 * cookie's top byte says which handler (enum probe_kind), the rest is the
 * handler's own cookie. It exists twice only because multi-uprobe links (one
 * link per image, cheap to attach and detach) need their own program type;
 * uv_single is the fallback for kernels without them (< 6.6). */

/* Links attached for every process of a file (--all, cgroups, forks of a
 * traced command) fire in processes not traced: those are filtered here. */
static __always_inline int for_traced(__u64 cookie)
{
	return (cookie & (1ULL << COOKIE_ONE_PROCESS_SHIFT)) || is_traced(current_ids() >> 32);
}

/* Benchmark only: one more hit at this attach point (of a traced process:
 * links attached for every process of a file fire in others too). With
 * time_hits, only a session program's returns: bench_leave counts the
 * entries. */
static __always_inline void count_hit(__u64 cookie, int is_return)
{
	__u64 key = (cookie & ~(1ULL << COOKIE_ONE_PROCESS_SHIFT)) | (is_return ? HIT_RETURN : 0);
	__u64 *n = bpf_map_lookup_elem(&hit_counts, &key);
	if (n) {
		__sync_fetch_and_add(n, 1);
	} else {
		__u64 one = 1;
		bpf_map_update_elem(&hit_counts, &key, &one, BPF_NOEXIST);
	}
}

/* Benchmark only (UVSPAN_BENCH_TIME_HITS=1): attached to the same points
 * and cookies as uv_multi and uv_session, so that the kernel runs
 * bench_enter just before uvspan's program at a hit and bench_leave just
 * after it (a uprobe runs its newest consumer first: user space attaches
 * bench_leave, then uvspan's, then bench_enter). The time between the
 * two is the program's, with one program's entry and exit. Entries only
 * (a session program's returns are not timed). bench_leave also counts
 * every entry hit it sees (timed or not: hit_time), in place of
 * count_hit. */
SEC("uprobe.multi")
int bench_enter(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	if (!for_traced(cookie))
		return 0;
	struct hit_stamp *s = bpf_task_storage_get(&hit_stamps, bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!s)
		return 0;
	s->cookie = cookie;
	s->ts = bpf_ktime_get_ns();
	return 0;
}

SEC("uprobe.multi")
int bench_leave(struct pt_regs *ctx)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 cookie = bpf_get_attach_cookie(ctx);
	if (!for_traced(cookie))
		return 0;
	__u64 key = cookie & ~(1ULL << COOKIE_ONE_PROCESS_SHIFT);
	struct hit_time *h = bpf_map_lookup_elem(&hit_times, &key);
	if (!h) {
		struct hit_time zero = {};
		bpf_map_update_elem(&hit_times, &key, &zero, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&hit_times, &key);
		if (!h)
			return 0;
	}
	struct hit_stamp *s = bpf_task_storage_get(&hit_stamps, bpf_get_current_task_btf(), 0, 0);
	if (!s || s->cookie != cookie || !s->ts || now < s->ts) {
		__sync_fetch_and_add(&h->unordered, 1);
		return 0;
	}
	__u64 d = now - s->ts;
	s->ts = 0;
	if (d > 1000000) {
		__sync_fetch_and_add(&h->outliers, 1);
		return 0;
	}
	__sync_fetch_and_add(&h->n, 1);
	__sync_fetch_and_add(&h->ns, d);
	return 0;
}

static long trap_spin_step(__u64 i, __u64 *until)
{
	return bpf_ktime_get_ns() >= *until;
}

/* The trap floor's optional BPF time (trap_spin_ns). */
static __always_inline void trap_spin(void)
{
	if (!trap_spin_ns)
		return;
	__u64 until = bpf_ktime_get_ns() + trap_spin_ns;
	bpf_loop(1 << 20, trap_spin_step, &until, 0);
}

/* The dispatcher's probe kinds in four groups, each a function of its
 * own (not inlined): every call chain below the dispatcher shares 512
 * bytes of stack, and one frame holding every handler's locals (272
 * bytes) left too little for the deepest chains (the kernel counts the
 * frames of global functions in them). */
static __noinline int dispatch_ops(struct pt_regs *ctx, __u64 cookie)
{
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
	}
	return 0;
}

static __noinline int dispatch_streams(struct pt_regs *ctx, __u64 cookie)
{
	switch (cookie >> COOKIE_KIND_SHIFT) {
	case PROBE_STREAM_IO: return stream_io(ctx);
	case PROBE_STREAM_WRITE: return stream_write(ctx, cookie);
	case PROBE_TLS_WRITE: return tls_write(ctx);
	case PROBE_CAUSE_CLEAR: return task_start(ctx, cookie);
	case PROBE_STREAM_CONNECT: return stream_connect(ctx);
	case PROBE_STREAM_READ: return stream_read(ctx);
	}
	return 0;
}

static __noinline int dispatch_h2(struct pt_regs *ctx, __u64 cookie)
{
	switch (cookie >> COOKIE_KIND_SHIFT) {
	case PROBE_H2_HEADER: return h2_header(ctx);
	/* without session uprobes: the stream's cause stays after the frame */
	case PROBE_H2_FRAME: { __u64 prev; h2_frame(ctx, &prev); return 0; }
	case PROBE_H2_DATA: { __u64 prev; h2_data(ctx, &prev); return 0; }
	case PROBE_H2_RESPONSE: return h2_response(ctx);
	case PROBE_H2_CLOSE: { __u64 prev; h2_close(ctx, &prev); return 0; }
	}
	return 0;
}

static __noinline int dispatch_rest(struct pt_regs *ctx, __u64 cookie)
{
	switch (cookie >> COOKIE_KIND_SHIFT) {
	case PROBE_GC: return gc_callbacks(ctx, cookie);
	case PROBE_WORK_BATCH: return work_batch(ctx, cookie);
	case PROBE_QUEUE_WORK: return queue_work(ctx);
	case PROBE_QUEUE_WORK_RUN: return queued_work_runs(ctx);
	case PROBE_PORT_POST: return port_post(ctx);
	case PROBE_PORT_RECEIVE: return port_receive(ctx);
	case PROBE_SPAWN: return spawn(ctx);
	case PROBE_PROCESS_EXIT: return process_exit(ctx);
	}
	return 0;
}

static __always_inline int dispatch(struct pt_regs *ctx)
{
	if (trap_only) {
		trap_spin();
		return 0;
	}
	/* --sample-time: attached, but the window is not open (yet, or any
	 * more): see window_closed. */
	if (sampling && window_closed)
		return 0;
	__u64 cookie = bpf_get_attach_cookie(ctx);
	if (!for_traced(cookie))
		return 0;
	if (count_hits && !time_hits)
		count_hit(cookie, 0);
	switch (cookie >> COOKIE_KIND_SHIFT) {
	case PROBE_FS_SUBMIT:
	case PROBE_FS_WORK:
	case PROBE_FS_DONE:
	case PROBE_FS_CLEANUP:
	case PROBE_WORK_END:
	case PROBE_DNS_SUBMIT:
	case PROBE_DNS_WORK:
	case PROBE_DNS_DONE:
	case PROBE_LOOP_PHASE:
	case PROBE_DNS_WORK_LIBC:
	case PROBE_DNS_FREE:
	case PROBE_LOOP_RUN:
		return dispatch_ops(ctx, cookie);
	case PROBE_STREAM_IO:
	case PROBE_STREAM_WRITE:
	case PROBE_TLS_WRITE:
	case PROBE_CAUSE_CLEAR:
	case PROBE_STREAM_CONNECT:
	case PROBE_STREAM_READ:
		return dispatch_streams(ctx, cookie);
	case PROBE_H2_HEADER:
	case PROBE_H2_FRAME:
	case PROBE_H2_DATA:
	case PROBE_H2_RESPONSE:
	case PROBE_H2_CLOSE:
		return dispatch_h2(ctx, cookie);
	case PROBE_HTTP_MESSAGE: return http_message(ctx);
	/* a session uprobe only (the stream id is its return value) */
	case PROBE_H2_SUBMIT: return 0;
	}
	return dispatch_rest(ctx, cookie);
}

SEC("uprobe.multi")
int uv_multi(struct pt_regs *ctx) { return dispatch(ctx); }

SEC("uprobe")
int uv_single(struct pt_regs *ctx) { return dispatch(ctx); }
/* Session uprobes (Linux >= 6.13) on the uv_fs_* submit functions: the
 * entry records the call; returning 0 asks the kernel for the function's
 * return too, which only sync calls do (their end, exact). Async requests
 * return 1: no return trap. The session cookie carries the request from
 * entry to return. The same program serves libc's epoll waits
 * (epoll_wait_probe, epoll.h), HTTP/2 frames and body pieces (h2_frame,
 * h2_data, h2.h: only a known stream's asks for its return, where the
 * cause before it is put back; and a client stream's close), and outgoing
 * HTTP/2 streams (h2_submit: under a cause, its return gives the stream
 * id). */
SEC("uprobe.session")
int uv_session(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	int epoll = cookie >> COOKIE_KIND_SHIFT == PROBE_EPOLL_WAIT;
	if (count_hits && (!time_hits || bpf_session_is_return()) && for_traced(cookie))
		count_hit(cookie, bpf_session_is_return());
	/* The benchmark's trap floor: an epoll wait that can block traps at
	 * its return too, so it does here. */
	if (trap_only) {
		if (!bpf_session_is_return())
			trap_spin();
		return !epoll || libc_wait_timeout_zero(ctx, cookie);
	}
	if (epoll)
		return epoll_wait_probe(ctx, cookie);
	__u64 *req = bpf_session_cookie();
	if (!req)
		return 1;
	__u64 kind = cookie >> COOKIE_KIND_SHIFT;
	if (kind == PROBE_H2_SUBMIT) {
		if (bpf_session_is_return())
			return h2_submit_return(ctx);
		if ((sampling && window_closed) || !for_traced(cookie))
			return 1;
		return !h2_submit(ctx);
	}
	if (kind == PROBE_H2_FRAME || kind == PROBE_H2_DATA || kind == PROBE_H2_CLOSE) {
		if (bpf_session_is_return())
			return h2_frame_return(*req);
		if ((sampling && window_closed) || !for_traced(cookie))
			return 1;
		if (kind == PROBE_H2_CLOSE)
			return !h2_close(ctx, req);
		return kind == PROBE_H2_FRAME ? !h2_frame(ctx, req) : !h2_data(ctx, req);
	}
	if (bpf_session_is_return())
		return fs_sync_return(*req);
	if ((sampling && window_closed) || !for_traced(cookie) || !fs_submit(ctx, cookie))
		return 1;
	*req = PT_REGS_PARM2(ctx);
	return 0;
}
