//! `uvspan run`, the CI performance gate, end to end: the real uvspan traces
//! tests/fixtures/ci_job.js (known work in a parent and a forked child,
//! started through `sh -c`), and the tests check the report's numbers, the
//! exit status (budgets held, broken, the command's own failure, a bad
//! expression), the GitHub step summary, the JUnit XML and the HTML page in
//! a real headless browser (Debian's chromium, installed by scripts/setup.sh).
//!
//! Timing: only lower bounds (the busy loop lasts at least 150 ms), never an
//! upper bound on how long something took on this machine.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

/// What the fixture does (tests/fixtures/ci_job.js).
const SYNC_CALLS: u64 = 25;
const CHILD_CALLS: u64 = 7;
const ASYNC_READS: u64 = 3;
const BUSY_MS: f64 = 150.0;

struct Run {
    out: Output,
    dir: TempDir,
    markers: Markers,
}

impl Run {
    fn json(&self) -> Value {
        let p = self.dir.join("report.json");
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("no report at {p}: {e}\n{}", self.out.context()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("report is not JSON: {e}\n{text}"))
    }
    fn file(&self, name: &str) -> String {
        let p = self.dir.join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}\n{}", self.out.context()))
    }
}

/// `uvspan run --report --junit --html [extra] -- sh -c "node ci_job.js CODE"`,
/// with $GITHUB_STEP_SUMMARY set.
fn run(tag: &str, extra: &[&str], code: i32) -> Run {
    require_root();
    let dir = TempDir::new(tag);
    let summary = dir.join("step-summary.md");
    std::fs::write(&summary, "# earlier step\n").unwrap();
    let script = format!("node {} {code}", fixture("ci_job.js"));
    let mut args: Vec<String> =
        ["run", "--report", &dir.join("report.json"), "--junit", &dir.join("junit.xml"), "--html", &dir.join("report.html")]
            .iter()
            .map(|s| s.to_string())
            .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(["--", "sh", "-c", &script].iter().map(|s| s.to_string()));
    let mut cmd = uvspan_cmd(&args);
    cmd.env("GITHUB_STEP_SUMMARY", &summary);
    let out = Running::spawn(cmd).finish(RUN_TIMEOUT);
    let markers = Markers::parse(&out.stdout);
    Run { out, dir, markers }
}

fn process(report: &Value, pid: i64) -> &Value {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_i64() == Some(pid))
        .unwrap_or_else(|| panic!("process {pid} is not in the report: {report:#}"))
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// JUnit XML, parsed: (tests, failures, [(case name, failure message)]).
fn junit(xml: &str) -> (u64, u64, Vec<(String, Option<String>)>) {
    let doc = roxmltree::Document::parse(xml).unwrap_or_else(|e| panic!("JUnit is not XML: {e}\n{xml}"));
    let suite = doc.descendants().find(|n| n.has_tag_name("testsuite")).expect("a testsuite");
    let num = |a: &str| suite.attribute(a).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("testsuite {a}: {xml}"));
    let cases = suite
        .children()
        .filter(|n| n.has_tag_name("testcase"))
        .map(|c| {
            let fail = c.children().find(|n| n.has_tag_name("failure")).map(|f| f.attribute("message").unwrap_or_default().to_string());
            (c.attribute("name").unwrap_or_default().to_string(), fail)
        })
        .collect();
    (num("tests"), num("failures"), cases)
}

