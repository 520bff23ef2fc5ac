//! `--sample-time`: when the uprobes are live. Each second (the period) has
//! one window of `share × period`, at a random offset inside it, so a
//! periodic job in the app is not always in (or always out of) the window.
//! The tracer detaches the probes outside the windows (see
//! `Tracer::close_window`); the loop thread's epoll path stays on. A
//! window's length is the time the probes are live: counted from when the
//! tracer made them live (after attaching) to when it stopped them (before
//! detaching), so the share stated is the share of the time they were.
//!
//! The share of the time is not the share of the app's work: under load the
//! probes' traps slow the app while they are live, so a window holds fewer
//! requests than its length says. [`IoShare`] counts the bytes the traced
//! processes read and wrote (`/proc/PID/io`, no probe) in the windows and in
//! all, the share of the work the windows saw: the one to scale counts by.
//! Bytes, not system calls: how many calls a request takes changes with the
//! slowdown itself (threadpool completions share a loop wake-up, one
//! eventfd write and read, more often when the loop is slower), its bytes
//! do not.
//!
//! At each edge the traced processes' CPU and bytes are read too (just
//! before the probes stop and after they stopped, before they go live and
//! after), so that [`super::cost`] sets each window against the time off
//! after it: what the probes cost. With `--max-overhead`, its controller
//! sets the share of the next period from that (all processes share one
//! schedule: the share holds the budget for the most expensive one).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::events::clock::monotonic_ns;

use super::cost::{self, Usage};
use crate::events::spans::{Family, KeyValue, Span};

/// Writes the share on each span (`uvspan.sample_time`), so counts can be
/// scaled: loop iterations and their phases come from the always-on epoll
/// path (1.0), the rest from the sampled probes.
pub fn mark(spans: &mut [Span], share: f64) {
    for s in spans {
        let v = if matches!(s.family, Family::Iteration | Family::Phase) { 1.0 } else { share };
        s.attributes.push(KeyValue::new("uvspan.sample_time", v));
    }
}

/// The sampling period.
pub const PERIOD: Duration = Duration::from_secs(1);

/// A window edge that is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edge {
    Open,
    Close,
}

/// One window: offset from its period's start, and length.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    pub offset: Duration,
    pub len: Duration,
}

/// The window of a period, from a random value in [0, 1).
pub fn window(share: f64, period: Duration, r: f64) -> Window {
    let len = period.mul_f64(share.clamp(0.0, 1.0));
    let room = period.saturating_sub(len);
    Window { offset: room.mul_f64(r.clamp(0.0, 1.0)), len }
}

/// xorshift64*: enough to place windows; seeded from the clock.
struct Rng(u64);

