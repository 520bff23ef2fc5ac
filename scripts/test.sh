#!/usr/bin/env bash
# The test suite: unit and golden tests (no root) and end-to-end tests that
# trace real node processes with eBPF and receive real OTLP (root needed).
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
# The database and cache drivers tests/db.rs runs (pg, postgres, mysql2,
# ioredis, redis, express), pinned by tests/db/package-lock.json.
if [ ! -e tests/db/node_modules/.package-lock.json ] || ! cmp -s tests/db/package-lock.json tests/db/node_modules/.db-lock; then
  echo "test: npm ci in tests/db/ (database drivers)" >&2
  (cd tests/db && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  cp tests/db/package-lock.json tests/db/node_modules/.db-lock
fi
cargo test --release "$@"