#[test]
fn report_numbers_summary_junit_and_budgets_held() {
    let held = ["loop.blocked.max_ms>=100", "fs.by_op.access.count==32", "dns.errors==1", "fs.by_op.rename.count==0"];
    let mut extra = vec![];
    for b in &held {
        extra.extend(["--budget", b]);
    }
    let r = run("run-held", &extra, 0);
    assert_eq!(r.out.code(), Some(0), "{}", r.out.context());
    let parent = r.markers.i64("parent", "pid");
    let child = r.markers.i64("child", "pid");
    assert_ne!(r.markers.str("done", "dns_error"), "resolved", "the lookup failed as intended");
    let j = r.json();

    // The run.
    assert_eq!(j["command"], serde_json::json!(["sh", "-c", format!("node {} 0", fixture("ci_job.js"))]));
    assert_eq!(j["exit_code"], 0);
    assert!(f(&j["wall_ms"]) >= BUSY_MS, "the run includes the busy loop: {}", j["wall_ms"]);
    assert_eq!(f(&j["loop_threshold_ms"]), 10.0);

    // Per process: the parent and the child it forked (the shell has no loop
    // and no fs work of libuv's: it is not listed).
    let p = process(&j, parent);
    let c = process(&j, child);
    assert!(p["command"].as_str().unwrap().contains("ci_job.js"), "{p}");
    assert!(c["command"].as_str().unwrap().ends_with("ci_job.js child"), "{c}");
    assert_eq!(n(&p["fs"]["by_op"]["access"]["count"]), SYNC_CALLS, "{p:#}");
    assert_eq!(n(&c["fs"]["by_op"]["access"]["count"]), CHILD_CALLS, "{c:#}");
    assert_eq!(n(&p["fs"]["by_op"]["scandir"]["count"]), ASYNC_READS, "{p:#}");
    assert!(c["fs"]["by_op"].get("scandir").is_none(), "{c:#}");
    // Sync calls on the loop thread: the accessSync calls and Node's own
    // start-up reads; the async readdirs are not among them.
    assert!(n(&p["fs"]["sync_on_loop"]["count"]) >= SYNC_CALLS, "{p:#}");
    assert!(n(&p["fs"]["sync_on_loop"]["count"]) <= n(&p["fs"]["count"]) - ASYNC_READS, "{p:#}");
    assert!(n(&c["fs"]["sync_on_loop"]["count"]) >= CHILD_CALLS, "{c:#}");
    let access = &p["fs"]["by_op"]["access"];
    assert!(f(&access["p50_ms"]) <= f(&access["p99_ms"]) && f(&access["p99_ms"]) <= f(&access["max_ms"]), "{access}");
    assert!(f(&access["max_ms"]) > 0.0, "{access}");
    assert!(f(&access["total_ms"]) >= f(&access["max_ms"]), "{access}");
    assert_eq!(access["histogram"].as_array().unwrap().iter().map(n).sum::<u64>(), SYNC_CALLS);
    let script = fixture("ci_job.js");
    assert!(p["fs"]["top_paths"].as_array().unwrap().iter().any(|x| x["path"] == script.as_str()), "{p:#}");

    // DNS: one failed lookup, in the parent.
    assert_eq!((n(&p["dns"]["count"]), n(&p["dns"]["errors"])), (1, 1), "{p:#}");
    assert_eq!(p["dns"]["by_name"][0]["name"], "nonexistent.invalid");
    assert_eq!(n(&c["dns"]["count"]), 0);

    // The loop: the busy timer callback is a blocked iteration of at least BUSY_MS.
    let lp = &p["loop"];
    assert!(n(&lp["blocked"]["count"]) >= 1, "{lp}");
    assert!(f(&lp["blocked"]["max_ms"]) >= BUSY_MS, "{lp}");
    assert!(n(&lp["iterations"]) > n(&lp["blocked"]["count"]), "fast iterations counted too: {lp}");
    let worst = &j["loop"]["blocked"]["worst"];
    assert_eq!(worst["pid"].as_i64(), Some(parent), "{worst}");
    assert_eq!(worst["thread_id"].as_i64(), Some(parent), "{worst}");
    check_worst(&r, worst, lp);

    // Totals are the processes' sums (iterations: the kernel's count).
    let procs = j["processes"].as_array().unwrap();
    for key in ["count", "errors"] {
        assert_eq!(n(&j["fs"][key]), procs.iter().map(|p| n(&p["fs"][key])).sum::<u64>(), "fs.{key}");
    }
    assert_eq!(n(&j["fs"]["by_op"]["access"]["count"]), SYNC_CALLS + CHILD_CALLS);
    assert_eq!(n(&j["fs"]["sync_on_loop"]["count"]), procs.iter().map(|p| n(&p["fs"]["sync_on_loop"]["count"])).sum::<u64>());
    assert_eq!(n(&j["loop"]["iterations"]), procs.iter().map(|p| n(&p["loop"]["iterations"])).sum::<u64>(), "{j:#}");
    let summary_iterations = summary_number(&r.out.stderr, " loop iterations");
    assert_eq!(n(&j["loop"]["iterations"]), summary_iterations, "the report and uvspan's summary line agree");

    // Budgets: all held.
    let budgets = j["budgets"].as_array().unwrap();
    let got: Vec<(&str, bool)> = budgets.iter().map(|b| (b["expr"].as_str().unwrap(), b["ok"].as_bool().unwrap())).collect();
    assert_eq!(got, held.iter().map(|e| (*e, true)).collect::<Vec<_>>());
    assert_eq!(f(&budgets[1]["value"]), 32.0);

    // The console: the summary table, and no span lines (the console view is off).
    let err = &r.out.stderr;
    assert!(err.contains("uvspan run: `sh -c node ") && err.contains("exited 0 after") && err.contains("4 budget(s) held"), "{err}");
    assert!(err.lines().any(|l| l.trim_start().starts_with(&format!("{parent} node "))), "a row for the parent: {err}");
    assert!(err.lines().any(|l| l.trim_start().starts_with(&format!("{child} "))), "a row for the child: {err}");
    assert!(!r.out.stdout.contains("fs.access"), "no span lines: {}", r.out.stdout);
    // Process counts that agree with the table: the shell is traced, and
    // is not one of the Node.js processes the table lists.
    assert_eq!(n(&j["processes_traced"]), 3, "sh, the parent, its child: {j:#}");
    assert_eq!(procs.len(), 2, "{j:#}");
    assert!(err.contains("uvspan: 3 process(es), 2 Node.js; spans: "), "{err}");
    assert!(err.contains("\nProcesses: 2 Node.js processes of 3 traced (loop threshold 10 ms)\n"), "{err}");
    // V8's collections in the blocked iterations: a column of the table,
    // the JSON's numbers ("-" where none was seen).
    assert!(err.contains("  GC IN BLOCKED MS\n"), "{err}");
    let total_row = err.lines().find(|l| l.trim_start().starts_with("total ")).unwrap_or_else(|| panic!("a total row: {err}"));
    let gc = match &j["loop"]["gc"] {
        Value::Null => "-".to_string(),
        g => format!("{} (max {})", console_ms(f(&g["total_ms"])), console_ms(f(&g["max_ms"]))),
    };
    assert!(total_row.ends_with(&format!("  {gc}")), "the total's GC cell is {gc:?}: {total_row}");

    // The step summary: appended after what an earlier step wrote.
    let md = r.file("step-summary.md");
    assert!(md.starts_with("# earlier step\n### ✅ uvspan: <code>sh -c node "), "{md}");
    assert!(md.contains("| process | fs ops |") && md.contains(&format!("| {parent} ")) && md.contains(&format!("| {child} ")), "{md}");
    assert!(md.contains("| nonexistent.invalid | 1 | 1 |"), "{md}");
    assert!(md.contains("**Processes: 2 Node.js processes of 3 traced") && md.contains(" | GC in blocked ms |"), "{md}");
    assert!(md.contains("| fs.by\\_op.access.count==32 | 32 | ok |"), "{md}");

    // JUnit: one case per budget, none failed.
    let (tests, failures, cases) = junit(&r.file("junit.xml"));
    assert_eq!((tests, failures), (4, 0));
    assert_eq!(cases.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), held);
    assert!(cases.iter().all(|c| c.1.is_none()));

    // The HTML page, in a real browser.
    check_html(&r, parent, child);
}

