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
[ "$(id -u)" -eq 0 ] || { echo "loop_cost: run as root" >&2; exit 1; }
command -v bpftool >/dev/null && command -v jq >/dev/null || { echo "loop_cost: needs bpftool and jq" >&2; exit 1; }
was=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1
trap 'sysctl -qw kernel.bpf_stats_enabled=$was' EXIT
out=$(mktemp)
BENCH_OUT=$out node loop_cost.js &
app=$!
"$bin" --loop-threshold 1s --otlp-endpoint http://127.0.0.1:9 "$@" --pid "$app" > /dev/null 2>&1 &
up=$!
for _ in $(seq 200); do grep -q iterations "$out" && break; sleep 0.05; done
iters=$(grep -o '"iterations":[0-9]*' "$out" | cut -d: -f2)
# this uvspan's programs (by the ids its descriptors hold: other tracers may run)
ids=$(grep -h '^prog_id:' /proc/"$up"/fdinfo/* 2>/dev/null | awk '{print $2}' | sort -un | paste -sd, -)
bpftool prog show -j | jq -r --arg ids "[$ids]" '
  ($ids | fromjson) as $mine
  | [.[] | select(.id as $i | $mine | index($i)) | select(.run_cnt > 0)]
  | sort_by(-.run_cnt)[] | "\(.name) \(.run_cnt) \(.run_time_ns)"' \
  | awk -v it="$iters" '
    BEGIN { printf "%-18s %12s %12s %10s %12s\n", "program", "runs", "ns total", "ns/run", "runs/iter" }
    { printf "%-18s %12d %12d %10.0f %12.2f\n", $1, $2, $3, $3 / $2, $2 / it; runs += $2; ns += $3 }
    END { printf "iterations %d; per iteration: %.2f program runs, %.0f ns\n", it, runs / it, ns / it }'
wait "$app"
kill -INT "$up" 2>/dev/null; wait "$up" || true
rm -f "$out"
