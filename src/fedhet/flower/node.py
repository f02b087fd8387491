"""The node side: a node's own partition of the clients, and fedhet's engine answering the server's calls.

A node holds some of the run's clients (a contiguous block of the ids, or whatever its partition file lists). Its
data keeps the run's layout: every client id exists, and only the node's own clients have samples, so the engine
draws exactly the mini-batches the single-machine engine would (streams are keyed by client id).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import torch
import yaml
from torch import Tensor

from fedhet.data.dataset import ClientData, FederatedData
from fedhet.engine.plan import PHASES
from fedhet.errors import ConfigError, DataError
from fedhet.experiments.build import build_model, components, federated_data, make_engine
from fedhet.experiments.config import RunConfig, dump_yaml, parse_config
from fedhet.flower.codec import (
    Arrays,
    Config,
    Payload,
    decode_plan,
    encode_result,
    encode_scores,
    to_numpy,
    to_torch,
)
from fedhet.yaml_text import safe_yaml

PARTITION_FORMAT = "fedhet-node-partition/1"
Split = Literal["train", "test"]
STATEFUL = frozenset({"train", "personal_scores"})  # the calls that read the clients' state kept on the node


@dataclass(frozen=True)
class Stamp:
    """Which version of its clients' state a node holds: the training that wrote it last, by its `ClientStore`
    version (round × `PHASES` + phase; -1: none) and a token drawn for that training alone ("": no state)."""

    version: int
    token: str

    def describe(self) -> str:
        if self.version < 0:
            return "no client state"
        return f"the state of round {self.version // PHASES + 1}'s training (phase {self.version % PHASES})"


NO_STATE = Stamp(-1, "")
UNFINISHED = Stamp(-1, "unfinished")  # a training that raised may have written part of its state


class StaleStateError(DataError):
    """A node holds another version of its clients' state than the server's last training on it left."""


def config_text(config: RunConfig) -> str:
    """The config as it travels to the nodes (YAML)."""
    return dump_yaml(config.model_dump(mode="json"))


def config_from_text(text: str) -> RunConfig:
    """The config the server sent, validated (no Python objects, no key twice, no alias bomb: `safe_yaml`)."""
    try:
        raw = safe_yaml(text)
    except (yaml.YAMLError, RecursionError) as err:
        raise ConfigError(f"the server's config is not valid YAML ({' '.join(str(err).split())[:200]})") from None
    if not isinstance(raw, dict):
        raise ConfigError("the server's config is not a mapping of keys to values")
    return parse_config(raw)


def fingerprint(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def node_clients(num_clients: int, partition_id: int, num_partitions: int) -> Tensor:
    """The clients node `partition_id` of `num_partitions` holds: the ids cut into contiguous blocks."""
    if not 0 <= partition_id < num_partitions:
        raise DataError(f"partition-id {partition_id} is not in 0..{num_partitions - 1}")
    if num_partitions > num_clients:
        raise DataError(f"{num_partitions} nodes for {num_clients} clients: use at most one node per client")
    block = np.array_split(np.arange(num_clients), num_partitions)[partition_id]
    return torch.as_tensor(block, dtype=torch.long)


def _restrict_split(data: ClientData, clients: Tensor) -> ClientData:
    keep = set(clients.tolist())
    xs, ys = [], []
    for k in range(data.num_clients):
        x, y = data.client(k)
        xs.append(x if k in keep else x[:0])
        ys.append(y if k in keep else y[:0])
    return ClientData.from_parts(xs, ys)


def restrict(data: FederatedData, clients: Tensor) -> FederatedData:
    """`data` with only `clients`' samples; every other client keeps its id and has none."""
    return FederatedData(
        data.name,
        _restrict_split(data.train, clients),
        _restrict_split(data.test, clients),
        data.num_classes,
        data.seen.clone(),
        dict(data.info),
    )


def save_partition(path: Path, data: FederatedData, clients: Tensor) -> None:
    """Write the partition file a node loads (`load_partition`): its clients' samples only."""
    part = restrict(data, clients)
    payload = {
        "format": PARTITION_FORMAT,
        "name": part.name,
        "num_classes": part.num_classes,
        "clients": clients.clone(),
        "seen": part.seen,
        "train": {"x": part.train.x, "y": part.train.y, "offsets": part.train.offsets},
        "test": {"x": part.test.x, "y": part.test.y, "offsets": part.test.offsets},
        "info": part.info,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)