/// The worst iteration's culprit: the user's JS function (the busy callback
/// spins on performance.now(): the innermost frames are mostly the clock's,
/// native), the native top staying in the stack; its busy time split, and
/// the blocked iterations' per process (`lp`).
fn check_worst(r: &Run, worst: &Value, lp: &Value) {
    let culprit = worst["culprit"].as_str().unwrap_or_else(|| panic!("no culprit: {worst}"));
    assert!(culprit.contains("ci_job.js:"), "the culprit is a frame of the fixture's JS, not {culprit:?}: {worst}");
    let stack = worst["stacktrace"].as_str().unwrap_or_else(|| panic!("no stack: {worst}"));
    // (Native frames are above it when the heaviest stack was sampled in
    // the clock, as it mostly is; not asserted: the sampling decides.)
    assert!(stack.lines().any(|l| l == culprit), "the culprit is a frame of the stack:\n{stack}");
    assert!(r.out.stderr.contains(&format!("): {culprit}")), "the summary names it: {}", r.out.stderr);
    // Its busy time split, and the blocked iterations' per process: a
    // busy loop, mostly on a CPU or waiting for one, never mostly off it.
    let split = &worst["split"];
    let (on, off, rq) = (f(&split["on_cpu_ms"]), f(&split["off_cpu_ms"]), f(&split["runqueue_ms"]));
    let busy = f(&worst["busy_ms"]);
    assert!((on + off + rq - busy).abs() <= 0.03 * busy, "on {on} + off {off} + run queue {rq} = busy {busy}: {worst}");
    assert!(off < 0.5 * busy, "{worst}");
    assert!(f(&lp["on_cpu"]["total_ms"]) >= on && f(&lp["on_cpu"]["max_ms"]) > 0.0, "{lp}");
    assert!(r.out.stderr.contains("ms on-CPU, ") && r.out.stderr.contains("ms waiting for a CPU"), "{}", r.out.stderr);
}

