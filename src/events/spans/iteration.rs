//! `uv.loop.iteration` spans: one per slow loop iteration, with a child per
//! phase when the phase probes are on, and (--stacks) what the loop thread
//! was running while it was blocked.

use super::{keys, ms, Builder, Event, Family, KeyValue, Span, GC_EVENT, ITERATION, STACK_EVENT};
use crate::events::decode::{GcRecord, LoopRecord};
use crate::probes::catalog;
use crate::stacks::fold::{self, Blocked};

/// The sampled stacks on the iteration span: the heaviest as
/// `code.stacktrace`, the innermost JS function of it as
/// `uvspan.loop.blocked_by`, time per loop phase, and one span event per
/// distinct stack with its sample count. Events, not child spans: a stack's
/// samples are scattered over the iteration, so a child span would claim
/// an interval it did not occupy. Times per phase and per stack are the
/// iteration's busy time split by their share of the samples (the samples
/// count the thread's CPU time, less than wall time when it waits for a CPU).
fn add_stacks(b: &Builder<'_>, span: &mut Span, blocked: &Blocked, busy: u64, at: u64) {
    let a = &mut span.attributes;
    a.push(KeyValue::new(keys::STACK_SAMPLES, blocked.samples as i64));
    if let Some(t) = blocked.heaviest() {
        a.push(KeyValue::new(keys::STACKTRACE, t));
    }
    if let Some(c) = blocked.culprit() {
        a.push(KeyValue::new(keys::BLOCKED_BY, c.to_string()));
    }
    let total = blocked.samples.max(1) as f64;
    let part = |n: u64| ms(busy) * n as f64 / total;
    for (phase, n) in &blocked.phases {
        a.push(KeyValue::new(format!("uvspan.loop.phase.{phase}_ms"), part(*n)));
    }
    if let Some(n) = &blocked.notice {
        a.push(KeyValue::new(keys::STACKS_NOTICE, n.clone()));
    }
    for (stack, n) in &blocked.stacks {
        span.events.push(Event {
            name: STACK_EVENT,
            time_ns: b.wall(at),
            attributes: vec![
                KeyValue::new(keys::STACKTRACE, fold::render(stack)),
                KeyValue::new(keys::SAMPLES, *n as i64),
                KeyValue::new(keys::SHARE, *n as f64 / total),
                KeyValue::new(keys::SAMPLED_MS, part(*n)),
            ],
        });
    }
}

/// Span events kept per iteration at most (`uvspan.loop.gc_count` counts
/// them all).
pub const GC_EVENTS_MAX: usize = 256;

/// The iteration's garbage collections: their time, their count, and one
/// `v8js.gc` event each (at its start, with its type and duration).
fn add_gcs(b: &Builder<'_>, span: &mut Span, gc_ns: u64, gc_count: u64, gcs: &[GcRecord]) {
    span.attributes.push(KeyValue::new(keys::GC, ms(gc_ns)));
    // The kernel's count: exact whatever the records that reached here.
    span.attributes.push(KeyValue::new(keys::GC_COUNT, gc_count.max(gcs.len() as u64) as i64));
    for g in gcs.iter().take(GC_EVENTS_MAX) {
        span.events.push(Event {
            name: GC_EVENT,
            time_ns: b.wall(g.start_ns),
            attributes: vec![
                KeyValue::new(keys::GC_TYPE, g.gc_type.name()),
                KeyValue::new(keys::GC_DURATION, ms(g.end_ns.saturating_sub(g.start_ns))),
            ],
        });
    }
}

