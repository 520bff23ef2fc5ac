/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * What every family of the BPF side uses: the settings user space writes
 * before load, the kernel types read through CO-RE, the maps (maps.h), and
 * the helpers: counters, the ids of a task as uvspan sees them, the traced
 * set, scratch space, sending records, a probe's integer arguments.
 */
#ifndef UVSPAN_COMMON_H
#define UVSPAN_COMMON_H

#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "uvspan.h"
#include "maps.h"

/* Settings, written by user space before load. */
const volatile unsigned long long loop_threshold_ns = 10000000ULL;
const volatile unsigned long long wakeup_bytes = 256 * 1024;
const volatile unsigned int follow_forks = 0;
/* --all: report every exec, so user space can pick up new Node processes */
const volatile unsigned int discover = 0;
/* Benchmark only (UVSPAN_BENCH_TRAP_ONLY=1): uprobes and epoll tracepoints
 * fire, their programs return at once (no spans). Measures what the kernel
 * charges for the probes alone. */
const volatile unsigned int trap_only = 0;
/* Benchmark only (UVSPAN_BENCH_TRAP_SPIN_NS=N, with trap_only): each entry
 * hit spins N ns in a compact loop instead: BPF time without the real
 * programs' memory traffic (their maps, scratch and code). */
const volatile unsigned long long trap_spin_ns = 0;
/* Benchmark only (UVSPAN_BENCH_COUNT_HITS=1): every uprobe hit is counted by
 * its attach point (hit_counts), for hits per request by probe point. */
const volatile unsigned int count_hits = 0;
/* Benchmark only (UVSPAN_BENCH_TIME_HITS=1): bench_enter and bench_leave
 * time each entry hit, and bench_leave counts it; uvspan's programs do not
 * count entries then (hit_counts' map update, ~200 ns a hit here, would be
 * inside the time measured and not in the trap floor's). */
const volatile unsigned int time_hits = 0;
/* Request context (--requests): off, the hot paths skip the thread's cause. */
const volatile unsigned int requests = 0;
/* --sample-time: user space attaches the uprobes only during sampling
 * windows. The window's edges are these flags, not the attach and detach
 * (which take milliseconds to tens of ms, and during which some probes fire
 * and others not): user space sets window_closed before detaching, and
 * attaches with it set, then writes window_open_ns, bumps window_gen and
 * clears it. The programs do nothing while it is set, so the probes are
 * live exactly while it is clear, the time user space reports. An operation
 * that crosses an edge is dropped and counted (STAT_STRADDLED), never
 * paired with a wrong end; a cause (request) made before the window opened
 * is not carried by work in it (its request was not seen whole). */
const volatile unsigned int sampling = 0;
volatile __u32 window_closed = 0;
volatile __u32 window_gen = 0;
volatile __u64 window_open_ns = 0;
/* The trace sampler (OTEL_TRACES_SAMPLER), decided in the kernel where a
 * trace starts: a request at its head (ksample_requests), a task when it
 * starts (ksample_tasks: tasks are traces of their own). Not sampled: the
 * cause carries CAUSE_DROP (ops.h). A trace id's 56 low bits are kept when
 * at least ksample_threshold (1 << 56: never); with ksample_parent an
 * incoming traceparent's sampled flag decides instead. User space derives
 * the trace ids it makes from the cause the same way (mix64), so both
 * sides agree; off (0): user space decides every trace. */
const volatile unsigned int ksample_requests = 0;
const volatile unsigned int ksample_tasks = 0;
const volatile unsigned int ksample_parent = 0;
const volatile unsigned long long ksample_threshold = 0;
/* With ksample_requests: an unsampled HTTP/1 request is followed in the
 * kernel to its end and counted in op_hist (http_follow.h), no record sent. */
