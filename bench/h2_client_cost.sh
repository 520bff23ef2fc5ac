#!/usr/bin/env bash
# What HTTP/2 CLIENT spans cost in uvspan's BPF programs, per client stream
# (kernel.bpf_stats_enabled: runs and ns of each program): a server whose
# handler makes CALLS=2 h2c calls per request to a backend in another
# process (bench/h2_client_cost.js; only the server is traced). For the part
# client spans add, run it again with NODE= a copy of the same node whose
# nghttp2_submit_request is renamed (its streams are then unknown to the
# kernel), e.g.
#   python3 -c "import sys; p=sys.argv[1]; b=open(p,'rb').read(); open(p,'wb').write(b.replace(b'\0nghttp2_submit_request\0', b'\0nghttp2_submit_requesX\0'))" /tmp/node-copy
# and --symbol-cache off (the copy has the same build-id).
#
#   sudo [NODE=…] [CALLS=2] [REQUESTS=2000] bench/h2_client_cost.sh [UVSPAN_BINARY] [uvspan options...]
# Needs root, bpftool and jq. Not part of bench.sh.
set -euo pipefail
cd "$(dirname "$0")"
# shellcheck source=prog_stats.sh
. ./prog_stats.sh
bin=${1:-../target/release/uvspan}
shift || true
prog_stats_run h2_client_cost h2_client_cost.js streams 600 each "$bin" --loop-threshold 10s "$@"
