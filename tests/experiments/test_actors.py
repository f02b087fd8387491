"""`fedhet.experiments.actors` without Ray: the cohort's split, the results put back together, and whole runs whose
training goes to in-process stand-ins of the actors (each shard pickled there and back, as Ray sends it) giving the
one-process run's files byte for byte, client state (SCAFFOLD, Ditto) and a resume included; the refusals.

The same on real Ray actors (a local instance, and a `ray start --head` cluster by address): test_actors_ray.py.
"""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from fedhet.engine.plan import LocalResult
from fedhet.errors import FedhetError, FedhetNote
from fedhet.experiments.actors import (
    ActorPool,
    Trainer,
    check_actors,
    concat_results,
    one_process_chunks,
    split_work,
)
from fedhet.experiments.config import RunConfig, parse_config
from fedhet.experiments.runfolder import CHECKPOINT
from fedhet.experiments.runner import resume, run
from helpers.hostile import assert_refused

SMALL: dict[str, Any] = {
    "dataset": "digits",
    "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
    "model": {"name": "mlp", "hidden": [32]},
    "num_clients": 20,
    "clients_per_round": 16,
    "rounds": 3,
    "local": {"steps": 2, "lr": 0.05, "batch_size": 8},
    "chunk_size": 4,  # one process's chunks: what the cohort is cut at (the default would be one chunk of 28)
}
FILES = ("metrics.csv", "clients.csv", "config.yaml")


class InProcessPool(ActorPool):
    """An `ActorPool` whose actors are `Trainer`s in this process; what they are sent and send back goes through
    pickle, as through Ray."""

    def __init__(self, actors: int) -> None:  # no Ray to check for
        self.count, self.address, self.threads = actors, None, 1
        self.handles = []
        self._ray = None
        self.calls: list[list[int]] = []  # the shards' sizes, call by call

    def _start(self, config: RunConfig, data: Any) -> None:
        raw = config.model_dump(mode="json")
        self.handles = [Trainer(raw, data, 1, ".") for _ in range(self.count)]

    def train(
        self, shards: list[Any], params: torch.Tensor, round_: int, backend: str, chunk: int, history: int
    ) -> list[Any]:
        self.calls.append([len(plan.clients) for plan, _ in shards])
        out = []
        for handle, (plan, state) in zip(self.handles, shards, strict=False):
            sent = pickle.loads(pickle.dumps((params, plan, state)))
            result, models, new = pickle.loads(
                pickle.dumps(handle.train(*sent[:2], round_, backend, chunk, sent[2], history))
            )
            result.params = torch.from_numpy(models.copy())
            out.append((result, new))
        return out


def same_files(a: Path, b: Path) -> None:
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_split_work_cuts_into_equal_work_at_the_starts_allowed() -> None:
    assert [len(p) for p in split_work(torch.full((16,), 5), 2)] == [8, 8]
    assert [len(p) for p in split_work(torch.full((6,), 5), 2)] == [3, 3]
    assert [len(p) for p in split_work(torch.full((20,), 5), 2, [0, 8, 16])] == [8, 12]  # 10 is not allowed: 8
    assert [len(p) for p in split_work(torch.full((20,), 5), 2, [0])] == [20]  # one chunk: one actor
    # equal work, not equal clients: 2 clients of 10 steps weigh as 4 of 5
    assert [len(p) for p in split_work(torch.tensor([10, 10, 5, 5, 5, 5]), 2)] == [2, 4]
    assert [len(p) for p in split_work(torch.tensor([0, 0, 0, 0]), 2)] == [2, 2]  # steps 0 count as 1
    assert [p.tolist() for p in split_work(torch.full((3,), 1), 8)] == [[0], [1], [2]]  # no empty shard
    parts = split_work(torch.randint(0, 9, (100,)), 3, list(range(0, 100, 7)))
    assert torch.equal(torch.cat(parts), torch.arange(100)) and all(int(p[0]) % 7 == 0 for p in parts)


