//! Budgets: `path<=number` over the report, e.g. `loop.blocked.max_ms<=100`,
//! `fs.sync_on_loop.count<50`, `dns.count==0`, `fs.by_op.stat.p99_ms<=2`,
//! `loop.off_cpu.max_ms<=20` (the split of the blocked iterations:
//! `loop.{on_cpu,off_cpu,runqueue,throttled}.{max_ms,total_ms}`), `loop.gc.max_ms<=50`
//! (V8 garbage collection in the blocked iterations).
//! A path is checked against the report's shape when parsed, so a typo
//! stops the run before it starts.
//!
//! A budget is checked over the processes that matter: by default the
//! command's own processes, not the package managers that start them
//! (npm, npx, yarn, pnpm, corepack: see [`is_wrapper`]; a run where every
//! process is one of those, `npm install`, is checked over all of them). A
//! selector in brackets after the path picks the processes instead:
//! `loop.blocked.max_ms[vitest]<=200` (the processes whose command line
//! holds "vitest"), `loop.blocked.max_ms[node */server.js]<=200` (a glob
//! over the whole command line: `*` and `?`), `loop.blocked.max_ms[*]<=200`
//! (every process, wrappers included). The result names the selected
//! process whose own figure is the worst.

use std::fmt;

use serde_json::Value;

use super::aggregate::{Aggregate, BudgetResult, FromProcess, Report};

/// Which processes a budget is checked over.
#[derive(Clone, Debug, PartialEq)]
pub enum Scope {
    /// The command's own processes, not package-manager wrappers (all of
    /// them when there are no others).
    Job,
    /// Processes whose command line matches the pattern: a glob (`*`, `?`)
    /// over the whole line, or without those, a part of it.
    Matching(String),
}

impl Scope {
    fn selects(&self, command: &str) -> bool {
        match self {
            Scope::Job => !is_wrapper(command),
            Scope::Matching(p) if p.contains(['*', '?']) => glob(p.as_bytes(), command.as_bytes()),
            Scope::Matching(p) => command.contains(p.as_str()),
        }
    }

    fn shown(&self) -> String {
        match self {
            Scope::Job => "the command's own processes".into(),
            Scope::Matching(p) => format!("[{p}]"),
        }
    }
}

/// Whether a process's command line (argv joined by spaces) is a package
/// manager's own process: its executable or, for node, its script is npm,
/// npx, yarn, pnpm, pnpx or corepack (`npm-cli.js`, `yarn.cjs` ...).
pub fn is_wrapper(command: &str) -> bool {
    const WRAPPERS: [&str; 9] = ["npm", "npx", "npm-cli", "npx-cli", "yarn", "yarnpkg", "pnpm", "pnpx", "corepack"];
    let name = |w: &str| {
        let base = w.rsplit('/').next().unwrap_or(w);
        let stem = [".js", ".cjs", ".mjs"].iter().find_map(|e| base.strip_suffix(e)).unwrap_or(base);
        // yarn 2+ runs as .yarn/releases/yarn-4.1.0.cjs
        WRAPPERS.contains(&stem) || stem.starts_with("yarn-")
    };
    let mut words = command.split_whitespace();
    let Some(exe) = words.next() else { return false };
    if name(exe) {
        return true;
    }
    let node = exe.rsplit('/').next().is_some_and(|b| b == "node" || b.starts_with("node") && b[4..].chars().all(|c| c.is_ascii_digit()));
    // node's options come before its script.
    node && words.find(|w| !w.starts_with('-')).is_some_and(name)
}

/// `*` any run of bytes, `?` one byte, over the whole text.
fn glob(p: &[u8], t: &[u8]) -> bool {
    // Iterative with one backtrack point: linear in practice, never
    // exponential.
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
}

