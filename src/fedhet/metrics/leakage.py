"""Leakage as evaluation: privacy attacks run on the run's models (`fedhet.attacks.membership`,
`fedhet.attacks.inversion`).

- ``mia``: membership inference at each evaluated round. Members: up to `samples` training samples of the seen
  clients; non-members: up to `samples` of their test samples (drawn once from the seed). On the global model
  (``target: global``, the default): ``mia_auc``/``mia_tpr_at_1fpr``, the loss-threshold attack (Yeom et al. 2018),
  and ``mia_calibrated_*``, difficulty calibration (Watson et al. 2022) with the run's initial model as the
  shadow-free reference, ℓ(w_0) − ℓ(w_t). On the personalised models (``target: personal`` or ``both``), each
  sample scored by its owner's model (Ditto's, FedRep's head on the shared body, local-only's, IFCA's cluster
  model): ``mia_personal_auc``/``_tpr_at_1fpr``, and ``mia_personal_calibrated_*`` with the same round's global
  model as the reference, ℓ(w_t) − ℓ(v_k): what a client's own model reveals beyond the shared one. Only the
  evaluated clients' samples count (with ``eval_clients``, the round's sample).
- ``dlg``: gradient inversion of one client's gradient on `batch` of its training samples at the global model
  that starts round `round` (the first evaluated round from `round` on), optionally clipped and noised as
  DP-FedAvg would (`clip`, `noise_multiplier`). Writes ``dlg_psnr``, ``dlg_ssim``, ``dlg_label_accuracy`` on that
  round and saves ``dlg_truth_<i>.png`` and ``dlg_reconstruction_<i>.png`` in the folder fedhet gives plugins.

Both need the clients' samples in this process (not a Flower run's remote engine): there they write NaN.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr, model_validator
from torch import Tensor

from fedhet.attacks import inversion, membership
from fedhet.data.dataset import ClientData
from fedhet.engine.plan import LocalPlan
from fedhet.engine.protocol import EngineProtocol
from fedhet.errors import ConfigError
from fedhet.metrics.base import METRIC_PLUGINS, Metric, RoundView
from fedhet.models.zoo import image_shape
from fedhet.seeding import torch_gen

__all__ = ["DeepLeakage", "MembershipInference"]


def _sample(part: ClientData, clients: Tensor, count: int, gen: torch.Generator) -> Tensor:
    """Indices of up to `count` samples of `clients`, drawn without replacement."""
    rows = torch.nonzero(torch.isin(part.owner, clients)).flatten()
    return rows[torch.randperm(len(rows), generator=gen)[:count]].sort().values


def sample_losses(engine: EngineProtocol, params: Tensor, x: Tensor, y: Tensor, chunk: int = 1024) -> Tensor:
    """Per-sample losses of `params` on (x, y), in chunks."""
    with torch.no_grad():
        steps = range(0, len(x), chunk)
        parts = [engine.model.sample_losses(params, x[i : i + chunk], y[i : i + chunk]) for i in steps]
    return torch.cat(parts) if parts else torch.zeros(0)


PERSONAL_BLOCK = 64  # personalised models built at a time for the personal attack: (64, P) floats


def personal_losses(
    engine: EngineProtocol, params: Tensor, plan: LocalPlan, round_: int, part: ClientData, rows: Tensor
) -> Tensor | None:
    """Per-sample losses of `part`'s samples `rows`, each under its owner's personalised model as `plan` makes it
    from the global model `params` (NaN where the owner is not one of the plan's clients), or None where those
    models are not at hand here (made by training: ``personal_eval.finetune_steps``; a remote engine's nodes)."""
    if bool((plan.steps > 0).any()):
        return None
    losses = torch.full((len(rows),), math.nan)
    owner = part.owner[rows]
    present = torch.nonzero(torch.isin(plan.clients, owner)).flatten()
    for block in torch.split(present, PERSONAL_BLOCK):
        some = plan.rows(block)
        if some.personal is not None:
            models = engine.personal_starts(params, some, round_)
        else:  # IFCA's cluster models, or the global model itself
            models = some.starts if some.starts is not None else params.expand(len(some.clients), -1)
        if models is None:
            return None
        for model, client in zip(models, some.clients.tolist(), strict=True):
            mine = torch.nonzero(owner == client).flatten()
            losses[mine] = sample_losses(engine, model, part.x[rows[mine]], part.y[rows[mine]])
    return losses


GLOBAL_COLUMNS = ("mia_auc", "mia_tpr_at_1fpr", "mia_calibrated_auc", "mia_calibrated_tpr_at_1fpr")
PERSONAL_COLUMNS = tuple(c.replace("mia_", "mia_personal_", 1) for c in GLOBAL_COLUMNS)


def _attack(member: Tensor, nonmember: Tensor, ref: tuple[Tensor, Tensor], names: tuple[str, ...]) -> dict[str, float]:
    """The loss-threshold attack and the one calibrated by the reference losses `ref`, as columns `names`."""
    auc, tpr = membership.evaluate(membership.attack_scores(member), membership.attack_scores(nonmember))
    cal_auc, cal_tpr = membership.evaluate(
        membership.attack_scores(member, ref[0]), membership.attack_scores(nonmember, ref[1])
    )
    return dict(zip(names, (auc, tpr, cal_auc, cal_tpr), strict=True))


@METRIC_PLUGINS.register
class MembershipInference(Metric):
    """Loss-threshold and calibrated membership inference on the global and/or the personalised models (attack
    AUC, TPR at 1% FPR)."""

    name: ClassVar[str] = "mia"
    description: ClassVar[str] = "membership inference on the global or personal models: attack AUC, TPR at 1% FPR"
    samples: int = Field(1000, ge=1, description="members and non-members drawn (each) from the seen clients")
    target: Literal["global", "personal", "both"] = Field(
        "global", description="attack the global model, each client's personalised model (its own samples), or both"
    )
    needs_all_clients: ClassVar[bool] = False

    _members: Tensor = PrivateAttr(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    _nonmembers: Tensor = PrivateAttr(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    _reference: tuple[Tensor, Tensor] | None = PrivateAttr(None)

    def columns(self) -> tuple[str, ...]:
        return {"global": GLOBAL_COLUMNS, "personal": PERSONAL_COLUMNS, "both": GLOBAL_COLUMNS + PERSONAL_COLUMNS}[
            self.target
        ]

    def needs_personal_models(self) -> bool:
        return self.target != "global"

    def setup(self, engine: EngineProtocol, seed: int) -> None:
        super().setup(engine, seed)
        data, seen = engine.data, engine.data.seen_ids
        self._members = _sample(data.train, seen, self.samples, torch_gen(seed, "mia-members"))
        self._nonmembers = _sample(data.test, seen, self.samples, torch_gen(seed, "mia-nonmembers"))
        self._reference = None

    def _losses(self, engine: EngineProtocol, params: Tensor) -> tuple[Tensor, Tensor]:
        train, test = engine.data.train, engine.data.test
        return (
            sample_losses(engine, params, train.x[self._members], train.y[self._members]),
            sample_losses(engine, params, test.x[self._nonmembers], test.y[self._nonmembers]),
        )

    def compute(self, view: RoundView) -> tuple[dict[str, float], dict[str, Tensor]]:
        data = view.engine.data
        if len(data.train.x) == 0 or len(data.test.x) == 0:  # a remote engine holds no samples
            return dict.fromkeys(self.columns(), math.nan), {}
        member, nonmember = self._losses(view.engine, view.params)
        row: dict[str, float] = {}
        if self.target != "personal":
            if self._reference is None:
                self._reference = self._losses(view.engine, view.engine.initial_params())
            row.update(_attack(member, nonmember, self._reference, GLOBAL_COLUMNS))
        if self.target != "global":
            row.update(self._personal(view, member, nonmember))
        return row, {}

    def _personal(self, view: RoundView, member: Tensor, nonmember: Tensor) -> dict[str, float]:
        """The attacks on each evaluated client's personalised model, calibrated by the global model's losses."""
        plan, data = view.personal, view.engine.data
        if plan is None:
            return dict.fromkeys(PERSONAL_COLUMNS, math.nan)
        own_m = personal_losses(view.engine, view.params, plan, view.round, data.train, self._members)
        own_n = personal_losses(view.engine, view.params, plan, view.round, data.test, self._nonmembers)
        if own_m is None or own_n is None:
            return dict.fromkeys(PERSONAL_COLUMNS, math.nan)
        in_m = torch.isin(data.train.owner[self._members], plan.clients)
        in_n = torch.isin(data.test.owner[self._nonmembers], plan.clients)
        return _attack(own_m[in_m], own_n[in_n], (member[in_m], nonmember[in_n]), PERSONAL_COLUMNS)


@METRIC_PLUGINS.register
class DeepLeakage(Metric):
    """Gradient inversion (DLG, iDLG, Geiping et al.) of one client's gradient; PSNR/SSIM and PNGs."""

    name: ClassVar[str] = "dlg"
    description: ClassVar[str] = "gradient inversion of one client's gradient at a round: PSNR, SSIM, images"
    round: int = Field(1, ge=1, description="attack the global model that starts this round (or the next evaluated)")
    client: int = Field(0, ge=0, description="the attacked client's id")
    batch: int = Field(1, ge=1, le=64, description="the client's first `batch` training samples make the gradient")
    method: inversion.Method = Field(
        "dlg", description="dlg (L-BFGS, soft label), idlg (label from the output layer), geiping (cosine + TV, Adam)"
    )
    iterations: int = Field(300, ge=1, description="L-BFGS iterations (dlg, idlg) or Adam steps (geiping)")
    tv_weight: float = Field(1e-2, ge=0, description="weight of the total-variation prior (geiping)")
    clip: float | None = Field(None, gt=0, description="clip the gradient to this L2 norm (DP-FedAvg's C)")
    noise_multiplier: float = Field(0.0, ge=0, description="add N(0, (z·clip)²) noise (needs clip)")
    needs_all_clients: ClassVar[bool] = False

    _done: bool = PrivateAttr(False)
    _images: tuple[Tensor, Tensor] | None = PrivateAttr(None)
    _shape: tuple[int, int, int] = PrivateAttr((1, 1, 1))

    @model_validator(mode="after")
    def _noise_needs_clip(self) -> DeepLeakage:
        if self.noise_multiplier > 0 and self.clip is None:
            raise ValueError("noise_multiplier needs clip (the noise's scale is z·clip)")
        return self

    def columns(self) -> tuple[str, ...]:
        return ("dlg_psnr", "dlg_ssim", "dlg_label_accuracy")

    def setup(self, engine: EngineProtocol, seed: int) -> None:
        super().setup(engine, seed)
        if self.client >= engine.data.num_clients:
            last = engine.data.num_clients - 1
            raise ConfigError(f"metrics 'dlg': client {self.client} is not a client id (0..{last})")
        try:
            self._shape = image_shape(engine.data.input_shape, "dlg")
        except ConfigError:
            raise ConfigError(
                f"metrics 'dlg' attacks images (C, H, W), (H, W) or flat square ones; this dataset's samples have "
                f"shape {engine.data.input_shape}"
            ) from None
        self._done, self._images = False, None

    def compute(self, view: RoundView) -> tuple[dict[str, float], dict[str, Tensor]]:
        if self._done or view.round < self.round:
            return {}, {}
        self._done = True
        engine, data = view.engine, view.engine.data
        x, y = data.train.client(self.client)
        x, y = x[: self.batch], y[: self.batch]
        if len(x) == 0:  # a remote engine, or a client without training samples
            return dict.fromkeys(self.columns(), math.nan), {}
        seed = self._seed or 0
        grad = inversion.true_gradient(engine.model, view.previous, x, y, data.num_classes)
        if self.clip is not None:
            grad = inversion.privatize(grad, self.clip, self.noise_multiplier, seed)
        found = inversion.invert(
            engine.model,
            view.previous,
            grad,
            data.input_shape,
            data.num_classes,
            batch=len(x),
            method=self.method,
            iterations=self.iterations,
            seed=seed,
            tv_weight=self.tv_weight,
            image=self._shape,
        )
        guess = inversion.match_order(x, found.x)
        self._images = (x, guess)
        images = (-1, *self._shape)
        return {
            "dlg_psnr": inversion.psnr(x, guess),
            "dlg_ssim": inversion.ssim(x.reshape(images), guess.reshape(images)),
            "dlg_label_accuracy": inversion.label_accuracy(y, found.y),
        }, {}

    def save(self, out: Path) -> None:
        if self._images is not None:
            truth, guess = self._images
            inversion.save_images(out, "dlg_truth", truth, self._shape)
            inversion.save_images(out, "dlg_reconstruction", guess, self._shape)

    def state_dict(self) -> dict[str, object]:
        return {"done": self._done}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self._done = bool(state["done"])
