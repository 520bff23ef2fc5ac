//! The summary: the same tables as plain text (the console, at the end of a
//! run) and as GitHub-flavoured Markdown (`$GITHUB_STEP_SUMMARY`).

use super::aggregate::{LoopReport, Report, Sections};

pub struct Table {
    pub title: String,
    pub header: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
}

fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// At most `n` characters: the start and the end, "…" in the middle.
fn short(s: &str, n: usize) -> String {
    let len = s.chars().count();
    if len <= n {
        return s.to_string();
    }
    let head = n / 3;
    let tail = n - head - 1;
    let start: String = s.chars().take(head).collect();
    let end: String = s.chars().skip(len - tail).collect();
    format!("{start}…{end}")
}

fn process_row(who: String, s: &Sections) -> Vec<String> {
    let b = &s.event_loop.blocked;
    vec![
        who,
        s.fs.count.to_string(),
        s.fs.errors.to_string(),
        format!("{} ({} ms)", s.fs.sync_on_loop.count, ms(s.fs.sync_on_loop.total_ms)),
        s.dns.count.to_string(),
        s.dns.errors.to_string(),
        s.event_loop.iterations.to_string(),
        b.count.to_string(),
        if b.count > 0 { format!("{} ms", ms(b.max_ms)) } else { "-".into() },
        split_cell(&s.event_loop),
        gc_cell(&s.event_loop),
    ]
}

/// V8's collections in the reported iterations: "total (max one) ms"; "-"
/// where none was seen.
fn gc_cell(l: &LoopReport) -> String {
    l.gc.as_ref().map_or_else(|| "-".into(), |g| format!("{} (max {})", ms(g.total_ms), ms(g.max_ms)))
}

/// "2 Node.js processes of 3 traced" (the others: shells, programs a
/// script ran), or "2 Node.js processes" when every one was.
pub fn processes_said(r: &Report) -> String {
    let node = r.processes.len();
    let noun = if node == 1 { "process" } else { "processes" };
    if r.processes_traced > node as u64 {
        format!("{node} Node.js {noun} of {} traced", r.processes_traced)
    } else {
        format!("{node} Node.js {noun}")
    }
}

/// The blocked iterations' busy time split, summed: "on / off / run queue ms".
fn split_cell(l: &LoopReport) -> String {
    let total = l.on_cpu.total_ms + l.off_cpu.total_ms + l.runqueue.total_ms;
    if total <= 0.0 {
        return "-".into();
    }
    let mut c = format!("{} / {} / {}", ms(l.on_cpu.total_ms), ms(l.off_cpu.total_ms), ms(l.runqueue.total_ms));
    if l.throttled.total_ms > 0.0 {
        c.push_str(&format!(" (throttled {})", ms(l.throttled.total_ms)));
    }
    c
}

/// The headline: the command, how it ended, the budgets.
pub fn headline(r: &Report) -> String {
    headline_with(r, &format!("`{}`", r.command.join(" ")))
}

fn headline_with(r: &Report, command: &str) -> String {
    let broken = r.budgets.iter().filter(|b| !b.ok).count();
    let budgets = match (r.budgets.len(), broken) {
        (0, _) => String::new(),
        (n, 0) => format!("; {n} budget(s) held"),
        (n, b) => format!("; {b} of {n} budget(s) BROKEN"),
    };
    let unseen = match r.unseen_processes.len() {
        0 => String::new(),
        n => format!("; NOT SEEN: the probes saw nothing of {n} process(es), this report is incomplete"),
    };
    format!("{command} exited {} after {:.2} s{budgets}{unseen}", r.exit_code, r.wall_ms / 1e3)
}

