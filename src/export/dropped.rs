//! Spans dropped by the export queue, per process: for the summary and the
//! health metrics (pure). Bounded: the first [`NAMED`] processes that lose
//! spans are kept by name, the rest are counted together.

use rustc_hash::FxHashMap;

/// Processes kept by name.
pub const NAMED: usize = 64;
/// A command line is cut to this many characters.
const COMMAND_CHARS: usize = 120;

/// One process's dropped spans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    pub pid: u32,
    /// "service[pid]", as the console names the process.
    pub label: String,
    /// Its command line (cut).
    pub command: String,
    pub spans: u64,
}

#[derive(Debug, Default)]
pub struct Drops {
    /// The names of the processes the exporter knows (registered, not forgotten).
    names: FxHashMap<u32, (String, String)>,
    named: Vec<Dropped>,
    index: FxHashMap<u32, usize>,
    /// Spans of the processes past the first [`NAMED`].
    pub others: u64,
    /// Every span dropped.
    pub total: u64,
}

impl Drops {
    /// The process `pid` is `label`, started as `argv`.
    pub fn name(&mut self, pid: u32, label: &str, argv: &[String]) {
        self.names.insert(pid, (label.to_string(), command(argv)));
    }

    /// `pid` is gone: its name is kept only where it lost spans.
    pub fn forget(&mut self, pid: u32) {
        self.names.remove(&pid);
    }

    /// `spans` of `pid` dropped.
    pub fn add(&mut self, pid: u32, spans: u64) {
        self.total += spans;
        if let Some(&i) = self.index.get(&pid) {
            self.named[i].spans += spans;
        } else if self.named.len() < NAMED {
            let (label, command) = self.names.get(&pid).cloned().unwrap_or_else(|| (format!("pid {pid}"), String::new()));
            self.index.insert(pid, self.named.len());
            self.named.push(Dropped { pid, label, command, spans });
        } else {
            self.others += spans;
        }
    }

    /// The processes kept by name, in the order they first lost spans.
    pub fn named(&self) -> &[Dropped] {
        &self.named
    }
}

/// `argv` as one line of at most [`COMMAND_CHARS`] characters.
fn command(argv: &[String]) -> String {
    let line = argv.join(" ");
    if line.chars().count() <= COMMAND_CHARS {
        return line;
    }
    line.chars().take(COMMAND_CHARS - 1).chain(['…']).collect()
}

/// The summary's line naming the processes that lost spans, the most first
/// (at most `shown`; the rest summed); None when none did.
pub fn line(d: &Drops, shown: usize) -> Option<String> {
    if d.total == 0 {
        return None;
    }
    let mut by: Vec<&Dropped> = d.named.iter().collect();
    by.sort_by(|a, b| b.spans.cmp(&a.spans).then(a.pid.cmp(&b.pid)));
    let mut parts: Vec<String> = by
        .iter()
        .take(shown)
        .map(|x| {
            if x.command.is_empty() {
                format!("{} of {}", x.spans, x.label)
            } else {
                format!("{} of {} ({})", x.spans, x.label, x.command)
            }
        })
        .collect();
    let rest_procs = by.len().saturating_sub(shown);
    let rest: u64 = by.iter().skip(shown).map(|x| x.spans).sum::<u64>() + d.others;
    if rest > 0 {
        let more = if d.others > 0 { format!("{rest_procs}+") } else { rest_procs.to_string() };
        parts.push(format!("{rest} of {more} other process(es)"));
    }
    Some(format!("uvspan: spans dropped (queue full), by process: {}", parts.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn drops_are_named_per_process_the_most_first() {
        let mut d = Drops::default();
        assert_eq!(line(&d, 5), None, "nothing dropped: no line");
        d.name(10, "quiet[10]", &argv("node quiet.js"));
        d.name(20, "flood[20]", &argv("node flood.js --hard"));
        d.add(10, 3);
        d.add(20, 500);
        d.add(20, 7);
        d.add(30, 2);
        assert_eq!(d.total, 512);
        assert_eq!(
            line(&d, 5).as_deref(),
            Some("uvspan: spans dropped (queue full), by process: 507 of flood[20] (node flood.js --hard), 3 of quiet[10] (node quiet.js), 2 of pid 30")
        );
        assert_eq!(
            line(&d, 1).as_deref(),
            Some("uvspan: spans dropped (queue full), by process: 507 of flood[20] (node flood.js --hard), 5 of 2 other process(es)")
        );
    }

    #[test]
    fn the_table_is_bounded_and_a_name_outlives_its_process_once_it_lost_spans() {
        let mut d = Drops::default();
        d.name(1, "a[1]", &argv("node a.js"));
        d.add(1, 1);
        d.forget(1);
        d.add(1, 1);
        assert_eq!(d.named()[0], Dropped { pid: 1, label: "a[1]".into(), command: "node a.js".into(), spans: 2 });
        for pid in 2..200 {
            d.name(pid, &format!("p[{pid}]"), &argv("node p.js"));
            d.add(pid, 1);
        }
        assert_eq!(d.named().len(), NAMED);
        assert_eq!((d.others, d.total), (200 - 1 - NAMED as u64, 200));
        let l = line(&d, 3).expect("a line");
        assert!(l.ends_with(&format!(", {} of {}+ other process(es)", 200 - 2 - 2, NAMED - 3)), "{l}");
    }

    #[test]
    fn long_command_lines_are_cut() {
        let long = format!("node {}", "x".repeat(300));
        let c = command(&[long]);
        assert_eq!(c.chars().count(), COMMAND_CHARS);
        assert!(c.ends_with('…') && c.starts_with("node xx"));
        assert_eq!(command(&argv("node é.js")), "node é.js");
    }
}
