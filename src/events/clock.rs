//! Kernel timestamps (`bpf_ktime_get_ns`, CLOCK_MONOTONIC) to wall-clock time.
//!
//! The offset REALTIME − MONOTONIC is estimated from many paired reads, keeping
//! the pair read in the shortest window (least disturbed by preemption), as
//! opentelemetry-go-instrumentation does. It is re-estimated periodically so
//! NTP adjustments are followed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own; both clocks used
    // here always exist on Linux, so it cannot fail.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

/// Nanoseconds since boot on CLOCK_MONOTONIC, as bpf_ktime_get_ns() reads it.
pub fn monotonic_ns() -> u64 {
    now_ns(libc::CLOCK_MONOTONIC) as u64
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clock {
    /// realtime_ns - monotonic_ns
    offset_ns: i128,
}

impl Clock {
    /// A clock with a known offset (tests, replays).
    pub fn with_offset(offset_ns: i128) -> Self {
        Clock { offset_ns }
    }

    /// Estimates the offset: the best of `samples` reads.
    pub fn estimate(samples: usize) -> Self {
        let mut best: Option<(i128, i128)> = None; // (window, offset)
        for _ in 0..samples.max(1) {
            let m1 = now_ns(libc::CLOCK_MONOTONIC);
            let r = now_ns(libc::CLOCK_REALTIME);
            let m2 = now_ns(libc::CLOCK_MONOTONIC);
            let window = m2 - m1;
            let offset = r - (m1 + m2) / 2;
            if best.is_none_or(|(w, _)| window < w) {
                best = Some((window, offset));
            }
        }
        Clock { offset_ns: best.map_or(0, |b| b.1) }
    }

    pub fn to_wall(&self, mono_ns: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.to_wall_ns(mono_ns))
    }

    /// Wall clock in nanoseconds since the Unix epoch (0 before it).
    pub fn to_wall_ns(&self, mono_ns: u64) -> u64 {
        let ns = i128::from(mono_ns) + self.offset_ns;
        ns.clamp(0, i128::from(u64::MAX)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimate_agrees_with_system_time() {
        let c = Clock::estimate(25);
        let before = SystemTime::now();
        let wall = c.to_wall(monotonic_ns());
        let after = SystemTime::now();
        // Preemption can only widen [before, after]; the estimate must fall inside it (±1 ms).
        let slack = Duration::from_millis(1);
        assert!(wall + slack >= before && wall <= after + slack, "{wall:?} not in [{before:?}, {after:?}]");
    }

    #[test]
    fn fixed_offset() {
        let c = Clock::with_offset(1_000_000_000);
        assert_eq!(c.to_wall(500), UNIX_EPOCH + Duration::from_nanos(1_000_000_500));
    }
}
