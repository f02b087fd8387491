"""CFL, Clustered Federated Learning (Sattler, Müller, Samek, IEEE TNNLS 2020, "Clustered Federated Learning:
Model-Agnostic Distributed Multitask Optimization under Privacy Constraints", Algorithm 1).

All seen clients start in one cluster c = {1..K}; each cluster runs FedAvg over its members from its own model θ_c.
After a round, for each cluster c with updates Δθ_i = θ̃_i − θ_c from its clients S_c in the round,

    mean = ‖Σ_{i ∈ S_c} p_i Δθ_i‖,   max = max_{i ∈ S_c} ‖Δθ_i‖        (Algorithm 1; p_i = n_i / Σ n, or 1/|S_c|)

and if mean < ε1 (the federation is near a stationary point of the cluster's joint objective) while max > ε2 (some
client is not: its own risk is far from stationary), S_c is bipartitioned by the cosine similarities of its updates

    α_ij = ⟨Δθ_i, Δθ_j⟩ / (‖Δθ_i‖ ‖Δθ_j‖),   c_1, c_2 = argmin_{c_1 ∪ c_2 = S_c} max_{i ∈ c_1, j ∈ c_2} α_ij

(single linkage solves this minimax problem exactly: cut the weakest link of a maximum spanning tree of α; complete
linkage, the default, is what the authors' released code runs, and is less prone to cutting off one outlying
client). Both halves continue from θ_c, and the round's aggregation already runs per half:
θ_{c_h} ← θ_c − η_g Σ_{i ∈ c_h} p_i (θ_c − θ̃_i). A split also needs at least ``min_size`` updates in the cluster,
``min_rounds`` rounds since the cluster was made, and fewer than ``max_clusters`` clusters. Defaults ε1 = 0.4,
ε2 = 1.6 are the values of the authors' experiments (their released code); both are norms of a whole round's update,
so they depend on the model, local steps and learning rate: the
``update_norm_mean``/``update_norm_max`` round metrics (of the largest cluster) show where a run stands.

The paper's check of the risk-approximation error γ_max < √((1 − α_max^cross)/2) is left out (γ is unknown in
practice, as in the authors' code). Members of a splitting cluster that did not train that round, and clients never
seen (held out), are placed by the rule IFCA uses: when next selected (or evaluated), the cluster model with the
lowest loss on their training data. A client's personalised model is its cluster's model; the global model reported is
the model of the cluster with the most clients (ties: the lowest index). The clusters, each client's cluster and the
clusters' ages are in the checkpoint (a resumed run is byte-identical); with ground-truth groups (``shift``), ``ari``
is the adjusted Rand index of the clients' clusters against them. With one cluster (no split) CFL is FedAvg.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.strategies.base import STRATEGIES, ServerContext, Strategy, Train, weighted_update
from fedhet.strategies.fedavg import fedavg_weights
from fedhet.strategies.ifca import MAX_CLUSTERS, assignment_ari, cluster_average, cluster_choice, require_sgd


def cosine_similarities(updates: Tensor) -> Tensor:
    """α (m, m): the cosine similarity of each pair of updates (a zero update is similar to nothing: 0)."""
    u = updates.double()
    unit = u / u.norm(dim=1, keepdim=True).clamp_min(1e-30)
    return unit @ unit.T


def bipartition(updates: Tensor, linkage: Literal["complete", "single"] = "complete") -> Tensor:
    """The second half (m,) bool of the clients whose updates `updates` (m ≥ 2, P) are split: agglomerative clustering
    of the distances 1 − α into two groups; the half holding the first client is the first."""
    from sklearn.cluster import AgglomerativeClustering

    distances = (1 - cosine_similarities(updates)).clamp_min(0).cpu().numpy()
    labels = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage=linkage).fit(distances).labels_
    labels = torch.as_tensor(labels)
    return labels != labels[0]


def update_norms(updates: Tensor, weights: Tensor) -> tuple[float, float]:
    """(‖Σ_i p_i Δθ_i‖, max_i ‖Δθ_i‖) of a cluster's updates (m, P) with weights p (m,) summing to 1."""
    return float(weighted_update(updates, weights).norm()), float(updates.norm(dim=1).max())


