//! What the probes cost the traced app, measured while it runs, and the
//! live share that holds a budget (`--max-overhead`). Pure: fed with what
//! `/proc` says at the sampling windows' edges (`agent/sampling.rs`).
//!
//! The app's CPU per unit of work while the probes are live is set against
//! its CPU per unit of work in the time off right after, a pair of
//! segments close in time, so that a change of load between pairs cancels.
//! The unit of work is the bytes the app's threads read and wrote (as for
//! the work share, `IoShare`): how many system calls a request takes
//! changes with the slowdown itself, its bytes do not. CPU is each thread's
//! time on a CPU (`/proc/PID/task/TID/schedstat`), which holds the time the
//! kernel spends in the uprobe traps (charged to the thread that trapped).
//!
//! The ratio `r` of a pair is (CPU/byte live) ÷ (CPU/byte off); the estimate
//! is the median of the last [`PAIRS`] pairs, with the order-statistic
//! interval of the median (≈95%). With a share `s` of the work seen live,
//! the probes add `s·(r−1)` to the CPU the app would use without them.

use std::collections::{HashMap, VecDeque};

/// One thread's counters: ns on a CPU, bytes read and written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_ns: u64,
    pub bytes: u64,
}

/// A stretch of one process's time between two edges, live or off.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Segment {
    pub live: bool,
    pub ns: u64,
    pub cpu_ns: u64,
    pub bytes: u64,
}

/// The pairs the estimate is the median of.
pub const PAIRS: usize = 15;
/// Fewer pairs than this: no estimate.
pub const MIN_PAIRS: usize = 3;
/// A segment with less CPU than this (2 ms) or fewer bytes than
/// [`MIN_BYTES`] makes its pair too noisy to use: skipped, counted.
pub const MIN_CPU_NS: u64 = 2_000_000;
pub const MIN_BYTES: u64 = 4096;

/// The estimate for one process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// CPU per byte live ÷ off: the median of the pairs.
    pub ratio: f64,
    /// The order-statistic interval of the median (≈95%).
    pub low: f64,
    pub high: f64,
    /// Pairs it is made of.
    pub pairs: usize,
    /// Bytes per second live ÷ off (below 1: the probes slow the app).
    pub q: f64,
}

impl Estimate {
    /// CPU the probes add, as a share of the app's CPU without them, when
    /// the windows see `work_share` of its work.
    pub fn added(&self, work_share: f64) -> f64 {
        (work_share * (self.ratio - 1.0)).max(0.0)
    }

    /// The share of the work the windows see when they hold `time_share`
    /// of the time.
    pub fn work_share(&self, time_share: f64) -> f64 {
        let (t, q) = (time_share.clamp(0.0, 1.0), self.q);
        let live = t * q;
        if live + (1.0 - t) <= 0.0 {
            return t;
        }
        live / (live + 1.0 - t)
    }

    /// The share of the time that makes the windows see `work_share` of the
    /// work: `t = s / (q(1−s) + s)`.
    pub fn time_share(&self, work_share: f64) -> f64 {
        let s = work_share.clamp(0.0, 1.0);
        let d = self.q * (1.0 - s) + s;
        if d <= 0.0 {
            return s;
        }
        s / d
    }
}

struct Pair {
    ratio: f64,
    live: Segment,
    off: Segment,
}

fn enough(s: &Segment) -> bool {
    s.cpu_ns >= MIN_CPU_NS && s.bytes >= MIN_BYTES && s.ns > 0
}

/// One process's pairs.
#[derive(Default)]
pub struct Estimator {
    /// The live segment waiting for the off one after it.
    live: Option<Segment>,
    pairs: VecDeque<Pair>,
    /// Windows that ended with their time off after them.
    pub windows: u64,
    /// Of them, pairs with too little work or CPU to use.
    pub skipped: u64,
}

