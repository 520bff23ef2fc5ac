#!/usr/bin/env bash
# Where uvspan's BPF programs spend their time: bench/app.js (a private copy
# of node) traced by uvspan --pid under wrk, the app's CPU sampled by
# `perf record -e cpu-clock -g` (no PMU needed); of the samples inside the
# programs (their call chains pass uprobe_prog_run), the share of each kind
# of kernel work (reading the app's memory, hash maps, task-local storage,
# the clock, the ring buffer, the programs' own instructions, the rest) and
# of each BPF function (its callees included). Extra arguments go to uvspan;
# OTEL_* variables are passed through (OTEL_TRACES_SAMPLER=always_off:
# metrics only).
#
#   sudo [BENCH_MODE=saturated|paced] [BENCH_SECONDS=8] bench/bpf_profile.sh [UVSPAN_BINARY] [uvspan options...]
# Needs wrk, jq and perf. Not part of bench.sh. The sampling timer fires
# where interrupts are on: time with them off (the int3 trap's entry) is
# charged to where they come back on, so the trap's own cost is not split
# here (see trap_cost.sh); the programs run with interrupts on.
set -euo pipefail
bin=$(realpath "${1:-$(dirname "$0")/../target/release/uvspan}"); shift || true
cd "$(dirname "$0")"
. ./start_app.sh
secs=${BENCH_SECONDS:-8}
bench_mode bpf_profile
bench_begin bpf_profile wrk jq perf
trap stop_all EXIT
start_app
"$bin" --otlp-endpoint http://127.0.0.1:9 "$@" --pid "$app" > /dev/null 2> "$work/uvspan.err" &
side=$!
for _ in $(seq 200); do grep -q '^prog_id:' /proc/"$side"/fdinfo/* 2>/dev/null && break; sleep 0.05; done
sleep 1
BENCH_DELAY_MS=$delay wrk -t1 -c"$conns" -d"$((secs + 2))s" --timeout 5s -s pace.lua "http://127.0.0.1:$port/" > "$work/wrk.out" &
load=$!
sleep 1
perf record -q -e cpu-clock -F 4999 -g -p "$app" -o "$work/perf.data" -- sleep "$secs" 2> /dev/null
wait "$load"
reqs=$(sed -n 's/^WRKJSON //p' "$work/wrk.out" | jq .requests)
echo "mode $mode: wrk -t1 -c$conns, ${delay} ms between a connection's requests; $reqs requests in $((secs + 2)) s, ${secs} s sampled"

report() { perf report -i "$work/perf.data" --stdio -g none --percent-limit 0 "$@" 2> /dev/null | grep -v '^#' | grep -v '^$'; }
# Self time inside the programs, by kind.
report --no-children --sort sym --parent uprobe_prog_run -x | awk '
  { p = $1; sub("%", "", p); s = $NF == "uprobe_prog_run" ? $(NF - 1) : $NF; all += p
    if (s ~ /^bpf_prog_/) k = "the programs'"'"' own instructions"
    else if (s ~ /copy_from_user|probe_read|check_object_size|check_stack_object|check_heap_object|is_vmalloc_addr|virt_addr_valid|uaccess_okay|strncpy_from_user|copy_from_kernel|find_vmap_area/) k = "reading the app'"'"'s memory (bpf_probe_read_user and its checks)"
    else if (s ~ /htab|lookup_nulls_elem|lookup_elem_raw|pcpu_freelist|bpf_lru|jhash/) k = "hash maps (lookup, update, delete)"
    else if (s ~ /task_storage|local_storage|get_current_task/) k = "task-local storage"
    else if (s ~ /ktime|read_tsc|clocksource/) k = "the clock"
    else if (s ~ /ringbuf/) k = "the ring buffer"
    else k = "the rest (dispatch, cookies, bpf_loop, pid and cgroup helpers)"
    by[k] += p }
  END { if (!all) { print "bpf_profile: no sample inside uvspan'"'"'s programs" > "/dev/stderr"; exit 1 }
        printf "\nInside the programs: %.2f%% of the app'"'"'s samples. By kind of work (self time):\n", all
        for (k in by) printf "  %5.1f%%  %s\n", 100 * by[k] / all, k | "sort -rn"; close("sort -rn")
        print all > "'"$work/all"'" }'
all=$(cat "$work/all")
echo
echo "By BPF function, its callees included (share of the programs' samples; nested functions count in each caller too):"
report --children --sort sym | awk -v all="$all" '$NF ~ /^bpf_prog_/ {
    p = $1; sub("%", "", p); n = $NF; sub(/^bpf_prog_[0-9a-f]+_/, "", n); t[n] += p }
  END { for (n in t) if (100 * t[n] / all >= 1) printf "  %5.1f%%  %s\n", 100 * t[n] / all, n | "sort -rn" }'
