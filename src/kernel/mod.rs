//! The kernel side from Rust: the generated [`skel`]eton of bpf/uvspan.bpf.c,
//! the [`tracer`] that loads, attaches and detaches it, the kernel
//! [`features`] it uses on this machine, the kernel types its CO-RE
//! relocations match ([`core_btf`]), waiting on the ring buffer ([`wake`])
//! and explaining refusals ([`diagnose`]); the pinned map profilers read
//! ([`trace_ctx`]).
pub mod core_btf;
pub mod diagnose;
pub mod features;
pub mod sampler;
pub mod skel;
pub mod trace_ctx;
pub mod tracer;
pub mod wake;