impl Estimator {
    /// The next segment of the process (a live one, then the off one after
    /// it make a pair; an off one with no live one before it is not used).
    pub fn add(&mut self, s: Segment) {
        if s.live {
            self.live = Some(s);
            return;
        }
        let Some(live) = self.live.take() else { return };
        self.windows += 1;
        if !enough(&live) || !enough(&s) {
            self.skipped += 1;
            return;
        }
        let per = |x: &Segment| x.cpu_ns as f64 / x.bytes as f64;
        let ratio = per(&live) / per(&s);
        if !ratio.is_finite() || ratio <= 0.0 {
            self.skipped += 1;
            return;
        }
        self.pairs.push_back(Pair { ratio, live, off: s });
        if self.pairs.len() > PAIRS {
            self.pairs.pop_front();
        }
    }

    /// None: fewer than [`MIN_PAIRS`] pairs with enough work.
    pub fn estimate(&self) -> Option<Estimate> {
        let n = self.pairs.len();
        if n < MIN_PAIRS {
            return None;
        }
        let mut v: Vec<f64> = self.pairs.iter().map(|p| p.ratio).collect();
        v.sort_by(f64::total_cmp);
        let ratio = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        // The median lies between the k-th smallest and k-th largest with
        // ≈95% confidence (binomial, normal approximation).
        let k = ((n as f64 - 1.96 * (n as f64).sqrt()) / 2.0).floor().max(0.0) as usize;
        let (low, high) = (v[k], v[n - 1 - k]);
        let sum = |f: fn(&Pair) -> &Segment| {
            self.pairs.iter().map(f).fold((0u64, 0u64), |(b, t), s| (b.saturating_add(s.bytes), t.saturating_add(s.ns)))
        };
        let rate = |(b, t): (u64, u64)| if t == 0 { 0.0 } else { b as f64 / t as f64 };
        let (live, off) = (rate(sum(|p| &p.live)), rate(sum(|p| &p.off)));
        let q = if off > 0.0 && live > 0.0 { (live / off).clamp(0.05, 20.0) } else { 1.0 };
        Some(Estimate { ratio, low, high, pairs: n, q })
    }
}

/// The segments of each process from its threads' counters read at the
/// edges: a segment begins at one reading and ends at the next `end`.
#[derive(Default)]
pub struct Meter {
    open: HashMap<u32, (u64, bool, HashMap<u32, Usage>)>,
    pub by_pid: HashMap<u32, Estimator>,
}

impl Meter {
    /// A segment (live or off) begins at `t_ns` for each process read.
    pub fn begin(&mut self, t_ns: u64, live: bool, readings: impl IntoIterator<Item = (u32, Vec<(u32, Usage)>)>) {
        self.open.clear();
        for (pid, threads) in readings {
            self.open.insert(pid, (t_ns, live, threads.into_iter().collect()));
        }
    }

    /// The segments end at `t_ns`. Counted per thread: a thread in both
    /// readings adds what it moved (one that exited or began between them
    /// is left out; Node's threads live as long as their process). A
    /// process gone (no threads) ends nothing.
    pub fn end(&mut self, t_ns: u64, readings: impl IntoIterator<Item = (u32, Vec<(u32, Usage)>)>) {
        for (pid, threads) in readings {
            let Some((t0, live, before)) = self.open.remove(&pid) else { continue };
            if threads.is_empty() {
                continue;
            }
            let mut s = Segment { live, ns: t_ns.saturating_sub(t0), ..Default::default() };
            for (tid, u) in threads {
                if let Some(b) = before.get(&tid) {
                    s.cpu_ns += u.cpu_ns.saturating_sub(b.cpu_ns);
                    s.bytes += u.bytes.saturating_sub(b.bytes);
                }
            }
            self.by_pid.entry(pid).or_default().add(s);
        }
        self.open.clear();
    }
}

/// The least share of the time the probes are live under a budget.
pub const MIN_SHARE: f64 = 0.02;
/// The most: the time off is what the cost is measured against.
pub const MAX_SHARE: f64 = 0.9;
/// The share a budget starts at (without --sample-time).
pub const START_SHARE: f64 = 0.1;
/// How much the share may grow from one period to the next.
pub const RISE: f64 = 1.5;

/// `--max-overhead`: the live share of the time for the next period.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Controller {
    /// The CPU the probes may add, as a share of the app's own.
    pub budget: f64,
    /// The largest share of the time (--sample-time, or [`MAX_SHARE`]).
    pub max: f64,
    /// The share in force.
    pub share: f64,
}

