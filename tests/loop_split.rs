//! Why a loop iteration was slow: the split of its busy time into on-CPU,
//! off-CPU (sleeping or blocked) and run queue (runnable, waiting for a
//! CPU), and its cgroup's CFS throttling, on real node processes under
//! uvspan (tests/fixtures/loop_split.js, one slow iteration each):
//! - busy JS on the loop thread: mostly on a CPU;
//! - a readSync on a FIFO that another process writes later: mostly off-CPU;
//! - busy JS pinned to one CPU with a busy hog pinned there too: a good
//!   part waiting for the CPU;
//! - busy JS in a cgroup with a small CPU quota: throttled;
//! - busy JS whose thread moves to another CPU: still adds up.
//!
//! Each checks the parts add up to the busy time. Nothing here bounds a
//! duration: the checks are ratios of the split, which is the feature.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use common::collector::{metric_values, Collector, Listen};
use common::*;

/// How far on + off + run queue may be from the busy time (a share of it).
const SUM_SLACK: f64 = 0.03;

/// One test at a time: the hog of one would be the run queue of another.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The command `cmd` under uvspan (metrics every 500 ms): its output, the
/// slow iteration covering the fixture's `slow` marker, and what the
/// collector got.
fn slow_iteration(label: &str, cmd: &[&str]) -> (Output, Span, Collector) {
    let col = Collector::start(Listen::Plain);
    let ep = format!("http://127.0.0.1:{}", col.port());
    let mut args: Vec<&str> = vec!["--status-interval", "0", "--loop-threshold", "50ms", "--"];
    args.extend_from_slice(cmd);
    let mut c = uvspan_cmd(args);
    c.envs([("OTEL_EXPORTER_OTLP_ENDPOINT", ep.as_str()), ("OTEL_METRIC_EXPORT_INTERVAL", "500")]);
    let out = run(c);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let m = Markers::parse(&out.stdout);
    let (before, after) = (m.f64("slow", "before"), m.f64("slow", "after"));
    let spans = col.spans();
    let iters: Vec<&Span> = spans.iter().filter(|s| s.name == "uv.loop.iteration").collect();
    let it = iters
        .iter()
        .find(|s| s.start_ms() <= before + CLOCK_SLACK_MS && s.end_ms() >= after - CLOCK_SLACK_MS)
        .map(|s| (*s).clone())
        .unwrap_or_else(|| panic!("{label}: no uv.loop.iteration covers [{before:.3}, {after:.3}]:\n{}\n{}", dump(&iters), out.context()));
    (out, it, col)
}

/// The split of a span: (busy, on-CPU, off-CPU, run queue) ms, checked to
/// add up to the busy time.
fn split(it: &Span, label: &str) -> (f64, f64, f64, f64) {
    let get = |k: &str| it.double(k).unwrap_or_else(|| panic!("{label}: no {k}: {}", it.brief()));
    let (busy, on, off, rq) =
        (get("uvspan.loop.busy_ms"), get("uvspan.loop.on_cpu_ms"), get("uvspan.loop.off_cpu_ms"), get("uvspan.loop.runqueue_ms"));
    assert!(on >= 0.0 && off >= 0.0 && rq >= 0.0, "{label}: {}", it.brief());
    let sum = on + off + rq;
    assert!((sum - busy).abs() <= SUM_SLACK * busy, "{label}: on + off + run queue = {sum:.3} ms, busy {busy:.3} ms: {}", it.brief());
    eprintln!("{label}: busy {busy:.3} ms = on-CPU {on:.3} + off-CPU {off:.3} + run queue {rq:.3}");
    (busy, on, off, rq)
}