impl Rng {
    fn next_unit(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The schedule of windows, and how long the probes were live.
pub struct Windows {
    pub share: f64,
    rng: Rng,
    /// Length of the next window.
    pending_len: Duration,
    /// The next edge and when it is due.
    next: (Edge, Instant),
    /// Start of the period holding the current or next window.
    period_start: Instant,
    opened_at: Option<Instant>,
    live: Duration,
    started: Instant,
    /// The traced processes' I/O bytes in the windows and in all.
    pub io: IoShare,
    /// When they were last read.
    io_read: Instant,
    /// The probes' cost, per process.
    pub cost: cost::Meter,
    /// --max-overhead: what sets the share.
    pub control: Option<cost::Controller>,
    /// Processes whose budget was said to be out of reach.
    said: std::collections::HashSet<u32>,
}

impl Windows {
    /// The probes are live at start (they were just attached): the first
    /// window runs from now for `share × period`.
    pub fn new(share: f64, now: Instant) -> Windows {
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1;
        Windows {
            share,
            rng: Rng(seed),
            pending_len: Duration::ZERO,
            next: (Edge::Close, now + window(share, PERIOD, 0.0).len),
            period_start: now,
            opened_at: Some(now),
            live: Duration::ZERO,
            started: now,
            io: IoShare { open: true, ..Default::default() },
            io_read: now,
            cost: cost::Meter::default(),
            control: None,
            said: Default::default(),
        }
    }

    pub fn with_control(mut self, control: Option<cost::Controller>) -> Windows {
        self.control = control;
        self
    }

    /// The share from the next window on (called while the probes are off:
    /// the next window is placed again at the new length).
    pub fn set_share(&mut self, share: f64, now: Instant) {
        if (share - self.share).abs() < 1e-9 {
            return;
        }
        self.share = share;
        if self.next.0 == Edge::Open {
            let w = window(share, PERIOD, self.rng.next_unit());
            self.next = (Edge::Open, (self.period_start + w.offset).max(now));
            self.pending_len = w.len;
        }
    }

    /// Time until the next edge (zero if due).
    pub fn until_next(&self, now: Instant) -> Duration {
        self.next.1.saturating_duration_since(now)
    }

    /// The edge due now, if any; the caller carries it out and says when
    /// the probes stopped ([`Windows::closed`]) or went live
    /// ([`Windows::opened`]).
    pub fn step(&self, now: Instant) -> Option<Edge> {
        let (edge, at) = self.next;
        (now >= at).then_some(edge)
    }

    /// The probes stopped at `at`: the next period's window is placed (a
    /// late tick skips periods).
    pub fn closed(&mut self, at: Instant) {
        if let Some(t) = self.opened_at.take() {
            self.live += at.saturating_duration_since(t);
        }
        let mut start = self.period_start + PERIOD;
        while start + PERIOD <= at {
            start += PERIOD;
        }
        let w = window(self.share, PERIOD, self.rng.next_unit());
        self.period_start = start;
        self.next = (Edge::Open, (start + w.offset).max(at));
        self.pending_len = w.len;
    }

    /// The probes went live at `at` (attached, then let run): the window
    /// closes its length after that.
    pub fn opened(&mut self, at: Instant) {
        self.opened_at = Some(at);
        self.next = (Edge::Close, at + self.pending_len);
    }

    /// Share of the time the probes were live so far.
    pub fn measured(&self, now: Instant) -> f64 {
        let live = self.live + self.opened_at.map_or(Duration::ZERO, |t| now - t);
        let all = now - self.started;
        if all.is_zero() {
            return self.share;
        }
        live.as_secs_f64() / all.as_secs_f64()
    }
}

/// A thread of a traced process: (pid, tid).
pub type Thread = (u32, u32);

/// One thread's I/O bytes, read at the window edges and every
/// [`IO_EVERY`] between them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct IoCount {
    /// When it was first read.
    first: u64,
    /// When it was last read.
    last: u64,
    /// At the open of the window it is in (None: no window open).
    opened: Option<u64>,
    /// Moved while the probes were live, in closed windows.
    live: u64,
}

impl IoCount {
    /// (live, all) bytes up to its last reading; a window open now counts
    /// up to then.
    fn counts(&self) -> (u64, u64) {
        let open = self.opened.map_or(0, |o| self.last.saturating_sub(o));
        (self.live + open, self.last.saturating_sub(self.first))
    }
}

/// How often the counts are read between window edges, so that a process
/// that exits leaves at most this much of its work uncounted.
pub const IO_EVERY: Duration = Duration::from_millis(100);

/// The bytes the traced processes read and wrote while the probes were live
/// and in all (of the processes with a loop: see `loop_io`). Counted per
/// thread: a process's own total also holds what the children it reaped
/// moved (a build step, a load generator), all at once when it reaps them.
/// Each reading lists every thread of the processes counted: a thread
/// missing from one has exited, and its counts move to `gone` (so the
/// table holds the threads alive, and a reused thread id starts anew).
#[derive(Debug, Default)]
pub struct IoShare {
    threads: HashMap<Thread, IoCount>,
    /// (live, all) bytes of the threads that have exited.
    gone: (u64, u64),
    /// A window is open (a thread first read now starts in it).
    open: bool,
}

impl IoShare {
    /// A reading: every thread of the processes counted, with its count now.
    pub fn update(&mut self, now: impl IntoIterator<Item = (Thread, u64)>) {
        let mut seen = HashMap::with_capacity(self.threads.len());
        for (t, v) in now {
            let opened = self.open.then_some(v);
            let fresh = IoCount { first: v, last: v, opened, live: 0 };
            let c = match self.threads.remove(&t) {
                Some(c) if v >= c.last => IoCount { last: v, ..c },
                // Lower than it was: the thread id was reused.
                Some(c) => {
                    self.exited(c);
                    fresh
                }
                None => fresh,
            };
            seen.insert(t, c);
        }
        for c in std::mem::replace(&mut self.threads, seen).into_values() {
            self.exited(c);
        }
    }

