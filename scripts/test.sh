#!/usr/bin/env bash
# The test suite: unit and golden tests (no root) and end-to-end tests that
# trace real node processes with eBPF and receive real OTLP (root needed).
# Every test binary runs even when one fails; the last line sums them all:
# "N passed, N failed[, N ignored]". The exit status is non-zero when any
# test failed or a test binary did not build or run to its end.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ "$(id -u)" -ne 0 ]; then
  echo "test: the end-to-end tests load eBPF programs: run as root (sudo $0)" >&2
  exit 1
fi
# The official OpenTelemetry JS SDK, the oracle of tests/requests.rs, pinned by
# bench/package-lock.json (the benchmark uses the same).
if [ ! -e bench/node_modules/.package-lock.json ] || ! cmp -s bench/package-lock.json bench/node_modules/.bench-lock; then
  echo "test: npm ci in bench/ (OpenTelemetry JS SDK)" >&2
  (cd bench && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  cp bench/package-lock.json bench/node_modules/.bench-lock
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --release --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
./scripts/test-summary.sh "$log" "$status"