impl Controller {
    /// Starting at `start` (--sample-time) or [`START_SHARE`].
    pub fn new(budget: f64, start: Option<f64>) -> Controller {
        let max = start.unwrap_or(MAX_SHARE).clamp(MIN_SHARE, MAX_SHARE);
        Controller { budget, max, share: start.unwrap_or(START_SHARE).clamp(MIN_SHARE, max) }
    }

    /// The share of the time that holds the budget for a process with this
    /// estimate (clamped to the bounds).
    pub fn target(&self, e: &Estimate) -> f64 {
        let work = if e.ratio > 1.0 { self.budget / (e.ratio - 1.0) } else { 1.0 };
        e.time_share(work.clamp(0.0, 1.0)).clamp(MIN_SHARE, self.max)
    }

    /// Whether even the least share costs more than the budget.
    pub fn cannot_hold(&self, e: &Estimate) -> bool {
        e.added(e.work_share(MIN_SHARE)) > self.budget
    }

    /// The share for the next period from every process's estimate: the
    /// one that holds the budget for the most expensive of them; down at
    /// once, up by at most [`RISE`] a period. No estimate: unchanged.
    pub fn next(&mut self, estimates: impl IntoIterator<Item = Estimate>) -> f64 {
        let Some(target) = estimates.into_iter().map(|e| self.target(&e)).min_by(f64::total_cmp) else { return self.share };
        self.share = target.min(self.share * RISE).clamp(MIN_SHARE, self.max);
        self.share
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A period at `share` live of `period_ms`: the live and the off
    /// segment of an app moving `rate` bytes per ms with `cpu_per_byte` ns
    /// off, `r` times that live, slowed to `q` of its rate while live.
    fn period(share: f64, rate: f64, cpu_per_byte: f64, r: f64, q: f64) -> [Segment; 2] {
        let (live_ms, off_ms) = (1000.0 * share, 1000.0 * (1.0 - share));
        let seg = |live: bool, ms: f64, rate: f64, per: f64| {
            let bytes = (ms * rate) as u64;
            Segment { live, ns: (ms * MS as f64) as u64, cpu_ns: (bytes as f64 * per) as u64, bytes }
        };
        [seg(true, live_ms, rate * q, cpu_per_byte * r), seg(false, off_ms, rate, cpu_per_byte)]
    }

    /// Deterministic noise in [−1, 1].
    fn noise(i: u64) -> f64 {
        // splitmix64
        let mut x = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x = (x ^ (x >> 31)) >> 11;
        (x as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }

    #[test]
    fn no_work_gives_no_estimate() {
        let mut e = Estimator::default();
        for _ in 0..20 {
            e.add(Segment { live: true, ns: 100 * MS, cpu_ns: 50_000, bytes: 0 });
            e.add(Segment { live: false, ns: 900 * MS, cpu_ns: 400_000, bytes: 0 });
        }
        assert_eq!(e.estimate(), None);
        assert_eq!((e.windows, e.skipped), (20, 20));
        // CPU but no bytes (a busy loop that moves nothing) is no unit of work either.
        let mut e = Estimator::default();
        for _ in 0..5 {
            e.add(Segment { live: true, ns: 100 * MS, cpu_ns: 100 * MS, bytes: 0 });
            e.add(Segment { live: false, ns: 900 * MS, cpu_ns: 900 * MS, bytes: 10 });
        }
        assert_eq!(e.estimate(), None);
        // Two good pairs are not enough.
        let mut e = Estimator::default();
        for s in period(0.1, 1000.0, 100.0, 2.0, 1.0).into_iter().chain(period(0.1, 1000.0, 100.0, 2.0, 1.0)) {
            e.add(s);
        }
        assert_eq!(e.estimate(), None);
        // An off segment with no live one before it pairs with nothing.
        e.add(period(0.1, 1000.0, 100.0, 2.0, 1.0)[1]);
        assert_eq!((e.windows, e.estimate()), (2, None));
    }

    #[test]
    fn a_steady_load_gives_its_ratio_and_rate() {
        let mut e = Estimator::default();
        for _ in 0..10 {
            for s in period(0.1, 500.0, 200.0, 3.0, 0.5) {
                e.add(s);
            }
        }
        let est = e.estimate().expect("an estimate");
        assert!((est.ratio - 3.0).abs() < 1e-6 && est.low <= est.ratio && est.ratio <= est.high, "{est:?}");
        assert!((est.q - 0.5).abs() < 0.01, "{est:?}");
        assert_eq!(est.pairs, 10);
        assert!((est.added(0.1) - 0.2).abs() < 1e-6);
        // A time share and the work share it sees, one the other's inverse.
        let s = est.work_share(0.1);
        assert!((s - 0.05 / 0.95).abs() < 1e-9, "{s}");
        assert!((est.time_share(s) - 0.1).abs() < 1e-9);
    }

    /// A step in load between pairs cancels: each pair is close in time.
    #[test]
    fn a_step_in_load_cancels_in_the_pairs() {
        let mut e = Estimator::default();
        for i in 0..30 {
            let rate = if i < 15 { 100.0 } else { 5000.0 };
            for s in period(0.2, rate, 150.0, 1.4, 0.9) {
                e.add(s);
            }
            if let Some(est) = e.estimate() {
                assert!((est.ratio - 1.4).abs() < 1e-6, "period {i}: {est:?}");
            }
        }
        assert_eq!(e.estimate().map(|x| x.pairs), Some(PAIRS));
    }

    /// Noisy pairs: the median and its interval hold the true ratio; a few
    /// wild pairs (a GC in one segment) move neither far.
    #[test]
    fn noise_and_outliers_stay_in_the_interval() {
        let mut e = Estimator::default();
        for i in 0..40u64 {
            let mut p = period(0.1, 1000.0, 100.0, 2.0, 0.8);
            p[0].cpu_ns = (p[0].cpu_ns as f64 * (1.0 + 0.2 * noise(i))) as u64;
            p[1].cpu_ns = (p[1].cpu_ns as f64 * (1.0 + 0.2 * noise(i + 1000))) as u64;
            if i % 7 == 0 {
                p[0].cpu_ns *= 10;
            }
            for s in p {
                e.add(s);
            }
        }
        let est = e.estimate().expect("an estimate");
        assert!(est.low <= 2.0 && 2.0 <= est.high, "{est:?}");
        assert!((est.ratio - 2.0).abs() < 0.4 && est.high < 4.0, "{est:?}");
    }

    /// A series recorded from the busy test app with no probes at all (the
    /// machine busy with other work): the truth is 1, and the interval
    /// holds it; with the live half made dearer by 40%, the estimate moves
    /// by that.
    #[test]
    fn a_recorded_series_without_probes_gives_one() {
        let segs: Vec<Segment> = include_str!("../../tests/golden/cost/busy_no_probes.txt")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let v: Vec<u64> = l.split_whitespace().map(|x| x.parse().expect("a number")).collect();
                Segment { live: v[0] == 1, ns: v[1], cpu_ns: v[2], bytes: v[3] }
            })
            .collect();
        let mut e = Estimator::default();
        segs.iter().for_each(|&s| e.add(s));
        let est = e.estimate().expect("an estimate");
        assert!(est.low <= 1.0 && 1.0 <= est.high, "{est:?}");
        assert_eq!((e.windows, e.skipped), (14, 0));
        let mut dear = Estimator::default();
        segs.iter().map(|&s| if s.live { Segment { cpu_ns: s.cpu_ns * 14 / 10, ..s } } else { s }).for_each(|s| dear.add(s));
        let d = dear.estimate().expect("an estimate");
        assert!((d.ratio / est.ratio - 1.4).abs() < 1e-3, "{d:?} vs {est:?}");
    }

