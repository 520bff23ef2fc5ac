//! Request context: the HTTP requests a process serves, seen where their
//! bytes reach the parser, and the fs/DNS work they caused (the kernel tags
//! each operation with its cause), as one trace per request — inside the
//! caller's trace when the request carried a W3C `traceparent`.
//!
//! Records come in from [`crate::events::decode`]; the request's [`head`]
//! is parsed, the `tracker` holds its work until the request ends, and
//! `spans` builds its spans in one batch: its SERVER span, the fs/DNS spans
//! under it, and a CLIENT span per outgoing HTTP call it made. What leaves
//! goes to export, or with `--otlp-listen` to the joiner ([`RequestKey`]).
//! Pure: no kernel, no clock of its own.

pub mod head;
mod held;
mod spans;
pub mod template;
mod tracker;

#[cfg(test)]
pub(crate) mod testing;

pub use held::{held_records, released, Held};
pub(crate) use spans::call_span;
pub(crate) use tracker::Call;
pub use tracker::{request_over, Finished, FinishedCall, Ready, RequestKey, RequestStats, Requests, Tail};
