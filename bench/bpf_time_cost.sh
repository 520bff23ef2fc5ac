#!/usr/bin/env bash
# What BPF run time costs bench/app.js, apart from what the real programs'
# memory traffic (their maps, scratch and code) costs it: on one app (a
# private copy of node), saturated (wrk -t1 -c16, as bench.sh's saturated
# part), each round runs in turn
#   bare;
#   trap: uvspan's trap floor (UVSPAN_BENCH_TRAP_ONLY=1: its programs
#     return at once);
#   spin: the same, each entry hit spinning SPIN_NS of BPF time in a
#     compact loop (UVSPAN_BENCH_TRAP_SPIN_NS);
#   metrics: uvspan with OTEL_TRACES_SAMPLER=always_off (every request
#     unsampled: counted in the metrics, no record);
#   full: uvspan with its defaults (every request's spans sent up and
#     exported);
# and prints the app's CPU ns per request of each (on-CPU time from
# /proc/PID/task/*/schedstat), then the medians over the rounds of the
# paired differences over that round's bare run: spin - trap (what SPIN_NS
# of BPF per hit costs the app), metrics - spin (what the real programs
# cost beyond a loop of about their run time; SPIN_NS should be their ns
# per run: hit_counts.sh with OTEL_TRACES_SAMPLER=always_off), metrics -
# trap, and full - metrics (what making and exporting the spans adds).
# PIN=1 gives the app CPU 0 and wrk CPU 1 (uvspan goes where the scheduler
# puts it): the app's CPU time then holds less of the others' competition
# for the two CPUs.
#
#   sudo [ROUNDS=12] [BENCH_SECONDS=6] [SPIN_NS=1000] [PIN=1] bench/bpf_time_cost.sh [UVSPAN_BINARY]
# Needs wrk and jq. Not part of bench.sh.
set -euo pipefail
bin=$(realpath "${1:-$(dirname "$0")/../target/release/uvspan}")
cd "$(dirname "$0")"
rounds=${ROUNDS:-12}
secs=${BENCH_SECONDS:-6}
spin=${SPIN_NS:-1000}
. ./start_app.sh
bench_begin bpf_time_cost wrk jq
trap stop_all EXIT
start_app
# The OTLP receiver every configuration exports to (bench/sink.js).
node sink.js > "$work/sink.out" &
sink=$!
for _ in $(seq 100); do grep -q grpc "$work/sink.out" && break; sleep 0.05; done
endpoint="http://127.0.0.1:$(jq -r .grpc "$work/sink.out")"
trap 'kill "$sink" 2>/dev/null; stop_all' EXIT
wrk_cpu=()
if [ "${PIN:-0}" = 1 ]; then
  taskset -a -p -c 0 "$app" > /dev/null
  wrk_cpu=(taskset -c 1)
fi

appcpu() { cat /proc/"$app"/task/*/schedstat | awk '{s += $1} END {printf "%.0f", s}'; }
# One measured run under the configuration: prints its label and the app's
# CPU ns per request.
run() {
  local label=$1; shift
  if [ "$label" != bare ]; then
    env "$@" "$bin" --pid "$app" --otlp-endpoint "$endpoint" > /dev/null 2> "$work/uvspan.err" &
    side=$!
    for _ in $(seq 100); do grep -q 'tracing' "$work/uvspan.err" 2>/dev/null && break; sleep 0.05; done
    sleep 1
  fi
  local c0 c1 n
  c0=$(appcpu)
  BENCH_DELAY_MS=0 "${wrk_cpu[@]}" wrk -t1 -c16 -d"${secs}s" --timeout 5s -s pace.lua "http://127.0.0.1:$port/" > "$work/wrk.out"
  c1=$(appcpu)
  n=$(sed -n 's/^WRKJSON //p' "$work/wrk.out" | jq .requests)
  if [ -n "$side" ]; then kill -INT "$side"; wait "$side" || true; side=; fi
  echo "$label $(( (c1 - c0) / n ))"
}

for r in $(seq "$rounds"); do
  run bare
  run trap UVSPAN_BENCH_TRAP_ONLY=1
  run spin UVSPAN_BENCH_TRAP_ONLY=1 UVSPAN_BENCH_TRAP_SPIN_NS="$spin"
  run metrics OTEL_TRACES_SAMPLER=always_off
  run full
done | tee "$work/runs.txt" | sed 's/^/round run: /'

awk -v spin="$spin" '
  $1 == "bare" { r++ }
  { v[$1, r] = $2 }
  END {
    for (i = 1; i <= r; i++) {
      b = v["bare", i]
      st[i] = (v["spin", i] - v["trap", i]) / b
      ms[i] = (v["metrics", i] - v["spin", i]) / b
      mt[i] = (v["metrics", i] - v["trap", i]) / b
      fm[i] = (v["full", i] - v["metrics", i]) / b
      bare[i] = b
    }
    printf "%d rounds; bare %.1f us/request (median)\n", r, med(bare, r) / 1000
    printf "spin (%d ns a hit) - trap: %.3fx bare\n", spin, med(st, r)
    printf "metrics only - spin:       %.3fx bare\n", med(ms, r)
    printf "metrics only - trap:       %.3fx bare\n", med(mt, r)
    printf "full - metrics only:       %.3fx bare\n", med(fm, r)
  }
  function med(a, n,    i, j, t, c) {
    for (i = 1; i <= n; i++) c[i] = a[i]
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (c[j] < c[i]) { t = c[i]; c[i] = c[j]; c[j] = t }
    return n % 2 ? c[(n + 1) / 2] : (c[n / 2] + c[n / 2 + 1]) / 2
  }' "$work/runs.txt"
