"""MaxFL's client-centric metrics (§5): GM-appeal, preferred-model accuracy, and both after fine-tuning."""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor

from fedhet.engine.evaluate import ClientScores
from fedhet.engine.plan import LocalPlan
from fedhet.engine.protocol import EngineProtocol
from fedhet.metrics.base import METRIC_PLUGINS, Metric, RoundView
from fedhet.requirements import UsesRequirements


def gm_appeal(losses: Tensor, rho: Tensor) -> float:
    """GM-Appeal (MaxFL eq. 1): the share of clients with loss strictly below their requirement."""
    return float((losses < rho).double().mean()) if len(losses) else float("nan")


def preferred_accuracy(global_acc: Tensor, local_acc: Tensor, appealing: Tensor) -> float:
    """Preferred-model accuracy: the global model's accuracy where it appeals, else the local model's."""
    return float(torch.where(appealing, global_acc, local_acc).double().mean()) if len(global_acc) else float("nan")


def _group_metrics(
    prefix: str, ids: Tensor, test: ClientScores, train: ClientScores, rho: Tensor, local_acc: Tensor | None
) -> dict[str, float]:
    out = {
        f"{prefix}gm_appeal": gm_appeal(test.loss[ids], rho[ids]),
        f"{prefix}gm_appeal_train": gm_appeal(train.loss[ids], rho[ids]),
    }
    if local_acc is not None:
        appealing = test.loss[ids] < rho[ids]
        out[f"{prefix}preferred_accuracy"] = preferred_accuracy(test.accuracy[ids], local_acc[ids], appealing)
    return out


def finetuned_scores(
    engine: EngineProtocol, params: Tensor, steps: int, lr: float, batch_size: int, round_: int
) -> tuple[ClientScores, ClientScores]:
    """Every client tunes the global model for `steps` local SGD steps; its own tuned model's test and train
    scores (MaxFL Table 3: 5 steps)."""
    clients = torch.arange(engine.data.num_clients)
    plan = LocalPlan.uniform(clients, steps, lr, batch_size, stream="finetune")
    tuned = engine.train(params, plan, round_).params
    return engine.own_scores(tuned, clients, "test"), engine.own_scores(tuned, clients, "train")


@METRIC_PLUGINS.register
class Appeal(Metric, UsesRequirements):
    """GM-appeal (strict ``loss < ρ``) on test and on train loss, preferred-model accuracy, for seen and unseen
    clients, and the same after ``finetune_steps`` local steps (``ft_`` prefix; 0 disables)."""

    name: ClassVar[str] = "appeal"
    description: ClassVar[str] = "GM-appeal and preferred-model accuracy, seen/unseen, with and without tuning"
    finetune_steps: int = Field(5, ge=0)
    finetune_every: Literal["final", "every"] = "final"

    def columns(self) -> tuple[str, ...]:
        plain = [
            f"{group}{m}" for group in ("", "unseen_") for m in ("gm_appeal", "gm_appeal_train", "preferred_accuracy")
        ]
        tuned = [f"ft_{c}" for c in (*plain, "test_accuracy", "unseen_test_accuracy")]
        return (*plain, *tuned)

    def client_columns(self) -> tuple[str, ...]:
        return ("rho", "appealing", "local_test_accuracy", "label_flipped")

    def compute(self, view: RoundView) -> tuple[dict[str, float], dict[str, Tensor]]:
        req = self.requirements.value
        data = view.engine.data
        groups = {"": data.seen_ids, "unseen_": data.unseen_ids}
        out: dict[str, float] = {}
        for prefix, ids in groups.items():
            if len(ids):
                out.update(_group_metrics(prefix, ids, view.test, view.train, req.rho, req.local_test_accuracy))
        if self.finetune_steps and (self.finetune_every == "every" or view.final):
            local = view.engine.local
            test, train = finetuned_scores(
                view.engine, view.params, self.finetune_steps, local.lr, local.batch_size, view.round
            )
            for prefix, ids in groups.items():
                if len(ids):
                    tuned = _group_metrics(prefix, ids, test, train, req.rho, req.local_test_accuracy)
                    out.update({f"ft_{k}": v for k, v in tuned.items()})
                    out[f"ft_{prefix}test_accuracy"] = float(test.accuracy[ids].double().mean())
        columns = {"rho": req.rho, "appealing": (view.test.loss < req.rho).int()}
        if req.local_test_accuracy is not None:
            columns["local_test_accuracy"] = req.local_test_accuracy
        if "corrupted" in data.info:
            columns["label_flipped"] = data.info["corrupted"].int()
        return out, columns
