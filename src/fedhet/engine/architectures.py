"""Clients of different architectures: the engine routes each client to its own member of a composite model.

With ``model: architectures`` (`fedhet.models.architectures`) the run's parameter vector holds every member, one
contiguous block each, and every client trains and is scored on its member only: `ArchitectureEngine` splits each
call by member and hands each group to a plain `Engine` over that member's `FlatModel` (the member's block of the
vector), so a client costs what its own architecture costs, whatever backend that member trains on (dense for an
MLP, conv for a CNN, autograd where an objective needs it). The clients' state (personal models, terms' rows) lives
in the member engines, in the member's size. Nothing else changes: a strategy's plans, personal parts (``"head"``,
``"body"``, ``"*"`` name the member's), local terms and evaluation are the ones every run uses.

Refused in one line: members with batch-norm running statistics, plans with sub-model masks or layer scales, and
local terms that send vectors of the model's size (SCAFFOLD's control variates).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedhet.data.dataset import FederatedData
from fedhet.engine.engine import BackendChoice, Engine
from fedhet.engine.evaluate import ClientScores, scores_of_some
from fedhet.engine.functional import FlatModel, VmapProbe
from fedhet.engine.numerics import Precision
from fedhet.engine.plan import LocalPlan, LocalResult, LocalSettings
from fedhet.engine.protocol import Split
from fedhet.engine.state_store import PersonalState
from fedhet.errors import ConfigError
from fedhet.models.architectures import Architectures, Composite
from fedhet.models.flops import parameter_flops
from fedhet.seeding import numpy_rng

ARCHITECTURE = "architecture"  # data.info's key: each client's member (K,), for per-architecture metrics


def member_blocks(model: FlatModel) -> list[slice]:
    """The block of each member ``members.<a>.*`` in the composite's parameter vector."""
    module = model.module
    assert isinstance(module, Composite)
    blocks = []
    for a in range(len(module.members)):
        spans = [model.slices[n] for n in model.names if n.startswith(f"members.{a}.")]
        blocks.append(slice(spans[0].start, spans[-1].stop))
    return blocks


def member_levels(spec: Architectures, model: FlatModel) -> list[float]:
    """Each member's capacity level: ``spec.levels``, or its parameter count over the largest member's."""
    if spec.levels is not None:
        return list(spec.levels)
    sizes = [b.stop - b.start for b in member_blocks(model)]
    return [s / max(sizes) for s in sizes]


def assign_members(spec: Architectures, model: FlatModel, k: int, seed: int, capacities: Tensor | None) -> Tensor:
    """(K,) int64 each client's member. ``fix``: the clients, in a seeded random order, split in the proportions (as
    nearly as whole clients allow); ``system``: the member of the largest level within the client's capacity (the
    system model's `capacities`, (K,); the smallest member where none fits)."""
    n = len(spec.members)
    if spec.assignment == "system":
        if capacities is None:
            raise ConfigError(
                "model.assignment: system takes each client's architecture from the system model's capacity, and "
                "the run sets none; set system.capacity (levels, proportions, by), or use model.assignment: fix"
            )
        levels = torch.tensor(member_levels(spec, model), dtype=torch.float64)
        capacity = capacities.double()
        fits = levels.unsqueeze(0) <= capacity.unsqueeze(1) + 1e-12  # (K, n)
        ranked = torch.where(fits, levels.unsqueeze(0), -1.0)
        best = ranked.argmax(1)  # the first member of the largest level that fits
        return torch.where(fits.any(1), best, levels.argmin()).long()
    shares = torch.tensor(spec.proportions or [1.0] * n, dtype=torch.float64)
    bounds = torch.round(shares.cumsum(0) / shares.sum() * k).long()
    which = torch.bucketize(torch.arange(k), bounds, right=True).clamp_max(n - 1)
    order = torch.as_tensor(numpy_rng(seed, "architectures/fix").permutation(k))
    out = torch.empty(k, dtype=torch.long)
    out[order] = which
    return out


def _groups(members: Tensor) -> list[tuple[int, Tensor]]:
    """(member, indices into `members`) for each member present, in member order."""
    return [(a, torch.nonzero(members == a).flatten()) for a in torch.unique(members).tolist()]


def _in_order(parts: list[ClientScores], indices: list[Tensor]) -> ClientScores:
    """The groups' scores put back in the order of the rows they came from."""
    joined = ClientScores.concat(parts)
    return joined.select(torch.argsort(torch.cat(indices)))


