"""FedAvgM, FedAdagrad, FedAdam and FedYogi: FedAvg with a server optimiser (`fedhet.strategies.server`).

Names for what ``{name: fedavg, server_optimizer: {...}}`` also gives, with their papers' defaults: FedAvgM
(Hsu, Qi, Brown 2019) server momentum β = 0.9 with η_g = 1; FedOpt (Reddi et al., ICLR 2021, Algorithm 2)
β₁ = 0.9, β₂ = 0.99, τ = 10⁻³ and a server learning rate η = 10⁻², which the paper tunes per task on a grid
(as should you: ``server_lr`` and ``server_optimizer.tau``).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.fedavg import FedAvg
from fedhet.strategies.server import ServerAdagrad, ServerAdam, ServerMomentum, ServerOptimizer, ServerYogi


@STRATEGIES.register
class FedAvgM(FedAvg):
    name: ClassVar[str] = "fedavgm"
    description: ClassVar[str] = "FedAvg with server momentum (Hsu et al. 2019)"
    server_optimizer: ServerOptimizer = Field(default_factory=ServerMomentum, description="server momentum β = 0.9")


@STRATEGIES.register
class FedAdagrad(FedAvg):
    name: ClassVar[str] = "fedadagrad"
    description: ClassVar[str] = "FedAvg with an Adagrad server step (Reddi et al. 2021)"
    server_lr: float = Field(1e-2, gt=0, description="server learning rate η (tune it)")
    server_optimizer: ServerOptimizer = Field(default_factory=ServerAdagrad, description="Adagrad, τ = 1e-3")


@STRATEGIES.register
class FedAdam(FedAvg):
    name: ClassVar[str] = "fedadam"
    description: ClassVar[str] = "FedAvg with an Adam server step (Reddi et al. 2021)"
    server_lr: float = Field(1e-2, gt=0, description="server learning rate η (tune it)")
    server_optimizer: ServerOptimizer = Field(default_factory=ServerAdam, description="Adam, β = (0.9, 0.99), τ = 1e-3")


@STRATEGIES.register
class FedYogi(FedAvg):
    name: ClassVar[str] = "fedyogi"
    description: ClassVar[str] = "FedAvg with a Yogi server step (Reddi et al. 2021)"
    server_lr: float = Field(1e-2, gt=0, description="server learning rate η (tune it)")
    server_optimizer: ServerOptimizer = Field(default_factory=ServerYogi, description="Yogi, β = (0.9, 0.99), τ = 1e-3")
