//! What uvspan says while it runs: the "tracing" line per process (and what
//! cannot be traced there), the periodic status line, the summary at exit,
//! and the health metrics' values.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::export::health::Health;
use crate::export::Summary;
use crate::kernel::tracer::Stats;
use crate::probes::plan::{notices, short_notices, ProbeState, ProbeStatus};
use crate::requests::RequestStats;
use crate::symbols::Images;

/// Counters of the run, besides the exporter's and the kernel's.
#[derive(Default)]
pub struct RunStats {
    /// Requests a process had in flight when it exited (dropped, counted).
    pub unfinished_at_exit: u64,
    /// Ring-buffer records that did not decode.
    pub undecodable: u64,
    /// Request context's counters (None: --requests off).
    pub requests: Option<RequestStats>,
    /// --sample-time (None: not sampling).
    pub sampling: Option<Sampled>,
    /// What the probes cost each process (None: not sampling).
    pub cost: Option<Costs>,
    /// OTEL_TRACES_SAMPLER when it is not the default, and the operations
    /// and loop iterations outside requests whose trace it dropped.
    pub sampler: Option<(String, u64)>,
    /// Why spans were not exported at all (OTEL_TRACES_EXPORTER=none, …).
    pub traces_off: Option<&'static str>,
    /// --min-duration: operations outside requests too short to export.
    pub short: u64,
    /// Background tasks and process traces.
    pub tasks: crate::tasks::TaskStats,
    /// `v8js.gc` span events dropped: more collections than a thread holds
    /// waiting for its next slow iteration (the metrics count them all).
    pub gc_events_dropped: u64,
    /// Database connections and operations from their bytes.
    pub db: crate::db::live::WireStats,
}

/// --sample-time: the share asked for and the shares the windows saw.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled {
    /// The share asked for (--max-overhead: the share in force).
    pub asked: f64,
    /// --max-overhead's budget.
    pub budget: Option<f64>,
    /// Of the time, from when the probes went live to when they stopped.
    pub time: f64,
    /// Of the bytes the traced processes read and wrote (None: none): the
    /// share of the work, to scale sampled counts by.
    pub work: Option<f64>,
}

/// The probes' cost as measured: the budget, the share in force, and each
/// process's estimate.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Costs {
    pub budget: Option<f64>,
    pub share: f64,
    pub procs: Vec<ProcCost>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProcCost {
    pub pid: u32,
    /// None: too few windows with enough work.
    pub estimate: Option<crate::agent::cost::Estimate>,
    /// Windows with their time off after them, and those of them too
    /// quiet to use.
    pub windows: u64,
    pub skipped: u64,
    /// The share of its work the windows see at the share in force.
    pub work_share: Option<f64>,
    /// The budget is out of reach even at the least share.
    pub over: bool,
}

impl ProcCost {
    /// CPU the probes add at the share in force, as a share of the app's own.
    pub fn added(&self) -> Option<f64> {
        Some(self.estimate?.added(self.work_share?))
    }
}

/// A share as the percentage it was given as (0.07 → "7", not 7.000000000000001).
fn percent(share: f64) -> f64 {
    (share * 1e6).round() / 1e4
}

/// How many processes the cost line names.
const COST_LISTED: usize = 8;

