//! `uv.loop.iteration` spans: one per slow loop iteration, with a child per
//! phase when the phase probes are on.

use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::SpanData;

use super::{keys, ms, Builder, ITERATION};
use crate::events::decode::LoopRecord;
use crate::probes::catalog;

/// One `uv.loop.iteration` span and a child per phase. The iteration is
/// shown from the moment the loop woke up in poll (time blocked before that
/// is an attribute), so its duration is how long the loop was busy.
pub(super) fn spans(b: &Builder<'_>, r: &LoopRecord) -> Vec<SpanData> {
    let start = r.wake_ns.unwrap_or(r.start_ns).min(r.end_ns);
    let total = r.end_ns.saturating_sub(r.start_ns);
    let busy = total.saturating_sub(r.poll_wait_ns);
    let attrs = vec![
        KeyValue::new(keys::THREAD_ID, i64::from(r.tid)),
        KeyValue::new(keys::BUSY, ms(busy)),
        KeyValue::new(keys::POLL_WAIT, ms(r.poll_wait_ns)),
        KeyValue::new(keys::FAST_BEFORE, r.skipped as i64),
    ];
    let root = b.span(ITERATION, b.parent, start, r.end_ns, attrs);
    let parent = root.span_context.span_id();
    let mut out = vec![root];
    for &(i, ps, pe) in &r.phases {
        let phase = catalog::phase(i).map_or("unknown", |p| p.name);
        let ps = ps.max(start);
        out.push(b.span(
            format!("uv.loop.{phase}"),
            parent,
            ps,
            pe,
            vec![KeyValue::new(keys::PHASE, phase)],
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use opentelemetry::Value;

    use super::super::testing::{attr, build_one, nanos};
    use crate::events::decode::{LoopRecord, Record};

    fn rec() -> LoopRecord {
        LoopRecord { pid: 10, tid: 10, start_ns: 1_000, wake_ns: Some(41_000), end_ns: 141_000, poll_wait_ns: 40_000, skipped: 3, phases: vec![] }
    }

    #[test]
    fn starts_at_the_wake_up_busy_time_excludes_the_wait() {
        let spans = build_one(&Record::Loop(rec()));
        assert_eq!(spans.len(), 1, "no phase children without phase probes");
        let s = &spans[0];
        assert_eq!(s.name, "uv.loop.iteration");
        assert_eq!((nanos(s.start_time), nanos(s.end_time)), (41_000, 141_000));
        assert_eq!(attr(s, "uvspan.loop.busy_ms"), Some(&Value::F64(0.1)));
        assert_eq!(attr(s, "uvspan.loop.poll_wait_ms"), Some(&Value::F64(0.04)));
        assert_eq!(attr(s, "uvspan.loop.fast_iterations_before"), Some(&Value::I64(3)));
    }

    #[test]
    fn phase_children_are_named_from_the_catalog_and_clipped_to_the_wake_up() {
        let r = LoopRecord { phases: vec![(0, 1_000, 100_000), (2, 100_000, 141_000)], ..rec() };
        let spans = build_one(&Record::Loop(r));
        let root = spans[0].span_context.span_id();
        let names: Vec<&str> = spans[1..].iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names, ["uv.loop.poll", "uv.loop.timers"]);
        assert!(spans[1..].iter().all(|s| s.parent_span_id == root && s.span_context.trace_id() == spans[0].span_context.trace_id()));
        assert_eq!(nanos(spans[1].start_time), 41_000, "the poll phase starts where the iteration span does");
        assert_eq!(attr(&spans[2], "uvspan.loop.phase"), Some(&Value::from("timers")));
    }
}
