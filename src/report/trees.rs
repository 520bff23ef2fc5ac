//! Each process's trace as a tree for the report: its root span (command
//! line, duration, exit code), its start-up, its tasks and slow loop
//! iterations, the requests it served, and under each its operations. Pure.
//!
//! Spans come in batches, children often before their parent (a process's
//! held spans go out every 5 s, its root span at its exit), so the tree is
//! made when the report is written ([`Trees::trace`]). Memory is bounded by
//! what the tree shows, not by the run's spans: per process the
//! [`TOP_TASKS`] longest tasks, [`TOP_ITERATIONS`] longest slow iterations
//! and [`TOP_REQUESTS`] longest requests, per node its [`TOP_OPS`] longest
//! operations, and counts of everything else. A node that falls out of its
//! top list takes its operations with it; its span id is remembered (8
//! bytes) so that its later operations are not kept either.

use std::collections::BTreeMap;
use std::time::SystemTime;

use opentelemetry::trace::{SpanId, SpanKind, Status};
use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;

use super::aggregate::{culprit, ms_since, round, STACKTRACE};
use crate::events::spans::{keys, Family, Span, Value};
use crate::tasks::task_keys;

/// Tasks, slow iterations and requests listed per process (the longest).
pub const TOP_TASKS: usize = 20;
pub const TOP_ITERATIONS: usize = 20;
pub const TOP_REQUESTS: usize = 20;
/// Operations listed per node (the longest).
pub const TOP_OPS: usize = 50;

/// A process's trace (the JSON contract, under each process's `trace`).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ProcessTrace {
    /// Its root span; absent when the process's trace did not end (or with
    /// `--trace-per task`, where tasks are roots).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root: Option<Root>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub startup: Option<Node>,
    /// The longest tasks and slow iterations, in the order they started.
    pub children: Vec<Node>,
    /// Tasks and slow iterations seen, and how many of them are not listed.
    pub tasks: u64,
    pub more_tasks: u64,
    pub iterations: u64,
    pub more_iterations: u64,
    /// The longest requests served (SERVER spans), in the order they started.
    pub requests: Vec<Node>,
    pub requests_total: u64,
    pub more_requests: u64,
}

/// A process's root span.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Root {
    pub name: String,
    pub command_line: String,
    /// Milliseconds since the run started.
    pub start_ms: f64,
    pub duration_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i64>,
    /// The span's ERROR status ("exit code 3").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Operations directly under it (in no start-up or task).
    #[serde(flatten)]
    pub work: Work,
}

/// A row under a process: its start-up, a task, a slow iteration, a request.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Node {
    /// `startup`, the task's kind (`timers`, `immediate`, `io`), `iteration`
    /// or `request`.
    pub kind: String,
    pub name: String,
    pub start_ms: f64,
    pub duration_ms: f64,
    /// What else identifies it: a slow iteration's top stack frame, a
    /// request's response status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(flatten)]
    pub work: Work,
}

/// The operations under a span: how many, and the longest of them.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Work {
    pub operations: u64,
    pub errors: u64,
    /// The longest [`TOP_OPS`], in the order they started.
    pub ops: Vec<Op>,
    pub more_ops: u64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Op {
    pub name: String,
    pub start_ms: f64,
    pub duration_ms: f64,
    /// The path, host name or address it was about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `error.type` (set without ERROR status for existence checks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether its status is ERROR.
    pub failed: bool,
}

/// The `cap` largest items by key (ties: the earlier stays).
#[derive(Debug)]
struct TopN<T> {
    cap: usize,
    seq: u64,
    items: Vec<(u64, u64, T)>,
}

impl<T> TopN<T> {
    fn new(cap: usize) -> TopN<T> {
        TopN { cap, seq: 0, items: Vec::new() }
    }

    /// Keeps `item` if it is among the largest; gives back what is not kept
    /// (`item`, or the one it pushed out).
    fn push(&mut self, key: u64, item: T) -> Option<T> {
        self.seq += 1;
        if self.items.len() < self.cap {
            self.items.push((key, self.seq, item));
            return None;
        }
        let smallest = self.items.iter().enumerate().min_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.1 .1.cmp(&a.1 .1))).map(|(i, _)| i);
        match smallest {
            Some(i) if key > self.items[i].0 => Some(std::mem::replace(&mut self.items[i], (key, self.seq, item)).2),
            _ => Some(item),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter().map(|i| &i.2)
    }
}

