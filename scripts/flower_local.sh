#!/usr/bin/env bash
# fedhet on a local Flower deployment: one SuperLink and N SuperNodes on 127.0.0.1 (insecure: loopback only), each
# node loading its own partition file, and `flwr run` of fedhet's ServerApp/ClientApp. See docs/flower.md.
#
#   scripts/flower_local.sh demo  CONFIG.yaml RUN_FOLDER [NODES]   start, run, stop (default 3 nodes)
#   scripts/flower_local.sh start CONFIG.yaml RUN_FOLDER [NODES]   partitions, SuperLink and SuperNodes (background)
#   scripts/flower_local.sh run   RUN_FOLDER      submit the run (resumes RUN_FOLDER's checkpoint if there is one);
#                                                 exit 2 when it is refused (its one `error:` line says why)
#   scripts/flower_local.sh kill  RUN_FOLDER I    stop SuperNode I (and the helpers it started)
#   scripts/flower_local.sh stop  RUN_FOLDER      stop everything started for RUN_FOLDER
#
# Environment: VENV (default .venv-flower), PORT (SuperLink port, default 19300; node i uses PORT+1+i),
# TIMEOUT (seconds a node has per call before the server drops it, default 60), ISOLATION (where each node's
# ClientApp runs: `none`, the default: each SuperNode, `python -m fedhet.flower.supernode --in-process` (Flower's,
# with shorter polls), runs it itself, keeping torch, the partition and the engine loaded; `process`: the same
# SuperNode in `--isolation process` beside one long-lived `python -m fedhet.flower.worker` that does so; with
# either, the SuperLink is `python -m fedhet.flower.superlink` (Flower's, each API's middleware kept to its paths);
# `subprocess`: Flower's own SuperLink, `flower-supernode` and isolation, a new flwr-clientapp process per message),
# ALLOW_IMPORTS (comma-separated modules and .py files the nodes may import for the config: its plugins, its torch
# model target; default none: built-in components only).
# Logs, pids, partitions and the Flower App are in RUN_FOLDER/deploy/.
set -euo pipefail
usage() { sed -n '2,/^# Logs/p' "$0"; exit 2; }  # the header, down to its last line
[ $# -ge 2 ] || usage
cmd=$1
bin=$(realpath "${VENV:-.venv-flower}")/bin
[ -x "$bin/flower-superlink" ] || { echo "error: no Flower in $bin; run: make flower-venv" >&2; exit 2; }
export FLWR_TELEMETRY_ENABLED=0 PATH="$bin:$PATH"  # SuperLink/SuperNodes start flower-superexec and the app processes

start() {
  local config out nodes port work
  config=$(realpath "$1"); out=$(realpath -m "$2"); nodes=${3:-3}; port=${PORT:-19300}; work=$out/deploy
  echo "writing $nodes partition files to $work/parts"
  # first claims RUN_FOLDER as fedhet's run folder (new, empty or fedhet's: its marker), then writes the partitions
  "$bin/python" -m fedhet.flower.partitions "$config" "$nodes" "$work/parts" --run-folder "$out" > /dev/null
  mkdir -p "$work/app" "$work/flwr-home" "$work/state"
  echo "$port $nodes" > "$work/ports"
  export FLWR_HOME=$work/flwr-home  # Flower's apps, runtime environments and configuration for this deployment
  local isolation=${ISOLATION:-none}
  case $isolation in none|process|subprocess) ;; *) echo "error: ISOLATION is none, process or subprocess" >&2; exit 2 ;; esac
  local superlink=("$bin/flower-superlink")
  if [ "$isolation" != subprocess ]; then  # Flower's SuperLink, its middleware kept to each API's paths (docs/flower.md)
    superlink=("$bin/python" -m fedhet.flower.superlink)
  fi
  "${superlink[@]}" --insecure --host 127.0.0.1 --port "$port" \
    > "$work/superlink.log" 2>&1 &
  echo $! > "$work/superlink.pid"
  for _ in $(seq 240); do (echo > "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.5; done
  local supernode=("$bin/flower-supernode" --isolation "$isolation")
  if [ "$isolation" = process ]; then  # Flower's SuperNode with fedhet's shorter polls (docs/flower.md)
    supernode=("$bin/python" -m fedhet.flower.supernode --isolation process)
  elif [ "$isolation" = none ]; then  # the same, answering its ClientApp tasks itself
    supernode=("$bin/python" -m fedhet.flower.supernode --in-process --warm)
  fi
  for i in $(seq 0 $((nodes - 1))); do
    "${supernode[@]}" --insecure --superlink "127.0.0.1:$port" --port $((port + 1 + i)) \
      --node-config "data-file='$work/parts/node-$i.pt' state-dir='$work/state/node-$i'${ALLOW_IMPORTS:+ allow-imports='$ALLOW_IMPORTS'}" \
      > "$work/node-$i.log" 2>&1 &
    echo $! > "$work/node-$i.pid"
    if [ "$isolation" = process ]; then  # the node's long-lived ClientApp process (docs/flower.md)
      "$bin/python" -m fedhet.flower.worker --runtime-api-address "127.0.0.1:$((port + 1 + i))" --insecure \
        --parent-pid "$(cat "$work/node-$i.pid")" --warm > "$work/worker-$i.log" 2>&1 &
    fi
  done
  # The Flower App: fedhet's apps are installed in the venv, so only this pyproject.toml travels to the SuperLink.
  cat > "$work/app/pyproject.toml" <<TOML
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedhet-flower-app"
version = "1.0.0"
description = "fedhet strategies on Flower (the app lives in the installed fedhet package)"
license = "Apache-2.0"
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
timeout = ${TIMEOUT:-60}
wait = 180
TOML
  cat > "$work/flwr-home/config.toml" <<TOML
[superlink]
default = "fedhet-local"

[superlink.fedhet-local]
address = "127.0.0.1:$port"
insecure = true
TOML
  echo "SuperLink on 127.0.0.1:$port with $nodes SuperNodes, isolation $isolation (logs in $work)"
}