def test_shards_are_whole_chunks_of_one_process_in_its_order() -> None:
    """The dense backend's chunks (in order of decreasing steps), at starts of whole 32-byte words of models."""
    engine = run(parse_config({**SMALL, "rounds": 1, "chunk_size": 3})).experiment.engine
    steps = torch.tensor([1, 5, 5, 2, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9])
    plan = engine.local.plan(torch.arange(14))
    plan.steps = steps
    order, chunk, starts = one_process_chunks(engine, plan, "dense")
    assert torch.equal(order, torch.argsort(steps, descending=True, stable=True)) and chunk == 3
    assert engine.model.size % 8 == 2 and starts == [0, 12]  # chunks start at 0, 3, 6, 9, 12; 4 models a word


def test_concat_results_keeps_the_order_and_every_per_client_field() -> None:
    def result(clients: list[int]) -> LocalResult:
        c = torch.tensor(clients)
        out = LocalResult(c, c.float().view(-1, 1).repeat(1, 2), c.float(), c, c.float() / 10, {"t.c": c.view(-1, 1)})
        out.clipped = c > 2
        return out

    whole = concat_results([result([3, 1]), result([4])])
    assert whole.clients.tolist() == [3, 1, 4]
    assert whole.params.tolist() == [[3, 3], [1, 1], [4, 4]]
    assert whole.state_delta["t.c"].view(-1).tolist() == [3, 1, 4]
    assert whole.clipped is not None and whole.clipped.tolist() == [True, False, True]
    assert whole.dropped is None


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "ditto"])
def test_sharded_training_writes_the_one_process_run_folder(tmp_path: Path, algorithm: str) -> None:
    config = parse_config({**SMALL, "algorithm": algorithm})
    run(config, tmp_path / "one")
    with InProcessPool(2) as pool:
        state = run(config, tmp_path / "two", builder=pool.builder)
    assert all(len(sizes) == 2 for sizes in pool.calls) and pool.calls  # every training was sharded
    assert state.experiment.engine.client_state.keys() == run(config).experiment.engine.client_state.keys()
    same_files(tmp_path / "one", tmp_path / "two")


def test_each_actor_is_sent_its_shards_rows_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clients' state travels for the cohort only, and the driver's store is never read whole (a round's cost
    follows its cohort, not the clients with rows): SCAFFOLD's c_i of 20 clients, 6 a round."""
    from fedhet.engine.state import ClientStore

    sent: list[tuple[set[int], set[int]]] = []  # each shard's clients, and the clients whose rows it was sent

    class Recording(InProcessPool):
        def train(self, shards: list[Any], *args: Any) -> list[Any]:
            sent.extend((set(plan.clients.tolist()), {k for t in state.values() for k in t}) for plan, state in shards)
            return super().train(shards, *args)

    config = parse_config({**SMALL, "algorithm": "scaffold", "clients_per_round": 6, "rounds": 5})
    whole = ClientStore.state_dict
    driver: list[ClientStore] = []
    monkeypatch.setattr(ClientStore, "state_dict", lambda self: [] if self in driver else whole(self))
    with Recording(2) as pool:
        experiment = pool.builder(config)
        driver.append(experiment.engine.client_state)  # reading it whole would give a list: the actor fails
        state = run(config, builder=lambda _: experiment)
    held = state.experiment.engine.client_state
    assert len(held.clients(held.keys()[0])) > 6  # the store holds more clients than a cohort
    assert all(rows <= cohort for cohort, rows in sent) and any(rows for _, rows in sent)


def test_varying_steps_give_the_one_process_numbers(tmp_path: Path) -> None:
    """Epochs: clients of different steps, trained in order of decreasing steps."""
    config = parse_config({**SMALL, "clients_per_round": 9, "local": {"epochs": 1, "batch_size": 8}})
    run(config, tmp_path / "one")
    with InProcessPool(3) as pool:
        run(config, tmp_path / "two", builder=pool.builder)
    assert all(len(sizes) > 1 for sizes in pool.calls)
    same_files(tmp_path / "one", tmp_path / "two")


def test_a_lone_client_trains_as_among_others() -> None:
    """A chunk of one client (the last of a cohort, or an actor's only one) gives its numbers in a larger chunk:
    its loss sums as a column among others (`fedhet.engine.dense`), its softmax takes the same form
    (`fedhet.engine.task.fast_softmax`)."""
    engine = run(parse_config({**SMALL, "rounds": 1, "chunk_size": 8})).experiment.engine
    params = engine.initial_params()
    plan = engine.local.plan(torch.arange(9))
    whole = engine.train(params, plan, 5)
    alone = engine.train(params, plan.rows(torch.tensor([8])), 5)
    assert engine.last_backend == "dense"
    assert torch.equal(whole.params[8], alone.params[0]) and torch.equal(whole.train_loss[8], alone.train_loss[0])