/// Loads the page in headless chromium: its script ran without errors and
/// drew the timeline, the histograms and the tables. Leaves a screenshot
/// in the temp dir (printed) for a person to look at.
fn check_html(r: &Run, parent: i64, child: i64) {
    let chromium = ["chromium", "chromium-browser"].into_iter().find(|c| on_path(c));
    let chromium = chromium
        .expect("chromium is not on PATH: the HTML report is tested in a real browser (scripts/setup.sh installs Debian's chromium)");
    let page = r.dir.join("report.html");
    let html = r.file("report.html");
    for fetch in ["<link", " src=", "fetch(", "XMLHttpRequest", "@import"] {
        assert!(!html.contains(fetch), "the page is self-contained, yet has {fetch}");
    }
    let url = format!("file://{page}");
    let browser = |extra: &[&str]| {
        let profile = r.dir.join("chromium-profile");
        let mut c = Command::new(chromium);
        c.args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,2400"])
            .arg(format!("--user-data-dir={profile}"))
            .args(extra)
            .arg(&url);
        run_cmd(c)
    };
    let dom = browser(&["--dump-dom", "--virtual-time-budget=5000"]);
    assert!(dom.status.success(), "chromium failed: {}", dom.context());
    let d = &dom.stdout;
    assert!(d.contains("data-rendered=\"ok\""), "the page's script did not finish cleanly:\n{}", error_box(d));
    assert!(error_box(d).is_empty(), "the page reported errors: {}", error_box(d));
    let lanes: u32 =
        d.split("data-lanes=\"").nth(1).and_then(|s| s.split('"').next()).and_then(|s| s.parse().ok()).expect("timeline lanes");
    assert!(lanes >= 3, "parent loop, parent fs, child fs at least: {lanes}");
    assert!(d.matches("class=\"bar loop slow").count() >= 1, "the blocked iteration is drawn, highlighted");
    assert!(d.matches("class=\"bar fs").count() >= (SYNC_CALLS + CHILD_CALLS) as usize, "fs bars");
    assert!(d.contains("class=\"bar dns error\"") || d.contains("class=\"bar dns slow error\""), "the failed lookup is drawn as failed");
    assert!(d.matches("class=\"histogram\"").count() >= 3, "histograms per op");
    assert!(d.contains(">nonexistent.invalid<") && d.contains(&format!(">{parent} ")) && d.contains(&format!(">{child} ")), "tables");
    assert!(d.contains(">fs.by_op.access.count==32<") && d.contains(">held<"), "budgets");
    // The processes counted as the table lists them, GC per process.
    assert!(d.contains("data-processes=\"2/3\">2 Node.js processes of 3 traced<"), "the processes line");
    assert!(d.matches("class=\"gc-cell\"").count() >= 3, "a GC cell per process and the total");
    // The busy time split: a stacked bar per process, the total, and the worst iteration.
    assert!(d.matches("class=\"split-cell\"").count() >= 4, "split bars per process, total and worst");
    assert!(d.contains("class=\"split split-wide\""), "the worst iteration's split is drawn");
    assert!(d.contains("background:var(--oncpu)"), "its on-CPU part is drawn");
    // The path with markup in it is text (in the bar's tooltip), not an element.
    assert!(!d.contains("<b id=\"injected\">"), "markup from a path became an element");
    assert!(d.contains("/nonexistent/&lt;b id=\"injected\"&gt;&amp;'quoted'&lt;/b&gt;.json"), "the path is shown as text");
    let png = r.dir.join("report.png");
    let shot = browser(&[&format!("--screenshot={png}"), "--virtual-time-budget=5000"]);
    assert!(shot.status.success(), "chromium screenshot failed: {}", shot.context());
    let len = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
    assert!(len > 10_000, "the screenshot is {len} bytes");
    // To look at it: REPORT_SCREENSHOT=/some/file.png (the temp dir goes).
    if let Some(keep) = std::env::var_os("REPORT_SCREENSHOT") {
        std::fs::copy(&png, &keep).unwrap_or_else(|e| panic!("cannot copy the screenshot to {keep:?}: {e}"));
    }
}

/// A time as the console's tables show it (ms, 3 significant digits or
/// whole).
fn console_ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// The page's error box (empty when it stayed hidden and empty).
fn error_box(dom: &str) -> String {
    dom.split("<div id=\"errors\"")
        .nth(1)
        .and_then(|s| s.split_once('>'))
        .map(|(_, s)| s.split("</div>").next().unwrap_or("").to_string())
        .unwrap_or_default()
}

fn run_cmd(mut c: Command) -> Output {
    c.stdin(std::process::Stdio::null());
    Running::spawn(c).finish(RUN_TIMEOUT)
}

