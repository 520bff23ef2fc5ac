/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * fs requests (uv_fs_*): one record per finished request.
 * Sync calls (cb == NULL) are per thread: their state lives in task-local
 * storage (no hash update, freed with the thread) and is filled in place.
 * Async requests keep a small record in inflight_fs, keyed by request; the
 * rest (fd, paths, result) is read from the request when it ends: libuv
 * keeps its own copy of an async request's paths until uv_fs_req_cleanup.
 */
#ifndef UVSPAN_FS_H
#define UVSPAN_FS_H

#include "ops.h"
#include "stacks.h"

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

static __always_inline struct sync_slot *sync_slot_of(int create)
{
	return (struct sync_slot *)thread_state_of(create);
}

/* An fs operation's histogram error attribute: the negative errno. */
static __always_inline int fs_err(long long result)
{
	return result < 0 ? (int)result : 0;
}

/* Ends the thread's sync call: result from the request, one record (or,
 * of an unsampled trace, a count in op_hist). */
static __always_inline void sync_finish(struct sync_slot *slot, __u8 end_kind)
{
	struct fs_event *e = &slot->ev;
	e->op.end_ns = bpf_ktime_get_ns();
	e->op.end_kind = end_kind;
	bpf_probe_read_user(&e->result, sizeof(e->result), (void *)(slot->req + FS_RESULT_OFF));
	if (dropped(e->op.cause)) {
		int lost = op_hist_add(e->op.hdr.pid, HIST_FS, e->op_id, 1, fs_err(e->result), e->op.end_ns - e->op.start_ns);
		http_work_end(e->op.hdr.pid, e->op.cause, e->op.end_ns);
		struct scratch *s = tail_wants(e->op.cause) ? get_scratch() : 0;
		if (s) {
			__builtin_memcpy(&s->fs, e, sizeof(*e));
			s->fs.op.flags = lost ? 0 : OP_COUNTED;
			tail_hold(e->op.hdr.pid, e->op.cause, fs_record_size(&s->fs), e->op.end_ns);
		}
		slot->req = 0;
		return;
	}
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
 * straddles a sampling window's edge. A global function: one copy of the
 * record's end for the places a pending call ends. */
__attribute__((noinline)) int sync_end(struct sync_slot *slot, __u32 end_kind)
{
	if (!slot)
		return 0;
	if (sync_straddles(slot)) {
		slot->req = 0;
		stat_inc(STAT_STRADDLED);
		return 0;
	}
	sync_finish(slot, end_kind);
	return 0;
}

/* Ends the thread's pending sync call, if any: a sync call has returned by
 * the time its thread does anything else in libuv (see sync_slot). */
static __always_inline void end_pending_sync(void)
{
	struct sync_slot *slot = sync_slot_of(0);
	if (slot && slot->req)
		sync_end(slot, END_NEXT);
}

/* The slot of `req` in this thread's fs slots, or UVSPAN_FS_SLOTS. */
static __always_inline __u32 fs_slot_of(struct thread_state *ts, __u64 req)
{
	__u32 i = slot_at(req, UVSPAN_FS_SLOTS);
	return slot_holding(i, ts->fs[i].req, ts->fs[i + 1].req, req, UVSPAN_FS_SLOTS);
}

/* Ends an async request: reads what it needs from the request, one record.
 * Its start is in its thread's state (ops_local) or in inflight_fs.
 * END_DONE: its result reaches the loop, its callback runs next. A global
 * function: verified once for uv__fs_done, the batches and
 * uv_fs_req_cleanup. `here`: the thread's state where the caller has it
 * (else looked up); `jb`: the request's fields as the batch walk read them
 * (job_buf), else NULL (read here). */
__attribute__((noinline)) int fs_job_end(struct thread_state *here, __u32 pid, __u64 req, __u32 end_kind, struct job_bytes *jb)
{
	struct req_key key = { .pid = pid, .req = req };
	struct thread_state *ts = here ? here : ops_local ? thread_state_of(0) : 0;
	struct fs_async a;
	__u32 j = ts && ops_local ? fs_slot_of(ts, req) : UVSPAN_FS_SLOTS;
	if (ts && j < UVSPAN_FS_SLOTS) {
		a = ts->fs[j].a;
		ts->fs[j].req = 0;
	} else {
		struct fs_async *p = bpf_map_lookup_elem(&inflight_fs, &key);
		if (!p) {
			/* Its start fell before this sampling window. (Without
			 * uv__fs_done, uv_fs_req_cleanup ends async requests and also
			 * sees every sync one: not counted there.) */
			if (sampling && end_kind == END_DONE) {
				stat_inc(STAT_STRADDLED);
				/* Its callback runs next, for a request not known. */
				set_cause(0);
			}
			return 0;
		}
		a = *p;
		bpf_map_delete_elem(&inflight_fs, &key);
	}
	__u64 now = bpf_ktime_get_ns();
	__u16 flags = 0;
	if (dropped(a.cause)) {
		/* An unsampled trace's: counted (or, the map full, counted as
		 * lost), no record, nothing read but its result (ktail: its
		 * record sent held, see tail_hold). */
		long long result = 0;
		if (jb)
			result = (long long)jb->w[0];
		else
			bpf_probe_read_user(&result, sizeof(result), (void *)(req + FS_RESULT_OFF));
		int lost = op_hist_add(pid, HIST_FS, a.op_id, 0, fs_err(result), now - a.start_ns);
		if (!lost)
			queue_hist_add(pid, HIST_FS, a.start_ns, a.work_start_ns);
		http_work_end(pid, a.cause, now);
		if (!tail_wants(a.cause)) {
			if (end_kind == END_DONE)
				put_cause(ts, a.cause);
			return 0;
		}
		flags = lost ? 0 : OP_COUNTED;
	}
	struct scratch *s = get_scratch();
	if (!s)
		return 0;
	struct fs_event *e = &s->fs;
	e->op.hdr.kind = EV_FS;
	e->op.hdr.pid = pid;
	e->op.hdr.tid = a.tid;
	e->op.hdr.flags = 0;
	e->op.req = req;
	e->op.cause = a.cause;
	e->op.start_ns = a.start_ns;
	e->op.work_start_ns = a.work_start_ns;
	e->op.work_end_ns = a.work_end_ns;
	e->op.end_ns = now;
	e->op.worker_tid = a.worker_tid;
	e->op_id = a.op_id;
	e->op.sync = 0;
	e->op.end_kind = end_kind;
	e->op.flags = flags;
	e->path_len = 0;
	/* Neighbouring fields in one read each (each read is a helper call):
	 * result .. path, and new_path .. file; none where the batch walk read
	 * them all. */
	__u64 head[(FS_PATH_OFF - FS_RESULT_OFF) / 8 + 1] = {};
	__u64 tail[(FS_FILE_OFF - FS_NEW_PATH_OFF) / 8 + 1] = {};
	if (jb) {
		__builtin_memcpy(head, jb->w, sizeof(head));
		__builtin_memcpy(tail, &jb->w[(FS_NEW_PATH_OFF - FS_RESULT_OFF) / 8], sizeof(tail));
	} else {
		bpf_probe_read_user(head, sizeof(head), (void *)(req + FS_RESULT_OFF));
		if (a.has_fd || a.has_path2)
			bpf_probe_read_user(tail, sizeof(tail), (void *)(req + FS_NEW_PATH_OFF));
	}
	e->result = (long long)head[0];
	e->fd = a.has_fd ? (int)tail[(FS_FILE_OFF - FS_NEW_PATH_OFF) / 8] : -1;
	e->path[0] = 0;
	e->has_path2 = a.has_path2;
	if (a.has_path)
		e->path_len = read_path(e->path, sizeof(e->path), (void *)head[(FS_PATH_OFF - FS_RESULT_OFF) / 8]);
	if (a.has_path2) {
		e->path2[0] = 0;
		bpf_probe_read_user_str(e->path2, sizeof(e->path2), (void *)tail[0]);
	}
	/* Its callback runs next, on behalf of the same request. */
	if (end_kind == END_DONE)
		put_cause(ts, e->op.cause);
	if (flags || tail_wants(e->op.cause))
		tail_hold(pid, e->op.cause, fs_record_size(e), e->op.end_ns);
	else
		emit(e, fs_record_size(e));
	return 0;
}

/* Keeps an async request until its end: in a free slot of its thread's
 * state (ops_local), else in inflight_fs. */
static __always_inline void fs_keep(struct thread_state *ts, __u32 pid, __u64 req, struct fs_async *a)
{
	if (ts) {
		__u32 i = slot_at(req, UVSPAN_FS_SLOTS);
		__u32 j = slot_for(i, ts->fs[i].req, ts->fs[i + 1].req, req, UVSPAN_FS_SLOTS);
		if (j < UVSPAN_FS_SLOTS) {
			ts->fs[j].a = *a;
			ts->fs[j].req = req;
			return;
		}
	}
	struct req_key key = { .pid = pid, .req = req };
	if (bpf_map_update_elem(&inflight_fs, &key, a, BPF_NOEXIST)) {
		if (bpf_map_update_elem(&inflight_fs, &key, a, BPF_ANY))
			stat_inc(STAT_INFLIGHT_FULL); /* this span is lost, and counted */
		else
			stat_inc(STAT_INFLIGHT_REPLACED);
	}
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

	/* One lookup for the pending sync call, the cause and (ops_local)
	 * the request's slot. */
	struct thread_state *ts = thread_state_of(sync || ops_local);
	struct sync_slot *slot = (struct sync_slot *)ts;
	__u64 cause = requests && ts ? fresh_cause(thread_cause(ts)) : 0;
	if (slot && slot->req)
		sync_end(slot, END_NEXT);

	if (!sync) {
		struct fs_async a = {
			.start_ns = now,
			.cause = cause,
			.tid = (__u32)id,
			.op_id = cookie & 0xFF,
			.has_path = cookie_field(cookie, COOKIE_PATH_SHIFT) != COOKIE_NONE,
			.has_path2 = cookie_field(cookie, COOKIE_PATH2_SHIFT) != COOKIE_NONE,
			.has_fd = cookie_field(cookie, COOKIE_FD_SHIFT) != COOKIE_NONE,
		};
		fs_keep(ops_local ? ts : 0, pid, req, &a);
		return 0;
	}
	if (!slot)
		return 0;

	/* A sync call: its arguments are only valid now, so read them now. */
	struct fs_event *e = &slot->ev;
	slot->req = req;
	slot->gen = window_gen;
	e->op.hdr.kind = EV_FS;
	e->op.hdr.pid = pid;
	e->op.hdr.tid = (__u32)id;
	e->op.hdr.flags = 0;
	e->op.req = req;
	e->op.cause = cause;
	e->op.start_ns = now;
	e->op.work_start_ns = 0;
	e->op.work_end_ns = 0;
	e->op.end_ns = 0;
	e->result = 0;
	e->op.worker_tid = 0;
	e->op.end_kind = 0;
	e->op.flags = 0;
	e->path_len = 0;
	e->op_id = cookie & 0xFF;
	e->op.sync = 1;

	idx = cookie_field(cookie, COOKIE_FD_SHIFT);
	e->fd = idx == COOKIE_NONE ? -1 : (int)args.v[idx & 7];

	e->path[0] = 0;
	e->has_path2 = 0;
	/* An unsampled trace's call is only counted: no path to read. */
	if (lean(cause))
		return 1;
	idx = cookie_field(cookie, COOKIE_PATH_SHIFT);
	if (idx != COOKIE_NONE)
		e->path_len = read_path(e->path, sizeof(e->path), (void *)args.v[idx & 7]);
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
	return fs_job_end(0, current_ids() >> 32, PT_REGS_PARM1(ctx) - FS_WORK_OFF, END_DONE, 0);
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
	return fs_job_end(0, current_ids() >> 32, req, END_CLEANUP, 0);
}

#endif /* UVSPAN_FS_H */