/// "uvspan: the probes' cost …": each process's estimate, or why there is
/// none; never silent.
pub fn cost_line(c: &Costs) -> String {
    use crate::agent::cost::{MIN_BYTES, MIN_CPU_NS};
    let pct = |x: f64| x * 100.0;
    let budget = c.budget.map_or_else(String::new, |b| format!(", --max-overhead {}%", percent(b)));
    let mut line = format!("uvspan: the probes' cost (CPU they add to the app's own{budget}; live {:.1}% of the time now)", pct(c.share));
    if c.procs.is_empty() {
        line.push_str(": no estimate: no traced process with an event loop was read at the windows' edges");
        return line;
    }
    let each: Vec<String> = c
        .procs
        .iter()
        .take(COST_LISTED)
        .map(|p| {
            let used = p.windows - p.skipped;
            match (p.estimate, p.added(), p.work_share) {
                (Some(e), Some(added), Some(w)) => format!(
                    "pid {}: {:+.1}% while live (95%: {:+.1}% to {:+.1}%, {} of {} windows used), {:.1}% of its work seen live: {:+.2}%{}",
                    p.pid,
                    pct(e.ratio - 1.0),
                    pct(e.low - 1.0),
                    pct(e.high - 1.0),
                    e.pairs,
                    p.windows,
                    pct(w),
                    pct(added),
                    if p.over { " (over the budget even at the least live share)" } else { "" }
                ),
                _ => format!(
                    "pid {}: no estimate: too little work in the windows ({used} of {} windows had {} ms of CPU and {} KiB of I/O in \
                     it and in the time off after it)",
                    p.pid,
                    p.windows,
                    MIN_CPU_NS / 1_000_000,
                    MIN_BYTES / 1024
                ),
            }
        })
        .collect();
    line.push_str(": ");
    line.push_str(&each.join("; "));
    let more = c.procs.len().saturating_sub(COST_LISTED);
    if more > 0 {
        line.push_str(&format!("; and {more} more (uvspan.overhead, per process.pid)"));
    }
    line
}

/// "uvspan: tracing WHO (…)", and the notices of what this build loses
/// (once per binary: `notices_too`): a line per capability, or with
/// `verbose` the probes by name.
pub fn announce(who: &str, images: &Images, report: &[ProbeStatus], took: Duration, notices_too: bool, verbose: bool) {
    let loc = &images.libuv;
    let attached = report.iter().filter(|r| r.state == ProbeState::Usable).count();
    let version = match (&images.node_version, &loc.image.libuv_version) {
        (Some(n), Some(u)) => format!("node {n}, libuv {u}"),
        (Some(n), None) => format!("node {n}"),
        (None, Some(u)) => format!("libuv {u}"),
        (None, None) => "version unknown".into(),
    };
    eprintln!(
        "uvspan: tracing {who} ({}, {version}): {attached} probes live {:.1} ms after it was found",
        loc.path,
        took.as_secs_f64() * 1e3
    );
    if !notices_too {
        return;
    }
    if verbose {
        for line in notices(loc, report) {
            eprintln!("uvspan:   {line}");
        }
        return;
    }
    let lines = short_notices(report);
    for line in &lines {
        eprintln!("uvspan:   {line}");
    }
    if !lines.is_empty() {
        eprintln!("uvspan:   (the probes missing and why: --verbose, or `uvspan probes`)");
    }
}

/// Requests in flight when their process (or their thread) exited.
fn unfinished(k: &Stats, run: &RunStats) -> u64 {
    run.unfinished_at_exit + k.unfinished_in_threads
}

pub fn status_line(processes: usize, sum: &Summary, k: &Stats, run: &RunStats) -> String {
    format!(
        "uvspan: status: {processes} processes traced; spans: {} exported, {} dropped (queue full), {} failed to export, \
         {} export errors; {} records lost in the kernel; {} unfinished at process exit",
        sum.exported,
        sum.dropped,
        sum.failed,
        sum.export_errors,
        k.records_lost,
        unfinished(k, run)
    )
}

