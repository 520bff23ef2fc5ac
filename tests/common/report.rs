//! What uvspan reports on stderr: the final summary, the periodic status
//! lines, the "tracing process" lines and the kernel fallback notice.

use super::runner::{Running, RUN_TIMEOUT};

/// The start of the line uvspan says once at start on kernels that refuse
/// fentry programs (it then reads the epoll waits from the syscall
/// tracepoints); tests/e2e.rs checks it matches the kernel, other tests that
/// check stderr line by line leave it out.
pub const KERNEL_FALLBACK_NOTICE: &str = "uvspan: this kernel refuses fentry programs";

/// The number just before `what` in `line`.
fn number_before(line: &str, what: &str) -> u64 {
    let at = line.find(what).unwrap_or_else(|| panic!("{what:?} missing from uvspan's line: {line}"));
    let digits: String = line[..at].chars().rev().take_while(|c| c.is_ascii_digit()).collect();
    digits.chars().rev().collect::<String>().parse().unwrap_or_else(|_| panic!("no number before {what:?}: {line}"))
}

// ---------------------------------------------------------------------------
// The final summary
// ---------------------------------------------------------------------------

/// The numbers of uvspan's final "uvspan: N process(es), M Node.js; spans: ..." line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub exported: u64,
    pub dropped: u64,
    pub failed: u64,
    pub unflushed: u64,
    pub lost: u64,
    pub undecodable: u64,
}

pub fn summary(stderr: &str) -> Summary {
    let line = summary_line(stderr);
    let num_before = |what: &str| number_before(line, what);
    Summary {
        exported: num_before(" exported"),
        dropped: num_before(" dropped"),
        failed: num_before(" failed to export"),
        unflushed: num_before(" not flushed"),
        lost: num_before(" records lost"),
        undecodable: num_before(" undecodable"),
    }
}

/// Whether `l` is uvspan's final "uvspan: N process(es), M Node.js;
/// spans: ..." line.
pub fn is_summary_line(l: &str) -> bool {
    l.starts_with("uvspan: ") && l.contains(" process(es), ") && l.contains(" Node.js; spans: ")
}

/// The final "uvspan: N process(es), M Node.js; spans: ..." line of `stderr`.
fn summary_line(stderr: &str) -> &str {
    stderr.lines().find(|l| is_summary_line(l)).unwrap_or_else(|| panic!("no summary line in uvspan's stderr:\n{stderr}"))
}

/// A number of the final summary line that [`summary`] does not parse:
/// `" process(es)"`, `" Node.js"`, `" unfinished at process exit"`, `" loop iterations"`.
pub fn summary_number(stderr: &str, what: &str) -> u64 {
    number_before(summary_line(stderr), what)
}

/// The root spans of background tasks uvspan made (its summary's
/// "N background tasks"; 0 when it made none), for tests that count spans
/// per operation.
pub fn task_spans(stderr: &str) -> u64 {
    let line = summary_line(stderr);
    if !line.contains(" background tasks") {
        return 0;
    }
    number_before(line, " background tasks")
}

// ---------------------------------------------------------------------------
// Status lines
// ---------------------------------------------------------------------------

/// One periodic "uvspan: status: ..." line (--status-interval).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StatusLine {
    pub processes: u64,
    pub exported: u64,
    pub dropped: u64,
    pub failed: u64,
    pub export_errors: u64,
    pub lost: u64,
    pub unfinished: u64,
}

/// Every status line printed so far, in order.
pub fn status_lines(stderr: &str) -> Vec<StatusLine> {
    stderr
        .lines()
        .filter(|l| l.starts_with("uvspan: status: "))
        .map(|l| StatusLine {
            processes: number_before(l, " processes traced"),
            exported: number_before(l, " exported"),
            dropped: number_before(l, " dropped"),
            failed: number_before(l, " failed to export"),
            export_errors: number_before(l, " export errors"),
            lost: number_before(l, " records lost"),
            unfinished: number_before(l, " unfinished at process exit"),
        })
        .collect()
}

// ---------------------------------------------------------------------------
// "tracing process" lines
// ---------------------------------------------------------------------------

/// The start of the line uvspan says when it starts tracing process `pid`.
pub fn tracing_line(pid: u32) -> String {
    format!("uvspan: tracing process {pid} ")
}

/// Waits until uvspan says it traces `pid` (a stderr line starting with
/// [`tracing_line`]); fails on timeout or if uvspan exits first.
pub fn wait_traced(uv: &mut Running, pid: u32) {
    let l = tracing_line(pid);
    uv.wait_stderr(RUN_TIMEOUT, &format!("'tracing process {pid}'"), |e| e.lines().any(|x| x.starts_with(&l)));
}
