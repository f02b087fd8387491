"""A node's partition file (`fedhet.flower.node.load_partition`): anything but a partition fedhet wrote is one line
naming the file, read without running code."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from flower_helpers import small_config

from fedhet.errors import DataError
from fedhet.experiments.build import components, federated_data
from fedhet.flower.node import load_partition, node_clients, save_partition


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch pwned",))


def _saved(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def test_a_partition_round_trips(tmp_path: Path) -> None:
    config = small_config()
    data = federated_data(config, components(config))
    save_partition(tmp_path / "node-0.pt", data, node_clients(data.num_clients, 0, 2))
    loaded, clients = load_partition(tmp_path / "node-0.pt")
    assert clients.tolist() == node_clients(data.num_clients, 0, 2).tolist()
    assert loaded.num_clients == data.num_clients and loaded.train.sizes[3:].sum() == 0


def _partition(tmp_path: Path) -> dict[str, Any]:
    config = small_config()
    data = federated_data(config, components(config))
    save_partition(tmp_path / "good.pt", data, node_clients(data.num_clients, 0, 2))
    loaded: dict[str, Any] = torch.load(tmp_path / "good.pt", weights_only=True)
    return loaded


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (lambda p: b"", "is not a fedhet node partition"),
        (lambda p: b"garbage" * 100, "is not a fedhet node partition"),
        (lambda p: _saved(p)[:2000], "is not a fedhet node partition"),
        (lambda p: _saved({"params": _Evil()}), "is not a fedhet node partition"),
        (lambda p: _saved([1, 2]), "format 'list'"),
        (lambda p: _saved({**p, "train": {"x": p["train"]["x"]}}), "is a damaged fedhet node partition"),
        (lambda p: _saved({**p, "clients": torch.tensor([0, 99])}), "client ids are out of range"),
        (
            lambda p: _saved({**p, "test": {**p["test"], "offsets": p["test"]["offsets"].flip(0)}}),
            "offsets do not cut its samples",
        ),
    ],
)
def test_a_damaged_or_crafted_partition_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: Any, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "node.pt").write_bytes(content(_partition(tmp_path)))
    with pytest.raises(DataError, match=r"^'node.pt' [^\n]+$") as info:
        load_partition(Path("node.pt"))
    assert message in str(info.value) and not (tmp_path / "pwned").exists()


def test_a_missing_partition_says_how_to_write_it(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"python -m fedhet\.flower\.partitions CONFIG NODES DIR"):
        load_partition(tmp_path / "missing.pt")


# ---- the clients' state a node keeps, versioned by the training that wrote it (issue 48) -------------------------


def _ditto_node() -> tuple[Any, Any, Any]:
    """Node 0 of 2 for a small Ditto run, and the plan of its personal steps (phase 1) for its clients."""
    from fedhet.engine.personal import Personal
    from fedhet.engine.plan import LocalPlan
    from fedhet.flower.codec import encode_plan
    from fedhet.flower.node import NodeWorker, config_text, derived_partition

    config = small_config("ditto")
    data, clients = derived_partition(config, config_text(config), 0, 2)
    worker = NodeWorker(config, data, clients)
    plan = LocalPlan.uniform(clients, 3, 0.05, 8, stream="ditto", personal=Personal(key="ditto.v"), phase=1)
    arrays, config = encode_plan(plan)
    return worker, plan, (arrays, {**config, "state_version": -1, "state_token": ""})  # the server's first call


def test_a_training_stamps_the_state_with_its_version_and_a_token_of_its_own() -> None:
    import numpy as np

    from fedhet.flower.node import NO_STATE, Stamp

    worker, _, (arrays, config) = _ditto_node()
    params = worker.engine.initial_params().numpy()
    assert worker.stamp == NO_STATE
    _, first = worker.handle("train", {**arrays, "params": params}, {**config, "round": 2})
    assert (first["state_version"], len(str(first["state_token"]))) == (2 * 8 + 1, 16)  # round × PHASES + phase
    expected = {"state_version": first["state_version"], "state_token": first["state_token"]}
    _, second = worker.handle("train", {**arrays, "params": params}, {**config, **expected, "round": 3})
    assert second["state_version"] == 3 * 8 + 1 and second["state_token"] != first["state_token"]
    assert worker.stamp == Stamp(25, str(second["state_token"]))
    scores, _ = worker.handle(
        "personal_scores",
        {**arrays, "steps": np.zeros_like(arrays["steps"]), "params": params},
        {**config, "state_version": 25, "state_token": second["state_token"], "round": 4},
    )
    assert np.isfinite(scores["accuracy"]).all()


def test_a_missing_or_stale_state_is_one_line_naming_the_client_and_the_round() -> None:
    from fedhet.flower.node import StaleStateError

    worker, plan, (arrays, config) = _ditto_node()
    params = worker.engine.initial_params().numpy()
    first = int(plan.clients[0])
    request = {**arrays, "params": params}
    # the evaluation after round 3 (0-based training round 2 wrote version 2 × 8 + 1 = 17), on a node with no state
    with pytest.raises(
        StaleStateError,
        match=rf"^the state of client {first} \(and 2 more\) for the evaluation after round 3 is missing: the "
        r"server's last training on this node left the state of round 3's training \(phase 1\), the node holds no "
        r"client state$",
    ):
        evaluation = {**config, "state_version": 17, "state_token": "a" * 16, "round": 3, "split": "test"}
        worker.handle("personal_scores", request, evaluation)
    worker.handle("train", request, {**config, "round": 1})  # round 2's training: version 9
    with pytest.raises(
        StaleStateError,
        match=r"for round 4 is stale: .* left the state of round 3's training \(phase 1\), the node holds the "
        r"state of round 2's training \(phase 1\)$",
    ):
        worker.handle("train", request, {**config, "state_version": 17, "state_token": "b" * 16, "round": 3})
    with pytest.raises(StaleStateError, match=r"for round 3 is stale: .* holds .* round 2's .* by another training$"):
        worker.handle("train", request, {**config, "state_version": 9, "state_token": "c" * 16, "round": 2})


def test_a_node_ahead_of_a_resumed_server_forgets_what_came_after() -> None:
    worker, plan, (arrays, config) = _ditto_node()
    request = {**arrays, "params": worker.engine.initial_params().numpy()}
    _, one = worker.handle("train", request, {**config, "round": 1})
    kept = {k: [r for r, _ in h] for k, h in worker.engine.client_state.state_dict()["ditto.v"].items()}
    worker.handle("train", request, {**config, "state_version": 9, "state_token": one["state_token"], "round": 2})
    assert {k: [r for r, _ in h] for k, h in worker.engine.client_state.state_dict()["ditto.v"].items()} == {
        k: [9, 17] for k in kept
    }
    # the server resumed from its checkpoint of round 1: round 2 again, expecting round 1's state
    worker.check_state({"state_version": 9, "state_token": str(one["state_token"])}, plan.clients, "round 3")
    assert {k: [r for r, _ in h] for k, h in worker.engine.client_state.state_dict()["ditto.v"].items()} == kept
    assert worker.stamp.version == 9 and worker.stamp.token == one["state_token"]


def test_a_server_that_sends_no_state_version_is_refused() -> None:
    from fedhet.errors import ConfigError

    worker, _, (arrays, config) = _ditto_node()
    request = {**arrays, "params": worker.engine.initial_params().numpy()}
    older = {k: v for k, v in config.items() if not k.startswith("state_")}
    with pytest.raises(ConfigError, match="sent no client state version: give it and every node the same fedhet"):
        worker.handle("train", request, {**older, "round": 1})
