"""What a strategy asks of local training (`LocalPlan`) and what comes back (`LocalResult`)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from fedhet.engine.rules import LocalRule
from fedhet.engine.state import ClientStateRule


@dataclass(frozen=True)
class LocalSettings:
    """A run's default local training (the config's ``local`` section)."""

    steps: int
    lr: float
    batch_size: int
    weight_decay: float = 0.0


@dataclass
class LocalPlan:
    """Instructions for one round's cohort.

    Local update of client k for steps r = 0..steps_k-1 (learning rate η_k, mini-batch ξ):
        w ← w − η_k (∇F_k(w; ξ) + μ (w − w_global) + c_k + λ w)
    with the proximal term μ (FedProx), an additive gradient correction c_k (SCAFFOLD's c − c_k) and an L2
    penalty λ (`weight_decay`). With ``grad_stats_samples = B > 0`` the engine also returns the mean and
    the per-coordinate variance of B per-sample gradients at the received model (FedGSNR).
    """

    clients: Tensor  # (m,) int64 client ids
    steps: Tensor  # (m,) int64 local steps per client (0 allowed: the client returns the received model)
    lr: Tensor  # (m,) float32 local learning rate per client
    batch_size: int
    prox_mu: float = 0.0
    weight_decay: float = 0.0
    correction: Tensor | None = None  # (m, P)
    grad_stats_samples: int = 0
    stream: str = "train"  # names the random stream of mini-batches (e.g. "finetune" for evaluation-time tuning)
    rule: LocalRule | None = None  # a non-SGD local step (Per-FedAvg, pFedMe), see `fedhet.engine.rules`
    client_state: ClientStateRule | None = None  # state kept on the client (SCAFFOLD's c_i), `fedhet.engine.state`

    def __post_init__(self) -> None:
        m = len(self.clients)
        if self.steps.shape != (m,) or self.lr.shape != (m,):
            raise ValueError(f"steps {tuple(self.steps.shape)} and lr {tuple(self.lr.shape)} must be ({m},)")
        if self.correction is not None and self.correction.shape[0] != m:
            raise ValueError("correction needs one row per client")
        if bool((self.steps < 0).any()):
            raise ValueError("local steps must be >= 0")
        if self.client_state is not None and self.correction is not None:
            raise ValueError("a client-state rule sets the correction itself; do not pass both")
        if self.rule is not None and (self.prox_mu or self.correction is not None or self.client_state is not None):
            raise ValueError(f"{type(self.rule).__name__} does not combine with a proximal term or a correction")

    @staticmethod
    def uniform(clients: Tensor, steps: int, lr: float, batch_size: int, **extra: object) -> LocalPlan:
        """The same number of steps and learning rate for every client."""
        m = len(clients)
        return LocalPlan(
            clients=clients,
            steps=torch.full((m,), steps, dtype=torch.long),
            lr=torch.full((m,), lr, dtype=torch.float32),
            batch_size=batch_size,
            **extra,  # type: ignore[arg-type]
        )

    def to(self, device: torch.device) -> LocalPlan:
        """The plan with its learning rates and correction on `device`; client ids and step counts stay on
        the CPU, where the mini-batches are drawn."""
        correction = self.correction.to(device) if self.correction is not None else None
        return replace(self, lr=self.lr.to(device), correction=correction)


@dataclass
class LocalResult:
    """Local models after training, and what was measured on the way."""

    clients: Tensor  # (m,)
    params: Tensor  # (m, P) local models after their steps
    train_loss: Tensor  # (m,) mean mini-batch loss over the steps taken (nan for 0 steps)
    steps: Tensor  # (m,)
    lr: Tensor  # (m,)
    grad_mean: Tensor | None = None  # (m, P) mean per-sample gradient at the received model
    grad_var: Tensor | None = None  # (m, P) per-coordinate variance of those gradients
    state_delta: Tensor | None = None  # (m, P) change of the client state (plan.client_state), 0 where steps = 0
    dropped: Tensor | None = None  # (m,) bool: clients that never answered (a remote node was lost); NaN rows

    def rows(self, keep: Tensor) -> LocalResult:
        """The clients selected by `keep` (a bool mask or indices), every per-client field included."""
        return replace(
            self, **{f.name: getattr(self, f.name)[keep] for f in fields(self) if getattr(self, f.name) is not None}
        )

    def updates(self, global_params: Tensor) -> Tensor:
        """Δ_k = w_global − w_k (so that w_global − η Σ p_k Δ_k is a descent step)."""
        return global_params.unsqueeze(0) - self.params
