"""DepthFL (Kim, Yu, Kim, Moon, ICLR 2023): clients of different capacity train depth sub-models of one global model.

The global model has a classifier (exit) after each of its D blocks (a multi-exit model, `fedhet.models.exits`:
``model: mlp_exits`` or ``cnn_exits``). A client of depth level r ∈ (0, 1] trains the first d = ⌈r·D⌉ blocks and
their d exits (§3.1: the deeper blocks pruned off), as a masked full model (`LocalPlan.masks`: the deeper blocks
and exits are zero and stay zero), on the loss (§3.3, with mutual self-distillation among its exits)

    L_k = Σ_{i≤d} L_ce(y, ŷ_i) + λ/(d−1) Σ_{i≤d} Σ_{j≤d, j≠i} KL(ŷ_j ‖ ŷ_i)

(ŷ_i the softmax of exit i; the target ŷ_j held fixed in the gradient, as in deep mutual learning and the paper's
code; λ = ``distill_weight``, the term dropped with ``distill: false`` or d = 1). The server averages each parameter
over the clients that hold it (§3.2, HeteroFL's Eq. 2: `fedhet.strategies.submodels.masked_average`). Inference is
the ensemble of the available exits (the mean of their logits, §3.4).

Levels, proportions, the assignment (fix, dynamic, system), the capacity columns and the aggregation are the width
sub-models' (`fedhet.strategies.submodels.SubModels`); a level's sub-model is the first ⌈r·D⌉ blocks with their
exits, and each level is scored as the ensemble of its exits (``test_accuracy_level<r>``), each exit alone as
``test_accuracy_exit<i>``. Not implemented: the paper's ramp-up of the distillation weight (its code), FedDyn as
the base optimiser (a local term that pulls the pruned weights off zero: refused, as for HeteroFL).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import ClassVar

import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.objective import TERMS, DataTerm, ModelView
from fedhet.engine.plan import LocalPlan
from fedhet.errors import ConfigError
from fedhet.models.exits import MultiExit
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.submodels import SubModels, kept


def mutual_distillation(z: Tensor, held: Tensor) -> Tensor:
    """(B,) per sample 1/(d−1) Σ_{i≠j held} KL(sg(p_j) ‖ p_i) over the exits' outputs z (D, B, C), p = softmax(z),
    d = Σ held (0 where d ≤ 1): DepthFL's mutual self-distillation, the targets p_j detached."""
    logp = torch.log_softmax(z, dim=-1)
    target = logp.detach()
    p = target.exp()
    entropy = (p * target).sum(-1)  # (D, B): Σ_c p_j log p_j
    cross = torch.einsum("jbc,ibc->ijb", p, logp)  # (D, D, B): Σ_c p_j log p_i
    kl = entropy.unsqueeze(0) - cross  # kl[i, j] = KL(p_j ‖ p_i)
    h = held.to(z.dtype)
    pairs = h.unsqueeze(1) * h.unsqueeze(0) * (1 - torch.eye(len(h), dtype=z.dtype, device=z.device))
    d = h.sum()
    return torch.einsum("ij,ijb->b", pairs, kl) / (d - 1).clamp_min(1.0)


@TERMS.register
class ExitDistillation(DataTerm):
    """λ · DepthFL's mutual self-distillation among the exits a client holds (`mutual_distillation`); needs a
    multi-exit model."""

    name: ClassVar[str] = "exit_distillation"
    description: ClassVar[str] = "mutual self-distillation among a multi-exit model's exits (DepthFL)"
    needs_exits: ClassVar[bool] = True
    weight: float = Field(1.0, ge=0, description="weight λ of the distillation term")

    def loss(self, view: ModelView) -> Tensor:
        if view.exits is None or view.held is None:
            raise ConfigError("local term 'exit_distillation' needs a multi-exit model (model: mlp_exits)")
        return self.weight * view.mean(mutual_distillation(view.exits, view.held))


