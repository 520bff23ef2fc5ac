/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The event loop: an iteration runs from one uv__io_poll entry to the next,
 * its phases from one phase function's entry to the next; one record per
 * iteration busy for at least the loop threshold. Builds without the phase
 * functions are delimited by their epoll waits instead (epoll.h).
 */
#ifndef UVSPAN_LOOP_H
#define UVSPAN_LOOP_H

#include "fs.h" /* end_pending_sync */

/*
 * The split of an iteration's busy time (the time outside its epoll waits):
 * on a CPU, runnable waiting for one (run queue), and the rest off-CPU
 * (sleeping or blocked: a sync read, a lock, a page fault from disk). Read
 * from the loop thread's own scheduler accounting at the bounds of each busy
 * part, which uvspan probes anyway: a wait's end opens one, the next wait's
 * start (or the iteration's end) closes it. No scheduler tracepoint: the
 * current task's counters are plain loads through its BTF pointer.
 * - sum_exec_runtime is brought up to date at ticks and switches only: the
 *   time since se.exec_start is added. exec_start is on the CPU's task
 *   clock (rq->clock_task): sched_clock less the IRQ and steal time of that
 *   CPU, so its offset to ktime differs from CPU to CPU (by seconds on a
 *   VM). It is taken apart: this CPU's rq->clock - rq->clock_task, read
 *   now, and sched_clock's offset to ktime, the same on every CPU, measured
 *   at the thread's last wake-up (exec_start is the switch's time then). A
 *   thread that moved to another CPU since (a throttled one often does)
 *   is caught up on that CPU's clock.
 * - run_delay is complete whenever the task runs (it grows when the task
 *   gets a CPU).
 * - throttled_time is the cgroup's (the nearest with a CFS quota, up to
 *   THROTTLE_LEVELS up), as its cpu.stat shows it: summed over its CPUs,
 *   added when a throttled run queue is let go; read at the iteration's
 *   bounds only, the walk up the task groups with probe reads (a load of
 *   a pointer through a BTF pointer costs the verifier a search of the
 *   kernel's types at load).
 */
#define CATCHUP_MAX_NS 50000000ULL /* more: the offset is wrong, none added */
#define THROTTLE_LEVELS 8
#define RUNTIME_INF (~0ULL)

/* The nearest task group with a CFS quota, from the task's own. */
static __always_inline struct task_group *quota_group(struct task_struct *t)
{
	if (!bpf_core_field_exists(t->sched_task_group))
		return NULL;
	struct task_group *g = BPF_CORE_READ(t, sched_task_group);
	for (int i = 0; i < THROTTLE_LEVELS && g; i++) {
		if (BPF_CORE_READ(g, cfs_bandwidth.quota) != RUNTIME_INF)
			return g;
		g = BPF_CORE_READ(g, parent);
	}
	return NULL;
}

/* The current task's scheduler counters, as read at one bound. */
struct task_sched {
	__u64 sum_exec_runtime;
	__u64 exec_start;
	__u64 run_delay;
	__u64 nvcsw;
	__u64 throttled; /* its quota group's (has_quota) */
	__u64 stolen;    /* this CPU's rq->clock - rq->clock_task (0: unknown) */
	__u32 has_quota;
	__u32 _pad;
};

/* The current task's counters into *o (`throttle`: its quota group's
 * throttled time too, a walk up the task groups). A global function: the
 * verifier checks each load through a task's BTF pointer with a search of
 * the kernel's types, once here rather than at every path to it. */
__attribute__((noinline)) int task_sched_read(struct task_sched *o, int throttle)
{
	if (!o)
		return 0;
	struct task_struct *t = bpf_get_current_task_btf();
	o->sum_exec_runtime = t->se.sum_exec_runtime;
	o->exec_start = t->se.exec_start;
	o->run_delay = t->sched_info.run_delay;
	o->nvcsw = t->nvcsw;
	o->stolen = 0;
	if (bpf_core_field_exists(t->se.cfs_rq)) {
		struct rq *rq = BPF_CORE_READ(t, se.cfs_rq, rq);
		__u64 clock = 0, task = 0;
		if (rq) {
			clock = BPF_CORE_READ(rq, clock);
			task = BPF_CORE_READ(rq, clock_task);
		}
		if (clock > task)
			o->stolen = clock - task;
	}
	o->throttled = 0;
	o->has_quota = 0;
	if (throttle) {
		struct task_group *g = quota_group(t);
		if (g) {
			o->has_quota = 1;
			o->throttled = BPF_CORE_READ(g, cfs_bandwidth.throttled_time);
		}
	}
	return 0;
}

/* The loop thread's counters now (`now`: ktime; `t`: the current task's). */
static __always_inline void sched_read(const struct task_sched *t, struct loop_state *st, __u64 now, struct loop_sched *out)
{
	__u64 on = t->sum_exec_runtime;
	__u64 off = st->sched.clk_off;
	if (sched_catchup && off) {
		__u64 since = t->exec_start + t->stolen + off; /* modulo 2^64 */
		if (now > since && now - since < CATCHUP_MAX_NS)
			on += now - since;
	}
	out->on_cpu = on;
	out->run_delay = t->run_delay;
}

