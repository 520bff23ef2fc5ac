//! V8 garbage collections waiting for their loop iteration: the kernel sends
//! one record per collection as it ends, and the iteration's own record
//! after it (same thread, so in order). A slow iteration takes the
//! collections that started in it; those of fast iterations (never reported)
//! are dropped at the next slow one. Bounded per thread.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::decode::{GcRecord, LoopRecord};

/// Collections kept per thread until its next slow iteration (an
/// allocation-heavy second sees a few hundred scavenges).
pub const PENDING_MAX: usize = 4096;

#[derive(Debug, Default)]
pub struct PendingGcs {
    by_thread: FxHashMap<(u32, u32), VecDeque<GcRecord>>,
    /// Collections dropped because a thread had [`PENDING_MAX`] waiting.
    pub dropped: u64,
}

impl PendingGcs {
    pub fn add(&mut self, r: GcRecord) {
        let q = self.by_thread.entry((r.pid, r.tid)).or_default();
        if q.len() >= PENDING_MAX {
            q.pop_front();
            self.dropped += 1;
        }
        q.push_back(r);
    }

    /// The collections that started in iteration `r` (in order); earlier
    /// ones are dropped, later ones kept for the next.
    pub fn take(&mut self, r: &LoopRecord) -> Vec<GcRecord> {
        let Some(q) = self.by_thread.get_mut(&(r.pid, r.tid)) else { return Vec::new() };
        while q.front().is_some_and(|g| g.start_ns < r.start_ns) {
            q.pop_front();
        }
        let n = q.iter().take_while(|g| g.start_ns <= r.end_ns).count();
        let out = q.drain(..n).collect();
        if q.is_empty() {
            self.by_thread.remove(&(r.pid, r.tid));
        }
        out
    }

    /// The process is gone.
    pub fn forget(&mut self, pid: u32) {
        self.by_thread.retain(|(p, _), _| *p != pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::decode::GcType;

    fn gc(tid: u32, start_ns: u64) -> GcRecord {
        GcRecord { pid: 1, tid, gc_type: GcType::Minor, start_ns, end_ns: start_ns + 5 }
    }

    fn iteration(tid: u32, start_ns: u64, end_ns: u64) -> LoopRecord {
        LoopRecord::test(1, tid, start_ns, end_ns)
    }

    #[test]
    fn an_iteration_takes_its_own_thread_s_collections_in_its_bounds() {
        let mut p = PendingGcs::default();
        for r in [gc(1, 50), gc(1, 100), gc(2, 120), gc(1, 150), gc(1, 300)] {
            p.add(r);
        }
        let got: Vec<u64> = p.take(&iteration(1, 100, 200)).iter().map(|g| g.start_ns).collect();
        assert_eq!(got, [100, 150], "the one before (a fast iteration's) dropped, the later one kept");
        let got: Vec<u64> = p.take(&iteration(1, 250, 400)).iter().map(|g| g.start_ns).collect();
        assert_eq!(got, [300]);
        assert_eq!(p.take(&iteration(2, 100, 200)).len(), 1, "another thread's are its own");
        assert!(p.by_thread.is_empty());
    }

    #[test]
    fn bounded_per_thread_and_forgotten_with_the_process() {
        let mut p = PendingGcs::default();
        for i in 0..PENDING_MAX as u64 + 10 {
            p.add(gc(1, i));
        }
        assert_eq!(p.dropped, 10);
        assert_eq!(p.by_thread[&(1, 1)].len(), PENDING_MAX);
        assert_eq!(p.by_thread[&(1, 1)].front().map(|g| g.start_ns), Some(10), "the oldest go");
        p.forget(1);
        assert!(p.by_thread.is_empty());
    }
}
