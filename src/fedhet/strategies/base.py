"""The `Strategy` interface: what an algorithm decides, while the engine does the training.

A round, driven by `fedhet.experiments.runner`:

1. ``select``     — which available clients take part (default: m uniformly without replacement);
2. ``configure``  — a `LocalPlan` for them (steps, learning rates, the local objective's terms, the optimiser);
3. the engine trains the cohort and returns a `LocalResult` (``local_training``: one plan by default; a
   personalised method may train its clients' personal models too, or in phases);
4. ``aggregate``  — the new global model from the local ones, usually ``self.server_step(w, d)`` with the
   strategy's aggregate direction d, so that any strategy composes with any server optimiser
   (`fedhet.strategies.server`).

A method with personal models says how a client's personalised model is made (``personalization``: its stored
personal part, or steps from the global model), and runs that ask for it score those models
(`fedhet.experiments.evaluation.evaluate_personal`).

A strategy sees the clients only through `EngineProtocol` (the native engine or Flower's remote one). It keeps its
state (control variates, estimates) in private attributes and exposes it through ``state_dict``/``load_state_dict``
(subclasses extend the base's dictionary) so that checkpoints resume exactly. Per-cohort values that ``aggregate``
needs are kept per client id, so that the round can go on with fewer clients if some are lost mid-round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import ConfigDict, Field, PrivateAttr, field_serializer, field_validator
from torch import Tensor

from fedhet.attacks.base import Attack, NoAttack
from fedhet.engine.plan import LocalPlan, LocalResult, LocalSettings, check_steps
from fedhet.engine.protocol import EngineProtocol
from fedhet.engine.schedules import Schedule
from fedhet.registry import Component, Registry, spec_of
from fedhet.seeding import numpy_rng
from fedhet.strategies.server import SERVER_OPTIMIZERS, ServerOptimizer, ServerSGD
from fedhet.systems.base import NoSystem, SystemModel

__all__ = ["STRATEGIES", "LocalSettings", "ServerContext", "Strategy", "Train", "weighted_update"]

Train = Callable[[LocalPlan], LocalResult]  # runs a plan on the engine from the round's global model


@dataclass
class ServerContext:
    """What a strategy may use: the engine (to score models), client sizes, local settings, the seed."""

    engine: EngineProtocol
    local: LocalSettings
    seed: int
    clients_per_round: int
    attack: Attack = field(default_factory=NoAttack)
    system: SystemModel = field(default_factory=NoSystem)  # the clients' speeds (TiFL's tiers); none: no clock
    params: Tensor | None = None  # the current global model, set by the runner before each round's `select`
    local_schedule: Schedule | None = None  # ``schedules.local_lr`` (None: constant)
    server_schedule: Schedule | None = None  # ``schedules.server_lr`` (None: the strategy's own, `server_schedule`)
    rounds: int = 1  # T, the rounds planned (schedules that anneal over the run use it)
    round: int = 0  # the round under way (`start_round`)
    base_local: LocalSettings | None = None  # the config's local settings (``local`` is round t's)
    cohort_size: int | None = None  # clients `select` picks a round (None: clients_per_round; more: over-selection)

    @property
    def selects(self) -> int:
        """m' = the clients `Strategy.select` picks a round: ``clients_per_round``, or ⌈(1 + r)·m⌉ where a deadline
        over-selects (`fedhet.systems.deadline`)."""
        return self.cohort_size if self.cohort_size is not None else self.clients_per_round

    def start_round(self, round_: int) -> None:
        """Round `round_` (0-based) begins: ``local`` takes the round's learning rate from ``local_schedule``."""
        self.round = round_
        if self.local_schedule is None:
            return
        if self.base_local is None:
            self.base_local = self.local
        self.local = replace(self.base_local, lr=self.base_local.lr * self.local_schedule.factor(round_, self.rounds))

    def scheduled_lr(self, lr: float) -> float:
        """`lr` times round t's factor of ``schedules.local_lr`` (a strategy's second local learning rate, such as
        Ditto's personal one, follows local.lr's schedule)."""
        if self.local_schedule is None:
            return lr
        return lr * self.local_schedule.factor(self.round, self.rounds)

    def most_local_steps(self) -> int:
        """The most local steps a client takes in a round (``local.epochs`` gives larger clients more)."""
        sizes = self.train_sizes
        return int(self.local.plan(torch.arange(len(sizes)), sizes).steps.max()) if len(sizes) else 0

    def check_steps(self, what: str, steps: float, clients: int) -> None:
        """Refuse in one line, at setup, a training of `steps` local steps for `clients` clients at once that is
        too long or whose mini-batches would not fit in memory (`fedhet.engine.plan.check_steps`)."""
        check_steps(what, steps, clients, self.local.batch_size, self.engine.data.input_shape)

    def client_losses(self, params: Tensor, clients: Tensor, split: Literal["train", "test"] = "train") -> Tensor:
        """The losses F_k(params) that `clients` report to the server (malicious ones may lie)."""
        return self.attack.report_losses(clients, self.engine.losses_at(params, clients, split))

    @property
    def num_clients(self) -> int:
        return self.engine.data.num_clients

    @property
    def train_sizes(self) -> Tensor:
        return self.engine.data.train.sizes


