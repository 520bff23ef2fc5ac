# Sourced by the analysis scripts (from bench/, with $work a temporary
# directory): start_app starts app.js on a private copy of node in $work
# (uprobes belong to a file: other tracers' probes on the system's node do
# not fire in it) and sets app (its pid) and port.
start_app() {
  cp "$(command -v node)" "$work/node"
  "$work/node" app.js > "$work/app.out" &
  app=$!
  for _ in $(seq 100); do grep -q port "$work/app.out" && break; sleep 0.05; done
  port=$(jq -r .port "$work/app.out")
}
