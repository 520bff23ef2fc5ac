#!/usr/bin/env bash
# What the kernel's uprobe traps alone cost bench/app.js, without uvspan's
# programs: plain counting uprobes (perf_uprobes.py: perf_event_open on the
# uprobe PMU, no BPF program, no tracefs) at every point uvspan's plan for
# the app uses, beside bare, uvspan's trap floor (UVSPAN_BENCH_TRAP_ONLY=1:
# its programs return at once) and uvspan's defaults. One app (a private
# copy of node), saturated (wrk -t1 -c16, as bench.sh's saturated part),
# the configurations interleaved in each round; the app's CPU per request
# (utime + stime from /proc) per configuration, median of the rounds.
# With SUBSETS (names from: ops http epoll one), also plain uprobes at part
# of the points only: ops (the fs and DNS submits and the batch of their
# ends), http (the request's read, head and response), epoll (the loop's
# waits), one (uv_fs_open alone: one hit per request): what the first hits
# cost beside the later ones. Each round starts at another configuration;
# each is also paired with that round's bare run (the median of the
# differences), for the whole app and for its loop thread alone ("loop",
# where every probe point here is).
#
#   sudo [ROUNDS=5] [BENCH_SECONDS=5] [SUBSETS="ops http epoll one"] bench/trap_cost.sh [UVSPAN_BINARY]
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
# The points of each configuration of plain uprobes, by symbol (perf: all).
declare -A subset=(
  [perf]=''
  [ops]='^(uv_fs_open|uv_fs_fstat|uv_fs_read|uv_fs_close|uv_getaddrinfo|uv__work_done)$'
  [http]='^(llhttp__on_message_begin|uv__stream_io|uv_try_write)$'
  [epoll]='^(epoll_wait|epoll_pwait)$'
  [one]='^uv_fs_open$'
)
for s in perf ${SUBSETS:-}; do
  [ -n "${subset[$s]+set}" ] || { echo "trap_cost: no subset $s (ops http epoll one)" >&2; exit 2; }
  jq --arg r "${subset[$s]}" '.probes |= map(select(.symbol | test($r)))' "$work/plan.json" > "$work/plan-$s.json"
done

ticks=$(getconf CLK_TCK)
# utime + stime of the app (its stat) or of its loop thread, the main one
# (task/PID/stat: every probe point here is on it).
cpu() { awk '{print $14 + $15}' "$1"; }
# One measured run: prints the app's CPU ns per request, the requests and
# the loop thread's CPU ns per request.
measure() {
  local c0 c1 l0 l1 n
  c0=$(cpu "/proc/$app/stat"); l0=$(cpu "/proc/$app/task/$app/stat")
  BENCH_DELAY_MS=0 wrk -t1 -c16 -d"${secs}s" --timeout 5s -s pace.lua "http://127.0.0.1:$port/" > "$work/wrk.out"
  c1=$(cpu "/proc/$app/stat"); l1=$(cpu "/proc/$app/task/$app/stat")
  n=$(sed -n 's/^WRKJSON //p' "$work/wrk.out" | jq .requests)
  echo $(( (c1 - c0) * 1000000000 / ticks / n )) "$n" $(( (l1 - l0) * 1000000000 / ticks / n ))
}
wait_line() { for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done; echo "trap_cost: no '$2' in $1" >&2; cat "$1" >&2; exit 1; }

wrk -t1 -c16 -d2s "http://127.0.0.1:$port/" > /dev/null # warm-up
configs=(bare perf floor uvspan ${SUBSETS:-})
for r in $(seq "$rounds"); do
  for k in "${!configs[@]}"; do
    c=${configs[$(( (k + r - 1) % ${#configs[@]} ))]}
    case $c in
      bare) ;;
      floor|uvspan)
        env $([ $c = floor ] && echo UVSPAN_BENCH_TRAP_ONLY=1) "$bin" --otlp-endpoint http://127.0.0.1:9 --pid "$app" > /dev/null 2> "$work/side.err" &
        side=$!; wait_line "$work/side.err" 'probes live\|attached'; sleep 1 ;;
      *)
        python3 perf_uprobes.py "$app" < "$work/plan-$c.json" > "$work/side.out" 2> "$work/side.err" &
        side=$!; wait_line "$work/side.out" '^attached' ;;
    esac
    read -r ns n loop < <(measure)
    hits=
    if [ -n "$side" ]; then
      kill -INT "$side"; wait "$side" 2>/dev/null || true; side=
      case $c in floor|uvspan) ;; *) hits=$(sed -n 's/^hits //p' "$work/side.out") ;; esac
    fi
    echo "$r $c $ns $n $loop ${hits:-}" >> "$work/runs"
    echo "round $r $c: $((ns / 1000)) µs/request ($n requests${hits:+, $hits hits})" >&2
  done
done
awk -v order="${configs[*]}" '
  { ns[$2] = ns[$2] " " $3; at[$1, $2] = $3; lp[$1, $2] = $5; rounds[$1] = 1; if ($6 != "") { h[$2] += $6; q[$2] += $4 } }
  function median(s,   a, n, i, j, t) {
    n = split(s, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    name["bare"] = "bare"; name["perf"] = "plain uprobes at uvspan'"'"'s points (no BPF)"
    name["floor"] = "uvspan, trap floor"; name["uvspan"] = "uvspan, defaults"
    name["ops"] = "plain uprobes: fs and DNS points only"; name["http"] = "plain uprobes: HTTP points only"
    name["epoll"] = "plain uprobes: epoll waits only"; name["one"] = "plain uprobes: uv_fs_open only"
    b = median(ns["bare"])
    printf "%-44s %11s %7s %11s %11s %9s %9s\n", "configuration (saturated, median of rounds)", "µs/request", "× bare", "paired +µs", "loop +µs", "hits/req", "+µs/hit"
    n = split(order, cs, " ")
    for (i = 1; i <= n; i++) {
      c = cs[i]; d = ""; dl = ""
      for (r in rounds) if ((r, c) in at && (r, "bare") in at) {
        d = d " " (at[r, c] - at[r, "bare"]); dl = dl " " (lp[r, c] - lp[r, "bare"])
      }
      m = median(ns[c]); pd = median(d) / 1000
      per = q[c] ? h[c] / q[c] : 0
      printf "%-44s %11.1f %7.2f %11.1f %11.1f %9s %9s\n", name[c], m / 1000, m / b, pd, median(dl) / 1000,
        per ? sprintf("%.2f", per) : "–", per ? sprintf("%.2f", pd / per) : "–"
    }
  }' "$work/runs"