    fn exited(&mut self, c: IoCount) {
        let (live, all) = c.counts();
        self.gone = (self.gone.0 + live, self.gone.1 + all);
    }

    /// The probes went live; `now` as for [`IoShare::update`].
    pub fn opened(&mut self, now: impl IntoIterator<Item = (Thread, u64)>) {
        self.update(now);
        self.open = true;
        for c in self.threads.values_mut() {
            c.opened = Some(c.last);
        }
    }

    /// The probes stopped: the bytes since each thread's open were live.
    pub fn closed(&mut self, now: impl IntoIterator<Item = (Thread, u64)>) {
        self.update(now);
        self.open = false;
        for c in self.threads.values_mut() {
            if let Some(o) = c.opened.take() {
                c.live += c.last.saturating_sub(o);
            }
        }
    }

    /// Whether the process `pid` is counted.
    pub fn tracks(&self, pid: u32) -> bool {
        self.threads.keys().any(|t| t.0 == pid)
    }

    /// (live, all) bytes up to the last reading; a window open now counts
    /// up to then.
    pub fn counts(&self) -> (u64, u64) {
        self.threads.values().map(IoCount::counts).fold(self.gone, |(l, a), (cl, ca)| (l + cl, a + ca))
    }
}

/// Each thread of a process: the bytes it has read and written so far,
/// files, sockets and pipes alike, and its time on a CPU (`schedstat`, ns;
/// 0 where the kernel keeps none). None: the process is gone.
pub fn thread_usage(pid: u32) -> Vec<(u32, Usage)> {
    let Ok(tasks) = procfs::process::Process::new(pid as i32).and_then(|p| p.tasks()) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|t| {
            let io = t.io().ok()?;
            let cpu_ns = t.schedstat().map_or(0, |s| s.sum_exec_runtime);
            Some((t.tid as u32, Usage { cpu_ns, bytes: io.rchar.saturating_add(io.wchar) }))
        })
        .collect()
}

/// One reading of the traced processes whose event loop the probes have
/// seen (a process a traced one started that runs another program, a load
/// generator, say, has no operations to sample).
type Readings = Vec<(u32, Vec<(u32, Usage)>)>;

fn loop_usage(procs: &super::procs::Procs, tracer: &crate::kernel::tracer::Tracer, io: &IoShare) -> Readings {
    procs.live_pids().into_iter().filter(|&p| io.tracks(p) || tracer.loop_seen(p)).map(|p| (p, thread_usage(p))).collect()
}

/// The bytes of a reading, per thread, for [`IoShare`].
fn bytes(r: &Readings) -> Vec<(Thread, u64)> {
    r.iter().flat_map(|(pid, ts)| ts.iter().map(move |(tid, u)| ((*pid, *tid), u.bytes))).collect()
}

fn loop_io(procs: &super::procs::Procs, tracer: &crate::kernel::tracer::Tracer, io: &IoShare) -> Vec<(Thread, u64)> {
    bytes(&loop_usage(procs, tracer, io))
}

impl super::Agent {
    /// What the windows saw so far, for the summary (None: not sampling).
    pub(super) fn sampled(&mut self) -> Option<super::report::Sampled> {
        let w = self.windows.as_mut()?;
        w.io.update(loop_io(&self.procs, &self.tracer, &w.io));
        let (live, all) = w.io.counts();
        Some(super::report::Sampled {
            asked: w.share,
            budget: w.control.map(|c| c.budget),
            time: w.measured(Instant::now()),
            work: (all > 0).then(|| live as f64 / all as f64),
        })
    }

