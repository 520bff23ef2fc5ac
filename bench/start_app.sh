# Sourced by the analysis scripts (from bench/, with $work a temporary
# directory): start_app starts app.js on a private copy of node in $work
# (uprobes belong to a file: other tracers' probes on the system's node do
# not fire in it) and sets app (its pid) and port; stop_all (for an EXIT
# trap) stops the sidecar running ($side, if any) and the app, and removes
# $work.
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
