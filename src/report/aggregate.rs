//! The report's numbers: a pure fold of finished spans into per-process and
//! total sections (fs by op with p50/p99/max, top paths, DNS names, blocked
//! loop iterations). Spans count by their family (never by their names):
//! fs, DNS and loop iterations; phase children and HTTP spans are ignored.

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use opentelemetry::trace::Status;
use serde::Serialize;

use crate::events::spans::{keys, Family, Span, Value};

/// The stack of a slow iteration, when uvspan captured one.
pub const STACKTRACE: &str = "code.stacktrace";
/// Upper bounds (ms) of the latency histograms' buckets; the last bucket is
/// everything above the last bound.
pub const HISTOGRAM_LE_MS: [f64; 16] = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];
/// How many paths and DNS names a section lists.
pub const TOP: usize = 10;

/// The whole report (the JSON contract; `budgets` are filled in by the caller).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Report {
    pub command: Vec<String>,
    pub exit_code: i32,
    pub wall_ms: f64,
    pub loop_threshold_ms: f64,
    /// Every process traced in the run: `processes` lists those that ran
    /// Node.js, not the shells and other programs between them.
    pub processes_traced: u64,
    pub processes: Vec<ProcessReport>,
    #[serde(flatten)]
    pub total: Sections,
    pub budgets: Vec<BudgetResult>,
    pub histogram_le_ms: Vec<f64>,
    /// Traced processes the kernel sent nothing of, not even their exit:
    /// the run is not what the report says (see [`super::exit_status`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unseen_processes: Vec<u32>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ProcessReport {
    pub pid: u32,
    pub command: String,
    #[serde(flatten)]
    pub sections: Sections,
    /// Its trace as a tree (`--trace-per process`; see [`super::trees`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<super::trees::ProcessTrace>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Sections {
    pub fs: FsReport,
    pub dns: DnsReport,
    #[serde(rename = "loop")]
    pub event_loop: LoopReport,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct FsReport {
    pub count: u64,
    pub errors: u64,
    /// Synchronous fs calls (`fs.*Sync`) made on the process's main thread.
    pub sync_on_loop: CountMs,
    pub by_op: BTreeMap<String, OpStats>,
    pub top_paths: Vec<PathStats>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct CountMs {
    pub count: u64,
    pub total_ms: f64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct OpStats {
    pub count: u64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub total_ms: f64,
    /// Of the async ops, the time their callbacks waited for the loop
    /// after the threadpool finished them (`--detail threadpool`; null
    /// without it). Where it is known, the latencies above are the ops' own
    /// time (queue + run) without it.
    pub loop_wait_ms: Option<f64>,
    /// Counts per bucket of [`HISTOGRAM_LE_MS`] (one more: above the last).
    pub histogram: Vec<u64>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PathStats {
    pub path: String,
    pub count: u64,
    /// Submit to callback.
    pub total_ms: f64,
    /// Of it, the operations' own time (without `loop_wait_ms`): what the
    /// list is ranked by.
    pub own_ms: f64,
    /// Of it, the callbacks' wait for a busy loop after the threadpool had
    /// finished (`--detail threadpool`; null without it).
    pub loop_wait_ms: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct DnsReport {
    pub count: u64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub histogram: Vec<u64>,
    pub by_name: Vec<NameStats>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct NameStats {
    pub name: String,
    pub count: u64,
    pub errors: u64,
    pub max_ms: f64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct LoopReport {
    /// Every iteration, the fast ones uvspan counted but did not report too.
    pub iterations: u64,
    pub blocked: Blocked,
    /// The blocked iterations' busy time split (bpf/loop.h): the largest in
    /// one iteration and the sum, over the iterations that carry it.
    pub on_cpu: PartStats,
    pub off_cpu: PartStats,
    pub runqueue: PartStats,
    /// The process's cgroup's CFS throttling (iterations of processes with a quota).
    pub throttled: PartStats,
    /// V8 garbage collections on the loop thread (iterations of processes
    /// whose collections are seen: `uvspan.loop.gc_ms`); null where no
    /// reported iteration carries it (not seen, not 0).
    pub gc: Option<PartStats>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PartStats {
    pub max_ms: f64,
    pub total_ms: f64,
}

impl PartStats {
    fn add(&mut self, ms: f64) {
        self.max_ms = self.max_ms.max(round(ms));
        self.total_ms = round(self.total_ms + ms);
    }
}

/// One iteration's busy time split (ms).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Split {
    pub on_cpu_ms: f64,
    pub off_cpu_ms: f64,
    pub runqueue_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttled_ms: Option<f64>,
}

impl Split {
    /// The split a span carries (all three parts, or none).
    fn of(s: &Span) -> Option<Split> {
        let get = |k: &str| match s.attr(k) {
            Some(Value::F64(v)) => Some(round(*v)),
            _ => None,
        };
        Some(Split {
            on_cpu_ms: get(keys::ON_CPU)?,
            off_cpu_ms: get(keys::OFF_CPU)?,
            runqueue_ms: get(keys::RUNQUEUE)?,
            throttled_ms: get(keys::THROTTLED),
        })
    }
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Blocked {
    pub count: u64,
    pub max_ms: f64,
    pub total_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst: Option<Worst>,
}

/// The longest blocked iteration.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Worst {
    pub pid: u32,
    pub thread_id: i64,
    pub busy_ms: f64,
    /// Milliseconds since the run started.
    pub at_ms: f64,
    /// The innermost user JS frame of its heaviest stack (the span's
    /// `uvspan.loop.blocked_by`; when stacks are captured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub culprit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stacktrace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<Split>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct BudgetResult {
    pub expr: String,
    /// None: the run did not measure it (null in the report); the budget
    /// is then broken, not held on nothing.
    pub value: Option<f64>,
    pub ok: bool,
    /// The processes it was checked over (its selector, see
    /// [`super::budget`]); absent for a number of the whole run (wall_ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The selected process whose own figure is the worst (the largest for
    /// `<`, `<=`, `==`; the smallest for `>`, `>=`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<FromProcess>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FromProcess {
    pub pid: u32,
    pub command: String,
    pub value: f64,
}

impl BudgetResult {
    /// The value as shown beside the budget.
    pub fn shown(&self) -> String {
        self.value.map_or_else(|| "not measured".to_string(), |v| v.to_string())
    }

    /// Where the worst figure came from: "pid 12 node test.js", or "".
    pub fn shown_from(&self) -> String {
        self.from.as_ref().map_or_else(String::new, |f| format!("pid {} {}", f.pid, short_command(&f.command, 60)))
    }
}

/// `command` cut to `max` characters.
pub fn short_command(command: &str, max: usize) -> String {
    if command.chars().count() <= max {
        return command.to_string();
    }
    let cut: String = command.chars().take(max.saturating_sub(1)).collect();
    cut + "…"
}

/// One span, as the report sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    /// `loop_wait_ms`: the callback's wait for the loop (`--detail threadpool`).
    Fs {
        op: String,
        path: Option<String>,
        sync_on_loop: bool,
        loop_wait_ms: Option<f64>,
    },
    Dns {
        name: String,
    },
    Iteration {
        tid: i64,
        stack: Option<String>,
        blocked_by: Option<String>,
        split: Option<Split>,
        gc_ms: Option<f64>,
    },
}

/// What one span is, how long it took, whether it failed; None for spans
/// the report does not count.
pub fn classify(pid: u32, s: &Span) -> Option<(Item, f64, bool)> {
    let attr = |k: &str| s.attr(k);
    let text = |k: &str| attr(k).map(|v| v.as_str().into_owned());
    let int = |k: &str| match attr(k) {
        Some(Value::I64(v)) => Some(*v),
        _ => None,
    };
    let ms = s.ms();
    let failed = matches!(s.status, Status::Error { .. });
    let item = match s.family {
        Family::Fs(op) => {
            let on_loop = int(keys::THREAD_ID) == Some(i64::from(pid));
            let sync = matches!(attr(keys::SYNC), Some(Value::Bool(true)));
            let loop_wait_ms = match attr(keys::CALLBACK_WAIT) {
                Some(Value::F64(v)) => Some(v.clamp(0.0, ms)),
                _ => None,
            };
            Item::Fs { op: op.to_string(), path: text(keys::FILE_PATH), sync_on_loop: sync && on_loop, loop_wait_ms }
        }
        Family::Dns => Item::Dns { name: text(keys::DNS_NAME).unwrap_or_default() },
        Family::Iteration => {
            let busy = match attr(keys::BUSY) {
                Some(Value::F64(v)) => *v,
                _ => ms,
            };
            let tid = int(keys::THREAD_ID).unwrap_or(i64::from(pid));
            let gc_ms = match attr(keys::GC) {
                Some(Value::F64(v)) => Some(*v),
                _ => None,
            };
            let item = Item::Iteration { tid, stack: text(STACKTRACE), blocked_by: text(keys::BLOCKED_BY), split: Split::of(s), gc_ms };
            return Some((item, busy, failed));
        }
        Family::Phase | Family::Http | Family::Db | Family::Task | Family::Process | Family::Other => return None,
    };
    Some((item, ms, failed))
}

/// The running sums of one section.
#[derive(Debug, Default)]
struct Acc {
    /// Per op: own times, errors, the callbacks' wait where known.
    ops: BTreeMap<String, (Vec<f64>, u64, Option<f64>)>,
    sync_on_loop: (u64, f64),
    /// Per path: count, total time, the callbacks' wait where known.
    paths: HashMap<String, (u64, f64, Option<f64>)>,
    dns: Vec<f64>,
    dns_errors: u64,
    names: HashMap<String, (u64, u64, f64)>,
    /// Iterations counted through the reported ones (each says how many fast
    /// ones came before it).
    iterations: u64,
    blocked: Vec<f64>,
    worst: Option<Worst>,
    /// on-CPU, off-CPU, run queue, throttled
    parts: [PartStats; 4],
    gc: Option<PartStats>,
}

impl Acc {
    fn add(&mut self, pid: u32, item: &Item, ms: f64, failed: bool, at_ms: f64, fast_before: u64) {
        match item {
            Item::Fs { op, path, sync_on_loop, loop_wait_ms } => {
                let wait = loop_wait_ms.unwrap_or(0.0);
                let e = self.ops.entry(op.clone()).or_default();
                e.0.push(ms - wait);
                e.1 += u64::from(failed);
                if let Some(w) = loop_wait_ms {
                    *e.2.get_or_insert(0.0) += w;
                }
                if *sync_on_loop {
                    self.sync_on_loop.0 += 1;
                    self.sync_on_loop.1 += ms;
                }
                if let Some(p) = path {
                    let e = self.paths.entry(p.clone()).or_default();
                    e.0 += 1;
                    e.1 += ms;
                    if let Some(w) = loop_wait_ms {
                        *e.2.get_or_insert(0.0) += w;
                    }
                }
            }
            Item::Dns { name } => {
                self.dns.push(ms);
                self.dns_errors += u64::from(failed);
                let e = self.names.entry(name.clone()).or_default();
                e.0 += 1;
                e.1 += u64::from(failed);
                e.2 = e.2.max(ms);
            }
            Item::Iteration { tid, stack, blocked_by, split, gc_ms } => {
                self.iterations += 1 + fast_before;
                self.blocked.push(ms);
                if let Some(g) = gc_ms {
                    self.gc.get_or_insert_with(PartStats::default).add(*g);
                }
                if let Some(s) = split {
                    let [on, off, rq, thr] = &mut self.parts;
                    on.add(s.on_cpu_ms);
                    off.add(s.off_cpu_ms);
                    rq.add(s.runqueue_ms);
                    if let Some(t) = s.throttled_ms {
                        thr.add(t);
                    }
                }
                if self.worst.as_ref().is_none_or(|w| ms > w.busy_ms) {
                    self.worst = Some(Worst {
                        pid,
                        thread_id: *tid,
                        busy_ms: round(ms),
                        at_ms: round(at_ms),
                        // The user's function, not the native frame on top
                        // (a stack without the span's pick: its top frame).
                        culprit: blocked_by.clone().or_else(|| stack.as_deref().and_then(culprit)),
                        stacktrace: stack.clone(),
                        split: split.clone(),
                    });
                }
            }
        }
    }

    /// Adds another section's sums (processes folded together).
    fn merge(&mut self, o: &Acc) {
        for (op, (d, e, w)) in &o.ops {
            let m = self.ops.entry(op.clone()).or_default();
            m.0.extend_from_slice(d);
            m.1 += e;
            if let Some(w) = w {
                *m.2.get_or_insert(0.0) += w;
            }
        }
        self.sync_on_loop.0 += o.sync_on_loop.0;
        self.sync_on_loop.1 += o.sync_on_loop.1;
        for (p, (n, t, w)) in &o.paths {
            let m = self.paths.entry(p.clone()).or_default();
            m.0 += n;
            m.1 += t;
            if let Some(w) = w {
                *m.2.get_or_insert(0.0) += w;
            }
        }
        self.dns.extend_from_slice(&o.dns);
        self.dns_errors += o.dns_errors;
        for (n, (c, e, x)) in &o.names {
            let m = self.names.entry(n.clone()).or_default();
            m.0 += c;
            m.1 += e;
            m.2 = m.2.max(*x);
        }
        self.iterations += o.iterations;
        self.blocked.extend_from_slice(&o.blocked);
        if let Some(w) = &o.worst {
            if self.worst.as_ref().is_none_or(|m| w.busy_ms > m.busy_ms) {
                self.worst = Some(w.clone());
            }
        }
        for (m, p) in self.parts.iter_mut().zip(&o.parts) {
            m.max_ms = m.max_ms.max(p.max_ms);
            m.total_ms = round(m.total_ms + p.total_ms);
        }
        if let Some(g) = &o.gc {
            let m = self.gc.get_or_insert_with(PartStats::default);
            m.max_ms = m.max_ms.max(g.max_ms);
            m.total_ms = round(m.total_ms + g.total_ms);
        }
    }

    fn sections(&self, iterations: u64) -> Sections {
        let by_op: BTreeMap<String, OpStats> = self
            .ops
            .iter()
            .map(|(op, (d, errors, wait))| {
                let (p50, p99, max, total) = stats(d);
                let s = OpStats {
                    count: d.len() as u64,
                    errors: *errors,
                    p50_ms: p50,
                    p99_ms: p99,
                    max_ms: max,
                    total_ms: total,
                    loop_wait_ms: wait.map(round),
                    histogram: histogram(d),
                };
                (op.clone(), s)
            })
            .collect();
        let mut top_paths: Vec<PathStats> = self
            .paths
            .iter()
            .map(|(p, (n, t, w))| PathStats {
                path: p.clone(),
                count: *n,
                total_ms: round(*t),
                own_ms: round(t - w.unwrap_or(0.0)),
                loop_wait_ms: w.map(round),
            })
            .collect();
        top_paths.sort_by(|a, b| b.own_ms.total_cmp(&a.own_ms).then(b.count.cmp(&a.count)).then(a.path.cmp(&b.path)));
        top_paths.truncate(TOP);
        let mut by_name: Vec<NameStats> =
            self.names.iter().map(|(n, (c, e, m))| NameStats { name: n.clone(), count: *c, errors: *e, max_ms: round(*m) }).collect();
        by_name.sort_by(|a, b| b.count.cmp(&a.count).then(b.max_ms.total_cmp(&a.max_ms)).then(a.name.cmp(&b.name)));
        by_name.truncate(TOP);
        let (p50, p99, max, _) = stats(&self.dns);
        let (_, _, bmax, btotal) = stats(&self.blocked);
        Sections {
            fs: FsReport {
                count: by_op.values().map(|o| o.count).sum(),
                errors: by_op.values().map(|o| o.errors).sum(),
                sync_on_loop: CountMs { count: self.sync_on_loop.0, total_ms: round(self.sync_on_loop.1) },
                by_op,
                top_paths,
            },
            dns: DnsReport {
                count: self.dns.len() as u64,
                errors: self.dns_errors,
                p50_ms: p50,
                p99_ms: p99,
                max_ms: max,
                histogram: histogram(&self.dns),
                by_name,
            },
            event_loop: LoopReport {
                iterations: iterations.max(self.iterations),
                blocked: Blocked { count: self.blocked.len() as u64, max_ms: bmax, total_ms: btotal, worst: self.worst.clone() },
                on_cpu: self.parts[0].clone(),
                off_cpu: self.parts[1].clone(),
                runqueue: self.parts[2].clone(),
                throttled: self.parts[3].clone(),
                gc: self.gc.clone(),
            },
        }
    }
}

/// The top frame of a stack trace: its first line that is not a header
/// ("Error", "Stack trace:"), trimmed, without a leading "at "; never a
/// shared library's frame ("open64 (libc.so.6)", "[vdso]"), an address or
/// a marker ("[unknown] (0x...)", "[truncated]").
pub fn culprit(stack: &str) -> Option<String> {
    let library =
        |l: &str| l.rsplit_once(" (").is_some_and(|(_, m)| m.contains(".so") && !m.starts_with("libnode") || m.starts_with("[vdso]"));
    stack
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.ends_with(':') && *l != "Error")
        .map(|l| l.strip_prefix("at ").unwrap_or(l))
        .find(|l| !l.starts_with('[') && !library(l))
        .map(str::to_string)
}

/// Rounded to the microsecond: reports do not change with float noise.
pub fn round(ms: f64) -> f64 {
    (ms * 1e3).round() / 1e3
}

/// p50, p99 (nearest rank), max, total.
fn stats(d: &[f64]) -> (f64, f64, f64, f64) {
    if d.is_empty() {
        return (0.0, 0.0, 0.0, 0.0);
    }
    let mut v = d.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    (round(rank(0.50)), round(rank(0.99)), round(v[v.len() - 1]), round(v.iter().sum()))
}

fn histogram(d: &[f64]) -> Vec<u64> {
    let mut h = vec![0; HISTOGRAM_LE_MS.len() + 1];
    for &x in d {
        h[HISTOGRAM_LE_MS.iter().position(|&le| x <= le).unwrap_or(HISTOGRAM_LE_MS.len())] += 1;
    }
    h
}

/// The fold: spans in, sections per process and in total out.
#[derive(Debug, Default)]
pub struct Aggregate {
    procs: BTreeMap<u32, Acc>,
    total: Acc,
    /// Fast iterations after a process's last reported one (from its exit).
    trailing_fast: HashMap<u32, u64>,
}

/// How the run went, besides its spans.
#[derive(Clone, Debug, Default)]
pub struct RunFacts {
    pub command: Vec<String>,
    pub exit_code: i32,
    pub wall_ms: f64,
    pub loop_threshold_ms: f64,
    /// Loop iterations the kernel counted in all traced processes.
    pub loop_iterations: u64,
    /// The command line of each process (pid → argv).
    pub commands: HashMap<u32, Vec<String>>,
    /// Traced processes the kernel sent nothing of, not even their exit.
    pub unseen: Vec<u32>,
    /// Every process traced in the run (Node.js or not).
    pub processes_traced: u64,
}

impl Aggregate {
    /// One span of process `pid`; `start` is when the run started.
    pub fn add(&mut self, pid: u32, s: &Span, start: SystemTime) {
        let Some((item, ms, failed)) = classify(pid, s) else { return };
        let at_ms = ms_since(s.start_ns, start);
        let fast_before = match s.attr(keys::FAST_BEFORE) {
            Some(Value::I64(n)) => (*n).max(0) as u64,
            _ => 0,
        };
        self.procs.entry(pid).or_default().add(pid, &item, ms, failed, at_ms, fast_before);
        self.total.add(pid, &item, ms, failed, at_ms, fast_before);
    }

    /// Process `pid` exited after `fast` loop iterations it did not report
    /// (a process that did nothing else is listed for its iterations).
    pub fn exited(&mut self, pid: u32, fast: u64) {
        if fast > 0 {
            self.procs.entry(pid).or_default();
            *self.trailing_fast.entry(pid).or_default() += fast;
        }
    }

    /// The sections of processes `pids` folded together (a budget's
    /// selected processes).
    pub fn scoped(&self, pids: &[u32]) -> Sections {
        let mut acc = Acc::default();
        let mut trailing = 0;
        for pid in pids {
            if let Some(a) = self.procs.get(pid) {
                acc.merge(a);
            }
            trailing += self.trailing_fast.get(pid).copied().unwrap_or(0);
        }
        acc.sections(acc.iterations + trailing)
    }

    /// The report (without budgets).
    pub fn report(&self, facts: &RunFacts) -> Report {
        let processes: Vec<ProcessReport> = self
            .procs
            .iter()
            .map(|(&pid, acc)| {
                let trailing = self.trailing_fast.get(&pid).copied().unwrap_or(0);
                let command = facts.commands.get(&pid).map(|a| a.join(" ")).unwrap_or_default();
                ProcessReport { pid, command, sections: acc.sections(acc.iterations + trailing), trace: None }
            })
            .collect();
        Report {
            command: facts.command.clone(),
            exit_code: facts.exit_code,
            wall_ms: round(facts.wall_ms),
            loop_threshold_ms: round(facts.loop_threshold_ms),
            processes_traced: facts.processes_traced.max(processes.len() as u64),
            processes,
            total: self.total.sections(facts.loop_iterations),
            budgets: vec![],
            histogram_le_ms: HISTOGRAM_LE_MS.to_vec(),
            unseen_processes: facts.unseen.clone(),
        }
    }
}

/// Milliseconds from `start` to `unix_ns` (0 before it).
pub fn ms_since(unix_ns: u64, start: SystemTime) -> f64 {
    let start_ns = start.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    unix_ns.saturating_sub(start_ns) as f64 / 1e6
}

#[cfg(test)]
pub(crate) mod tests {
    use std::borrow::Cow;
    use std::time::{Duration, UNIX_EPOCH};

    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, TraceFlags, TraceId, TraceState};

    use crate::events::spans::{KeyValue, DNS, ITERATION};

    use super::*;

    pub fn t0() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    /// A span of `family` starting `at` ms into the run, lasting `ms`.
    pub fn span(family: Family, name: &'static str, at: f64, ms: f64, attrs: Vec<KeyValue>, error: Option<&str>) -> Span {
        let start = t0() + Duration::from_secs_f64(at / 1e3);
        let ns = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
        Span {
            span_context: SpanContext::new(TraceId::from(1u128), SpanId::from(1u64), TraceFlags::SAMPLED, false, TraceState::NONE),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: Cow::Borrowed(name),
            start_ns: ns(start),
            end_ns: ns(start + Duration::from_secs_f64(ms / 1e3)),
            attributes: attrs,
            events: vec![],
            status: error.map_or(Status::Unset, |e| Status::error(e.to_string())),
            family,
        }
    }

    pub fn fs(op: &'static str, at: f64, ms: f64, tid: i64, sync: bool, path: &str, error: Option<&str>) -> Span {
        let mut a =
            vec![KeyValue::new(keys::FILE_PATH, path.to_string()), KeyValue::new(keys::THREAD_ID, tid), KeyValue::new(keys::SYNC, sync)];
        if let Some(e) = error {
            a.push(KeyValue::new(keys::ERROR_TYPE, e.to_string()));
        }
        span(Family::Fs(op.strip_prefix("fs.").unwrap()), op, at, ms, a, error)
    }

    pub fn dns(at: f64, ms: f64, name: &str, error: Option<&str>) -> Span {
        span(Family::Dns, DNS, at, ms, vec![KeyValue::new(keys::DNS_NAME, name.to_string()), KeyValue::new(keys::THREAD_ID, 100i64)], error)
    }

    pub fn iteration(at: f64, busy: f64, tid: i64, fast_before: i64, stack: Option<&str>) -> Span {
        let mut a =
            vec![KeyValue::new(keys::THREAD_ID, tid), KeyValue::new(keys::BUSY, busy), KeyValue::new(keys::FAST_BEFORE, fast_before)];
        if let Some(s) = stack {
            a.push(KeyValue::new(STACKTRACE, s.to_string()));
        }
        span(Family::Iteration, ITERATION, at, busy, a, None)
    }

    /// A blocked iteration as uvspan makes them: its stack sampled (the
    /// innermost frame native), the user's function picked, its busy time
    /// split (on, off, run queue; throttled when its cgroup has a quota).
    pub fn split_iteration(at: f64, busy: f64, tid: i64, fast_before: i64, split: [f64; 3], throttled: Option<f64>) -> Span {
        let mut s = iteration(at, busy, tid, fast_before, Some(VDSO_STACK));
        s.attributes.push(KeyValue::new(keys::BLOCKED_BY, "busyLoop (/app/index.js:10:5)".to_string()));
        for (k, v) in [keys::ON_CPU, keys::OFF_CPU, keys::RUNQUEUE].into_iter().zip(split) {
            s.attributes.push(KeyValue::new(k, v));
        }
        if let Some(t) = throttled {
            s.attributes.push(KeyValue::new(keys::THROTTLED, t));
        }
        s
    }

    const VDSO_STACK: &str = "__vdso_gettimeofday ([vdso])\nbusyLoop (/app/index.js:10:5)\nmain (/app/index.js:20:1)\nuv_run (node)";

    /// A run of two processes with known work (the golden report).
    pub fn sample() -> Report {
        let (a, facts) = sample_agg();
        a.report(&facts)
    }

    /// [`sample`]'s fold and facts.
    pub fn sample_agg() -> (Aggregate, RunFacts) {
        let mut a = Aggregate::default();
        let t = t0();
        for i in 0..4 {
            a.add(100, &fs("fs.stat", 1.0 + f64::from(i), 0.01 + f64::from(i) * 0.01, 100, true, "/app/package.json", None), t);
        }
        a.add(100, &fs("fs.stat", 9.0, 0.5, 100, false, "/app/<missing> & \"quoted\".json", Some("ENOENT")), t);
        a.add(100, &fs("fs.read", 10.0, 2.0, 100, false, "/app/data.bin", None), t);
        a.add(100, &fs("fs.open", 11.0, 0.3, 101, true, "/app/worker.js", None), t); // sync, not on the loop thread
        a.add(100, &dns(12.0, 4.0, "localhost", None), t);
        a.add(100, &dns(13.0, 30.0, "nonexistent.invalid", Some("ENOTFOUND")), t);
        let mut it = split_iteration(20.0, 150.25, 100, 40, [120.5, 20.75, 9.0], Some(4.5));
        it.attributes.push(KeyValue::new(keys::GC, 30.5)); // its collections
        a.add(100, &it, t);
        a.add(100, &iteration(200.0, 12.0, 100, 5, None), t);
        a.add(200, &split_iteration(250.0, 60.0, 200, 0, [10.0, 45.0, 5.0], None), t);
        a.add(100, &span(Family::Phase, "uv.loop.poll", 20.0, 100.0, vec![], None), t); // a phase child: not counted
        a.add(200, &fs("fs.stat", 300.0, 0.02, 200, true, "/app/package.json", None), t);
        a.add(200, &dns(301.0, 3.0, "localhost", None), t);
        a.exited(200, 12);
        a.exited(300, 0); // a shell: no loop, not listed
        let facts = RunFacts {
            command: vec!["npm".into(), "test".into()],
            exit_code: 0,
            wall_ms: 512.3456,
            loop_threshold_ms: 10.0,
            loop_iterations: 80,
            commands: [(100, vec!["node".to_string(), "index.js".to_string()]), (200, vec!["node".to_string(), "child.js".to_string()])]
                .into(),
            unseen: vec![],
            processes_traced: 3,
        };
        (a, facts)
    }

    #[test]
    fn golden_json() {
        let got = serde_json::to_string_pretty(&sample()).unwrap() + "\n";
        crate::report::tests::golden("report.json", &got);
    }

    #[test]
    fn counts_and_percentiles() {
        let r = sample();
        assert_eq!((r.total.fs.count, r.total.fs.errors), (8, 1));
        assert_eq!(r.total.fs.sync_on_loop.count, 5, "4 stats in 100 and 1 in 200; the open on thread 101 is not on the loop");
        let stat = &r.total.fs.by_op["stat"];
        assert_eq!((stat.count, stat.errors, stat.max_ms), (6, 1, 0.5));
        assert_eq!(stat.p50_ms, 0.02);
        assert_eq!(stat.histogram.iter().sum::<u64>(), 6);
        assert_eq!((r.total.dns.count, r.total.dns.errors), (3, 1));
        assert_eq!(r.total.dns.by_name[0].name, "localhost");
        assert_eq!(r.total.dns.by_name[0].count, 2);
        assert_eq!((r.total.event_loop.blocked.count, r.total.event_loop.blocked.max_ms, r.total.event_loop.iterations), (3, 150.25, 80));
        let worst = r.total.event_loop.blocked.worst.as_ref().unwrap();
        assert_eq!(worst.culprit.as_deref(), Some("busyLoop (/app/index.js:10:5)"), "the user's function, not the vdso on top");
        assert!(worst.stacktrace.as_deref().is_some_and(|s| s.starts_with("__vdso_gettimeofday")), "the native top stays in the stack");
        let split = worst.split.as_ref().unwrap();
        assert_eq!((split.on_cpu_ms, split.off_cpu_ms, split.runqueue_ms, split.throttled_ms), (120.5, 20.75, 9.0, Some(4.5)));
        let l = &r.total.event_loop;
        assert_eq!((l.on_cpu.max_ms, l.on_cpu.total_ms), (120.5, 130.5));
        assert_eq!((l.off_cpu.max_ms, l.off_cpu.total_ms), (45.0, 65.75));
        assert_eq!((l.runqueue.max_ms, l.throttled.total_ms), (9.0, 4.5), "throttled: of the process with a quota only");
        assert_eq!(r.processes[1].sections.event_loop.off_cpu.max_ms, 45.0, "per process");
        assert_eq!(worst.at_ms, 20.0);
        let p = &r.processes;
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].sections.event_loop.iterations, 47, "1+40 and 1+5");
        assert_eq!(p[1].command, "node child.js");
        assert_eq!(p[1].sections.event_loop.iterations, 13, "its blocked one and the fast ones from its exit record");
        assert_eq!(p[1].sections.event_loop.blocked.count, 1);
    }

    /// A span is what its family says, whatever its name looks like.
    #[test]
    fn spans_count_by_family_not_by_name() {
        let attrs = || vec![KeyValue::new(keys::FILE_PATH, "/a".to_string()), KeyValue::new(keys::THREAD_ID, 100i64)];
        // Named like a family's span, of no family: not counted.
        for name in ["fs.stat", DNS, ITERATION] {
            assert_eq!(classify(100, &span(Family::Other, name, 1.0, 2.0, attrs(), None)), None, "{name}");
            assert_eq!(classify(100, &span(Family::Http, name, 1.0, 2.0, attrs(), None)), None, "{name}");
        }
        // Of the fs family under any name: counted under the family's op.
        for name in ["GET", "fs.read", DNS, "stat"] {
            let (item, ms, failed) = classify(100, &span(Family::Fs("stat"), name, 1.0, 2.0, attrs(), Some("ENOENT"))).unwrap();
            assert_eq!(item, Item::Fs { op: "stat".into(), path: Some("/a".into()), sync_on_loop: false, loop_wait_ms: None }, "{name}");
            assert_eq!((ms, failed), (2.0, true));
        }
        let dns = classify(100, &span(Family::Dns, "fs.open", 1.0, 2.0, vec![KeyValue::new(keys::DNS_NAME, "h".to_string())], None));
        assert_eq!(dns.map(|d| d.0), Some(Item::Dns { name: "h".into() }));
        let it = classify(100, &span(Family::Iteration, "fs.open", 1.0, 2.0, attrs(), None));
        assert_eq!(it.map(|i| i.0), Some(Item::Iteration { tid: 100, stack: None, blocked_by: None, split: None, gc_ms: None }));
        // The report agrees: one fs op, under the family's name.
        let mut a = Aggregate::default();
        a.add(100, &span(Family::Other, "fs.stat", 1.0, 2.0, attrs(), None), t0());
        a.add(100, &span(Family::Fs("open"), "fs.stat", 1.0, 2.0, attrs(), None), t0());
        let facts = RunFacts {
            command: vec![],
            exit_code: 0,
            wall_ms: 0.0,
            loop_threshold_ms: 10.0,
            loop_iterations: 0,
            commands: Default::default(),
            unseen: vec![],
            processes_traced: 0,
        };
        let fs = a.report(&facts).total.fs;
        assert_eq!(fs.count, 1);
        assert_eq!(fs.by_op.keys().collect::<Vec<_>>(), ["open"]);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let d: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(stats(&d), (50.0, 99.0, 100.0, 5050.0));
        assert_eq!(stats(&[7.0]), (7.0, 7.0, 7.0, 7.0));
        assert_eq!(stats(&[]), (0.0, 0.0, 0.0, 0.0));
        assert_eq!(histogram(&[0.005, 0.01, 5000.0]), {
            let mut h = vec![0; 17];
            h[0] = 2;
            h[16] = 1;
            h
        });
    }

    /// Without the span's pick (no stacks, or a recording of an older
    /// version): the stack's top frame.
    #[test]
    fn culprit_is_the_top_frame() {
        assert_eq!(culprit("Error\n  at f (/a.js:1:2)\n  at g").as_deref(), Some("f (/a.js:1:2)"));
        assert_eq!(culprit("busy (/x.js:3)\nmain").as_deref(), Some("busy (/x.js:3)"));
        assert_eq!(culprit("\n\n"), None);
        assert_eq!(culprit("open64 (libc.so.6)\n[unknown] (0x6f6d5f65646f6e2e)"), None, "a libc leaf over an address");
        assert_eq!(culprit("open64 (libc.so.6)\nuv_fs_open (node)\n[truncated]").as_deref(), Some("uv_fs_open (node)"));
        assert_eq!(culprit("Scavenge (libnode.so.109)").as_deref(), Some("Scavenge (libnode.so.109)"));
    }

    /// With the threadpool split, a callback that waited for a busy loop is
    /// not the disk's time: the paths are ranked by their own time, the wait
    /// apart, and the op's latencies are its own time; without the split
    /// the wait is unknown (null), not 0.
    #[test]
    fn a_callbacks_wait_for_the_loop_is_not_the_operations_own_time() {
        let t = t0();
        let mut a = Aggregate::default();
        // The log read: 0.09 ms of its own, then 600 ms waiting for a blocked loop.
        let mut waited = fs("fs.read", 10.0, 600.09, 5, false, "/home/u/.npm/_logs", None);
        waited.attributes.push(KeyValue::new(keys::CALLBACK_WAIT, 600.0));
        // A read of 5 ms of its own that waited 1 ms.
        let mut slow = fs("fs.read", 20.0, 6.0, 5, false, "/data/big", None);
        slow.attributes.push(KeyValue::new(keys::CALLBACK_WAIT, 1.0));
        a.add(100, &waited, t);
        a.add(100, &slow, t);
        let r = a.report(&RunFacts::default());
        let paths: Vec<(&str, f64, Option<f64>, f64)> =
            r.total.fs.top_paths.iter().map(|p| (p.path.as_str(), p.own_ms, p.loop_wait_ms, p.total_ms)).collect();
        assert_eq!(paths, [("/data/big", 5.0, Some(1.0), 6.0), ("/home/u/.npm/_logs", 0.09, Some(600.0), 600.09)]);
        let read = &r.total.fs.by_op["read"];
        assert_eq!((read.max_ms, read.loop_wait_ms), (5.0, Some(601.0)));
        // No split: the total, and the wait unknown.
        let mut b = Aggregate::default();
        b.add(100, &fs("fs.read", 10.0, 600.09, 5, false, "/home/u/.npm/_logs", None), t);
        let r = b.report(&RunFacts::default());
        assert_eq!((r.total.fs.top_paths[0].own_ms, r.total.fs.top_paths[0].loop_wait_ms), (600.09, None));
        assert_eq!(r.total.fs.by_op["read"].loop_wait_ms, None);
    }
}