const volatile unsigned int khttp = 0;
/* Tail exceptions (--keep-errors, --keep-slower-than) with khttp: the
 * records of a followed request are sent marked held (HDR_HELD: user
 * space keeps their bytes unread), and its end says whether they go on:
 * a 5xx (ktail_errors), or over ktail_slow_ns (all ones: no bound); else
 * they are dropped (its work already counted). */
const volatile unsigned int ktail = 0;
const volatile unsigned int ktail_errors = 0;
const volatile unsigned long long ktail_slow_ns = ~0ULL;
/* --publish-trace-context: each loop thread's current request in
 * traces_ctx_v1 (ops.h: publish), its ids made from its cause and this
 * run's random key (ctx_ids), as user space makes them for its spans. */
const volatile unsigned int publish_ctx = 0;
const volatile __u64 ctx_key[2] = {};
/* Set by user space at exit, before it leaves the pinned map as it found
 * it: only deletes from then on. */
volatile __u32 ctx_stop = 0;
/* Set at the first request with a traceparent (ctx_parent has entries):
 * until then no lookup there. */
volatile __u32 ctx_parents = 0;
/* The bucket bounds (ns, inclusive) of op_hist per enum hist_family, as
 * user space's metrics have them; unused ones are 2^62 (op_hist_add). */
const volatile unsigned long long hist_bounds_ns[HIST_FAMILIES][UVSPAN_HIST_BOUNDS] = {};
/* Async fs requests, and the DNS lookups of unsampled traces, wait for
 * their end in the submitting thread's own state (thread_state.fs, .dns),
 * not in inflight_fs and inflight_dns: no hash update, lookup and delete
 * per request. Off where another thread or user space must find them:
 * --detail threadpool (the worker marks its start and end) and
 * --sample-time (user space sweeps them at a window's close). */
const volatile unsigned int ops_local = 0;
/* --stacks all-ops: the user stack at each fs/DNS submit. */
const volatile unsigned int stacks_all_ops = 0;
/* --stacks: how busy a loop's iteration is when gate_tick wakes the
 * sampler's gate (half --loop-threshold). */
const volatile __u64 gate_lead_ns = 0;
/* uvspan's own PID namespace (nsfs device and inode of /proc/self/ns/pid)
 * when it is not the initial one; 0: the initial namespace. Every pid and
 * tid the programs key maps by or send is the one uvspan sees, as its /proc,
 * perf_event_open and the uprobe pid filters do (see current_ids). */
const volatile __u64 pidns_dev = 0;
const volatile __u64 pidns_ino = 0;

/* The loop split (loop.h): the on-CPU time the scheduler has not yet added
 * to sum_exec_runtime (it does at ticks and switches) is added from
 * se.exec_start. Benchmark only: 0 (UVSPAN_BENCH_SCHED_RAW=1) reads the
 * counter as it is, to see what the catch-up changes. */
const volatile unsigned int sched_catchup = 1;

/* Kernel types (CO-RE: only the fields used). */
struct files_struct;
struct pid;

/* A task's scheduler accounting (the loop split, loop.h): its CPU time and
 * when that was last brought up to date (rq_clock_task), its time runnable
 * but waiting for a CPU (CONFIG_SCHED_INFO), its cgroup's CFS bandwidth. */
struct sched_entity {
	struct cfs_rq *cfs_rq;
	unsigned long long exec_start;
	unsigned long long sum_exec_runtime;
} __attribute__((preserve_access_index));

struct sched_info {
	unsigned long long run_delay;
} __attribute__((preserve_access_index));

struct cfs_bandwidth {
	unsigned long long quota;
	unsigned long long throttled_time;
} __attribute__((preserve_access_index));

struct task_group {
	struct task_group *parent;
	struct cfs_bandwidth cfs_bandwidth;
} __attribute__((preserve_access_index));

