# Sourced by the analysis scripts (from bench/). bench_begin NAME TOOL...
# checks for root and the tools and makes $work, a temporary directory;
# bench_mode NAME sets the load from BENCH_MODE (conns: wrk's connections,
# delay: pace.lua's ms between a connection's requests); start_app starts
# app.js on a private copy of node in $work (uprobes belong to a file:
# other tracers' probes on the system's node do not fire in it) and sets
# app (its pid) and port; stop_all (for an EXIT trap) stops the sidecar
# running ($side, if any) and the app, and removes $work.
app=; side=
stop_all() {
  [ -n "$side" ] && kill -INT "$side" 2>/dev/null && wait "$side" 2>/dev/null || true
  [ -n "$app" ] && kill "$app" 2>/dev/null && wait "$app" 2>/dev/null || true
  rm -rf "$work"
}
start_app() {
  cp "$(command -v node)" "$work/node"
  "$work/node" app.js > "$work/app.out" &
  app=$!
  for _ in $(seq 100); do grep -q port "$work/app.out" && break; sleep 0.05; done
  port=$(jq -r .port "$work/app.out")
}
bench_begin() {
  local name=$1 t
  shift
  [ "$(id -u)" -eq 0 ] || { echo "$name: run as root" >&2; exit 1; }
  for t in "$@"; do command -v "$t" > /dev/null || { echo "$name: needs $t" >&2; exit 1; }; done
  work=$(mktemp -d "/tmp/uvspan-$name.XXXXXX")
}
bench_mode() {
  mode=${BENCH_MODE:-saturated}
  case $mode in
    saturated) conns=16; delay=0 ;;
    paced) conns=10; delay=10 ;;
    *) echo "$1: BENCH_MODE is saturated or paced, not $mode" >&2; exit 2 ;;
  esac
}
