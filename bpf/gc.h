/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * V8 garbage collections. Around each one V8 calls
 * Heap::CallGCPrologueCallbacks(heap, type, flags[, scope]) and, with the
 * same type, Heap::CallGCEpilogueCallbacks: the embedder's GC callbacks,
 * where Node's perf_hooks GC entries come from (their kind is this type,
 * their duration prologue to epilogue). `type` is one v8::GCType bit:
 * scavenge 1, minor mark-sweep 2, mark-compact 4, incremental marking 8,
 * weak callbacks 16. Entry probes only: two traps per collection.
 * One record per collection (the metrics count every one); its time also
 * goes to the loop iteration in progress on the thread (loop_event.gc_ns).
 */
#ifndef UVSPAN_GC_H
#define UVSPAN_GC_H

#include "ops.h"

/* The index of a single GCType bit (UVSPAN_GC_TYPES: not one bit we know). */
static __always_inline __u64 gc_slot(__u64 type)
{
	for (__u64 i = 0; i < UVSPAN_GC_TYPES; i++)
		if (type == (1ULL << i))
			return i;
	return UVSPAN_GC_TYPES;
}

/* cookie 0: a prologue (a collection starts), 1: an epilogue (it ends). */
static __always_inline int gc_callbacks(struct pt_regs *ctx, __u64 cookie)
{
	__u64 slot = gc_slot((__u32)PT_REGS_PARM2(ctx));
	if (slot >= UVSPAN_GC_TYPES)
		return 0;
	int epilogue = cookie & 1;
	struct thread_state *t = thread_state_of(!epilogue);
	if (!t)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	struct gc_state *g = &t->gc;
	if (!epilogue) {
		if (!g->start[slot] && !g->depth++)
			g->outer_start = now;
		g->start[slot] = now;
		return 0;
	}
	__u64 start = g->start[slot];
	if (!start) /* its start was not seen (attached mid-collection) */
		return 0;
	g->start[slot] = 0;
	__u64 id = current_ids();
	struct gc_event ev = {
		.hdr = { .kind = EV_GC, .pid = id >> 32, .tid = (__u32)id },
		.start_ns = start,
		.end_ns = now,
		.gc_type = 1U << slot,
	};
	emit(&ev, sizeof(ev));
	/* Each collection counts on the loop thread's iteration in progress (a
	 * collection cannot outlast its iteration: the thread is in V8, not in
	 * libuv, meanwhile), whatever reaches user space of its record; the
	 * outermost one's time goes to it too. */
	__u32 tid = (__u32)id;
	struct loop_state *st = bpf_map_lookup_elem(&loops, &tid);
	int in_iteration = st && st->ev.start_ns;
	if (in_iteration && start >= st->ev.start_ns)
		st->ev.gc_count++;
	if (!g->depth || --g->depth)
		return 0;
	if (in_iteration && g->outer_start >= st->ev.start_ns)
		st->ev.gc_ns += now - g->outer_start;
	return 0;
}

#endif /* UVSPAN_GC_H */
