#!/usr/bin/env bash
# The demo: set up, build, and trace examples/demo.js with spans on the console,
# with every optional detail on (--detail all: threadpool split, loop phases).
# Pass OTEL_EXPORTER_OTLP_ENDPOINT=http://host:4317 to send them to a collector instead.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build --release --quiet
exec ./target/release/uvspan --detail all --loop-threshold 20ms -- node examples/demo.js "$@"