/// The exit summary; `processes` traced in all, `node` of them ran Node.js.
pub fn summary_line(processes: u64, node: u64, sum: &Summary, k: &Stats, run: &RunStats, loop_threshold: Duration) -> String {
    let fast = k.loop_iterations.saturating_sub(k.loop_emitted);
    let requests = run.requests.map_or_else(String::new, |r| {
        format!(
            "; {} HTTP requests ({} with a malformed traceparent, ignored; {} not sampled, not exported{})",
            r.requests + r.followed,
            r.bad_traceparent,
            r.unsampled + r.followed,
            if r.followed > 0 {
                format!(", {} of them followed in the kernel (metrics only, no record)", r.followed)
            } else {
                String::new()
            } + &if r.tail_kept > 0 { format!("; {} not sampled but kept: errors or slow", r.tail_kept) } else { String::new() }
                + &if r.tail_lost > 0 {
                    format!(
                        "; {} records of unsampled requests not held for the tail exceptions (over 64 MiB or 512 per request, or \
                         their request's end lost): kept requests may miss them",
                        r.tail_lost
                    )
                } else {
                    String::new()
                }
                + &if r.h2_open_at_end > 0 {
                    format!(
                        "; {} unsampled HTTP/2 streams followed in the kernel still open when their process or uvspan exited (not in \
                         the metrics)",
                        r.h2_open_at_end
                    )
                } else {
                    String::new()
                }
                + &if r.not_held > 0 {
                    format!("; {} operations over what a request holds, sent alone (dropped when not sampled)", r.not_held)
                } else {
                    String::new()
                }
                + &if r.unanswered > 0 {
                    format!(
                        "; {} ended without their response seen (their process exited, uvspan stopped, their connection began another, or none came in 30 s: \
                         uvspan.http.ended_by)",
                        r.unanswered
                    )
                } else {
                    String::new()
                }
        )
    });
    let stacks = match k.sampler_on {
        Some(n) => {
            let times = if n == 1 { "once".to_string() } else { format!("{n} times") };
            format!("; {} loop-thread stack samples (the sampler on {times}, for slow iterations)", k.stack_samples)
        }
        None if k.stack_samples > 0 => format!("; {} loop-thread stack samples", k.stack_samples),
        None => String::new(),
    };
    let sampling = run.sampling.map_or_else(String::new, |s| {
        let cut = run.requests.unwrap_or_default();
        let work = s.work.map_or_else(String::new, |w| {
            format!(" and for {:.1}% of the traced processes' I/O bytes (scale sampled counts by this)", w * 100.0)
        });
        let asked = match s.budget {
            Some(b) => format!("--max-overhead {}% (live {:.1}% of the time now)", percent(b), s.asked * 100.0),
            None => format!("--sample-time {}%", s.asked * 100.0),
        };
        format!(
            "; {asked}: probes live {:.1}% of the time{work}, {} operations crossing a window edge dropped \
             ({} of them held by the {} requests crossing one)",
            s.time * 100.0,
            straddled(k, run),
            cut.straddled_ops,
            cut.straddled
        )
    });
    let sampler = run.sampler.as_ref().map_or_else(String::new, |(name, n)| {
        format!("; sampler {name}: {n} operations and loop iterations outside requests not sampled, not exported")
    });
    let kernel = if k.unsampled_ops > 0 || k.hist_full > 0 {
        format!(
            "; {} operations of unsampled traces counted in the kernel (metrics only, no record){}",
            k.unsampled_ops,
            if k.hist_full > 0 { format!(", {} not counted: histogram map full", k.hist_full) } else { String::new() }
        )
    } else {
        String::new()
    };
    let h2 = if k.h2_headers_unsent > 0 {
        format!(
            "; {} HTTP/2 request headers not sent (repeated ones past the 10 a stream dropped as a root keeps until its \
             traceparent samples it)",
            k.h2_headers_unsent
        )
    } else {
        String::new()
    };
    let mixed = if k.mixed_reads > 0 {
        format!(
            "; {} reads of client connections shared by several requests' pipelined commands made tasks of their own (not \
             attributed to either request)",
            k.mixed_reads
        )
    } else {
        String::new()
    };
    let after = if k.after_answer > 0 {
        format!(
            "; {} replies on client connections read after the request that wrote there had answered (a pooled connection \
             handed on) made tasks of their own (not attributed to that request)",
            k.after_answer
        )
    } else {
        String::new()
    };
    let short = if run.short > 0 {
        format!("; {} operations outside requests shorter than --min-duration not exported", run.short)
    } else {
        String::new()
    };
    let gc = if run.gc_events_dropped > 0 {
        format!(
            "; {} v8js.gc span events dropped (over {} collections waiting on a thread; v8js.gc.duration counts them)",
            run.gc_events_dropped,
            crate::events::gc::PENDING_MAX
        )
    } else {
        String::new()
    };
    let d = &run.db;
    let db = if d.connections > 0 || d.unknown > 0 {
        let mut t = format!("; {} database operations on {} connections", d.ops, d.connections);
        if d.lost_ops > 0 {
            t += &format!(
                " ({} commands without an operation: unanswered when their connection's parsing ended or it was dropped)",
                d.lost_ops
            );
        }
        if d.stopped > 0 {
            t += &format!(
                ", {} connections no longer parsed (a lost record, bytes the parser could not follow, a protocol switch)",
                d.stopped
            );
        }
        if d.unknown > 0 {
            t += &format!(", {} client connections of no known protocol", d.unknown);
        }
        if d.unattributed > 0 {
            t += &format!(
                ", {} not under a request (their responses came in one read with several requests' answers: pipelined commands of several requests)",
                d.unattributed
            );
        }
        t
    } else {
        String::new()
    };
    let off = run.traces_off.map_or_else(String::new, |why| format!("; no span is sent anywhere ({why})"));
    let t = &run.tasks;
    let tasks = if t.tasks > 0 || t.processes > 0 {
        format!(
            "; {} background tasks, {} process traces ({} not sampled, not exported{})",
            t.tasks,
            t.processes,
            t.unsampled,
            if t.not_held > 0 { format!("; {} operations over what a task holds, sent alone", t.not_held) } else { String::new() }
        )
    } else {
        String::new()
    };
    format!(
        "uvspan: {processes} process(es), {node} Node.js; spans: {} exported, {} dropped (queue full), {} failed to export, {} not flushed; \
         {} records lost in the kernel (ring buffer or in-flight table full), {} undecodable, {} unfinished at process exit; \
         {} loop iterations, {fast} under {loop_threshold:?} not reported{requests}{h2}{mixed}{after}{tasks}{db}{sampler}{kernel}{short}{gc}{stacks}{sampling}{off}",
        sum.exported, sum.dropped, sum.failed, sum.unflushed, k.records_lost, run.undecodable, unfinished(k, run), k.loop_iterations,
    )
}

