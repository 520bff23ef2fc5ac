//! Budgets: `path<=number` over the report, e.g. `loop.blocked.max_ms<=100`,
//! `fs.sync_on_loop.count<50`, `dns.count==0`, `fs.by_op.stat.p99_ms<=2`,
//! `loop.off_cpu.max_ms<=20` (the split of the blocked iterations:
//! `loop.{on_cpu,off_cpu,runqueue,throttled}.{max_ms,total_ms}`), `loop.gc.max_ms<=50`
//! (V8 garbage collection in the blocked iterations).
//! A path is checked against the report's shape when parsed, so a typo
//! stops the run before it starts.

use std::fmt;

use serde_json::Value;

use super::aggregate::{BudgetResult, Report};

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
        };
        write!(
            f,
            "invalid budget {:?}: {why}; write e.g. loop.blocked.max_ms<=100, fs.sync_on_loop.count<50, dns.errors==0, fs.by_op.stat.p99_ms<=2",
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
        let at = expr.find(['<', '>', '=']).ok_or_else(|| err(BudgetError::NoComparison))?;
        let (path, rest) = expr.split_at(at);
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
        match lookup(&shape(), &probe) {
            None => Err(err(BudgetError::UnknownKey(shown))),
            Some(Value::Number(_)) => Ok(Budget { expr: expr.trim().to_string(), path, cmp, limit }),
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

    pub fn check(&self, report: &Value) -> BudgetResult {
        let value = self.value(report);
        BudgetResult { expr: self.expr.clone(), value, ok: value.is_some_and(|v| self.cmp.holds(v, self.limit)) }
    }
}

fn lookup<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k.as_str()))
}

/// Checks every budget against the report and records the results in it.
pub fn evaluate(report: &mut Report, budgets: &[Budget]) {
    let json = serde_json::to_value(&*report).unwrap_or(Value::Null);
    report.budgets = budgets.iter().map(|b| b.check(&json)).collect();
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
        let mut r = super::super::aggregate::tests::sample();
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
        evaluate(&mut r, &budgets);
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
        let mut r = super::super::aggregate::Aggregate::default().report(&Default::default());
        assert_eq!(r.total.event_loop.gc, None);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["total"]["loop"]["gc"], Value::Null, "{json}");
        evaluate(&mut r, &[Budget::parse("loop.gc.max_ms<=20").unwrap(), Budget::parse("dns.count==0").unwrap()]);
        let got: Vec<(Option<f64>, bool, String)> = r.budgets.iter().map(|b| (b.value, b.ok, b.shown())).collect();
        assert_eq!(got, [(None, false, "not measured".into()), (Some(0.0), true, "0".into())]);
    }
}
