//! `--sample-time`: when the uprobes are live. Each second (the period) has
//! one window of `share × period`, at a random offset inside it, so a
//! periodic job in the app is not always in (or always out of) the window.
//! The tracer detaches the probes outside the windows (see
//! `Tracer::close_window`); the loop thread's epoll path stays on. A
//! window's length is the time the probes are live: counted from when the
//! tracer made them live (after attaching) to when it stopped them (before
//! detaching), so the share stated is the share of the time they were.

use std::time::{Duration, Instant};

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

impl super::Agent {
    /// --sample-time: opens or closes the window when due. At a close, the
    /// window's records (all in the ring buffer once the probes are
    /// detached) are handled, then the requests the edge cut are dropped
    /// and counted (see `Requests::window_closed`).
    pub(super) fn sample_window(&mut self) {
        let Some(w) = self.windows.as_mut() else { return };
        match w.step(Instant::now()) {
            Some(Edge::Close) => {
                w.closed(self.tracer.close_window());
                let _ = self.rb.consume();
                self.handle_records(false);
                if let Some(r) = self.requests.as_mut() {
                    r.window_closed();
                }
            }
            Some(Edge::Open) => w.opened(self.tracer.open_window()),
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
}
