#!/usr/bin/env bash
# Cost of one uprobe hit at each libuv function uvspan probes, without BPF:
# a plain tracefs uprobe (perf probe) on a private copy of node, hit by a
# fs.statSync loop or by the loop phases. Shows the probed function's first
# instruction: the kernel emulates a few (push, nop, jmp/jcc/call) and must
# single-step the others out of line, which costs a second trap (#DB) — in a
# VM that traps to the hypervisor, tens of microseconds here.
#
#   sudo bench/probe_cost.sh [SYMBOL[+OFF] ...]
# Default: uv_fs_stat uv__fs_work uv_fs_req_cleanup uv_fs_req_cleanup+3.
# Needs perf (Debian: linux-perf) and objdump (binutils). Not part of bench.sh.
set -euo pipefail
cd "$(dirname "$0")"
command -v perf >/dev/null || { echo "probe_cost: needs perf (apt-get install linux-perf)" >&2; exit 1; }
command -v objdump >/dev/null || { echo "probe_cost: needs objdump (apt-get install binutils)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "probe_cost: run as root" >&2; exit 1; }

work=$(mktemp -d /tmp/uvspan-probecost.XXXXXX)
group=probe_$(basename "$work" | tr -c 'a-zA-Z0-9\n' '_')
cleanup() { perf probe -q -d "${group}:*" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
node_bin="$work/node"
cp "$(command -v node)" "$node_bin"
ops=200000
cat > "$work/loop.js" <<EOF
const fs = require('fs');
for (let i = 0; i < $ops; i++) fs.statSync(__filename); // warm up
const c0 = process.cpuUsage();
for (let i = 0; i < $ops; i++) fs.statSync(__filename);
const c = process.cpuUsage(c0);
console.log(((c.user + c.system) * 1000 / $ops).toFixed(0));
EOF

[ $# -gt 0 ] || set -- uv_fs_stat uv__fs_work uv_fs_req_cleanup uv_fs_req_cleanup+3
bare=$("$node_bin" "$work/loop.js")
printf '%-26s %-40s %10s %12s %14s\n' probe "instruction" "hits/op" "CPU ns/op" "ns per hit"
printf '%-26s %-40s %10s %12s %14s\n' "(none)" "" 0 "$bare" ""
i=0
for p in "$@"; do
  sym=${p%%+*}; off=0; [ "$sym" != "$p" ] && off=${p#*+}
  addr=$(nm "$node_bin" 2>/dev/null | awk -v s="$sym" '$3 == s && !f {print $1; f = 1}')
  [ -n "$addr" ] || { echo "probe_cost: $sym not found" >&2; continue; }
  start=$((16#$addr + off))
  insn=$(objdump -d --no-show-raw-insn --start-address="$start" --stop-address=$((start + 16)) "$node_bin" \
    | awk -F'\t' '/^ +[0-9a-f]+:/ && !f {print $2; f = 1}' | tr -s ' ')
  i=$((i + 1))
  perf probe -q -x "$node_bin" -a "${group}:p$i=$p" >/dev/null
  perf stat -x, -o "$work/stat" -e "${group}:p$i" "$node_bin" "$work/loop.js" > "$work/out"
  ns=$(cat "$work/out")
  hits=$(awk -F, '/p'"$i"'/ {print $1}' "$work/stat")
  hpo=$(awk -v h="$hits" -v o="$ops" 'BEGIN {printf "%.2f", h / (2 * o)}')
  per=$(awk -v n="$ns" -v b="$bare" -v h="$hpo" 'BEGIN {if (h > 0) printf "%.0f", (n - b) / h; else print "-"}')
  printf '%-26s %-40s %10s %12s %14s\n' "$p" "$insn" "$hpo" "$ns" "$per"
  perf probe -q -d "${group}:p$i" >/dev/null
done
