"""`TrainRequest`: everything a training backend needs to run one cohort's local steps.

The four backends (`dense`, `conv`, `vectorised`, `sequential`) take one request and return the same `Trained`
triple, so the engine calls them alike and a new field (a start point per client, frozen parameters) reaches them
all without a longer signature.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from fedhet.data.dataset import ClientData
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan
from fedhet.engine.reuse import Reuse
from fedhet.engine.step import Cohort

Trained = tuple[Tensor, Tensor, dict[str, Tensor]]  # params (m, P), mean loss (m,), the cohort's optimiser state
CLIPPED = "dp/clipped"  # in a `Trained` state: (m,) bool, the updates a backend clipped to ``TrainRequest.clip``


@dataclass
class TrainRequest:
    """One cohort's local training.

    ``anchor`` is the received (global) model w_global: the parameter terms' `Aligned.start` (FedProx pulls towards
    it) and every client's start point unless ``starts`` gives each client its own (m, P) (a personal model, or a
    personal part of one: `fedhet.engine.personal`). ``frozen`` (P,) marks coordinates the steps leave unchanged
    (whole parameters: FedRep trains its head and its body in turn); the optimiser state of a frozen coordinate
    stays as it was too.

    ``clip`` (client-level DP, `fedhet.engine.privacy`): a backend that can clip each update w_k − anchor to this norm
    while it writes the models does so and reports which it clipped under `CLIPPED` in its state (the dense
    backend); the others leave the clipping to the engine. The engine sets it only where nothing reads the
    unclipped models after training (no personal part, no term state).
    """

    model: FlatModel
    data: ClientData  # the samples (on the device training runs on)
    anchor: Tensor  # (P,) w_global
    plan: LocalPlan
    cohort: Cohort
    seed: int
    round_: int
    chunk_size: int = 0  # clients per chunk (0: the backend's default)
    workers: int = 0  # CPU threads of the dense and conv backends (0: torch's intra-op thread count)
    starts: Tensor | None = None  # (m, P) each client's start point (None: the anchor)
    frozen: Tensor | None = None  # (P,) bool: coordinates not trained (None: none)
    clip: float | None = None  # client-level DP's bound on ‖w_k − anchor‖ (None: no clipping here)
    reuse: Reuse | None = None  # products of the round's batches kept for the next training (`fedhet.engine.reuse`)
    _frozen_parts: dict[tuple[int, int], bool] = field(default_factory=dict, repr=False)

    @property
    def size(self) -> int:
        """m: the cohort's clients."""
        return len(self.plan.clients)

    def start(self, rows: Tensor | slice | None = None) -> Tensor:
        """A new (k, P) tensor of the start points of the cohort's clients `rows` (all by default)."""
        if self.starts is not None:
            return self.starts.clone() if rows is None else self.starts[rows].clone()
        k = self.size if rows is None else len(torch.arange(self.size)[rows])
        return self.anchor.unsqueeze(0).repeat(k, 1)

    def start_into(self, out: Tensor, rows: Tensor | slice) -> Tensor:
        """Write the start points of clients `rows` into `out` (k, P) and return it."""
        if self.starts is None:
            return out.copy_(self.anchor.expand(len(out), -1))
        return out.copy_(self.starts[rows])

    def is_frozen(self, where: slice) -> bool:
        """Whether the parameter at `where` (a slice of the flat vector) is frozen."""
        if self.frozen is None:
            return False
        key = (int(where.start or 0), int(where.stop))
        if key not in self._frozen_parts:
            self._frozen_parts[key] = bool(self.frozen[where].all())
        return self._frozen_parts[key]

    def keep_frozen(self, new: Tensor, old: Tensor) -> Tensor:
        """`new` (…, P) with the frozen coordinates of `old` (the flat weights or a "param" optimiser state)."""
        if self.frozen is None:
            return new
        return torch.where(self.frozen.to(new.device), old, new)

    def on(self, data: ClientData, device: torch.device) -> TrainRequest:
        """The request with its tensors on `device` and `data` (the device's copy of the samples)."""
        return TrainRequest(
            self.model,
            data,
            self.anchor.to(device),
            self.plan,
            self.cohort.to(device),
            self.seed,
            self.round_,
            self.chunk_size,
            self.workers,
            None if self.starts is None else self.starts.to(device),
            None if self.frozen is None else self.frozen.to(device),
            self.clip,
            self.reuse,
        )
