#!/usr/bin/env bash
# What the kernel's uprobe traps alone cost bench/app.js, without uvspan's
# programs: plain counting uprobes (perf_uprobes.py: perf_event_open on the
# uprobe PMU, no BPF program, no tracefs) at every point uvspan's plan for
# the app uses, beside bare, uvspan's trap floor (UVSPAN_BENCH_TRAP_ONLY=1:
# its programs return at once) and uvspan's defaults. One app (a private
# copy of node), saturated (wrk -t1 -c16, as bench.sh's saturated part),
# the configurations interleaved in each round; the app's CPU per request
# (utime + stime from /proc) per configuration, median of the rounds.
#
#   sudo [ROUNDS=5] [BENCH_SECONDS=5] bench/trap_cost.sh [UVSPAN_BINARY]
# Needs wrk, jq and python3. Not part of bench.sh.
set -euo pipefail
bin=$(realpath "${1:-$(dirname "$0")/../target/release/uvspan}")
cd "$(dirname "$0")"
rounds=${ROUNDS:-5}
secs=${BENCH_SECONDS:-5}
. ./start_app.sh
bench_begin trap_cost wrk jq python3
trap stop_all EXIT
start_app
"$bin" probes --pid "$app" --json > "$work/plan.json"

ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$app/stat"; }
# One measured run: prints the app's CPU ns per request.
measure() {
  local c0 c1 n
  c0=$(cpu)
  BENCH_DELAY_MS=0 wrk -t1 -c16 -d"${secs}s" --timeout 5s -s pace.lua "http://127.0.0.1:$port/" > "$work/wrk.out"
  c1=$(cpu)
  n=$(sed -n 's/^WRKJSON //p' "$work/wrk.out" | jq .requests)
  echo $(( (c1 - c0) * 1000000000 / ticks / n )) "$n"
}
wait_line() { for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done; echo "trap_cost: no '$2' in $1" >&2; cat "$1" >&2; exit 1; }

wrk -t1 -c16 -d2s "http://127.0.0.1:$port/" > /dev/null # warm-up
configs=(bare perf floor uvspan)
for r in $(seq "$rounds"); do
  for c in "${configs[@]}"; do
    case $c in
      perf)
        python3 perf_uprobes.py "$app" < "$work/plan.json" > "$work/side.out" 2> "$work/side.err" &
        side=$!; wait_line "$work/side.out" '^attached' ;;
      floor|uvspan)
        env $([ $c = floor ] && echo UVSPAN_BENCH_TRAP_ONLY=1) "$bin" --otlp-endpoint http://127.0.0.1:9 --pid "$app" > /dev/null 2> "$work/side.err" &
        side=$!; wait_line "$work/side.err" 'probes live\|attached'; sleep 1 ;;
    esac
    read -r ns n < <(measure)
    hits=
    if [ -n "$side" ]; then
      kill -INT "$side"; wait "$side" 2>/dev/null || true; side=
      [ $c = perf ] && hits=$(sed -n 's/^hits //p' "$work/side.out")
    fi
    echo "$r $c $ns $n ${hits:-}" >> "$work/runs"
    echo "round $r $c: $((ns / 1000)) µs/request ($n requests${hits:+, $hits hits})" >&2
  done
done
awk '
  { ns[$2] = ns[$2] " " $3; if ($5 != "") { h[$2] += $5; q[$2] += $4 } }
  function median(s,   a, n, i, j, t) {
    n = split(s, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    b = median(ns["bare"])
    printf "%-44s %12s %8s\n", "configuration (saturated, median of rounds)", "µs/request", "× bare"
    split("bare perf floor uvspan", order, " ")
    name["bare"] = "bare"; name["perf"] = "plain uprobes at uvspan'"'"'s points (no BPF)"
    name["floor"] = "uvspan, trap floor"; name["uvspan"] = "uvspan, defaults"
    for (i = 1; i <= 4; i++) { c = order[i]; m = median(ns[c]); printf "%-44s %12.1f %8.2f\n", name[c], m / 1000, m / b }
    if (q["perf"]) {
      per = h["perf"] / q["perf"]
      printf "plain uprobes: %.2f hits per request (counted), %.2f µs of app CPU per hit\n", per, (median(ns["perf"]) - b) / 1000 / per
    }
  }' "$work/runs"
