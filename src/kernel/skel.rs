//! The generated skeleton of bpf/uvspan.bpf.c, and its record and key types
//! (generated from bpf/uvspan.h through BTF: nothing is copied by hand).
#![allow(clippy::all, dead_code, non_camel_case_types, non_snake_case, non_upper_case_globals, unused)]
include!(concat!(env!("OUT_DIR"), "/uvspan.skel.rs"));

// SAFETY (for each impl below): the type is #[repr(C)], generated from a
// struct in bpf/uvspan.h made only of integers, integer arrays, nested such
// structs and enum newtypes over u32, so every byte pattern is a valid value
// (the `plain` contract). Each was laid out with explicit padding fields.
unsafe impl plain::Plain for types::ev_header {}
unsafe impl plain::Plain for types::fs_event {}
unsafe impl plain::Plain for types::dns_event {}
unsafe impl plain::Plain for types::loop_event {}
unsafe impl plain::Plain for types::proc_event {}
unsafe impl plain::Plain for types::http_event {}
unsafe impl plain::Plain for types::req_key {}
unsafe impl plain::Plain for types::stack_event {}
unsafe impl plain::Plain for types::stack_frame {}
unsafe impl plain::Plain for types::loop_time {}
unsafe impl plain::Plain for types::gc_event {}
unsafe impl plain::Plain for types::op_hist_key {}
unsafe impl plain::Plain for types::op_hist {}
unsafe impl plain::Plain for types::http_req {}
// (conn_key, h2_key and h2_stream are bpf/maps.h's, of the same kind.)
unsafe impl plain::Plain for types::conn_key {}
unsafe impl plain::Plain for types::h2_key {}
unsafe impl plain::Plain for types::h2_stream {}

/// The BPF sources the skeleton's object is compiled from (bpf/uvspan.bpf.c
/// and the headers it includes, listed by build.rs), for the tests that
/// check the Rust side against them.
#[cfg(test)]
pub mod sources {
    include!(concat!(env!("OUT_DIR"), "/bpf_sources.rs"));
}
