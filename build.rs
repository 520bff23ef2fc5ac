//! Compiles bpf/uvspan.bpf.c (one compilation unit: the headers of bpf/ it
//! includes) with clang and generates its libbpf-rs skeleton into OUT_DIR
//! (pulled in by src/kernel/skel.rs), with the list of those source files
//! for the tests that check them against the Rust side. src/ holds only
//! hand-written code.
use std::{
    env,
    path::{Path, PathBuf},
};

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "bpf/uvspan.bpf.c";

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let out = out_dir.join("uvspan.skel.rs");
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets CARGO_CFG_TARGET_ARCH");
    if arch != "x86_64" {
        // The argument and struct offsets in bpf/ are the x86_64 System V ones.
        panic!("uvspan supports x86_64 only (target arch is {arch})");
    }
    let sources = sources(Path::new(SRC));
    for file in &sources {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    write_source_list(&sources, &out_dir.join("bpf_sources.rs"));
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
}

/// `src` and the local headers it includes (`#include "..."`, next to the
/// file that includes them), transitively, each once: what the object is
/// compiled from besides the system headers.
fn sources(src: &Path) -> Vec<PathBuf> {
    let mut files = vec![src.to_path_buf()];
    let mut i = 0;
    while i < files.len() {
        let text = std::fs::read_to_string(&files[i]).unwrap_or_else(|e| panic!("reading {}: {e}", files[i].display()));
        let dir = files[i].parent().expect("a file in bpf/").to_path_buf();
        for line in text.lines() {
            let Some(name) = line.trim().strip_prefix("#include \"").and_then(|rest| rest.split('"').next()) else { continue };
            let header = dir.join(name);
            if !files.contains(&header) {
                files.push(header);
            }
        }
        i += 1;
    }
    files
}

/// `SOURCES`: each source file's path (as `sources` found it) and its text
/// (`include_str!`, so the crate is rebuilt when one changes).
fn write_source_list(sources: &[PathBuf], to: &Path) {
    let dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let mut list =
        String::from("/// The BPF sources the object is compiled from: (path, text).\npub const SOURCES: &[(&str, &str)] = &[\n");
    for file in sources {
        list += &format!("    ({:?}, include_str!({:?})),\n", file.display().to_string(), dir.join(file).display().to_string());
    }
    list += "];\n";
    std::fs::write(to, list).unwrap_or_else(|e| panic!("writing {}: {e}", to.display()));
}
