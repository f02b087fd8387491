"""What a strategy asks of local training (`LocalPlan`) and what comes back (`LocalResult`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor

from fedhet.engine.objective import LocalTerm, ParameterTerm, WeightDecay
from fedhet.engine.optimizers import SGD, ClientOptimizer
from fedhet.engine.personal import Personal
from fedhet.engine.privacy import ExampleDP, UpdateClip
from fedhet.engine.rules import LocalRule
from fedhet.errors import ConfigError

PHASES = 8  # trainings of one round that may build on each other (`LocalPlan.phase`)
MAX_STEPS = 1_000_000  # local steps a client may be asked for in one training (the bound of the config's local.steps)
MAX_BATCH_BYTES = 4 << 30  # the padded mini-batches of one training's cohort: indices, weights and gathered inputs


def batch_bytes(clients: int, steps: int, batch: int, features: int) -> int:
    """Bytes of one training's padded mini-batches: (clients, steps, batch) int64 indices and float32 weights, and
    the float32 inputs they gather (every batch is padded to `batch` rows; see `fedhet.engine.batches`)."""
    return clients * steps * batch * (12 + 4 * features)


def check_steps(what: str, steps: float, clients: int, batch: int, input_shape: tuple[int, ...]) -> None:
    """Refuse in one line (`ConfigError` naming `what`) a training of `steps` local steps for `clients` clients at
    once that takes more than `MAX_STEPS` steps or whose mini-batches need more than `MAX_BATCH_BYTES`, before
    anything runs (such a training would end in an out-of-memory error or run for days)."""
    if not math.isfinite(steps) or steps > MAX_STEPS:
        raise ConfigError(f"{what}: {steps:,.0f} local steps per client, more than {MAX_STEPS:,}; lower it")
    need = batch_bytes(clients, int(steps), batch, math.prod(input_shape))
    if need > MAX_BATCH_BYTES:
        raise ConfigError(
            f"{what}: {int(steps):,} local steps × batch {batch:,} × {clients:,} clients need about "
            f"{need / 2**30:,.1f} GiB of mini-batches (at most {MAX_BATCH_BYTES / 2**30:.0f}); lower it"
        )


@dataclass(frozen=True)
class LocalSettings:
    """A run's default local training (the config's ``local`` section): steps (or epochs), learning rate, batch
    size, the client optimiser and the terms every client's objective carries (``weight_decay`` is one of them)."""

    steps: int
    lr: float
    batch_size: int
    weight_decay: float = 0.0
    optimizer: ClientOptimizer = field(default_factory=SGD)
    terms: tuple[LocalTerm, ...] = ()
    epochs: float | None = None  # instead of steps: client k takes ⌈epochs · n_k / B⌉ steps

    @property
    def objective(self) -> tuple[LocalTerm, ...]:
        """The configured terms, with the weight decay as a term when it is set."""
        decay = (WeightDecay(lam=self.weight_decay),) if self.weight_decay else ()
        return (*self.terms, *decay)

    def plan(self, clients: Tensor, sizes: Tensor | None = None) -> LocalPlan:
        """The default plan for `clients` (with ``epochs``, `sizes` (m,) gives each client's training samples)."""
        plan = LocalPlan.uniform(
            clients, self.steps, self.lr, self.batch_size, terms=self.objective, optimizer=self.optimizer
        )
        if self.epochs is not None:
            if sizes is None:
                raise ValueError("local epochs need the clients' sizes")
            plan.steps = epoch_steps(sizes, self.batch_size, self.epochs)
        return plan


def epoch_steps(sizes: Tensor, batch_size: int, epochs: float) -> Tensor:
    """⌈epochs · n_k / B⌉ steps for each client (at least 1; 0 for a client without samples): `epochs` passes
    over its data in mini-batches of B (the last batch of a pass continues into the next pass)."""
    steps = torch.ceil(epochs * sizes.double() / batch_size).long().clamp_min(1)
    return torch.where(sizes > 0, steps, torch.zeros_like(steps))


@dataclass(frozen=True)
class Upload:
    """What a client sends for a plan under a protocol, in place of its update: `sent` bytes (instead of the shared
    update's 4 bytes a parameter) and `trips`, the protocol's message round trips besides the upload itself (each
    costs the client's latency both ways)."""

    sent: float  # bytes
    trips: int = 0


