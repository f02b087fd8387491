"""The server side: `RemoteEngine`, an engine whose calls are answered by the nodes that hold the data.

The strategy, availability process, metrics and round loop are fedhet's own (`fedhet.experiments.runner`); only
the engine differs. Each call is split by the node that holds each client, sent through a `Transport` (Flower's
Grid in `fedhet.flower.apps`, or direct calls in `InProcessTransport`), and the replies are put back in the
caller's order. A node that fails to answer in time, or answers with an error, is *lost*: its clients leave the
round (the runner goes on with the others), are unavailable from then on, and score NaN (left out of the metrics).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from pydantic import PrivateAttr
from torch import Tensor

from fedhet.availability.base import Availability
from fedhet.data.dataset import ClientData, FederatedData
from fedhet.engine.engine import BackendChoice, resolve_backend
from fedhet.engine.evaluate import ClientScores, scores_of_some
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.engine.protocol import EngineProtocol, Split
from fedhet.errors import ConfigError, DataError, FedhetError
from fedhet.experiments.build import Components, Experiment, assemble, build_model, components, local_settings
from fedhet.experiments.config import RunConfig
from fedhet.flower.codec import (
    Arrays,
    Config,
    Payload,
    concat_results,
    decode_result,
    decode_scores,
    encode_plan,
    to_numpy,
    to_torch,
)
from fedhet.flower.node import STATEFUL, NodeWorker, config_text

log = logging.getLogger("fedhet.flower")


class Transport(Protocol):
    """How the server reaches the nodes."""

    def nodes(self) -> list[int]:
        """Ids of the nodes connected now."""
        ...

    def ask(self, requests: dict[int, Payload], timeout: float) -> dict[int, Payload]:
        """Send each node its request; the replies of the nodes that answered in time and without error. A node
        that refuses (raises a `fedhet.errors.FedhetError`: a config it does not allow, a stale state) goes into the
        transport's ``refusals`` (node -> reason), with which `RemoteEngine` stops the run."""
        ...


class InProcessTransport:
    """Nodes as `NodeWorker`s in this process (tests, and a reference for the Flower transport)."""

    def __init__(self, workers: dict[int, NodeWorker]) -> None:
        self.workers = workers
        self.dead: set[int] = set()
        self.calls: list[str] = []
        self.refusals: dict[int, str] = {}  # as `fedhet.flower.apps.GridTransport`'s

    def nodes(self) -> list[int]:
        return sorted(set(self.workers) - self.dead)

    def ask(self, requests: dict[int, Payload], timeout: float) -> dict[int, Payload]:
        replies = {}
        for node, (arrays, config) in requests.items():
            self.calls.append(str(config["op"]))
            if node not in self.dead:
                try:
                    replies[node] = self.workers[node].handle(str(config["op"]), arrays, config)
                except FedhetError as err:
                    self.refusals[node] = str(err)
        return replies


@dataclass(frozen=True)
class Settings:
    """How the server talks to the nodes."""

    timeout: float = 120.0  # seconds a node has to answer one call before it is lost
    min_nodes: int = 1  # nodes to wait for before the run starts
    wait: float = 60.0  # seconds to wait for them
    run_key: str = ""  # names the nodes' saved client state (a resumed run finds it); where: each node's own choice


def _skeleton(sizes: Tensor, input_shape: tuple[int, ...], dtype: torch.dtype) -> ClientData:
    """A `ClientData` with the clients' sizes and no samples (the server never sees any)."""
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    return ClientData(torch.zeros((0, *input_shape), dtype=dtype), torch.zeros(0, dtype=torch.long), offsets)


