/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * V8 garbage collections. Around each one V8 calls
 * Heap::CallGCPrologueCallbacks(heap, type, flags[, scope]) and, with the
 * same type, Heap::CallGCEpilogueCallbacks: the embedder's GC callbacks,
 * where Node's perf_hooks GC entries come from (their kind is this type,
 * their duration prologue to epilogue). `type` is one v8::GCType bit:
 * scavenge 1, minor mark-sweep 2, mark-compact 4, incremental marking 8,
 * weak callbacks 16. V8 10.2 (Node 18) inlines those into its collections
 * (called out of line for weak callbacks alone): there the out-of-line
 * functions just inside them bracket minor/major collections and the
 * start of incremental marking. Entry probes only: two traps per
 * collection.
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

/* V8 10.2's GarbageCollector (argument 2 of Heap::GarbageCollectionEpilogue):
 * SCAVENGER 0, MARK_COMPACTOR 1, MINOR_MARK_COMPACTOR 2, as a GCType slot. */
static __always_inline __u64 collector_slot(__u64 collector)
{
	switch (collector) {
	case 0: return 0; /* kGCTypeScavenge */
	case 1: return 2; /* kGCTypeMarkSweepCompact */
	case 2: return 1; /* kGCTypeMinorMarkSweep */
	default: return UVSPAN_GC_TYPES;
	}
}

static __always_inline void gc_open(struct gc_state *g, __u64 *start, __u64 now)
{
	if (!*start && !g->depth++)
		g->outer_start = now;
	*start = now;
}

/* A V8 10.2 point's collection whose callbacks turn out to be probed (they
 * are called out of line inside it): the callbacks' own record stands. */
static __always_inline void gc_cancel(struct gc_state *g, __u64 *start)
{
	if (!*start)
		return;
	*start = 0;
	if (g->depth)
		g->depth--;
}

/* The collection of type slot `slot` started at *start ends now. */
static __always_inline int gc_close(struct gc_state *g, __u64 *start, __u64 slot, __u64 now)
{
	__u64 begun = *start;
	if (!begun) /* its start was not seen (attached mid-collection) */
		return 0;
	*start = 0;
	__u64 id = current_ids();
	struct gc_event ev = {
		.hdr = { .kind = EV_GC, .pid = id >> 32, .tid = (__u32)id },
		.start_ns = begun,
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
	if (in_iteration && begun >= st->ev.start_ns)
		st->ev.gc_count++;
	if (!g->depth || --g->depth)
		return 0;
	if (in_iteration && g->outer_start >= st->ev.start_ns)
		st->ev.gc_ns += now - g->outer_start;
	return 0;
}

/* Handler cookie (enum probe_kind PROBE_GC): bit 0 an end (else a start),
 * bits 1-3 the point: 0 V8's GC callbacks (GCType in argument 2), 1 V8
 * 10.2's minor/major collection (its kind known at its end), 2 V8 10.2's
 * incremental marking start. Where V8 10.2 calls its callbacks out of line
 * too (Debian's libnode), they win: a collection is recorded once. */
static __always_inline int gc_callbacks(struct pt_regs *ctx, __u64 cookie)
{
	int epilogue = cookie & 1;
	__u64 point = (cookie >> 1) & 7;
	__u64 slot;
	if (point == 0)
		slot = gc_slot((__u32)PT_REGS_PARM2(ctx));
	else if (point == 2)
		slot = 3; /* kGCTypeIncrementalMarking */
	else if (epilogue)
		slot = collector_slot(PT_REGS_PARM2(ctx));
	else
		slot = 0; /* not known yet */
	if (slot >= UVSPAN_GC_TYPES)
		return 0;
	struct thread_state *t = thread_state_of(!epilogue);
	if (!t)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	struct gc_state *g = &t->gc;
	if (point == 0) {
		if (epilogue)
			return gc_close(g, &g->start[slot], slot, now);
		if (slot == 3)
			gc_cancel(g, &g->incremental_start);
		else if (slot != 4)
			gc_cancel(g, &g->pause_start);
		gc_open(g, &g->start[slot], now);
		return 0;
	}
	__u64 *start = point == 1 ? &g->pause_start : &g->incremental_start;
	if (epilogue)
		return gc_close(g, start, slot, now);
	/* The callbacks of its kind are probed and in progress around it. */
	if (point == 1 ? (g->start[0] || g->start[1] || g->start[2]) : g->start[3])
		return 0;
	gc_open(g, start, now);
	return 0;
}

#endif /* UVSPAN_GC_H */
