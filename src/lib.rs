//! uvspan: libuv inside unmodified Node.js processes, seen from the kernel
//! with eBPF uprobes, exported as OpenTelemetry spans.
//!
//! The data flow, one folder per step (ARCHITECTURE.md has the picture):
//! discover (which processes) → symbols (where libuv is) → probes (what to
//! attach, pure) → kernel (BPF load, attach, ring buffer) → events (records,
//! and spans of each family) → requests (request context: records held per
//! HTTP request, its spans built) → enrich (process resources) → export (OTLP
//! or console), with the agent loop on top wiring them together.

pub mod agent;
pub mod cli;
pub mod config;
pub mod db;
pub mod discover;
pub mod enrich;
pub mod events;
pub mod export;
pub mod kernel;
pub mod listen;
pub mod metrics;
pub mod probes;
pub mod report;
pub mod requests;
pub mod semconv;
pub mod stacks;
pub mod symbols;
pub mod tasks;
