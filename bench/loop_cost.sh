#!/usr/bin/env bash
# What uvspan's BPF programs cost per loop iteration: bench/loop_cost.js runs
# a setImmediate chain (every iteration polls and runs its phases) traced by
# uvspan (--pid: its epoll waits by session uprobes on libc where the kernel
# has them) with kernel.bpf_stats_enabled=1; while the programs are still loaded
# their run_time_ns and run_cnt (bpftool) give ns per program run, and their
# sum over the iterations the ns each iteration pays in the kernel's BPF.
#
#   sudo [BENCH_MODE=paced] bench/loop_cost.sh [UVSPAN_BINARY] [extra uvspan options...]
# BENCH_MODE: saturated (default; no iteration sleeps) or paced (each
# iteration sleeps ~1 ms in epoll and wakes up), see loop_cost.js.
# Needs bpftool and jq. Not part of bench.sh.
set -euo pipefail
cd "$(dirname "$0")"
bin=${1:-../target/release/uvspan}; shift || true
# shellcheck source=prog_stats.sh
. ./prog_stats.sh
prog_stats_run loop_cost loop_cost.js iterations 200 total "$bin" --loop-threshold 1s "$@"