impl Cmp {
    fn holds(self, value: f64, limit: f64) -> bool {
        match self {
            Cmp::Lt => value < limit,
            Cmp::Le => value <= limit,
            Cmp::Gt => value > limit,
            Cmp::Ge => value >= limit,
            Cmp::Eq => value == limit,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    pub expr: String,
    pub path: Vec<String>,
    pub cmp: Cmp,
    pub limit: f64,
    /// None: a number of the whole run (wall_ms, exit_code), not per process.
    pub scope: Option<Scope>,
}

/// Why a budget expression is not one.
#[derive(Clone, Debug, PartialEq)]
pub enum BudgetError {
    NoComparison,
    BadLimit(String),
    /// The path names nothing in the report.
    UnknownKey(String),
    /// The path names a section, not a number.
    NotANumber(String),
    /// A selector on a number of the whole run, or a bad selector.
    BadSelector(String),
}

#[derive(Debug)]
pub struct InvalidBudget {
    pub expr: String,
    pub why: BudgetError,
}

impl fmt::Display for InvalidBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match &self.why {
            BudgetError::NoComparison => "no comparison; use <, <=, >, >= or == and a number".to_string(),
            BudgetError::BadLimit(s) => format!("{s:?} is not a number"),
            BudgetError::UnknownKey(p) => format!("the report has no {p}"),
            BudgetError::NotANumber(p) => format!("{p} is not a number in the report"),
            BudgetError::BadSelector(why) => why.clone(),
        };
        write!(
            f,
            "invalid budget {:?}: {why}; write e.g. loop.blocked.max_ms<=100, loop.blocked.max_ms[vitest]<=200, fs.sync_on_loop.count<50, fs.by_op.stat.p99_ms<=2",
            self.expr
        )
    }
}

impl std::error::Error for InvalidBudget {}

/// The report's shape, for checking paths: an empty report with one fs op.
fn shape() -> Value {
    let mut r = super::aggregate::Aggregate::default().report(&Default::default());
    r.total.fs.by_op.insert("op".into(), Default::default());
    r.total.event_loop.blocked.worst = None;
    r.total.event_loop.gc = Some(Default::default());
    serde_json::to_value(&r).unwrap_or(Value::Null)
}

impl Budget {
    pub fn parse(expr: &str) -> Result<Budget, InvalidBudget> {
        let err = |why| InvalidBudget { expr: expr.to_string(), why };
        // The comparison after the selector (which may hold '=').
        let base = expr.rfind(']').map_or(0, |i| i + 1);
        let at = expr[base..].find(['<', '>', '=']).map(|i| i + base).ok_or_else(|| err(BudgetError::NoComparison))?;
        let (path, rest) = expr.split_at(at);
        // KEY[SELECTOR]
        let (path, selector) = match path.trim_end().strip_suffix(']') {
            Some(p) => {
                let (key, sel) = p.split_once('[').ok_or_else(|| err(BudgetError::BadSelector("a ']' without its '['".into())))?;
                if sel.contains(['[', ']']) || sel.trim().is_empty() {
                    return Err(err(BudgetError::BadSelector(format!(
                        "[{sel}] is not a process selector (a part of a command line, or a glob)"
                    ))));
                }
                (key, Some(sel.trim().to_string()))
            }
            None if path.contains(['[', ']']) => return Err(err(BudgetError::BadSelector("a '[' without its ']'".into()))),
            None => (path, None),
        };
        let (cmp, num) = [("<=", Cmp::Le), (">=", Cmp::Ge), ("==", Cmp::Eq), ("<", Cmp::Lt), (">", Cmp::Gt)]
            .into_iter()
            .find_map(|(s, c)| rest.strip_prefix(s).map(|n| (c, n)))
            .ok_or_else(|| err(BudgetError::NoComparison))?;
        let num = num.trim();
        let limit: f64 = num.parse().ok().filter(|v: &f64| v.is_finite()).ok_or_else(|| err(BudgetError::BadLimit(num.to_string())))?;
        let path: Vec<String> = path.trim().split('.').map(|s| s.trim().to_string()).collect();
        let shown = path.join(".");
        if path.iter().any(String::is_empty) {
            return Err(err(BudgetError::UnknownKey(shown)));
        }
        // Any op name under fs.by_op (an op that did not happen is 0).
        let mut probe = path.clone();
        if probe.len() > 2 && probe[0] == "fs" && probe[1] == "by_op" {
            probe[2] = "op".into();
        }
        let sections = serde_json::to_value(super::aggregate::Sections::default()).unwrap_or(Value::Null);
        let per_process = sections.get(probe[0].as_str()).is_some();
        let scope = match (selector, per_process) {
            (Some(s), true) => Some(Scope::Matching(s)),
            (Some(_), false) => {
                return Err(err(BudgetError::BadSelector(format!("{shown} is the whole run's, not a process's: it takes no selector"))))
            }
            (None, true) => Some(Scope::Job),
            (None, false) => None,
        };
        match lookup(&shape(), &probe) {
            None => Err(err(BudgetError::UnknownKey(shown))),
            Some(Value::Number(_)) => Ok(Budget { expr: expr.trim().to_string(), path, cmp, limit, scope }),
            Some(_) => Err(err(BudgetError::NotANumber(shown))),
        }
    }

