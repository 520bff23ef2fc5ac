#!/usr/bin/env bash
# What --publish-trace-context costs inside the BPF programs: bench/hit_counts.sh
# (bench/app.js saturated, UVSPAN_BENCH_TIME_HITS=1) without and with the
# flag, interleaved in BENCH_ROUNDS rounds (3); the ns per hit at the points
# where the thread's cause changes (the request's head, a stream's callback,
# the epoll wait, the batch of finished jobs) and the BPF ns per request
# (kernel.bpf_stats_enabled), per round. The difference at a point is the
# map update (or delete) made there. Needs what hit_counts.sh needs.
#
#   sudo [BENCH_ROUNDS=3] [BENCH_SECONDS=4] bench/trace_ctx_cost.sh [UVSPAN_BINARY]
set -euo pipefail
bin=$(realpath "${1:-$(dirname "$0")/../target/release/uvspan}")
cd "$(dirname "$0")"
rounds=${BENCH_ROUNDS:-3}
points='llhttp__on_message_begin|uv__stream_io|epoll_wait\|epoll_pwait |uv__work_done'
printf "%-6s %-8s %10s %10s %10s %10s %14s\n" round publish message_begin stream_io epoll_wait work_done "BPF ns/request"
for r in $(seq "$rounds"); do
  for flag in "" --publish-trace-context; do
    out=$(BENCH_SECONDS=${BENCH_SECONDS:-4} ./hit_counts.sh "$bin" $flag 2>&1)
    ns() { echo "$out" | awk -v p="$1" '$1 == p { print $NF; exit }'; }
    per=$(echo "$out" | sed -n 's/.*(BPF ns\/request \([0-9]*\)).*/\1/p')
    printf "%-6s %-8s %10s %10s %10s %10s %14s\n" "$r" "${flag:+on}${flag:-off}" \
      "$(ns llhttp__on_message_begin)" "$(ns uv__stream_io)" "$(ns 'epoll_wait|epoll_pwait')" "$(ns uv__work_done)" "$per"
  done
done