class RemoteEngine:
    """`EngineProtocol`, answered by the nodes; the server holds the model and the clients' sizes only."""

    def __init__(self, config: RunConfig, parts: Components, transport: Transport, settings: Settings) -> None:
        task = parts.task.name if parts.task is not None else getattr(parts.dataset, "task", "auto")
        if config.val_fraction > 0 or task not in ("auto", "classification"):
            raise ConfigError(
                "--engine flower runs classification without a validation split (val_fraction 0) for now; run this "
                "config on the native engine"
            )
        self.transport, self.settings = transport, settings
        self.base: Config = {"fedhet_config": config_text(config), "run_key": settings.run_key}
        self.lost: dict[int, str] = {}  # node -> the call it failed
        self.last_backend: str | None = None  # the nodes choose theirs
        self._wait_for_nodes(settings)
        metas = self._describe_nodes(settings)
        self.node_ids = sorted(metas)  # Flower's node ids (64-bit); `owner` holds positions in this list
        data, owner, first = self._federation(config, metas)
        self.owner = owner  # (K,) position of the node holding each client
        model = build_model(config, parts, data.input_shape, data.num_classes, data.task)
        if not np.allclose(first, model.initial_params()[:16].numpy()):
            raise ConfigError("the nodes built a different initial model: give every node the same fedhet version")
        self.model, self.data, self.seed = model, data, config.seed
        # Flower's SecAgg+ aggregates the round's training on the nodes (`secure_mean`): they keep it
        self.keep_training = any(getattr(p, "protocol", None) == "flower" for p in parts.algorithm.parts())
        self.local = local_settings(config, parts)
        self.backend: BackendChoice = config.backend
        self._scored: tuple[Tensor, dict[str, tuple[Tensor, Tensor]]] | None = None
        # node -> (version, token) of the clients' state its last training left (`fedhet.flower.node.Stamp`)
        self.stamps: dict[int, tuple[int, str]] = {}

    # -- connection ------------------------------------------------------------------------------------------

    def _wait_for_nodes(self, settings: Settings) -> None:
        deadline = time.monotonic() + settings.wait
        while True:
            nodes = self.transport.nodes()
            if len(nodes) >= settings.min_nodes:
                return
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"only {len(nodes)} of {settings.min_nodes} nodes connected within {settings.wait:g} s; "
                    "start the SuperNodes (scripts/flower_local.sh) or lower --nodes"
                )
            time.sleep(0.5)

    def _describe_nodes(self, settings: Settings) -> dict[int, Payload]:
        """Every connected node's description of its partition. A node that does not answer in time (it may still
        be busy with a message of a server that died) is asked again until `min_nodes` have answered or `wait`
        seconds have passed."""
        deadline = time.monotonic() + settings.wait
        metas: dict[int, Payload] = {}
        while True:
            pending = [n for n in self.transport.nodes() if n not in metas]
            if pending:
                request: dict[int, Payload] = {n: ({}, {**self.base, "op": "meta"}) for n in pending}
                metas.update(self.transport.ask(request, settings.timeout))
                self._stop_if_refused(request)
            if len(metas) >= settings.min_nodes or time.monotonic() > deadline:
                return metas
            time.sleep(0.5)

    def _federation(self, config: RunConfig, metas: dict[int, Payload]) -> tuple[FederatedData, Tensor, np.ndarray]:
        total = config.num_clients + config.unseen_clients
        if not metas:
            failures = getattr(self.transport, "failures", {})
            why = f" (node {next(iter(failures))}: {next(iter(failures.values()))})" if failures else ""
            raise ConfigError(f"no node answered{why}; check that the SuperNodes run this fedhet version")
        owner = torch.full((total,), -1, dtype=torch.long)
        train, test = torch.zeros(total, dtype=torch.long), torch.zeros(total, dtype=torch.long)
        seen = torch.ones(total, dtype=torch.bool)
        info: dict[str, Tensor] = {}
        labels = torch.zeros(total, int(next(iter(metas.values()))[1]["num_classes"]))
        for index, node in enumerate(self.node_ids):
            arrays, meta = metas[node]
            if int(meta["num_clients"]) != total:
                raise DataError(f"node {node} holds a partition of {meta['num_clients']} clients, the run has {total}")
            ids = to_torch(arrays["clients"])
            if bool((owner[ids] >= 0).any()):
                raise DataError(f"node {node} holds clients that another node holds too: give each its own partition")
            owner[ids] = index
            train[ids], test[ids] = to_torch(arrays["train_sizes"]), to_torch(arrays["test_sizes"])
            seen[ids] = to_torch(arrays["seen"])
            labels[ids] = to_torch(arrays["label_counts"]).float()
            for key in (k for k in arrays if k.startswith("info.")):
                tag = to_torch(arrays[key])
                info.setdefault(key[5:], torch.zeros(total, dtype=tag.dtype))[ids] = tag
        missing = torch.nonzero(owner < 0).flatten()
        if len(missing):
            raise DataError(
                f"{len(missing)} of {total} clients (first: {int(missing[0])}) are on no node; start more nodes"
            )
        arrays, meta = next(iter(metas.values()))
        shape = tuple(int(v) for v in arrays["input_shape"])
        dtype = getattr(torch, str(meta["x_dtype"]))
        data = FederatedData(
            str(meta["name"]),
            _skeleton(train, shape, dtype),
            _skeleton(test, shape, dtype),
            int(meta["num_classes"]),
            seen,
            info,
        )
        self._labels = labels
        return data, owner, arrays["initial_params"]

    # -- plumbing --------------------------------------------------------------------------------------------

    @property
    def nodes(self) -> list[int]:
        return list(self.node_ids)

    def initial_params(self) -> Tensor:
        return self.model.initial_params()

    def backend_for(self, cohort: int, autograd_only: bool = False) -> str:
        """The backend the nodes use (resolved on each node for its share of the cohort)."""
        return resolve_backend(self.backend, self.model, cohort, None, autograd_only)

    def reachable(self) -> Tensor:
        """(K,) bool: clients whose node has not been lost."""
        lost = [i for i, n in enumerate(self.node_ids) if n in self.lost]
        return ~torch.isin(self.owner, torch.as_tensor(lost, dtype=torch.long))

    def _groups(self, clients: Tensor) -> dict[int, Tensor]:
        """Row indices of `clients` by the (not lost) node holding them."""
        owners = self.owner[clients]
        groups = {}
        for index in torch.unique(owners).tolist():
            node = self.node_ids[int(index)]
            if node not in self.lost:
                groups[node] = torch.nonzero(owners == index).flatten()
        return groups

    def _call(self, op: str, per_node: dict[int, Arrays], config: Config | None = None) -> dict[int, Arrays]:
        requests = {
            n: (a, {**self.base, **(config or {}), **self._expected(n, op), "op": op}) for n, a in per_node.items()
        }
        replies = self.transport.ask(requests, self.settings.timeout) if requests else {}
        self._stop_if_refused(requests)
        if op == "train":
            for node, (_, answer) in replies.items():
                self.stamps[node] = (int(answer["state_version"]), str(answer["state_token"]))
        for node in per_node:
            if node not in replies and node not in self.lost:
                self.lost[node] = op
                held = int((self.owner == self.node_ids.index(node)).sum())
                log.warning("node %s did not answer '%s' in time: its %d clients leave the run", node, op, held)
        if len(self.lost) == len(getattr(self, "node_ids", [None])):
            raise ConfigError(
                "every node was lost; restart the SuperNodes, then run again: the run resumes from its checkpoint"
            )
        return {n: r[0] for n, r in replies.items()}

    def secure_mean(
        self,
        round_: int,
        clients: Tensor,
        weights: Tensor,
        sizes: Callable[[int], tuple[int, int]],
        clip: float,
        bits: int,
    ) -> tuple[Tensor | None, Tensor]:
        """Σ_u p_u Δ_u / Σ_u p_u over `clients` (this round's survivors, weights p_u) by Flower's SecAgg+ between the
        nodes that trained them (`fedhet.flower.secagg`), and the clients it includes. A node whose masked input
        does not arrive leaves it, and the run (it is lost, as for any call); None when the workflow halted."""
        secure = getattr(self.transport, "secure_mean", None)
        if secure is None:
            raise ConfigError("algorithm.protocol: flower runs Flower's SecAgg+ workflow, which needs Flower's Grid")
        requests: dict[int, Config] = {}
        for node, rows in self._groups(clients).items():
            requests[node] = {
                **self.base,
                "op": "secagg",
                "round": round_,
                "seed": self.seed,
                "clients": json.dumps(clients[rows].tolist()),
                "weights": json.dumps(weights[rows].double().tolist()),
            }
        mean, nodes = secure(requests, round_, sizes, clip, bits, self.settings.timeout)
        for node in set(requests) - nodes if mean is not None else ():
            if node not in self.lost:
                self.lost[node] = "secagg"
                log.warning("node %s sent no masked input for secure aggregation: its clients leave the run", node)
        included = [c for node in sorted(nodes) for c in json.loads(str(requests[node]["clients"]))]
        out = None if mean is None else torch.from_numpy(np.asarray(mean, dtype=np.float64))
        return out, torch.as_tensor(sorted(included), dtype=torch.long)

    def _stop_if_refused(self, requests: dict[int, Payload]) -> None:
        """A node that refused a call (its config, a stale client state) would refuse it again: the run stops with
        one line naming the node and what it refused, instead of losing the node or asking it again."""
        refusals: dict[int, str] = getattr(self.transport, "refusals", {})
        for node in requests:
            if node in refusals:
                raise ConfigError(f"node {node}: {refusals.pop(node)}")

    def _expected(self, node: int, op: str) -> Config:
        """What a call that reads the clients' state tells `node` of the state it must hold (`NodeWorker.check_state`):
        the stamp of its last training, none before its first."""
        if op not in STATEFUL:
            return {}
        version, token = self.stamps.get(node, (-1, ""))
        return {"state_version": version, "state_token": token}

    def _rows(
        self, op: str, clients: Tensor, arrays: Callable[[Tensor], Arrays], config: Config
    ) -> dict[Tensor, Arrays]:
        groups = self._groups(clients)
        replies = self._call(op, {n: arrays(rows) for n, rows in groups.items()}, config)
        return {groups[n]: reply for n, reply in replies.items()}

    def _values(self, op: str, clients: Tensor, params: Tensor, key: str, config: Config, width: int = 0) -> Tensor:
        out = torch.full((len(clients), width) if width else (len(clients),), float("nan"))
        for rows, reply in self._rows(
            op, clients, lambda r: {"params": to_numpy(params), "clients": to_numpy(clients[r])}, config
        ).items():
            out[rows] = to_torch(reply[key]).float()
        return out

    # -- the engine's interface ------------------------------------------------------------------------------

    def train(self, global_params: Tensor, plan: LocalPlan, round_: int) -> LocalResult:
        """The cohort's result in the plan's order; clients whose node was lost come back as NaN rows marked
        in ``dropped`` (the runner then goes on with the others)."""
        config: Config = {"round": round_, **({"keep_training": True} if self.keep_training else {})}
        per_node: dict[int, Arrays] = {}
        for node, rows in self._groups(plan.clients).items():
            arrays, scalars = encode_plan(plan, rows)
            config.update(scalars)
            per_node[node] = {**arrays, "params": to_numpy(global_params)}
        replies = self._call("train", per_node, config)
        got = concat_results([decode_result(replies[n]) for n in sorted(replies)], plan.clients) if replies else None
        # under Flower's SecAgg+ the nodes keep their clients' models (`fedhet.flower.secagg.withhold_models`)
        m, nan = len(plan.clients), float("nan")
        p = got.params.shape[1] if got is not None else (0 if self.keep_training else self.model.size)
        full = LocalResult(
            plan.clients,
            torch.full((m, p), nan),
            torch.full((m,), nan),
            torch.zeros_like(plan.steps),
            plan.lr,
            dropped=torch.ones(m, dtype=torch.bool),
        )
        if got is not None:
            rows = torch.nonzero(torch.isin(plan.clients, got.clients)).flatten()
            full.params[rows], full.train_loss[rows], full.steps[rows] = got.params, got.train_loss, got.steps
            full.dropped[rows] = False  # type: ignore[index]
            if got.clipped is not None:  # client-level DP: which updates the nodes clipped
                full.clipped = torch.zeros(m, dtype=torch.bool)
                full.clipped[rows] = got.clipped
            for key, value in got.state_delta.items():
                column = torch.zeros(m, *value.shape[1:])
                column[rows] = value
                full.state_delta[key] = column
        return full

    def scores(self, params: Tensor, split: Split = "test", clients: Tensor | None = None) -> ClientScores:
        """Both splits come back in one message; the round's second call (train after test) is then free. The
        nodes score every client they hold; `clients` keeps those (the others NaN), as the native engine does."""
        if self._scored is None or not torch.equal(self._scored[0], params):
            k = self.data.num_clients
            both = {
                name: (torch.full((k,), float("nan")), torch.full((k,), float("nan"))) for name in ("test", "train")
            }
            live = [n for n in self.nodes if n not in self.lost]
            replies = self._call("scores", {n: {"params": to_numpy(params)} for n in live})
            for reply in replies.values():
                ids = to_torch(reply["clients"])
                for name, (loss, acc) in both.items():
                    loss[ids], acc[ids] = to_torch(reply[f"{name}.loss"]), to_torch(reply[f"{name}.accuracy"])
            self._scored = (params.clone(), both)
        loss, acc = self._scored[1][split]
        sizes = getattr(self.data, split).sizes
        if clients is not None:
            return scores_of_some(ClientScores(loss[clients], acc[clients], sizes[clients]), clients, sizes)
        return ClientScores(loss.clone(), acc.clone(), sizes)

    def losses_at(self, params: Tensor, clients: Tensor, split: Split = "train") -> Tensor:
        """F_k(w) as the nodes compute it. The losses of the model last scored (`scores`: every client's mean loss
        on each split, the same function) are not asked again: a strategy that weighs its cohort by the losses at
        the received model (MaxFL, q-FFL, AFL) then needs no exchange of its own in a round that follows an
        evaluation."""
        if self._scored is not None and torch.equal(self._scored[0], params):
            known = self._scored[1][split][0][clients]
            if not bool(known.isnan().any()):
                return known
        return self._values("losses_at", clients, params, "values", {"split": split})

    def own_scores(self, params: Tensor, clients: Tensor, split: Split = "test") -> ClientScores:
        loss, acc = torch.full((len(clients),), float("nan")), torch.full((len(clients),), float("nan"))
        replies = self._rows(
            "own_scores",
            clients,
            lambda r: {"params": to_numpy(params[r]), "clients": to_numpy(clients[r])},
            {"split": split},
        )
        for rows, reply in replies.items():
            scores = decode_scores(reply)
            loss[rows], acc[rows] = scores.loss, scores.accuracy
        return ClientScores(loss, acc, getattr(self.data, split).sizes[clients])

    def personal_starts(self, global_params: Tensor, plan: LocalPlan, round_: int) -> Tensor | None:
        """None: personal parts live on the nodes and never travel to the server."""
        return None

    def personal_scores(
        self, global_params: Tensor, plan: LocalPlan, round_: int, split: Split = "test"
    ) -> ClientScores:
        """Each node builds its clients' personalised models where their personal parts live and scores them:
        only the scores travel."""
        m = len(plan.clients)
        loss, acc = torch.full((m,), float("nan")), torch.full((m,), float("nan"))
        config: Config = {"round": round_, "split": split}
        per_node: dict[int, Arrays] = {}
        groups = self._groups(plan.clients)
        for node, rows in groups.items():
            arrays, scalars = encode_plan(plan, rows)
            config.update(scalars)
            per_node[node] = {**arrays, "params": to_numpy(global_params)}
        for node, reply in self._call("personal_scores", per_node, config).items():
            scores = decode_scores(reply)
            loss[groups[node]], acc[groups[node]] = scores.loss, scores.accuracy
        return ClientScores(loss, acc, getattr(self.data, split).sizes[plan.clients])

    def gradient_statistics(self, params: Tensor, clients: Tensor, samples: int, round_: int) -> tuple[Tensor, Tensor]:
        p = self.model.size
        mean, var = torch.full((len(clients), p), float("nan")), torch.full((len(clients), p), float("nan"))
        replies = self._rows(
            "gradient_statistics",
            clients,
            lambda r: {"params": to_numpy(params), "clients": to_numpy(clients[r])},
            {"samples": samples, "round": round_},
        )
        for rows, reply in replies.items():
            mean[rows], var[rows] = to_torch(reply["mean"]), to_torch(reply["var"])
        return mean, var

    def sampled_losses(self, params: Tensor, clients: Tensor, batch: int, round_: int, stream: str) -> Tensor:
        return self._values(
            "sampled_losses", clients, params, "values", {"batch": batch, "round": round_, "stream": stream}
        )

    def label_counts(self) -> Tensor:
        return self._labels.clone()  # reported by the nodes when they connected

    def state_dict(self) -> dict[str, Any]:
        """The clients' state stays on the nodes (versioned by round, see `fedhet.engine.state`); the server keeps
        which version each node's last training left, by the first client the node holds (Flower's node ids change
        when a node restarts)."""
        return {"node_stamps": {str(self._first_client(n)): [v, t] for n, (v, t) in self.stamps.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        by_client = {int(k): (int(v), str(t)) for k, (v, t) in state.get("node_stamps", {}).items()}
        self.stamps = {n: by_client[self._first_client(n)] for n in self.node_ids if self._first_client(n) in by_client}

    def _first_client(self, node: int) -> int:
        """The lowest client id `node` holds (-1: none)."""
        held = torch.nonzero(self.owner == self.node_ids.index(node)).flatten()
        return int(held[0]) if len(held) else -1


class NodeAvailability(Availability):
    """The run's availability process, minus the clients whose node was lost."""

    name: ClassVar[str] = "flower-nodes"
    description: ClassVar[str] = "the configured availability, restricted to reachable Flower nodes"
    _inner: Availability | None = PrivateAttr(None)
    _engine: RemoteEngine | None = PrivateAttr(None)

    @staticmethod
    def wrap(inner: Availability, engine: RemoteEngine) -> NodeAvailability:
        out = NodeAvailability()
        out._inner, out._engine = inner, engine
        return out

    def available(self, round_: int) -> Tensor:
        assert self._inner is not None and self._engine is not None
        return self._inner.available(round_) & self._engine.reachable()

    def observe(self, round_: int, engine: EngineProtocol, params: Tensor) -> None:
        assert self._inner is not None
        self._inner.observe(round_, engine, params)

    def saved_arrays(self) -> dict[str, np.ndarray]:
        assert self._inner is not None
        return self._inner.saved_arrays()

    def derived(self) -> dict[str, Any]:
        assert self._inner is not None
        return self._inner.derived()

    def state_dict(self) -> dict[str, Any]:
        assert self._inner is not None
        return self._inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assert self._inner is not None
        self._inner.load_state_dict(state)


def remote_builder(transport: Transport, settings: Settings) -> Callable[[RunConfig], Experiment]:
    """A `fedhet.experiments.runner` builder whose engine is a `RemoteEngine` over `transport`."""

    def builder(config: RunConfig) -> Experiment:
        parts = components(config)
        engine = RemoteEngine(config, parts, transport, settings)
        experiment = assemble(config, parts, engine.data, engine)
        experiment.availability = NodeAvailability.wrap(experiment.availability, engine)
        return experiment

    return builder
