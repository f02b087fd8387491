"""Client requirements ρ_k (MaxFL §3): the loss a client asks of the global model (the config's ``requirements``).

By default ρ_k = F_k(ŵ_k), the training loss of a local model ŵ_k trained alone from the initial global model
for τ_l SGD steps with the run's batch size and learning rate (MaxFL App. D.1: τ_l = 100). ρ may instead be a
constant, or read from a file (one value per client, in client order). Computed once per run (on first use), for
seen and unseen clients, and shared by every component of the run that asks for it: a component that needs ρ
(the MaxFL and MW-Fed strategies, appeal-driven participation, the appeal metrics, or a plugin) subclasses
`UsesRequirements`, and the run hands it the run's `ClientRequirements` when it is set up. A run-level service
like the engine, so it lives below the components that use it and the experiments that configure it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, PrivateAttr
from torch import Tensor

from fedhet.engine.plan import LocalPlan
from fedhet.engine.protocol import EngineProtocol
from fedhet.errors import ConfigError
from fedhet.requirements_config import RequirementsConfig


@dataclass
class Requirements:
    """ρ (K,) and, when trained, the local models ŵ_k (K, P) with their own test accuracy (K,)."""

    rho: Tensor
    local_params: Tensor | None
    local_test_accuracy: Tensor | None


def compute_requirements(engine: EngineProtocol, cfg: RequirementsConfig) -> Requirements:
    k = engine.data.num_clients
    if cfg.file is not None:
        path = Path(cfg.file)
        if not path.is_file():
            raise ConfigError(f"requirements.file '{path}' does not exist")
        values = np.loadtxt(path, delimiter=",", ndmin=1).reshape(-1)
        if len(values) != k:
            raise ConfigError(f"requirements.file '{path}' has {len(values)} values, expected one per client ({k})")
        return Requirements(torch.as_tensor(values, dtype=torch.float32), None, None)
    if cfg.constant is not None:
        return Requirements(torch.full((k,), float(cfg.constant)), None, None)
    clients = torch.arange(k)
    defaults = engine.local
    plan = LocalPlan.uniform(
        clients, cfg.steps, cfg.lr or defaults.lr, cfg.batch_size or defaults.batch_size, stream="requirements"
    )
    local = engine.train(engine.initial_params(), plan, 0).params
    rho = engine.own_scores(local, clients, "train").loss
    return Requirements(rho, local, engine.own_scores(local, clients, "test").accuracy)


class ClientRequirements:
    """The run's requirements, computed on first use from the engine and the config's ``requirements``."""

    def __init__(self, engine: EngineProtocol, settings: RequirementsConfig, value: Requirements | None = None) -> None:
        self.engine, self.settings = engine, settings
        self._value = value  # given: used as it is (tests, or ρ computed elsewhere)

    @property
    def value(self) -> Requirements:
        if self._value is None:
            self._value = compute_requirements(self.engine, self.settings)
        return self._value

    @property
    def rho(self) -> Tensor:
        """ρ_k of every client (K,)."""
        return self.value.rho

    def derived(self) -> dict[str, Any]:
        """The solo training's learning rate and batch size where the settings leave them to the run's."""
        cfg, local = self.settings, self.engine.local
        if cfg.file is not None or cfg.constant is not None:
            return {}
        out: dict[str, Any] = {}
        if cfg.lr is None:
            out["lr"] = local.lr
        if cfg.batch_size is None:
            out["batch_size"] = local.batch_size
        return out


class UsesRequirements(BaseModel):
    """Mixin of components that need the clients' requirements (the run calls `use_requirements` at set-up)."""

    _requirements: ClientRequirements | None = PrivateAttr(None)

    def use_requirements(self, requirements: ClientRequirements) -> None:
        self._requirements = requirements

    @property
    def requirements(self) -> ClientRequirements:
        if self._requirements is None:
            raise RuntimeError(f"{type(self).__name__} needs the run's client requirements: call use_requirements()")
        return self._requirements