    #[test]
    fn the_meter_counts_threads_in_both_readings() {
        let u = |cpu_ns, bytes| Usage { cpu_ns, bytes };
        let mut m = Meter::default();
        m.begin(0, true, [(7, vec![(7, u(100, 10)), (8, u(1000, 0))]), (9, vec![(9, u(0, 0))])]);
        // Thread 8 exited, thread 10 began; process 9 is gone.
        m.end(50, [(7, vec![(7, u(300, 40)), (10, u(5000, 5000))]), (9, vec![])]);
        m.begin(50, false, [(7, vec![(7, u(300, 40))])]);
        m.end(80, [(7, vec![(7, u(400, 50))])]);
        let e = &m.by_pid[&7];
        assert_eq!(e.windows, 1);
        assert!(!m.by_pid.contains_key(&9));
        // What a process read at an end it was not begun for is not a segment.
        m.end(90, [(11, vec![(11, u(1, 1))])]);
        assert!(!m.by_pid.contains_key(&11));
    }

    fn est(ratio: f64, q: f64) -> Estimate {
        Estimate { ratio, low: ratio, high: ratio, pairs: PAIRS, q }
    }

    #[test]
    fn the_share_holds_the_budget_for_the_most_expensive_process() {
        let mut c = Controller::new(0.05, None);
        assert_eq!(c.share, START_SHARE);
        // +50% live: a tenth of the work holds 5%; unslowed, a tenth of the time.
        assert!((c.target(&est(1.5, 1.0)) - 0.1).abs() < 1e-9);
        // Slowed to half while live: more of the time for that work.
        let slowed = est(1.5, 0.5);
        assert!((slowed.work_share(c.target(&slowed)) - 0.1).abs() < 1e-9);
        assert!(c.target(&slowed) > 0.1);
        // Two processes: the dearer one decides, at once.
        let s = c.next([est(1.1, 1.0), est(3.5, 1.0)]);
        assert!((s - 0.02).abs() < 1e-9, "{s}");
        // Cheap probes: the share rises by at most RISE a period, to the most.
        let mut seen = vec![];
        for _ in 0..12 {
            seen.push(c.next([est(1.01, 1.0)]));
        }
        assert!(seen.windows(2).all(|w| w[1] <= w[0] * RISE + 1e-12 && w[1] >= w[0]), "{seen:?}");
        assert_eq!(seen.last().copied(), Some(MAX_SHARE));
        // No estimate: unchanged.
        assert_eq!(c.next([]), MAX_SHARE);
        // Probes that cost nothing measurable (r ≤ 1): the most.
        assert_eq!(c.target(&est(0.9, 1.0)), MAX_SHARE);
    }

