"""FedDF (Lin, Kong, Stich, Jaggi, NeurIPS 2020, Algorithm 3): ensemble distillation on the server, for clients of
different architectures.

The server keeps one global model per architecture (``model: architectures``: its member of the global vector).
Each selected client trains its architecture's global model on its data and sends it back. The server then, for
each architecture a that some client of the round trained:

1. averages the models of a's clients, weighted by their samples (FedAvg within the architecture): the student;
2. distils into the student the ensemble of *every* model received (all architectures): ``distill_steps`` steps of
   Adam (learning rate ``distill_lr``) on mini-batches of ``distill_batch`` unlabelled proxy samples x of

       KL( σ(t(x)/T) ‖ σ(s(x)/T) ),     t(x) = (1/m) Σ_k F_k(x)   (the mean logits of the m received models)

   with temperature T (``temperature``).

An architecture no client of the round trained keeps its global model. The proxy set is the training data of the
held-out clients (``unseen_clients``), whose labels are never read: data the server holds and no client trains on.
The paper stops the distillation early on a validation set; here the number of steps is fixed. Each client is
scored with its architecture's global model (``test_accuracy``, ``test_accuracy_arch<a>``).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalResult
from fedhet.errors import ConfigError
from fedhet.seeding import numpy_rng
from fedhet.strategies.base import STRATEGIES, ServerContext
from fedhet.strategies.fedproto import NoServerStep, architecture_engine


def ensemble_logits(models: list[tuple[FlatModel, Tensor]], x: Tensor) -> Tensor:
    """t(x) = the mean of the models' logits (N, C) on `x` (each a member's network and its parameters)."""
    with torch.no_grad():
        return torch.stack([model.logits(params, x) for model, params in models]).mean(0)


def distill(
    model: FlatModel,
    student: Tensor,
    x: Tensor,
    teacher: Tensor,
    steps: int,
    lr: float,
    batch: int,
    temperature: float,
    order: Tensor,
) -> Tensor:
    """`student` (P,) after `steps` Adam steps on KL(σ(teacher/T) ‖ σ(model(x)/T)), averaged over mini-batches of
    `batch` rows of `x` taken in `order` (a permutation of the rows, cycled)."""
    w = student.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([w], lr=lr)
    target = F.log_softmax(teacher / temperature, dim=-1)
    n = len(x)
    for step in range(steps if n else 0):
        rows = order[(torch.arange(batch) + step * batch) % n]
        out = F.log_softmax(model.logits(w, x[rows]) / temperature, dim=-1)
        loss = F.kl_div(out, target[rows], log_target=True, reduction="batchmean")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return w.detach()


@STRATEGIES.register
class FedDF(NoServerStep):
    """A global model per architecture: FedAvg within each, then distillation of every client's model into it."""

    name: ClassVar[str] = "feddf"
    description: ClassVar[str] = (
        "FedDF: a global model per architecture, distilled on the server from all clients' models (Lin et al. 2020)"
    )
    architectures: ClassVar[bool] = True
    distill_steps: int = Field(100, ge=0, le=100_000, description="the server's distillation steps per architecture")
    distill_lr: float = Field(1e-3, gt=0, description="Adam's learning rate for the distillation")
    distill_batch: int = Field(64, ge=1, le=100_000, description="proxy samples per distillation step")
    temperature: float = Field(1.0, gt=0, description="T: the softmax temperature of the distillation")

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        architecture_engine(ctx, self.name)
        if self.distill_steps and not bool((~ctx.engine.data.seen).any()):
            raise ConfigError(
                "algorithm feddf distils on a proxy set, the training data of held-out clients: set unseen_clients "
                "(e.g. unseen_clients: 4), or algorithm.distill_steps=0"
            )

    def proxy(self) -> Tensor:
        """The unlabelled proxy samples: the training inputs of the held-out clients."""
        data = self.ctx.engine.data
        return data.train.x[~data.seen[data.train.owner]]

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        engine = architecture_engine(self.ctx, self.name)
        members = engine.members[result.clients]
        weights = self.ctx.train_sizes[result.clients].float()
        received = [
            (engine.parts[int(a)].model, row[engine.blocks[int(a)]])
            for a, row in zip(members.tolist(), result.params, strict=True)
        ]
        x = self.proxy()
        teacher = ensemble_logits(received, x) if len(received) and self.distill_steps else None
        out = global_params.clone()
        for a in torch.unique(members).tolist():
            block, mine = engine.blocks[a], members == a
            student = (weights[mine] / weights[mine].sum()) @ result.params[mine][:, block]
            if teacher is not None:
                order = torch.as_tensor(numpy_rng(self.ctx.seed, "feddf", round_, a).permutation(len(x)))
                student = distill(
                    engine.parts[a].model,
                    student,
                    x,
                    teacher,
                    self.distill_steps,
                    self.distill_lr,
                    self.distill_batch,
                    self.temperature,
                    order,
                )
            out[block] = student
        return out
