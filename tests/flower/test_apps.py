"""fedhet's Flower apps (`fedhet.flower.apps`): how a payload travels in a Flower message, and the server's short
retries for a reply's objects on a deployment. (Whole runs: test_simulation.py, test_worker.py, test_deployment.py.)"""

from __future__ import annotations

import functools
import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict
from flwr.superlink.grid import http_grid

from fedhet.errors import ConfigError
from fedhet.flower import apps


def test_a_payloads_small_arrays_travel_as_one_and_all_come_back_whole() -> None:
    arrays = {
        "weights": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
        "ids": np.array([5, 1, 9], dtype=np.int64),
        "mask": np.array([True, False]),
        "empty": np.zeros((0, 3)),
        "scalar": np.array(2.5),
        "strided": np.arange(10.0)[::3],  # not contiguous
        "model": np.linspace(0, 1, apps.PACK_BELOW // 4, dtype=np.float32),  # large: an object of its own
    }
    config = {"round": 3, "name": "maxfl", "lr": 0.1, "warm": True}
    record = apps._record(arrays, config)
    assert sorted(record["arrays"]) == ["model"]  # the small arrays are one bytes value of the config
    assert sorted(record) == ["arrays", "config"] and isinstance(record["config"][apps.PACKED], bytes)
    back, back_config = apps._payload(record)
    assert back_config == config
    assert sorted(back) == sorted(arrays)
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype and back[name].shape == a.shape
        np.testing.assert_array_equal(back[name], a)
    back["ids"][0] = -1  # each array is its own copy
    assert apps._payload(record)[0]["ids"][0] == 5


def test_an_empty_payload_round_trips() -> None:
    assert apps._payload(apps._record({}, {})) == ({}, {})


def test_a_message_without_large_arrays_is_its_config_record_alone() -> None:
    """Each object of a message costs the SuperLink requests of its own: record dict and config record only."""
    record = apps._record({"steps": np.array([10, 0, 4]), "lr": np.full(3, 0.05, np.float32)}, {"round": 1})
    assert sorted(record) == ["config"]
    back, _ = apps._payload(record)
    np.testing.assert_array_equal(back["steps"], [10, 0, 4])


def test_packed_bytes_are_read_as_numbers_only() -> None:
    record = apps._record({"ids": np.array([1, 2])}, {})
    record["config"][apps.LAYOUT] = '[["ids", "|O", [2]]]'  # object references from bytes: refused
    with pytest.raises(ValueError, match="not a numeric one"):
        apps._payload(record)


def test_the_server_retries_missing_reply_objects_soon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_grid, "pull_objects", http_grid.pull_objects)  # restored after the test
    original = http_grid.pull_objects
    apps.shorten_reply_pulls()
    apps.shorten_reply_pulls()  # once is enough: a second call leaves it as it is
    pull = http_grid.pull_objects
    assert isinstance(pull, functools.partial) and pull.func is original
    assert pull.keywords == {"initial_backoff": apps.POLL_S, "backoff_cap": apps.MAX_POLL_S}


# ---- what a node lets the server's config do (docs/reliability.md, "What can run code") --------------------------

NODE = 11
EVIL = "import pathlib\npathlib.Path(__file__).with_name('pwned').write_text('ran')\n"


@pytest.fixture
def server_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """The messages the tests make come from the server's task."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_task_id", 1), ("_run_id", 7), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value)


def _query(raw: dict[str, object], op: str = "meta", run_key: str = "0123456789abcdef") -> Message:
    from fedhet.experiments.config import dump_yaml

    config = {"fedhet_config": dump_yaml(raw), "run_key": run_key, "op": op}
    return Message(apps._record({}, config), dst_node_id=NODE, message_type="query")


def _context(**node_config: object) -> Context:
    return Context(run_id=7, node_id=NODE, node_config=node_config, state=RecordDict(), run_config={})


SMALL = {"dataset": "digits", "num_clients": 4, "clients_per_round": 2, "rounds": 1}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"imports": ["{root}/evil.py"]}, "refused to import '.*evil.py' \\(allowed here: nothing\\).*allow-imports"),
        ({"model": {"name": "torch", "target": "{root}/evil.py:Net"}}, "refused to import '.*evil.py'"),
        (
            {"model": {"name": "torch", "target": "subprocess:getoutput", "kwargs": {"cmd": "touch {root}/pwned"}}},
            "refused to import 'subprocess'",
        ),
    ],
)
def test_a_node_imports_nothing_the_server_names_that_its_operator_did_not_allow(
    tmp_path: Path, server_task: None, extra: dict[str, object], message: str
) -> None:
    (tmp_path / "evil.py").write_text(EVIL)
    raw = json.loads(json.dumps({**SMALL, **extra}).replace("{root}", str(tmp_path)))
    reply = apps.answer(_query(raw), _context(**{"partition-id": 0, "num-partitions": 2}))
    assert re.search(message, refused(reply))
    assert not (tmp_path / "pwned").exists()


def refused(reply: Message) -> str:
    """What a node's reply says it refused (the reply is an error reply naming a `FedhetError`)."""
    assert reply.has_error()
    reason = apps.refusal(str(reply.error.reason))
    assert reason is not None, reply.error.reason
    return reason