    #[test]
    fn a_budget_that_cannot_be_held_is_said() {
        let c = Controller::new(0.01, None);
        // +300% live: even 2% of the work adds 6%.
        assert!(c.cannot_hold(&est(4.0, 1.0)));
        assert_eq!(c.target(&est(4.0, 1.0)), MIN_SHARE);
        // +40%: 2% of the work adds 0.8%, within.
        assert!(!c.cannot_hold(&est(1.4, 1.0)));
    }

    #[test]
    fn sample_time_is_the_start_and_the_most() {
        let c = Controller::new(0.05, Some(0.3));
        assert_eq!((c.share, c.max), (0.3, 0.3));
        let c = Controller::new(0.05, Some(1.0));
        assert_eq!((c.share, c.max), (MAX_SHARE, MAX_SHARE));
        let c = Controller::new(0.05, Some(0.01));
        assert_eq!((c.share, c.max), (MIN_SHARE, MIN_SHARE));
    }

    /// The loop closed on a simulated app: the share settles where the
    /// added CPU is the budget, falls when the probes get dearer (a change
    /// in the request mix) and rises back when they get cheaper.
    #[test]
    fn the_loop_holds_the_budget_through_changes() {
        let mut c = Controller::new(0.05, None);
        let mut e = Estimator::default();
        let mut added = vec![];
        for i in 0..90u64 {
            let r = if (30..60).contains(&i) { 3.0 } else { 1.5 };
            let mut p = period(c.share, 800.0, 120.0, r, 1.0 / r.sqrt());
            p[1].cpu_ns = (p[1].cpu_ns as f64 * (1.0 + 0.05 * noise(i))) as u64;
            e.add(p[0]);
            e.add(p[1]);
            let truth = Estimate { ratio: r, low: r, high: r, pairs: 1, q: 1.0 / r.sqrt() };
            added.push(truth.added(truth.work_share(c.share)));
            c.next(e.estimate());
        }
        // Settled in each phase (the median follows after half of PAIRS).
        for (phase, range) in [(0, 20..30), (1, 50..60), (2, 80..90)] {
            for i in range {
                assert!((added[i] - 0.05).abs() < 0.01, "phase {phase}, period {i}: +{:.3}", added[i]);
            }
        }
    }
}
