/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * DNS lookups (uv_getaddrinfo): one record per finished lookup, with the
 * addresses it returned. The request waits in inflight_dns as the record
 * it becomes.
 */
#ifndef UVSPAN_DNS_H
#define UVSPAN_DNS_H

#include "ops.h"
#include "stacks.h"

/* The slot of `req` in this thread's DNS slots, or UVSPAN_DNS_SLOTS. */
static __always_inline __u32 dns_slot_of(struct thread_state *ts, __u64 req)
{
	__u32 i = slot_at(req, UVSPAN_DNS_SLOTS);
	return slot_holding(i, ts->dns[i].req, ts->dns[i + 1].req, req, UVSPAN_DNS_SLOTS);
}

/* An unsampled lookup (lean: only counted) kept in its thread's state
 * (ops_local); 0 when its two slots are taken (it goes to inflight_dns). */
static __always_inline int dns_keep(struct thread_state *ts, __u64 req, __u64 start_ns, __u64 cause)
{
	__u32 i = slot_at(req, UVSPAN_DNS_SLOTS);
	__u32 j = slot_for(i, ts->dns[i].req, ts->dns[i + 1].req, req, UVSPAN_DNS_SLOTS);
	if (j >= UVSPAN_DNS_SLOTS)
		return 0;
	ts->dns[j].start_ns = start_ns;
	ts->dns[j].cause = cause;
	ts->dns[j].req = req;
	return 1;
}

/* uv_getaddrinfo(loop, req, cb, node, service, hints) */
static __always_inline int dns_submit(struct pt_regs *ctx, __u64 cookie)
{
	__u64 id = current_ids();
	__u32 pid = id >> 32;
	__u64 req = PT_REGS_PARM2(ctx);
	if (stacks_all_ops)
		op_stack(ctx, req);
	__u64 now = bpf_ktime_get_ns();
	struct thread_state *ts = ops_local && requests ? thread_state_of(1) : 0;
	__u64 cause = ts ? fresh_cause(thread_cause(ts)) : current_cause();
	if (ts && lean(cause) && dns_keep(ts, req, now, cause))
		return 0;
	struct scratch *s = get_scratch();
	if (!s)
		return 0;
	struct dns_event *e = &s->dns;
	__builtin_memset(e, 0, sizeof(*e) - UVSPAN_HOST_MAX);
	e->op.hdr.kind = EV_DNS;
	e->op.hdr.pid = pid;
	e->op.hdr.tid = (__u32)id;
	e->op.req = req;
	e->op.cause = cause;
	e->op.start_ns = now;
	e->op.sync = PT_REGS_PARM3(ctx) == 0;
	e->host[0] = 0;
	if (!lean(e->op.cause))
		bpf_probe_read_user_str(e->host, sizeof(e->host), (void *)PT_REGS_PARM4(ctx));
	struct req_key key = { .pid = pid, .req = e->op.req };
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
	if (!e || e->op.sync)
		return 0;
	e->op.work_start_ns = bpf_ktime_get_ns();
	e->op.worker_tid = tid;
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
		if (sampling && end_kind == END_DONE) {
			stat_inc(STAT_STRADDLED); /* started before this window */
			set_cause(0);             /* its callback's request is not known */
		}
		return 0;
	}
	__u64 req = key->req;
	e->op.end_ns = bpf_ktime_get_ns();
	e->op.end_kind = end_kind;
	/* addrinfo and retcode in one read */
	__u64 r[(GAI_RETCODE_OFF - GAI_ADDRINFO_OFF) / 8 + 1] = {};
	bpf_probe_read_user(r, sizeof(r), (void *)(req + GAI_ADDRINFO_OFF));
	e->retcode = (int)r[(GAI_RETCODE_OFF - GAI_ADDRINFO_OFF) / 8];
	if (status == -125 /* UV_ECANCELED */)
		e->retcode = -3003; /* UV_EAI_CANCELED, as libuv reports it */
	/* An unsampled trace's: counted, no record (DNS durations have no
	 * sync attribute). */
	int held = 0;
	if (dropped(e->op.cause)) {
		int lost = op_hist_add(key->pid, HIST_DNS, 0, 0, e->retcode, e->op.end_ns - e->op.start_ns);
		if (!lost)
			queue_hist_add(key->pid, HIST_DNS, e->op.start_ns, e->op.work_start_ns);
		http_work_end(key->pid, e->op.cause, e->op.end_ns);
		if (!tail_wants(e->op.cause)) {
			if (end_kind == END_DONE)
				set_cause(e->op.cause);
			bpf_map_delete_elem(&inflight_dns, key);
			return 0;
		}
		/* ktail: its record is sent held (tail_hold) */
		e->op.flags = lost ? 0 : OP_COUNTED;
		held = 1;
	}

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
		set_cause(e->op.cause);
	struct scratch *s = held ? get_scratch() : 0;
	if (s) {
		__builtin_memcpy(&s->dns, e, sizeof(*e));
		tail_hold(key->pid, e->op.cause, sizeof(*e), e->op.end_ns);
	} else if (!held) {
		emit(e, sizeof(*e));
	}
	bpf_map_delete_elem(&inflight_dns, key);
	return 0;
}

/* Ends an unsampled lookup kept in slot j of its thread's state: counted,
 * no record. */
