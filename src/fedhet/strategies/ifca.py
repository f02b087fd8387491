"""IFCA, the Iterative Federated Clustering Algorithm (Ghosh, Chung, Yin, Ramchandran, NeurIPS 2020, Algorithm 2,
"model averaging").

The server keeps k cluster models θ_1..θ_k. Each round every selected client m estimates its cluster identity

    ĵ_m = argmin_j F_m(θ_j)                       (Algorithm 2, line 6: the loss on its training data)

trains θ_ĵ for its local steps (from θ_ĵ) and returns its local model θ̃_m; the server averages each cluster model
over the clients that chose it (weighted by samples, or uniformly),

    θ_j ← θ_j − η_g Σ_{m ∈ S_j} p_m (θ_j − θ̃_m),   p_m = n_m / Σ_{m' ∈ S_j} n_m'     (line 10; η_g = 1: the average)

and a cluster no client chose keeps its model. θ_1 is the run's initial model; θ_2..θ_k are seeded shuffles of it
within each parameter tensor (random initialisations from the same distribution), so IFCA with k = 1 is FedAvg.

The personalised model of a client is the cluster model with the lowest loss on its training data (the same rule, at
evaluation time, for every client). The global model reported is the model of the cluster most clients last chose.
Each client's last choice is logged (`assignment`), and with ground-truth groups (``shift``) the adjusted Rand index
of those choices against the groups is a round metric (``ari``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.errors import ConfigError
from fedhet.seeding import torch_gen
from fedhet.strategies.base import STRATEGIES, ServerContext, Strategy, Train, weighted_update
from fedhet.strategies.fedavg import fedavg_weights
from fedhet.strategies.server import ServerSGD

MAX_CLUSTERS = 64


def cluster_choice(losses: Tensor) -> Tensor:
    """ĵ = argmin_j losses[j, m] for each client m of a (k, m) table (NaN counts as +∞; ties: the lowest j)."""
    return torch.nan_to_num(losses.double(), nan=float("inf")).argmin(dim=0)


Step = Callable[[Tensor, Tensor], Tensor]


def cluster_average(models: Tensor, choice: Tensor, local: Tensor, weights: Tensor, step: Step | None = None) -> Tensor:
    """The new (k, P) cluster models: θ_j − η_g Σ_{m: choice_m = j} p_m (θ_j − θ̃_m), with p renormalised within
    cluster j (`step(θ_j, d)` takes the server step; default θ_j − d); a cluster no client chose keeps θ_j."""
    out = models.clone()
    for j in torch.unique(choice).tolist():
        mine = choice == j
        p = weights[mine].double()
        direction = weighted_update(models[j].unsqueeze(0) - local[mine], (p / p.sum()).float())
        out[j] = step(models[j], direction) if step is not None else models[j] - direction
    return out


def assignment_ari(choice: Tensor, groups: Tensor) -> float:
    """The adjusted Rand index of the clients' chosen clusters against their ground-truth groups, over the clients
    with a choice (≥ 0); NaN when fewer than two clients have one."""
    from sklearn.metrics import adjusted_rand_score

    chosen = choice >= 0
    if int(chosen.sum()) < 2:
        return float("nan")
    return float(adjusted_rand_score(groups[chosen].numpy(), choice[chosen].numpy()))


def require_sgd(strategy: Strategy, what: str) -> None:
    """Refuse in one line a stateful server optimiser for a strategy that steps several models (`what` does)."""
    if not isinstance(strategy.server_optimizer, ServerSGD):
        raise ConfigError(
            f"algorithm.server_optimizer '{strategy.server_optimizer.name}' keeps one state for one model; {what}: "
            "use the plain server step (server_optimizer: sgd)"
        )


@STRATEGIES.register
class IFCA(Strategy):
    """k cluster models; each client trains the one with its lowest loss; each is averaged over its clients."""

    name: ClassVar[str] = "ifca"
    description: ClassVar[str] = "IFCA: k cluster models, each client trains its best (Ghosh et al. 2020)"
    k: int = Field(2, ge=1, le=MAX_CLUSTERS, description="number of cluster models")
    weighting: Literal["samples", "uniform"] = Field("samples", description="a cluster's average: by samples or 1/m")

    _models: Tensor | None = PrivateAttr(None)
    _choice: Tensor | None = PrivateAttr(None)  # (K,) each client's last chosen cluster (-1: never selected)

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        if self.k > 1:
            require_sgd(self, "ifca with k > 1 steps k models")
        initial = ctx.engine.initial_params()
        models = [initial]
        for j in range(1, self.k):  # θ_j: each parameter tensor's entries of θ_1 in a seeded order
            theta = initial.clone()
            for part in ctx.engine.model.slices.values():
                n = part.stop - part.start
                theta[part] = initial[part][torch.randperm(n, generator=torch_gen(ctx.seed, "ifca-init", j))]
            models.append(theta)
        self._models = torch.stack(models)
        self._choice = torch.full((ctx.num_clients,), -1, dtype=torch.long)

    @property
    def models(self) -> Tensor:
        """(k, P) the cluster models."""
        if self._models is None:
            raise RuntimeError("strategy 'ifca' used before setup()")
        return self._models

    @property
    def assignment(self) -> Tensor:
        """(K,) each client's last chosen cluster (-1 for a client never selected)."""
        if self._choice is None:
            raise RuntimeError("strategy 'ifca' used before setup()")
        return self._choice

    def local_training(self, round_: int, clients: Tensor, global_params: Tensor, train: Train) -> LocalResult:
        losses = torch.stack([self.ctx.client_losses(theta, clients) for theta in self.models])
        choice = cluster_choice(losses)
        self.assignment[clients] = choice
        plan = self.configure(round_, clients, global_params)
        plan.starts = self.models[choice]
        return train(plan)

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        if len(result.clients):
            weights = fedavg_weights(self.ctx.train_sizes[result.clients], self.weighting)
            choice = self.assignment[result.clients]
            self._models = cluster_average(self.models, choice, result.params, weights, self.server_step)
        chosen = self.assignment[self.assignment >= 0]
        largest = int(torch.bincount(chosen, minlength=self.k).argmax()) if len(chosen) else 0
        return self.models[largest].clone()

    def personalization(self, clients: Tensor) -> LocalPlan:
        local = self.ctx.local
        plan = LocalPlan.uniform(clients, 0, local.lr, local.batch_size)
        if len(clients):
            engine = self.ctx.engine
            losses = torch.stack([engine.losses_at(theta, clients, "train") for theta in self.models])
            plan.starts = self.models[cluster_choice(losses)]
        return plan

    def round_metrics(self) -> dict[str, float]:
        groups = self.ctx.engine.data.info.get("group")
        return {"ari": assignment_ari(self.assignment, groups)} if groups is not None else {}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "models": self.models.clone(), "choice": self.assignment.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._models, self._choice = state["models"].clone(), state["choice"].clone()