def test_a_node_builds_what_its_allow_imports_lists_and_nothing_else(tmp_path: Path, server_task: None) -> None:
    nets = tmp_path / "nets.py"
    nets.write_text(
        "from torch import nn\n\nclass Net(nn.Sequential):\n    def __init__(self, num_classes):\n"
        "        super().__init__(nn.Flatten(), nn.Linear(64, num_classes))\n\n"
        "def build(num_classes):\n    open(__file__ + '.pwned', 'w')\n"
    )
    node = {"partition-id": 0, "num-partitions": 2, "allow-imports": f"fedhet_nothing, {nets}"}
    reply = apps.answer(_query({**SMALL, "model": {"name": "torch", "target": f"{nets}:Net"}}), _context(**node))
    arrays, config = apps._payload(reply.content)
    assert config["num_clients"] == 4 and arrays["clients"].tolist() == [0, 1]
    reply = apps.answer(_query({**SMALL, "model": {"name": "torch", "target": f"{nets}:build"}}), _context(**node))
    assert re.search(r"is a function, not an nn\.Module class", refused(reply))  # allowed file, no model
    assert not Path(f"{nets}.pwned").exists()


def test_a_node_refuses_in_one_line_to_the_server(tmp_path: Path, server_task: None) -> None:
    """A SuperNode answering in process (`InProcessTasks`, Flower's own node state): the server gets an error reply
    whose reason is the one-line refusal, and the hostile import never ran."""
    import hashlib

    from flwr.supercore.constant import TaskType
    from flwr.supercore.fab import Fab
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.supernode import start_client_internal as loop
    from flwr.supernode.nodestate import NodeStateFactory

    from fedhet.flower.inprocess import InProcessTasks

    (tmp_path / "evil.py").write_text(EVIL)
    fab_hash = hashlib.sha256(b"fab").hexdigest()
    state = NodeStateFactory(ObjectStoreFactory()).state()
    store = state.object_store
    state.set_node_id(NODE)
    run = Run.create_empty(7)
    run.fab_id, run.fab_version, run.fab_hash, run.series_id = "fedhet/test", "1.0.0", fab_hash, 5
    state.store_run(run)
    state.store_fab(Fab(fab_hash, b"fab", {}))
    state.set_run_series_context(5, _context(**{"partition-id": 0, "num-partitions": 2}))
    state.create_task(task_type=TaskType.CLIENT_APP, run_id=7, fab_hash=fab_hash)
    loop._insert_message(_query({**SMALL, "imports": [str(tmp_path / "evil.py")]}), state, store)
    tasks = InProcessTasks()
    tasks.apps[fab_hash] = apps.client_app
    tasks.run_pending(state, store)
    replies = list(state.get_messages_legacy(run_ids=[7], is_reply=True))
    assert len(replies) == 1 and replies[0].has_error()
    reason = apps.failure_reason(str(replies[0].error.reason))
    assert reason.startswith(f"refused to import '{tmp_path / 'evil.py'}' (allowed here: nothing)"), reason
    assert not (tmp_path / "pwned").exists()


def test_node_state_stays_in_the_nodes_own_state_folder(tmp_path: Path) -> None:
    policy = apps.NodePolicy.of({"state-dir": str(tmp_path / "state")})
    config = {"run_key": "0123456789abcdef", "state_dir": str(tmp_path / "server-chosen")}
    path = apps._state_file(config, {"partition-id": 0}, policy)
    assert path is not None and path.parent == tmp_path / "state"  # the server's state_dir is not a node's choice
    for key in ("../../../outside", "0123456789abcdef/../../x", "", "0123456789ABCDEF", "a" * 17):
        with pytest.raises(ValueError, match="not a fedhet run key"):
            apps._state_file({**config, "run_key": key}, {"partition-id": 0}, policy)
    assert apps._state_file(config, {}, apps.NodePolicy.of({})) is None  # no state-dir: Flower's context only
    (tmp_path / "state").mkdir()
    path.symlink_to(tmp_path / "outside.pt")
    with pytest.raises(ValueError, match="leads out of the node's state folder"):
        apps._state_file(config, {"partition-id": 0}, policy)