/// The worst iteration, in words (None without a blocked iteration).
pub fn worst_line(r: &Report) -> Option<String> {
    let w = r.total.event_loop.blocked.worst.as_ref()?;
    let culprit = w.culprit.as_ref().map_or_else(String::new, |c| format!(": {c}"));
    let split = w.split.as_ref().map_or_else(String::new, |s| {
        let throttled = s.throttled_ms.map_or_else(String::new, |t| format!(", its cgroup throttled {} ms", ms(t)));
        format!(" ({} ms on-CPU, {} ms off-CPU, {} ms waiting for a CPU{throttled})", ms(s.on_cpu_ms), ms(s.off_cpu_ms), ms(s.runqueue_ms))
    });
    Some(format!(
        "worst loop iteration: {} ms busy in process {} (thread {}) at +{:.0} ms{split}{culprit}",
        ms(w.busy_ms),
        w.pid,
        w.thread_id,
        w.at_ms
    ))
}

pub fn tables(r: &Report) -> Vec<Table> {
    let mut out = Vec::new();
    let mut rows: Vec<Vec<String>> =
        r.processes.iter().map(|p| process_row(format!("{} {}", p.pid, short(&p.command, 40)), &p.sections)).collect();
    rows.push(process_row("total".into(), &r.total));
    out.push(Table {
        title: format!("Processes: {} (loop threshold {} ms)", processes_said(r), r.loop_threshold_ms),
        header: vec![
            "process",
            "fs ops",
            "fs errors",
            "sync fs on loop",
            "DNS",
            "DNS errors",
            "loop iterations",
            "blocked",
            "worst",
            "blocked on-CPU / off-CPU / run queue ms",
            "GC in blocked ms",
        ],
        rows,
    });
    if !r.total.fs.by_op.is_empty() {
        out.push(Table {
            title: "fs by op".into(),
            header: vec!["op", "count", "errors", "p50 ms", "p99 ms", "max ms", "total ms"],
            rows: r
                .total
                .fs
                .by_op
                .iter()
                .map(|(op, s)| {
                    vec![op.clone(), s.count.to_string(), s.errors.to_string(), ms(s.p50_ms), ms(s.p99_ms), ms(s.max_ms), ms(s.total_ms)]
                })
                .collect(),
        });
    }
    if !r.total.fs.top_paths.is_empty() {
        out.push(slowest_paths(&r.total.fs.top_paths));
    }
    if !r.total.dns.by_name.is_empty() {
        out.push(Table {
            title: "DNS names".into(),
            header: vec!["name", "count", "errors", "max ms"],
            rows: r
                .total
                .dns
                .by_name
                .iter()
                .map(|n| vec![short(&n.name, 60), n.count.to_string(), n.errors.to_string(), ms(n.max_ms)])
                .collect(),
        });
    }
    if !r.budgets.is_empty() {
        out.push(Table {
            title: "Budgets".into(),
            header: vec!["budget", "value", "result", "worst process"],
            rows: r
                .budgets
                .iter()
                .map(|b| vec![b.expr.clone(), b.shown(), if b.ok { "ok" } else { "BROKEN" }.into(), b.shown_from()])
                .collect(),
        });
    }
    out
}

/// ", worst in pid N COMMAND" when the budget says where its worst figure
/// came from.
fn worst_of(b: &super::aggregate::BudgetResult) -> String {
    b.from.as_ref().map_or_else(String::new, |_| format!(", worst in {}", b.shown_from()))
}

/// The slowest paths by their own time. Where the threadpool split is
/// known (`--detail threadpool`), the callbacks' wait for a busy loop is a
/// column apart, not the disk's time; else the title says the time
/// includes it.
fn slowest_paths(paths: &[super::aggregate::PathStats]) -> Table {
    let split = paths.iter().any(|p| p.loop_wait_ms.is_some());
    if split {
        Table {
            title: "Slowest paths (own time: threadpool queue + run; the callbacks' wait for a busy loop apart)".into(),
            header: vec!["path", "count", "own ms", "callback waited for the loop ms"],
            rows: paths
                .iter()
                .map(|p| {
                    let wait = p.loop_wait_ms.map_or_else(|| "-".into(), ms);
                    vec![short(&p.path, 60), p.count.to_string(), ms(p.own_ms), wait]
                })
                .collect(),
        }
    } else {
        Table {
            title: "Slowest paths (total time, the callbacks' wait for the loop included: --detail threadpool splits it)".into(),
            header: vec!["path", "count", "total ms"],
            rows: paths.iter().map(|p| vec![short(&p.path, 60), p.count.to_string(), ms(p.total_ms)]).collect(),
        }
    }
}