    /// The probes' cost per process as it stands (None: not sampling).
    pub(super) fn costs(&self) -> Option<super::report::Costs> {
        let w = self.windows.as_ref()?;
        let mut procs: Vec<super::report::ProcCost> = w
            .cost
            .by_pid
            .iter()
            .map(|(&pid, e)| {
                let estimate = e.estimate();
                super::report::ProcCost {
                    pid,
                    estimate,
                    windows: e.windows,
                    skipped: e.skipped,
                    work_share: estimate.map(|x| x.work_share(w.share)),
                    over: match (&w.control, &estimate) {
                        (Some(c), Some(x)) => c.cannot_hold(x),
                        _ => false,
                    },
                }
            })
            .collect();
        procs.sort_by_key(|p| p.pid);
        Some(super::report::Costs { budget: w.control.map(|c| c.budget), share: w.share, procs })
    }

    /// --max-overhead: the share of the next period from the estimates of
    /// the processes alive; a budget out of reach said once per process.
    fn control_share(&mut self) {
        let Some(w) = self.windows.as_mut() else { return };
        let Some(c) = w.control.as_mut() else { return };
        let live: Vec<(u32, cost::Estimate)> =
            self.procs.live_pids().into_iter().filter_map(|p| Some((p, w.cost.by_pid.get(&p)?.estimate()?))).collect();
        for (pid, e) in &live {
            if c.cannot_hold(e) && w.said.insert(*pid) {
                eprintln!(
                    "uvspan: pid {pid}: --max-overhead {}% cannot be held: its probes add {:+.0}% CPU while live, so even the least \
                     live share ({}% of the time) adds {:.1}%; held at that share; raise the budget or trace less (--requests off, \
                     --detail)",
                    c.budget * 100.0,
                    (e.ratio - 1.0) * 100.0,
                    cost::MIN_SHARE * 100.0,
                    e.added(e.work_share(cost::MIN_SHARE)) * 100.0
                );
            }
        }
        let share = c.next(live.into_iter().map(|(_, e)| e));
        w.set_share(share, Instant::now());
        self.health.sample_time_ppm.store((share * 1e6).round() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// --sample-time: opens or closes the window when due. At a close, the
    /// window's records (all in the ring buffer once the probes are
    /// detached) are handled, then the requests the edge cut are dropped
    /// and counted (see `Requests::window_closed`).
    pub(super) fn sample_window(&mut self) {
        let Some(w) = self.windows.as_mut() else { return };
        match w.step(Instant::now()) {
            Some(Edge::Close) => {
                // Read as the probes stop: detaching them takes a while,
                // and their programs do nothing from the start of it.
                let before = loop_usage(&self.procs, &self.tracer, &w.io);
                w.io.closed(bytes(&before));
                w.cost.end(monotonic_ns(), before);
                let at = self.tracer.close_window();
                // The time off is measured from when they are detached
                // (their traps cost until then).
                w.cost.begin(monotonic_ns(), false, loop_usage(&self.procs, &self.tracer, &w.io));
                w.closed(at);
                let _ = self.rb.consume();
                // The window's spans carry the share it had.
                self.handle_records(false);
                self.control_share();
                if let Some(r) = self.requests.as_mut() {
                    r.window_closed();
                    // The unsampled ones the kernel follows that are not
                    // over: their ends went unseen, dropped the same way
                    // (with what was held for them).
                    let cut = self.tracer.followed_over(|_, _| true, None);
                    for f in &cut {
                        self.held.take(f.pid, f.cause);
                    }
                    r.stats.straddled += cut.len() as u64;
                }
            }
            Some(Edge::Open) => {
                w.cost.end(monotonic_ns(), loop_usage(&self.procs, &self.tracer, &w.io));
                w.opened(self.tracer.open_window());
                let after = loop_usage(&self.procs, &self.tracer, &w.io);
                w.io.opened(bytes(&after));
                w.cost.begin(monotonic_ns(), true, after);
            }
            // A process that exits leaves at most IO_EVERY of its work uncounted.
            None if w.io_read.elapsed() >= IO_EVERY => {
                w.io.update(loop_io(&self.procs, &self.tracer, &w.io));
                w.io_read = Instant::now();
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The share a span is marked with follows its family, not its name.
    #[test]
    fn loop_spans_are_marked_whole_by_their_family() {
        use crate::events::spans::{Value, DNS, ITERATION};
        use crate::report::aggregate::tests::span;
        let whole = [(Family::Iteration, ITERATION), (Family::Phase, "uv.loop.timers"), (Family::Iteration, "renamed")];
        let sampled = [(Family::Fs("stat"), "fs.stat"), (Family::Dns, DNS), (Family::Http, "GET"), (Family::Other, "uv.loop.iteration")];
        let mut spans: Vec<Span> = whole.iter().chain(&sampled).map(|&(f, name)| span(f, name, 0.0, 1.0, vec![], None)).collect();
        mark(&mut spans, 0.25);
        let marks: Vec<Option<&Value>> = spans.iter().map(|s| s.attr("uvspan.sample_time")).collect();
        let (one, share) = (Value::F64(1.0), Value::F64(0.25));
        let want = [&one, &one, &one, &share, &share, &share, &share].map(Some);
        assert_eq!(marks, want);
    }

    #[test]
    fn a_window_fits_its_period() {
        let p = Duration::from_secs(1);
        assert_eq!(window(0.1, p, 0.0), Window { offset: Duration::ZERO, len: Duration::from_millis(100) });
        assert_eq!(window(0.1, p, 1.0), Window { offset: Duration::from_millis(900), len: Duration::from_millis(100) });
        assert_eq!(window(0.25, p, 0.5).offset, Duration::from_millis(375));
        assert_eq!(window(1.0, p, 0.7), Window { offset: Duration::ZERO, len: p });
    }

    #[test]
    fn edges_alternate_one_window_per_period() {
        let t0 = Instant::now();
        let mut w = Windows::new(0.1, t0);
        assert_eq!(w.step(t0), None);
        assert_eq!(w.until_next(t0), Duration::from_millis(100));
        let mut t = t0;
        let mut edges = vec![];
        let mut opens = vec![];
        // Tick every millisecond for 10 periods.
        for _ in 0..10_000 {
            t += Duration::from_millis(1);
            if let Some(e) = w.step(t) {
                edges.push(e);
                match e {
                    Edge::Open => {
                        opens.push(t - t0);
                        w.opened(t);
                    }
                    Edge::Close => w.closed(t),
                }
            }
        }
        assert!(edges.windows(2).all(|p| p[0] != p[1]), "{edges:?}");
        assert_eq!(edges[0], Edge::Close);
        // One window opens in each later period.
        assert_eq!(opens.len(), 9, "{opens:?}");
        for (i, o) in opens.iter().enumerate() {
            let period = (i + 1) as u128 * 1000;
            assert!((period..period + 1000).contains(&o.as_millis()), "window {i} opened at {o:?}");
        }
        let m = w.measured(t);
        assert!((0.095..=0.105).contains(&m), "{m}");
    }

    /// The time to attach and to detach is not live: the share counts from
    /// when the probes went live to when they stopped.
    #[test]
    fn live_time_runs_from_live_to_stopped() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut w = Windows::new(0.1, t0);
        w.closed(t0 + ms(100));
        let mut t = t0 + ms(100);
        for _ in 0..9 {
            t += w.until_next(t);
            assert_eq!(w.step(t), Some(Edge::Open));
            // Attaching took 15 ms; the window is 100 ms from then.
            w.opened(t + ms(15));
            t += ms(15);
            assert_eq!(w.until_next(t), ms(100));
            t += ms(100);
            assert_eq!(w.step(t), Some(Edge::Close));
            w.closed(t);
            // Detaching takes 60 ms.
            t += ms(60);
        }
        let live = 10.0 * 0.1;
        let all = (t - t0).as_secs_f64();
        assert!((w.measured(t) - live / all).abs() < 1e-9, "{} vs {}", w.measured(t), live / all);
    }

    #[test]
    fn a_late_tick_skips_periods_instead_of_catching_up() {
        let t0 = Instant::now();
        let mut w = Windows::new(0.5, t0);
        let late = t0 + Duration::from_millis(3500);
        assert_eq!(w.step(late), Some(Edge::Close));
        w.closed(late);
        // The next window is in the period that holds `late`, or after.
        assert!(w.until_next(late) < Duration::from_millis(1000));
    }

    /// Bytes moved while a window was open are live; a thread found in a
    /// closed period starts counting there; one that exited keeps its last
    /// count; a window open at the end counts up to the last reading.
    #[test]
    fn io_share_counts_bytes_inside_windows() {
        let mut io = IoShare::default();
        io.opened([((1, 1), 100)]);
        // Thread 2 is first read at the close: nothing of it was live.
        io.closed([((1, 1), 110), ((2, 2), 5000)]);
        io.update([((1, 1), 200), ((2, 2), 5090)]);
        assert_eq!(io.counts(), (10, 190));
        io.opened([((1, 1), 200), ((2, 2), 5090)]);
        io.update([((1, 1), 200), ((2, 2), 5095)]);
        // Process 2 exits inside the window: its last count stands, its 5
        // bytes since the open live.
        io.closed([((1, 1), 205)]);
        assert!(!io.tracks(2));
        io.update([((1, 1), 300)]);
        assert_eq!(io.counts(), (15 + 5, 200 + 95));
        // A window open now counts to the last reading.
        io.opened([((1, 1), 300)]);
        io.update([((1, 1), 320)]);
        assert_eq!(io.counts(), (35 + 5, 220 + 95));
        // First read while a window is open (a new thread of process 1):
        // counted live from there.
        io.update([((1, 1), 320), ((1, 3), 1000)]);
        io.closed([((1, 1), 330), ((1, 3), 1040)]);
        assert_eq!(io.counts(), (45 + 40 + 5, 230 + 40 + 95));
        assert!(io.tracks(1) && !io.tracks(2) && !io.tracks(3));
        // A reused thread id (its count lower than the last) starts anew.
        io.update([((1, 1), 7), ((1, 3), 1040)]);
        io.update([((1, 1), 17), ((1, 3), 1040)]);
        assert_eq!(io.counts(), (90, 365 + 10));
        assert_eq!(IoShare::default().counts(), (0, 0));
    }

    /// A process's threads' bytes, without those of the children it reaped
    /// (which its own total in /proc/PID/io holds).
    #[test]
    fn a_process_threads_bytes_leave_out_its_reaped_children() {
        let me = std::process::id();
        let sum = |pid| thread_usage(pid).iter().map(|(_, u)| u.bytes).sum::<u64>();
        let before = sum(me);
        std::fs::read("/proc/self/stat").expect("read");
        assert!(sum(me) > before);
        assert!(thread_usage(me).iter().any(|&(t, u)| t == me && u.cpu_ns > 0), "{:?}", thread_usage(me));
        assert_eq!(thread_usage(u32::MAX >> 1), vec![]);
        // A shell that reaps a child that moved 8 MB, then waits for stdin.
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "head -c 4000000 /dev/zero > /dev/null; echo done; read x"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(sh.stdout.as_mut().expect("stdout")), &mut line).expect("done");
        let whole = procfs::process::Process::new(sh.id() as i32).and_then(|p| p.io()).expect("io");
        assert!(whole.rchar + whole.wchar >= 8_000_000, "{whole:?}");
        assert!(sum(sh.id()) < 1_000_000, "{:?}", thread_usage(sh.id()));
        drop(sh.stdin.take());
        sh.wait().expect("sh exits");
    }
}
