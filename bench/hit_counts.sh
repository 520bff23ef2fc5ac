#!/usr/bin/env bash
# Probe hits per request, by probe point, and what uvspan's BPF programs
# cost per run: bench/app.js (fs.readFile + dns.lookup per request) on a
# private copy of node, driven by wrk, traced by uvspan --pid with
# UVSPAN_BENCH_COUNT_HITS=1 (the kernel counts every uprobe hit by attach
# point; uvspan prints the counts at exit), UVSPAN_BENCH_TIME_HITS=1 (the
# time inside uvspan's program per hit, by attach point: see below) and
# kernel.bpf_stats_enabled=1
# (run_cnt and run_time_ns of this uvspan's programs, read before it exits).
# Hits before the load starts (an idle loop's few iterations) are counted
# too; requests are wrk's completed ones.
#
#   sudo [BENCH_MODE=saturated|paced] [BENCH_SECONDS=5] bench/hit_counts.sh [UVSPAN_BINARY] [extra uvspan options...]
# saturated (default): wrk -t1 -c16, closed loop, as bench.sh's saturated
# part; paced: wrk -t1 -c10 with 10 ms between a connection's requests
# (~1000 requests/s, the loop sleeps between them).
# Needs wrk, bpftool and jq. Not part of bench.sh.
set -euo pipefail
bin=$(realpath "${1:-$(dirname "$0")/../target/release/uvspan}"); shift || true
cd "$(dirname "$0")"
. ./start_app.sh
secs=${BENCH_SECONDS:-5}
bench_mode hit_counts
bench_begin hit_counts wrk bpftool jq
was=$(sysctl -n kernel.bpf_stats_enabled)
cleanup() {
  stop_all
  sysctl -qw kernel.bpf_stats_enabled="$was"
}
trap cleanup EXIT
start_app
sysctl -qw kernel.bpf_stats_enabled=1
UVSPAN_BENCH_COUNT_HITS=1 UVSPAN_BENCH_TIME_HITS=1 "$bin" --otlp-endpoint http://127.0.0.1:9 "$@" --pid "$app" > /dev/null 2> "$work/uvspan.err" &
side=$!
for _ in $(seq 200); do grep -q '^prog_id:' /proc/"$side"/fdinfo/* 2>/dev/null && [ "$(grep -c 'uvspan' "$work/uvspan.err")" -gt 0 ] && break; sleep 0.05; done
sleep 1 # attached: its first lines are out
BENCH_DELAY_MS=$delay wrk -t1 -c"$conns" -d"${secs}s" --timeout 5s -s pace.lua "http://127.0.0.1:$port/" > "$work/wrk.out"
reqs=$(sed -n 's/^WRKJSON //p' "$work/wrk.out" | jq .requests)
ids=$(grep -h '^prog_id:' /proc/"$side"/fdinfo/* 2>/dev/null | awk '{print $2}' | sort -un | paste -sd, -)
progs=$(bpftool prog show -j | jq -r --arg ids "[$ids]" '
  ($ids | fromjson) as $mine
  | [.[] | select(.id as $i | $mine | index($i)) | select(.run_cnt > 0) | select(.name | startswith("bench_") | not)]
  | sort_by(-.run_cnt)[] | "\(.name) \(.run_cnt) \(.run_time_ns)"')
kill -INT "$side"; wait "$side" || true; side=
echo "mode $mode: wrk -t1 -c$conns, ${delay} ms between a connection's requests, ${secs} s: $reqs requests"
echo "$progs" | awk -v n="$reqs" '
  BEGIN { printf "%-22s %12s %10s %12s\n", "BPF program", "runs", "ns/run", "runs/request" }
  NF == 3 { printf "%-22s %12d %10.0f %12.2f\n", $1, $2, $3 / $2, $2 / n; runs += $2; ns += $3 }
  END { printf "%-22s %12d %10.0f %12.2f   (BPF ns/request %.0f)\n", "all", runs, runs ? ns / runs : 0, runs / n, ns / n }'
echo
# ns/hit: the time inside uvspan's program at that point (hit-ns lines:
# per hit, hits timed, not timed as out of order, over 1 ms), between two
# benchmark programs the kernel runs just before and just after it; it
# includes one program's entry and exit (compare the trap floor's, with
# UVSPAN_BENCH_TRAP_ONLY=1). The timing programs count the entry hits (so
# that uvspan's own count is not inside the time); uvspan counts a session
# probe's returns. Entries only: "-" ns for a session's returns.
{ sed -n 's/^uvspan: hit-ns /T /p' "$work/uvspan.err"; sed -n 's/^uvspan: hits /H /p' "$work/uvspan.err"; } | awk -v n="$reqs" '
  BEGIN { printf "%-60s %10s %12s %8s\n", "probe point", "hits", "hits/request", "ns/hit" }
  $1 == "T" { ns = $2; $1 = $2 = $3 = ""; u += $4; o += $5; $4 = $5 = ""; sub(/^ +/, ""); per[$0] = ns; next }
  { c = $2; $1 = $2 = ""; sub(/^ +/, ""); name[++k] = $0; hits[k] = c; t += c }
  END {
    for (i = 1; i <= k; i++) {
      s = name[i]; if (length(s) > 60) s = substr(s, 1, 57) "..."
      printf "%-60s %10d %12.2f %8s\n", s, hits[i], hits[i] / n, (name[i] in per) ? per[name[i]] : "-"
    }
    for (p in per) {
      for (i = 1; i <= k; i++) if (name[i] == p) break
      if (i <= k) continue
      s = p; if (length(s) > 60) s = substr(s, 1, 57) "..."
      printf "%-60s %10s %12s %8s\n", s, "-", "-", per[p]
    }
    printf "%-60s %10d %12.2f\n", "all uprobe hits", t, t / n
    if (u + o) printf "(hits not timed: %d out of order, %d over 1 ms)\n", u, o
  }'
