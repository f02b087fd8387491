"""Flower's own SecAgg+ (`fedhet.flower.secagg`: Flower's ``secaggplus_mod`` on the nodes, its
``SecAggPlusWorkflow`` on the server) as a fedhet round's aggregation, on in-process Flower nodes: fedhet's
ClientApp answering Flower messages with a Context of its own per node, through a Grid in this process. The runs
give the numbers of fedhet's simulated secure aggregation within Flower's quantisation step, a node dropped after
sharing its keys is recovered from the shares, and too many dropped nodes fail the round."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flower_helpers import assert_same_metrics, read_metrics, small_config
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE
from flwr.supercore.task_identity import TaskIdentity

from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.errors import ConfigError
from fedhet.experiments.build import build
from fedhet.experiments.runner import run
from fedhet.flower.apps import GridTransport, NodePolicy, make_client_app
from fedhet.flower.codec import Payload
from fedhet.flower.remote import RemoteEngine, Settings, remote_builder
from fedhet.flower.secagg import levels, workflow
from fedhet.imports import ImportPolicy
from fedhet.privacy.secagg import levels as fedhet_levels

SECURE = {"name": "secagg", "protocol": "flower"}


@pytest.fixture(autouse=True)
def server_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """The messages the server makes come from the server's task (restored after each test)."""
    for name, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value)


class LocalGrid:
    """A Flower Grid in this process: each node is `app` with a Context of its own (Flower keeps a node's context
    across a run's messages), and every message travels as a copy, as on the wire. A node in `silent` stops
    answering ``train`` messages after the given number of them (dropped in the middle of SecAgg+)."""

    def __init__(self, app: ClientApp, nodes: int, silent: dict[int, int] | None = None) -> None:
        self.app = app
        self.contexts = {
            100 + p: Context(
                run_id=1,
                node_id=100 + p,
                node_config={"partition-id": p, "num-partitions": nodes},
                state=RecordDict(),
                run_config={},
            )
            for p in range(nodes)
        }
        self.silent = silent or {}
        self.trains: dict[int, int] = dict.fromkeys(self.contexts, 0)
        self.replies: dict[str, Message] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            node = message.metadata.dst_node_id
            ids.append(message.metadata.message_id)
            if message.metadata.message_type == "train":
                self.trains[node] += 1
                if self.trains[node] > self.silent.get(node, 10**9):
                    continue  # no reply: the node dropped
            reply = self.app(message=copy.deepcopy(message), context=self.contexts[node])
            self.replies[message.metadata.message_id] = copy.deepcopy(reply)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        return self.pull_messages(self.push_messages(messages))


class Recording(GridTransport):
    """Flower's Grid transport that keeps every training reply the server gets (op, arrays)."""

    def __init__(self, grid: Any) -> None:
        super().__init__(grid)
        self.trained: list[dict[str, np.ndarray]] = []

    def ask(self, requests: dict[int, Payload], timeout: float) -> dict[int, Payload]:
        replies = super().ask(requests, timeout)
        if any(config["op"] == "train" for _, config in requests.values()):
            self.trained.extend(arrays for arrays, _ in replies.values())
        return replies


def flower_run(
    config: Any, out: Path, nodes: int, silent: dict[int, int] | None = None, transport: list[Recording] | None = None
) -> tuple[Any, LocalGrid]:
    grid = LocalGrid(make_client_app(NodePolicy(ImportPolicy(None, ""))), nodes, silent)
    settings = Settings(timeout=0.5, min_nodes=nodes, wait=5.0)  # a silent node costs a stage this long
    recording = Recording(grid)
    if transport is not None:
        transport.append(recording)
    return run(config, out, builder=remote_builder(recording, settings)), grid  # type: ignore[arg-type]


def test_flowers_quantisation_step_is_fedhets() -> None:
    # T = ⌊(2^b − 1)/n⌋: n values in [0, T] never wrap mod 2^b, and the step 2c/T is fedhet's 1/L = n c/(2^(b−1) − 1)
    for bits, n in ((32, 6), (24, 10), (16, 3)):
        assert n * levels(bits, n) < 2**bits
        assert 2 / levels(bits, n) == pytest.approx(1 / fedhet_levels(bits, 1.0, n), rel=n / 2 ** (bits - 1))
    assert levels(32, 2) == 2**30  # Flower rounds in int32
    flower = workflow(nodes=6, degree=4, threshold=3, clip=0.5, bits=32, timeout=1.0)
    assert (flower.num_shares, flower.reconstruction_threshold, flower.clipping_range) == (5, 3, 0.5)
    assert (flower.quantization_range, flower.modulus_range) == (levels(32, 6), 2**32)
    complete = workflow(nodes=4, degree=3, threshold=2, clip=1.0, bits=32, timeout=1.0)  # k = n − 1: SecAgg
    assert (complete.num_shares, complete.reconstruction_threshold) == (1.0, 2)  # all of them, as a proportion
    pair = workflow(nodes=2, degree=1, threshold=1, clip=1.0, bits=32, timeout=1.0)  # Flower's floor: 2 = all
    assert (pair.num_shares, pair.reconstruction_threshold) == (1.0, 1.0)