run() {
  local out work said
  out=$(realpath -m "$1"); work=$out/deploy; said=$work/flwr-run.last
  FLWR_HOME=$work/flwr-home "$bin/flwr" run "$work/app" fedhet-local --stream 2>&1 | tee "$said" | tee -a "$work/flwr-run.log"
  # the ServerApp says a refusal (a node's, or of the config) as one `error:` line and ends the run: exit 2 (as fedhet)
  if grep -q '^error: ' "$said"; then exit 2; fi
  if [ -f "$out/summary.json" ]; then
    "$bin/python" -c "import json,sys; s=json.load(open(sys.argv[1])); print('fedhet run', s['status'], '|', s['rounds'], 'of', s['rounds_planned'], 'rounds | nodes lost:', s.get('nodes_lost'))" "$out/summary.json"
  fi
}

helpers() {  # pids of the processes a SuperLink or SuperNode on these ports started (in sessions of their own)
  ps -ww -eo pid=,args= | grep -E "(flower-superexec|flwr-serverapp|flwr-clientapp|fedhet\.flower\.worker).*127\.0\.0\.1:($1)( |$)" \
    | grep -v grep | awk '{print $1}' || true
}

kill_node() {
  local work port
  work=$(realpath -m "$1")/deploy; read -r port _ < "$work/ports"
  kill "$(cat "$work/node-$2.pid")" 2>/dev/null || true
  for p in $(helpers $((port + 1 + $2))); do kill "$p" 2>/dev/null || true; done
  echo "SuperNode $2 stopped"
}

stop() {
  local work port nodes ports
  work=$(realpath -m "$1")/deploy
  [ -f "$work/ports" ] || return 0  # nothing was started
  read -r port nodes < "$work/ports"
  ports=$port
  for i in $(seq 0 $((nodes - 1))); do ports="$ports|$((port + 1 + i))"; kill "$(cat "$work/node-$i.pid")" 2>/dev/null || true; done
  kill "$(cat "$work/superlink.pid")" 2>/dev/null || true
  for p in $(helpers "$ports"); do kill "$p" 2>/dev/null || true; done
  echo "stopped the SuperLink and SuperNodes of $work"
}

case $cmd in
  start) start "${@:2}" ;;
  run) run "$2" ;;
  kill) [ $# -eq 3 ] || usage; kill_node "$2" "$3" ;;
  stop) stop "$2" ;;
  demo)  # stop on every exit: an exit inside a function runs the trap with that function's arguments, hence a global
    [ $# -ge 3 ] || usage; demo_out=$3; trap 'stop "$demo_out"' EXIT; start "${@:2}"; run "$demo_out" ;;
  *) usage ;;
esac
