//! Compiles bpf/uvspan.bpf.c with clang and generates its libbpf-rs skeleton
//! into OUT_DIR (pulled in by src/bpf.rs). src/ holds only hand-written code.
use std::{env, path::PathBuf};

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "bpf/uvspan.bpf.c";

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("uvspan.skel.rs");
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets CARGO_CFG_TARGET_ARCH");
    if arch != "x86_64" {
        // The argument and struct offsets in bpf/ are the x86_64 System V ones.
        panic!("uvspan supports x86_64 only (target arch is {arch})");
    }
    if let Err(e) = SkeletonBuilder::new()
        .source(SRC)
        .clang_args(["-I/usr/include/x86_64-linux-gnu", "-D__TARGET_ARCH_x86", "-Wall", "-Werror"])
        .build_and_generate(&out)
    {
        panic!(
            "compiling {SRC} failed: {e:#}\n\
             Is clang installed? Run `sudo ./scripts/setup.sh` (apt-get install clang libelf-dev zlib1g-dev pkg-config)."
        );
    }
    println!("cargo:rerun-if-changed=bpf");
}