#[test]
fn broken_budgets_exit_3_and_are_named() {
    let dir = TempDir::new("run-config");
    let config = dir.join("uvspan.yaml");
    // One budget from the config file, one from the command line: both apply.
    std::fs::write(&config, "loop_threshold: 20ms\nbudgets:\n  - loop.blocked.max_ms<=1\n").unwrap();
    let r = run("run-broken", &["--config", &config, "--budget", "fs.by_op.access.count<10", "--budget", "dns.count==1"], 0);
    assert_eq!(r.out.code(), Some(3), "{}", r.out.context());
    let j = r.json();
    assert_eq!(j["exit_code"], 0, "the command itself succeeded");
    assert_eq!(f(&j["loop_threshold_ms"]), 20.0, "the config file applies to run");
    let b = j["budgets"].as_array().unwrap();
    assert_eq!(b.len(), 3, "{b:?}");
    assert_eq!((b[0]["expr"].as_str(), b[0]["ok"].as_bool()), (Some("loop.blocked.max_ms<=1"), Some(false)));
    assert!(f(&b[0]["value"]) >= BUSY_MS);
    assert_eq!((b[1]["value"].as_f64(), b[1]["ok"].as_bool()), (Some(32.0), Some(false)));
    assert_eq!(b[2]["ok"].as_bool(), Some(true));
    let err = &r.out.stderr;
    assert!(err.contains("2 of 3 budget(s) BROKEN"), "{err}");
    assert!(err.contains("budget broken: loop.blocked.max_ms<=1 (value "), "{err}");
    assert!(err.contains("budget broken: fs.by_op.access.count<10 (value 32, worst in pid "), "{err}");
    let md = r.file("step-summary.md");
    assert!(
        md.contains("### ❌ uvspan:") && md.contains("**budget broken:** fs.by\\_op.access.count&lt;10 (value 32, worst in pid "),
        "{md}"
    );
    let (tests, failures, cases) = junit(&r.file("junit.xml"));
    assert_eq!((tests, failures), (3, 2));
    assert_eq!(cases[1].0, "fs.by_op.access.count<10");
    let msg = cases[1].1.as_deref().unwrap_or_default();
    assert!(msg.starts_with("budget fs.by_op.access.count<10 broken: the value is 32 (worst in pid "), "{msg}");
    assert!(cases[2].1.is_none());
}

#[test]
fn the_commands_own_failure_wins_over_budgets() {
    let r = run("run-failing", &["--budget", "loop.blocked.max_ms<=1"], 7);
    assert_eq!(r.out.code(), Some(7), "{}", r.out.context());
    let j = r.json();
    assert_eq!(j["exit_code"], 7);
    assert_eq!(j["budgets"][0]["ok"], false, "budgets are still checked and reported");
    assert!(r.out.stderr.contains("exited 7 after"), "{}", r.out.stderr);
    assert!(r.file("step-summary.md").contains("### ❌"));
}

#[test]
fn a_bad_budget_exits_2_before_anything_runs() {
    require_root();
    let dir = TempDir::new("run-bad");
    let marker = dir.join("ran");
    for (args, what) in [
        (vec!["--budget", "fs.cout<=3"], "invalid budget \"fs.cout<=3\": the report has no fs.cout"),
        (vec!["--budget", "loop.blocked.max_ms"], "invalid budget \"loop.blocked.max_ms\": no comparison"),
        (vec!["--budget", "dns.count<=many"], "invalid budget \"dns.count<=many\": \"many\" is not a number"),
        (vec!["--budget", "fs.sync_on_loop<3"], "invalid budget \"fs.sync_on_loop<3\": fs.sync_on_loop is not a number"),
        (vec!["--budget", "wall_ms[node]<3"], "invalid budget \"wall_ms[node]<3\": wall_ms is the whole run's, not a process's"),
        (vec!["--budget", "loop.blocked.max_ms[vitest<3"], "invalid budget \"loop.blocked.max_ms[vitest<3\": a '[' without its ']'"),
    ] {
        let mut all = vec!["run".to_string(), "--report".into(), dir.join("r.json")];
        all.extend(args.iter().map(|s| s.to_string()));
        all.extend(["--".to_string(), "touch".into(), marker.clone()]);
        let out = run_cmd(uvspan_cmd(&all));
        assert_eq!(out.code(), Some(2), "{}", out.context());
        let lines: Vec<&str> = out.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {}", out.stderr);
        assert!(lines[0].starts_with(&format!("uvspan: {what}")), "{}", lines[0]);
        assert!(!Path::new(&marker).exists(), "the command must not run");
        assert!(!Path::new(&dir.join("r.json")).exists(), "no report");
    }
    // The same from the config file.
    let config = dir.join("bad.yaml");
    std::fs::write(&config, "budgets: [\"loop.blockd.max_ms<=3\"]\n").unwrap();
    let out = run_cmd(uvspan_cmd(["run", "--config", &config, "--", "touch", &marker]));
    assert_eq!(out.code(), Some(2), "{}", out.context());
    assert!(out.stderr.starts_with("uvspan: invalid budget \"loop.blockd.max_ms<=3\""), "{}", out.stderr);
    assert!(!Path::new(&marker).exists());
    // run needs a command.
    for args in [&["run", "--pid", "1"][..], &["run", "--"], &["run", "--all", "--", "true"]] {
        let out = run_cmd(uvspan_cmd(args));
        assert_eq!(out.code(), Some(2), "{args:?}: {}", out.context());
        assert!(out.stderr.starts_with("uvspan: uvspan run traces a command it starts"), "{}", out.stderr);
    }
    // Nor with sampling: the numbers would be a share.
    let out = run_cmd(uvspan_cmd(["run", "--sample-time", "10%", "--", "touch", &marker]));
    assert_eq!(out.code(), Some(2), "{}", out.context());
    assert!(out.stderr.starts_with("uvspan: uvspan run cannot be combined with --sample-time"), "{}", out.stderr);
    assert!(!Path::new(&marker).exists());
}