/* A busy part starts now, at counters `s`. */
static __always_inline void sched_open(struct loop_state *st, __u64 now, struct loop_sched *s)
{
	st->sched.at = now;
	st->sched.on_cpu = s->on_cpu;
	st->sched.run_delay = s->run_delay;
}

/* The busy part open ends now, at counters `s`: its counters go to the
 * iteration and the thread's totals. None open: the iteration's split
 * misses a part. */
static __always_inline void sched_close(struct loop_state *st, __u64 now, struct loop_sched *s)
{
	if (!st->sched.at) {
		st->ev.split &= ~SPLIT_MEASURED;
		return;
	}
	__u64 on = s->on_cpu > st->sched.on_cpu ? s->on_cpu - st->sched.on_cpu : 0;
	__u64 rq = s->run_delay > st->sched.run_delay ? s->run_delay - st->sched.run_delay : 0;
	st->ev.on_cpu_ns += on;
	st->ev.runqueue_ns += rq;
	st->time.busy_ns += now - st->sched.at;
	st->time.on_cpu_ns += on;
	st->time.runqueue_ns += rq;
	st->sched.at = 0;
}

/* An iteration ends and the next starts (`ended`: one was in progress): its
 * last busy part closes, the next one's opens, at one reading. The cgroup's
 * throttled time is read here only (its walk up the task groups is the
 * dearest read): an iteration's covers its waits too. */
static __always_inline void sched_iteration(struct loop_state *st, __u64 now, int ended)
{
	struct task_sched t = {};
	task_sched_read(&t, 1);
	struct loop_sched s = {};
	sched_read(&t, st, now, &s);
	__u64 throttled = t.throttled;
	if (ended) {
		sched_close(st, now, &s);
		if (t.has_quota) {
			st->ev.split |= SPLIT_THROTTLE;
			st->ev.throttled_ns = throttled > st->sched.throttled ? throttled - st->sched.throttled : 0;
		}
	}
	st->sched.throttled = throttled;
	sched_open(st, now, &s);
}

/* A wait starts: the busy part ends; whether the wait slept is told by
 * the voluntary switches at its end. */
static __always_inline void sched_wait_start(struct loop_state *st, __u64 now)
{
	struct task_sched t = {};
	task_sched_read(&t, 0);
	struct loop_sched s = {};
	sched_read(&t, st, now, &s);
	sched_close(st, now, &s);
	st->sched.nvcsw = t.nvcsw;
}

/* A wait ended: a busy part starts. After a wait that slept the task was
 * switched in just now, at se.exec_start on this CPU's task clock: the
 * offset of sched_clock to ktime, within the few microseconds since. */
static __always_inline void sched_wait_end(struct loop_state *st, __u64 now)
{
	struct task_sched t = {};
	task_sched_read(&t, 0);
	/* Modulo 2^64: sched_clock may be ahead of ktime. */
	__u64 off = now - (t.exec_start + t.stolen);
	if (t.nvcsw != st->sched.nvcsw && off)
		st->sched.clk_off = off;
	struct loop_sched s = {};
	sched_read(&t, st, now, &s);
	sched_open(st, now, &s);
}

/* Every iteration's busy time goes to the thread's histogram (the metric
 * counts all of them, reported or not): the first bucket whose bound it
 * does not exceed, bounds doubling from UVSPAN_ITER_BASE_NS. */
static __always_inline void loop_count_iteration(struct loop_time *t, __u64 busy)
{
	__u64 bound = UVSPAN_ITER_BASE_NS;
	__u32 i;
	for (i = 0; i < UVSPAN_ITER_BOUNDS; i++) {
		if (busy <= bound)
			break;
		bound <<= 1;
	}
	if (i > UVSPAN_ITER_BOUNDS)
		i = UVSPAN_ITER_BOUNDS;
	t->iter_buckets[i]++;
	t->iterations++;
	t->iter_busy_ns += busy;
}

static __always_inline void loop_finish_iteration(struct loop_state *st, __u64 now)
{
	struct loop_event *ev = &st->ev;
	__u64 total = now - ev->start_ns;
	__u64 busy = total > ev->poll_wait_ns ? total - ev->poll_wait_ns : 0;
	stat_inc(STAT_LOOP_ITERATIONS);
	loop_count_iteration(&st->time, busy);
	if (busy < loop_threshold_ns) {
		ev->skipped++;
		return;
	}
	stat_inc(STAT_LOOP_EMITTED);
	__u8 *flags = bpf_map_lookup_elem(&traced, &ev->hdr.pid);
	if (flags && (*flags & TRACED_GC))
		ev->split |= SPLIT_GC;
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
	s->loop.time.since_ns = bpf_ktime_get_ns();
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
		int ended = st->ev.start_ns != 0;
		sched_iteration(st, now, ended);
		if (ended)
			loop_finish_iteration(st, now);
		st->ev.start_ns = now;
		st->ev.split = SPLIT_MEASURED; /* until a part is missed */
		st->ev.on_cpu_ns = 0;
		st->ev.runqueue_ns = 0;
		st->ev.throttled_ns = 0;
		st->ev.gc_ns = 0;
		st->ev.gc_count = 0;
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

#endif /* UVSPAN_LOOP_H */