def test_flowers_secagg_gives_the_simulated_secagg_numbers(tmp_path: Path) -> None:
    # one client per node: Flower's participants are fedhet's clients; 4 of 6 a round, k = 3 (complete), t = 2
    config = small_config(SECURE, clients_per_round=4, rounds=2)
    simulated = run(small_config({"name": "secagg"}, clients_per_round=4, rounds=2), tmp_path / "simulated")
    recorded: list[Recording] = []
    state, grid = flower_run(config, tmp_path / "flower", nodes=6, transport=recorded)
    assert state.status == "finished"
    # the server never gets a client's model: the training replies hold ids, steps, losses and learning rates only
    size = state.experiment.engine.model.size
    replies = recorded[0].trained
    assert len(replies) == 2 * 4
    for arrays in replies:
        assert set(arrays) == {"clients", "train_loss", "steps", "lr"}
        assert all(a.size == len(arrays["clients"]) < size for a in arrays.values())
    # tolerance: the nodes' stochastic rounding, n·2c/T = 4·2/⌊(2^32 − 1)/4⌋ ≈ 7.5e-9 per coordinate a round
    assert_same_metrics(read_metrics(tmp_path / "simulated"), read_metrics(tmp_path / "flower"), tol=1e-5)
    torch.testing.assert_close(state.params, simulated.params, atol=1e-6, rtol=0)
    assert not torch.equal(state.params, state.experiment.engine.initial_params())
    rows = read_metrics(tmp_path / "flower")
    assert all(float(r["secagg_failed"]) == 0 and float(r["secagg_dropouts"]) == 0 for r in rows)
    # Flower's four stages ran on the selected nodes every round: 4 train messages each, 2 rounds of 4 nodes
    assert sum(grid.trains.values()) == 2 * 4 * 4
    # through Flower's mod, which keeps its protocol state in each node's context
    for node, context in grid.contexts.items():
        assert (RECORD_KEY_STATE in context.state.config_records) == (grid.trains[node] > 0)


def test_a_node_dropped_after_sharing_its_keys_is_recovered(tmp_path: Path) -> None:
    # every client each round: k = 5 (complete graph on 6), t = 3; node 102 answers setup and share keys of round 1,
    # then nothing: its pairwise masks are rebuilt from its neighbours' shares, the round aggregates the others
    config = small_config(SECURE, clients_per_round=6, rounds=2)
    state, grid = flower_run(config, tmp_path / "flower", nodes=6, silent={102: 2})
    assert state.status == "finished"
    rows = read_metrics(tmp_path / "flower")
    assert [float(r["secagg_dropouts"]) for r in rows] == [1.0, 0.0]  # lost after round 1: not selected again
    assert all(float(r["secagg_failed"]) == 0 for r in rows)
    engine = state.experiment.engine
    assert isinstance(engine, RemoteEngine) and engine.lost == {102: "secagg"}
    assert grid.trains[102] == 3  # setup, share keys, and the masked input it never sent


def test_the_recovered_round_is_the_simulated_secure_mean_of_the_others(tmp_path: Path) -> None:
    # round 1 with client 2 (node 102) dropped after sharing its keys, against fedhet's simulated secagg of the same
    # round with client 2 dropped after training: the same model within Flower's quantisation step
    state, _ = flower_run(small_config(SECURE, clients_per_round=6, rounds=1), tmp_path / "flower", 6, {102: 2})
    exp = build(small_config({"name": "secagg"}, clients_per_round=6, rounds=1))
    w, clients = exp.engine.initial_params(), torch.arange(6)
    lost = clients == 2

    def train(plan: LocalPlan) -> LocalResult:
        return replace(exp.engine.train(w, plan, 0), dropped=lost)

    result = exp.strategy.local_training(0, clients, w, train)
    expected = exp.strategy.aggregate(0, w, result.rows(~lost))
    assert exp.strategy.round_metrics()["secagg_dropouts"] == 1
    assert not torch.equal(expected, w)
    torch.testing.assert_close(state.params, expected, atol=1e-6, rtol=0)


def test_too_many_dropped_nodes_fail_the_round_and_leave_the_model(tmp_path: Path) -> None:
    # t = 3 of 4 shares (k = 3): two of four nodes silent after sharing keys leave too few shares: Flower halts
    config = small_config({**SECURE, "threshold": 3}, num_clients=4, clients_per_round=4, rounds=1)
    with pytest.warns(Warning, match="secure aggregation failed"):
        state, _ = flower_run(config, tmp_path / "flower", nodes=4, silent={100: 2, 101: 2})
    rows = read_metrics(tmp_path / "flower")
    assert float(rows[0]["secagg_failed"]) == 1
    assert torch.equal(state.params, state.experiment.engine.initial_params())


def test_two_nodes_run_flowers_secagg_with_every_share(tmp_path: Path) -> None:
    # n = 2: k = 1, t = 1, which Flower's integers cannot say (num_shares > 2, a threshold of 1 means "all"): the
    # complete graph and every share, as proportions; the round is the simulated one
    config = small_config(SECURE, num_clients=2, clients_per_round=2, rounds=1, partition="iid")
    state, grid = flower_run(config, tmp_path / "flower", nodes=2)
    simulated = run(small_config("secagg", num_clients=2, clients_per_round=2, rounds=1, partition="iid"))
    assert sum(grid.trains.values()) == 2 * 4
    assert float(read_metrics(tmp_path / "flower")[0]["secagg_failed"]) == 0
    torch.testing.assert_close(state.params, simulated.params, atol=1e-6, rtol=0)


def test_an_update_attack_is_refused_since_the_updates_stay_on_the_nodes(tmp_path: Path) -> None:
    # the server never holds a client's update under protocol: flower: an attack that corrupts them there is refused
    config = small_config(SECURE, rounds=1, attack={"name": "malicious", "update": "gaussian", "fraction": 0.5})
    with pytest.raises(ConfigError, match=r"attack\.update: none"):
        flower_run(config, tmp_path / "flower", nodes=6)
    assert not (tmp_path / "flower" / "metrics.csv").exists()
