//! The generated skeleton for bpf/uvspan.bpf.c.
#![allow(clippy::all, dead_code, non_camel_case_types, non_snake_case, non_upper_case_globals, unused)]
include!(concat!(env!("OUT_DIR"), "/uvspan.skel.rs"));