/// Busy JS: the loop thread runs, on a CPU nearly all of the time; the
/// loop's metrics carry the split too. The fixture runs with a real-time
/// priority (SCHED_FIFO): other work on a shared CI machine (two CPUs here)
/// would otherwise keep it waiting for a CPU, which the split rightly says
/// (a nice value does not help where the scheduler groups tasks by session).
#[test]
fn busy_js_is_on_cpu() {
    require_root();
    let _one = one_at_a_time();
    let script = fixture("loop_split.js");
    let (out, it, col) = slow_iteration("busy", &["chrt", "-f", "10", "node", &script, "busy"]);
    eprintln!("busy: {:?}", metric_values(&col, &["nodejs.eventloop.time", "uvspan.eventloop.time"]));
    let (busy, on, _, _) = split(&it, "busy");
    assert!(on >= 0.8 * busy, "busy JS: on-CPU {on:.3} of {busy:.3} ms: {}\n{}", it.brief(), out.context());
    // This process's root cgroup has no CFS quota: no throttling attribute.
    if cpu_quota_of_self().is_none() {
        assert_eq!(it.double("uvspan.loop.throttled_ms"), None, "{}", it.brief());
    }
    // uvspan.eventloop.time: the active time by state, within the active time.
    let v = metric_values(&col, &["nodejs.eventloop.time", "uvspan.eventloop.time"]);
    let part = |s: &str| v.get(&format!("uvspan.eventloop.time/{s}")).copied().unwrap_or_else(|| panic!("no {s} point: {v:?}"));
    let (on, off, rq) = (part("on_cpu"), part("off_cpu"), part("runqueue"));
    let active = v.get("nodejs.eventloop.time/active").copied().unwrap_or(0.0);
    let sum = on + off + rq;
    assert!(sum > 0.0 && sum <= active * (1.0 + SUM_SLACK), "split {sum} s of the active {active} s: {v:?}");
    assert!(on >= 0.5 * sum, "a run of busy JS is mostly on-CPU: {v:?}");
}

/// A sync read of a FIFO the loop thread waits on: off-CPU.
#[test]
fn a_blocking_read_is_off_cpu() {
    require_root();
    let _one = one_at_a_time();
    let dir = TempDir::new("loop-split-fifo");
    let fifo = dir.join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success(), "mkfifo {fifo}");
    let script = fixture("loop_split.js");
    let (out, it, _) = slow_iteration("fifo", &["node", &script, "fifo", &fifo]);
    assert_eq!(Markers::parse(&out.stdout).i64("slow", "read"), 1, "{}", out.context());
    let (busy, _, off, _) = split(&it, "fifo");
    assert!(off >= 0.6 * busy, "readSync on a FIFO: off-CPU {off:.3} of {busy:.3} ms: {}", it.brief());
}

/// A busy process pinned to one CPU, killed on drop.
struct Hog(Child);