class ArchitectureEngine(Engine):
    """The engine of a composite model: every call split by the clients' members (see the module docstring)."""

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
        precision: Precision = "float32",
    ) -> None:
        module = model.module
        if not isinstance(module, Composite):
            raise TypeError("ArchitectureEngine needs a model built by model: architectures")
        if model.stat_names:
            raise ConfigError(
                "model: architectures cannot hold members with batch-norm running statistics (a ResNet's); choose "
                "members without batch norm (mlp, cnn_mnist, cnn_cifar, lenet)"
            )
        model.vmap_probe = VmapProbe()  # the composite itself never trains: nothing to probe
        settings: dict[str, Any] = dict(
            backend=backend, seed=seed, chunk_size=chunk_size, local=local, device=device, precision=precision
        )
        super().__init__(model, data, **settings)
        self.blocks = member_blocks(model)
        self.dim = module.dim  # the representation's dimension d
        # each member's head (W (C, d), b (C,)): its coordinates in the composite's vector
        self.heads = [
            (model.slices[f"members.{a}.head.weight"], model.slices[f"members.{a}.head.bias"])
            for a in range(len(self.blocks))
        ]
        self.parts = [Engine(FlatModel(m, model.task), data, **settings) for m in module.members]
        self.members = torch.zeros(data.num_clients, dtype=torch.long)
        self._flops: Tensor | None = None  # `member_flops`

    def assign(self, members: Tensor) -> None:
        """Give each client (K,) its member; per-architecture metrics read them from ``data.info``."""
        self.members = members.long()
        self.data = replace(self.data, info={**self.data.info, ARCHITECTURE: self.members})
        for part in self.parts:
            part.data = self.data

    @property
    def state_history(self) -> int:
        return self._history

    @state_history.setter
    def state_history(self, rounds: int) -> None:
        self._history = rounds
        for part in getattr(self, "parts", []):
            part.state_history = rounds

    def place_client_state(
        self, mode: PersonalState, folder: Path | None, claim: Any = None
    ) -> str:  # the members' rows differ in size
        if mode == "disk":
            raise ConfigError(
                "model: architectures keeps the clients' rows in memory: use personal_state memory or auto"
            )
        return "memory"

    def split_plan(self, plan: LocalPlan, rows: Tensor, a: int) -> LocalPlan:
        """The plan of `rows` of `plan` (all of member `a`) on that member's coordinates."""
        if plan.masks is not None or plan.scales is not None:
            raise ConfigError("model: architectures does not combine with sub-model methods (masks, scales)")
        for term in plan.terms:
            if term.server_tensors():
                raise ConfigError(
                    f"model: architectures cannot run the local term '{term.name}': it sends vectors of the model's "
                    "size, and each architecture has its own"
                )
        sub = plan.rows(rows)
        if sub.starts is not None:
            sub = replace(sub, starts=sub.starts[:, self.blocks[a]])
        return sub

    def _routed(self, clients: Tensor) -> list[tuple[int, Tensor]]:
        return _groups(self.members[clients])

    def train(self, global_params: Tensor, plan: LocalPlan, round_: int) -> LocalResult:
        m = len(plan.clients)
        params = global_params.unsqueeze(0).repeat(m, 1)
        losses = torch.full((m,), float("nan"))
        deltas: dict[str, Tensor] = {}
        backends = []
        for a, rows in self._routed(plan.clients):
            block = self.blocks[a]
            part = self.parts[a]
            result = part.train(global_params[block], self.split_plan(plan, rows, a), round_)
            params[rows, block] = result.params
            losses[rows] = result.train_loss
            for key, delta in result.state_delta.items():
                deltas.setdefault(key, torch.zeros(m, self.model.size))[rows, block] = delta
            backends.append(str(part.last_backend))
        self.last_backend = "+".join(dict.fromkeys(backends)) or None
        out = LocalResult(plan.clients, params, losses, plan.steps, plan.lr)
        out.state_delta = deltas
        return out

    def personal_scores(
        self, global_params: Tensor, plan: LocalPlan, round_: int, split: Split = "test"
    ) -> ClientScores:
        parts, indices = [], []
        for a, rows in self._routed(plan.clients):
            sub = self.split_plan(plan, rows, a)
            parts.append(self.parts[a].personal_scores(global_params[self.blocks[a]], sub, round_, split))
            indices.append(rows)
        return _in_order(parts, indices)

    def personal_starts(self, global_params: Tensor, plan: LocalPlan, round_: int) -> Tensor | None:
        if plan.personal is None:
            return None
        out = global_params.unsqueeze(0).repeat(len(plan.clients), 1)
        for a, rows in self._routed(plan.clients):
            block = self.blocks[a]
            starts = self.parts[a].personal_starts(global_params[block], self.split_plan(plan, rows, a), round_)
            assert starts is not None
            out[rows, block] = starts
        return out

    def own_scores(self, params: Tensor, clients: Tensor, split: Split = "test") -> ClientScores:
        parts, indices = [], []
        for a, rows in self._routed(clients):
            parts.append(self.parts[a].own_scores(params[rows][:, self.blocks[a]], clients[rows], split))
            indices.append(rows)
        return _in_order(parts, indices)

    def scores(self, params: Tensor, split: Split = "test", clients: Tensor | None = None) -> ClientScores:
        """Each client's score of its member of the global model `params` (the global model of its architecture)."""
        chosen = torch.arange(self.data.num_clients) if clients is None else clients.sort().values
        parts, indices = [], []
        for a, rows in self._routed(chosen):
            some = chosen[rows]
            parts.append(self.parts[a].scores(params[self.blocks[a]], split, some).select(some))
            indices.append(rows)
        sizes = self.split(split).sizes
        return scores_of_some(_in_order(parts, indices), chosen, sizes)

    def losses_at(self, params: Tensor, clients: Tensor, split: Split = "train") -> Tensor:
        out = torch.empty(len(clients))
        for a, rows in self._routed(clients):
            out[rows] = self.parts[a].losses_at(params[self.blocks[a]], clients[rows], split)
        return out

    def gradient_statistics(self, params: Tensor, clients: Tensor, samples: int, round_: int) -> tuple[Tensor, Tensor]:
        raise ConfigError("model: architectures has no gradient statistics of one model across architectures")

    def sampled_losses(self, params: Tensor, clients: Tensor, batch: int, round_: int, stream: str) -> Tensor:
        out = torch.empty(len(clients))
        for a, rows in self._routed(clients):
            out[rows] = self.parts[a].sampled_losses(params[self.blocks[a]], clients[rows], batch, round_, stream)
        return out

    def clock_costs(self, plan: LocalPlan) -> tuple[Tensor, Tensor, Tensor]:
        """What the round's clock charges each of the plan's clients (`fedhet.systems.clock.RoundClock.schedule`):
        its architecture's parameters (m,), those of them that stay on the client (its personal part), and its
        share of the forward FLOPs per sample of the largest architecture (a system model's seconds per sample are
        the largest architecture's)."""
        members = self.members[plan.clients]
        sizes = torch.tensor([b.stop - b.start for b in self.blocks])
        personal = torch.zeros(len(self.blocks), dtype=torch.long)
        if plan.personal is not None:
            spec = plan.personal
            personal = torch.stack([part.mask(spec.parts, spec.what).sum() for part in self.parts])
        flops = self.member_flops()
        return sizes[members], personal[members], flops[members] / flops.max()

    def member_flops(self) -> Tensor:
        """(n,) float64 each architecture's forward FLOPs per sample (`fedhet.models.flops`), worked out once."""
        if self._flops is None:
            shape = self.data.input_shape
            self._flops = torch.stack([parameter_flops(part.model.module, shape).double().sum() for part in self.parts])
        return self._flops

    def client_representations(
        self, global_params: Tensor, plan: LocalPlan, round_: int, split: Split = "train"
    ) -> Iterator[tuple[int, Tensor, Tensor]]:
        """(row, z (n_k, dim), y (n_k,)) for each of the plan's clients: the representations z = f(x) of its `split`
        data under its model as the plan starts it (its personal model with ``plan.personal``, as stored by the
        trainings before the plan's phase), and the labels."""
        starts = self.personal_starts(global_params, plan, round_)
        data = self.split(split)
        for a, rows in self._routed(plan.clients):
            block, part = self.blocks[a], self.parts[a].model
            for i in rows.tolist():
                k = int(plan.clients[i])
                flat = (starts[i] if starts is not None else global_params)[block]
                lo, hi = int(data.offsets[k]), int(data.offsets[k + 1])
                with torch.no_grad():
                    yield i, part.representation(part.unflatten(flat), data.x[lo:hi]), data.y[lo:hi]

    def representations(self, global_params: Tensor, plan: LocalPlan, round_: int) -> tuple[Tensor, Tensor]:
        """The sum (m, C, dim) and the number (m, C) of the representations of each class on each of the plan's
        clients' training data (`client_representations`): local class prototypes are sum / number (FedProto's
        eq. 4)."""
        m, classes = len(plan.clients), self.data.num_classes
        sums, counts = torch.zeros(m, classes, self.dim), torch.zeros(m, classes)
        for i, z, y in self.client_representations(global_params, plan, round_):
            sums[i].index_add_(0, y, z)
            counts[i] += torch.bincount(y, minlength=classes).float()
        return sums, counts

    def state_dict(self) -> dict[str, Any]:
        return {"members": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for part, saved in zip(self.parts, state.get("members", []), strict=False):
            part.load_state_dict(saved)