def depth_mask(model: MultiExit, names: list[str], sizes: list[int], depth: int) -> Tensor:
    """(P,) bool: the parameters of the first `depth` blocks and their exits (the others, and the coordinates
    after the parameters, False), for a flat vector of parameters `names` of `sizes`."""
    keep = set()
    for i in range(depth):
        keep |= {f"blocks.{i}.{n}" for n, _ in model.blocks[i].named_parameters()}
        keep |= {f"heads.{i}.{n}" for n, _ in model.heads[i].named_parameters()}
    parts = [torch.full((k,), n in keep, dtype=torch.bool) for n, k in zip(names, sizes, strict=True)]
    return torch.cat(parts)


def exit_mask(model: MultiExit, names: list[str], sizes: list[int], exit_: int) -> Tensor:
    """(P,) bool: the first `exit_` blocks and exit `exit_` alone (1-based): the model that scores that exit."""
    deeper = depth_mask(model, names, sizes, exit_)
    before = depth_mask(model, names, sizes, exit_ - 1)
    heads = torch.cat(
        [torch.full((k,), n.startswith("heads."), dtype=torch.bool) for n, k in zip(names, sizes, strict=True)]
    )
    return deeper & ~(before & heads)


@STRATEGIES.register
class DepthFL(SubModels):
    """FedAvg of depth sub-models of a multi-exit model, with mutual self-distillation among a client's exits."""

    name: ClassVar[str] = "depthfl"
    description: ClassVar[str] = "DepthFL: depth sub-models of a multi-exit model per client capacity (Kim et al. 2023)"
    default_model: ClassVar[str | None] = "mlp_exits"
    levels: list[float] = Field(
        default_factory=lambda: [1.0, 0.75, 0.5, 0.25],
        min_length=1,
        description="depth levels r in (0, 1]: a client of level r trains the first ceil(r*D) of the D blocks",
    )
    distill: bool = Field(True, description="mutual self-distillation among the client's exits (DepthFL §3.3)")
    distill_weight: float = Field(1.0, ge=0, description="weight λ of the self-distillation term")

    _exit_masks: list[Tensor] = PrivateAttr(default_factory=list)  # (P,) the model that scores each exit alone

    def level_masks(self, what: str) -> dict[float, Tensor]:
        """Check that the model has exits, and give the mask of each level: the first ⌈r·D⌉ blocks and exits."""
        flat = self.ctx.engine.model
        module = flat.module
        if not isinstance(module, MultiExit):
            raise ConfigError(f"{what} trains a model with exits after its blocks: use model: mlp_exits or cnn_exits")
        if self.distill and flat.task.name != "classification":
            raise ConfigError(f"{what}: self-distillation compares class probabilities; set algorithm.distill=false")
        blocks = module.num_exits
        depths = {level: kept(blocks, level) for level in self.levels}
        same = [(a, b) for a in depths for b in depths if a < b and depths[a] == depths[b]]
        if same:
            a, b = same[0]
            raise ConfigError(
                f"{what}: levels {a:g} and {b:g} give the same depth {depths[a]} of the model's {blocks} blocks; "
                "give levels of different depths (e.g. [1, 0.75, 0.5, 0.25] for 4 blocks)"
            )
        names, sizes = flat.names, flat.numels
        self._exit_masks = [exit_mask(module, names, sizes, i) for i in range(1, blocks + 1)]
        return {level: depth_mask(module, names, sizes, d) for level, d in depths.items()}

    def sub_model(self, round_: int, client: int, level: float) -> tuple[Hashable, Callable[[], Tensor]]:
        """Every client of level r trains the same sub-model: the first ⌈r·D⌉ blocks and their exits."""
        return level, lambda: self._prefix[level]

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        plan = super().configure(round_, clients, global_params)
        if self.distill and self.distill_weight > 0:
            plan = plan.with_terms(ExitDistillation(weight=self.distill_weight))
        return plan

    def round_metrics(self) -> dict[str, float]:
        """The width methods' columns (each level scored as the ensemble of its exits), and
        ``test_accuracy_exit<i>``: each exit of the global model alone, its mean test accuracy over the seen
        clients."""
        metrics = super().round_metrics()
        if self._evaluated is not None:
            seen = self.ctx.engine.data.seen
            w = self._evaluated
            for i, mask in enumerate(self._exit_masks, start=1):
                scores = self.ctx.engine.scores(torch.where(mask, w, 0.0), "test")
                metrics[f"test_accuracy_exit{i}"] = float(scores.accuracy[seen].double().mean())
        return metrics
