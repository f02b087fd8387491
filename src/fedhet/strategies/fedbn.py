"""FedBN (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021, Algorithm 1): FedAvg with local batch normalisation.

Each client keeps its own batch-norm layers, their affine parameters (γ, β) and their running statistics (mean,
variance, batches tracked), and the server averages every other parameter as FedAvg does (the paper's eq. for
w^{t+1}: the average over the non-BN layers only). The BN layers are a personal part of the model
(`fedhet.engine.personal`): a client's first BN layers are the model's initial ones; a client's personal model is
the global model's shared layers with its own BN layers (``personal_eval``). On a model without batch norm FedBN is
FedAvg.

`check_statistics` settles a run's batch-norm statistics policy (``model.batch_norm``, docs/batchnorm.md) against
its algorithm before anything runs.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import ClassVar

from torch import Tensor, nn

from fedhet.engine.functional import FlatModel
from fedhet.engine.personal import Personal
from fedhet.engine.plan import LocalPlan
from fedhet.errors import ConfigError, FedhetNote
from fedhet.models.base import ModelSpec, Statistics
from fedhet.strategies.base import STRATEGIES, Strategy
from fedhet.strategies.fedavg import FedAvg
from fedhet.strategies.server import ServerSGD


def norm_names(model: FlatModel) -> list[str]:
    """The model's batch-norm entries: the affine parameters and running statistics of its BatchNorm (and
    InstanceNorm) layers, in the model's order."""
    norm = nn.modules.batchnorm._NormBase
    owners = {name for name, m in model.module.named_modules() if isinstance(m, norm)}
    return [n for n in model.names if n.rpartition(".")[0] in owners]


@STRATEGIES.register
class FedBN(FedAvg):
    """FedAvg on every layer but batch norm; each client keeps its own BN layers (parameters and statistics)."""

    name: ClassVar[str] = "fedbn"
    description: ClassVar[str] = "FedBN: FedAvg with each client's batch-norm layers kept local (Li et al. 2021)"

    @property
    def spec(self) -> Personal | None:
        """The BN layers as the clients' personal part (None: the model has none, and FedBN is FedAvg)."""
        names = norm_names(self.ctx.engine.model)
        return Personal(self.name, tuple(names)) if names else None

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        return replace(super().configure(round_, clients, global_params), personal=self.spec)

    def personalization(self, clients: Tensor) -> LocalPlan | None:
        spec = self.spec
        if spec is None:
            return None
        return LocalPlan.uniform(clients, 0, self.ctx.local.lr, self.ctx.local.batch_size, personal=spec)


def check_statistics(
    spec: ModelSpec, strategy: Strategy, model: FlatModel, private: bool, native: bool = True
) -> Statistics:
    """The run's batch-norm statistics policy: ``model.batch_norm``, else the algorithm's (fedbn: ``local``; the
    sub-model methods heterofl, fedrolex, fjord: ``recompute``, HeteroFL's static batch norm, each level scored with
    statistics worked out at that level; others: ``aggregate``), set on `model`; a one-line `ConfigError` for a
    combination that cannot hold (before anything is written). `private`: the run asks for differential privacy;
    `native`: the engine is fedhet's own (not Flower's nodes)."""
    declared: Statistics | None = getattr(spec, "batch_norm", None)
    parts = strategy.parts()
    fedbn = any(isinstance(part, FedBN) for part in parts)
    if fedbn and declared not in (None, "local"):
        raise ConfigError(
            f"algorithm fedbn keeps each client's batch-norm layers local; model.batch_norm '{declared}' contradicts "
            "it (leave it out, or choose another algorithm)"
        )
    if declared == "local" and not fedbn:
        raise ConfigError(
            "model.batch_norm 'local' keeps each client's batch-norm layers (statistics and affine parameters) on "
            "the client: that is algorithm fedbn; use it, or batch_norm 'aggregate' or 'recompute'"
        )
    sliced = [part.name for part in parts if part.sub_models]
    policy: Statistics = declared or ("local" if fedbn else "recompute" if sliced and model.stat_names else "aggregate")
    model.statistics = policy
    if not model.stat_names:
        if declared is not None:
            raise ConfigError(
                f"model.batch_norm '{declared}' says what the server does with batch norm's running statistics, and "
                "this model keeps none (no BatchNorm, or norm: group); leave batch_norm out"
            )
        if fedbn:
            warnings.warn(
                "algorithm fedbn keeps each client's batch-norm layers local, and this model has none: the run is "
                "FedAvg (use a model with BatchNorm, e.g. resnet8)",
                FedhetNote,
                stacklevel=2,
            )
        return policy
    if private:
        raise ConfigError(
            "differential privacy cannot protect batch norm's running statistics (they are sums over samples, "
            "neither clipped nor noised): use a model with GroupNorm (e.g. resnet18 with norm: group)"
        )
    if sliced and policy == "aggregate":
        raise ConfigError(
            f"algorithm '{sliced[0]}' trains sub-models of different widths, whose running statistics differ: their "
            "average would score every level with a mixture of other widths' statistics; use model.batch_norm: "
            "recompute (HeteroFL's static batch norm, the default)"
        )
    if sliced and not native:
        raise ConfigError(
            f"algorithm '{sliced[0]}' on a model with batch norm scores each level with statistics worked out from "
            "every client's training data (model.batch_norm: recompute), which Flower's nodes hold apart: use a "
            "model without batch norm, or the native engine"
        )
    if policy == "recompute" and not native:
        raise ConfigError(
            "model.batch_norm 'recompute' works the statistics out from every client's training data, which Flower's "
            "nodes hold apart: use batch_norm 'aggregate' or algorithm fedbn"
        )
    if policy == "aggregate":
        for part in parts:
            opt = part.server_optimizer
            averaging = type(opt) is ServerSGD and opt.weight_decay == 0 and part.server_lr <= 1.0
            if not averaging:
                raise ConfigError(
                    f"model.batch_norm 'aggregate' averages the running statistics through the server step, and "
                    f"algorithm '{part.name}' steps with server_optimizer '{opt.name}', server_lr {part.server_lr:g}"
                    f", which would not average them: use server_optimizer sgd with server_lr <= 1, "
                    "or model.batch_norm: recompute"
                )
    return policy
