/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * What the operation families (fs, DNS, the loop, HTTP) share: the thread's
 * state (task-local storage: its sync fs call in progress, its request
 * context), the current cause, and the end of a threadpool job.
 */
#ifndef UVSPAN_OPS_H
#define UVSPAN_OPS_H

#include "common.h"

/* The thread's state (struct thread_state), created on first use when asked. */
static __always_inline struct thread_state *thread_state_of(int create)
{
	struct task_struct *task = bpf_get_current_task_btf();
	return bpf_task_storage_get(&threads, task, 0, create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
}

/* The request context.
 * A cause is a request uvspan saw start (llhttp begins one on a server
 * parser) or a task (a callback no request caused: a batch of timers or
 * immediates, the I/O callbacks after an epoll wait). Each thread has a
 * current cause; fs and DNS requests submitted while it is set carry it,
 * and their completion callbacks restore it, so chains of callbacks (and
 * the promise continuations Node drains before returning to libuv) keep
 * their request or task. None (0) before the loop's first wait: the
 * start-up. */
/* The small helpers below that test a load-time constant are global
 * functions, verified once (see current_ids in common.h). */

/* --sample-time: a cause made before this window opened (its ktime is in
 * its top bits, see cause_at) is stale: the thread's or a stream's cause
 * left from an earlier window, whose request uvspan dropped at that edge. */
__attribute__((noinline)) __u64 fresh_cause(__u64 cause)
{
	return sampling && (cause >> 8) < window_open_ns ? 0 : cause;
}

/* splitmix64 (its step and finalizer) of x. */
static __always_inline __u64 ctx_mix(__u64 x)
{
	__u64 z = x + 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* The ids of a request's trace and SERVER span when it came without a
 * traceparent (--publish-trace-context), from its cause c (without
 * CAUSE_DROP) and this run's key: the trace id's high 64 bits
 * splitmix64(c ^ key0), its low 64 bits splitmix64(c ^ key1)'s top 8 bits
 * and the sampler's 56 random bits (cause_random: splitmix64(c)'s low 56),
 * the span id splitmix64(high ^ key1), never 0. User space makes the same
 * (src/events/sampler.rs: ContextKey), so they are final here, at the
 * request's head. Big-endian, as W3C ids are written. */
static __always_inline void ctx_ids(__u64 cause, struct trace_ctx_v1 *v)
{
	__u64 c = cause & ~(__u64)CAUSE_DROP;
	__u64 hi = ctx_mix(c ^ ctx_key[0]);
	__u64 lo = (ctx_mix(c ^ ctx_key[1]) & ~((1ULL << 56) - 1)) | (ctx_mix(c) & ((1ULL << 56) - 1));
	__u64 span = ctx_mix(hi ^ ctx_key[1]);
	if (!span)
		span = 1;
	__u64 w[3] = { __builtin_bswap64(hi), __builtin_bswap64(lo), __builtin_bswap64(span) };
	__builtin_memcpy(v, w, sizeof(w));
}

/* --publish-trace-context: the thread runs `cause` now; traces_ctx_v1
 * holds its request's ids, or nothing for a task, a request whose trace is
 * not sampled (none of it is exported) or none. One map update (or delete)
 * when that changes, nothing when not. A global function: verified once. */
__attribute__((noinline)) int ctx_publish(struct thread_state *ts, __u64 cause)
{
	if (!ts || ts->ctx.walking)
		return 0;
	int request = cause && !((cause >> CAUSE_KIND_SHIFT) & CAUSE_KIND_MASK) && !(cause & CAUSE_DROP);
	__u64 want = request && !ctx_stop ? fresh_cause(cause) : 0;
	if (want == ts->ctx.published)
		return 0;
	ts->ctx.published = want;
	__u64 key = bpf_get_current_pid_tgid();
	if (!want) {
		bpf_map_delete_elem(&traces_ctx_v1, &key);
		return 0;
	}
	struct conn_key pk = { .pid = key >> 32, .ptr = want };
	struct trace_ctx_v1 v = {};
	struct trace_ctx_v1 *p = ctx_parents ? bpf_map_lookup_elem(&ctx_parent, &pk) : 0;
	if (p)
		v = *p;
	else
		ctx_ids(want, &v);
	bpf_map_update_elem(&traces_ctx_v1, &key, &v, BPF_ANY);
	if (!ts->ctx.ctx_noted) {
		__u8 one = 1;
		bpf_map_update_elem(&ctx_threads, &key, &one, BPF_ANY);
		ts->ctx.ctx_noted = 1;
	}
	return 0;
}

/* Where the thread's cause changes (off: removed at load). */
static __always_inline void publish(struct thread_state *ts, __u64 cause)
{
	if (publish_ctx)
		ctx_publish(ts, cause);
}

struct batch_find {
	__u64 next;
	__u32 found; /* the index of the job whose node is `next` (from 1) */
};

/* One job of the thread's batch (a bpf_loop callback: verified once, not
 * per job). */
static long batch_find_job(__u64 i, struct batch_find *f)
{
	struct thread_state *ts = thread_state_of(0);
	if (!ts || i == 0)
		return !ts;
	if (ts->batch.q[i & (UVSPAN_BATCH - 1)] != f->next)
		return 0;
	f->found = i;
	return 1;
}

/* The thread's cause now. While the callbacks of a batch of finished
 * threadpool jobs run (batch.h), the cause of the job whose callback runs:
 * libuv takes each job off the head of the queue on uv__work_done's stack
 * before its callback, so the queue's head is the job after it (the queue
 * empty: the last job's runs, or the batch is over). A head not among the
 * jobs kept is one past them (a batch of more than UVSPAN_BATCH: not
 * known), or the batch is over and its stack reused (the last job's cause
 * stays, as it did when each job's callback set it). A global function:
 * verified once. */
__attribute__((noinline)) __u64 thread_cause(struct thread_state *ts)
{
	if (!ts)
		return 0;
	__u32 n = ts->batch.n;
	if (!n || n > UVSPAN_BATCH)
		return ts->ctx.cause;
	/* One job: its callback's, whatever the queue's head is now (the
	 * batch is not over until another cause is put) */
	if (n == 1 && !ts->batch.more)
		return ts->batch.cause[0];
	__u64 head = ts->batch.head, next = head;
	bpf_probe_read_user(&next, sizeof(next), (void *)head);
	__u32 cur = n - 1;
	if (next != head) {
		/* Callbacks run in order: the job asked about last, or the one
		 * after it, is most often the one running. */
		__u32 h = ts->batch.hint & (UVSPAN_BATCH - 1);
		if (h + 1 < n && ts->batch.q[(h + 1) & (UVSPAN_BATCH - 1)] == next) {
			cur = h;
		} else if (h + 2 < n && ts->batch.q[(h + 2) & (UVSPAN_BATCH - 1)] == next) {
			cur = h + 1;
		} else {
			struct batch_find f = { .next = next, .found = n };
			bpf_loop(n < UVSPAN_BATCH ? n : UVSPAN_BATCH, batch_find_job, &f, 0);
			if (f.found < n)
				cur = f.found - 1;
			else if (ts->batch.more)
				return 0;
		}
	}
	ts->batch.hint = cur;
	return ts->batch.cause[cur & (UVSPAN_BATCH - 1)];
}

/* The thread's cause is this one now (a batch's, if any, is over). */
static __always_inline void cause_put(struct thread_state *ts, __u64 cause)
{
	ts->ctx.cause = cause;
	ts->batch.n = 0;
	publish(ts, cause);
}

/* A cause current for a while inside a callback (an HTTP/2 frame's
 * handlers: h2.h), the one before put back at its end (cause_leave): a
 * batch's callback, with the rest of its batch after it. */
static __always_inline void cause_enter(struct thread_state *ts, __u64 cause)
{
	ts->batch.paused = ts->batch.n;
	ts->batch.n = 0;
	ts->ctx.cause = cause;
	/* an HTTP/2 stream's: not published (its traceparent may come in a
	 * later header) */
	publish(ts, 0);
}

static __always_inline void cause_leave(struct thread_state *ts, __u64 prev)
{
	ts->ctx.cause = prev;
	ts->batch.n = ts->batch.paused;
	ts->batch.paused = 0;
	publish(ts, ts->batch.n ? 0 : prev);
}

__attribute__((noinline)) __u64 current_cause(void)
{
	if (!requests)
		return 0;
	struct thread_state *t = thread_state_of(0);
	return t ? fresh_cause(thread_cause(t)) : 0;
}

__attribute__((noinline)) int set_cause(__u64 cause)
{
	if (!requests)
		return 0;
	struct thread_state *t = thread_state_of(cause != 0);
	if (t)
		cause_put(t, cause);
	return 0;
}

/* The thread's cause, set where its state is already at hand. */
static __always_inline void put_cause(struct thread_state *ts, __u64 cause)
{
	if (!ts)
		set_cause(cause);
	else if (requests)
		cause_put(ts, cause);
}

/* Requests that start and end on one thread wait for their end in its
 * state (ops_local: thread_state.fs, .dns), each in one of a pair of
 * slots picked by a hash of its address (allocations are 16-byte
 * aligned). The pair's first, of `slots` (a power of two): */
static __always_inline __u32 slot_at(__u64 req, __u32 slots)
{
	return (((req >> 4) * 0x9E3779B97F4A7C15ULL) >> 58) & (slots - 2);
}

/* Of the pair at i, whose slots hold requests r0 and r1 (0: free): the
 * one holding `req`, else `none`. */
static __always_inline __u32 slot_holding(__u32 i, __u64 r0, __u64 r1, __u64 req, __u32 none)
{
	return r0 == req ? i : r1 == req ? i + 1 : none;
}

/* Where `req` waits in the pair at i: its own slot (its address submitted
 * again before its end was seen: counted), else a free one, else `none`
 * (both taken: it waits in the in-flight map). */
static __always_inline __u32 slot_for(__u32 i, __u64 r0, __u64 r1, __u64 req, __u32 none)
{
	__u32 j = slot_holding(i, r0, r1, req, none);
	if (j != none) {
		stat_inc(STAT_INFLIGHT_REPLACED);
		return j;
	}
	return !r0 ? i : !r1 ? i + 1 : none;
}

/* The thread exits: the requests still in its slots (ops_local) go with
 * its storage, counted as unfinished (user space sweeps those of
 * inflight_fs and inflight_dns at its process's exit). */
static __always_inline void slots_gone(void)
{
	struct thread_state *ts = ops_local ? thread_state_of(0) : 0;
	if (!ts)
		return;
	/* one count per slot: no sum whose every value the verifier follows */
	for (int i = 0; i < UVSPAN_FS_SLOTS; i++)
		if (ts->fs[i].req)
			stat_inc(STAT_OPS_UNFINISHED);
	for (int i = 0; i < UVSPAN_DNS_SLOTS; i++)
		if (ts->dns[i].req)
			stat_inc(STAT_OPS_UNFINISHED);
}

/* A new cause of `kind` (enum cause_kind): unique per request or task in
 * a process (time, then kind and CPU). */
static __always_inline __u64 cause_at(__u64 now, __u64 kind)
{
	return (now << 8) | (kind << CAUSE_KIND_SHIFT) | (bpf_get_smp_processor_id() & CAUSE_CPU_MASK);
}

static __always_inline __u64 new_cause(__u64 kind)
{
	return cause_at(bpf_ktime_get_ns(), kind);
}

/* The sampler's random number for a trace that starts with this cause:
 * 56 bits, splitmix64's finalizer of the cause (without CAUSE_DROP). User
 * space gives the trace it makes for the cause these low bits
 * (src/events/sampler.rs: cause_random), so a trace-id ratio decides the
 * same on both sides. */
static __always_inline __u64 cause_random(__u64 cause)
{
	__u64 z = (cause & ~(__u64)CAUSE_DROP) + 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return (z ^ (z >> 31)) & ((1ULL << 56) - 1);
}

/* A trace with no parent that starts with this cause, decided: marked
 * CAUSE_DROP when the sampler does not keep it. */
__attribute__((noinline)) __u64 sample_root(__u64 cause)
{
	return cause_random(cause) >= ksample_threshold ? cause : cause | CAUSE_DROP;
}

/* Not sampled: the cause's work sends no record (op_hist counts it). */
static __always_inline int dropped(__u64 cause)
{
	return cause & CAUSE_DROP;
}

/* A new task's cause (a trace of its own when tasks are sampled here). */
static __always_inline __u64 task_cause_at(__u64 now, __u64 kind)
{
	__u64 cause = cause_at(now, kind);
	return ksample_tasks ? sample_root(cause) : cause;
}

static __always_inline __u64 new_task_cause(__u64 kind)
{
	return task_cause_at(bpf_ktime_get_ns(), kind);
}

/* An operation of an unsampled trace: its duration in its process's
 * histogram for its attributes (no record); `what` is ver << 24 | family
 * << 16 | op_id << 8 | sync. Returns 0 when counted; else (the map full) it is lost
 * to the metrics, and counted (STAT_HIST_FULL). A global function: the verifier
 * checks it once, not in every path of the programs that call it. */
/* A histogram's first value, from .rodata (not built on the stack: its
 * 17 words would count against the 512 bytes every call chain shares). */
static const struct op_hist op_hist_zero = {};

__attribute__((noinline)) int op_hist_count(__u32 pid, __u32 what, int err, __u64 dur_ns)
{
	__u32 family = (what >> 16) & 0xFF;
	if (family >= HIST_FAMILIES)
		return -1;
	struct op_hist_key k = { .pid = pid, .family = family, .op_id = what >> 8, .sync = what & 1, .ver = what >> 24, .err = err };
	struct op_hist *h = bpf_map_lookup_elem(&op_hists, &k);
	if (!h) {
		bpf_map_update_elem(&op_hists, &k, &op_hist_zero, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&op_hists, &k);
		if (!h) {
			stat_inc(STAT_HIST_FULL);
			return -1;
		}
	}
	/* The bucket: how many bounds are below the value (without a branch
	 * per bound: bounds and durations stay below 2^62, so bound - value
	 * has its top bit set exactly when the value is over the bound). */
	__u32 i = 0;
	for (int b = 0; b < UVSPAN_HIST_BOUNDS; b++)
		i += (hist_bounds_ns[family][b] - dur_ns) >> 63;
	if (i > UVSPAN_HIST_BOUNDS)
		i = UVSPAN_HIST_BOUNDS;
	h->buckets[i] += 1;
	h->count += 1;
	h->sum_ns += dur_ns;
	if (family == HIST_FS || family == HIST_DNS)
		stat_inc(STAT_UNSAMPLED_OPS);
	else if (family == HIST_HTTP)
		stat_inc(STAT_UNSAMPLED_REQS);
	return 0;
}

static __always_inline int op_hist_add(__u32 pid, __u32 family, __u32 op_id, __u32 sync, int err, __u64 dur_ns)
{
	return op_hist_count(pid, family << 16 | (op_id & 0xFF) << 8 | (sync & 1), err, dur_ns);
}

/* An unsampled threadpool job's wait in libuv's queue (--detail
 * threadpool: its start was seen), counted as uvspan.threadpool.queue.duration
 * (op_id: the job's enum hist_family). */
static __always_inline void queue_hist_add(__u32 pid, __u8 family, __u64 start_ns, __u64 work_start_ns)
{
	if (work_start_ns)
		op_hist_add(pid, HIST_QUEUE, family, 0, 0, work_start_ns - start_ns);
}

/* A task's cause (not a request's): its writes are not sent up (no
 * CLIENT spans under tasks yet), only remembered for the replies. */
static __always_inline int is_task(__u64 cause)
{
	return (cause >> CAUSE_KIND_SHIFT) & CAUSE_KIND_MASK;
}

/* Tail exceptions (ktail): the work of an unsampled request (not a
 * task's) is read whole, as if sampled, and held with its request. */
static __always_inline int tail_wants(__u64 cause)
{
	return ktail && dropped(cause) && !is_task(cause);
}

/* Only counted: an unsampled trace's operation whose details (paths,
 * host) no span will need. */
static __always_inline int lean(__u64 cause)
{
	return dropped(cause) && !tail_wants(cause);
}

/* ktail: a record of an unsampled request, built in the scratch buffer
 * (`size` bytes; its end at end_ns, or 0), sent: marked held (HDR_HELD)
 * while the kernel follows its request (whose end says whether it goes
 * on: http_follow.h; end_ns is its last activity then), else
 * as any record (user space follows that request: handed over, or never
 * followed). Holding the bytes in user space costs the programs a ring
 * buffer write, no map; uvspan a copy, not a decode. A global function:
 * verified once. */
__attribute__((noinline)) int tail_hold(__u32 pid, __u64 cause, __u32 size, __u64 end_ns)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_buf, &zero);
	if (!s || size > sizeof(struct http_event))
		return 0;
	struct conn_key k = { .pid = pid, .ptr = cause };
	struct http_req *r = khttp ? bpf_map_lookup_elem(&http_reqs, &k) : 0;
	struct ev_header *h = (struct ev_header *)s;
	if (r) {
		h->flags = HDR_HELD;
		r->held = 1;
		/* its last activity, as http_work_end (one lookup for both) */
		if (r->last_ns < end_ns)
			r->last_ns = end_ns;
	}
	emit(s, size);
	h->flags = 0;
	return r != 0;
}

/* An unsampled operation ended: if its request is one the kernel follows
 * (http_follow.h), that request's last activity, where user space ends a
 * request not answered whole (at its last write or work). */
__attribute__((noinline)) int http_work_end(__u32 pid, __u64 cause, __u64 end_ns)
{
	if (!khttp || !cause || is_task(cause) || tail_wants(cause))
		return 0;
	struct conn_key k = { .pid = pid, .ptr = cause };
	struct http_req *r = bpf_map_lookup_elem(&http_reqs, &k);
	if (r && r->last_ns < end_ns)
		r->last_ns = end_ns;
	return 0;
}

/* A threadpool job ends: the worker wakes the loop (uv_async_send) right
 * after w->work(w). The job is an fs or DNS request (worker_jobs). */
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
		if (e && e->op.worker_tid == tid && !e->op.work_end_ns)
			e->op.work_end_ns = now;
	}
	bpf_map_delete_elem(&worker_jobs, &tid);
	return 0;
}

#endif /* UVSPAN_OPS_H */
