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
cargo test --release "$@"