/// A node as kept until the report is written.
#[derive(Clone, Debug)]
struct Kept {
    span_id: SpanId,
    kind: String,
    name: String,
    start_ns: u64,
    end_ns: u64,
    detail: Option<String>,
    error: Option<String>,
}

#[derive(Clone, Debug)]
struct RootKept {
    node: Kept,
    command_line: String,
    exit_code: Option<i64>,
    signal: Option<i64>,
}

/// The operations under one span.
#[derive(Debug)]
struct Group {
    count: u64,
    errors: u64,
    top: TopN<(u64, Op)>,
}

#[derive(Debug)]
struct Proc {
    root: Option<RootKept>,
    startup: Option<Kept>,
    tasks: TopN<Kept>,
    iterations: TopN<Kept>,
    requests: TopN<Kept>,
    counts: [u64; 3],
}

impl Default for Proc {
    fn default() -> Proc {
        Proc {
            root: None,
            startup: None,
            tasks: TopN::new(TOP_TASKS),
            iterations: TopN::new(TOP_ITERATIONS),
            requests: TopN::new(TOP_REQUESTS),
            counts: [0; 3],
        }
    }
}

/// The fold: spans in (any order), each process's tree out.
#[derive(Debug, Default)]
pub struct Trees {
    procs: BTreeMap<u32, Proc>,
    /// Operations per parent span id.
    groups: FxHashMap<SpanId, Group>,
    /// Nodes not listed: their operations are not kept.
    dropped: FxHashSet<SpanId>,
}

fn text(s: &Span, key: &str) -> Option<String> {
    s.attr(key).map(|v| v.as_str().into_owned())
}

fn int(s: &Span, key: &str) -> Option<i64> {
    match s.attr(key) {
        Some(Value::I64(v)) => Some(*v),
        _ => None,
    }
}

fn status_error(s: &Span) -> Option<String> {
    match &s.status {
        Status::Error { description } => Some(description.to_string()),
        _ => None,
    }
}

fn kept(s: &Span, kind: &str, name: String, detail: Option<String>) -> Kept {
    Kept {
        span_id: s.span_id(),
        kind: kind.to_string(),
        name,
        start_ns: s.start_ns,
        end_ns: s.end_ns.max(s.start_ns),
        detail,
        error: status_error(s),
    }
}

/// An operation: what it was about.
fn op(s: &Span, start: SystemTime) -> Op {
    let target = match s.family {
        Family::Fs(_) => text(s, keys::FILE_PATH),
        Family::Dns => text(s, keys::DNS_NAME),
        Family::Db => text(s, "db.query.text").or_else(|| text(s, "server.address")),
        Family::Http => match (text(s, "server.address"), text(s, "url.path")) {
            (Some(h), Some(p)) => Some(format!("{h}{p}")),
            (h, p) => h.or(p),
        },
        _ => None,
    };
    Op {
        name: s.name.to_string(),
        start_ms: round(ms_since(s.start_ns, start)),
        duration_ms: round(s.ms()),
        target,
        error: text(s, keys::ERROR_TYPE).or_else(|| status_error(s)),
        failed: matches!(s.status, Status::Error { .. }),
    }
}

impl Trees {
    /// One span of process `pid`; `start` is when the run started.
    pub fn add(&mut self, pid: u32, s: &Span, start: SystemTime) {
        let span_ns = s.end_ns.saturating_sub(s.start_ns);
        match (s.family, &s.span_kind) {
            (Family::Process, _) => {
                let node = kept(s, "process", s.name.to_string(), None);
                let root = RootKept {
                    node,
                    command_line: text(s, "process.command_line").unwrap_or_default(),
                    exit_code: int(s, "process.exit.code"),
                    signal: int(s, task_keys::SIGNAL),
                };
                self.procs.entry(pid).or_default().root = Some(root);
            }
            (Family::Task, _) => match text(s, task_keys::KIND) {
                // What the start-up's run started: a row beside the tasks.
                None if s.name == "main" => self.node(pid, 0, span_ns, kept(s, "main", s.name.to_string(), None)),
                None => self.procs.entry(pid).or_default().startup = Some(kept(s, "startup", s.name.to_string(), None)),
                Some(kind) => self.node(pid, 0, span_ns, kept(s, &kind, s.name.to_string(), None)),
            },
            (Family::Iteration, _) => {
                let detail = text(s, STACKTRACE).as_deref().and_then(culprit);
                self.node(pid, 1, span_ns, kept(s, "iteration", s.name.to_string(), detail));
            }
            (Family::Http, SpanKind::Server) => {
                let name = match text(s, "url.path") {
                    Some(p) => format!("{} {p}", s.name),
                    None => s.name.to_string(),
                };
                let detail = int(s, "http.response.status_code").map(|c| c.to_string());
                self.node(pid, 2, span_ns, kept(s, "request", name, detail));
            }
            (Family::Fs(_) | Family::Dns | Family::Phase | Family::Http | Family::Db, _) => self.op(pid, s, span_ns, start),
            (Family::Other, _) => {}
        }
    }