class Strategy(Component):
    """Base class of every algorithm; subclasses set ``name``/``description`` and override hooks."""

    model_config = ConfigDict(extra="forbid", frozen=False, arbitrary_types_allowed=True)
    asynchronous: ClassVar[bool] = False  # an `AsynchronousStrategy`: updates arrive one by one, no rounds
    sub_models: ClassVar[bool] = False  # its plans give clients sub-models (`LocalPlan.masks`): no DP (noise leaks)
    default_model: ClassVar[str | dict[str, Any] | None] = (
        None  # the model (a name or a spec) where the config names none
    )
    architectures: ClassVar[bool] = False  # shares no weights between clients: runs with model: architectures
    server_lr: float = Field(1.0, gt=0, description="global (server) learning rate η_g")
    server_optimizer: ServerOptimizer = Field(
        default_factory=ServerSGD, description="sgd, momentum (FedAvgM), adagrad, adam or yogi (FedOpt)"
    )

    _ctx: ServerContext | None = PrivateAttr(None)
    _perturbation: Tensor | None = PrivateAttr(None)  # added to the next server step's direction (`perturb_next_step`)

    @field_validator("server_optimizer", mode="before")
    @classmethod
    def _server_optimizer(cls, value: Any) -> Any:
        if isinstance(value, ServerOptimizer):
            return value
        return SERVER_OPTIMIZERS.build(value, where="algorithm.server_optimizer")

    @field_serializer("server_optimizer")
    def _dump_server_optimizer(self, value: ServerOptimizer) -> dict[str, Any]:
        return spec_of(value)

    @property
    def ctx(self) -> ServerContext:
        if self._ctx is None:
            raise RuntimeError(f"strategy '{self.name}' used before setup()")
        return self._ctx

    def setup(self, ctx: ServerContext) -> None:
        """Called once before the first round (and again before a resumed run loads its state)."""
        self._ctx = ctx

    def select(self, round_: int, available: Tensor) -> Tensor:
        """Sample ``min(m, #available)`` of the available clients uniformly without replacement."""
        pool = torch.from_numpy(np.flatnonzero(available.cpu().numpy()))  # NumPy's: 8x torch.nonzero's speed
        m = min(self.ctx.selects, len(pool))
        rng = numpy_rng(self.ctx.seed, "select", round_)
        chosen = rng.choice(len(pool), size=m, replace=False)
        return pool[torch.as_tensor(chosen, dtype=torch.long)].sort().values

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        """Local-training instructions; default: the run's local settings (steps, learning rate, batch size,
        optimiser and objective terms) for every client."""
        return self.ctx.local.plan(clients, self.ctx.train_sizes[clients])

    def local_training(self, round_: int, clients: Tensor, global_params: Tensor, train: Train) -> LocalResult:
        """The round's local training; `train` runs a plan on the engine (from `global_params`, with the run's
        attack). Default: the `configure` plan, once. The result is what ``aggregate`` gets."""
        return train(self.configure(round_, clients, global_params))

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        """The next global model."""
        raise NotImplementedError

    def aggregation_weights(self, round_: int, result: LocalResult) -> Tensor | None:
        """p (m,): the weight of each client's update Δ_k in the direction d = Σ_k p_k Δ_k that ``aggregate`` gives
        its server step, for a strategy whose d is such a weighted sum (FedAvg, MaxFL); None otherwise. Client-level
        DP's central noise is calibrated to the largest p_k (`fedhet.privacy`), so a strategy that defines it must
        aggregate with these very weights (a subclass that overrides ``aggregate`` overrides this too)."""
        return None

    def personalization(self, clients: Tensor) -> LocalPlan | None:
        """How `clients`' personalised models are made from the global model, for personalised evaluation: a plan
        that the engine runs without storing anything (its personal part, and steps from there: fine-tuning, a
        rule). None: the method has no personal model (the global model is each client's, unless the run
        fine-tunes it: ``personal_eval.finetune_steps``)."""
        return None

    def parts(self) -> list[Strategy]:
        """This strategy and the strategies it wraps (a run sets each of them up with what it asks for)."""
        return [self]

    def server_step(self, global_params: Tensor, direction: Tensor, lr: float | None = None) -> Tensor:
        """The next global model from the aggregate direction d: the server optimiser's step with the round's η_g
        (`server_lr_at`), or `lr`, on d plus a pending perturbation, if any."""
        if self._perturbation is not None:
            direction, self._perturbation = direction + self._perturbation, None
        round_ = self._ctx.round if self._ctx is not None else 0
        return self.server_optimizer.step(global_params, direction, self.server_lr_at(round_) if lr is None else lr)

    def server_schedule(self) -> Schedule | None:
        """The strategy's own schedule of its server learning rate, used unless the run names one
        (``schedules.server_lr``); default: none, a constant rate."""
        return None

    def server_lr_at(self, round_: int) -> float:
        """η_g in round `round_`: ``server_lr`` times the run's server schedule (or the strategy's own)."""
        ctx = self._ctx  # None for a strategy used on its own (tests): its own schedule
        schedule = (ctx.server_schedule if ctx is not None else None) or self.server_schedule()
        rounds = ctx.rounds if ctx is not None else 1
        return self.server_lr if schedule is None else self.server_lr * schedule.factor(round_, rounds)

    def perturb_next_step(self, noise: Tensor) -> None:
        """Add `noise` (P,) to the direction of the next ``server_step`` (client-level DP's central noise, which a
        server optimiser then treats as part of the direction)."""
        self._perturbation = noise

    def pending_perturbation(self) -> bool:
        """Whether a perturbation waits for a server step (the strategy took none since it was given)."""
        return self._perturbation is not None

    def evaluation_params(self, params: Tensor) -> Tensor:
        """The model that is evaluated and reported after a round (default: the current global model; AFL
        reports the average of its iterates)."""
        return params

    def round_metrics(self) -> dict[str, float]:
        """Extra per-round numbers to log (e.g. the sum of MaxFL's weights)."""
        return {}

    def client_columns(self) -> dict[str, Tensor]:
        """Extra clients.csv columns (K,) after an evaluated round (e.g. HeteroFL's ``capacity``); default: none."""
        return {}

    def participation_log(self) -> dict[str, np.ndarray]:
        """Per round × client arrays of what the server saw and decided (who was active, selected, the weights
        applied), saved in the run folder's ``availability.npz``; default: none (CA-Fed's strategies log them)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The strategy's state for a checkpoint (subclasses add to this dictionary)."""
        return {"server_optimizer": self.server_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server_optimizer.load_state_dict(state.get("server_optimizer", {}))


STRATEGIES: Registry[Strategy] = Registry("algorithm")


def by_client(values: Tensor, clients: Tensor, num_clients: int) -> Tensor:
    """A (K, ...) tensor holding `values` at the rows of `clients` (NaN/False elsewhere): per-cohort values that
    ``configure`` computes and ``aggregate`` reads for the clients that answered."""
    fill = False if values.dtype == torch.bool else float("nan")
    out = torch.full((num_clients, *values.shape[1:]), fill, dtype=values.dtype)
    out[clients] = values
    return out


def weighted_update(updates: Tensor, weights: Tensor) -> Tensor:
    """Σ_k p_k Δ_k for weights p (m,) and updates Δ (m, P)."""
    return weights.to(updates.dtype) @ updates
