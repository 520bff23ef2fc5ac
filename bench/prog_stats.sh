# Sourced by bench/*_cost.sh: what uvspan's BPF programs cost per unit of an
# app's work, from kernel.bpf_stats_enabled's run_cnt and run_time_ns.
#
#   prog_stats_run NAME APP_JS WAIT_KEY WAIT_TRIES TOTAL UVSPAN_BINARY [uvspan options...]
# runs `node APP_JS` (it writes one JSON object to $BENCH_OUT), traces it with
# uvspan --pid, waits until that file holds WAIT_KEY (WAIT_TRIES × 50 ms at
# most), then prints each of this uvspan's programs that ran (name, runs, ns,
# ns/run) and their runs per the JSON's WAIT_KEY count; with TOTAL=total,
# also the sum of all of them per unit (the process tracepoints run for every
# process on the host, so it suits only a unit far more frequent than
# forks); and stops both. NODE=path runs another node build (default: node
# on PATH). Needs root, bpftool and jq.

prog_stats_run() {
  local name=$1 app_js=$2 key=$3 tries=$4 total=$5 bin=$6
  shift 6
  [ "$(id -u)" -eq 0 ] || { echo "$name: run as root" >&2; exit 1; }
  command -v bpftool >/dev/null && command -v jq >/dev/null || { echo "$name: needs bpftool and jq" >&2; exit 1; }
  local was out app up units ids
  was=$(sysctl -n kernel.bpf_stats_enabled)
  sysctl -qw kernel.bpf_stats_enabled=1
  # shellcheck disable=SC2064 # $was now, not at exit
  trap "sysctl -qw kernel.bpf_stats_enabled=$was" EXIT
  out=$(mktemp)
  BENCH_OUT=$out "${NODE:-node}" "$app_js" &
  app=$!
  "$bin" --otlp-endpoint http://127.0.0.1:9 "$@" --pid "$app" > /dev/null 2>&1 &
  up=$!
  for _ in $(seq "$tries"); do grep -q "\"$key\"" "$out" && break; sleep 0.05; done
  cat "$out"
  units=$(jq ".$key" "$out")
  # this uvspan's programs (by the ids its descriptors hold: other tracers may run)
  ids=$(grep -h '^prog_id:' /proc/"$up"/fdinfo/* 2>/dev/null | awk '{print $2}' | sort -un | paste -sd, -)
  bpftool prog show -j | jq -r --arg ids "[$ids]" '
    ($ids | fromjson) as $mine
    | [.[] | select(.id as $i | $mine | index($i)) | select(.run_cnt > 0)]
    | sort_by(-.run_cnt)[] | "\(.name) \(.run_cnt) \(.run_time_ns)"' \
    | awk -v n="$units" -v unit="$key" -v total="$total" '
      BEGIN { printf "%-18s %12s %12s %10s %12s\n", "program", "runs", "ns total", "ns/run", "runs/" unit }
      { printf "%-18s %12d %12d %10.0f %12.2f\n", $1, $2, $3, $3 / $2, $2 / n; runs += $2; ns += $3 }
      END { if (total == "total") printf "%s %d; per one: %.2f program runs, %.0f ns\n", unit, n, runs / n, ns / n }'
  wait "$app"
  kill -INT "$up" 2>/dev/null; wait "$up" || true
  rm -f "$out"
}
