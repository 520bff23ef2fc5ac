//! The export queue: bounded in spans, shared fairly between the traced
//! processes (pure).
//!
//! Runs of one process's spans wait here, per process and in order, until
//! the export task takes them: one export request at a time, from each
//! process in turn. The bound counts what waits and what is being exported.
//!
//! A run that fits is always taken. When one does not, the processes' fair
//! share decides who loses: the bound divided by the number of processes
//! with spans queued (the arriving one counted). A process that would go
//! over its share with the run loses the run (its newest). One that stays
//! within its share takes the room from the others: the process holding the
//! most spans, while it is over its share, loses its newest runs still
//! waiting until the run fits (when that cannot make room, nothing is taken
//! from anyone and the run is lost). Runs are dropped whole: a run holds
//! whole requests. The cost is O(1) per run, plus a scan over the processes
//! queued for each run taken from another process.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

/// What the queue holds: a run of spans.
pub trait Run {
    /// How many spans.
    fn spans(&self) -> u64;
}

#[derive(Debug)]
pub struct Queue<R> {
    /// The bound, in spans.
    max: u64,
    /// Spans waiting and being exported.
    queued: u64,
    waiting: u64,
    procs: FxHashMap<u32, Proc<R>>,
    /// Processes with spans queued (waiting or being exported).
    active: usize,
    /// Whose turn is next: processes with runs waiting, each at most once.
    turns: VecDeque<u32>,
}

#[derive(Debug)]
struct Proc<R> {
    runs: VecDeque<R>,
    waiting: u64,
    /// Taken by the export task, not done yet.
    in_flight: u64,
    in_turns: bool,
}

impl<R> Proc<R> {
    fn queued(&self) -> u64 {
        self.waiting + self.in_flight
    }
}

impl<R: Run> Queue<R> {
    pub fn new(max: u64) -> Queue<R> {
        Queue { max: max.max(1), queued: 0, waiting: 0, procs: FxHashMap::default(), active: 0, turns: VecDeque::new() }
    }

    /// Spans waiting and being exported.
    pub fn len(&self) -> u64 {
        self.queued
    }

    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    /// Spans waiting (not being exported).
    pub fn waiting(&self) -> u64 {
        self.waiting
    }

