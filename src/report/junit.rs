//! JUnit XML for CI systems that read it: one test case per budget, failed
//! when the budget is broken; the text summary as the suite's output.

use super::aggregate::Report;
use super::escape;

pub fn junit(r: &Report) -> String {
    let failures = r.budgets.iter().filter(|b| !b.ok).count();
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    s.push_str(&format!(
        "<testsuites name=\"uvspan\" tests=\"{n}\" failures=\"{failures}\" time=\"{t:.3}\">\n  <testsuite name=\"uvspan budgets\" tests=\"{n}\" failures=\"{failures}\" errors=\"0\" skipped=\"0\" time=\"{t:.3}\">\n",
        n = r.budgets.len(),
        t = r.wall_ms / 1e3
    ));
    for b in &r.budgets {
        let name = escape(&b.expr);
        s.push_str(&format!("    <testcase classname=\"uvspan.budget\" name=\"{name}\" time=\"0\">"));
        if b.ok {
            s.push_str("</testcase>\n");
        } else {
            let worst = b.from.as_ref().map_or_else(String::new, |_| format!(" (worst in {})", b.shown_from()));
            let msg = escape(&format!("budget {} broken: the value is {}{worst}", b.expr, b.shown()));
            s.push_str(&format!("\n      <failure type=\"budget\" message=\"{msg}\">{msg}</failure>\n    </testcase>\n"));
        }
    }
    s.push_str(&format!("    <system-out>{}</system-out>\n  </testsuite>\n</testsuites>\n", escape(&super::summary::text(r))));
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_case_per_budget_escaped() {
        let (a, facts) = super::super::aggregate::tests::sample_agg();
        let mut r = a.report(&facts);
        let b: Vec<_> =
            ["loop.blocked.max_ms<=100", "dns.errors<5"].iter().map(|e| super::super::budget::Budget::parse(e).unwrap()).collect();
        super::super::budget::evaluate(&mut r, &b, &a);
        let x = super::junit(&r);
        assert!(x.contains("tests=\"2\" failures=\"1\""), "{x}");
        assert!(x.contains("name=\"loop.blocked.max_ms&lt;=100\""), "{x}");
        assert!(x.contains("the value is 150.25"), "{x}");
        assert!(x.contains("<testcase classname=\"uvspan.budget\" name=\"dns.errors&lt;5\" time=\"0\"></testcase>"), "{x}");
        assert!(!x.contains("<missing>"), "paths in the output are escaped");
    }
}
