"""`EngineProtocol`: everything strategies, availability processes and metrics may ask of the clients.

Two implementations: `fedhet.engine.engine.Engine` (the clients' data in this process) and
`fedhet.flower.remote.RemoteEngine` (the calls go to the Flower nodes that hold the data). Code above the engine
layer types its engine as this protocol, never as either class.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from torch import Tensor

from fedhet.data.dataset import FederatedData
from fedhet.engine.evaluate import ClientScores
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan, LocalResult, LocalSettings

Split = Literal["train", "test", "val"]  # "val": the validation split (``val_fraction``)


class EngineProtocol(Protocol):
    """Local training and evaluation of the run's clients."""

    model: FlatModel
    data: FederatedData  # the clients' layout (sizes, seen/unseen, classes); a remote engine holds no samples
    local: LocalSettings  # the run's default local training
    seed: int
    last_backend: str | None  # the backend of the last cohort trained here (None: none yet, or chosen by nodes)

    def train(self, global_params: Tensor, plan: LocalPlan, round_: int) -> LocalResult:
        """Local training of the plan's cohort from `global_params`."""
        ...

    def scores(self, params: Tensor, split: Split = "test", clients: Tensor | None = None) -> ClientScores:
        """Loss and accuracy of one model on every client's `split` data, or only on `clients`' (NaN for the
        clients not scored, and for unreachable ones)."""
        ...

    def losses_at(self, params: Tensor, clients: Tensor, split: Split = "train") -> Tensor:
        """F_k(w) on each of `clients`' full `split` data (m,)."""
        ...

    def own_scores(self, params: Tensor, clients: Tensor, split: Split = "test") -> ClientScores:
        """Loss and accuracy of client i's own model params[i] on its own `split` data."""
        ...

    def personal_scores(
        self, global_params: Tensor, plan: LocalPlan, round_: int, split: Split = "test"
    ) -> ClientScores:
        """Loss and accuracy of each of the plan's clients' personalised model (its stored personal part with
        ``plan.personal``, then the plan's steps) on its own `split` data; nothing is stored."""
        ...

    def personal_starts(self, global_params: Tensor, plan: LocalPlan, round_: int) -> Tensor | None:
        """(m, P) the plan's clients' personalised models before the plan's steps (their stored personal parts on
        the global model), or None where they are not held here (without ``plan.personal``; a remote engine)."""
        ...

    def gradient_statistics(self, params: Tensor, clients: Tensor, samples: int, round_: int) -> tuple[Tensor, Tensor]:
        """Mean and per-coordinate variance (m, P) of `samples` per-sample gradients of each client at `params`."""
        ...

    def sampled_losses(self, params: Tensor, clients: Tensor, batch: int, round_: int, stream: str) -> Tensor:
        """Each client's mean loss of `params` on `batch` of its training samples drawn from `stream` (m,)."""
        ...

    def label_counts(self) -> Tensor:
        """(K, C) number of training samples of each class per client."""
        ...

    def reachable(self) -> Tensor:
        """(K,) bool: the clients the engine can still reach."""
        ...

    def initial_params(self) -> Tensor:
        """The model's initial parameters (P,)."""
        ...

    def backend_for(self, cohort: int, autograd_only: bool = False) -> str:
        """The name of the backend that trains a cohort of this size."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the engine (the clients' state, where it lives here)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
