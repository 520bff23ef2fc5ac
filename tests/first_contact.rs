//! What a new user meets first: the test command's one summary line, what
//! uvspan says of a process that is not Node.js with libuv, a command in
//! which no Node.js process ran, and the processes of `-- COMMAND` stopped
//! with uvspan. Real uvspan, real eBPF, real processes.
//!
//! The tests that trace are root only: without root they fail, they are
//! never skipped. The summary script's tests need no root.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// scripts/test-summary.sh on a `cargo test` log and cargo's exit status.
fn summary(log: &str, status: i32) -> (Option<i32>, String) {
    let dir = TempDir::new("summary");
    let path = dir.join("log");
    std::fs::write(&path, log).expect("write the log");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-summary.sh");
    let out = Command::new(script).arg(&path).arg(status.to_string()).output().expect("run scripts/test-summary.sh");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

const OK: &str = "test result: ok. 5 passed; 0 failed; 2 ignored; 0 measured; 3 filtered out; finished in 0.10s\n";
const FAILED: &str = "test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s\n";

#[test]
fn the_test_summary_sums_every_binary() {
    let log = format!("running 7 tests\n{OK}\n     Running tests/b.rs\n{FAILED}error: 1 target failed:\n");
    let (code, out) = summary(&log, 101);
    assert_eq!(out.lines().last(), Some("8 passed, 2 failed, 2 ignored"), "{out}");
    assert_eq!(code, Some(1), "{out}");
}

#[test]
fn the_test_summary_passes_only_a_clean_run() {
    let ok = OK.replace("2 ignored", "0 ignored");
    let (code, out) = summary(&format!("{ok}{ok}"), 0);
    assert_eq!(out.lines().last(), Some("10 passed, 0 failed"), "{out}");
    assert_eq!(code, Some(0), "{out}");
    // A binary that did not build, or died before its result line: cargo
    // failed though no count did.
    let (code, out) = summary(&ok, 101);
    assert_eq!(out.lines().last(), Some("5 passed, 1 failed"), "{out}");
    assert!(out.contains("cargo test exited with 101 after 1 test binaries reported"), "{out}");
    assert_eq!(code, Some(1), "{out}");
    let (code, out) = summary("error[E0425]: cannot find value `x`\n", 101);
    assert_eq!(out.lines().last(), Some("0 passed, 1 failed"), "{out}");
    assert_eq!(code, Some(1), "{out}");
}

#[test]
fn the_test_command_runs_every_binary_and_ends_with_the_summary() {
    let script = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test.sh")).expect("scripts/test.sh");
    let cargo = script.lines().find(|l| l.starts_with("cargo test")).expect("scripts/test.sh runs cargo test");
    assert!(cargo.contains("--no-fail-fast"), "a failing binary must not hide the others: {cargo}");
    assert!(script.trim_end().ends_with("./scripts/test-summary.sh \"$log\" \"$status\""), "{script}");
}
