//! A loop thread's time as the kernel counts it (bpf/uvspan.h `struct
//! loop_time`, kept in the thread's `loops` entry and sent with its
//! process's exit record): decoded here, aggregated by [`crate::metrics`].

use crate::kernel::skel::types::uvspan_sizes;

/// Buckets of the kernel's loop-iteration histogram (its bounds + 1).
pub const ITER_BUCKETS: usize = uvspan_sizes::UVSPAN_ITER_BOUNDS.0 as usize + 1;

/// A loop thread's time as the kernel counts it (kernel ns): since when,
/// how long of it blocked in epoll waits, as of `now_ns`; the split of its
/// busy parts already ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoopTime {
    pub since_ns: u64,
    pub idle_ns: u64,
    pub now_ns: u64,
    pub split: BusySplit,
    pub iterations: Iterations,
}

/// The kernel's histogram of every iteration's busy time so far: counts per
/// bucket (bounds: bpf/uvspan.h's `UVSPAN_ITER_*`, as
/// `crate::metrics` exports them), and their busy time's sum (ns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Iterations {
    pub buckets: [u64; ITER_BUCKETS],
    pub busy_ns: u64,
}

impl LoopTime {
    /// The kernel's count (`Tracer::loop_time`) as of `now_ns`.
    pub fn of(t: &crate::kernel::skel::types::loop_time, now_ns: u64) -> LoopTime {
        let split = BusySplit { busy_ns: t.busy_ns, on_cpu_ns: t.on_cpu_ns, runqueue_ns: t.runqueue_ns };
        let iterations = Iterations { buckets: t.iter_buckets, busy_ns: t.iter_busy_ns };
        LoopTime { since_ns: t.since_ns, idle_ns: t.idle_ns, now_ns, split, iterations }
    }
}

/// The loop thread's busy parts already ended (kernel ns) and, of them, the
/// time on a CPU and runnable waiting for one (bpf/loop.h).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BusySplit {
    pub busy_ns: u64,
    pub on_cpu_ns: u64,
    pub runqueue_ns: u64,
}
