#!/usr/bin/env bash
# What request context costs an HTTP/1.1 server in uvspan's BPF programs,
# per request (kernel.bpf_stats_enabled: runs and ns of each program): a
# keep-alive server answering at once (bench/http1_cost.js), one request per
# write, or PIPELINE=3 requests per write.
#
#   sudo [PIPELINE=3] [REQUESTS=4000] bench/http1_cost.sh [UVSPAN_BINARY] [uvspan options...]
# Needs root, bpftool and jq. Not part of bench.sh.
set -euo pipefail
cd "$(dirname "$0")"
# shellcheck source=prog_stats.sh
. ./prog_stats.sh
bin=${1:-../target/release/uvspan}
shift || true
prog_stats_run http1_cost http1_cost.js requests 400 each "$bin" --loop-threshold 10s "$@"