/// The health metrics' current values.
pub fn update_health(health: &Health, processes: usize, k: &Stats, run: &RunStats) {
    health.processes_traced.store(processes as u64, Ordering::Relaxed);
    health.records_lost.store(k.records_lost, Ordering::Relaxed);
    health.loop_iterations.store(k.loop_iterations, Ordering::Relaxed);
    health.unfinished_at_exit.store(unfinished(k, run), Ordering::Relaxed);
    health.straddled.store(straddled(k, run), Ordering::Relaxed);
    if let Some(w) = run.sampling.and_then(|s| s.work) {
        health.sample_work_ppm.store((w * 1e6).round() as u64, Ordering::Relaxed);
    }
    if let Some(c) = &run.cost {
        let points = c
            .procs
            .iter()
            .filter_map(|p| {
                let e = p.estimate?;
                Some(crate::export::health::CostPoint { pid: p.pid, ratio: e.ratio, low: e.low, high: e.high, added: p.added()? })
            })
            .collect();
        *health.cost.lock().unwrap_or_else(|e| e.into_inner()) = points;
    }
    health.operations_unsampled.store(run.sampler.as_ref().map_or(0, |s| s.1) + k.unsampled_ops, Ordering::Relaxed);
    health.operations_short.store(run.short, Ordering::Relaxed);
    if let Some(r) = run.requests {
        health.requests.store(r.requests + r.followed, Ordering::Relaxed);
        health.requests_bad_traceparent.store(r.bad_traceparent, Ordering::Relaxed);
        health.requests_unsampled.store(r.unsampled + r.followed, Ordering::Relaxed);
        health.requests_straddled.store(r.straddled, Ordering::Relaxed);
    }
}

