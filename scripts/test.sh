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
# npm packages the tests run, each folder pinned by its package-lock.json:
# bench/ the official OpenTelemetry JS SDK, the oracle of tests/requests.rs
# (the benchmark uses the same); tests/realcode/ the packages of
# tests/realcode.rs (express, compression, undici, pg, ioredis); tests/db/
# the database and cache drivers of tests/db.rs (pg, postgres, mysql2,
# ioredis, redis, express); tests/sdk/ the zero-code OpenTelemetry JS SDK
# of tests/sdk_join.rs (@opentelemetry/auto-instrumentations-node).
for d in bench tests/realcode tests/db tests/sdk; do
  if [ ! -e "$d/node_modules/.package-lock.json" ] || ! cmp -s "$d/package-lock.json" "$d/node_modules/.lock-installed"; then
    echo "test: npm ci in $d/" >&2
    (cd "$d" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    cp "$d/package-lock.json" "$d/node_modules/.lock-installed"
  fi
done
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --release --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
./scripts/test-summary.sh "$log" "$status"
