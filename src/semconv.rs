//! Every attribute key uvspan writes on its spans, in one place.
//!
//! Keys of the OpenTelemetry semantic conventions come from the
//! `opentelemetry-semantic-conventions` crate (the release line of the `opentelemetry` crates in
//! use; its `semconv_experimental` feature for keys still in development, such as `rpc.*`,
//! `thread.id`, `file.path`, `dns.*`, `v8js.gc.type`), under the crate's names. uvspan's own keys
//! (`uvspan.*`), for what the conventions do not name, are constants named after the key.
//!
//! RPC spans follow the release-candidate RPC conventions: `rpc.system.name`, `rpc.method` fully
//! qualified (`package.Service/Method`), `rpc.response.status_code` (the gRPC status's name).

pub use opentelemetry_semantic_conventions::attribute::{
    CLIENT_ADDRESS, CLIENT_PORT, CODE_STACKTRACE, DNS_ANSWERS, DNS_QUESTION_NAME, ERROR_TYPE, FILE_PATH, HTTP_REQUEST_METHOD,
    HTTP_RESPONSE_STATUS_CODE, HTTP_ROUTE, NETWORK_PROTOCOL_VERSION, RPC_METHOD, RPC_RESPONSE_STATUS_CODE, RPC_SYSTEM_NAME, SERVER_ADDRESS,
    SERVER_PORT, THREAD_ID, URL_PATH, URL_QUERY, URL_SCHEME, URL_TEMPLATE, USER_AGENT_ORIGINAL, V8JS_GC_TYPE,
};

// fs and DNS operations.
pub const UVSPAN_FILE_NEW_PATH: &str = "uvspan.file.new_path";
pub const UVSPAN_FS_FD: &str = "uvspan.fs.fd";
pub const UVSPAN_FS_BYTES: &str = "uvspan.fs.bytes";
pub const UVSPAN_FS_ENTRIES: &str = "uvspan.fs.entries";
pub const UVSPAN_SYNC: &str = "uvspan.sync";
pub const UVSPAN_ENDED_AT: &str = "uvspan.ended_at";
pub const UVSPAN_THREADPOOL_QUEUE_WAIT_MS: &str = "uvspan.threadpool.queue_wait_ms";
pub const UVSPAN_THREADPOOL_RUN_MS: &str = "uvspan.threadpool.run_ms";
pub const UVSPAN_LOOP_CALLBACK_WAIT_MS: &str = "uvspan.loop.callback_wait_ms";
pub const UVSPAN_THREADPOOL_THREAD_ID: &str = "uvspan.threadpool.thread.id";

// Event-loop iterations.
pub const UVSPAN_LOOP_BUSY_MS: &str = "uvspan.loop.busy_ms";
pub const UVSPAN_LOOP_POLL_WAIT_MS: &str = "uvspan.loop.poll_wait_ms";
pub const UVSPAN_LOOP_ON_CPU_MS: &str = "uvspan.loop.on_cpu_ms";
pub const UVSPAN_LOOP_OFF_CPU_MS: &str = "uvspan.loop.off_cpu_ms";
pub const UVSPAN_LOOP_RUNQUEUE_MS: &str = "uvspan.loop.runqueue_ms";
pub const UVSPAN_LOOP_THROTTLED_MS: &str = "uvspan.loop.throttled_ms";
pub const UVSPAN_LOOP_FAST_ITERATIONS_BEFORE: &str = "uvspan.loop.fast_iterations_before";
pub const UVSPAN_LOOP_PHASE: &str = "uvspan.loop.phase";
pub const UVSPAN_LOOP_BLOCKED_BY: &str = "uvspan.loop.blocked_by";
pub const UVSPAN_LOOP_STACK_SAMPLES: &str = "uvspan.loop.stack_samples";
pub const UVSPAN_LOOP_STACKS_NOTICE: &str = "uvspan.loop.stacks_notice";
pub const UVSPAN_STACK_SAMPLES: &str = "uvspan.stack.samples";
pub const UVSPAN_STACK_SHARE: &str = "uvspan.stack.share";
pub const UVSPAN_STACK_MS: &str = "uvspan.stack.ms";
pub const UVSPAN_LOOP_GC_MS: &str = "uvspan.loop.gc_ms";
pub const UVSPAN_LOOP_GC_COUNT: &str = "uvspan.loop.gc_count";
pub const UVSPAN_GC_DURATION_MS: &str = "uvspan.gc.duration_ms";

// Requests.
pub const UVSPAN_HTTP_RESPONSE_SEEN: &str = "uvspan.http.response_seen";
/// How a request whose response was not seen ended (requests::Unanswered).
pub const UVSPAN_HTTP_ENDED_BY: &str = "uvspan.http.ended_by";
pub const UVSPAN_HTTP_TRACEPARENT_WRITTEN: &str = "uvspan.http.traceparent_written";

/// `rpc.system.name` of gRPC calls.
pub const RPC_SYSTEM_NAME_GRPC: &str = "grpc";

/// gRPC status codes a server's span and call are errors for (UNKNOWN, DEADLINE_EXCEEDED,
/// UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS; the others are the client's doing).
pub fn grpc_server_error(code: u8) -> bool {
    matches!(code, 2 | 4 | 12 | 13 | 14 | 15)
}

/// Metric names of the conventions that uvspan exports.
pub use opentelemetry_semantic_conventions::metric::{
    DNS_LOOKUP_DURATION, HTTP_CLIENT_REQUEST_DURATION, HTTP_SERVER_REQUEST_DURATION, NODEJS_EVENTLOOP_TIME, NODEJS_EVENTLOOP_UTILIZATION,
    RPC_CLIENT_CALL_DURATION, RPC_SERVER_CALL_DURATION, V8JS_GC_DURATION,
};

/// The gRPC status code's name, as `rpc.response.status_code` carries it (`OK`,
/// `DEADLINE_EXCEEDED`); a code outside the 17 defined ones as its number.
pub fn grpc_status_name(code: u32) -> std::borrow::Cow<'static, str> {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    match NAMES.get(code as usize) {
        Some(n) => (*n).into(),
        None => code.to_string().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_rpc_names() {
        assert_eq!(RPC_SYSTEM_NAME, "rpc.system.name");
        assert_eq!(RPC_METHOD, "rpc.method");
        assert_eq!(RPC_RESPONSE_STATUS_CODE, "rpc.response.status_code");
        assert_eq!(grpc_status_name(0), "OK");
        assert_eq!(grpc_status_name(4), "DEADLINE_EXCEEDED");
        assert_eq!(grpc_status_name(16), "UNAUTHENTICATED");
        assert_eq!(grpc_status_name(17), "17");
        assert_eq!(grpc_status_name(u32::MAX), u32::MAX.to_string());
    }
}
