"""`fedhet run --engine flower`: a run through Flower's Simulation Runtime (Ray), nodes on this machine."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from fedhet.errors import ConfigError
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.config import RunConfig
from fedhet.experiments.runfolder import NODE_STATE
from fedhet.experiments.state import RunState
from fedhet.flower import require_flwr
from fedhet.flower.remote import Settings


def simulate(
    config: RunConfig | None,
    out: Path,
    nodes: int = 2,
    callbacks: list[Callback] | None = None,
    timeout: float = 300.0,
    cpus_per_node: float = 1.0,
    trust: bool = False,
) -> RunState:
    """Run `config` (or resume the run in `out` when `config` is None) on `nodes` simulated SuperNodes.

    Each node holds a contiguous block of the clients, derived from the config; the nodes' client state goes
    to ``out/node-state`` as well, so that a resumed simulation finds it. The nodes import what the config names
    (it is yours), or, resuming, what ``out/config.yaml`` names only with `trust` (`fedhet.experiments.trust`).
    """
    require_flwr()
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    from flwr.simulation import run_simulation

    from fedhet.flower.apps import NodePolicy, make_client_app, make_server_app, run_key
    from fedhet.imports import ImportPolicy

    total = None if config is None else config.num_clients + config.unseen_clients
    if total is not None and nodes > total:
        raise ConfigError(f"--nodes {nodes} is more than the {total} clients: use at most one node per client")
    settings = Settings(timeout=timeout, min_nodes=nodes, wait=timeout, run_key=run_key(config, out))
    trusted = config is not None or trust
    refusal = f"if you trust '{out}', resume with fedhet run --resume {out} --engine flower --trust-imports"
    policy = NodePolicy(ImportPolicy(None if trusted else (), refusal), out.absolute() / NODE_STATE)
    client_app = make_client_app(policy)
    finished: list[RunState] = []
    app = make_server_app(config, out, settings, callbacks, finished.append, trust)
    logging.getLogger("flwr").setLevel(logging.ERROR)  # quiet: run_simulation's deprecation notice, Ray's chatter
    backend = {
        "client_resources": {"num_cpus": cpus_per_node, "num_gpus": 0.0},
        "init_args": {"include_dashboard": False, "logging_level": "error", "log_to_driver": False},
    }
    run_simulation(server_app=app, client_app=client_app, num_supernodes=nodes, backend_config=backend)
    if not finished:
        raise ConfigError("the Flower simulation ended without finishing the run; see the log above")
    return finished[0]