@dataclass
class LocalPlan:
    """Instructions for one round's cohort.

    Client k takes ``steps[k]`` local steps with learning rate ``lr[k]`` from the received model w_global:

        d ← ∇F_k(w; ξ) + Σ_j ∇T_j(w)          (``terms``, `fedhet.engine.objective`)
        w, s_k ← optimizer(w, d, s_k, lr[k])   (``optimizer``, `fedhet.engine.optimizers`; SGD: w ← w − η d)

    A ``rule`` (`fedhet.engine.rules`) replaces the plain gradient d by its own estimate from several mini-batches
    (Per-FedAvg, pFedMe). ``stream`` names the random stream of mini-batches (e.g. "finetune").

    ``starts`` gives each client its own start point (an asynchronous server sent them different model versions;
    `anchor_free` says when that is the same as training each from its own received model). With ``personal``
    (`fedhet.engine.personal.Personal`) each client starts from its own model (its stored
    personal part, the received model elsewhere), keeps the personal part after its steps and returns only the
    shared part. ``frozen`` names parameters the steps leave as they start (patterns as ``personal.parts``:
    FedRep trains its head, then its body). ``phase`` orders several trainings of one round that read what an
    earlier one stored (a later phase sees the rows an earlier phase of the same round wrote).

    ``masks`` (m, P) bool gives each client the coordinates it trains (a sub-model of the global model: HeteroFL's
    width slices): the engine starts client k from its start point with the coordinates outside ``masks[k]`` set to
    zero and returns them as zero (`fedhet.engine.engine.Engine.train`). That is training with those coordinates
    frozen at zero whenever their gradient is zero there, as in a network whose masked-out hidden units have zero
    incoming and outgoing weights and an activation with φ(0) = 0 (ReLU, GELU, Tanh), under an objective with no
    term pulling them elsewhere (`anchor_free`); the strategy that sets masks checks this. ``scales`` (m, L)
    multiplies, in training only, the outputs of the model's L Linear/Conv2d layers (in module order, their
    weights and bias applied, before the activation) by a factor per client: HeteroFL's scaler (1/r on a sliced
    layer). Every backend runs it (sequential: not with an objective that needs autograd, which it trains functionally).

    Differential privacy (`fedhet.engine.privacy`): ``clip`` clips (and, for local DP, noises) the update each
    client sends, after its steps; ``dp_sgd`` makes every step a DP-SGD step (per-sample clipping and noise).

    ``upload`` (`Upload`) says what each client sends in place of its update under a protocol (secure aggregation):
    the simulated clock charges it (`fedhet.systems.clock`); training ignores it, and it does not travel to nodes.
    """

    clients: Tensor  # (m,) int64 client ids
    steps: Tensor  # (m,) int64 local steps per client (0 allowed: the client returns the received model)
    lr: Tensor  # (m,) float32 local learning rate per client
    batch_size: int
    terms: tuple[LocalTerm, ...] = ()
    optimizer: ClientOptimizer = field(default_factory=SGD)
    rule: LocalRule | None = None
    stream: str = "train"
    personal: Personal | None = None
    frozen: tuple[str, ...] = ()
    phase: int = 0
    starts: Tensor | None = None  # (m, P) each client's own start point (clients sent different models)
    clip: UpdateClip | None = None
    dp_sgd: ExampleDP | None = None
    masks: Tensor | None = None  # (m, P) bool: the coordinates each client trains (the others: zero)
    scales: Tensor | None = None  # (m, L) float32: factors on the outputs of the L Linear/Conv2d layers in training
    upload: Upload | None = None  # what a client sends instead of its update (secure aggregation), for the clock
    step_masks: Tensor | None = None  # (S, P) bool: the sub-models the clients' steps train (with ``step_index``)
    step_index: Tensor | None = None  # (m, T) int64: which of ``step_masks`` client k's step t trains

    def __post_init__(self) -> None:
        m = len(self.clients)
        if self.steps.shape != (m,) or self.lr.shape != (m,):
            raise ValueError(f"steps {tuple(self.steps.shape)} and lr {tuple(self.lr.shape)} must be ({m},)")
        if bool((self.steps < 0).any()):
            raise ValueError("local steps must be >= 0")
        names = [t.name for t in self.terms]
        if len(set(names)) != len(names):
            raise ValueError(f"a local term appears twice in the plan: {names}")
        if not 0 <= self.phase < PHASES:
            raise ValueError(f"a plan's phase must be in 0..{PHASES - 1}")
        if self.starts is not None and (self.starts.dim() != 2 or len(self.starts) != m):
            raise ValueError(f"a plan's start points must be ({m}, P)")
        if self.starts is not None and self.personal is not None:
            raise ValueError("a plan starts its clients from given points or from their personal parts, not both")
        if self.masks is not None and (self.masks.dim() != 2 or len(self.masks) != m or self.masks.dtype != torch.bool):
            raise ValueError(f"a plan's masks must be ({m}, P) bool")
        if self.scales is not None and (self.scales.dim() != 2 or len(self.scales) != m):
            raise ValueError(f"a plan's scales must be ({m}, L)")
        if (self.step_masks is None) != (self.step_index is None):
            raise ValueError("a plan's step_masks and step_index come together")
        if self.step_masks is not None and self.step_index is not None:
            s, t = len(self.step_masks), int(self.steps.max()) if m else 0
            if self.step_masks.dim() != 2 or self.step_masks.dtype != torch.bool:
                raise ValueError("a plan's step_masks must be (S, P) bool")
            if self.step_index.dim() != 2 or len(self.step_index) != m or self.step_index.shape[1] < t:
                raise ValueError(f"a plan's step_index must be ({m}, T) with T >= every client's steps")
            if self.step_index.numel() and not (int(self.step_index.min()) >= 0 and int(self.step_index.max()) < s):
                raise ValueError(f"a plan's step_index must point into its {s} step_masks")
            if self.masks is None:
                self.masks = self.step_union()
        if self.masks is not None and (self.personal is not None or self.clip is not None):
            raise ValueError("a plan's masks do not combine with personal parts or update clipping")
        self.terms = tuple(self.terms)
        self.frozen = tuple(self.frozen)

    @staticmethod
    def uniform(
        clients: Tensor,
        steps: int,
        lr: float,
        batch_size: int,
        *,
        terms: tuple[LocalTerm, ...] = (),
        optimizer: ClientOptimizer | None = None,
        rule: LocalRule | None = None,
        stream: str = "train",
        weight_decay: float = 0.0,
        personal: Personal | None = None,
        frozen: tuple[str, ...] = (),
        phase: int = 0,
    ) -> LocalPlan:
        """The same number of steps and learning rate for every client (``weight_decay`` adds that term)."""
        m = len(clients)
        decay = (WeightDecay(lam=weight_decay),) if weight_decay else ()
        return LocalPlan(
            clients=clients,
            steps=torch.full((m,), steps, dtype=torch.long),
            lr=torch.full((m,), lr, dtype=torch.float32),
            batch_size=batch_size,
            terms=(*terms, *decay),
            optimizer=optimizer or SGD(),
            rule=rule,
            stream=stream,
            personal=personal,
            frozen=frozen,
            phase=phase,
        )

    def rows(self, keep: Tensor) -> LocalPlan:
        """The plan of the clients `keep` selects (indices into ``clients``)."""
        starts = self.starts[keep] if self.starts is not None else None
        masks = self.masks[keep] if self.masks is not None else None
        scales = self.scales[keep] if self.scales is not None else None
        index = self.step_index[keep] if self.step_index is not None else None
        return replace(
            self,
            clients=self.clients[keep],
            steps=self.steps[keep],
            lr=self.lr[keep],
            starts=starts,
            masks=masks,
            scales=scales,
            step_index=index,
        )

    def step_union(self) -> Tensor:
        """(m, P) bool: each client's union of the ``step_masks`` of the steps it takes (none: all False)."""
        assert self.step_masks is not None and self.step_index is not None
        m, s = len(self.clients), len(self.step_masks)
        taken = torch.arange(self.step_index.shape[1]).unsqueeze(0) < self.steps.unsqueeze(1)
        used = torch.zeros(m, s + 1, dtype=torch.bool)
        used.scatter_(1, torch.where(taken, self.step_index, s), True)  # column s: the steps not taken
        return (used[:, :s].to(torch.float32) @ self.step_masks.to(torch.float32)) > 0

    def step_mask(self, rows: Tensor | slice | int, t: int) -> Tensor | None:
        """(len(rows), P) bool (one row: (P,)): the sub-model the plan's clients `rows` train at step t (None without
        step masks)."""
        if self.step_masks is None or self.step_index is None:
            return None
        return self.step_masks[self.step_index[rows, t]]

    @property
    def anchor_free(self) -> bool:
        """Whether the steps never look at the received model except as their start (no data term, no rule, only
        parameter terms whose gradient ignores it, such as weight decay): clients sent different models may then
        train together from their own start points (``starts``)."""
        if self.rule is not None:
            return False
        for term in self.terms:
            form = term.affine() if isinstance(term, ParameterTerm) else None
            if form is None or form[1] != 0 or term.client_state:
                return False
        return True

    def with_terms(self, *terms: LocalTerm) -> LocalPlan:
        """The plan with `terms` added to the objective."""
        return replace(self, terms=(*self.terms, *terms))


