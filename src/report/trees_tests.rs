use opentelemetry::trace::{SpanContext, TraceFlags, TraceId, TraceState};

use super::super::aggregate::tests::{fs, iteration, span, t0};
use super::*;
use crate::events::spans::{KeyValue, DNS};

/// `s` with span id `id` under `parent` (0: a root).
fn ids(mut s: Span, id: u64, parent: u64) -> Span {
    s.span_context = SpanContext::new(TraceId::from(7u128), SpanId::from(id), TraceFlags::SAMPLED, false, TraceState::NONE);
    s.parent_span_id = SpanId::from(parent);
    s
}

fn root(id: u64, at: f64, ms: f64, code: i64) -> Span {
    let attrs = vec![
        KeyValue::new("process.command_line", "node cli.js /tmp/d".to_string()),
        KeyValue::new(task_keys::TASKS, 3i64),
        KeyValue::new("process.exit.code", code),
    ];
    let mut s = ids(span(Family::Process, "node", at, ms, attrs, (code != 0).then_some("exit code 3")), id, 0);
    s.name = "node".into();
    s
}

fn task(kind: &'static str, id: u64, parent: u64, at: f64, ms: f64) -> Span {
    ids(span(Family::Task, kind, at, ms, vec![KeyValue::new(task_keys::KIND, kind)], None), id, parent)
}

fn startup(id: u64, parent: u64, at: f64, ms: f64) -> Span {
    ids(span(Family::Task, "startup", at, ms, vec![KeyValue::new(task_keys::OPERATIONS, 3i64)], None), id, parent)
}

fn server(id: u64, at: f64, ms: f64, status: i64) -> Span {
    let attrs = vec![KeyValue::new("url.path", "/r/1".to_string()), KeyValue::new("http.response.status_code", status)];
    let mut s = ids(span(Family::Http, "GET", at, ms, attrs, None), id, 0);
    s.span_kind = SpanKind::Server;
    s
}

fn client(id: u64, parent: u64, at: f64, ms: f64) -> Span {
    let attrs = vec![KeyValue::new("server.address", "api.local".to_string()), KeyValue::new("url.path", "/v1".to_string())];
    let mut s = ids(span(Family::Http, "GET", at, ms, attrs, None), id, parent);
    s.span_kind = SpanKind::Client;
    s
}

/// A CLI run as uvspan sends it: the start-up's operations before the
/// start-up span (a hold sent after 5 s), tasks before their operations,
/// the root last; a slow iteration with its phases; a request beside it.
fn cli_spans() -> Vec<Span> {
    let mut v = vec![
        ids(fs("fs.stat", 1.0, 0.05, 100, true, "/srv/cli.js", None), 11, 10),
        ids(fs("fs.open", 1.2, 0.03, 100, true, "/srv/package.json", Some("ENOENT")), 12, 10),
        ids(fs("fs.stat", 2.0, 0.02, 100, true, "/tmp/d/s-0", None), 13, 10),
    ];
    for (i, at) in [150.0, 180.0, 210.0].into_iter().enumerate() {
        let id = 20 + i as u64 * 2;
        v.push(task("timers", id, 1, at, 0.5 + i as f64));
        let mut stat = ids(fs("fs.stat", at + 0.1, 0.3, 100, false, &format!("/tmp/d/t-{i}"), None), id + 1, id);
        stat.attributes.push(KeyValue::new(keys::ERROR_TYPE, "ENOENT"));
        v.push(stat);
    }
    v.push(ids(iteration(100.0, 40.0, 100, 3, Some("Error\n    at busy (/srv/cli.js:9:3)")), 30, 1));
    v.push(ids(span(Family::Phase, "uv.loop.timers", 100.0, 39.0, vec![], None), 31, 30));
    v.push(server(40, 120.0, 5.0, 200));
    v.push(ids(fs("fs.stat", 121.0, 0.2, 100, false, "/srv/req-1", None), 41, 40));
    v.push(client(42, 40, 122.0, 2.0));
    v.push(ids(span(Family::Dns, DNS, 121.5, 0.4, vec![KeyValue::new(keys::DNS_NAME, "api.local".to_string())], None), 43, 40));
    v.push(startup(10, 1, 0.0, 120.0));
    v.push(root(1, 0.0, 260.0, 3));
    // A root-level operation (its own trace): in no tree.
    v.push(fs("fs.stat", 3.0, 0.1, 100, true, "/own-trace", None));
    v
}

fn fold(spans: &[Span]) -> Trees {
    let mut t = Trees::default();
    for s in spans {
        t.add(100, s, t0());
    }
    t
}

#[test]
fn golden_tree() {
    let got = fold(&cli_spans()).trace(100, t0()).expect("a tree");
    crate::report::tests::golden("trees.json", &(serde_json::to_string_pretty(&got).unwrap() + "\n"));
}