def load_partition(path: Path) -> tuple[FederatedData, Tensor]:
    """(data in the run's layout, the node's client ids) from a partition file (read weights-only; anything but a
    partition fedhet wrote is a one-line `DataError` naming the file)."""
    if not path.is_file():
        raise DataError(
            f"partition file '{path}' does not exist; write it with python -m fedhet.flower.partitions CONFIG NODES DIR"
        )
    try:
        raw: Any = torch.load(path, weights_only=True)
    except Exception as err:  # truncated, garbage, or holding Python objects
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        raise DataError(f"'{path}' is not a fedhet node partition ({reason})") from None
    if not isinstance(raw, dict) or raw.get("format") != PARTITION_FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise DataError(f"'{path}' is not a fedhet node partition (format {found!r})")

    def split(d: Any) -> ClientData:
        x, y, offsets = d["x"], d["y"], d["offsets"]
        if not all(isinstance(t, Tensor) for t in (x, y, offsets)) or offsets.ndim != 1 or len(offsets) < 1:
            raise ValueError("a split is not tensors x, y and offsets")
        if int(offsets[0]) != 0 or bool((offsets.diff() < 0).any()) or not int(offsets[-1]) == len(x) == len(y):
            raise ValueError("a split's offsets do not cut its samples")
        return ClientData(x, y, offsets)

    try:
        clients, seen, info = raw["clients"], raw["seen"], raw["info"]
        data = FederatedData(
            str(raw["name"]), split(raw["train"]), split(raw["test"]), int(raw["num_classes"]), seen, dict(info)
        )
        if not isinstance(clients, Tensor) or clients.dtype != torch.long or clients.ndim != 1:
            raise ValueError("its client ids are not a vector of integers")
        if len(clients) and (int(clients.min()) < 0 or int(clients.max()) >= data.num_clients):
            raise ValueError("its client ids are out of range")
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as err:
        reason = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        raise DataError(f"'{path}' is a damaged fedhet node partition ({reason})") from None
    return data, clients


_DATA: dict[str, FederatedData] = {}  # whole federations derived in this process, by config fingerprint


def derived_partition(
    config: RunConfig, text: str, partition_id: int, num_partitions: int
) -> tuple[FederatedData, Tensor]:
    """A node's partition derived from the config (simulation, or every node holding the same public dataset)."""
    key = fingerprint(text)
    if key not in _DATA:
        _DATA.clear()
        _DATA[key] = federated_data(config, components(config))
    data = _DATA[key]
    clients = node_clients(data.num_clients, partition_id, num_partitions)
    return restrict(data, clients), clients