def test_the_server_names_the_node_that_failed_not_the_superlink(
    caplog: pytest.LogCaptureFixture, server_task: None
) -> None:
    from types import SimpleNamespace

    class Grid:
        def push_messages(self, messages: list[Message]) -> list[str]:
            return ["m-7", "m-8"]

        def pull_messages(self, ids: list[str]) -> list[object]:
            error = SimpleNamespace(reason="<class 'RuntimeError'>:<'out of \\'memory\\''>")
            metadata = SimpleNamespace(reply_to_message_id="m-8", src_node_id=0)  # the SuperLink reports it
            return [SimpleNamespace(metadata=metadata, has_error=lambda: True, error=error)]

    transport = apps.GridTransport(Grid())  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="fedhet.flower"):
        assert transport.ask({7: ({}, {"op": "meta"}), 8: ({}, {"op": "meta"})}, timeout=0.05) == {}
    assert transport.failures == {8: "out of \\'memory\\'"} and transport.refusals == {}
    assert "node 8 failed: out of" in caplog.text


# ---- a node's state on a runtime that answers each message with any of several workers (issue 48) -----------------


class Actors:
    """`fedhet.flower.remote.Transport` through fedhet's ClientApp code (`apps.answer_with`), each node with its own
    Flower context, as Flower's simulation runtime does, and each message goes to whichever of three Ray actors
    (each a process with its own `NodeWorker`s, `apps._WORKERS`) is free: here one drawn at random."""

    def __init__(self, nodes: int, policy: apps.NodePolicy | None = None) -> None:
        from fedhet.imports import ImportPolicy

        self.contexts = {n: _context(**{"partition-id": n, "num-partitions": nodes}) for n in range(nodes)}
        self.actors: list[dict[str, object]] = [{}, {}, {}]
        self.policy = policy or apps.NodePolicy(ImportPolicy(None, ""))
        self.refusals: dict[int, str] = {}
        self.messages = 0
        self.draw = random.Random(0)

    def nodes(self) -> list[int]:
        return sorted(self.contexts)

    def ask(self, requests: dict, timeout: float) -> dict:
        replies = {}
        for node, (arrays, config) in requests.items():
            self.messages += 1
            apps._WORKERS = self.draw.choice(self.actors)  # type: ignore[assignment]
            message = Message(apps._record(arrays, config), dst_node_id=node, message_type="query")
            reply = apps.answer_with(message, self.contexts[node], self.policy)
            if reply.has_error():
                self.refusals[node] = str(apps.refusal(str(reply.error.reason)))
            else:
                replies[node] = apps._payload(reply.content)
        return replies


@pytest.mark.parametrize("algorithm", ["ditto", "apfl"])
def test_personal_models_are_the_native_ones_whichever_worker_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_task: None, algorithm: str
) -> None:
    from flower_helpers import assert_same_metrics, read_metrics, small_config

    from fedhet.experiments.runner import run
    from fedhet.flower.remote import Settings, remote_builder

    monkeypatch.setattr(apps, "_WORKERS", {})
    config = small_config(algorithm)
    run(config, tmp_path / "native")
    transport = Actors(2)
    run(config, tmp_path / "actors", builder=remote_builder(transport, Settings(min_nodes=2)))
    native, actors = read_metrics(tmp_path / "native"), read_metrics(tmp_path / "actors")
    assert "personal_test_accuracy" in native[0]
    assert_same_metrics(native, actors)


@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [("heterofl", {}), ("fedrolex", {}), ("fjord", {}), ("fjord", {"draws": "round"}), ("depthfl", {})],
    ids=["heterofl", "fedrolex", "fjord-per-batch", "fjord-per-round", "depthfl"],
)
def test_sub_models_on_flower_nodes_give_the_native_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_task: None, algorithm: str, extra: dict
) -> None:
    """HeteroFL (its scaler on), FedRolex, FjORD (p per mini-batch: the plans' step masks; and per round) and
    DepthFL (its self-distillation term and multi-exit model): the plans' masks, scales and terms reach the nodes,
    whose engines train the sub-models; every metrics.csv value, the accuracy at every level included, within 1e-5
    of the native run."""
    from flower_helpers import assert_same_metrics, read_metrics, small_config

    from fedhet.experiments.runner import run
    from fedhet.flower.remote import Settings, remote_builder

    monkeypatch.setattr(apps, "_WORKERS", {})
    levels = {"name": algorithm, "levels": [1, 0.5, 0.25], **extra}
    model = (
        {"name": "mlp_exits", "hidden": [16, 16, 16, 16]} if algorithm == "depthfl" else {"name": "mlp", "hidden": [16]}
    )
    config = small_config(levels, model=model)
    run(config, tmp_path / "native")
    run(config, tmp_path / "nodes", builder=remote_builder(Actors(2), Settings(min_nodes=2)))
    native, nodes = read_metrics(tmp_path / "native"), read_metrics(tmp_path / "nodes")
    assert "test_accuracy_level0.25" in native[0]
    assert_same_metrics(native, nodes)
    clients = [(tmp_path / folder / "clients.csv").read_text() for folder in ("native", "nodes")]
    assert "capacity" in clients[0].splitlines()[0] and clients[0].count("\n") == clients[1].count("\n")