#[test]
fn spans_still_go_to_otlp_and_match_the_report() {
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let r = run("run-otlp", &["--otlp-endpoint", &ep, "--budget", "dns.count==1"], 0);
    assert_eq!(r.out.code(), Some(0), "{}", r.out.context());
    let (parent, child) = (r.markers.i64("parent", "pid"), r.markers.i64("child", "pid"));
    let spans = rx.spans();
    check_summary(&r.out, spans.len());
    let j = r.json();
    let count =
        |pid: i64, pred: &dyn Fn(&Span) -> bool| spans.iter().filter(|s| s.res_int("process.pid") == Some(pid) && pred(s)).count() as u64;
    for pid in [parent, child] {
        let p = process(&j, pid);
        assert_eq!(count(pid, &|s| s.name.starts_with("fs.")), n(&p["fs"]["count"]), "fs spans exported and counted, process {pid}");
        assert_eq!(count(pid, &|s| s.name == "fs.access"), n(&p["fs"]["by_op"]["access"]["count"]));
        assert_eq!(count(pid, &|s| s.name == "dns.getaddrinfo"), n(&p["dns"]["count"]));
        assert_eq!(count(pid, &|s| s.name == "uv.loop.iteration"), n(&p["loop"]["blocked"]["count"]));
    }
    assert_eq!(count(parent, &|s| s.name == "fs.access"), SYNC_CALLS);
}

#[test]
fn an_unwritable_report_is_said_and_fails_a_passing_run() {
    require_root();
    let out = run_cmd(uvspan_cmd(["run", "--report", "/nonexistent-dir/report.json", "--", "node", "-e", "0"]));
    assert_eq!(out.code(), Some(1), "{}", out.context());
    let line = out.stderr.lines().find(|l| l.contains("cannot write")).unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(
        line.starts_with(
            "uvspan: cannot write the JSON report to /nonexistent-dir/report.json; check the directory exists and is writable: "
        ),
        "{line}"
    );
    // The command's own failure still wins.
    let out = run_cmd(uvspan_cmd(["run", "--report", "/nonexistent-dir/report.json", "--", "node", "-e", "process.exit(5)"]));
    assert_eq!(out.code(), Some(5), "{}", out.context());
}