/* A CPU's run queue: its scheduler clock (sched_clock) and its task clock
 * (that minus the IRQ and steal time this CPU has had), as of its last
 * update. Their difference is the CPU's own: each CPU has its steal. A
 * running task reaches its CPU's through its CFS run queue
 * (CONFIG_FAIR_GROUP_SCHED; the per-CPU `runqueues` is no kernel symbol a
 * program can name without CONFIG_KALLSYMS_ALL). */
struct rq {
	unsigned long long clock;
	unsigned long long clock_task;
} __attribute__((preserve_access_index));

struct cfs_rq {
	struct rq *rq;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct files_struct *files;
	struct pid *thread_pid;
	struct task_struct *group_leader;
	int exit_code;
	struct sched_entity se;
	struct sched_info sched_info;
	unsigned long nvcsw;
	struct task_group *sched_task_group;
} __attribute__((preserve_access_index));

struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));

struct pid_namespace {
	struct ns_common ns;
} __attribute__((preserve_access_index));

struct upid {
	int nr;
	struct pid_namespace *ns;
} __attribute__((preserve_access_index));

struct pid {
	unsigned int level;
	struct upid numbers[1];
} __attribute__((preserve_access_index));

struct file;
struct fdtable {
	struct file **fd;
	unsigned int max_fds;
} __attribute__((preserve_access_index));

struct files_struct {
	struct fdtable *fdt;
} __attribute__((preserve_access_index));

struct file {
	void *private_data;
} __attribute__((preserve_access_index));

struct in6_addr___k {
	unsigned char s6_addr[16];
};

struct sock_common {
	unsigned int skc_daddr;
	unsigned short skc_dport;
	unsigned short skc_num;
	unsigned short skc_family;
	struct in6_addr___k skc_v6_daddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
} __attribute__((preserve_access_index));

struct socket {
	struct file *file;
	struct sock *sk;
} __attribute__((preserve_access_index));

/* Session uprobe kfuncs (Linux >= 6.13). User space loads the programs that
 * call them only where the kernel has session uprobes, so the weak kfuncs
 * are always there when they run. */
extern _Bool bpf_session_is_return(void) __ksym __weak;
extern __u64 *bpf_session_cookie(void) __ksym __weak;

/* A global function: one copy (each inlined lookup of an array map is an
 * instruction the verifier patches, and each patch costs the program's
 * length at load). */
__attribute__((noinline)) int stat_add(__u32 idx, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);
	if (v)
		*v += n;
	return 0;
}

static __always_inline void stat_inc(__u32 idx)
{
	stat_add(idx, 1);
}

/* How deep PID namespaces nest (the kernel's MAX_PID_NS_LEVEL). */
#define PIDNS_LEVELS 32

/* A task's number in uvspan's PID namespace (0: not visible there), from
 * its struct pid at `at` (0: none). A global function: inline, its walk of
 * the namespace levels was a third of the uprobe program at every place
 * that asks for the current ids (load time: the verifier's passes are
 * linear in the program's length, some of them per patched instruction). */
__attribute__((noinline)) __u32 pid_nr_ours(__u64 at)
{
	struct pid *p = (struct pid *)at;
	if (!p)
		return 0;
	unsigned int level = BPF_CORE_READ(p, level);
	for (int i = 0; i < PIDNS_LEVELS; i++) {
		if (i > level)
			break;
		struct upid u = {};
		if (bpf_core_read(&u, sizeof(u), &p->numbers[i]))
			break;
		if (BPF_CORE_READ(u.ns, ns.inum) == pidns_ino)
			return u.nr;
	}
	return 0;
}

/* (tgid << 32 | pid) of a task as uvspan sees them. */
static __always_inline __u64 task_ids(struct task_struct *t)
{
	if (!pidns_ino)
		return ((__u64)BPF_CORE_READ(t, tgid) << 32) | (__u32)BPF_CORE_READ(t, pid);
	__u64 tgid = pid_nr_ours((__u64)BPF_CORE_READ(t, group_leader, thread_pid));
	return (tgid << 32) | pid_nr_ours((__u64)BPF_CORE_READ(t, thread_pid));
}

