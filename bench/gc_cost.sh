#!/usr/bin/env bash
# What uvspan's BPF program costs per V8 garbage collection: bench/gc_cost.js
# allocates for a few seconds (collections counted by Node itself) traced by
# uvspan (--pid) with kernel.bpf_stats_enabled=1; while the programs are
# still loaded, the uprobe program's run_cnt and run_time_ns (bpftool) give
# its runs per collection (the GC callbacks' two entry probes, plus the few
# fs calls of writing the result) and ns per run.
#
#   sudo [NODE=path/to/node] bench/gc_cost.sh [UVSPAN_BINARY] [extra uvspan options...]
# Needs bpftool and jq. Not part of bench.sh.
set -euo pipefail
cd "$(dirname "$0")"
bin=${1:-../target/release/uvspan}; shift || true
# shellcheck source=prog_stats.sh
. ./prog_stats.sh
prog_stats_run gc_cost gc_cost.js gcs 400 each "$bin" --loop-threshold 10s "$@"
