#!/usr/bin/env bash
# The benchmark: uvspan's overhead on a Node app (vs. bare and vs. the
# OpenTelemetry JS SDK), per-operation cost, sidecar throughput, attach latency.
#
#   sudo ./scripts/bench.sh            full run (~4-5 minutes) -> bench/results/results.{md,json}
#   sudo ./scripts/bench.sh --quick    seconds-long smoke (CI)  -> bench/results/quick/
#   sudo ./scripts/bench.sh --only statloop,attach   some parts only
#
# Installs what it needs, idempotently: the build packages (scripts/setup.sh),
# wrk (apt), the OpenTelemetry JS SDK (npm ci into bench/node_modules).
# Environment: BENCH_ROUNDS (5), BENCH_SECONDS (6), BENCH_RATE (1000 req/s),
# BENCH_OTLP_PROTOCOL (grpc | http/protobuf), BENCH_NODE (node binary to copy).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "bench: uvspan loads eBPF programs: run as root (sudo $0)" >&2
  exit 1
fi
./scripts/setup.sh

if ! command -v wrk >/dev/null; then
  echo "bench: installing wrk" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends wrk >/dev/null
fi
# bench/perf_uprobes.py: the saturated part's plain-uprobe configuration
if ! command -v python3 >/dev/null; then
  echo "bench: installing python3" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends python3 >/dev/null
fi

# The OpenTelemetry JS SDK, pinned by bench/package-lock.json.
if [ ! -e bench/node_modules/.package-lock.json ] || ! cmp -s bench/package-lock.json bench/node_modules/.bench-lock; then
  echo "bench: npm ci (OpenTelemetry JS SDK)" >&2
  (cd bench && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  cp bench/package-lock.json bench/node_modules/.bench-lock
fi

cargo build --release --quiet

# Private copies, so the run is not disturbed by what else happens here:
# - uvspan: a rebuild of target/ during the run does not swap the binary;
# - node: uprobes are per file (inode), so other uvspan/bpftrace sessions
#   attached to /usr/bin/node (e.g. `uvspan -- node` in tests) do not fire
#   in the benchmark's processes.
work=$(mktemp -d /tmp/uvspan-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp target/release/uvspan "$work/uvspan"
cp "$(command -v "${BENCH_NODE:-node}")" "$work/node"

"$work/node" bench/run.js --uvspan "$work/uvspan" --node "$work/node" "$@"