@dataclass
class LocalResult:
    """Local models after training, and what was measured on the way."""

    clients: Tensor  # (m,)
    params: Tensor  # (m, P) local models after their steps
    train_loss: Tensor  # (m,) mean mini-batch loss over the steps taken (nan for 0 steps)
    steps: Tensor  # (m,)
    lr: Tensor  # (m,)
    state_delta: dict[str, Tensor] = field(default_factory=dict)  # "<term>.<state>" -> (m, P) change, 0 if no step
    dropped: Tensor | None = None  # (m,) bool: clients that never answered (a remote node was lost); NaN rows
    clipped: Tensor | None = None  # (m,) bool: updates the plan's ``clip`` scaled down (client-level DP)

    def rows(self, keep: Tensor) -> LocalResult:
        """The clients selected by `keep` (a bool mask or indices), every per-client field included."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        picked: dict[str, object] = {k: v[keep] for k, v in values.items() if isinstance(v, Tensor)}
        picked["state_delta"] = {k: v[keep] for k, v in self.state_delta.items()}
        return replace(self, **picked)  # type: ignore[arg-type]

    def updates(self, global_params: Tensor) -> Tensor:
        """Δ_k = w_global − w_k (so that w_global − η Σ p_k Δ_k is a descent step)."""
        return global_params.unsqueeze(0) - self.params
