/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Finished threadpool jobs, a batch at a time: one probe hit where
 * uv__work_done has moved the loop's queue of finished jobs (loop->wq) to
 * a queue on its own stack, still under the queue's lock (the call of
 * uv_mutex_unlock: symbols::point::work_batch), instead of one per job at
 * uv__fs_done and uv__getaddrinfo_done. Each fs and DNS job in it ends
 * there, as it did at its own done function; libuv runs their callbacks
 * next, in queue order, and the cause of each is kept with its queue node
 * so that work started in a callback finds its cause (thread_cause, ops.h).
 */
#ifndef UVSPAN_BATCH_H
#define UVSPAN_BATCH_H

#include "dns.h"
#include "fs.h"

/* A job queued with uv_queue_work (queue_work: its cause kept by its
 * node) ends: its callback runs under that cause; a job queued unseen
 * (uv_random, before the probes) is a task of its own, never the job's
 * before it. A global function: verified once. */
__attribute__((noinline)) int queued_job_cause(struct thread_state *ts, __u32 pid, __u64 job)
{
	if (!ts)
		return 0;
	struct conn_key k = { .pid = pid, .ptr = job };
	__u64 *c = bpf_map_lookup_elem(&work_cause, &k);
	if (c) {
		ts->ctx.cause = *c;
		bpf_map_delete_elem(&work_cause, &k);
	} else {
		ts->ctx.cause = new_task_cause(CAUSE_IO);
	}
	return 0;
}

/* uv_queue_work(loop, req, work_cb, after_work_cb): the job (req's
 * work_req) is queued under the thread's cause. */
static __always_inline int queue_work(struct pt_regs *ctx)
{
	__u64 cause = current_cause();
	if (!cause)
		return 0;
	struct conn_key k = { .pid = current_ids() >> 32, .ptr = PT_REGS_PARM2(ctx) + WORK_REQ_OFF };
	bpf_map_update_elem(&work_cause, &k, &cause, BPF_ANY);
	return 0;
}

/* uv__queue_work(w): a uv_queue_work job's work runs on a threadpool
 * thread; what it does there (a sync fs call: node 24+'s fs.readFile)
 * is its queuing cause's, or no one's. */
static __always_inline int queued_work_runs(struct pt_regs *ctx)
{
	struct conn_key k = { .pid = current_ids() >> 32, .ptr = PT_REGS_PARM1(ctx) };
	__u64 *c = bpf_map_lookup_elem(&work_cause, &k);
	/* not published: a threadpool thread's cause stays after its job */
	struct thread_state *t = requests ? thread_state_of(c != 0) : 0;
	if (t) {
		t->ctx.cause = c ? *c : 0;
		t->batch.n = 0;
	}
	return 0;
}

struct batch_walk {
	__u64 head;     /* the stack queue's head */
	__u64 q;        /* the next job's node */
	__u64 fs_done;  /* uv__fs_done's address in this process */
	__u64 dns_done; /* uv__getaddrinfo_done's, or 0 */
	struct thread_state *ts; /* the loop thread's (requests), else NULL */
	struct job_bytes *jb;    /* this CPU's job_buf, else NULL */
	__u32 pid;
	__u32 n;        /* jobs walked */
};

/* A signed field of the cookie. */
static __always_inline __s64 batch_field(__u64 cookie, __u32 shift, __u32 bits)
{
	return (__s64)(cookie << (64 - shift - bits)) >> (64 - bits);
}

