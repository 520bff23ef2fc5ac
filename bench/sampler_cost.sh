#!/usr/bin/env bash
# Analysis tool, not run by bench.sh: what the trace sampler decided in the
# kernel saves, per request of the saturated harness (bench/app.js under
# wrk -c16), for each OTEL_TRACES_SAMPLER: probe hits (BPF program runs),
# ns inside BPF per hit and per request (kernel.bpf_stats_enabled, this
# uvspan's programs only), and uvspan's own CPU per request. Rounds are
# interleaved; each line is one run.
#
#   sudo bench/sampler_cost.sh [UVSPAN_BINARY] [ROUNDS] [SECONDS]
#
# SAMPLER_COST_CONFIGS="always_off always_off+tail" runs only those.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/uvspan} rounds=${2:-3} secs=${3:-5}
[ "$(id -u)" -eq 0 ] || { echo "sampler_cost: run as root" >&2; exit 1; }
for t in wrk bpftool jq; do command -v $t >/dev/null || { echo "sampler_cost: needs $t" >&2; exit 1; }; done
was=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1
trap 'sysctl -qw kernel.bpf_stats_enabled=$was' EXIT
ticks=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
printf "%-28s %9s %10s %10s %12s %14s %10s\n" sampler requests hits/req "ns/hit" "BPF ns/req" "uvspan µs/req" spans
for r in $(seq "$rounds"); do
  # "/sent": unsampled HTTP/1 requests sent up as records, not followed in
  # the kernel (UVSPAN_BENCH_NO_FOLLOW=1), for what following them saves.
  # "+tail": with the tail exceptions (--keep-errors --keep-slower-than
  # 1s; the app's requests are all 200s and fast: none is kept), decided
  # in the kernel, or ("/sent") in user space from every request's records.
  for s in ${SAMPLER_COST_CONFIGS:-always_on parentbased_traceidratio:0.1 parentbased_traceidratio:0.1/sent always_off \
    always_off/sent always_off+tail always_off+tail/sent}; do
    sent=0 tail=()
    [ "${s%/sent}" != "$s" ] && sent=1
    spec=${s%/sent}
    [ "${spec%+tail}" != "$spec" ] && tail=(--keep-errors --keep-slower-than 1s)
    spec=${spec%+tail}
    out=$(mktemp)
    : > "$out.err"
    node bench/app.js > "$out" &
    app=$!
    for _ in $(seq 100); do grep -q port "$out" && break; sleep 0.05; done
    port=$(jq .port "$out")
    UVSPAN_BENCH_NO_FOLLOW=$sent OTEL_TRACES_SAMPLER=${spec%%:*} OTEL_TRACES_SAMPLER_ARG=$([ "${spec#*:}" != "$spec" ] && echo "${spec#*:}" || true) \
      "$bin" --otlp-endpoint http://127.0.0.1:9 --status-interval 0 ${tail[@]+"${tail[@]}"} --pid "$app" 2> "$out.err" &
    up=$!
    for _ in $(seq 200); do grep -q "probes live\|attached in" "$out.err" && break; sleep 0.05; done
    wrk -t2 -c16 -d1s "http://127.0.0.1:$port/" > /dev/null # warm
    ids=$(grep -h '^prog_id:' /proc/"$up"/fdinfo/* 2>/dev/null | awk '{print $2}' | sort -un | paste -sd, -)
    stats() { bpftool prog show -j | jq -r --arg ids "[$ids]" '($ids | fromjson) as $m | [.[] | select(.id as $i | $m | index($i))] | "\(map(.run_cnt // 0) | add) \(map(.run_time_ns // 0) | add)"'; }
    read -r c0 n0 < <(stats)
    u0=$(cpu_ticks "$up")
    reqs=$(wrk -t2 -c16 -d"${secs}s" "http://127.0.0.1:$port/" | awk '/requests in/ {print $1}')
    read -r c1 n1 < <(stats)
    u1=$(cpu_ticks "$up")
    kill "$app"; wait "$app" 2>/dev/null || true
    kill -INT "$up"; wait "$up" 2>/dev/null || true
    spans=$(grep -o 'spans: [0-9]* exported\|[0-9]* not flushed' "$out.err" | grep -o '[0-9]*' | paste -sd+ - | bc)
    awk -v s="$s" -v q="$reqs" -v c=$((c1 - c0)) -v n=$((n1 - n0)) -v u=$((u1 - u0)) -v hz="$ticks" -v sp="$spans" \
      'BEGIN { printf "%-28s %9d %10.2f %10.0f %12.0f %14.2f %10d\n", s, q, c / q, n / c, n / q, u * 1e6 / hz / q, sp }'
    rm -f "$out" "$out.err"
  done
done
