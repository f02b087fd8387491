"""The memory a run needs, worked out from its built objects before its first round: the data (loaded), the state
each of the K clients keeps between rounds (a personal model or head, SCAFFOLD's c_i, a persistent optimiser's
buffers), and one round's working memory for the cohort of m clients (their models and updates, their mini-batches).
A run whose state and cohort cannot fit in the memory this machine has available is refused in one line, before
anything is written (`check_memory`); ``--estimate`` prints the projection (`Footprint.lines`).

Sizes in bytes, float32 rows: a client's stored state is what `fedhet.engine.state.ClientStore` holds for it (each
term's rows, the optimiser's and the rule's where the plan keeps them, the personal part); the cohort's working
memory counts its trained models and their updates, each (m, P), the optimiser's per-parameter state, the term
changes reported to the server, and the padded mini-batches (`fedhet.engine.plan.batch_bytes`). These are lower
bounds of what a round allocates (temporaries, evaluation, Python objects come on top), so a run refused here
would surely not fit.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from fedhet.data.dataset import FederatedData
from fedhet.engine.plan import LocalPlan, batch_bytes
from fedhet.engine.protocol import EngineProtocol
from fedhet.errors import ConfigError
from fedhet.experiments.config import RunConfig
from fedhet.experiments.preflight import local_steps
from fedhet.strategies.base import Strategy

MEMORY_LIMIT_ENV = "FEDHET_MEMORY_LIMIT_MB"  # the memory a run may use, in MB, instead of the machine's available
FLOAT = 4
MB = 2**20


class Experiment(Protocol):
    """What of a built run (`fedhet.experiments.build.Experiment`) its footprint reads."""

    config: RunConfig
    data: FederatedData
    engine: EngineProtocol
    strategy: Strategy


@dataclass(frozen=True)
class Footprint:
    """A run's memory by part (bytes): `data` (its splits' tensors), `state_row` (one client's stored state), kept
    for `clients` clients, and `cohort` (a round's working memory for `cohort_size` clients of `params` parameters)."""

    clients: int
    cohort_size: int
    params: int
    data: int
    state_row: int
    cohort: int

    @property
    def state(self) -> int:
        """Every client's stored state (each of the K clients keeps its own after it first trains)."""
        return self.clients * self.state_row

    @property
    def needed(self) -> int:
        """What the run still allocates once its data is loaded: the clients' state and a round's cohort."""
        return self.state + self.cohort

    def lines(self) -> list[str]:
        """The projection in words, a line per part."""
        return [
            f"data: {self.data / MB:,.1f} MB (loaded before the first round)",
            f"clients' state: {self.clients:,} clients × {self.state_row / 1024:,.1f} KB = {self.state / MB:,.1f} MB",
            f"cohort: {self.cohort_size:,} clients × {self.params:,} parameters, {self.cohort / MB:,.1f} MB a round",
            f"needed beyond the data: {self.needed / MB:,.1f} MB (at least)",
        ]


def footprint(exp: Experiment) -> Footprint:
    """The `Footprint` of the built run `exp`, from the plan its strategy makes for one client (`probe_plan`)."""
    data, config = exp.data, exp.config
    size = exp.engine.model.size
    plan = probe_plan(exp)
    row, per_model = 0, 2  # a client's stored floats; the cohort's (m, P) tensors: models and updates
    for term in plan.terms:
        for name in term.client_state:
            row += term.initial_state(name, torch.zeros(size)).numel()
        per_model += len(term.client_state) if term.reports_state else 0
    kinds = plan.optimizer.state_kinds()
    param_kinds = sum(kind == "param" for kind in kinds.values())
    per_model += param_kinds
    if plan.optimizer.persistent:
        row += param_kinds * size + (len(kinds) - param_kinds)
    if plan.rule is not None:
        rule_kinds = plan.rule.state_kinds()
        row += sum(size if kind == "param" else 1 for kind in rule_kinds.values())
        per_model += sum(kind == "param" for kind in rule_kinds.values())
    personal = exp.strategy.personalization(torch.zeros(1, dtype=torch.long)) if data.num_clients else None
    spec = personal.personal if personal is not None else None
    if spec is not None:
        row += int(spec.mask(exp.engine.model).sum()) + (spec.mix is not None)
    m = min(config.clients_per_round, data.num_clients)
    features = math.prod(data.input_shape) if data.input_shape else 1
    batches = batch_bytes(m, local_steps(config, data), config.local.batch_size, features)
    return Footprint(
        int(data.seen.sum()),
        m,
        size,
        data_bytes(exp),
        FLOAT * row,
        FLOAT * per_model * m * size + batches,
    )


def data_bytes(exp: Experiment) -> int:
    """The bytes of the run's data tensors (samples, labels, offsets of each split)."""
    total = 0
    for split in (exp.data.train, exp.data.test, exp.data.val):
        if split is not None:
            total += sum(t.numel() * t.element_size() for t in (split.x, split.y, split.offsets))
    return total


def probe_plan(exp: Experiment) -> LocalPlan:
    """The plan the run's strategy makes for client 0 in the first round, made by a copy of the strategy (the run's
    own is left as it is); the config's local training where the strategy cannot plan before the run starts."""
    engine, strategy = exp.engine, exp.strategy
    clients = torch.zeros(min(1, exp.data.num_clients), dtype=torch.long)
    fallback = engine.local.plan(clients, exp.data.train.sizes[clients])
    try:
        shared = (strategy.ctx, engine, exp.data, engine.model)  # not copied: the copy only plans
        copied = copy.deepcopy(strategy, {id(x): x for x in shared})
        plan = copied.configure(0, clients, engine.initial_params())
    except Exception:  # a strategy that needs a started run to plan (asynchronous, or one that samples first)
        return fallback
    return plan if isinstance(plan, LocalPlan) else fallback


def available_bytes() -> int | None:
    """The memory a run may use: ``FEDHET_MEMORY_LIMIT_MB`` where set, else the machine's available memory
    (/proc/meminfo's MemAvailable, Linux); None where unknown."""
    limit = os.environ.get(MEMORY_LIMIT_ENV)
    if limit:
        try:
            return int(float(limit) * MB)
        except ValueError:
            raise ConfigError(f"{MEMORY_LIMIT_ENV}={limit!r} is not a number of MB") from None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(exp: Experiment) -> Footprint:
    """Refuse in one line a run whose clients' state and cohort need more memory than is available (the data is
    loaded already); return its footprint."""
    found = footprint(exp)
    available = available_bytes()
    if available is not None and found.needed > available:
        where = f"allowed ({MEMORY_LIMIT_ENV})" if os.environ.get(MEMORY_LIMIT_ENV) else "available on this machine"
        raise ConfigError(
            f"this run needs at least {found.needed / MB:,.1f} MB beyond its data ({found.clients:,} clients' state "
            f"{found.state / MB:,.1f} MB, a cohort of {found.cohort_size:,} {found.cohort / MB:,.1f} MB) and "
            f"{available / MB:,.1f} MB are {where}; lower num_clients, clients_per_round or the model's size"
        )
    return found
