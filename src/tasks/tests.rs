use opentelemetry::trace::{SpanId, Status};

use super::*;
use crate::events::clock::Clock;
use crate::events::decode::OpRecord;
use crate::events::spans::{Family, SequentialIds, Value};
use crate::tasks::cause::make;

/// A stat of process 7 (thread 7) with `cause`.
fn stat(cause: u64, start: u64, end: u64) -> Record {
    Record::Fs(FsRecord {
        op: OpRecord { cause, ..OpRecord::test(7, 7, start, end) },
        op_id: 4,
        result: 0,
        fd: None,
        path: Some("/x".into()),
        path2: None,
    })
}

/// `steps` on a tracker: the spans they made ready, in order.
fn run(per: TracePer, sampler: Sampler, steps: impl FnOnce(&mut Tasks, &SpanContextSource<'_>, &mut Ready)) -> (Vec<Span>, TaskStats) {
    run_with(per, sampler, StartupOps::Spans, steps)
}

fn run_with(
    per: TracePer,
    sampler: Sampler,
    ops: StartupOps,
    steps: impl FnOnce(&mut Tasks, &SpanContextSource<'_>, &mut Ready),
) -> (Vec<Span>, TaskStats) {
    let ids = SequentialIds::default();
    let src = SpanContextSource { clock: Clock::with_offset(0), ids: &ids, sampler };
    let mut t = Tasks::new(per, true).startup_ops(ops);
    let mut ready = Ready::default();
    steps(&mut t, &src, &mut ready);
    (ready.into_values().flatten().collect(), t.stats)
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn ms(n: u64) -> u64 {
    n * 1_000_000
}

#[test]
fn each_tick_is_a_trace_with_its_chain_under_it() {
    let (spans, stats) = run(TracePer::Task, Sampler::default(), |t, src, ready| {
        for tick in 0..3u64 {
            let at = ms(1_000 + tick * 150);
            let c = make(TaskKind::Timers, at, 1);
            // The tick's stat, then the readFile its callback started.
            assert!(t.work(stat(c, at + 10, at + 20), src, ready).is_none());
            assert!(t.work(stat(c, at + 30, at + 40), src, ready).is_none());
        }
        assert_eq!(t.open(), 3);
        t.expire(ms(1_300) + QUIET_NS, src, ready);
        assert_eq!(t.open(), 1, "the last tick is not quiet yet");
        t.finish_all(ms(5_000), src, ready);
    });
    let roots = named(&spans, "timers");
    assert_eq!(roots.len(), 3);
    assert_eq!(stats.tasks, 3);
    for r in &roots {
        assert_eq!(r.parent_span_id, SpanId::INVALID);
        assert_eq!(r.family, Family::Task);
        assert_eq!(r.attr("uvspan.task.operations"), Some(&Value::I64(2)));
        let kids: Vec<_> = spans.iter().filter(|s| s.parent_span_id == r.span_context.span_id()).collect();
        assert_eq!(kids.len(), 2);
        assert!(kids.iter().all(|k| k.span_context.trace_id() == r.span_context.trace_id()));
        assert!(kids.iter().all(|k| k.start_ns >= r.start_ns && k.end_ns <= r.end_ns), "the task spans its work");
    }
    let traces: std::collections::HashSet<_> = roots.iter().map(|r| r.span_context.trace_id()).collect();
    assert_eq!(traces.len(), 3, "ticks in separate traces");
}

#[test]
fn work_outside_tasks_is_given_back_per_task_and_late_work_joins() {
    let (spans, _) = run(TracePer::Task, Sampler::default(), |t, src, ready| {
        assert!(t.work(stat(0, 10, 20), src, ready).is_some(), "no cause, no process trace: its own trace");
        let c = make(TaskKind::Io, 100, 3);
        t.work(stat(c, 110, 120), src, ready);
        t.expire(120 + QUIET_NS, src, ready);
        assert!(t.work(stat(c, 130 + QUIET_NS, 140 + QUIET_NS), src, ready).is_none(), "late work of a finished task");
    });
    assert_eq!(spans.len(), 3);
    let io = named(&spans, "io")[0];
    assert_eq!(spans.iter().filter(|s| s.parent_span_id == io.span_context.span_id()).count(), 2);
}

#[test]
fn unsampled_tasks_send_nothing_and_are_counted() {
    let (spans, stats) = run(
        TracePer::Task,
        Sampler::from_env(&|k| (k == "OTEL_TRACES_SAMPLER").then(|| "always_off".to_string())).unwrap(),
        |t, src, ready| {
            let c = make(TaskKind::Immediate, 100, 0);
            t.work(stat(c, 110, 120), src, ready);
            t.finish_all(1_000, src, ready);
            assert!(t.work(stat(c, 130, 140), src, ready).is_none(), "its late work is not sent either");
        },
    );
    assert!(spans.is_empty());
    assert_eq!((stats.tasks, stats.unsampled), (1, 1));
}

#[test]
fn a_process_is_one_trace_with_startup_and_tasks_under_it() {
    let (spans, stats) = run(TracePer::Process, Sampler::default(), |t, src, ready| {
        t.started(7, 5);
        t.process(7, &["/usr/bin/node".into(), "cli.js".into()], 1, src.ids, src.sampler);
        for i in 0..50 {
            assert!(t.work(stat(0, 10 + i * 10, 15 + i * 10), src, ready).is_none());
        }
        for tick in 0..3u64 {
            let c = make(TaskKind::Timers, ms(10 + tick), 0);
            t.work(stat(c, ms(10 + tick) + 5, ms(10 + tick) + 9), src, ready);
        }
        t.expire(ms(20) + QUIET_NS, src, ready);
        assert!(ready.values().all(Vec::is_empty), "held until the process exits");
        t.exited(7, ms(700), Some(1 << 8), src, ready);
    });
    assert_eq!(stats.processes, 1);
    let trace = spans[0].span_context.trace_id();
    assert!(spans.iter().all(|s| s.span_context.trace_id() == trace), "one trace");
    let root = named(&spans, "node")[0];
    assert_eq!(root.parent_span_id, SpanId::INVALID);
    assert_eq!(root.attr("process.command_line"), Some(&Value::String("/usr/bin/node cli.js".into())));
    assert_eq!(root.attr("process.exit.code"), Some(&Value::I64(1)));
    assert_eq!(root.attr("uvspan.process.tasks"), Some(&Value::I64(3)));
    assert!(matches!(root.status, Status::Error { .. }));
    assert_eq!(root.start_ns, 5, "from its exec");
    let startup = named(&spans, "startup")[0];
    assert_eq!(startup.parent_span_id, root.span_context.span_id());
    assert_eq!(spans.iter().filter(|s| s.parent_span_id == startup.span_context.span_id()).count(), 50);
    let ticks = named(&spans, "timers");
    assert_eq!(ticks.len(), 3);
    assert!(ticks.iter().all(|s| s.parent_span_id == root.span_context.span_id()));
    let ids: Vec<SpanId> = spans.iter().map(|s| s.span_context.span_id()).collect();
    assert!(spans.iter().all(|s| s.parent_span_id == SpanId::INVALID || ids.contains(&s.parent_span_id)), "every parent exported");
    assert_eq!(spans.len(), 1 + 1 + 50 + 3 * 2);
}

#[test]
fn a_process_that_did_nothing_traced_leaves_no_trace_and_a_signal_is_an_error() {
    let (spans, _) = run(TracePer::Process, Sampler::default(), |t, src, ready| {
        t.process(8, &["sh".into()], 1, src.ids, src.sampler);
        t.exited(8, 100, Some(0), src, ready);
        t.process(7, &["node".into()], 1, src.ids, src.sampler);
        t.work(stat(0, 10, 20), src, ready);
        t.exited(7, 100, Some(9), src, ready);
    });
    assert_eq!(spans.len(), 3, "node's root, start-up, stat; nothing of sh");
    let root = named(&spans, "node")[0];
    assert_eq!(root.attr("uvspan.process.signal"), Some(&Value::I64(9)));
    assert!(matches!(root.status, Status::Error { .. }));
}

#[test]
fn a_long_lived_process_sends_what_it_held_after_a_while() {
    let (spans, _) = run(TracePer::Process, Sampler::default(), |t, src, ready| {
        t.process(7, &["node".into()], 1, src.ids, src.sampler);
        t.work(stat(0, 10, 20), src, ready);
        t.expire(20 + PROCESS_HELD_NS, src, ready);
        assert_eq!(ready.values().map(Vec::len).sum::<usize>(), 1, "the stat went out, its parents come at exit");
        t.finish_all(ms(10_000), src, ready);
    });
    assert_eq!(spans.len(), 3);
}

#[test]
fn work_before_the_loop_ran_is_the_startup_and_after_it_main_with_sync_fs_summarised() {
    let (spans, stats) = run_with(TracePer::Process, Sampler::default(), StartupOps::Summary, |t, src, ready| {
        t.process(7, &["node".into()], 1, src.ids, src.sampler);
        for i in 0..10u64 {
            t.work(sync_stat(10 + i * 10, 15 + i * 10 + i, &format!("/m/{i}"), if i % 2 == 0 { -2 } else { 0 }), src, ready);
        }
        // Async work started before the loop ran (its callback after).
        t.work(stat(0, 150, 900), src, ready);
        // The loop first ran at 500: what starts after is main's.
        t.work(stat(0, 600, 700), src, ready);
        t.work(sync_stat(800, 850, "/lazy", 0), src, ready);
        t.loop_started(7, 500);
        t.exited(7, 1_000, Some(0), src, ready);
    });
    assert_eq!(stats.summarised, 11);
    let startup = named(&spans, "startup")[0];
    let main = named(&spans, "main")[0];
    assert_eq!(startup.attr("uvspan.task.operations"), Some(&Value::I64(11)));
    assert_eq!(startup.attr("uvspan.sync_fs.count"), Some(&Value::I64(10)));
    assert_eq!(startup.attr("uvspan.sync_fs.errors"), Some(&Value::I64(5)));
    let Some(Value::Strings(slowest)) = startup.attr("uvspan.sync_fs.slowest") else { panic!("slowest") };
    assert_eq!(slowest.len(), 5);
    assert!(slowest[0].ends_with("fs.stat /m/9") && slowest[4].ends_with("fs.stat /m/5"), "{slowest:?}");
    assert_eq!((startup.start_ns, startup.end_ns), (1, 900), "from the process's start over its work");
    assert_eq!(main.attr("uvspan.sync_fs.count"), Some(&Value::I64(1)));
    assert_eq!(main.start_ns, 600);
    let under = |p: &Span| spans.iter().filter(|s| s.parent_span_id == p.span_context.span_id()).count();
    assert_eq!((under(startup), under(main)), (1, 1), "the async stats are spans");
}

/// A sync stat of `path` with `result`.
fn sync_stat(start: u64, end: u64, path: &str, result: i64) -> Record {
    Record::Fs(FsRecord {
        op: OpRecord { sync: true, ..OpRecord::test(7, 7, start, end) },
        op_id: 4,
        result,
        fd: None,
        path: Some(path.into()),
        path2: None,
    })
}

/// A task's HTTP/1 calls: a CLIENT span each under the task, with the
/// status of the response parsed on its connection; the task is not over
/// while a call waits for its response (up to CALL_WAIT_NS), and the
/// calls are handed to the metrics, answered or not.
#[test]
fn a_tasks_calls_are_client_spans_under_it() {
    use crate::events::decode::{HttpRecord, HttpWhat};
    use crate::requests::testing::http;
    let rec = |what, cause, conn, ts, data: &str| HttpRecord { peer: None, local_port: None, ..http(what, cause, conn, ts, data) };
    let mut calls = Vec::new();
    let (spans, _) = run(TracePer::Task, Sampler::default(), |t, src, ready| {
        t.finished_calls = Some(Vec::new());
        let c = make(TaskKind::Timers, ms(1_000), 1);
        t.http(&rec(HttpWhat::Write, c, 0xa, ms(1_001), "GET /a HTTP/1.1\r\nHost: up:81\r\n\r\n"), src, ready);
        t.http(&rec(HttpWhat::Write, c, 0xb, ms(1_002), "GET /b HTTP/1.1\r\nHost: up:81\r\n\r\n"), src, ready);
        t.http(&rec(HttpWhat::Response, c, 0xb, ms(1_003), "HTTP/1.1 503 X\r\n\r\n"), src, ready);
        t.expire(ms(1_003) + QUIET_NS, src, ready);
        assert_eq!(t.open(), 1, "waiting for /a's response");
        t.http(&rec(HttpWhat::Response, c, 0xa, ms(1_600), "HTTP/1.1 200 OK\r\n\r\n"), src, ready);
        assert!(t.work(stat(c, ms(1_601), ms(1_602)), src, ready).is_none());
        t.expire(ms(1_602) + QUIET_NS, src, ready);
        assert_eq!(t.open(), 0);
        calls = t.finished_calls.take().unwrap_or_default();
    });
    let task = &named(&spans, "timers")[0];
    let clients: Vec<&Span> = spans.iter().filter(|s| s.span_kind == opentelemetry::trace::SpanKind::Client).collect();
    assert_eq!(clients.len(), 2);
    for (c, path, code) in [(clients[0], "/a", 200), (clients[1], "/b", 503)] {
        assert_eq!(c.parent_span_id, task.span_context.span_id());
        assert_eq!(c.attributes.iter().find(|kv| kv.key.as_str() == "url.path").map(|kv| kv.value.clone()), Some(Value::from(path)));
        let status = c.attributes.iter().find(|kv| kv.key.as_str() == "http.response.status_code").map(|kv| kv.value.clone());
        assert_eq!(status, Some(Value::I64(code)), "{path}");
    }
    assert_eq!(named(&spans, "fs.stat")[0].parent_span_id, task.span_context.span_id());
    assert_eq!(calls.len(), 2);
    assert!(calls.iter().all(|(pid, c)| *pid == 7 && c.server == Some(("up".into(), 81))));
}

/// A sync fs call `name` (its catalog row) of process 7 with `cause`, on
/// `path` or `fd`, with `result`.
fn fs_op(name: &str, cause: u64, (start, end): (u64, u64), path: Option<&str>, fd: Option<i32>, result: i64) -> Record {
    let op_id = crate::probes::catalog::FS_OPS.iter().position(|o| o.span == name).expect("an fs op") as u8;
    Record::Fs(FsRecord {
        op: OpRecord { sync: true, cause, ..OpRecord::test(7, 7, start, end) },
        op_id,
        result,
        fd,
        path: path.map(Into::into),
        path2: None,
    })
}

/// What `require` of one module does: stat, open, fstat, read, close (fd
/// 20), and a failed probe of a sibling; 6 operations.
fn require_one(t: &mut Tasks, cause: u64, at: u64, src: &SpanContextSource<'_>, ready: &mut Ready) {
    let m = "/srv/app/node_modules/x/index.js";
    t.work(fs_op("fs.stat", cause, (at, at + 1), Some("/srv/app/node_modules/x.js"), None, -2), src, ready);
    t.work(fs_op("fs.stat", cause, (at + 2, at + 3), Some(m), None, 0), src, ready);
    t.work(fs_op("fs.open", cause, (at + 4, at + 5), Some(m), None, 20), src, ready);
    t.work(fs_op("fs.fstat", cause, (at + 6, at + 7), None, Some(20), 0), src, ready);
    t.work(fs_op("fs.read", cause, (at + 8, at + 60), None, Some(20), 300), src, ready);
    t.work(fs_op("fs.close", cause, (at + 61, at + 62), None, Some(20), 0), src, ready);
}

#[test]
fn module_loading_is_counted_on_the_startup_main_and_tasks_and_a_users_sync_calls_stay_spans() {
    let (spans, stats) = run_with(TracePer::Process, Sampler::default(), StartupOps::Modules, |t, src, ready| {
        t.process(7, &["node".into()], 1, src.ids, src.sampler);
        for i in 0..10 {
            require_one(t, 0, 100 + i * 100, src, ready);
        }
        // The resolution walk over the module's folders; the user's own statSync.
        t.work(fs_op("fs.lstat", 0, (2_000, 2_001), Some("/srv/app"), None, 0), src, ready);
        t.work(fs_op("fs.stat", 0, (2_002, 2_003), Some("/srv/app/data/config.json"), None, 0), src, ready);
        t.loop_started(7, 3_000);
        // A lazy require in main, and a timer's first export loading the exporter.
        require_one(t, 0, 4_000, src, ready);
        let c = make(TaskKind::Timers, ms(1), 0);
        for i in 0..20 {
            require_one(t, c, ms(1) + i * 100, src, ready);
        }
        t.exited(7, ms(10), Some(0), src, ready);
    });
    assert_eq!(stats.summarised, 10 * 6 + 1 + 6 + 20 * 6);
    let startup = named(&spans, "startup")[0];
    assert_eq!(startup.attr("uvspan.task.operations"), Some(&Value::I64(62)));
    assert_eq!(startup.attr("uvspan.module_load.count"), Some(&Value::I64(61)));
    assert_eq!(startup.attr("uvspan.module_load.errors"), Some(&Value::I64(10)));
    assert_eq!(startup.attr("uvspan.sync_fs.count"), None, "the user's call is no module loading");
    let Some(Value::Strings(slowest)) = startup.attr("uvspan.module_load.slowest") else { panic!("slowest") };
    assert_eq!(slowest.len(), 5);
    assert!(slowest[0].ends_with("fs.read /srv/app/node_modules/x/index.js"), "an fd's read named by its file: {slowest:?}");
    let under = |p: &Span| spans.iter().filter(|s| s.parent_span_id == p.span_context.span_id()).collect::<Vec<_>>();
    let mine = under(startup);
    assert_eq!(mine.len(), 1, "only the user's statSync is a span");
    assert_eq!(mine[0].attr("file.path"), Some(&Value::String("/srv/app/data/config.json".into())));
    let main = named(&spans, "main")[0];
    assert_eq!(main.attr("uvspan.module_load.count"), Some(&Value::I64(6)));
    assert!(under(main).is_empty());
    let timers = named(&spans, "timers")[0];
    assert_eq!(timers.attr("uvspan.module_load.count"), Some(&Value::I64(120)));
    assert_eq!(timers.attr("uvspan.task.operations"), Some(&Value::I64(120)));
    assert!(under(timers).is_empty(), "a task that only loaded modules: one span");
    assert_eq!(spans.len(), 1 + 1 + 1 + 1 + 1, "root, startup, its one span, main, timers");
}

#[test]
fn with_spans_every_module_operation_is_a_span() {
    let (spans, stats) = run_with(TracePer::Process, Sampler::default(), StartupOps::Spans, |t, src, ready| {
        t.process(7, &["node".into()], 1, src.ids, src.sampler);
        require_one(t, 0, 100, src, ready);
        t.exited(7, ms(10), Some(0), src, ready);
    });
    assert_eq!(stats.summarised, 0);
    assert_eq!(spans.len(), 2 + 6);
    assert_eq!(named(&spans, "startup")[0].attr("uvspan.module_load.count"), None);
}

#[test]
fn with_a_trace_per_task_module_loading_outside_tasks_is_one_startup_span() {
    let (spans, stats) = run_with(TracePer::Task, Sampler::default(), StartupOps::Modules, |t, src, ready| {
        for i in 0..10 {
            require_one(t, 0, 100 + i * 100, src, ready);
        }
        let mine = fs_op("fs.stat", 0, (2_000, 2_001), Some("/tmp/d/s-1"), None, -2);
        assert!(t.work(mine, src, ready).is_some(), "the user's statSync: its own trace");
        assert_eq!(t.loop_start_unknown(), vec![7], "its module loading asks when the loop ran");
        t.loop_started(7, 3_000);
        let c = make(TaskKind::Io, ms(1), 0);
        require_one(t, c, ms(1), src, ready);
        t.work(stat(c, ms(1) + 500, ms(1) + 600), src, ready);
        t.expire(ms(2) + QUIET_NS, src, ready);
        // Lazy loading outside tasks later: a span of its own, `main`.
        require_one(t, 0, ms(900), src, ready);
        t.finish_all(ms(2_000), src, ready);
    });
    assert_eq!(stats.summarised, 10 * 6 + 6 + 6);
    assert_eq!(stats.tasks, 1, "module loading outside tasks is no task");
    let startup = named(&spans, "startup");
    assert_eq!(startup.len(), 1);
    assert_eq!(startup[0].parent_span_id, SpanId::INVALID, "its own trace");
    assert_eq!(startup[0].attr("uvspan.module_load.count"), Some(&Value::I64(60)));
    assert_eq!(startup[0].attr("uvspan.task.kind"), None);
    assert_eq!((startup[0].start_ns, startup[0].end_ns), (100, 1_062));
    assert_eq!(named(&spans, "main")[0].attr("uvspan.module_load.count"), Some(&Value::I64(6)));
    let io = named(&spans, "io")[0];
    assert_eq!(io.attr("uvspan.module_load.count"), Some(&Value::I64(6)));
    assert_eq!(io.attr("uvspan.task.operations"), Some(&Value::I64(7)));
    assert_eq!(spans.iter().filter(|s| s.parent_span_id == io.span_context.span_id()).count(), 1, "its stat of /x");
    assert_eq!(spans.len(), 4, "startup, io, its stat, main (the user's statSync went back)");
}

/// An HTTPS call a task makes: its request's plaintext (SSL_write on the
/// TLS connection), then its ciphertext on the socket, where the response
/// is read. The server in the same process writing its own handshake on
/// that thread in between (another task's cause) is not the call's socket:
/// the response on the call's socket still finds it.
#[test]
fn an_https_calls_socket_is_its_own_ciphertexts_not_another_tasks_write_between() {
    use crate::events::decode::{HttpRecord, HttpWhat};
    use crate::requests::testing::http;
    let rec = |what, cause, conn, ts, data: &str| HttpRecord { peer: None, local_port: None, ..http(what, cause, conn, ts, data) };
    let (spans, _) = run(TracePer::Task, Sampler::default(), |t, src, ready| {
        let c = make(TaskKind::Timers, ms(1_000), 1);
        let server = make(TaskKind::Io, ms(1_000), 2);
        let (tls, socket, server_socket) = (0x70, 0x71, 0x72);
        t.http(&HttpRecord { tls: true, ..rec(HttpWhat::Write, c, tls, ms(1_001), "GET /s HTTP/1.1\r\nHost: up:443\r\n\r\n") }, src, ready);
        t.http(&rec(HttpWhat::Write, server, server_socket, ms(1_002), "\x16\x03\x03 server hello"), src, ready);
        t.http(&rec(HttpWhat::Write, c, socket, ms(1_003), "\x17\x03\x03 ciphertext"), src, ready);
        t.http(&rec(HttpWhat::Response, c, socket, ms(1_004), "HTTP/1.1 200 OK\r\n\r\n"), src, ready);
        t.expire(ms(1_004) + QUIET_NS, src, ready);
    });
    let clients: Vec<&Span> = spans.iter().filter(|s| s.span_kind == opentelemetry::trace::SpanKind::Client).collect();
    assert_eq!(clients.len(), 1, "{spans:#?}");
    let status = clients[0].attributes.iter().find(|kv| kv.key.as_str() == "http.response.status_code").map(|kv| kv.value.clone());
    assert_eq!(status, Some(Value::I64(200)));
    let scheme = clients[0].attributes.iter().find(|kv| kv.key.as_str() == "url.scheme").map(|kv| kv.value.clone());
    assert_eq!(scheme, Some(Value::from("https")));
}
