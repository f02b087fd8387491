"""The engine: one object that trains cohorts and scores models, whatever the strategy."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

import torch
from torch import Tensor

from fedhet.data.dataset import ClientData, FederatedData
from fedhet.engine.dense import dense_layers
from fedhet.engine.evaluate import ClientScores, sampled_losses, score_clients, score_own_models
from fedhet.engine.functional import FlatModel
from fedhet.engine.local import Backend, gradient_statistics, train_cohort
from fedhet.engine.memory import keep_freed_memory
from fedhet.engine.plan import LocalPlan, LocalResult, LocalSettings
from fedhet.engine.state import ClientStore
from fedhet.errors import ConfigError

BackendChoice = Literal["auto", "sequential", "vectorised", "dense"]

# For models the dense backend cannot run (CNNs, LSTMs). Measured on 2 CPU cores with LeNet-5 (62k parameters)
# on 32x32x3 images, 10 steps of 10: with two threads vmap is 1.15-1.25x faster than the per-client loop for 10
# to 100 clients (a vmapped convolution is large enough to use both cores); with one thread the loop is 1.2x
# faster. The FedAvg MNIST CNN (582k parameters) is within 10% either way, so larger models stay sequential.
VECTORISE_MAX_PARAMS = 100_000
VECTORISE_MIN_COHORT = 10


def resolve_device(device: str) -> torch.device:
    """The torch device for the config's `device` ("cpu", "cuda", "cuda:1"), with a clear error if absent."""
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ConfigError(f"device '{device}' is not a torch device; use 'cpu' or 'cuda'") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device '{device}' asked for, but torch sees no CUDA GPU here; use device: cpu")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device '{device}': fedhet runs on 'cpu' or 'cuda'")
    return dev


def resolve_backend(
    choice: BackendChoice, model: FlatModel, cohort: int = VECTORISE_MIN_COHORT, device: torch.device | None = None
) -> Backend:
    """`auto` picks `dense` for networks of Linear layers and ReLU/Tanh/Sigmoid (fastest on every workload
    of `fedhet bench`); for other models, vectorised for models of at most 100k parameters and cohorts of at
    least 10 clients when torch has two threads or more, else sequential (on a GPU: always vectorised). All
    give the same numbers."""
    if choice == "dense" and dense_layers(model) is None:
        raise ConfigError(
            "backend 'dense' needs a model of Linear layers with ReLU/Tanh/Sigmoid activations (and optional "
            "dropout); use backend 'auto', 'vectorised' or 'sequential' for this model"
        )
    if choice != "auto":
        return choice
    if dense_layers(model) is not None:
        return "dense"
    if device is not None and device.type != "cpu":
        return "vectorised"
    small = model.size <= VECTORISE_MAX_PARAMS and cohort >= VECTORISE_MIN_COHORT
    return "vectorised" if small and torch.get_num_threads() >= 2 else "sequential"


