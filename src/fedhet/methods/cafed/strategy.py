"""CA-Fed, Correlation-Aware FL (Rodio et al., "Federated Learning under Heterogeneous and Correlated Client
Availability", INFOCOM 2023; Algorithm 1).

Every round the server folds the losses reported by the active clients at w_{t,0} into F̂, F̂*, Γ̂′ (eqs. 15,
17), starts from the unbiased weights q = α/π̂ (line 5), then greedily zeroes clients, first by descending λ̂
(line 6, Guideline B) and then by ascending π̂ (line 7, Guideline A), whenever that lowers the estimated error
ε̂ = ⟨F̂ − F̂*, π̂ ⊙~ q⟩ + κ̄² d_TV²(α, π̂ ⊙~ q) Γ̂′ (eq. 18) by at least τ. Active clients with q_k > 0 train;
the others only report their loss. Aggregation is eq. (3) with the kept, un-normalised weights.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.availability.estimators import LossTracker
from fedhet.data.dataset import ClientData
from fedhet.engine.evaluate import sampled_losses
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.methods.cafed.availability_aware import (
    AvailabilityAware,
    descending,
    greedy_exclusion,
    proxy_error,
    unbiased_weights,
)
from fedhet.strategies.base import STRATEGIES, ServerContext

LOSS_STREAM = "cafed-loss"  # the random batches on which clients report F_k(w_{t,0})


def cafed_weights(
    alpha: np.ndarray,
    pi: np.ndarray,
    lam: np.ndarray,
    gap: np.ndarray,
    gamma: float,
    tau: float = 0.0,
    bias_weight: float = 1.0,
    correlation_order: Literal["lambda", "abs_lambda"] = "lambda",
    exclude_on_ties: bool = False,
) -> np.ndarray:
    """Algorithm 1, lines 5–7: q = α/π̂, then `get` by descending λ̂, then `get` by ascending π̂."""
    q = unbiased_weights(alpha, pi)
    by_correlation = descending(np.abs(lam) if correlation_order == "abs_lambda" else lam)
    for order in (by_correlation, descending(-np.asarray(pi))):
        q = greedy_exclusion(q, order, alpha, pi, gap, gamma, tau, bias_weight, exclude_on_ties)
    return q


def one_batch_losses(
    model: FlatModel, data: ClientData, params: Tensor, clients: Tensor, batch: int, seed: int, round_: int
) -> Tensor:
    """(1/|B_k|) Σ_{ξ ∈ B_k} f(w, ξ) for each client, B_k drawn without replacement from its data by
    ``numpy_rng(seed, "cafed-loss", round_, k)`` (the whole data when it is smaller than `batch`)."""
    return sampled_losses(model, data, params, clients, batch, seed, round_, LOSS_STREAM)


def solo_losses(ctx: ServerContext, steps: int) -> np.ndarray:
    """F_k(ŵ_k) on each client's training data, ŵ_k trained alone for `steps` SGD steps from the initial model
    with the run's local settings (an estimate of F_k*, as the authors' code precomputes it)."""
    engine, local = ctx.engine, ctx.local
    clients = torch.arange(ctx.num_clients)
    plan = LocalPlan.uniform(
        clients, steps, local.lr, local.batch_size, weight_decay=local.weight_decay, stream="cafed-local-optimum"
    )
    solo = engine.train(engine.initial_params(), plan, 0).params
    return engine.own_scores(solo, clients, "train").loss.double().numpy()


@STRATEGIES.register
class CAFed(AvailabilityAware):
    """CA-Fed (Algorithm 1) with the loss filter β, threshold τ and bias weight κ̄² (Sec. VI-A)."""

    name: ClassVar[str] = "cafed"
    description: ClassVar[str] = "CA-Fed: drop the most correlated, then least available clients while ε̂ falls"
    beta: float = Field(0.2, gt=0, le=1, description="loss filter β of eq. (15)")
    tau: float = Field(0.0, ge=0, description="exclusion threshold τ: drop a client if ε̂ falls by at least τ")
    bias_weight: float = Field(1.0, ge=0, description="κ̄²: weight of the bias term d_TV²·Γ̂′ (Sec. VI-A)")
    correlation_order: Literal["lambda", "abs_lambda"] = Field(
        "lambda", description="pass 1 order: λ̂ descending (paper) or |λ̂| descending (authors' code)"
    )
    exclude_on_ties: bool = Field(
        False, description="line 22 taken literally: with τ = 0 also exclude when ε̂ does not change (see get)"
    )
    local_minimum: Literal["running", "local"] = Field(
        "running",
        description="F̂*: running minimum of F̂ (paper, Sec. IV-B) or the loss of a model trained alone on each "
        "client from the initial model (the authors' code fits a logistic regression per client)",
    )
    local_steps: int = Field(200, ge=1, description="SGD steps of the solo models for local_minimum='local'")
    loss_batch: int | None = Field(
        None,
        ge=0,
        description="clients report F_k(w_{t,0}) on one random batch of this size (None: the local batch size, as "
        "in the paper); 0: on their whole training data",
    )

    _losses: LossTracker | None = PrivateAttr(None)
    _global: Tensor | None = PrivateAttr(None)  # w_{t,0}: select() is not given the global model
    _proxy: float = PrivateAttr(0.0)
    _gamma: float = PrivateAttr(0.0)

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        floor = solo_losses(ctx, self.local_steps) if self.local_minimum == "local" else None
        self._losses = LossTracker(ctx.num_clients, self.beta, floor)
        self._global = ctx.engine.initial_params()  # the runner starts from the same model

    def derived(self) -> dict[str, Any]:
        return {"loss_batch": self.ctx.local.batch_size} if self.loss_batch is None else {}

    @property
    def losses(self) -> LossTracker:
        if self._losses is None:
            raise RuntimeError("cafed used before setup()")
        return self._losses

    def reported_losses(self, round_: int, clients: Tensor) -> np.ndarray:
        """F_k^(t) of the active `clients` at w_{t,0}: a one-batch estimate (Sec. IV-A) or the full local loss;
        both go through the attack layer (malicious clients may lie)."""
        assert self._global is not None
        batch = self.ctx.local.batch_size if self.loss_batch is None else self.loss_batch
        if batch == 0:
            return self.ctx.client_losses(self._global, clients).double().numpy()
        losses = self.ctx.engine.sampled_losses(self._global, clients, batch, round_, LOSS_STREAM)
        return self.ctx.attack.report_losses(clients, losses).double().numpy()

    def weights(self, round_: int, active: np.ndarray, pi: np.ndarray, lam: np.ndarray) -> np.ndarray:
        ids = np.flatnonzero(active)
        if len(ids):  # line 3: the active clients report their loss at the received model w_{t,0}
            assert self._global is not None
            self.losses.update(ids, self.reported_losses(round_, torch.as_tensor(ids, dtype=torch.long)))
        gap, gamma = self.losses.gap, self.losses.gamma
        q = cafed_weights(
            self.alpha, pi, lam, gap, gamma, self.tau, self.bias_weight, self.correlation_order, self.exclude_on_ties
        )
        self._proxy = proxy_error(q, self.alpha, pi, gap, gamma, self.bias_weight)
        self._gamma = gamma
        return q

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        new = super().aggregate(round_, global_params, result)
        self._global = new.detach().clone()
        return new

    def round_metrics(self) -> dict[str, float]:
        return {**super().round_metrics(), "proxy_error": self._proxy, "gamma_hat": self._gamma}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "losses": self.losses.state_dict(),
            "global": None if self._global is None else self._global.clone(),
            "proxy": self._proxy,
            "gamma": self._gamma,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.losses.load_state_dict(state["losses"])
        self._global = state["global"]
        self._proxy, self._gamma = float(state["proxy"]), float(state["gamma"])
