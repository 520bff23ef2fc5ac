/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Process lifecycle: forks of traced processes (followed for `-- COMMAND`:
 * its descendants), execs (of traced processes; of any process with --all),
 * exits.
 */
#ifndef UVSPAN_PROCS_H
#define UVSPAN_PROCS_H

#include "fs.h" /* end_pending_sync */

/* `st`: an exit's main-thread loop (NULL: none), whose fast iterations,
 * start and time to now go with the record. */
static __always_inline void emit_proc(__u32 kind, __u32 pid, __u32 tid, __u32 ppid, int code, struct loop_state *st)
{
	struct proc_event ev = {};
	ev.exit_code = code;
	ev.hdr.kind = kind;
	ev.hdr.pid = pid;
	ev.hdr.tid = tid;
	ev.ppid = ppid;
	ev.ts_ns = bpf_ktime_get_ns();
	if (st) {
		ev.fast_iterations = (__u32)st->ev.skipped;
		ev.loop_since_ns = st->time.since_ns;
		ev.loop_time = st->time;
		/* exited while blocked in an epoll wait: idle up to now */
		if (st->epoll_enter && ev.ts_ns > st->epoll_enter)
			ev.loop_time.idle_ns += ev.ts_ns - st->epoll_enter;
	}
	emit_flags(&ev, sizeof(ev), BPF_RB_FORCE_WAKEUP);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(proc_fork, struct task_struct *parent, struct task_struct *child)
{
	if (!follow_forks)
		return 0;
	__u32 ppid = task_ids(parent) >> 32;
	__u64 child_ids = task_ids(child);
	__u32 cpid = child_ids >> 32;
	if (ppid == cpid || !cpid || !is_traced(ppid))
		return 0;
	/* the child inherits how its parent is traced, but not its parent's
	 * libc uprobes (attached for the parent alone) */
	__u8 *flags = bpf_map_lookup_elem(&traced, &ppid);
	__u8 f = (flags ? *flags : TRACED) & ~TRACED_WAITS_BY_UPROBE;
	bpf_map_update_elem(&traced, &cpid, &f, BPF_ANY);
	emit_proc(EV_PROC_FORK, cpid, (__u32)child_ids, ppid, 0, NULL);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(proc_exec, struct task_struct *p)
{
	__u64 id = current_ids();
	__u32 pid = id >> 32;
	/* pid 0: a process uvspan's PID namespace does not see */
	if (!pid || (!discover && !is_traced(pid)))
		return 0;
	emit_proc(EV_PROC_EXEC, pid, (__u32)id, 0, 0, NULL);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(proc_exit, struct task_struct *p)
{
	__u64 id = current_ids();
	__u32 pid = id >> 32, tid = (__u32)id;
	/* A sync call still waiting for the thread's next libuv call (END_NEXT)
	 * has returned: end it now, before its storage goes with the thread. */
	end_pending_sync();
	slots_gone();
	/* its entry in traces_ctx_v1 goes with it */
	publish(thread_state_of(0), 0);
	/* The main thread's loop goes with the exit record: its fast iterations
	 * after its last record (uvspan run's per-process iteration count), and
	 * its time up to now (the metrics' last interval). */
	if (pid == tid && is_traced(pid)) {
		bpf_map_delete_elem(&traced, &pid);
		emit_proc(EV_PROC_EXIT, pid, tid, 0, BPF_CORE_READ(p, exit_code), bpf_map_lookup_elem(&loops, &tid));
	}
	/* Per-thread state goes whatever the order of exits: in exit_group the
	 * main thread may exit (and leave the traced set) before the others. */
	bpf_map_delete_elem(&loops, &tid);
	bpf_map_delete_elem(&worker_jobs, &tid);
	return 0;
}

#endif /* UVSPAN_PROCS_H */
