"""fedhet objects as plain arrays and scalars, the form Flower's records carry (no flwr import here).

A `Payload` is (arrays, config): NumPy arrays by name, and scalars/strings by name. Flower wraps them into an
``ArrayRecord`` and a ``ConfigRecord`` (`fedhet.flower.apps`); the in-process transport passes them as they are.

A plan's components (local terms, the client optimiser, a local rule) travel by registered name: their scalar
parameters as one JSON string each, their tensor fields as arrays; the node rebuilds them from its registries
(built-ins, and the plugins its config imports), so a user's own term runs on the nodes without this module
knowing it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedhet.engine.evaluate import ClientScores
from fedhet.engine.objective import TERMS
from fedhet.engine.optimizers import OPTIMIZERS
from fedhet.engine.personal import Personal
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.engine.privacy import ExampleDP, UpdateClip
from fedhet.engine.rules import RULES
from fedhet.registry import Component, Registry

Arrays = dict[str, np.ndarray]
Scalar = int | float | str | bool
Config = dict[str, Scalar]
Payload = tuple[Arrays, Config]

_DELTA = "state_delta."


def to_numpy(t: Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


def to_torch(a: np.ndarray) -> Tensor:
    return torch.from_numpy(np.array(a, copy=True))


def _encode_component(component: Component, key: str, arrays: Arrays, config: Config) -> None:
    """``config[key]`` = JSON of the name and scalar parameters; tensor fields as ``arrays["key.field"]``."""
    tensors = {k: v for k, v in component.__dict__.items() if isinstance(v, Tensor)}
    config[key] = json.dumps({"name": component.name, **component.model_dump(mode="json", exclude=set(tensors))})
    arrays.update({f"{key}.{field}": to_numpy(value) for field, value in tensors.items()})


def _decode_component(registry: Registry[Any], key: str, arrays: Arrays, config: Config) -> Any:
    spec: dict[str, Any] = json.loads(str(config[key]))
    prefix = f"{key}."
    spec.update({name[len(prefix) :]: to_torch(a) for name, a in arrays.items() if name.startswith(prefix)})
    return registry.build(spec, where=key)


def encode_plan(plan: LocalPlan, rows: Tensor | slice = slice(None)) -> Payload:
    """The plan's instructions for the clients in `rows` (indices into ``plan.clients``)."""
    arrays: Arrays = {
        "clients": to_numpy(plan.clients[rows]),
        "steps": to_numpy(plan.steps[rows]),
        "lr": to_numpy(plan.lr[rows]),
    }
    config: Config = {"batch_size": plan.batch_size, "stream": plan.stream, "terms": len(plan.terms)}
    if plan.personal is not None:
        config["personal"] = json.dumps(dataclasses.asdict(plan.personal))
    if plan.frozen:
        config["frozen"] = json.dumps(list(plan.frozen))
    if plan.phase:
        config["phase"] = plan.phase
    if plan.starts is not None:
        arrays["starts"] = to_numpy(plan.starts[rows])
    if plan.masks is not None:
        arrays["masks"] = to_numpy(plan.masks[rows])
    if plan.scales is not None:
        arrays["scales"] = to_numpy(plan.scales[rows])
    if plan.step_masks is not None and plan.step_index is not None:
        arrays["step_masks"] = to_numpy(plan.step_masks)  # a few (P,) masks, shared by the rows
        arrays["step_index"] = to_numpy(plan.step_index[rows])
    if plan.clip is not None:
        config["clip"] = json.dumps(dataclasses.asdict(plan.clip))
    if plan.dp_sgd is not None:
        config["dp_sgd"] = json.dumps(dataclasses.asdict(plan.dp_sgd))
    for i, term in enumerate(plan.terms):
        _encode_component(term, f"term{i}", arrays, config)
    _encode_component(plan.optimizer, "optimizer", arrays, config)
    if plan.rule is not None:
        _encode_component(plan.rule, "rule", arrays, config)
    return arrays, config