/// `uvspan run` of a CLI (tests/fixtures/cli_run.js: 50 top-level
/// `statSync`, 3 timer ticks with a `fs.stat` each, exit 3): its trace is a
/// tree in the JSON report and on the HTML page.
#[test]
fn the_process_trace_is_a_tree_in_the_report_and_the_page() {
    require_root();
    let dir = TempDir::new("run-tree");
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let (json, html) = (dir.join("report.json"), dir.join("report.html"));
    let out = run_cmd(uvspan_cmd(["run", "--html", &html, "--report", &json, "--", "node", &fixture("cli_run.js"), &work]));
    assert_eq!(out.code(), Some(3), "{}", out.context());
    let j: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let p = j["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["command"].as_str().is_some_and(|c| c.contains("cli_run.js")))
        .unwrap_or_else(|| panic!("no process of cli_run.js: {j:#}"));
    let t = &p["trace"];
    let root = &t["root"];
    assert_eq!(
        (root["name"].as_str(), root["exit_code"].as_i64(), root["error"].as_str()),
        (Some("node"), Some(3), Some("exit code 3")),
        "{t:#}"
    );
    assert!(root["command_line"].as_str().unwrap().ends_with(&format!("cli_run.js {work}")), "{root}");
    let startup = &t["startup"];
    assert!(n(&startup["operations"]) >= 50, "the 50 statSync calls and module loading: {startup}");
    assert_eq!(startup["ops"].as_array().unwrap().len() as u64 + n(&startup["more_ops"]), n(&startup["operations"]), "{startup}");
    assert!(startup["ops"].as_array().unwrap().len() <= 50, "at most 50 operations listed");
    let timers: Vec<&Value> = t["children"].as_array().unwrap().iter().filter(|c| c["kind"] == "timers").collect();
    assert_eq!(timers.len(), 3, "{t:#}");
    assert_eq!((n(&t["tasks"]), n(&t["more_tasks"])), (3, 0));
    for (i, task) in timers.iter().enumerate() {
        assert_eq!(n(&task["operations"]), 1, "{task}");
        let stat = &task["ops"][0];
        assert_eq!(stat["name"], "fs.stat", "{task}");
        assert_eq!(stat["target"].as_str(), Some(format!("{work}/t-{i}").as_str()), "the ticks in order: {task}");
        assert_eq!((stat["error"].as_str(), stat["failed"].as_bool()), (Some("ENOENT"), Some(false)), "an existence check: {stat}");
    }
    assert!(t["requests"].as_array().unwrap().is_empty());

    // The page, in a real browser: the tree's rows are drawn.
    let chromium = ["chromium", "chromium-browser"].into_iter().find(|c| on_path(c)).expect("chromium is not on PATH");
    let mut c = Command::new(chromium);
    c.args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", "--virtual-time-budget=5000"])
        .arg(format!("--user-data-dir={}", dir.join("chromium-profile")))
        .arg(format!("file://{html}"));
    let dom = run_cmd(c);
    assert!(dom.status.success(), "chromium failed: {}", dom.context());
    let d = &dom.stdout;
    assert!(d.contains("data-rendered=\"ok\""), "the page's script did not finish cleanly:\n{}", error_box(d));
    let card = d.split(&format!("<div class=\"trace\" data-pid=\"{}\">", p["pid"])).nth(1).expect("a tree for the process");
    let card = card.split("<div class=\"trace\"").next().unwrap();
    assert_eq!(card.matches("data-kind=\"process\"").count(), 1, "{card}");
    assert_eq!(card.matches("data-kind=\"startup\"").count(), 1, "{card}");
    assert_eq!(card.matches("data-kind=\"timers\"").count(), 3, "{card}");
    assert!(card.contains(">exit code 3<"), "the root's exit code: {card}");
    for i in 0..3 {
        assert!(card.contains(&format!("{work}/t-{i}")), "tick {i}'s fs.stat under its task: {card}");
    }
}

/// A job that never runs its event loop (a compiler, like tsc): its
/// synchronous operations are in the report, and uvspan says that its loop
/// has not started, not that its spans are missing.
#[test]
fn a_job_that_never_enters_its_loop_is_traced_not_called_silent() {
    require_root();
    let dir = TempDir::new("run-sync");
    let report = dir.join("report.json");
    let cmd = uvspan_cmd(["run", "--report", &report, "--", "node", &fixture("sync_job.js")]);
    let out = Running::spawn(cmd).finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let stats = Markers::parse(&out.stdout).i64("done", "stats") as u64;
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("{report}: {e}\n{}", out.context()));
    let j: Value = serde_json::from_str(&text).unwrap();
    let traced = n(&j["fs"]["by_op"]["stat"]["count"]);
    assert!(traced >= stats, "{traced} fs.stat in the report, the job made {stats}\n{}", out.context());
    assert!(!out.stderr.contains("its spans are missing"), "a loop-less job was called silent\n{}", out.context());
    let said = out
        .stderr
        .lines()
        .find(|l| l.contains("without entering its event loop"))
        .unwrap_or_else(|| panic!("uvspan did not say the job has not entered its loop\n{}", out.context()));
    assert!(said.contains("its operations are traced"), "{said}");
}

