#!/usr/bin/env bash
# What uvspan's BPF program costs per fs operation, sampled or not:
# bench/op_cost.js runs a chain of async fs.stat calls traced by uvspan
# (--pid: a trace per task, so the sampler is decided in the kernel) with
# kernel.bpf_stats_enabled=1; the uprobe program's run_cnt and run_time_ns
# (bpftool) give its runs per operation (submit and completion) and ns per
# run. Run it with OTEL_TRACES_SAMPLER=always_on and always_off to compare a
# hit that sends a record with one that only counts the operation in the
# kernel's histograms.
#
#   sudo OTEL_TRACES_SAMPLER=always_off bench/op_cost.sh [UVSPAN_BINARY] [extra uvspan options...]
# Needs bpftool and jq. Not part of bench.sh.
set -euo pipefail
cd "$(dirname "$0")"
bin=${1:-../target/release/uvspan}; shift || true
# shellcheck source=prog_stats.sh
. ./prog_stats.sh
prog_stats_run op_cost op_cost.js ops 200 each "$bin" --loop-threshold 10s "$@"