class Engine:
    """Local training and evaluation for every algorithm (strategies never write a training loop).

    Everything a strategy or metric asks of the clients goes through these methods (`train`, `scores`,
    `losses_at`, `own_scores`, `gradient_statistics`, `sampled_losses`), so that an engine-shaped proxy can
    send the same calls to the machines that hold the data (`fedhet.flower.remote.RemoteEngine`).
    """

    def __init__(
        self,
        model: FlatModel,
        data: FederatedData,
        *,
        backend: BackendChoice = "auto",
        seed: int = 0,
        chunk_size: int = 0,
        local: LocalSettings | None = None,
        device: str = "cpu",
    ) -> None:
        self.model = model
        self.data = data
        self.device = resolve_device(device)
        if self.device.type != "cpu" and backend == "sequential":
            raise ConfigError("backend 'sequential' runs on the CPU only: use 'auto', 'dense' or 'vectorised' on a GPU")
        self._placed: dict[str, ClientData] = {}  # the data on `device`, moved once
        resolve_backend(backend, model)  # a backend the model cannot use fails here, with a clear message
        keep_freed_memory()  # per-round (cohort × parameters) tensors reuse memory instead of page-faulting
        self.backend: BackendChoice = backend
        self.seed = seed
        self.chunk_size = chunk_size
        self.local = local or LocalSettings(steps=10, lr=0.05, batch_size=10)  # the run's default local training
        self.cache: dict[str, object] = {}  # per-run values computed once (e.g. MaxFL's client requirements)
        self.client_state = ClientStore()  # state the clients keep between rounds (see `fedhet.engine.state`)
        self.state_history = 1  # rounds a run may be rewound by and still find the clients' state (a checkpoint's age)

    def train(self, global_params: Tensor, plan: LocalPlan, round_: int) -> LocalResult:
        """Local training of the plan's cohort from `global_params` (with its client-state rule, if any)."""
        rule = plan.client_state
        if rule is not None:
            old = self.client_state.read(rule.key, plan.clients, round_, torch.zeros(self.model.size))
            plan = replace(plan, correction=rule.correction(old), client_state=None)
        result = train_cohort(
            self.model,
            self.data.train,
            global_params,
            plan,
            backend=resolve_backend(self.backend, self.model, len(plan.clients), self.device),
            seed=self.seed,
            round_=round_,
            chunk_size=self.chunk_size,
            placed=self.placed("train"),
        )
        if rule is not None:
            trained = result.steps > 0
            new = rule.update(old, global_params, result.params, result.steps, result.lr)
            new = torch.where(trained.unsqueeze(1), new, old)
            self.client_state.write(rule.key, plan.clients[trained], new[trained], round_)
            self.client_state.prune(round_ + 1 - self.state_history)
            result.state_delta = new - old
        return result

    def placed(self, split: Literal["train", "test"]) -> ClientData | None:
        """The `split` data on the engine's device (moved on first use; offsets stay on the CPU), or None on
        the CPU."""
        if self.device.type == "cpu":
            return None
        if split not in self._placed:
            data: ClientData = getattr(self.data, split)
            self._placed[split] = ClientData(data.x.to(self.device), data.y.to(self.device), data.offsets)
        return self._placed[split]

    def scores(self, params: Tensor, split: Literal["train", "test"] = "test") -> ClientScores:
        """Loss and accuracy of one model on every client's `split` data."""
        return score_clients(self.model, params, self.placed(split) or getattr(self.data, split))

    def losses_at(self, params: Tensor, clients: Tensor, split: Literal["train", "test"] = "train") -> Tensor:
        """F_k(w): the mean loss of model `params` on each of `clients`' full `split` data (m,)."""
        return score_clients(self.model, params, getattr(self.data, split).select(clients)).loss

    def own_scores(self, params: Tensor, clients: Tensor, split: Literal["train", "test"] = "test") -> ClientScores:
        """Loss and accuracy of client i's own model params[i] on its own `split` data."""
        return score_own_models(self.model, params, self.placed(split) or getattr(self.data, split), clients)

    def gradient_statistics(self, params: Tensor, clients: Tensor, samples: int, round_: int) -> tuple[Tensor, Tensor]:
        """Mean and per-coordinate variance (m, P) of `samples` per-sample gradients of each client at `params`
        (no dropout), from the round's "grad-stats" sample stream."""
        self.model.module.eval()
        return gradient_statistics(self.model, self.data.train, params, clients, samples, self.seed, round_)

    def sampled_losses(self, params: Tensor, clients: Tensor, batch: int, round_: int, stream: str) -> Tensor:
        """Each client's mean loss of `params` on `batch` of its training samples drawn from `stream` (m,)."""
        return sampled_losses(self.model, self.data.train, params, clients, batch, self.seed, round_, stream)

    def label_counts(self) -> Tensor:
        """(K, C) number of training samples of each class per client."""
        data = self.data
        counts = torch.zeros(data.num_clients, data.num_classes)
        counts.index_put_((data.train.owner, data.train.y), torch.ones(len(data.train.y)), accumulate=True)
        return counts

    def reachable(self) -> Tensor:
        """(K,) bool: the clients the engine can still reach (all of them here; a remote engine loses the clients
        of a node that stops answering)."""
        return torch.ones(self.data.num_clients, dtype=torch.bool)

    def initial_params(self) -> Tensor:
        return self.model.initial_params()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep of the engine: the clients' state."""
        return {"client_state": self.client_state.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.client_state.load_state_dict(state.get("client_state", {}))
