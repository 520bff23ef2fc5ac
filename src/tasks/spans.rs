//! The spans of work no request caused: a task's root span, a process's
//! root span and its start-up span. Pure.

use std::borrow::Cow;

use opentelemetry::trace::{SpanId, SpanKind, Status, TraceState};

use super::tracker::{Life, Startup, Tally, Task};
use crate::events::spans::{keys, span_under, Family, KeyValue, Parent, Span, SpanContextSource, Value};

/// Attribute keys of these spans (no semantic convention covers a task).
pub mod task_keys {
    pub const KIND: &str = "uvspan.task.kind";
    pub const OPERATIONS: &str = "uvspan.task.operations";
    pub const TASKS: &str = "uvspan.process.tasks";
    pub const SIGNAL: &str = "uvspan.process.signal";
    pub const SYNC_FS: &str = "uvspan.sync_fs.count";
    pub const SYNC_FS_MS: &str = "uvspan.sync_fs.ms";
    pub const SYNC_FS_ERRORS: &str = "uvspan.sync_fs.errors";
    pub const SYNC_FS_SLOWEST: &str = "uvspan.sync_fs.slowest";
    pub const MODULE_LOAD: &str = "uvspan.module_load.count";
    pub const MODULE_LOAD_MS: &str = "uvspan.module_load.ms";
    pub const MODULE_LOAD_ERRORS: &str = "uvspan.module_load.errors";
    pub const MODULE_LOAD_SLOWEST: &str = "uvspan.module_load.slowest";
}

/// A tally's attributes (count, ms, errors, slowest), none when it is empty.
fn tally(attrs: &mut Vec<KeyValue>, t: &Tally, [count, ms, errors, slowest]: [&'static str; 4]) {
    if t.count == 0 {
        return;
    }
    let names = t.slowest.iter().map(|(ns, what)| format!("{:.3}ms {what}", *ns as f64 / 1e6)).collect();
    attrs.extend([
        KeyValue::new(count, i64::from(t.count)),
        KeyValue::new(ms, t.ns as f64 / 1e6),
        KeyValue::new(errors, i64::from(t.errors)),
        KeyValue::new(slowest, Value::Strings(names)),
    ]);
}

const MODULE_KEYS: [&str; 4] =
    [task_keys::MODULE_LOAD, task_keys::MODULE_LOAD_MS, task_keys::MODULE_LOAD_ERRORS, task_keys::MODULE_LOAD_SLOWEST];
const SYNC_FS_KEYS: [&str; 4] = [task_keys::SYNC_FS, task_keys::SYNC_FS_MS, task_keys::SYNC_FS_ERRORS, task_keys::SYNC_FS_SLOWEST];

/// An INTERNAL span of `family` under `parent` (times in kernel ns).
fn span(
    src: &SpanContextSource<'_>,
    parent: &Parent,
    span_id: SpanId,
    name: Cow<'static, str>,
    family: Family,
    times: (u64, u64),
    attributes: Vec<KeyValue>,
) -> Span {
    span_under(src, parent, span_id, name, (SpanKind::Internal, family), times, attributes)
}

/// A task's root span (under its process's with `--trace-per process`),
/// `name`d: from its callback's start to its last operation's end, with
/// its module loading counted. A process's module loading outside tasks
/// with a trace per task (`startup`, `main`) has no task kind.
pub(super) fn task_span(t: &Task, name: &'static str, parent: &Parent, src: &SpanContextSource<'_>) -> Span {
    let mut attrs = Vec::with_capacity(7);
    if !t.outside {
        attrs.push(KeyValue::new(task_keys::KIND, t.kind.name()));
    }
    attrs.extend([KeyValue::new(keys::THREAD_ID, i64::from(t.tid)), KeyValue::new(task_keys::OPERATIONS, i64::from(t.ops))]);
    tally(&mut attrs, &t.modules, MODULE_KEYS);
    span(src, parent, t.span_id, name.into(), Family::Task, (t.start_ns, t.last_ns), attrs)
}

/// A process's root span: exec (or fork) to exit, its command line and how
/// it ended (`code`: the kernel's exit code; None: still running).
pub(super) fn process_span(l: &Life, end_ns: u64, code: Option<i32>, src: &SpanContextSource<'_>) -> Span {
    let root = Parent { trace_id: l.trace_id, span_id: SpanId::INVALID, remote: false, state: TraceState::NONE };
    let exe = l.argv.first().map(|a| a.rsplit('/').next().unwrap_or(a).to_string()).filter(|e| !e.is_empty());
    let mut attrs = vec![KeyValue::new("process.command_line", l.argv.join(" ")), KeyValue::new(task_keys::TASKS, i64::from(l.tasks))];
    if let Some(e) = &exe {
        attrs.push(KeyValue::new("process.executable.name", e.clone()));
    }
    let name: Cow<'static, str> = exe.map_or(Cow::Borrowed("process"), Cow::Owned);
    let mut s = span(src, &root, l.span_id, name, Family::Process, (l.start_ns, end_ns), attrs);
    match code {
        // Killed by a signal: the low 7 bits.
        Some(c) if c & 0x7f != 0 => {
            s.attributes.push(KeyValue::new(task_keys::SIGNAL, i64::from(c & 0x7f)));
            s.status = Status::error(format!("killed by signal {}", c & 0x7f));
        }
        Some(c) => {
            let status = (c >> 8) & 0xff;
            s.attributes.push(KeyValue::new("process.exit.code", i64::from(status)));
            if status != 0 {
                s.status = Status::error(format!("exit code {status}"));
            }
        }
        None => {}
    }
    s
}

/// A process's `startup` span (its main module's run, from the process's
/// start until the loop first ran: module loading, top-level code) or its
/// `main` span (the callbacks and promise chains that run started), over
/// their operations, with module loading (and, when summarised, the other
/// sync fs calls) counted.
pub(super) fn startup_span(l: &Life, s: &Startup, name: &'static str, src: &SpanContextSource<'_>) -> Span {
    let parent = Parent { trace_id: l.trace_id, span_id: l.span_id, remote: false, state: TraceState::NONE };
    let mut attrs = vec![KeyValue::new(task_keys::OPERATIONS, i64::from(s.ops))];
    tally(&mut attrs, &s.modules, MODULE_KEYS);
    tally(&mut attrs, &s.sync_fs, SYNC_FS_KEYS);
    span(src, &parent, s.span_id, name.into(), Family::Task, (s.start_ns, s.end_ns), attrs)
}
