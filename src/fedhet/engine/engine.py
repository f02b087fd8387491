"""The engine: one object that trains cohorts and scores models, whatever the strategy."""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from fedhet.data.dataset import FederatedData
from fedhet.engine.evaluate import ClientScores, score_clients, score_own_models
from fedhet.engine.functional import FlatModel
from fedhet.engine.local import Backend, train_cohort
from fedhet.engine.plan import LocalPlan, LocalResult, LocalSettings

BackendChoice = Literal["auto", "sequential", "vectorised"]

# Measured with `fedhet bench` on 2 CPU cores: above this many parameters a client's step is compute-bound and
# vmap gains nothing; below this many clients vmap's fixed cost per step outweighs the per-client loop.
VECTORISE_MAX_PARAMS = 60_000
VECTORISE_MIN_COHORT = 20


def resolve_backend(choice: BackendChoice, model: FlatModel, cohort: int = VECTORISE_MIN_COHORT) -> Backend:
    """`auto` picks the vectorised backend for small models and cohorts of at least 20 clients (where a
    round is dominated by per-client overhead), else sequential. Both give the same numbers."""
    if choice != "auto":
        return choice
    small = model.size <= VECTORISE_MAX_PARAMS and cohort >= VECTORISE_MIN_COHORT
    return "vectorised" if small else "sequential"


class Engine:
    """Local training and evaluation for every algorithm (strategies never write a training loop)."""

    def __init__(
        self,
        model: FlatModel,
        data: FederatedData,
        *,
        backend: BackendChoice = "auto",
        seed: int = 0,
        chunk_size: int = 0,
        local: LocalSettings | None = None,
    ) -> None:
        self.model = model
        self.data = data
        self.backend: BackendChoice = backend
        self.seed = seed
        self.chunk_size = chunk_size
        self.local = local or LocalSettings(steps=10, lr=0.05, batch_size=10)  # the run's default local training
        self.cache: dict[str, object] = {}  # per-run values computed once (e.g. MaxFL's client requirements)

    def train(self, global_params: Tensor, plan: LocalPlan, round_: int) -> LocalResult:
        """Local training of the plan's cohort from `global_params`."""
        return train_cohort(
            self.model,
            self.data.train,
            global_params,
            plan,
            backend=resolve_backend(self.backend, self.model, len(plan.clients)),
            seed=self.seed,
            round_=round_,
            chunk_size=self.chunk_size,
        )

    def scores(self, params: Tensor, split: Literal["train", "test"] = "test") -> ClientScores:
        """Loss and accuracy of one model on every client's `split` data."""
        return score_clients(self.model, params, getattr(self.data, split))

    def losses_at(self, params: Tensor, clients: Tensor, split: Literal["train", "test"] = "train") -> Tensor:
        """F_k(w): the mean loss of model `params` on each of `clients`' full `split` data (m,)."""
        return score_clients(self.model, params, getattr(self.data, split).select(clients)).loss

    def own_scores(self, params: Tensor, clients: Tensor, split: Literal["train", "test"] = "test") -> ClientScores:
        """Loss and accuracy of client i's own model params[i] on its own `split` data."""
        return score_own_models(self.model, params, getattr(self.data, split), clients)

    def initial_params(self) -> Tensor:
        return self.model.initial_params()