/// --sample-time: operations dropped at a window edge, in flight there
/// (kernel) or held by a request whose end fell past it.
fn straddled(k: &Stats, run: &RunStats) -> u64 {
    k.straddled + run.requests.map_or(0, |r| r.straddled_ops)
}

/// The processes traced as Node.js (each said with a "tracing" line), for
/// the summary: the first ones named by pid and command line, the rest
/// counted.
#[derive(Default)]
pub struct Traced {
    listed: Vec<String>,
    count: u64,
    live: std::collections::HashSet<u32>,
    /// --no-follow-children: how many processes ran below the targets
    /// when the run began (not traced).
    pub not_followed: Option<usize>,
}

/// How many processes the summary names.
const LISTED: usize = 8;
/// How much of a command line it shows.
const COMMAND_CHARS: usize = 80;

impl Traced {
    /// `pid` is traced, `under` the --pid target it descends from.
    pub fn add(&mut self, pid: u32, under: Option<u32>) {
        if !self.live.insert(pid) {
            return;
        }
        self.count += 1;
        if self.listed.len() < LISTED {
            self.listed.push(describe(pid, &command_line(pid), crate::discover::pidns::view_of(pid, None), under));
        }
    }

    pub fn exited(&mut self, pid: u32) {
        self.live.remove(&pid);
    }

    /// Traced and not exited.
    pub fn is_live(&self, pid: u32) -> bool {
        self.live.contains(&pid)
    }

    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// "uvspan: traced N Node.js process(es): PID (COMMAND), …"; with
    /// --no-follow-children, that the processes below were not followed.
    pub fn line(&self) -> String {
        let mut line = format!("uvspan: traced {} Node.js process(es)", self.count);
        if !self.listed.is_empty() {
            line.push_str(": ");
            line.push_str(&self.listed.join(", "));
        }
        let more = self.count.saturating_sub(self.listed.len() as u64);
        if more > 0 {
            line.push_str(&format!(", and {more} more"));
        }
        if let Some(n) = self.not_followed {
            line.push_str(&format!(
                "; the processes below the --pid targets were not followed (--no-follow-children: {n} ran below them at the start)"
            ));
        }
        line
    }
}

/// "PID (COMMAND, OWN in its PID namespace, under TARGET)".
fn describe(pid: u32, command: &str, own: Option<u32>, under: Option<u32>) -> String {
    let mut s = format!("{pid} ({command}");
    if let Some(own) = own {
        s.push_str(&format!(", {own} in its PID namespace"));
    }
    if let Some(t) = under {
        s.push_str(&format!(", under {t}"));
    }
    s.push(')');
    s
}