#[test]
fn parents_and_order() {
    let t = fold(&cli_spans()).trace(100, t0()).unwrap();
    let r = t.root.as_ref().unwrap();
    assert_eq!(
        (r.name.as_str(), r.command_line.as_str(), r.exit_code, r.error.as_deref()),
        ("node", "node cli.js /tmp/d", Some(3), Some("exit code 3"))
    );
    assert_eq!((r.duration_ms, r.work.operations), (260.0, 0), "nothing directly under the root");
    let s = t.startup.as_ref().unwrap();
    assert_eq!((s.kind.as_str(), s.duration_ms, s.work.operations, s.work.errors, s.work.more_ops), ("startup", 120.0, 3, 1, 0));
    let paths: Vec<_> = s.work.ops.iter().map(|o| o.target.as_deref().unwrap()).collect();
    assert_eq!(paths, ["/srv/cli.js", "/srv/package.json", "/tmp/d/s-0"], "in start order; the root-level op is not here");
    let kinds: Vec<(&str, f64)> = t.children.iter().map(|c| (c.kind.as_str(), c.start_ms)).collect();
    assert_eq!(kinds, [("iteration", 100.0), ("timers", 150.0), ("timers", 180.0), ("timers", 210.0)], "by start");
    for (i, c) in t.children[1..].iter().enumerate() {
        assert_eq!(c.work.ops.len(), 1);
        let o = &c.work.ops[0];
        assert_eq!(
            (o.name.as_str(), o.target.clone(), o.error.as_deref(), o.failed),
            ("fs.stat", Some(format!("/tmp/d/t-{i}")), Some("ENOENT"), false)
        );
    }
    let it = &t.children[0];
    assert_eq!(it.detail.as_deref(), Some("busy (/srv/cli.js:9:3)"));
    assert_eq!(it.work.ops[0].name, "uv.loop.timers", "phases are an iteration's operations");
    assert_eq!((t.tasks, t.more_tasks, t.iterations, t.more_iterations), (3, 0, 1, 0));
    let req = &t.requests[0];
    assert_eq!((req.name.as_str(), req.detail.as_deref(), req.work.operations), ("GET /r/1", Some("200"), 3));
    let targets: Vec<_> = req.work.ops.iter().map(|o| o.target.as_deref().unwrap()).collect();
    assert_eq!(targets, ["/srv/req-1", "api.local", "api.local/v1"]);
}

/// Whatever order the batches bring spans in, the tree is the same.
#[test]
fn any_arrival_order_gives_the_same_tree() {
    let spans = cli_spans();
    let want = fold(&spans).trace(100, t0());
    let mut rev = spans.clone();
    rev.reverse();
    assert_eq!(fold(&rev).trace(100, t0()), want);
    let mut rot = spans;
    rot.rotate_left(7);
    assert_eq!(fold(&rot).trace(100, t0()), want);
}

#[test]
fn bounded_with_counts_of_what_is_not_listed() {
    let mut t = Trees::default();
    let n_tasks = TOP_TASKS as u64 + 10;
    let n_ops = TOP_OPS as u64 + 7;
    // Tasks 1..=30 ms long, each with 57 operations 1..=57 µs long; half
    // of the tasks' operations come before their task's span.
    for i in 0..n_tasks {
        let id = 1000 * (i + 1);
        let ops: Vec<Span> = (0..n_ops)
            .map(|j| ids(fs("fs.stat", i as f64 * 40.0 + j as f64 * 0.01, (j + 1) as f64 * 1e-3, 100, false, "/p", None), id + j + 1, id))
            .collect();
        let (before, after) = ops.split_at(if i % 2 == 0 { ops.len() } else { 0 });
        for s in before {
            t.add(100, s, t0());
        }
        t.add(100, &task("io", id, 1, i as f64 * 40.0, (i + 1) as f64), t0());
        for s in after {
            t.add(100, s, t0());
        }
    }
    // A late operation of a task not listed (the shortest): not kept.
    t.add(100, &ids(fs("fs.stat", 5000.0, 9.0, 100, false, "/late", None), 99, 1000), t0());
    assert_eq!(t.groups.len(), TOP_TASKS, "operations kept only for the listed tasks");
    let tr = t.trace(100, t0()).unwrap();
    assert!(tr.root.is_none() && tr.startup.is_none());
    assert_eq!((tr.tasks, tr.more_tasks, tr.children.len()), (n_tasks, 10, TOP_TASKS));
    let long: Vec<f64> = tr.children.iter().map(|c| c.duration_ms).collect();
    assert_eq!(long, (11..=n_tasks).map(|m| m as f64).collect::<Vec<_>>(), "the longest, in start order");
    for c in &tr.children {
        assert_eq!((c.work.operations, c.work.ops.len() as u64, c.work.more_ops), (n_ops, TOP_OPS as u64, 7));
        let d: Vec<f64> = c.work.ops.iter().map(|o| o.duration_ms).collect();
        assert_eq!(d, (8..=n_ops).map(|u| round(u as f64 * 1e-3)).collect::<Vec<_>>(), "the longest operations, in start order");
    }
}

#[test]
fn nothing_of_a_tree_gives_none() {
    let mut t = Trees::default();
    t.add(5, &fs("fs.stat", 1.0, 1.0, 5, true, "/own-trace", None), t0());
    assert_eq!(t.trace(5, t0()), None);
    assert_eq!(t.trace(6, t0()), None);
}

#[test]
fn top_n_keeps_the_largest_and_the_earlier_on_ties() {
    let mut top = TopN::new(2);
    assert_eq!(top.push(5, 'a'), None);
    assert_eq!(top.push(5, 'b'), None);
    assert_eq!(top.push(5, 'c'), Some('c'), "a tie does not push out");
    assert_eq!(top.push(6, 'd'), Some('b'), "the later of the smallest goes");
    assert_eq!(top.push(1, 'e'), Some('e'));
    assert_eq!(top.iter().copied().collect::<String>(), "ad");
}
