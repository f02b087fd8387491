"""fedhet objects as plain arrays and scalars, the form Flower's records carry (no flwr import here).

A `Payload` is (arrays, config): NumPy arrays by name, and scalars/strings by name. Flower wraps them into an
``ArrayRecord`` and a ``ConfigRecord`` (`fedhet.flower.apps`); the in-process transport passes them as they are.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedhet.engine.evaluate import ClientScores
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.engine.rules import PerFedAvgRule, PFedMeRule
from fedhet.engine.state import STATE_RULES

Arrays = dict[str, np.ndarray]
Scalar = int | float | str | bool
Config = dict[str, Scalar]
Payload = tuple[Arrays, Config]

LOCAL_RULES: dict[str, type[Any]] = {"PerFedAvgRule": PerFedAvgRule, "PFedMeRule": PFedMeRule}
_PLAN_SCALARS = ("batch_size", "prox_mu", "weight_decay", "grad_stats_samples", "stream")
_RESULT_OPTIONAL = ("grad_mean", "grad_var", "state_delta")


def to_numpy(t: Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


def to_torch(a: np.ndarray) -> Tensor:
    return torch.from_numpy(np.array(a, copy=True))


def encode_plan(plan: LocalPlan, rows: Tensor | slice = slice(None)) -> Payload:
    """The plan's instructions for the clients in `rows` (indices into ``plan.clients``)."""
    arrays: Arrays = {
        "clients": to_numpy(plan.clients[rows]),
        "steps": to_numpy(plan.steps[rows]),
        "lr": to_numpy(plan.lr[rows]),
    }
    config: Config = {key: getattr(plan, key) for key in _PLAN_SCALARS}
    if plan.correction is not None:
        arrays["correction"] = to_numpy(plan.correction[rows])
    if plan.rule is not None:
        config["rule"] = type(plan.rule).__name__
        config.update({f"rule.{f.name}": getattr(plan.rule, f.name) for f in dataclasses.fields(plan.rule)})
    if plan.client_state is not None:
        config["client_state"] = type(plan.client_state).__name__
        arrays.update(
            {
                f"client_state.{f.name}": to_numpy(getattr(plan.client_state, f.name))
                for f in dataclasses.fields(plan.client_state)
            }
        )
    return arrays, config


def decode_plan(arrays: Arrays, config: Config) -> LocalPlan:
    rule = None
    if "rule" in config:
        cls = LOCAL_RULES[str(config["rule"])]
        rule = cls(**{f.name: config[f"rule.{f.name}"] for f in dataclasses.fields(cls)})
    state = None
    if "client_state" in config:
        kind = STATE_RULES[str(config["client_state"])]
        state = kind(**{f.name: to_torch(arrays[f"client_state.{f.name}"]) for f in dataclasses.fields(kind)})
    return LocalPlan(
        clients=to_torch(arrays["clients"]),
        steps=to_torch(arrays["steps"]),
        lr=to_torch(arrays["lr"]),
        batch_size=int(config["batch_size"]),
        prox_mu=float(config["prox_mu"]),
        weight_decay=float(config["weight_decay"]),
        correction=to_torch(arrays["correction"]) if "correction" in arrays else None,
        grad_stats_samples=int(config["grad_stats_samples"]),
        stream=str(config["stream"]),
        rule=rule,
        client_state=state,
    )


def encode_result(result: LocalResult) -> Arrays:
    arrays = {
        "clients": to_numpy(result.clients),
        "params": to_numpy(result.params),
        "train_loss": to_numpy(result.train_loss),
        "steps": to_numpy(result.steps),
        "lr": to_numpy(result.lr),
    }
    for key in _RESULT_OPTIONAL:
        value = getattr(result, key)
        if value is not None:
            arrays[key] = to_numpy(value)
    return arrays


def decode_result(arrays: Arrays) -> LocalResult:
    optional = {key: to_torch(arrays[key]) for key in _RESULT_OPTIONAL if key in arrays}
    return LocalResult(
        to_torch(arrays["clients"]),
        to_torch(arrays["params"]),
        to_torch(arrays["train_loss"]),
        to_torch(arrays["steps"]),
        to_torch(arrays["lr"]),
        **optional,
    )


def concat_results(parts: list[LocalResult], order: Tensor) -> LocalResult:
    """One result from the nodes' parts, rows in the order of `order` (the plan's clients that answered)."""
    fields = [f.name for f in dataclasses.fields(LocalResult)]
    joined: dict[str, Any] = {
        name: torch.cat([getattr(p, name) for p in parts]) if getattr(parts[0], name) is not None else None
        for name in fields
    }
    result = LocalResult(**joined)
    position = {int(k): i for i, k in enumerate(result.clients.tolist())}
    wanted = [position[int(k)] for k in order.tolist() if int(k) in position]
    return result.rows(torch.as_tensor(wanted, dtype=torch.long))


def encode_scores(scores: ClientScores) -> Arrays:
    return {"loss": to_numpy(scores.loss), "accuracy": to_numpy(scores.accuracy), "count": to_numpy(scores.count)}


def decode_scores(arrays: Arrays) -> ClientScores:
    return ClientScores(to_torch(arrays["loss"]), to_torch(arrays["accuracy"]), to_torch(arrays["count"]))