/// An async read the threadpool finishes while the loop is blocked for
/// 300 ms: with the threadpool split, the slowest paths rank it by its own
/// time and show its callback's wait for the loop apart (the loop's time,
/// not the disk's), in the report, the console and the page.
#[test]
fn a_read_that_waited_for_a_blocked_loop_is_not_blamed_on_the_disk() {
    require_root();
    let dir = TempDir::new("run-wait");
    let data = dir.join("data.bin");
    std::fs::write(&data, vec![7u8; 4096]).unwrap();
    let (report, html) = (dir.join("report.json"), dir.join("report.html"));
    let cmd =
        uvspan_cmd(["run", "--detail", "threadpool", "--report", &report, "--html", &html, "--", "node", &fixture("wait_job.js"), &data]);
    let out = Running::spawn(cmd).finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "{}", out.context());
    assert_eq!(Markers::parse(&out.stdout).get("done")["bytes"], 4096, "{}", out.context());
    let j: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let paths = j["fs"]["top_paths"].as_array().unwrap();
    let p = paths.iter().find(|p| p["path"].as_str() == Some(data.as_str())).unwrap_or_else(|| panic!("{paths:#?}"));
    let (own, wait, total) = (f(&p["own_ms"]), f(&p["loop_wait_ms"]), f(&p["total_ms"]));
    assert!((own + wait - total).abs() < 0.01, "own {own} + wait {wait} = total {total}: {p}");
    assert!(wait > own, "the loop's block is the read's callback's wait, not its own time: {p}");
    // readFile's open is the op submitted before the block: its latency
    // is its own time, the wait apart.
    let open = &j["fs"]["by_op"]["open"];
    assert!(f(&open["loop_wait_ms"]) > f(&open["max_ms"]), "the op's latency is its own time: {open}");
    // The console: the split table, the wait apart.
    let err = &out.stderr;
    assert!(err.contains("Slowest paths (own time: threadpool queue + run; the callbacks' wait for a busy loop apart)"), "{err}");
    assert!(err.contains("CALLBACK WAITED FOR THE LOOP MS"), "{err}");
    // Without the split the table says its time includes the wait.
    let plain = Running::spawn(uvspan_cmd(["run", "--", "node", &fixture("wait_job.js"), &data])).finish(RUN_TIMEOUT);
    assert!(
        plain.stderr.contains("(total time, the callbacks' wait for the loop included: --detail threadpool splits it)"),
        "{}",
        plain.context()
    );
    // The page, in a real browser.
    let chromium = ["chromium", "chromium-browser"].into_iter().find(|c| on_path(c)).expect("chromium is not on PATH");
    let mut c = Command::new(chromium);
    c.args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", "--virtual-time-budget=5000"])
        .arg(format!("--user-data-dir={}", dir.join("chromium-profile")))
        .arg(format!("file://{html}"));
    let dom = run_cmd(c);
    assert!(dom.status.success(), "chromium failed: {}", dom.context());
    let d = &dom.stdout;
    assert!(d.contains("data-rendered=\"ok\""), "the page's script did not finish cleanly:\n{}", error_box(d));
    assert!(d.contains(">callback waited for the loop<") && d.contains("it is the loop's, not the disk's"), "the page's paths table");
}

/// `npm run job`, whose script blocks its loop ~300 ms: a budget without a
/// selector is checked over the job's process, not npm's (whose own
/// start-up is often the run's longest iteration), fails a 200 ms limit
/// and names the job's process; `[*]` covers npm too.
#[test]
fn budgets_cover_the_job_not_the_package_manager_that_starts_it() {
    require_root();
    let dir = TempDir::new("run-npm");
    let pkg = format!(
        "{{\"name\":\"uvspan-job\",\"version\":\"1.0.0\",\"private\":true,\"scripts\":{{\"job\":\"node {}\"}}}}\n",
        fixture("block_job.js")
    );
    std::fs::write(dir.join("package.json"), pkg).unwrap();
    let report = dir.join("report.json");
    let mut cmd = uvspan_cmd([
        "run",
        "--report",
        &report,
        "--loop-threshold",
        "50ms",
        "--budget",
        "loop.blocked.max_ms<=200",
        "--budget",
        "loop.blocked.max_ms[*]<=1000000",
        "--budget",
        "loop.blocked.count[npm run]>=0",
        "--",
        "npm",
        "run",
        "--silent",
        "job",
    ]);
    cmd.current_dir(dir.path()).env("npm_config_update_notifier", "false").env("npm_config_cache", dir.join("npm-cache"));
    let out = run_cmd(cmd);
    assert_eq!(out.code(), Some(3), "the job's budget is broken\n{}", out.context());
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("{report}: {e}\n{}", out.context()));
    let j: Value = serde_json::from_str(&text).unwrap();
    let procs = j["processes"].as_array().unwrap();
    let by = |needle: &str| procs.iter().find(|p| p["command"].as_str().unwrap_or("").contains(needle));
    let job = by("block_job.js").unwrap_or_else(|| panic!("the job's process is listed\n{text}"));
    let npm = by("npm").unwrap_or_else(|| panic!("npm's own process is listed\n{text}"));
    let b = j["budgets"].as_array().unwrap();
    assert_eq!(b[0]["ok"], false, "{text}");
    assert_eq!(b[0]["scope"], "the command's own processes");
    assert_eq!(b[0]["from"]["pid"], job["pid"], "the worst figure is the job's\n{text}");
    assert!(f(&b[0]["value"]) >= 300.0, "{text}");
    assert_eq!(f(&b[0]["value"]), f(&job["loop"]["blocked"]["max_ms"]), "over the job's own iterations\n{text}");
    // [*]: npm's processes too; its value is the largest of all of them.
    let all_max = procs.iter().map(|p| f(&p["loop"]["blocked"]["max_ms"])).fold(0.0, f64::max);
    assert_eq!((b[1]["ok"].as_bool(), f(&b[1]["value"])), (Some(true), all_max), "{text}");
    // [npm run]: npm's own process only.
    assert_eq!(b[2]["from"]["pid"], npm["pid"], "{text}");
    assert!(out.stderr.contains("budget broken: loop.blocked.max_ms<=200 (value "), "{}", out.stderr);
    assert!(out.stderr.contains(&format!("worst in pid {} ", job["pid"])), "{}", out.stderr);
}