/// A process's command line, its arguments joined by spaces, shortened to
/// [`COMMAND_CHARS`] (its name when it has none: a kernel thread, gone).
fn command_line(pid: u32) -> String {
    use std::io::Read;
    let mut raw = Vec::new();
    let _ = std::fs::File::open(format!("/proc/{pid}/cmdline")).map(|f| f.take(4096).read_to_end(&mut raw));
    let args: Vec<String> = raw.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let text = if args.is_empty() {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim().to_string()).unwrap_or_else(|_| "?".into())
    } else {
        args.join(" ")
    };
    shorten(&text, COMMAND_CHARS)
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
    s.push('…');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traced_list_names_the_first_processes_and_counts_the_rest() {
        let mut t = Traced::default();
        assert_eq!(t.line(), "uvspan: traced 0 Node.js process(es)");
        t.listed = vec![describe(40, "node primary.js", None, None), describe(41, "/usr/bin/node primary.js", Some(7), Some(40))];
        t.count = 2;
        assert_eq!(
            t.line(),
            "uvspan: traced 2 Node.js process(es): 40 (node primary.js), 41 (/usr/bin/node primary.js, 7 in its PID namespace, under 40)"
        );
        t.count = 12;
        assert!(t.line().ends_with(", and 10 more"), "{}", t.line());
        t.not_followed = Some(2);
        assert!(
            t.line().ends_with(
                "more; the processes below the --pid targets were not followed (--no-follow-children: 2 ran below them at the start)"
            ),
            "{}",
            t.line()
        );
        assert_eq!(shorten("abcdef", 4), "abc…");
        assert_eq!(shorten("abc", 4), "abc");
    }

    #[test]
    fn a_process_is_listed_once_while_it_lives() {
        let mut t = Traced::default();
        let me = std::process::id();
        t.add(me, None);
        t.add(me, None);
        assert_eq!((t.count, t.live(), t.listed.len()), (1, 1, 1));
        assert!(t.listed[0].starts_with(&format!("{me} (")), "{:?}", t.listed);
        t.exited(me);
        assert!(!t.is_live(me));
    }

    /// Each process's estimate or why it has none; never silent.
    #[test]
    fn the_cost_line_says_each_estimate_or_why_there_is_none() {
        use crate::agent::cost::Estimate;
        let e = Estimate { ratio: 1.8, low: 1.6, high: 2.1, pairs: 12, q: 0.8 };
        let est = ProcCost { pid: 123, estimate: Some(e), windows: 14, skipped: 2, work_share: Some(0.02), over: true };
        let none = ProcCost { pid: 7, estimate: None, windows: 9, skipped: 8, work_share: None, over: false };
        let line = cost_line(&Costs { budget: Some(0.01), share: 0.025, procs: vec![est, none] });
        assert_eq!(
            line,
            "uvspan: the probes' cost (CPU they add to the app's own, --max-overhead 1%; live 2.5% of the time now): \
             pid 123: +80.0% while live (95%: +60.0% to +110.0%, 12 of 14 windows used), 2.0% of its work seen live: +1.60% \
             (over the budget even at the least live share); pid 7: no estimate: too little work in the windows (1 of 9 \
             windows had 2 ms of CPU and 4 KiB of I/O in it and in the time off after it)"
        );
        assert!(cost_line(&Costs { budget: Some(0.07), share: 0.1, procs: vec![] }).contains(", --max-overhead 7%;"));
        assert!(cost_line(&Costs { budget: None, share: 0.1, procs: vec![] })
            .ends_with(": no estimate: no traced process with an event loop was read at the windows' edges"));
        let many = Costs { budget: None, share: 0.1, procs: vec![none; 10] };
        assert!(cost_line(&many).ends_with("; and 2 more (uvspan.overhead, per process.pid)"), "{}", cost_line(&many));
    }

    #[test]
    fn the_summary_counts_gc_events_dropped() {
        let line = |dropped| {
            let run = RunStats { gc_events_dropped: dropped, ..Default::default() };
            summary_line(1, 1, &Summary::default(), &Stats::default(), &run, Duration::from_millis(50))
        };
        assert!(!line(0).contains("v8js.gc"), "{}", line(0));
        assert!(
            line(7).contains("; 7 v8js.gc span events dropped (over 4096 collections waiting on a thread; v8js.gc.duration counts them)"),
            "{}",
            line(7)
        );
    }

    #[test]
    fn the_summary_says_how_often_the_stack_sampler_went_on() {
        let line = |on, samples| {
            let k = Stats { sampler_on: on, stack_samples: samples, ..Default::default() };
            summary_line(1, 1, &Summary::default(), &k, &RunStats::default(), Duration::from_millis(50))
        };
        assert!(!line(None, 0).contains("stack samples"), "--stacks off: {}", line(None, 0));
        assert!(
            line(Some(0), 0).ends_with("; 0 loop-thread stack samples (the sampler on 0 times, for slow iterations)"),
            "{}",
            line(Some(0), 0)
        );
        assert!(
            line(Some(1), 51).ends_with("; 51 loop-thread stack samples (the sampler on once, for slow iterations)"),
            "{}",
            line(Some(1), 51)
        );
        assert!(line(Some(3), 9).contains("(the sampler on 3 times, for slow iterations)"), "{}", line(Some(3), 9));
    }
}