def decode_plan(arrays: Arrays, config: Config) -> LocalPlan:
    terms = tuple(_decode_component(TERMS, f"term{i}", arrays, config) for i in range(int(config["terms"])))
    return LocalPlan(
        clients=to_torch(arrays["clients"]),
        steps=to_torch(arrays["steps"]),
        lr=to_torch(arrays["lr"]),
        batch_size=int(config["batch_size"]),
        terms=terms,
        optimizer=_decode_component(OPTIMIZERS, "optimizer", arrays, config),
        rule=_decode_component(RULES, "rule", arrays, config) if "rule" in config else None,
        stream=str(config["stream"]),
        personal=_decode_personal(str(config["personal"])) if "personal" in config else None,
        frozen=tuple(str(name) for name in json.loads(str(config.get("frozen", "[]")))),
        phase=int(config.get("phase", 0)),
        starts=to_torch(arrays["starts"]) if "starts" in arrays else None,
        masks=to_torch(arrays["masks"]).bool() if "masks" in arrays else None,
        scales=to_torch(arrays["scales"]) if "scales" in arrays else None,
        step_masks=to_torch(arrays["step_masks"]).bool() if "step_masks" in arrays else None,
        step_index=to_torch(arrays["step_index"]).long() if "step_index" in arrays else None,
        clip=UpdateClip(**_fields(str(config["clip"]), UpdateClip)) if "clip" in config else None,
        dp_sgd=ExampleDP(**_fields(str(config["dp_sgd"]), ExampleDP)) if "dp_sgd" in config else None,
    )


def _fields(text: str, cls: type) -> dict[str, Any]:
    """The fields of a dataclass `cls` from their JSON (a mapping of its own field names only)."""
    fields = json.loads(text)
    if not isinstance(fields, dict) or not set(fields) <= {f.name for f in dataclasses.fields(cls)}:
        raise ValueError(f"a plan's {cls.__name__} is not one")
    return fields


def _decode_personal(text: str) -> Personal:
    """A `Personal` spec from its JSON (its fields only; the tuple of parts back from a list)."""
    fields = json.loads(text)
    if not isinstance(fields, dict) or not set(fields) <= {f.name for f in dataclasses.fields(Personal)}:
        raise ValueError("a plan's personal part is not a personal-model spec")
    return Personal(**{**fields, "parts": tuple(str(p) for p in fields.get("parts", ("*",)))})


def encode_result(result: LocalResult) -> Arrays:
    arrays = {
        "clients": to_numpy(result.clients),
        "params": to_numpy(result.params),
        "train_loss": to_numpy(result.train_loss),
        "steps": to_numpy(result.steps),
        "lr": to_numpy(result.lr),
    }
    arrays.update({_DELTA + key: to_numpy(value) for key, value in result.state_delta.items()})
    if result.clipped is not None:
        arrays["clipped"] = to_numpy(result.clipped)
    return arrays


def decode_result(arrays: Arrays) -> LocalResult:
    """A node's training reply; without ``params`` (Flower's SecAgg+ keeps the models on the nodes,
    `fedhet.flower.secagg.withhold_models`) the result holds no models: ``params`` of shape (m, 0)."""
    deltas = {key[len(_DELTA) :]: to_torch(a) for key, a in arrays.items() if key.startswith(_DELTA)}
    clients = to_torch(arrays["clients"])
    return LocalResult(
        clients,
        to_torch(arrays["params"]) if "params" in arrays else torch.zeros(len(clients), 0),
        to_torch(arrays["train_loss"]),
        to_torch(arrays["steps"]),
        to_torch(arrays["lr"]),
        state_delta=deltas,
        clipped=to_torch(arrays["clipped"]) if "clipped" in arrays else None,
    )


def concat_results(parts: list[LocalResult], order: Tensor) -> LocalResult:
    """One result from the nodes' parts, rows in the order of `order` (the plan's clients that answered)."""
    joined: dict[str, Any] = {
        f.name: torch.cat([getattr(p, f.name) for p in parts])
        for f in dataclasses.fields(LocalResult)
        if isinstance(getattr(parts[0], f.name), Tensor)
    }
    joined["state_delta"] = {key: torch.cat([p.state_delta[key] for p in parts]) for key in parts[0].state_delta}
    result = LocalResult(**joined)
    position = {int(k): i for i, k in enumerate(result.clients.tolist())}
    wanted = [position[int(k)] for k in order.tolist() if int(k) in position]
    return result.rows(torch.as_tensor(wanted, dtype=torch.long))


def encode_scores(scores: ClientScores) -> Arrays:
    return {"loss": to_numpy(scores.loss), "accuracy": to_numpy(scores.accuracy), "count": to_numpy(scores.count)}


def decode_scores(arrays: Arrays) -> ClientScores:
    return ClientScores(to_torch(arrays["loss"]), to_torch(arrays["accuracy"]), to_torch(arrays["count"]))