static __always_inline int dns_finish_kept(struct thread_state *ts, __u32 j, __u32 pid, __u64 req, int status,
					   __u8 end_kind)
{
	if (j >= UVSPAN_DNS_SLOTS)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 start_ns = ts->dns[j].start_ns, cause = ts->dns[j].cause;
	ts->dns[j].req = 0;
	int retcode = 0;
	bpf_probe_read_user(&retcode, sizeof(retcode), (void *)(req + GAI_RETCODE_OFF));
	if (status == -125 /* UV_ECANCELED */)
		retcode = -3003; /* UV_EAI_CANCELED, as libuv reports it */
	op_hist_add(pid, HIST_DNS, 0, 0, retcode, now - start_ns);
	http_work_end(pid, cause, now);
	/* its callback runs next, for the same request */
	if (end_kind == END_DONE)
		put_cause(ts, cause);
	return 0;
}

/* A lookup's result reaches the loop (status: 0, or UV_ECANCELED); its
 * callback runs next. A global function: verified once for
 * uv__getaddrinfo_done and the batches. */
__attribute__((noinline)) int dns_done_of(__u32 pid, __u64 req, int status)
{
	struct req_key key = { .pid = pid, .req = req };
	struct thread_state *ts = ops_local ? thread_state_of(0) : 0;
	__u32 j = ts ? dns_slot_of(ts, key.req) : UVSPAN_DNS_SLOTS;
	if (ts && j < UVSPAN_DNS_SLOTS)
		return dns_finish_kept(ts, j, key.pid, key.req, status, END_DONE);
	return dns_finish(&key, status, END_DONE);
}

/* uv__getaddrinfo_done(struct uv__work *w, int status) */
static __always_inline int dns_done(struct pt_regs *ctx, __u64 cookie)
{
	return dns_done_of(current_ids() >> 32, PT_REGS_PARM1(ctx) - GAI_WORK_OFF, (int)PT_REGS_PARM2(ctx));
}

/* Fallback for builds without uv__getaddrinfo_work (stripped): libc's
 * getaddrinfo(node, service, hints, &req->addrinfo) on the pool thread. */
static __always_inline int dns_work_libc(struct pt_regs *ctx, __u64 cookie)
{
	__u64 id = current_ids();
	__u32 pid = id >> 32, tid = (__u32)id;
	struct worker_job job = { .key = { .pid = pid, .req = PT_REGS_PARM4(ctx) - GAI_ADDRINFO_OFF }, .kind = EV_DNS };
	struct dns_event *e = bpf_map_lookup_elem(&inflight_dns, &job.key);
	if (!e || e->op.sync || e->op.work_start_ns)
		return 0; /* not a libuv request (another getaddrinfo caller) */
	e->op.work_start_ns = bpf_ktime_get_ns();
	e->op.worker_tid = tid;
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
	__u64 when = e->op.work_end_ns ? e->op.work_end_ns : ~0ULL - 1;
	if (!m->found || when < m->best) {
		m->found = 1;
		m->best = when;
		m->key = *key;
	}
	return 0;
}

/* The slot of this thread's (ops_local) whose lookup's result is `ai`, or
 * UVSPAN_DNS_SLOTS. A global function: verified once. */
__attribute__((noinline)) __u32 dns_kept_of(struct thread_state *ts, __u64 ai)
{
	if (!ts)
		return UVSPAN_DNS_SLOTS;
	for (__u32 i = 0; i < UVSPAN_DNS_SLOTS; i++) {
		__u64 req = ts->dns[i].req, got = 1;
		if (!req)
			continue;
		bpf_probe_read_user(&got, sizeof(got), (void *)(req + GAI_ADDRINFO_OFF));
		if (got == ai)
			return i;
	}
	return UVSPAN_DNS_SLOTS;
}

/* Fallback for builds without uv__getaddrinfo_done (stripped): Node frees the
 * result with uv_freeaddrinfo(req->addrinfo) once its callback has run (also
 * on failure, with NULL). Find the request whose result this is. */
static __always_inline int dns_free(struct pt_regs *ctx, __u64 cookie)
{
	struct gai_match m = { .ai = PT_REGS_PARM1(ctx), .pid = current_ids() >> 32 };
	struct thread_state *ts = ops_local ? thread_state_of(0) : 0;
	/* An unsampled lookup kept in this thread's slots is its result's
	 * only owner: found there, no walk of inflight_dns. (A NULL result,
	 * a failure's, is every unfinished lookup's: the map first, as for
	 * any result not in the slots.) */
	__u32 j = ts && m.ai ? dns_kept_of(ts, m.ai) : UVSPAN_DNS_SLOTS;
	if (j >= UVSPAN_DNS_SLOTS) {
		bpf_for_each_map_elem(&inflight_dns, match_gai, &m, 0);
		if (!m.found && !m.ai)
			j = dns_kept_of(ts, 0);
	}
	if (ts && j < UVSPAN_DNS_SLOTS)
		return dns_finish_kept(ts, j, m.pid, ts->dns[j].req, 0, END_FREE);
	if (!m.found)
		return 0;
	struct req_key key = m.key;
	return dns_finish(&key, 0, END_FREE);
}

#endif /* UVSPAN_DNS_H */
