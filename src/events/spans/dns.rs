//! `dns.getaddrinfo` spans: one per finished lookup.

use opentelemetry::trace::SpanKind;

use super::{fail, keys, threadpool, Builder, Family, KeyValue, Span, Value, DNS};
use crate::events::decode::DnsRecord;

pub(super) fn span(b: &Builder<'_>, mut r: DnsRecord) -> Span {
    let mut answers: Vec<String> = Vec::new();
    for a in &r.answers {
        let s = a.to_string();
        if !answers.contains(&s) {
            answers.push(s);
        }
    }
    // Sized for all it may get (threadpool and error attributes too).
    let mut attrs = Vec::with_capacity(10);
    attrs.extend([
        KeyValue::new(keys::DNS_NAME, r.host),
        KeyValue::new(keys::THREAD_ID, i64::from(r.op.tid)),
        KeyValue::new(keys::SYNC, r.op.sync),
    ]);
    if !answers.is_empty() {
        attrs.push(KeyValue::new(keys::DNS_ANSWERS, Value::Strings(answers)));
    }
    if let Some(at) = r.op.ended_at.filter(|&at| at != "libuv_done") {
        attrs.push(KeyValue::new(keys::ENDED_AT, at));
    }
    if let Some(st) = r.op.stack.take() {
        attrs.push(KeyValue::new(keys::STACKTRACE, st));
    }
    let mut span = b.span(Family::Dns, DNS, b.parent, r.op.start_ns, r.op.end_ns, attrs);
    span.span_kind = SpanKind::Client;
    threadpool(b, &mut span, &r.op);
    if r.retcode != 0 {
        fail(&mut span, i64::from(r.retcode));
    }
    span
}

#[cfg(test)]
mod tests {
    use super::super::Value;
    use opentelemetry::trace::{SpanKind, Status};

    use super::super::testing::{attr, build_one};
    use crate::events::decode::{DnsRecord, OpRecord, Record};

    fn rec() -> DnsRecord {
        DnsRecord {
            op: OpRecord::test(10, 11, 100, 900),
            retcode: 0,
            host: "localhost".into(),
            answers: vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap(), "127.0.0.1".parse().unwrap()],
        }
    }

    #[test]
    fn answers_deduplicated_client_kind() {
        let s = &build_one(&Record::Dns(rec()))[0];
        assert_eq!(s.name, "dns.getaddrinfo");
        assert_eq!(s.span_kind, SpanKind::Client);
        assert_eq!(attr(s, "dns.question.name"), Some(&Value::from("localhost")));
        let want = Value::Strings(vec!["127.0.0.1".into(), "::1".into()]);
        assert_eq!(attr(s, "dns.answers"), Some(&want));
        assert_eq!(s.status, Status::Unset);
    }

    #[test]
    fn failure_is_an_eai_error_and_the_fallback_end_is_said() {
        let mut r = DnsRecord { retcode: -3008, answers: vec![], ..rec() };
        r.op.ended_at = Some("uv_freeaddrinfo");
        let s = &build_one(&Record::Dns(r))[0];
        assert_eq!(attr(s, "error.type"), Some(&Value::from("EAI_NONAME")));
        assert!(matches!(&s.status, Status::Error { .. }));
        assert_eq!(attr(s, "dns.answers"), None);
        assert_eq!(attr(s, "uvspan.ended_at"), Some(&Value::from("uv_freeaddrinfo")));
    }
}
