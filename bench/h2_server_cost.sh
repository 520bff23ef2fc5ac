#!/usr/bin/env bash
# What unsampled HTTP/2 server streams cost, per stream: in uvspan's BPF
# programs (kernel.bpf_stats_enabled: runs and ns) and in uvspan itself (its
# CPU time), for each binary given, in interleaved rounds. The app
# (bench/h2_server_cost.js) answers STREAMS h2c streams whose callers did
# not sample them (traceparent flag 00; the default sampler,
# parentbased_always_on, drops them), sent by a driver in another process.
#
#   sudo [ROUNDS=3] [STREAMS=40000] bench/h2_server_cost.sh UVSPAN_BINARY... [-- uvspan options...]
# Needs root, bpftool and jq. Not part of bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bins=() opts=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do bins+=("$1"); shift; done
[ $# -gt 0 ] && shift && opts=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(target/release/uvspan)
[ "$(id -u)" -eq 0 ] || { echo "h2_server_cost: run as root" >&2; exit 1; }
for t in bpftool jq; do command -v $t >/dev/null || { echo "h2_server_cost: needs $t" >&2; exit 1; }; done
was=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1
trap 'sysctl -qw kernel.bpf_stats_enabled=$was' EXIT
ticks=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
printf "%-32s %8s %10s %10s %12s %14s\n" binary streams runs/str "ns/run" "BPF ns/str" "uvspan µs/str"
for _ in $(seq "${ROUNDS:-3}"); do
  for bin in "${bins[@]}"; do
    out=$(mktemp)
    BENCH_OUT=$out node bench/h2_server_cost.js &
    app=$!
    for _ in $(seq 100); do grep -q port "$out" 2>/dev/null && break; sleep 0.05; done
    "$bin" --otlp-endpoint http://127.0.0.1:9 --status-interval 0 --loop-threshold 10s ${opts[@]+"${opts[@]}"} --pid "$app" 2> "$out.err" &
    up=$!
    for _ in $(seq 200); do grep -q "attached in" "$out.err" && break; sleep 0.05; done
    ids=$(grep -h '^prog_id:' /proc/"$up"/fdinfo/* 2>/dev/null | awk '{print $2}' | sort -un | paste -sd, -)
    stats() { bpftool prog show -j | jq -r --arg ids "[$ids]" '($ids | fromjson) as $m | [.[] | select(.id as $i | $m | index($i))] | "\(map(.run_cnt // 0) | add) \(map(.run_time_ns // 0) | add)"'; }
    read -r c0 n0 < <(stats)
    u0=$(cpu_ticks "$up")
    touch "$out.go"
    for _ in $(seq 1200); do grep -q streams "$out" && break; sleep 0.05; done
    read -r c1 n1 < <(stats)
    u1=$(cpu_ticks "$up")
    streams=$(jq .streams "$out")
    wait "$app" 2>/dev/null || true
    kill -INT "$up"; wait "$up" 2>/dev/null || true
    awk -v b="$bin" -v q="$streams" -v c=$((c1 - c0)) -v n=$((n1 - n0)) -v u=$((u1 - u0)) -v hz="$ticks" \
      'BEGIN { printf "%-32s %8d %10.2f %10.0f %12.0f %14.2f\n", b, q, c / q, n / c, n / q, u * 1e6 / hz / q }'
    rm -f "$out" "$out.err" "$out.go"
  done
done