/// Plain text for the console.
pub fn text(r: &Report) -> String {
    let mut s = format!("uvspan run: {}\n", headline(r));
    for t in tables(r) {
        s.push_str(&format!("\n{}\n", t.title));
        let mut widths: Vec<usize> = t.header.iter().map(|h| h.chars().count()).collect();
        for row in &t.rows {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: Vec<String>| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (c, w))| if i == 0 { format!("{c:<w$}") } else { format!("{c:>w$}") })
                .collect();
            format!("  {}\n", padded.join("  ").trim_end())
        };
        s.push_str(&line(t.header.iter().map(|h| h.to_uppercase()).collect()));
        for row in t.rows {
            s.push_str(&line(row));
        }
    }
    if let Some(w) = worst_line(r) {
        s.push_str(&format!("\n{w}\n"));
    }
    for b in r.budgets.iter().filter(|b| !b.ok) {
        s.push_str(&format!("budget broken: {} (value {}{})\n", b.expr, b.shown(), worst_of(b)));
    }
    s
}

/// Text safe in a Markdown table cell (no HTML, no table or emphasis syntax).
pub fn md_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if let Some(e) = super::markup_entity(c) {
            out.push_str(e);
            continue;
        }
        match c {
            '|' | '\\' | '*' | '_' | '`' | '[' | ']' | '#' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// GitHub-flavoured Markdown for the job summary.
pub fn markdown(r: &Report) -> String {
    let ok = r.exit_code == 0 && r.budgets.iter().all(|b| b.ok);
    let command = format!("<code>{}</code>", super::escape(&r.command.join(" ")));
    let mut s = format!("### {} uvspan: {}\n", if ok { "✅" } else { "❌" }, headline_with(r, &command));
    for t in tables(r) {
        s.push_str(&format!("\n**{}**\n\n", md_escape(&t.title)));
        s.push_str(&format!("| {} |\n", t.header.join(" | ")));
        s.push_str(&format!("|{}\n", t.header.iter().enumerate().map(|(i, _)| if i == 0 { "---|" } else { "---:|" }).collect::<String>()));
        for row in t.rows {
            let cells: Vec<String> = row.iter().map(|c| md_escape(c)).collect();
            s.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
    }
    if let Some(w) = worst_line(r) {
        s.push_str(&format!("\n{}\n", md_escape(&w)));
    }
    for b in r.budgets.iter().filter(|b| !b.ok) {
        s.push_str(&format!("\n**budget broken:** {} (value {}{})\n", md_escape(&b.expr), b.shown(), md_escape(&worst_of(b))));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        let (a, facts) = super::super::aggregate::tests::sample_agg();
        let mut r = a.report(&facts);
        let budgets: Vec<_> = ["loop.blocked.max_ms<=100", "fs.sync_on_loop.count<=50"]
            .iter()
            .map(|e| super::super::budget::Budget::parse(e).unwrap())
            .collect();
        super::super::budget::evaluate(&mut r, &budgets, &a);
        r
    }

    #[test]
    fn golden_markdown_and_text() {
        let r = sample();
        crate::report::tests::golden("summary.md", &markdown(&r));
        crate::report::tests::golden("summary.txt", &text(&r));
    }

    #[test]
    fn long_cells_keep_both_ends() {
        assert_eq!(short("node /a/very/long/path/to/the/app.js", 20), "node /…to/the/app.js");
        assert_eq!(short("short", 20), "short");
    }

    #[test]
    fn markdown_cells_cannot_break_the_table() {
        assert_eq!(md_escape("/a|b/<x>&_y_`"), "/a\\|b/&lt;x&gt;&amp;\\_y\\_\\`");
        let md = markdown(&sample());
        assert!(md.contains("budget broken:** loop.blocked.max\\_ms&lt;=100 (value 150.25, worst in pid 100 node index.js)"), "{md}");
        assert!(!md.contains("<missing>"), "{md}");
    }
}
