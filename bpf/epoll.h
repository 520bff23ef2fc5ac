/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The loop thread's epoll waits: the poll phase's idle time, when the loop
 * woke up, and (builds without phase probes) the iterations' bounds.
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
 */
#ifndef UVSPAN_EPOLL_H
#define UVSPAN_EPOLL_H

#include "loop.h"

/* libuv's two waits of one poll phase (idle-time metrics: a timeout-0 wait,
 * then the real one) follow each other within microseconds; a longer gap
 * means callbacks ran in between (a timeout-0 poll because immediates are
 * pending): a new iteration. */
#define SAME_POLL_GAP_NS 250000ULL

/* The syscall's own arguments are in the pt_regs it was given; the 4th (the
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
	/* The I/O callbacks that follow set their own cause, or are a task
	 * of this wait's (a socket no request owns, a worker's message). */
	set_cause(task_cause_at(now, CAUSE_IO));
	st->ev.poll_wait_ns += now - st->epoll_enter;
	st->time.idle_ns += now - st->epoll_enter;
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
	/* the thread waits: it runs nothing of a request */
	publish(thread_state_of(0), 0);
	if (by_uprobe && timeout_zero) {
		/* A wait that cannot block is not worth its return trap: it ends
		 * as it starts (its few microseconds count as busy, and its busy
		 * part goes on). Whether it found events is told by what
		 * follows: a blocking wait within the gap means it found none. */
		wait_done(st, now, 0, 0);
		return 0;
	}
	sched_wait_start(st, now);
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
	__u64 now = bpf_ktime_get_ns();
	wait_done(st, now, ret, 1);
	sched_wait_end(st, now);
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

#endif /* UVSPAN_EPOLL_H */
