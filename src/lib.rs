//! uvspan: libuv inside unmodified Node.js processes, seen from the kernel
//! with eBPF uprobes, exported as OpenTelemetry spans.
//!
//! Data flow (one module each):
//! target (which processes) → symbols (where libuv is) → probes::catalog
//! (what to attach) → tracer (BPF load, attach, ring buffer) → decode
//! (records) → spans (SpanData) → resource (process attributes) → export
//! (OTLP or console). `run` wires them together.

pub mod bpf;
pub mod cli;
pub mod clock;
pub mod config;
pub mod decode;
pub mod discover;
pub mod errno;
pub mod export;
pub mod kernel;
pub mod probes;
pub mod resource;
pub mod run;
pub mod spans;
pub mod symbols;
pub mod target;
pub mod tracer;
