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
 * A cause is a request uvspan saw start (llhttp_execute on a server
 * parser) or a task (a callback no request caused: a batch of timers or
 * immediates, the I/O callbacks after an epoll wait). Each thread has a
 * current cause; fs and DNS requests submitted while it is set carry it,
 * and their completion callbacks restore it, so chains of callbacks (and
 * the promise continuations Node drains before returning to libuv) keep
 * their request or task. None (0) before the loop's first wait: the
 * start-up. */
/* --sample-time: a cause made before this window opened (its ktime is in
 * its top bits, see cause_at) is stale: the thread's or a stream's cause
 * left from an earlier window, whose request uvspan dropped at that edge. */
static __always_inline __u64 fresh_cause(__u64 cause)
{
	return sampling && (cause >> 8) < window_open_ns ? 0 : cause;
}

static __always_inline __u64 current_cause(void)
{
	if (!requests)
		return 0;
	struct thread_state *t = thread_state_of(0);
	return t ? fresh_cause(t->ctx.cause) : 0;
}

static __always_inline void set_cause(__u64 cause)
{
	if (!requests)
		return;
	struct thread_state *t = thread_state_of(cause != 0);
	if (t)
		t->ctx.cause = cause;
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

/* A task's cause (not a request's): its writes are not sent up (no
 * CLIENT spans under tasks yet), only remembered for the replies. */
static __always_inline int is_task(__u64 cause)
{
	return (cause >> CAUSE_KIND_SHIFT) & CAUSE_KIND_MASK;
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
