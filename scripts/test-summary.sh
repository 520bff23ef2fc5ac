#!/usr/bin/env bash
# The one summary line of a `cargo test` output (scripts/test.sh): the
# counts of every "test result:" line summed, "N passed, N failed" (and
# ", N ignored" when some were). Exits 1 when a test failed or cargo itself
# did not succeed (a binary that did not build, or died before its result
# line), else 0.
#   test-summary.sh LOG [CARGO_STATUS]
set -euo pipefail
log=$1
cargo_status=${2:-0}
read -r passed failed ignored binaries < <(awk '
  /^test result: / {
    n++
    for (i = 1; i <= NF; i++) {
      w = $(i + 1); sub(/[;,]$/, "", w)
      if (w == "passed") p += $i
      if (w == "failed") f += $i
      if (w == "ignored") g += $i
    }
  }
  END { printf "%d %d %d %d\n", p, f, g, n }' "$log")
if [ "$failed" -eq 0 ] && [ "$cargo_status" -ne 0 ]; then
  # Nothing failed by count, yet cargo did not succeed: a test binary that
  # did not build or did not reach its result line counts as one failure.
  echo "test: cargo test exited with $cargo_status after $binaries test binaries reported: one did not build or did not run to its end (see above)"
  failed=1
fi
line="$passed passed, $failed failed"
if [ "$ignored" -gt 0 ]; then
  line="$line, $ignored ignored"
fi
echo "$line"
[ "$failed" -eq 0 ]