@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [
        ({"name": "cfl", "eps1": 10.0, "eps2": 0.0}, {"shift": {"name": "rotation", "groups": 2}}),  # splits early
        ({"name": "ifca", "k": 2}, {"shift": {"name": "rotation", "groups": 2}}),
        ("fedbn", {"model": {"name": "resnet8", "width": 2}, "personal_eval": {"appeal": False}}),
        ("fedavg", {"model": {"name": "resnet8", "width": 2, "batch_norm": "aggregate"}}),
    ],
    ids=["cfl", "ifca", "fedbn", "batch-norm-aggregated"],
)
def test_clusters_and_batch_norm_on_flower_nodes_give_the_native_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_task: None, algorithm: object, extra: dict
) -> None:
    """CFL (splitting in its first rounds), IFCA, FedBN (each client's batch-norm layers and statistics kept where
    the client lives) and batch-norm statistics averaged as parameters: every metrics.csv value within 1e-5 of the
    native run."""
    from flower_helpers import assert_same_metrics, read_metrics, small_config

    from fedhet.experiments.runner import run
    from fedhet.flower.remote import Settings, remote_builder

    monkeypatch.setattr(apps, "_WORKERS", {})
    config = small_config(algorithm, **{"model": {"name": "mlp", "hidden": [16]}, **extra})
    run(config, tmp_path / "native")
    run(config, tmp_path / "nodes", builder=remote_builder(Actors(2), Settings(min_nodes=2)))
    native, nodes = read_metrics(tmp_path / "native"), read_metrics(tmp_path / "nodes")
    if algorithm == "fedbn":
        assert "personal_test_accuracy" in native[-1]
    if "clusters" in native[-1]:
        assert float(native[-1]["clusters"]) > 1  # CFL did split
    assert_same_metrics(native, nodes)


def test_a_node_that_lost_its_state_stops_the_run_naming_the_node_client_and_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_task: None
) -> None:
    from flower_helpers import small_config

    from fedhet.experiments.callbacks import Callback
    from fedhet.experiments.runner import run
    from fedhet.flower.remote import Settings, remote_builder

    monkeypatch.setattr(apps, "_WORKERS", {})
    transport = Actors(2)

    class Forget(Callback):  # node 1's context loses its clients' state after round 2 (and no state file)
        def on_round_end(self, state: object, metrics: object) -> bool:
            if getattr(state, "round", 0) == 2:
                transport.contexts[1].state = RecordDict()
            return False

    config = small_config("ditto")
    with pytest.raises(ConfigError) as info:
        run(config, tmp_path, [Forget()], builder=remote_builder(transport, Settings(min_nodes=2)))
    message = str(info.value)
    assert "\n" not in message
    assert re.fullmatch(
        r"node 1: the state of client \d+( \(and \d+ more\))? for (the evaluation after )?round 3 is missing: the "
        r"server's last training on this node left the state of round \d's training \(phase \d\), the node holds no "
        r"client state",
        message,
    ), message


def test_a_refusing_node_stops_the_run_at_once_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_task: None
) -> None:
    """Issue 43: a node's refusal of the server's config was retried for the whole wait (hundreds of "node N failed"
    lines), then a traceback; now the first refusal stops the run, before anything is written to its folder."""
    from flower_helpers import small_config

    from fedhet.experiments.runner import run
    from fedhet.flower.remote import Settings, remote_builder

    monkeypatch.setattr(apps, "_WORKERS", {})
    (tmp_path / "plugin.py").write_text("X = 1\n")  # the server's own code (it imports it); the nodes refuse it
    config = small_config("fedavg", imports=[str(tmp_path / "plugin.py")])
    transport = Actors(2, apps.NodePolicy.of({}))  # a deployed node's default: no imports
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as info:
        run(config, out, builder=remote_builder(transport, Settings(min_nodes=2, wait=30)))
    assert re.fullmatch(
        r"node [01]: refused to import '.*plugin\.py' \(allowed here: nothing\); .*allow-imports.*", str(info.value)
    ), str(info.value)
    assert transport.messages == 2 and not out.exists()  # one message per node, no folder


def test_the_deployed_server_says_a_refusal_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def refused(grid: object, context: object) -> None:
        raise ConfigError("node 5: refused to import 'evil.py'\n(allowed here: nothing)")

    apps._one_line(refused)(None, None)  # type: ignore[arg-type]
    captured = capsys.readouterr()
    assert captured.err == "error: node 5: refused to import 'evil.py' (allowed here: nothing)\n"
    assert captured.out == ""
