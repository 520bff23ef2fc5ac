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

#endif /* UVSPAN_LOOP_H */