    /// The budget's value in `report` (0 for an fs op that did not happen;
    /// None for a number the run did not measure: null in the report, as
    /// `loop.gc` where V8's collections are not seen).
    pub fn value(&self, report: &Value) -> Option<f64> {
        let mut v = report;
        for k in &self.path {
            match v.get(k.as_str()) {
                Some(Value::Null) => return None,
                Some(next) => v = next,
                None => return Some(0.0),
            }
        }
        Some(v.as_f64().unwrap_or(0.0))
    }

    /// Checked over the whole report (`report`, as JSON) or, with a scope,
    /// over the selected processes of `report` folded by `agg`.
    pub fn check(&self, report: &Report, json: &Value, agg: &Aggregate) -> BudgetResult {
        let Some(scope) = &self.scope else {
            let value = self.value(json);
            return BudgetResult {
                expr: self.expr.clone(),
                value,
                ok: value.is_some_and(|v| self.cmp.holds(v, self.limit)),
                scope: None,
                from: None,
            };
        };
        let mut chosen: Vec<&super::aggregate::ProcessReport> = report.processes.iter().filter(|p| scope.selects(&p.command)).collect();
        let mut shown = scope.shown();
        if chosen.is_empty() && *scope == Scope::Job {
            // Only package managers ran: they are the job.
            chosen = report.processes.iter().collect();
            shown = "every process (all are package managers)".into();
        }
        let pids: Vec<u32> = chosen.iter().map(|p| p.pid).collect();
        // [*] and a job of every process: the run's own total (the
        // kernel's count of iterations included).
        let value = if pids.is_empty() && *scope != Scope::Job {
            // A selector that matches nothing (a typo) holds on nothing: it
            // is broken, "not measured".
            None
        } else if pids.len() == report.processes.len() {
            self.value(json)
        } else {
            let scoped = serde_json::to_value(agg.scoped(&pids)).unwrap_or(Value::Null);
            self.value(&scoped)
        };
        let worse = |a: f64, b: f64| if matches!(self.cmp, Cmp::Gt | Cmp::Ge) { a < b } else { a > b };
        let mut from: Option<FromProcess> = None;
        for p in &chosen {
            let Some(v) = serde_json::to_value(&p.sections).ok().and_then(|j| self.value(&j)) else { continue };
            if from.as_ref().is_none_or(|f| worse(v, f.value)) {
                from = Some(FromProcess { pid: p.pid, command: p.command.clone(), value: v });
            }
        }
        BudgetResult { expr: self.expr.clone(), value, ok: value.is_some_and(|v| self.cmp.holds(v, self.limit)), scope: Some(shown), from }
    }
}

fn lookup<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k.as_str()))
}