class NodeWorker:
    """fedhet's engine on one node's partition, answering `RemoteEngine`'s calls (`handle`)."""

    def __init__(self, config: RunConfig, data: FederatedData, clients: Tensor) -> None:
        total = config.num_clients + config.unseen_clients
        if data.num_clients != total:
            raise DataError(
                f"this node's partition is laid out for {data.num_clients} clients but the run has {total}; "
                "rewrite the partition files for this config"
            )
        self.config, self.clients = config, clients.sort().values
        parts = components(config)  # imports the config's plugins on this node too
        self.engine = make_engine(
            config, parts, build_model(config, parts, data.input_shape, data.num_classes, data.task), data
        )
        self.engine.state_history = config.checkpoint_every  # the server may rewind to its last checkpoint
        self.stamp = NO_STATE  # the version of the clients' state the engine holds

    # -- the clients' state, versioned -------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The clients' state with its stamp (what a node saves after each training)."""
        return {"engine": self.engine.state_dict(), "version": self.stamp.version, "token": self.stamp.token}

    def load(self, state: dict[str, Any]) -> None:
        """Take `state` (`state`'s form) as the clients' state."""
        self.engine.load_state_dict(state.get("engine", state))  # (an older fedhet saved the engine's alone)
        self.stamp = Stamp(int(state.get("version", -1)), str(state.get("token", "")))

    def reset(self) -> None:
        """Forget every client's state (a node whose run keeps none)."""
        self.engine.load_state_dict({})
        self.stamp = NO_STATE

    def check_state(self, config: Config, clients: Tensor, when: str) -> None:
        """Make sure the engine holds the state the server's last training on this node left (`config`'s
        ``state_version`` and ``state_token``), before a call reads it. A node ahead of the server (a server resumed
        from its checkpoint) forgets what came after; a node behind it, or holding another version of it, raises
        `StaleStateError` naming a client and the round (`when`: "round 5", "the evaluation after round 5"; the
        server names the node): its answer would silently be another model's."""
        if "state_version" not in config:  # a server that keeps no stamps: every answer could be another state's
            raise ConfigError("the server sent no client state version: give it and every node the same fedhet version")
        expected = Stamp(int(config["state_version"]), str(config.get("state_token", "")))
        if self.stamp == expected:
            return
        if self.stamp.version > expected.version:
            self._rewind(expected)
            return
        if self.stamp == UNFINISHED:
            held = "what a training that failed left"
        elif self.stamp.version == expected.version:
            held = f"{self.stamp.describe()} by another training"
        else:
            held = self.stamp.describe()
        more = f" (and {len(clients) - 1} more)" if len(clients) > 1 else ""
        raise StaleStateError(
            f"the state of client {int(clients[0]) if len(clients) else '?'}{more} for {when} is "
            f"{'missing' if self.stamp == NO_STATE else 'stale'}: the server's last training on this node left "
            f"{expected.describe()}, the node holds {held}"
        )

    def _rewind(self, to: Stamp) -> None:
        """Keep the state versions up to `to`'s only (what a server resumed from its checkpoint has seen)."""
        state = self.engine.state_dict()
        rows = state.get("client_state", {})
        kept = {
            key: {k: [(r, v) for r, v in history if r <= to.version] for k, history in table.items()}
            for key, table in rows.items()
        }
        self.engine.load_state_dict({**state, "client_state": kept})
        self.stamp = to

    def meta(self) -> Payload:
        data, k = self.engine.data, self.clients
        arrays: Arrays = {
            "clients": to_numpy(k),
            "train_sizes": to_numpy(data.train.sizes[k]),
            "test_sizes": to_numpy(data.test.sizes[k]),
            "seen": to_numpy(data.seen[k]),
            "input_shape": np.asarray(data.input_shape, dtype=np.int64),
            "initial_params": to_numpy(self.engine.initial_params()[:16]),
            "label_counts": to_numpy(self.engine.label_counts()[k]),
        }
        arrays.update({f"info.{name}": to_numpy(tag[k]) for name, tag in data.info.items()})
        config: Config = {
            "name": data.name,
            "num_clients": data.num_clients,
            "num_classes": data.num_classes,
            "x_dtype": str(data.train.x.dtype).removeprefix("torch."),
        }
        return arrays, config

    def handle(self, op: str, arrays: Arrays, config: Config) -> Payload:
        """Run one engine call: `op` names it, `arrays`/`config` hold its arguments."""
        engine = self.engine
        split = cast(Split, config.get("split", "train"))
        params = to_torch(arrays["params"]) if "params" in arrays else None
        clients = to_torch(arrays["clients"]) if "clients" in arrays else None
        round_ = int(config.get("round", 0))
        if op == "meta":
            return self.meta()
        assert params is not None
        if op in STATEFUL:
            plan = decode_plan(arrays, config)
            evaluation = op == "personal_scores" and split == "test"  # after round `round_`, else in round_ + 1
            self.check_state(
                config, plan.clients, f"the evaluation after round {round_}" if evaluation else f"round {round_ + 1}"
            )
            if op == "personal_scores":
                return encode_scores(engine.personal_scores(params, plan, round_, split)), {}
            self.stamp = UNFINISHED
            result = engine.train(params, plan, round_)
            self.stamp = Stamp(round_ * PHASES + plan.phase, secrets.token_hex(8))
            return encode_result(result), {"state_version": self.stamp.version, "state_token": self.stamp.token}
        if op == "scores":  # the global model on both splits of every client here
            out: Arrays = {"clients": to_numpy(self.clients)}
            for name in ("test", "train"):
                scores = engine.scores(params, cast(Split, name))
                out[f"{name}.loss"] = to_numpy(scores.loss[self.clients])
                out[f"{name}.accuracy"] = to_numpy(scores.accuracy[self.clients])
            return out, {}
        assert clients is not None
        if op == "losses_at":
            return {"values": to_numpy(engine.losses_at(params, clients, split))}, {}
        if op == "own_scores":
            return encode_scores(engine.own_scores(params, clients, split)), {}
        if op == "gradient_statistics":
            mean, var = engine.gradient_statistics(params, clients, int(config["samples"]), round_)
            return {"mean": to_numpy(mean), "var": to_numpy(var)}, {}
        if op == "sampled_losses":
            values = engine.sampled_losses(params, clients, int(config["batch"]), round_, str(config["stream"]))
            return {"values": to_numpy(values)}, {}
        raise ValueError(f"unknown fedhet node call '{op}'")