/* (tgid << 32 | pid) of the current task as uvspan sees them: the kernel's
 * own ids where uvspan runs in the initial PID namespace; else the ids in
 * uvspan's namespace (one helper call for a task of that namespace, a walk
 * of the task's pid numbers for one nested below it), 0 for a task that
 * uvspan cannot see (never traced). A global function, the test of the
 * load-time constant included: inlined at each of the ~100 places that
 * ask, the side it rules out was as many runs of dead code for the
 * verifier to remove, each a pass over the whole program. */
__attribute__((noinline)) __u64 current_ids(void)
{
	if (!pidns_ino)
		return bpf_get_current_pid_tgid();
	struct bpf_pidns_info ns;
	if (!bpf_get_ns_current_pid_tgid(pidns_dev, pidns_ino, &ns, sizeof(ns)))
		return ((__u64)ns.tgid << 32) | ns.pid;
	return task_ids(bpf_get_current_task_btf());
}

static __always_inline int is_traced(__u32 pid)
{
	return bpf_map_lookup_elem(&traced, &pid) != NULL;
}

static __always_inline struct scratch *get_scratch(void)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_buf, &zero);
	if (!s)
		stat_inc(STAT_SCRATCH_MISS);
	return s;
}

/* Looked at once per this many bytes sent from a CPU: the fill is read
 * from the ring buffer's consumer position, a cache line user space
 * writes from another CPU. */
#define WAKE_CHECK_BYTES (16 * 1024)

/* Batch wakeups: wake the reader only once a good amount is waiting
 * (user space also reads on a timer, so nothing waits for long). A global
 * function: inlined at each of the ~40 places that send a record, its
 * per-CPU array lookup was as many patches of the program at load. */
__attribute__((noinline)) __u64 wake_flags_after(__u64 size)
{
	__u32 zero = 0;
	__u64 *sent = bpf_map_lookup_elem(&sent_bytes, &zero);
	if (sent) {
		*sent += size;
		if (*sent < WAKE_CHECK_BYTES)
			return BPF_RB_NO_WAKEUP;
		*sent = 0;
	}
	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
		return BPF_RB_FORCE_WAKEUP;
	return BPF_RB_NO_WAKEUP;
}

static __always_inline void emit_flags(void *data, __u64 size, __u64 flags)
{
	if (bpf_ringbuf_output(&events, data, size, flags))
		stat_inc(STAT_RINGBUF_LOST);
}

static __always_inline void emit(void *data, __u64 size)
{
	emit_flags(data, size, wake_flags_after(size));
}

/* The integer arguments of a function at its entry (System V x86_64):
 * 0-5 in registers, 6 and 7 on the stack above the return address (read
 * only when asked: `stack`). One array indexed by the cookie's argument
 * positions keeps the verifier's work small (a switch per lookup multiplied
 * its states). */
struct args {
	__u64 v[8];
};

static __always_inline void read_args(struct pt_regs *ctx, struct args *a, int stack)
{
	a->v[0] = PT_REGS_PARM1(ctx);
	a->v[1] = PT_REGS_PARM2(ctx);
	a->v[2] = PT_REGS_PARM3(ctx);
	a->v[3] = PT_REGS_PARM4(ctx);
	a->v[4] = PT_REGS_PARM5(ctx);
	a->v[5] = PT_REGS_PARM6(ctx);
	a->v[6] = 0;
	a->v[7] = 0;
	if (stack)
		bpf_probe_read_user(&a->v[6], 2 * sizeof(__u64), (void *)(PT_REGS_SP(ctx) + 8));
}

/* A 4-bit argument position of an fs submit cookie (enum cookie_layout in
 * uvspan.h; the cookies are built by src/probes/catalog.rs). */
#define cookie_field(c, shift) ((__u32)(((c) >> (shift)) & COOKIE_NONE))

#endif /* UVSPAN_COMMON_H */