/// One `uv.loop.iteration` span and a child per phase. The iteration is
/// shown from the moment the loop woke up in poll (time blocked before that
/// is an attribute), so its duration is how long the loop was busy.
pub(super) fn spans(b: &Builder<'_>, r: &LoopRecord, out: &mut Vec<Span>) {
    let start = r.wake_ns.unwrap_or(r.start_ns).min(r.end_ns);
    let total = r.end_ns.saturating_sub(r.start_ns);
    let busy = total.saturating_sub(r.poll_wait_ns);
    let mut attrs = vec![
        KeyValue::new(keys::THREAD_ID, i64::from(r.tid)),
        KeyValue::new(keys::BUSY, ms(busy)),
        KeyValue::new(keys::POLL_WAIT, ms(r.poll_wait_ns)),
        KeyValue::new(keys::FAST_BEFORE, r.skipped as i64),
    ];
    if let Some(s) = &r.split {
        attrs.push(KeyValue::new(keys::ON_CPU, ms(s.on_cpu_ns)));
        attrs.push(KeyValue::new(keys::OFF_CPU, ms(s.off_cpu_ns(busy))));
        attrs.push(KeyValue::new(keys::RUNQUEUE, ms(s.runqueue_ns)));
        if let Some(t) = s.throttled_ns {
            attrs.push(KeyValue::new(keys::THROTTLED, ms(t)));
        }
    }
    let mut root = b.span(Family::Iteration, ITERATION, b.parent, start, r.end_ns, attrs);
    if let Some(gc_ns) = r.gc_ns {
        add_gcs(b, &mut root, gc_ns, r.gc_count, &r.gcs);
    }
    if let Some(blocked) = &r.stacks {
        add_stacks(b, &mut root, blocked, busy, r.end_ns);
    }
    let parent = root.span_context.span_id();
    out.push(root);
    for &(i, ps, pe) in &r.phases {
        let phase = catalog::phase(i).map_or("unknown", |p| p.name);
        let ps = ps.max(start);
        out.push(b.span(Family::Phase, format!("uv.loop.{phase}"), parent, ps, pe, vec![KeyValue::new(keys::PHASE, phase)]));
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{attr, build_one};
    use super::super::{Event, Value};
    use crate::events::decode::{LoopRecord, Record};

    fn rec() -> LoopRecord {
        LoopRecord { wake_ns: Some(41_000), poll_wait_ns: 40_000, skipped: 3, ..LoopRecord::test(10, 10, 1_000, 141_000) }
    }

    #[test]
    fn garbage_collections_are_events_with_their_time_summed() {
        use crate::events::decode::{GcRecord, GcType};
        let g = |gc_type, start_ns, end_ns| GcRecord { pid: 10, tid: 10, gc_type, start_ns, end_ns };
        let gcs = vec![g(GcType::Minor, 50_000, 52_000), g(GcType::Major, 60_000, 90_000), g(GcType::WeakCb, 95_000, 95_500)];
        let s = &build_one(&Record::Loop(LoopRecord { gc_ns: Some(32_500), gcs, ..rec() }))[0];
        assert_eq!(attr(s, "uvspan.loop.gc_ms"), Some(&Value::F64(0.0325)));
        assert_eq!(attr(s, "uvspan.loop.gc_count"), Some(&Value::I64(3)));
        let types: Vec<String> = s
            .events
            .iter()
            .filter(|e| e.name == "v8js.gc")
            .map(|e| e.attributes.iter().find(|k| k.key.as_str() == "v8js.gc.type").unwrap().value.to_string())
            .collect();
        assert_eq!(types, ["minor", "major", "weakcb"]);
        let d = s.events[1].attributes.iter().find(|k| k.key.as_str() == "uvspan.gc.duration_ms").unwrap();
        assert_eq!(d.value, Value::F64(0.03));
        // More collections than records reached user space (a thread's
        // pending records are bounded): the count is the kernel's.
        let one = vec![g(GcType::Minor, 50_000, 52_000)];
        let s = &build_one(&Record::Loop(LoopRecord { gc_ns: Some(2_000), gc_count: 5000, gcs: one, ..rec() }))[0];
        assert_eq!(attr(s, "uvspan.loop.gc_count"), Some(&Value::I64(5000)));
        assert_eq!(s.events.iter().filter(|e| e.name == "v8js.gc").count(), 1);
        // GC probed, none in the iteration: 0, said so.
        let s = &build_one(&Record::Loop(LoopRecord { gc_ns: Some(0), ..rec() }))[0];
        assert_eq!(attr(s, "uvspan.loop.gc_ms"), Some(&Value::F64(0.0)));
        // Not probed (a build without the symbols): no attribute at all, not a 0.
        let s = &build_one(&Record::Loop(rec()))[0];
        assert_eq!(attr(s, "uvspan.loop.gc_ms"), None);
        assert!(s.events.is_empty());
    }

    #[test]
    fn the_busy_time_splits_into_on_off_cpu_and_run_queue() {
        use crate::events::decode::LoopSplit;
        // 100 µs busy: 60 on a CPU, 15 waiting for one, the rest off-CPU.
        let r = LoopRecord { split: Some(LoopSplit { on_cpu_ns: 60_000, runqueue_ns: 15_000, throttled_ns: None }), ..rec() };
        let s = &build_one(&Record::Loop(r))[0];
        assert_eq!(attr(s, "uvspan.loop.on_cpu_ms"), Some(&Value::F64(0.06)));
        assert_eq!(attr(s, "uvspan.loop.runqueue_ms"), Some(&Value::F64(0.015)));
        assert_eq!(attr(s, "uvspan.loop.off_cpu_ms"), Some(&Value::F64(0.025)));
        assert_eq!(attr(s, "uvspan.loop.throttled_ms"), None, "no CFS quota: no throttling attribute");
        // Measured a little over the busy time: nothing is off-CPU, never negative.
        let over = LoopSplit { on_cpu_ns: 95_000, runqueue_ns: 10_000, throttled_ns: Some(0) };
        assert_eq!(over.off_cpu_ns(100_000), 0);
        let s = &build_one(&Record::Loop(LoopRecord { split: Some(over), ..rec() }))[0];
        assert_eq!(attr(s, "uvspan.loop.throttled_ms"), Some(&Value::F64(0.0)), "a quota, not throttled: 0");
        // Not measured (a busy part missed, an older record): no split at all.
        let s = &build_one(&Record::Loop(rec()))[0];
        assert!(s.attributes.iter().all(|k| !k.key.as_str().ends_with("cpu_ms")));
    }

    #[test]
    fn starts_at_the_wake_up_busy_time_excludes_the_wait() {
        let spans = build_one(&Record::Loop(rec()));
        assert_eq!(spans.len(), 1, "no phase children without phase probes");
        let s = &spans[0];
        assert_eq!(s.name, "uv.loop.iteration");
        assert_eq!((s.start_ns, s.end_ns), (41_000, 141_000));
        assert_eq!(attr(s, "uvspan.loop.busy_ms"), Some(&Value::F64(0.1)));
        assert_eq!(attr(s, "uvspan.loop.poll_wait_ms"), Some(&Value::F64(0.04)));
        assert_eq!(attr(s, "uvspan.loop.fast_iterations_before"), Some(&Value::I64(3)));
    }

    #[test]
    fn sampled_stacks_go_on_the_span_and_its_events() {
        use crate::stacks::fold::{Folder, Frame};
        let stack = |leaf: &str| {
            vec![
                Frame::js(leaf, Some("/app/blocker.js:3:10".into())),
                Frame::js("onTimer", Some("/app/blocker.js:9:1".into())),
                Frame::native("uv__run_timers", Some("node".into())),
                Frame::native("uv_run", Some("node".into())),
            ]
        };
        let mut f = Folder::default();
        for _ in 0..3 {
            f.add(stack("parseBigPayload"));
        }
        f.add(stack(""));
        let r = LoopRecord { stacks: Some(f.finish(1_000_000)), ..rec() };
        let spans = build_one(&Record::Loop(r));
        let s = &spans[0];
        assert_eq!(attr(s, "uvspan.loop.stack_samples"), Some(&Value::I64(4)));
        assert_eq!(attr(s, "uvspan.loop.blocked_by"), Some(&Value::from("parseBigPayload (/app/blocker.js:3:10)")));
        assert_eq!(
            attr(s, "code.stacktrace"),
            Some(&Value::from(
                "parseBigPayload (/app/blocker.js:3:10)\nonTimer (/app/blocker.js:9:1)\nuv__run_timers (node)\nuv_run (node)"
            ))
        );
        assert_eq!(attr(s, "uvspan.loop.phase.timers_ms"), Some(&Value::F64(0.1)), "the busy time, all in timers");
        let ev: Vec<_> = s.events.iter().collect();
        assert_eq!(ev.len(), 2, "one event per distinct stack");
        assert!(ev.iter().all(|e| e.name == "uvspan.loop.stack"));
        let samples = |e: &Event| e.attributes.iter().find(|k| k.key.as_str() == "uvspan.stack.samples").map(|k| k.value.clone());
        assert_eq!(samples(ev[0]), Some(Value::I64(3)));
        assert_eq!(samples(ev[1]), Some(Value::I64(1)));
        let second = ev[1].attributes.iter().find(|k| k.key.as_str() == "code.stacktrace").unwrap();
        assert!(second.value.as_str().starts_with("(anonymous) (/app/blocker.js:3:10)"));
    }

    #[test]
    fn without_samples_the_span_is_unchanged() {
        let spans = build_one(&Record::Loop(rec()));
        assert_eq!(attr(&spans[0], "code.stacktrace"), None);
        assert!(spans[0].events.is_empty());
    }

    #[test]
    fn phase_children_are_named_from_the_catalog_and_clipped_to_the_wake_up() {
        let r = LoopRecord { phases: vec![(0, 1_000, 100_000), (2, 100_000, 141_000)], ..rec() };
        let spans = build_one(&Record::Loop(r));
        let root = spans[0].span_context.span_id();
        let names: Vec<&str> = spans[1..].iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names, ["uv.loop.poll", "uv.loop.timers"]);
        assert!(spans[1..].iter().all(|s| s.parent_span_id == root && s.span_context.trace_id() == spans[0].span_context.trace_id()));
        assert_eq!(spans[1].start_ns, 41_000, "the poll phase starts where the iteration span does");
        assert_eq!(attr(&spans[2], "uvspan.loop.phase"), Some(&Value::from("timers")));
    }
}