static long batch_job(__u64 i, struct batch_walk *b)
{
	__u64 q = b->q;
	if (q == b->head || !q)
		return 1;
	/* struct uv__work { work, done, loop, wq { next, prev } }: in one
	 * read with an fs request's fields before it (job_buf), else alone */
	__u64 w[4] = {};
	struct job_bytes *jb = b->jb;
	int have = jb && !bpf_probe_read_user(jb->w, sizeof(jb->w), (void *)(q - WORK_WQ_OFF - FS_WORK_OFF + FS_RESULT_OFF));
	if (have)
		__builtin_memcpy(w, &jb->w[(FS_WORK_OFF - FS_RESULT_OFF) / 8], sizeof(w));
	else if (bpf_probe_read_user(w, sizeof(w), (void *)(q - WORK_WQ_OFF)))
		return 1;
	b->q = w[3];
	b->n = i + 1;
	__u64 job = q - WORK_WQ_OFF;
	if (w[1] == b->fs_done)
		fs_job_end(b->ts, b->pid, job - FS_WORK_OFF, END_DONE, have ? jb : 0);
	else if (b->dns_done && w[1] == b->dns_done)
		/* a finished job's work is NULL; a cancelled one's uv__cancelled */
		dns_done_of(b->pid, job - GAI_WORK_OFF, w[0] ? -125 /* UV_ECANCELED */ : 0);
	else if (b->ts)
		/* another job (uv_queue_work: crypto, zlib, addons; uv_random...) */
		queued_job_cause(b->ts, b->pid, job);
	struct thread_state *ts = b->ts;
	if (ts && i < UVSPAN_BATCH) {
		ts->batch.q[i & (UVSPAN_BATCH - 1)] = q;
		ts->batch.cause[i & (UVSPAN_BATCH - 1)] = ts->ctx.cause;
	}
	return 0;
}

/* The call of uv_mutex_unlock in uv__work_done(uv_async_t *): the jobs are
 * all in the stack queue, whose head is at %rbp or %rsp plus the cookie's
 * displacement. */
static __always_inline int work_batch(struct pt_regs *ctx, __u64 cookie)
{
	__u64 at = bpf_get_func_ip(ctx);
	__s64 disp = batch_field(cookie, BATCH_DISP_SHIFT, BATCH_DISP_BITS);
	/* both read (a context field at a variable offset is refused) */
	__u64 fp = PT_REGS_FP(ctx), sp = PT_REGS_SP(ctx);
	barrier_var(sp);
	__u64 base = (cookie >> BATCH_FRAME_SHIFT) & 1 ? fp : sp;
	__s64 dns = batch_field(cookie, BATCH_DNS_SHIFT, BATCH_FIELD_BITS);
	struct batch_walk b = {
		.head = base + disp,
		.fs_done = at + batch_field(cookie, 0, BATCH_FIELD_BITS),
		.dns_done = dns ? at + dns : 0,
		.pid = current_ids() >> 32,
	};
	if (bpf_probe_read_user(&b.q, sizeof(b.q), (void *)b.head) || b.q == b.head)
		return 0;
	/* Its callbacks run next: the thread's state keeps their causes. */
	struct thread_state *ts = requests ? thread_state_of(1) : 0;
	if (requests && !ts)
		return 0;
	b.ts = ts;
	/* its callbacks are another callback than the thread's last (http.h) */
	if (ts)
		ts->ctx.callbacks++;
	__u32 zero = 0;
	b.jb = bpf_map_lookup_elem(&job_buf, &zero);
	if (publish_ctx && ts)
		ts->ctx.walking = 1;
	bpf_loop(UVSPAN_BATCH_WALK, batch_job, &b, 0);
	if (b.q != b.head)
		stat_inc(STAT_BATCH_CUT);
	if (ts) {
		ts->batch.head = b.head;
		ts->batch.n = b.n < UVSPAN_BATCH ? b.n : UVSPAN_BATCH;
		ts->batch.more = b.n > UVSPAN_BATCH;
		ts->batch.hint = 0;
		ts->ctx.walking = 0;
		/* one job: its callback's cause; several: each callback's is
		 * known only when asked (thread_cause), none published */
		publish(ts, ts->batch.n == 1 && !ts->batch.more ? ts->batch.cause[0] : 0);
	}
	return 0;
}

#endif /* UVSPAN_BATCH_H */