/// Checks every budget against the report (its processes folded by `agg`)
/// and records the results in it.
pub fn evaluate(report: &mut Report, budgets: &[Budget], agg: &Aggregate) {
    let json = serde_json::to_value(&*report).unwrap_or(Value::Null);
    report.budgets = budgets.iter().map(|b| b.check(report, &json, agg)).collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_issue_examples() {
        let b = Budget::parse("loop.blocked.max_ms<=100").unwrap();
        assert_eq!((b.path.join("."), b.cmp, b.limit), ("loop.blocked.max_ms".to_string(), Cmp::Le, 100.0));
        assert_eq!(Budget::parse("fs.sync_on_loop.count <= 50").unwrap().cmp, Cmp::Le);
        assert_eq!(Budget::parse("dns.count==0").unwrap().cmp, Cmp::Eq);
        assert_eq!(Budget::parse("fs.errors<1").unwrap().cmp, Cmp::Lt);
        assert_eq!(Budget::parse("loop.iterations>=1").unwrap().cmp, Cmp::Ge);
        assert_eq!(Budget::parse("wall_ms>0.5").unwrap().limit, 0.5);
        assert_eq!(Budget::parse("fs.by_op.readdir.p99_ms<=2").unwrap().path.len(), 4);
    }

    #[test]
    fn bad_expressions_are_typed_errors() {
        let why = |e: &str| Budget::parse(e).unwrap_err().why;
        assert_eq!(why("loop.blocked.max_ms"), BudgetError::NoComparison);
        assert_eq!(why("loop.blocked.max_ms=>3"), BudgetError::NoComparison);
        assert_eq!(why("loop.blocked.max_ms<=lots"), BudgetError::BadLimit("lots".into()));
        assert_eq!(why("loop.blocked.max_ms<=inf"), BudgetError::BadLimit("inf".into()));
        assert_eq!(why("fs.cout<=3"), BudgetError::UnknownKey("fs.cout".into()));
        assert_eq!(why("<=3"), BudgetError::UnknownKey("".into()));
        assert_eq!(why("fs.sync_on_loop<=3"), BudgetError::NotANumber("fs.sync_on_loop".into()));
        assert_eq!(why("command==1"), BudgetError::NotANumber("command".into()));
        let line = Budget::parse("fs.cout<=3").unwrap_err().to_string();
        assert!(line.starts_with("invalid budget \"fs.cout<=3\": the report has no fs.cout;") && !line.contains('\n'), "{line}");
    }

    #[test]
    fn evaluated_against_the_report() {
        let (a, facts) = super::super::aggregate::tests::sample_agg();
        let mut r = a.report(&facts);
        let budgets: Vec<Budget> = [
            "loop.blocked.max_ms<=100",
            "fs.sync_on_loop.count<=50",
            "dns.count==0",
            "fs.by_op.rename.count==0",
            "fs.by_op.stat.errors<2",
            "loop.off_cpu.max_ms<=20",
            "loop.runqueue.total_ms<20",
            "loop.throttled.max_ms==0",
            "loop.gc.max_ms<=20",
        ]
        .iter()
        .map(|e| Budget::parse(e).unwrap())
        .collect();
        evaluate(&mut r, &budgets, &a);
        let got: Vec<(f64, bool)> = r.budgets.iter().map(|b| (b.value.unwrap_or(f64::NAN), b.ok)).collect();
        assert_eq!(
            got,
            [
                (150.25, false),
                (5.0, true),
                (3.0, false),
                (0.0, true),
                (1.0, true),
                (45.0, false),
                (14.0, true),
                (4.5, false),
                (30.5, false)
            ]
        );
    }

    #[test]
    fn a_number_not_measured_breaks_its_budget() {
        // No iteration carries a GC time (V8's collections not seen): the
        // report says null, not 0, and a GC budget does not hold on nothing.
        let a = super::super::aggregate::Aggregate::default();
        let mut r = a.report(&Default::default());
        assert_eq!(r.total.event_loop.gc, None);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["total"]["loop"]["gc"], Value::Null, "{json}");
        evaluate(&mut r, &[Budget::parse("loop.gc.max_ms<=20").unwrap(), Budget::parse("dns.count==0").unwrap()], &a);
        let got: Vec<(Option<f64>, bool, String)> = r.budgets.iter().map(|b| (b.value, b.ok, b.shown())).collect();
        assert_eq!(got, [(None, false, "not measured".into()), (Some(0.0), true, "0".into())]);
    }

    /// `npm test` running `node test.js`: npm's start-up (a 500 ms
    /// iteration) does not decide the default budget; the job's 250 ms one
    /// breaks a 200 ms limit, and the result names the job's process.
    #[test]
    fn budgets_are_checked_over_the_job_not_its_package_manager() {
        use super::super::aggregate::tests::{iteration, t0};
        use super::super::aggregate::RunFacts;
        let mut a = Aggregate::default();
        a.add(10, &iteration(5.0, 500.0, 10, 0, None), t0());
        a.add(20, &iteration(900.0, 250.0, 20, 3, None), t0());
        a.add(20, &iteration(1200.0, 120.0, 20, 0, None), t0());
        let commands = [
            (10, vec!["node".to_string(), "/usr/lib/node_modules/npm/bin/npm-cli.js".into(), "test".into()]),
            (20, vec!["/usr/bin/node".to_string(), "--enable-source-maps".into(), "test.js".into()]),
        ];
        let facts = RunFacts { command: vec!["npm".into(), "test".into()], commands: commands.into(), ..Default::default() };
        let mut r = a.report(&facts);
        let b: Vec<Budget> = [
            "loop.blocked.max_ms<=200",
            "loop.blocked.max_ms<=300",
            "loop.blocked.max_ms[*]<=300",
            "loop.blocked.max_ms[npm-cli]<=300",
            "loop.blocked.count[*node *test.js]==2",
            "wall_ms>=0",
            "loop.blocked.count[vitset]==0",
        ]
        .iter()
        .map(|e| Budget::parse(e).unwrap())
        .collect();
        evaluate(&mut r, &b, &a);
        let got: Vec<(Option<f64>, bool, Option<u32>)> =
            r.budgets.iter().map(|b| (b.value, b.ok, b.from.as_ref().map(|f| f.pid))).collect();
        assert_eq!(
            got,
            [
                (Some(250.0), false, Some(20)),
                (Some(250.0), true, Some(20)),
                (Some(500.0), false, Some(10)),
                (Some(500.0), false, Some(10)),
                (Some(2.0), true, Some(20)),
                (r.budgets[5].value, true, None),
                (None, false, None),
            ]
        );
        assert_eq!(r.budgets[0].scope.as_deref(), Some("the command's own processes"));
        assert!(r.budgets[0].shown_from().starts_with("pid 20 /usr/bin/node --enable-source-maps test.js"), "{:?}", r.budgets[0]);
        let text = super::super::summary::text(&r);
        assert!(text.contains("budget broken: loop.blocked.max_ms<=200 (value 250, worst in pid 20 /usr/bin/node"), "{text}");
        // `npm install`: only npm ran; its processes are the job.
        let mut a = Aggregate::default();
        a.add(10, &iteration(5.0, 500.0, 10, 0, None), t0());
        let facts = RunFacts { commands: [(10, vec!["npm".to_string(), "install".into()])].into(), ..Default::default() };
        let mut r = a.report(&facts);
        evaluate(&mut r, &[Budget::parse("loop.blocked.max_ms<=200").unwrap()], &a);
        assert_eq!((r.budgets[0].value, r.budgets[0].from.as_ref().map(|f| f.pid)), (Some(500.0), Some(10)));
    }

    #[test]
    fn package_managers_are_told_by_their_executable_or_script() {
        for w in [
            "npm test",
            "/usr/bin/npx vitest run",
            "node /usr/lib/node_modules/npm/bin/npm-cli.js run build",
            "node /x/npx-cli.js tsc",
            "node --max-old-space-size=4096 /y/.yarn/releases/yarn-4.1.0.cjs",
            "yarn",
            "node /p/pnpm/bin/pnpm.cjs i",
            "corepack pnpm i",
        ] {
            assert!(is_wrapper(w), "{w}");
        }
        for j in
            ["node test.js", "node node_modules/.bin/vitest run", "/usr/bin/node /app/npm-stats.js", "node22 server.js", "tsc -p .", ""]
        {
            assert!(!is_wrapper(j), "{j}");
        }
    }

    #[test]
    fn selectors_parse_and_bad_ones_are_one_line() {
        let b = Budget::parse("loop.blocked.max_ms[vitest]<=200").unwrap();
        assert_eq!(
            (b.path.join("."), b.scope, b.limit),
            ("loop.blocked.max_ms".to_string(), Some(Scope::Matching("vitest".into())), 200.0)
        );
        assert_eq!(Budget::parse("loop.blocked.max_ms <= 1").unwrap().scope, Some(Scope::Job));
        assert_eq!(Budget::parse("wall_ms<=1").unwrap().scope, None);
        let b = Budget::parse("loop.blocked.max_ms[node --stack-size=900 a.js]<5").unwrap();
        assert_eq!((b.scope, b.cmp), (Some(Scope::Matching("node --stack-size=900 a.js".into())), Cmp::Lt));
        let why = |e: &str| Budget::parse(e).unwrap_err().why;
        for bad in [
            "loop.blocked.max_ms[]<=1",
            "loop.blocked.max_ms[a<=1",
            "loop.blocked.max_msa]<=1",
            "loop.blocked.max_ms[a[b]]<=1",
            "wall_ms[node]<=1",
            "loop[x].blocked.max_ms<=1",
        ] {
            assert!(matches!(why(bad), BudgetError::BadSelector(_) | BudgetError::UnknownKey(_)), "{bad}: {:?}", why(bad));
            let line = Budget::parse(bad).unwrap_err().to_string();
            assert!(!line.contains('\n') && line.starts_with("invalid budget"), "{line}");
        }
        assert!(glob(b"node */server.js", b"node /app/server.js"));
        assert!(!glob(b"node */server.js", b"node /app/server.js --x"));
        assert!(glob(b"*", b""));
        assert!(glob(b"a?c*", b"abcdef"));
        assert!(!glob(&[b'*'; 64].iter().copied().chain(*b"x").collect::<Vec<u8>>(), &[b'a'; 4096]));
    }
}