@STRATEGIES.register
class CFL(Strategy):
    """Clusters that run FedAvg, each split in two by its updates' cosine similarities once near stationarity."""

    name: ClassVar[str] = "cfl"
    description: ClassVar[str] = "CFL: clusters split by their updates' cosine similarity (Sattler et al. 2020)"
    eps1: float = Field(
        0.4, gt=0, allow_inf_nan=False, description="ε1: a cluster splits only if its mean update's norm is below"
    )
    eps2: float = Field(
        1.6, ge=0, allow_inf_nan=False, description="ε2: ... and its largest client update's norm is above"
    )
    min_size: int = Field(3, ge=2, description="a cluster splits only with at least this many updates in the round")
    min_rounds: int = Field(0, ge=0, le=10**9, description="a cluster splits only this many rounds after it began")
    max_clusters: int = Field(MAX_CLUSTERS, ge=1, le=MAX_CLUSTERS, description="no split beyond this many clusters")
    linkage: Literal["complete", "single"] = Field(
        "complete", description="bipartition: complete (the authors' code) or single (the paper's optimal) linkage"
    )
    weighting: Literal["samples", "uniform"] = Field("samples", description="a cluster's average: by samples or 1/m")

    _models: Tensor | None = PrivateAttr(None)  # (C, P) the cluster models
    _cluster: Tensor | None = PrivateAttr(None)  # (K,) each client's cluster (-1: to be placed by its losses)
    _born: Tensor | None = PrivateAttr(None)  # (C,) the round each cluster began
    _norms: tuple[float, float] = PrivateAttr((float("nan"), float("nan")))

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        if self.max_clusters > 1:
            require_sgd(self, "cfl with max_clusters > 1")
        self._models = ctx.engine.initial_params().unsqueeze(0).clone()
        seen = ctx.engine.data.seen
        self._cluster = torch.where(seen, 0, -1).long()
        self._born = torch.zeros(1, dtype=torch.long)

    def _state(self) -> tuple[Tensor, Tensor, Tensor]:
        if self._models is None or self._cluster is None or self._born is None:
            raise RuntimeError("strategy 'cfl' used before setup()")
        return self._models, self._cluster, self._born

    @property
    def models(self) -> Tensor:
        """(C, P) the cluster models."""
        return self._state()[0]

    @property
    def assignment(self) -> Tensor:
        """(K,) each client's cluster (-1 for a client to be placed by its losses)."""
        return self._state()[1]

    def _best(self, clients: Tensor, losses_at: Any) -> Tensor:
        """The cluster of lowest training loss for each of `clients` (IFCA's rule)."""
        if len(self.models) == 1 or not len(clients):
            return torch.zeros(len(clients), dtype=torch.long)
        return cluster_choice(torch.stack([losses_at(theta, clients) for theta in self.models])).cpu()

    def local_training(self, round_: int, clients: Tensor, global_params: Tensor, train: Train) -> LocalResult:
        cluster = self.assignment
        away = clients[cluster[clients] < 0]
        cluster[away] = self._best(away, self.ctx.client_losses)
        plan = self.configure(round_, clients, global_params)
        if len(self.models) > 1:
            plan.starts = self.models[cluster[clients]]
        return train(plan)

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        models, cluster, _ = self._state()
        clients = result.clients
        if len(clients):
            weights = fedavg_weights(self.ctx.train_sizes[clients], self.weighting)
            updates = result.params - models[cluster[clients]]  # Δθ_i = θ̃_i − θ_c
            largest = self._largest()
            for c in torch.unique(cluster[clients]).tolist():
                mine = cluster[clients] == c
                p = weights[mine].double()
                norms = update_norms(updates[mine], (p / p.sum()).float())
                if c == largest:
                    self._norms = norms
                if self._splits(c, norms, int(mine.sum()), round_):
                    self._split(c, clients[mine], updates[mine], round_)
            self._models = cluster_average(self.models, cluster[clients], result.params, weights, self.server_step)
        return self.models[self._largest()].clone()

    def _splits(self, c: int, norms: tuple[float, float], size: int, round_: int) -> bool:
        """Algorithm 1's test: mean < ε1 and max > ε2, with enough updates, age, and room for one more cluster."""
        mean, most = norms
        old_enough = round_ - int(self._state()[2][c]) >= self.min_rounds
        room = len(self.models) < self.max_clusters
        return mean < self.eps1 and most > self.eps2 and size >= self.min_size and old_enough and room

    def _split(self, c: int, members: Tensor, updates: Tensor, round_: int) -> None:
        """Cluster c becomes its first half; a new cluster, from the same model, its second; members of c that did not
        train this round are placed again by their losses when next selected."""
        models, cluster, born = self._state()
        second = bipartition(updates, self.linkage)
        new = len(models)
        cluster[cluster == c] = -1
        cluster[members] = torch.where(second, new, c)
        self._models = torch.cat([models, models[c].unsqueeze(0)])
        born[c] = round_ + 1
        self._born = torch.cat([born, torch.tensor([round_ + 1])])

    def _largest(self) -> int:
        """The cluster with the most clients (ties: the lowest index; 0 when no client has one)."""
        placed = self.assignment[self.assignment >= 0]
        return int(torch.bincount(placed, minlength=len(self.models)).argmax()) if len(placed) else 0

    def personalization(self, clients: Tensor) -> LocalPlan:
        local = self.ctx.local
        plan = LocalPlan.uniform(clients, 0, local.lr, local.batch_size)
        if len(clients):
            cluster = self.assignment[clients].clone()
            away = cluster < 0
            engine = self.ctx.engine
            cluster[away] = self._best(clients[away], lambda theta, k: engine.losses_at(theta, k, "train"))
            plan.starts = self.models[cluster]
        return plan

    def round_metrics(self) -> dict[str, float]:
        mean, most = self._norms
        out = {"clusters": float(len(self.models)), "update_norm_mean": mean, "update_norm_max": most}
        groups = self.ctx.engine.data.info.get("group")
        return {**out, "ari": assignment_ari(self.assignment, groups)} if groups is not None else out

    def state_dict(self) -> dict[str, Any]:
        models, cluster, born = self._state()
        return {
            **super().state_dict(),
            "models": models.clone(),
            "cluster": cluster.clone(),
            "born": born.clone(),
            "norms": self._norms,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._models, self._cluster = state["models"].clone(), state["cluster"].clone()
        self._born, (mean, most) = state["born"].clone(), state["norms"]
        self._norms = (float(mean), float(most))
