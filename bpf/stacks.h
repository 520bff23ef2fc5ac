/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * --stacks: user stacks walked along the frame-pointer chain. The loop
 * thread's stack while an iteration is slow (a perf-event program), and
 * with --stacks all-ops the stack of each fs/DNS submit.
 */
#ifndef UVSPAN_STACKS_H
#define UVSPAN_STACKS_H

#include <linux/bpf_perf_event.h>
#include "common.h"

/* Walks the frame-pointer chain of the user stack from (pc, fp) into
 * e->frames. */
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

/* --stacks all-ops: the stack of the thread submitting fs/DNS request
 * `req`, sent before the request's own record. */
static __always_inline void op_stack(struct pt_regs *ctx, __u64 req)
{
	/* Without the stack copy: the submit's frame 0 is libuv's (frame pointers). */
	struct stack_event *e = bpf_ringbuf_reserve(&events, __builtin_offsetof(struct stack_event, stack), 0);
	if (!e) {
		stat_inc(STAT_RINGBUF_LOST);
		return;
	}
	__u64 id = current_ids();
	e->hdr.kind = EV_STACK;
	e->hdr.pid = id >> 32;
	e->hdr.tid = (__u32)id;
	e->hdr.flags = 0;
	e->iter_start_ns = 0;
	e->ts_ns = bpf_ktime_get_ns();
	e->sp = PT_REGS_SP(ctx);
	e->req = req;
	e->fp = PT_REGS_FP(ctx);
	e->stack_bytes = 0;
	walk_user_stack(e, PT_REGS_IP(ctx), PT_REGS_FP(ctx));
	bpf_ringbuf_submit(e, wake_flags_after(sizeof(*e)));
}

/* The loop thread's stack while an iteration is slow.
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

/* The loop of the thread `id` (current_ids) if it is a traced process's
 * and its iteration in progress has been busy (its time less its epoll
 * waits, the one under way included) for at least `busy` ns at `now`; else
 * NULL. A stale entry's tid may belong to another process: checked. */
static __always_inline struct loop_state *loop_busy_for(__u64 id, __u64 now, __u64 busy)
{
	__u32 tid = (__u32)id;
	struct loop_state *st = bpf_map_lookup_elem(&loops, &tid);
	if (!st || !st->ev.start_ns || !is_traced(id >> 32))
		return NULL;
	__u64 idle = st->ev.poll_wait_ns;
	if (st->epoll_enter && now > st->epoll_enter)
		idle += now - st->epoll_enter;
	return now < st->ev.start_ns + idle + busy ? NULL : st;
}

SEC("perf_event")
int loop_sample(struct bpf_perf_event_data *ctx)
{
	/* The event is per CPU: whatever runs here. */
	__u64 id = current_ids();
	__u32 tid = (__u32)id;
	__u64 now = bpf_ktime_get_ns();
	struct loop_state *st = loop_busy_for(id, now, loop_threshold_ns);
	if (!st)
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
	e->hdr.flags = 0;
	e->iter_start_ns = st->ev.start_ns;
	e->ts_ns = now;
	e->sp = BPF_CORE_READ(regs, sp);
	e->req = 0;
	e->fp = BPF_CORE_READ(regs, bp);
	walk_user_stack(e, BPF_CORE_READ(regs, ip), e->fp);
	/* The stack from sp up, for leaf functions without a frame pointer
	 * (the chain above is then wrong from frame 1 on): in chunks, up to
	 * the first that cannot be read (the stack's top, often within the
	 * copy's size of a loop thread's sp). */
	e->stack_bytes = 0;
	for (int i = 0; i < UVSPAN_STACK_COPY / UVSPAN_STACK_CHUNK; i++) {
		if (bpf_probe_read_user(e->stack + i * UVSPAN_STACK_CHUNK, UVSPAN_STACK_CHUNK,
					(void *)(e->sp + i * UVSPAN_STACK_CHUNK)))
			break;
		e->stack_bytes = (i + 1) * UVSPAN_STACK_CHUNK;
	}
	stat_inc(STAT_STACK_SAMPLES);
	/* The frames are named from the live process (V8's heap, its maps):
	 * wake the reader at the first sample of a slow iteration and every 32
	 * after, while the loop is still blocked, not at its next tick — a
	 * process that exits right after would leave them unnamed. */
	bpf_ringbuf_submit(e, (st->samples & 31) == 1 ? BPF_RB_FORCE_WAKEUP : wake_flags_after(sizeof(*e)));
	return 0;
}

/* The sampler's events are off while no loop is slow; their gate, a thread
 * of uvspan's (src/kernel/sampler.rs), sleeps until this wakes it: at any
 * hrtimer expiry on a CPU (the scheduler tick among them, every 1-10 ms
 * while a thread runs), the interrupted thread, if a traced process's main
 * thread whose iteration in progress has been busy for gate_lead_ns, wakes
 * the gate once (gate_awake[0] set; the gate clears it as it goes back to
 * sleep). A tracepoint, not a trap: one array lookup at every expiry, and
 * a hash lookup when a process's main thread was interrupted. */
SEC("tp_btf/hrtimer_expire_entry")
int BPF_PROG(gate_tick)
{
	__u32 zero = 0;
	__u32 *awake = bpf_map_lookup_elem(&gate_awake, &zero);
	if (!awake || *awake)
		return 0;
	/* A main thread (in any PID namespace its tid is its tgid), not idle. */
	__u64 raw = bpf_get_current_pid_tgid();
	if (!raw || (raw >> 32) != (__u32)raw)
		return 0;
	__u64 id = current_ids();
	__u32 tid = (__u32)id;
	if (!loop_busy_for(id, bpf_ktime_get_ns(), gate_lead_ns))
		return 0;
	*awake = 1;
	bpf_ringbuf_output(&gate_wake, &tid, sizeof(tid), BPF_RB_FORCE_WAKEUP);
	return 0;
}

#endif /* UVSPAN_STACKS_H */