impl Hog {
    fn on_cpu(cpu: &str) -> Hog {
        let child = Command::new("taskset")
            .args(["-c", cpu, "node", "-e", "for (;;) {}"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("taskset node (the hog)");
        Hog(child)
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Busy JS sharing its one CPU with a busy hog: runnable, waiting for the
/// CPU a good part of the time.
#[test]
fn sharing_a_cpu_with_a_hog_is_run_queue() {
    require_root();
    let _one = one_at_a_time();
    require_tool("taskset", "pins the fixture and the hog onto one CPU");
    let _hog = Hog::on_cpu("0");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let script = fixture("loop_split.js");
    let (_, it, _) = slow_iteration("shared CPU", &["taskset", "-c", "0", "node", &script, "busy"]);
    let (busy, _, _, rq) = split(&it, "shared CPU");
    assert!(rq >= 0.25 * busy, "busy JS beside a hog on its CPU: run queue {rq:.3} of {busy:.3} ms: {}", it.brief());
}

/// Busy JS whose loop thread moves to another CPU mid-iteration: the split
/// still adds up. Each CPU's task clock lags ktime by its own IRQ and steal
/// time (on a VM the CPUs differ by up to seconds), so the on-CPU time the
/// scheduler has not yet counted is caught up on the clock of the CPU the
/// thread ended on, not the one it woke on. Both ways, CPU 0 to 1 and 1 to
/// 0: which way a difference of clocks shows depends on the machine.
#[test]
fn a_loop_thread_moved_to_another_cpu_adds_up() {
    require_root();
    let _one = one_at_a_time();
    require_tool("taskset", "pins the fixture to one CPU and moves it to another");
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    assert!(cpus >= 2, "moving a thread between CPUs needs two; this machine has {cpus}");
    let script = fixture("loop_split.js");
    for (from, to) in [("0", "1"), ("1", "0")] {
        let label = format!("moved from CPU {from} to {to}");
        let (out, it, _) = slow_iteration(&label, &["taskset", "-c", from, "node", &script, "move", to]);
        let ended = Markers::parse(&out.stdout).i64("slow", "cpu");
        assert_eq!(ended.to_string(), to, "{label}: the loop thread ended on CPU {ended}: {}", out.context());
        let (busy, on, ..) = split(&it, &label);
        assert!(on >= 0.5 * busy, "{label}: on-CPU {on:.3} of {busy:.3} ms: {}", it.brief());
    }
}

/// A cgroup of the test's own with a CPU quota (cgroup v1 `cpu` controller,
/// else v2 `cpu.max`), removed on drop.
struct QuotaCgroup {
    dir: PathBuf,
}

impl QuotaCgroup {
    /// `quota_us` of CPU time per 100 ms period.
    fn create(quota_us: u64) -> QuotaCgroup {
        let (root, v1) = cpu_hierarchy();
        let dir = root.join(unique("uvspan-quota"));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", dir.display()));
        let g = QuotaCgroup { dir };
        if v1 {
            g.write("cpu.cfs_period_us", "100000");
            g.write("cpu.cfs_quota_us", &quota_us.to_string());
        } else {
            g.write("cpu.max", &format!("{quota_us} 100000"));
        }
        g
    }

    fn write(&self, file: &str, v: &str) {
        let p = self.dir.join(file);
        std::fs::write(&p, v).unwrap_or_else(|e| panic!("cannot write {v} to {}: {e}", p.display()));
    }

    fn procs(&self) -> String {
        self.dir.join("cgroup.procs").to_string_lossy().into_owned()
    }
}

impl Drop for QuotaCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// Where CPU quotas are set: a cgroup v1 hierarchy with the `cpu`
/// controller (true), else cgroup v2 with `cpu` enabled for children.
fn cpu_hierarchy() -> (PathBuf, bool) {
    let (root, v1) = hierarchy("cpu").expect("no cgroup v1 cpu hierarchy and no cgroup v2: cannot set a CPU quota");
    if v1 {
        return (root, true);
    }
    let controllers = std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
    if !controllers.split_whitespace().any(|c| c == "cpu") {
        std::fs::write(root.join("cgroup.subtree_control"), "+cpu").expect("enable the cpu controller for children (cgroup v2)");
    }
    (root, false)
}

/// This process's own CFS quota, if its cgroup (v1 cpu) has one.
fn cpu_quota_of_self() -> Option<i64> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cg.lines().find_map(|l| l.split_once(":cpu:").or_else(|| l.split_once(":cpu,cpuacct:")).map(|(_, p)| p.to_string()))?;
    let (root, v1) = cpu_hierarchy();
    if !v1 {
        return None;
    }
    let q: i64 = std::fs::read_to_string(root.join(path.trim_start_matches('/')).join("cpu.cfs_quota_us")).ok()?.trim().parse().ok()?;
    (q > 0).then_some(q)
}

/// Busy JS in a cgroup allowed 20 ms of CPU per 100 ms: the 150 ms
/// callback runs into the quota; the span says how long its cgroup was
/// throttled.
#[test]
fn a_cpu_quota_shows_as_throttled_time() {
    require_root();
    let _one = one_at_a_time();
    let g = QuotaCgroup::create(20_000);
    let script = fixture("loop_split.js");
    // The command enters the cgroup, then becomes node.
    let inner = format!("echo $$ > '{}' && exec node '{script}' busy", g.procs());
    let (_, it, _) = slow_iteration("throttled", &["sh", "-c", &inner]);
    let (busy, ..) = split(&it, "throttled");
    let throttled = it.double("uvspan.loop.throttled_ms").unwrap_or_else(|| panic!("no throttled_ms: {}", it.brief()));
    eprintln!("throttled: {throttled:.3} ms");
    assert!(throttled > 0.0, "a 20% quota, {busy:.3} ms busy, never throttled: {}", it.brief());
}
