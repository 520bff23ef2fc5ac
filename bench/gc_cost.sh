#!/usr/bin/env bash
# What uvspan's BPF program costs per V8 garbage collection: bench/gc_cost.js
# allocates for a few seconds (collections counted by Node itself) traced by
# uvspan (--pid) with kernel.bpf_stats_enabled=1; while the programs are
# still loaded, the uprobe program's run_cnt and run_time_ns (bpftool) give
# its runs per collection (the GC callbacks' two entry probes, plus the few
# fs calls of writing the result) and ns per run.
#
#   sudo bench/gc_cost.sh [UVSPAN_BINARY] [extra uvspan options...]
# Needs bpftool and jq. Not part of bench.sh.
set -euo pipefail
cd "$(dirname "$0")"
bin=${1:-../target/release/uvspan}; shift || true
[ "$(id -u)" -eq 0 ] || { echo "gc_cost: run as root" >&2; exit 1; }
command -v bpftool >/dev/null && command -v jq >/dev/null || { echo "gc_cost: needs bpftool and jq" >&2; exit 1; }
was=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1
trap 'sysctl -qw kernel.bpf_stats_enabled=$was' EXIT
out=$(mktemp)
BENCH_OUT=$out node gc_cost.js &
app=$!
"$bin" --loop-threshold 10s --otlp-endpoint http://127.0.0.1:9 "$@" --pid "$app" > /dev/null 2>&1 &
up=$!
for _ in $(seq 400); do grep -q gcs "$out" && break; sleep 0.05; done
cat "$out"
gcs=$(jq .gcs "$out")
# this uvspan's programs (by the ids its descriptors hold: other tracers may run)
ids=$(grep -h '^prog_id:' /proc/"$up"/fdinfo/* 2>/dev/null | awk '{print $2}' | sort -un | paste -sd, -)
bpftool prog show -j | jq -r --arg ids "[$ids]" '
  ($ids | fromjson) as $mine
  | [.[] | select(.id as $i | $mine | index($i)) | select(.run_cnt > 0)]
  | sort_by(-.run_cnt)[] | "\(.name) \(.run_cnt) \(.run_time_ns)"' \
  | awk -v gcs="$gcs" '
    BEGIN { printf "%-18s %12s %12s %10s %12s\n", "program", "runs", "ns total", "ns/run", "runs/gc" }
    { printf "%-18s %12d %12d %10.0f %12.2f\n", $1, $2, $3, $3 / $2, $2 / gcs }'
wait "$app"
kill -INT "$up" 2>/dev/null; wait "$up" || true
rm -f "$out"
