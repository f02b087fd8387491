#!/usr/bin/env bash
# A fedhet run on a local Flower deployment: one SuperLink and N SuperNodes on 127.0.0.1 (insecure, loopback only),
# each node loading its own partition file, then `flwr run` of fedhet's ServerApp/ClientApp. See docs/flower.md.
#
#   scripts/flower_local.sh CONFIG.yaml RUN_FOLDER [NODES]      (default 3 nodes)
#
# Environment: VENV (default .venv-flower), PORT (SuperLink port, default 19300; nodes use PORT+1..PORT+N),
# TIMEOUT (seconds a node has per call before it is dropped, default 60), KEEP=1 leaves the processes running.
# Logs and the node pids are in RUN_FOLDER/deploy/. Kill a node with: kill "$(cat RUN_FOLDER/deploy/node-1.pid)"
set -euo pipefail
if [ $# -lt 2 ]; then sed -n '2,10p' "$0"; exit 2; fi
config=$(realpath "$1"); out=$(realpath -m "$2"); nodes=${3:-3}
bin=$(realpath "${VENV:-.venv-flower}")/bin
port=${PORT:-19300}; timeout=${TIMEOUT:-60}
[ -x "$bin/flower-superlink" ] || { echo "error: no Flower in $bin; run: make flower-venv" >&2; exit 2; }
work=$out/deploy
mkdir -p "$work/app" "$work/flwr-home" "$work/state"
export FLWR_HOME=$work/flwr-home FLWR_TELEMETRY_ENABLED=0 PATH="$bin:$PATH"  # SuperLink and SuperNodes start flower-superexec, flwr-serverapp, flwr-clientapp

pids=()
stop() { [ "${KEEP:-0}" = 1 ] || for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop EXIT

echo "writing $nodes partition files"
"$bin/python" -m fedhet.flower.partitions "$config" "$nodes" "$work/parts" > /dev/null

"$bin/flower-superlink" --insecure --host 127.0.0.1 --port "$port" --database "$work/superlink.db" \
  > "$work/superlink.log" 2>&1 &
pids+=($!); echo $! > "$work/superlink.pid"
for _ in $(seq 120); do (echo > "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.5; done
for i in $(seq 0 $((nodes - 1))); do
  "$bin/flower-supernode" --insecure --superlink "127.0.0.1:$port" --port $((port + 1 + i)) \
    --node-config "data-file='$work/parts/node-$i.pt' state-dir='$work/state/node-$i'" \
    > "$work/node-$i.log" 2>&1 &
  pids+=($!); echo $! > "$work/node-$i.pid"
done

# The Flower App: fedhet's apps, installed in the venv; only this pyproject.toml travels to the SuperLink.
cat > "$work/app/pyproject.toml" <<TOML
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedhet-flower-app"
version = "1.0.0"
dependencies = []

[tool.flwr.app]
publisher = "fedhet"

[tool.flwr.app.components]
serverapp = "fedhet.flower.apps:server_app"
clientapp = "fedhet.flower.apps:client_app"

[tool.flwr.app.config]
config = "$config"
out = "$out"
nodes = $nodes
timeout = $timeout
wait = 120
TOML
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "fedhet-local"

[superlink.fedhet-local]
address = "127.0.0.1:$port"
insecure = true
TOML

echo "SuperLink on 127.0.0.1:$port, $nodes SuperNodes; run folder $out"
"$bin/flwr" run "$work/app" fedhet-local --stream 2>&1 | tee "$work/flwr-run.log"
test -f "$out/summary.json" && "$bin/python" -c "import json,sys; s=json.load(open(sys.argv[1])); print('status:', s['status'], '| rounds:', s['rounds'], '| nodes lost:', s.get('nodes_lost'))" "$out/summary.json"