    /// Whether `pid` has spans queued (waiting or being exported).
    pub fn holds(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| p.queued() > 0)
    }

    /// `pid`'s spans queued.
    pub fn queued_of(&self, pid: u32) -> u64 {
        self.procs.get(&pid).map_or(0, Proc::queued)
    }

    /// Queues `run` of `pid`, or drops it or other processes' newest runs
    /// as the fair share says; what is dropped goes to `dropped`, with its
    /// process.
    pub fn offer(&mut self, pid: u32, run: R, dropped: &mut Vec<(u32, R)>) {
        let n = run.spans();
        if self.queued + n > self.max {
            let mine = self.queued_of(pid);
            let share = self.max / (self.active + usize::from(mine == 0)) as u64;
            if mine + n > share {
                dropped.push((pid, run));
                return;
            }
            let from = dropped.len();
            while self.queued + n > self.max {
                let Some(victim) = self.largest_over(share, pid) else {
                    // No room to be had: what was taken goes back, in order.
                    for (v, r) in dropped.drain(from..).rev().collect::<Vec<_>>() {
                        self.push_newest(v, r);
                    }
                    dropped.push((pid, run));
                    return;
                };
                let r = self.pop_newest(victim);
                dropped.push((victim, r));
            }
        }
        self.push_newest(pid, run);
    }

    /// The next process's turn: its oldest runs waiting, at most `max_spans`
    /// spans (at least one run, which is never split), now being exported.
    pub fn take(&mut self, max_spans: usize) -> Option<(u32, Vec<R>)> {
        while let Some(pid) = self.turns.pop_front() {
            let Some(p) = self.procs.get_mut(&pid) else { continue };
            p.in_turns = false;
            if p.runs.is_empty() {
                self.tidy(pid);
                continue;
            }
            let mut out = Vec::new();
            let mut m = 0;
            while let Some(r) = p.runs.front() {
                let l = r.spans();
                if !out.is_empty() && m + l > max_spans as u64 {
                    break;
                }
                m += l;
                out.extend(p.runs.pop_front());
            }
            p.waiting -= m;
            p.in_flight += m;
            self.waiting -= m;
            if !p.runs.is_empty() {
                p.in_turns = true;
                self.turns.push_back(pid);
            }
            return Some((pid, out));
        }
        None
    }

    /// `spans` of `pid`'s being exported are done with (exported or lost).
    pub fn done(&mut self, pid: u32, spans: u64) {
        let Some(p) = self.procs.get_mut(&pid) else { return };
        let spans = spans.min(p.in_flight);
        p.in_flight -= spans;
        self.queued -= spans;
        if p.queued() == 0 && spans > 0 {
            self.active -= 1;
        }
        self.tidy(pid);
    }

    /// Runs of `pid` taken but not exported (to be tried again): waiting
    /// again, before its newer ones, and its turn first.
    pub fn put_back(&mut self, pid: u32, runs: Vec<R>) {
        let Some(p) = self.procs.get_mut(&pid) else { return };
        let m: u64 = runs.iter().map(Run::spans).sum();
        let m = m.min(p.in_flight);
        p.in_flight -= m;
        p.waiting += m;
        self.waiting += m;
        for r in runs.into_iter().rev() {
            p.runs.push_front(r);
        }
        if p.in_turns {
            if let Some(i) = self.turns.iter().position(|&t| t == pid) {
                self.turns.remove(i);
            }
        }
        p.in_turns = true;
        self.turns.push_front(pid);
    }

    fn push_newest(&mut self, pid: u32, run: R) {
        let n = run.spans();
        let p = self.procs.entry(pid).or_insert_with(|| Proc { runs: VecDeque::new(), waiting: 0, in_flight: 0, in_turns: false });
        if p.queued() == 0 && n > 0 {
            self.active += 1;
        }
        p.waiting += n;
        p.runs.push_back(run);
        self.waiting += n;
        self.queued += n;
        if !p.in_turns {
            p.in_turns = true;
            self.turns.push_back(pid);
        }
    }

    /// `pid`'s newest run waiting (there is one).
    fn pop_newest(&mut self, pid: u32) -> R {
        let p = self.procs.get_mut(&pid).expect("a process with runs waiting");
        let r = p.runs.pop_back().expect("a run waiting");
        let n = r.spans();
        p.waiting -= n;
        self.waiting -= n;
        self.queued -= n;
        if p.queued() == 0 && n > 0 {
            self.active -= 1;
        }
        // Left in `turns` when it is there: skipped when its turn comes.
        r
    }

    /// The process, other than `except`, with the most spans queued, over
    /// `share`, with a run waiting.
    fn largest_over(&self, share: u64, except: u32) -> Option<u32> {
        self.procs
            .iter()
            .filter(|(&pid, p)| pid != except && !p.runs.is_empty() && p.queued() > share)
            .max_by_key(|(&pid, p)| (p.queued(), std::cmp::Reverse(pid)))
            .map(|(&pid, _)| pid)
    }

    /// Forgets `pid` once it holds nothing and has no turn waiting.
    fn tidy(&mut self, pid: u32) {
        if self.procs.get(&pid).is_some_and(|p| p.queued() == 0 && p.runs.is_empty() && !p.in_turns) {
            self.procs.remove(&pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run: (its tag, its spans).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct R(u32, u64);

    impl Run for R {
        fn spans(&self) -> u64 {
            self.1
        }
    }

    fn offer(q: &mut Queue<R>, pid: u32, r: R) -> Vec<(u32, R)> {
        let mut d = Vec::new();
        q.offer(pid, r, &mut d);
        d
    }

    /// The queue's counts agree with its runs.
    fn consistent(q: &Queue<R>) {
        let waiting: u64 = q.procs.values().map(|p| p.runs.iter().map(|r| r.1).sum::<u64>()).sum();
        assert_eq!(waiting, q.waiting);
        assert_eq!(q.procs.values().map(|p| p.waiting).sum::<u64>(), q.waiting);
        assert_eq!(q.procs.values().map(Proc::queued).sum::<u64>(), q.queued);
        assert_eq!(q.procs.values().filter(|p| p.queued() > 0).count(), q.active);
        assert!(q.queued <= q.max, "over the bound: {} > {}", q.queued, q.max);
        for (pid, p) in &q.procs {
            assert_eq!(q.turns.iter().filter(|&&t| t == *pid).count(), usize::from(p.in_turns), "pid {pid} in turns once");
        }
    }

    #[test]
    fn what_fits_is_taken_whoever_sends_it() {
        let mut q = Queue::new(100);
        for i in 0..10 {
            assert!(offer(&mut q, 1, R(i, 9)).is_empty());
        }
        assert!(offer(&mut q, 2, R(99, 10)).is_empty(), "one process over its share while there is room loses nothing");
        assert_eq!((q.len(), q.waiting(), q.queued_of(1), q.queued_of(2)), (100, 100, 90, 10));
        consistent(&q);
    }

    #[test]
    fn a_process_over_its_share_loses_its_newest_run_when_full() {
        let mut q = Queue::new(100);
        for i in 0..10 {
            offer(&mut q, 1, R(i, 10));
        }
        // Alone, its share is the whole queue: the run that does not fit is lost.
        assert_eq!(offer(&mut q, 1, R(10, 10)), [(1, R(10, 10))]);
        assert_eq!(q.len(), 100);
        consistent(&q);
    }

    #[test]
    fn a_process_within_its_share_takes_room_from_the_largest_newest_first() {
        let mut q = Queue::new(100);
        for i in 0..10 {
            offer(&mut q, 1, R(i, 10));
        }
        // Process 2's share is 50: its runs get in, process 1's newest go.
        assert_eq!(offer(&mut q, 2, R(100, 15)), [(1, R(9, 10)), (1, R(8, 10))]);
        assert_eq!((q.queued_of(1), q.queued_of(2), q.len()), (80, 15, 95));
        assert!(offer(&mut q, 2, R(101, 5)).is_empty(), "room left: taken");
        assert_eq!(offer(&mut q, 2, R(102, 30)), [(1, R(7, 10)), (1, R(6, 10)), (1, R(5, 10))]);
        assert_eq!((q.queued_of(1), q.queued_of(2)), (50, 50));
        // Now at its share: process 2's next run is its own loss, and so is 1's.
        assert_eq!(offer(&mut q, 2, R(103, 1)), [(2, R(103, 1))]);
        assert_eq!(offer(&mut q, 1, R(104, 1)), [(1, R(104, 1))]);
        consistent(&q);
        // Each keeps its oldest runs, in order.
        let mut got = Vec::new();
        while let Some((pid, runs)) = q.take(1000) {
            got.push((pid, runs.iter().map(|r| r.0).collect::<Vec<_>>()));
            let n = runs.iter().map(|r| r.1).sum();
            q.done(pid, n);
        }
        assert_eq!(got, [(1, vec![0, 1, 2, 3, 4]), (2, vec![100, 101, 102])]);
        assert!(q.is_empty() && q.procs.is_empty() && q.turns.is_empty());
    }

    #[test]
    fn the_share_counts_every_process_with_spans_queued() {
        let mut q = Queue::new(90);
        for i in 0..6 {
            offer(&mut q, 1, R(i, 10));
        }
        for i in 0..3 {
            offer(&mut q, 2, R(10 + i, 10));
        }
        // Three processes: a share of 30. Process 3 gets 30 in, from process 1
        // (the largest, over its share); process 2 (at 30) keeps its runs.
        for i in 0..3 {
            assert_eq!(offer(&mut q, 3, R(20 + i, 10)), [(1, R(5 - i, 10))]);
        }
        assert_eq!((q.queued_of(1), q.queued_of(2), q.queued_of(3)), (30, 30, 30));
        assert_eq!(offer(&mut q, 3, R(23, 10)), [(3, R(23, 10))], "process 3 at its share");
        consistent(&q);
    }

    #[test]
    fn spans_being_exported_count_for_the_bound_and_the_share_but_are_not_taken() {
        let mut q = Queue::new(100);
        for i in 0..10 {
            offer(&mut q, 1, R(i, 10));
        }
        // Process 1's oldest 80 are being exported; 20 wait.
        let (pid, runs) = q.take(80).expect("a turn");
        assert_eq!((pid, runs.len(), q.waiting(), q.len()), (1, 8, 20, 100));
        // Process 2 within its share: only what waits can make room.
        assert_eq!(offer(&mut q, 2, R(100, 20)), [(1, R(9, 10)), (1, R(8, 10))]);
        assert_eq!(offer(&mut q, 2, R(101, 10)), [(2, R(101, 10))], "nothing of 1's waits: 2's run is lost, none of 1's");
        consistent(&q);
        q.done(1, 80);
        assert_eq!((q.len(), q.queued_of(1), q.queued_of(2)), (20, 0, 20));
        assert!(offer(&mut q, 2, R(102, 30)).is_empty());
        consistent(&q);
    }

    #[test]
    fn when_no_room_can_be_made_nothing_is_taken_from_anyone() {
        let mut q = Queue::new(100);
        for i in 0..5 {
            offer(&mut q, 1, R(i, 10));
        }
        offer(&mut q, 1, R(5, 45));
        // Its first 50 spans are taken for export in two requests (the run
        // of 45 would make the second too large).
        let (_, runs) = q.take(40).expect("a turn");
        assert_eq!(runs, [R(0, 10), R(1, 10), R(2, 10), R(3, 10)]);
        let (_, runs) = q.take(40).expect("a turn");
        assert_eq!(runs, [R(4, 10)]);
        // 50 in flight, 45 waiting in one run; 2's share is 50 and it
        // needs 35 more than the 5 free: taking 1's run (over its share) makes it.
        assert_eq!(offer(&mut q, 2, R(100, 40)), [(1, R(5, 45))]);
        // 60 being exported and a run of 30 waiting: that run makes the room.
        let mut q2 = Queue::new(100);
        offer(&mut q2, 1, R(0, 60));
        q2.take(100);
        offer(&mut q2, 1, R(1, 30));
        assert_eq!(offer(&mut q2, 2, R(2, 20)), [(1, R(1, 30))]);
        // Again with 1's waiting runs too small to make room: none goes.
        let mut q3 = Queue::new(100);
        offer(&mut q3, 1, R(0, 85));
        q3.take(100);
        offer(&mut q3, 1, R(1, 5));
        offer(&mut q3, 1, R(2, 5));
        assert_eq!(offer(&mut q3, 2, R(3, 20)), [(2, R(3, 20))]);
        assert_eq!(q3.queued_of(1), 95, "1's runs are back");
        let (_, runs) = {
            q3.done(1, 85);
            q3.take(100).expect("a turn")
        };
        assert_eq!(runs, [R(1, 5), R(2, 5)], "in their order");
        for q in [&q, &q2, &q3] {
            consistent(q);
        }
    }

    #[test]
    fn turns_go_round_one_request_at_a_time_and_never_split_a_run() {
        let mut q = Queue::new(1000);
        for i in 0..4 {
            offer(&mut q, 1, R(i, 3));
        }
        offer(&mut q, 2, R(10, 12));
        offer(&mut q, 2, R(11, 2));
        offer(&mut q, 3, R(20, 1));
        let mut got = Vec::new();
        while let Some((pid, runs)) = q.take(10) {
            got.push((pid, runs.iter().map(|r| r.0).collect::<Vec<_>>()));
            q.done(pid, runs.iter().map(|r| r.1).sum());
        }
        assert_eq!(got, [(1, vec![0, 1, 2]), (2, vec![10]), (3, vec![20]), (1, vec![3]), (2, vec![11])], "a run over the limit goes alone");
        assert!(q.is_empty() && q.procs.is_empty());
    }

    #[test]
    fn runs_put_back_go_first_in_their_order() {
        let mut q = Queue::new(100);
        for i in 0..4 {
            offer(&mut q, 1, R(i, 5));
        }
        offer(&mut q, 2, R(10, 5));
        let (pid, runs) = q.take(10).expect("a turn");
        assert_eq!((pid, runs.clone()), (1, vec![R(0, 5), R(1, 5)]));
        offer(&mut q, 1, R(4, 5));
        q.put_back(1, runs);
        consistent(&q);
        assert_eq!((q.waiting(), q.len()), (30, 30));
        let (pid, runs) = q.take(10).expect("a turn");
        assert_eq!((pid, runs), (1, vec![R(0, 5), R(1, 5)]), "the failed request is tried again first");
        q.done(1, 10);
        let order: Vec<u32> = std::iter::from_fn(|| {
            let (pid, runs) = q.take(10)?;
            q.done(pid, runs.iter().map(|r| r.1).sum());
            Some(pid)
        })
        .collect();
        assert_eq!(order, [2, 1, 1]);
        consistent(&q);
    }

    /// A flood beside a quiet process, through a small queue the export task
    /// drains now and then: the quiet one, within its share, loses nothing;
    /// every span of the flood is queued or dropped, never both.
    #[test]
    fn a_flood_does_not_take_a_quiet_process_s_runs() {
        let mut q = Queue::new(500);
        let (mut quiet_in, mut quiet_out, mut flood_in, mut flood_out, mut flood_lost) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut tag = 0;
        for round in 0..200 {
            for _ in 0..20 {
                tag += 1;
                flood_in += 50;
                for (pid, r) in offer(&mut q, 1, R(tag, 50)) {
                    assert_eq!(pid, 1, "round {round}: the quiet process lost a run");
                    flood_lost += r.1;
                }
            }
            tag += 1;
            quiet_in += 3;
            for (pid, r) in offer(&mut q, 2, R(tag, 3)) {
                assert_eq!(pid, 1, "round {round}: the quiet process lost a run");
                flood_lost += r.1;
            }
            consistent(&q);
            // The export task takes a few requests.
            for _ in 0..3 {
                if let Some((pid, runs)) = q.take(100) {
                    let n = runs.iter().map(|r| r.1).sum();
                    if pid == 2 {
                        quiet_out += n
                    } else {
                        flood_out += n
                    }
                    q.done(pid, n);
                }
            }
        }
        while let Some((pid, runs)) = q.take(100) {
            let n = runs.iter().map(|r| r.1).sum();
            if pid == 2 {
                quiet_out += n
            } else {
                flood_out += n
            }
            q.done(pid, n);
        }
        assert_eq!(quiet_out, quiet_in);
        assert!(flood_lost > 0);
        assert_eq!(flood_out + flood_lost, flood_in);
    }
}
