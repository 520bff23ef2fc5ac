//! The HTML report: one self-contained page (inline CSS, JS and SVG; it
//! fetches nothing), readable offline from a CI artifact. The report and the
//! timeline's bars are embedded as JSON and drawn by the page's script.
//! The timeline keeps the longest [`MAX_BARS`] spans; the page says so when
//! the run had more.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::SystemTime;

use crate::events::spans::Span;
use serde::Serialize;

use super::aggregate::{classify, round, Item, Report};

/// The most bars the timeline draws.
pub const MAX_BARS: usize = 5000;

const TEMPLATE: &str = include_str!("report.html");
const DATA_MARK: &str = "/*UVSPAN_DATA*/null";

/// One bar of the timeline.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Bar {
    pub pid: u32,
    pub tid: i64,
    /// "fs", "dns" or "loop".
    pub kind: &'static str,
    /// The fs op, or empty.
    pub op: String,
    /// Path or host name.
    pub label: String,
    pub start_ms: f64,
    pub ms: f64,
    pub error: bool,
    pub sync: bool,
}

/// The longest `cap` bars, and how many there were.
pub struct Timeline {
    cap: usize,
    seen: u64,
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    bars: Vec<Option<Bar>>,
}

impl Timeline {
    pub fn new(cap: usize) -> Timeline {
        Timeline { cap, seen: 0, heap: BinaryHeap::new(), bars: Vec::new() }
    }

    pub fn add(&mut self, pid: u32, s: &Span, start: SystemTime) {
        let Some((item, ms, error)) = classify(pid, s) else { return };
        let tid = match s.attr(crate::events::spans::keys::THREAD_ID) {
            Some(crate::events::spans::Value::I64(v)) => Some(*v),
            _ => None,
        };
        let (kind, op, label, sync) = match item {
            Item::Fs { op, path, sync_on_loop, .. } => ("fs", op, path.unwrap_or_default(), sync_on_loop),
            Item::Dns { name } => ("dns", String::new(), name, false),
            Item::Iteration { .. } => ("loop", String::new(), String::new(), false),
        };
        let start_ms = super::aggregate::ms_since(s.start_ns, start);
        let bar = Bar { pid, tid: tid.unwrap_or(i64::from(pid)), kind, op, label, start_ms: round(start_ms), ms: round(ms), error, sync };
        self.seen += 1;
        let key = ((ms * 1e3) as u64, self.seen);
        if self.heap.len() < self.cap {
            self.heap.push(Reverse((key.0, self.bars.len() as u64)));
            self.bars.push(Some(bar));
        } else if let Some(Reverse((shortest, slot))) = self.heap.peek().copied() {
            if key.0 > shortest {
                self.heap.pop();
                self.heap.push(Reverse((key.0, slot)));
                self.bars[slot as usize] = Some(bar);
            }
        }
    }

    /// The bars kept, in time order.
    pub fn bars(&self) -> Vec<&Bar> {
        let mut v: Vec<&Bar> = self.bars.iter().flatten().collect();
        v.sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
        v
    }
}

#[derive(Serialize)]
struct Data<'a> {
    report: &'a Report,
    bars: Vec<&'a Bar>,
    bars_total: u64,
    max_bars: usize,
}

/// The page: the template with the data in it.
pub fn page(report: &Report, timeline: &Timeline) -> String {
    let data = Data { report, bars: timeline.bars(), bars_total: timeline.seen, max_bars: timeline.cap };
    // Inside <script>, "</script>" or "<!--" in a path must not end it:
    // no '<' at all ('<' only occurs in JSON strings, where \u003c is the same).
    let json = serde_json::to_string(&data).unwrap_or_else(|_| "null".into()).replace('<', "\\u003c");
    let title = super::escape(&format!("uvspan run: {}", report.command.join(" ")));
    TEMPLATE.replacen("<title>uvspan run</title>", &format!("<title>{title}</title>"), 1).replacen(DATA_MARK, &json, 1)
}

#[cfg(test)]
mod tests {
    use super::super::aggregate::tests::{fs, iteration, sample, t0};
    use super::*;

    #[test]
    fn keeps_the_longest_bars() {
        let mut t = Timeline::new(3);
        for (i, ms) in [5.0, 1.0, 9.0, 2.0, 7.0, 0.5].into_iter().enumerate() {
            t.add(1, &fs("fs.stat", i as f64, ms, 1, true, "/p", None), t0());
        }
        t.add(1, &iteration(10.0, 120.0, 1, 0, None), t0());
        let kept: Vec<f64> = t.bars().iter().map(|b| b.ms).collect();
        assert_eq!(kept, [9.0, 7.0, 120.0], "the three longest, in time order");
        assert_eq!(t.seen, 7);
    }

    #[test]
    fn page_embeds_the_data_without_markup() {
        let mut t = Timeline::new(10);
        t.add(1, &fs("fs.stat", 1.0, 1.0, 1, true, "/x/</script><script>alert(1)</script>", None), t0());
        let mut r = sample();
        r.command = vec!["node".into(), "<b>x</b>".into()];
        let p = page(&r, &t);
        assert_eq!(p.matches("</script>").count(), TEMPLATE.matches("</script>").count(), "no script ends early");
        assert!(p.contains("<title>uvspan run: node &lt;b&gt;x&lt;/b&gt;</title>"));
        assert!(!p.contains(DATA_MARK));
        for fetch in ["<link", " src=", "fetch(", "XMLHttpRequest", "url(", "@import"] {
            assert!(!p.contains(fetch), "nothing is fetched: {fetch}");
        }
    }
}