class Stop(Exception):
    pass


def test_an_interrupted_sharded_run_resumes_to_the_one_process_numbers(tmp_path: Path) -> None:
    from fedhet.experiments.callbacks import Callback

    class Interrupt(Callback):
        def on_round_end(self, state: Any, metrics: Any) -> bool:
            if state.round == 2:
                raise KeyboardInterrupt
            return False

    config = parse_config({**SMALL, "algorithm": "scaffold", "rounds": 4})
    run(config, tmp_path / "one")
    with InProcessPool(2) as pool, pytest.raises(KeyboardInterrupt):
        run(config, tmp_path / "two", [Interrupt()], builder=pool.builder)
    assert (tmp_path / "two" / CHECKPOINT).is_file()
    with InProcessPool(2) as pool:
        resumed = resume(tmp_path / "two", builder=pool.builder)
    assert resumed.round == 4 and len(pool.calls) == 2  # rounds 3 and 4 only
    same_files(tmp_path / "one", tmp_path / "two")


def test_what_actors_cannot_do_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FedhetError, match="--ray gives the cluster of --actors"):
        check_actors(None, "auto")
    with pytest.raises(FedhetError, match="--actors 0: give 1 to"):
        check_actors(0, None)
    with pytest.raises(FedhetError, match="leave out --engine flower"):
        check_actors(2, None, engine="flower")
    with pytest.raises(FedhetError, match="--estimate times this process alone"):
        check_actors(2, None, estimate=True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(FedhetError, match=r"--actors needs Ray: pip install 'fedhet\[ray\]'"):
        check_actors(2, None)
    check_actors(None, None)  # no actors: nothing to check


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--actors", "0"], "--actors 0: give 1 to"),
        (["--ray", "auto"], "--ray gives the cluster of --actors"),
        (["--actors", "2", "--engine", "flower"], "leave out --engine flower"),
        (["--actors", "2", "--estimate"], "--estimate times this process alone"),
    ],
)
def test_the_cli_refuses_actors_it_cannot_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], fragment: str
) -> None:
    monkeypatch.chdir(tmp_path)
    assert_refused(["run", "--rounds", "1", "--out", "run", *args], fragment, tmp_path)


def test_the_cli_refuses_actors_without_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert_refused(["run", "--rounds", "1", "--out", "run", "--actors", "2"], "pip install 'fedhet[ray]'", tmp_path)


def test_a_cohort_of_one_chunk_trains_on_one_actor_with_a_note(tmp_path: Path) -> None:
    config = parse_config({**SMALL, "chunk_size": 0, "rounds": 2})  # the dense backend's default: 28 clients a chunk
    with InProcessPool(2) as pool, pytest.warns(FedhetNote, match="trains on 1 of the 2 actors; set chunk_size"):
        run(config, tmp_path / "two", builder=pool.builder)
    assert pool.calls == [[16], [16]]


def test_an_outbox_carries_the_models_and_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An actor on the driver's machine writes its models into the driver's `Outbox` (not through Ray's object
    store): the driver reads them bit for bit; the file's name goes once the actor has it open, and a larger shard
    gets a new file."""
    import mmap
    import os

    import fedhet.experiments.actors as actors

    monkeypatch.setattr(actors, "SHARED_MEMORY", str(tmp_path))
    box = actors.Outbox()
    models = torch.randn(3, 5)
    name = box.ready(models.numel() * 4)
    assert Path(name).parent == tmp_path and (Path(name).stat().st_mode & 0o077) == 0  # the driver's user alone
    opened = actors._map_file(name)
    torch.frombuffer(opened, dtype=torch.float32, count=15).copy_(models.view(-1))
    assert torch.equal(box.models((3, 5)), models)
    box.opened()
    assert not list(tmp_path.iterdir()) and box.ready(15 * 4) == ""  # open in both processes, the name gone
    assert box.ready(2 * mmap.PAGESIZE) != ""  # outgrown (a page at least): a new file
    box.close()
    assert not list(tmp_path.iterdir())

    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    assert box.ready(60) is None and not list(tmp_path.iterdir())  # no room: through Ray, nothing left behind