    /// A task (0), slow iteration (1) or request (2) of `pid`.
    fn node(&mut self, pid: u32, which: usize, span_ns: u64, k: Kept) {
        let p = self.procs.entry(pid).or_default();
        p.counts[which] += 1;
        let list = match which {
            0 => &mut p.tasks,
            1 => &mut p.iterations,
            _ => &mut p.requests,
        };
        if let Some(out) = list.push(span_ns, k) {
            self.groups.remove(&out.span_id);
            self.dropped.insert(out.span_id);
        }
    }

    fn op(&mut self, pid: u32, s: &Span, span_ns: u64, start: SystemTime) {
        let parent = s.parent_span_id;
        if parent == SpanId::INVALID || self.dropped.contains(&parent) {
            return;
        }
        self.procs.entry(pid).or_default();
        let g = self.groups.entry(parent).or_insert_with(|| Group { count: 0, errors: 0, top: TopN::new(TOP_OPS) });
        g.count += 1;
        g.errors += u64::from(matches!(s.status, Status::Error { .. }));
        if g.top.items.len() < TOP_OPS || g.top.items.iter().any(|i| i.0 < span_ns) {
            g.top.push(span_ns, (s.start_ns, op(s, start)));
        }
    }

    /// The operations under `id`.
    fn work(&self, id: SpanId) -> Work {
        let Some(g) = self.groups.get(&id) else { return Work::default() };
        let mut ops: Vec<&(u64, Op)> = g.top.iter().collect();
        ops.sort_by_key(|o| o.0);
        let ops: Vec<Op> = ops.into_iter().map(|o| o.1.clone()).collect();
        Work { operations: g.count, errors: g.errors, more_ops: g.count.saturating_sub(ops.len() as u64), ops }
    }

    fn node_out(&self, k: &Kept, start: SystemTime) -> Node {
        Node {
            kind: k.kind.clone(),
            name: k.name.clone(),
            start_ms: round(ms_since(k.start_ns, start)),
            duration_ms: round((k.end_ns - k.start_ns) as f64 / 1e6),
            detail: k.detail.clone(),
            error: k.error.clone(),
            work: self.work(k.span_id),
        }
    }

    /// Process `pid`'s tree (None: nothing of it was a tree's).
    pub fn trace(&self, pid: u32, start: SystemTime) -> Option<ProcessTrace> {
        let p = self.procs.get(&pid)?;
        let sorted = |l: &TopN<Kept>| {
            let mut v: Vec<&Kept> = l.iter().collect();
            v.sort_by_key(|k| k.start_ns);
            v.into_iter().map(|k| self.node_out(k, start)).collect::<Vec<Node>>()
        };
        let mut children: Vec<(u64, Node)> =
            p.tasks.iter().chain(p.iterations.iter()).map(|k| (k.start_ns, self.node_out(k, start))).collect();
        children.sort_by_key(|c| c.0);
        let root = p.root.as_ref().map(|r| {
            let n = self.node_out(&r.node, start);
            Root {
                name: n.name,
                command_line: r.command_line.clone(),
                start_ms: n.start_ms,
                duration_ms: n.duration_ms,
                exit_code: r.exit_code,
                signal: r.signal,
                error: n.error,
                work: n.work,
            }
        });
        let listed = |l: &TopN<Kept>| l.items.len() as u64;
        let t = ProcessTrace {
            root,
            startup: p.startup.as_ref().map(|k| self.node_out(k, start)),
            children: children.into_iter().map(|c| c.1).collect(),
            tasks: p.counts[0],
            more_tasks: p.counts[0] - listed(&p.tasks),
            iterations: p.counts[1],
            more_iterations: p.counts[1] - listed(&p.iterations),
            requests: sorted(&p.requests),
            requests_total: p.counts[2],
            more_requests: p.counts[2] - listed(&p.requests),
        };
        let empty = t.root.is_none() && t.startup.is_none() && t.children.is_empty() && t.requests.is_empty();
        (!empty).then_some(t)
    }
}

#[cfg(test)]
#[path = "trees_tests.rs"]
mod tests;
