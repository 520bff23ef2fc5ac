//! `uvspan run`'s report: spans on their way to export are also folded here
//! (pure: [`aggregate`]), and at the end the run's numbers are checked
//! against budgets ([`budget`]) and written out: a summary on the console and
//! in `$GITHUB_STEP_SUMMARY` ([`summary`]), JSON, JUnit ([`junit`]) and a
//! self-contained HTML page ([`html`]). Each process's trace is also kept as
//! a bounded tree (pure: [`trees`]), made when the report is written.

pub mod aggregate;
pub mod budget;
pub mod html;
pub mod junit;
pub mod summary;
pub mod trees;

use std::path::Path;
use std::time::{Instant, SystemTime};

use crate::events::spans::Span;
use anyhow::{Context, Result};

use crate::cli::RunOpts;
use aggregate::{Aggregate, Report, RunFacts};
use budget::Budget;

/// Exit status when the command succeeded but a budget was broken.
pub const EXIT_BUDGET_BROKEN: i32 = 3;
/// The exit status of a run some of whose processes the probes did not see
/// (the kernel sent nothing of them): never reported as a clean run.
pub const EXIT_UNSEEN: i32 = 4;

/// The entity for `&`, `<` or `>` (markup in HTML, XML and Markdown).
pub(crate) fn markup_entity(c: char) -> Option<&'static str> {
    match c {
        '&' => Some("&amp;"),
        '<' => Some("&lt;"),
        '>' => Some("&gt;"),
        _ => None,
    }
}

/// Text safe in HTML and XML (text and attribute values).
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if let Some(e) = markup_entity(c) {
            out.push_str(e);
            continue;
        }
        match c {
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Not allowed in XML 1.0.
            c if (c as u32) < 0x20 && !matches!(c, '\n' | '\r' | '\t') => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// The command's own status when it is not 0, else 4 when the probes did
/// not see some of its processes, else 3 when a budget is broken, else 0.
pub fn exit_status(report: &Report) -> i32 {
    if report.exit_code != 0 {
        report.exit_code
    } else if !report.unseen_processes.is_empty() {
        EXIT_UNSEEN
    } else if report.budgets.iter().any(|b| !b.ok) {
        EXIT_BUDGET_BROKEN
    } else {
        0
    }
}

/// The report's side of a run: everything the spans say, as they pass.
pub struct Collector {
    opts: RunOpts,
    budgets: Vec<Budget>,
    start: SystemTime,
    started: Instant,
    ended: Option<Instant>,
    agg: Aggregate,
    timeline: html::Timeline,
    trees: trees::Trees,
}

impl Collector {
    /// The budgets were checked when the command line was read.
    pub fn new(opts: RunOpts) -> Result<Collector> {
        let budgets = opts.budgets.iter().map(|b| Budget::parse(b)).collect::<Result<_, _>>()?;
        Ok(Collector {
            opts,
            budgets,
            start: SystemTime::now(),
            started: Instant::now(),
            ended: None,
            agg: Aggregate::default(),
            timeline: html::Timeline::new(html::MAX_BARS),
            trees: trees::Trees::default(),
        })
    }

    /// The command is started now: the run's time 0.
    pub fn started(&mut self) {
        self.start = SystemTime::now();
        self.started = Instant::now();
    }

    pub fn add(&mut self, pid: u32, spans: &[Span]) {
        for s in spans {
            self.agg.add(pid, s, self.start);
            self.timeline.add(pid, s, self.start);
            self.trees.add(pid, s, self.start);
        }
    }

    /// A process exited after `fast` loop iterations it did not report.
    pub fn exited(&mut self, pid: u32, fast: u64) {
        self.agg.exited(pid, fast);
    }

    /// The command has exited: the end of the wall time.
    pub fn command_exited(&mut self) {
        self.ended.get_or_insert_with(Instant::now);
    }

    /// The report with its budgets checked, written where asked; the exit
    /// status: the command's own when non-zero, else 3 when a budget is
    /// broken, else 0.
    pub fn finish(self, mut facts: RunFacts) -> i32 {
        facts.wall_ms = self.ended.unwrap_or_else(Instant::now).duration_since(self.started).as_secs_f64() * 1e3;
        let mut report = self.agg.report(&facts);
        for p in &mut report.processes {
            p.trace = self.trees.trace(p.pid, self.start);
        }
        budget::evaluate(&mut report, &self.budgets, &self.agg);
        eprint!("{}", summary::text(&report));
        let mut code = exit_status(&report);
        if let Err(e) = self.write(&report) {
            eprintln!("uvspan: {e:#}");
            if code == 0 {
                code = 1;
            }
        }
        code
    }

    fn write(&self, report: &Report) -> Result<()> {
        let put = |path: &Path, what: &str, text: String| {
            std::fs::write(path, text)
                .with_context(|| format!("cannot write the {what} to {}; check the directory exists and is writable", path.display()))
        };
        if let Some(p) = &self.opts.report {
            put(p, "JSON report", serde_json::to_string_pretty(report)? + "\n")?;
        }
        if let Some(p) = &self.opts.junit {
            put(p, "JUnit report", junit::junit(report))?;
        }
        if let Some(p) = &self.opts.html {
            put(p, "HTML report", html::page(report, &self.timeline))?;
        }
        if let Some(p) = std::env::var_os("GITHUB_STEP_SUMMARY").filter(|p| !p.is_empty()) {
            use std::io::Write;
            let p = Path::new(&p);
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(p)
                .and_then(|mut f| f.write_all((summary::markdown(report) + "\n").as_bytes()))
                .with_context(|| format!("cannot append the summary to $GITHUB_STEP_SUMMARY ({})", p.display()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    /// Compares `got` with tests/golden/report/`name`; `UPDATE_GOLDEN=1`
    /// writes it instead.
    pub fn golden(name: &str, got: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/report").join(name);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, got).unwrap();
            return;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
        assert_eq!(got, want, "{} differs (after an intended change: UPDATE_GOLDEN=1 cargo test --lib report)", path.display());
    }

    #[test]
    fn exit_status_command_first_then_budgets() {
        use super::aggregate::BudgetResult;
        let mut r = super::aggregate::tests::sample();
        assert_eq!(super::exit_status(&r), 0, "no budgets");
        r.budgets = vec![BudgetResult { expr: "a<1".into(), value: Some(0.0), ok: true, scope: None, from: None }];
        assert_eq!(super::exit_status(&r), 0);
        r.budgets.push(BudgetResult { expr: "b<1".into(), value: Some(2.0), ok: false, scope: None, from: None });
        assert_eq!(super::exit_status(&r), 3);
        r.unseen_processes = vec![12];
        assert_eq!(super::exit_status(&r), 4, "a run not seen is never clean, whatever the budgets say");
        r.exit_code = 7;
        assert_eq!(super::exit_status(&r), 7, "the command's failure wins");
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(super::escape("<a href=\"x\">'&'</a>\u{1}"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;\u{FFFD}");
    }
}
