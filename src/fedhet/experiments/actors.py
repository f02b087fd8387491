"""One run on several processes: each round's cohort sharded over Ray actors (``fedhet run --actors N``).

Each actor holds an `Engine` built from the run's config and the driver's federated data (sent once), and trains
its share of the cohort: the plan is cut into contiguous slices of about equal work (local steps), each actor trains
one (`Engine.train`), and the results are put back together in the plan's order. Everything else (selection, the
server step, evaluation, checkpoints) stays in the driver, on its own `Engine` over the same data.

The numbers are those of the one-process run (the same ``metrics.csv``, byte for byte): a client's mini-batches,
dropout masks and noise come from streams keyed by (seed, round, client) (`fedhet.engine.batches`,
`fedhet.seeding`), never by its place in the cohort, and every actor trains on the backend the driver picks for the
whole cohort. The clients' state between rounds (SCAFFOLD's c_i, Ditto's personal models, a persistent optimiser's
buffers) stays in the driver's `ClientStore`: each call sends the shard's rows to its actor and takes the new rows
back, so checkpoints, resumes and personalised evaluation read it where a one-process run does.

Ray is an optional extra (``pip install 'fedhet[ray]'``). Without an address the actors run on a local Ray instance
started for the run; with one (``auto``, ``HOST:PORT``) on that cluster, one actor per `threads` cores (and one GPU
each with ``device: cuda``). The data travels through Ray's object store: the nodes need no data files.
The global model goes into the object store once a round for all actors; an actor on the driver's machine writes
its models into a shared-memory `Outbox` that the driver reads in place, one elsewhere returns them through the
object store.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import logging
import math
import mmap
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedhet.data.dataset import FederatedData
from fedhet.engine.conv import conv_layers
from fedhet.engine.conv import default_chunk as conv_chunk
from fedhet.engine.dense import BLOCK as DENSE_BLOCK
from fedhet.engine.dense import default_chunk as dense_chunk
from fedhet.engine.dense import dense_layers
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.engine.state_store import PersonalState
from fedhet.engine.step import fresh_cohort
from fedhet.errors import ConfigError, FedhetError, FedhetNote
from fedhet.experiments.build import Components, Experiment, build, build_model, components, make_engine
from fedhet.experiments.config import RunConfig, parse_config
from fedhet.experiments.executor import RAY_HINT

MAX_ACTORS = 1024
DISK_STATE = (
    "--actors keeps the clients' state in this process's memory and sends each shard its clients' rows; "
    "personal_state disk does not combine with it: use personal_state memory, or leave out --actors"
)


def check_actors(actors: int | None, address: str | None, engine: str = "native", estimate: bool = False) -> None:
    """Refuse in one line, before anything runs, what `--actors` cannot do (and a missing Ray)."""
    if actors is None:
        if address is not None:
            raise FedhetError("--ray gives the cluster of --actors: add --actors N (the processes that train)")
        return
    if not 1 <= actors <= MAX_ACTORS:
        raise FedhetError(f"--actors {actors}: give 1 to {MAX_ACTORS} actors (processes that train the cohort)")
    if engine != "native":
        raise FedhetError(f"--actors shards the native engine's training: leave out --engine {engine}")
    if estimate:
        raise FedhetError("--estimate times this process alone: leave out --actors")
    if importlib.util.find_spec("ray") is None:
        raise FedhetError(f"--actors needs Ray: {RAY_HINT}")


class ActorPool:
    """Ray actors that train a run's cohorts (`ShardedEngine`); use as a context manager, or call `close`.

    `builder` is the run's builder (`fedhet.experiments.runner.run`/`resume`'s ``builder``): the run's own `build`,
    with an engine whose training goes to `actors` actors of `threads` torch threads each, on the Ray cluster at
    `address` (None: a local instance started here, stopped by `close`).
    """

    def __init__(self, actors: int, address: str | None = None, threads: int = 1) -> None:
        check_actors(actors, address)
        if threads < 1:
            raise FedhetError(f"--threads {threads}: give at least 1 torch thread per actor")
        self.count, self.address, self.threads = actors, address, threads
        self.handles: list[Any] = []
        self._ray: Any = None
        self._outboxes: list[Outbox | None] = []  # per actor: where it writes its models (None: Ray returns them)

    def __enter__(self) -> ActorPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the actors, and the Ray connection (a local instance stops with it)."""
        ray, self._ray = self._ray, None
        for box in getattr(self, "_outboxes", []):
            if box is not None:
                box.close()
        self._outboxes = []
        if ray is None:
            return
        for handle in self.handles:
            ray.kill(handle)
        self.handles = []
        ray.shutdown()

    def builder(self, config: RunConfig) -> Experiment:
        """`build` with a `ShardedEngine` on this pool's actors."""
        if config.personal_state == "disk":
            raise ConfigError(DISK_STATE)
        return build(config, make=self._engine)

    def _engine(self, config: RunConfig, parts: Components, model: FlatModel, data: FederatedData) -> Engine:
        engine = make_engine(config, parts, model, data, cls=ShardedEngine)
        assert isinstance(engine, ShardedEngine)
        engine.pool = self
        self._start(config, data)
        return engine

    def _connect(self) -> Any:
        if self._ray is None:
            import ray

            options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}  # no notices
            if self.address is None:  # a local instance of its own, as large as the actors
                options.update(address="local", num_cpus=self.count * self.threads, include_dashboard=False)
            else:
                options["address"] = self.address
            try:
                ray.init(**options)
            except (ConnectionError, RuntimeError, ValueError) as err:
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                where = f"the Ray cluster at '{self.address}'" if self.address else "a local Ray instance"
                raise FedhetError(f"cannot start {where} ({first}); start one with `ray start --head`") from None
            self._ray = ray
        return self._ray

    def _start(self, config: RunConfig, data: FederatedData) -> None:
        """Start the actors (once per pool: a resume builds the run again on the same actors' successors)."""
        ray = self._connect()
        for handle in self.handles:
            ray.kill(handle)
        gpus = 1 if config.device.startswith("cuda") else 0
        have = ray.cluster_resources()
        for what, each in (("CPU", self.threads), ("GPU", gpus)):
            if each and have.get(what, 0) < self.count * each:
                raise FedhetError(
                    f"--actors {self.count} need {self.count * each} {what}s ({each} each) and the Ray cluster has "
                    f"{have.get(what, 0):g}; ask for fewer actors (or --threads), or add nodes"
                )
        remote = ray.remote(num_cpus=self.threads, num_gpus=gpus, max_restarts=0)(Trainer)
        shared = ray.put(data)
        raw = config.model_dump(mode="json")
        self.handles = [remote.remote(raw, shared, self.threads, os.getcwd()) for _ in range(self.count)]
        try:
            nodes = ray.get([h.ready.remote() for h in self.handles])
        except ray.exceptions.RayError as err:
            raise FedhetError(f"the Ray actors did not start: {_first_line(err)}") from None
        here = ray.get_runtime_context().get_node_id()
        for box in self._outboxes:
            if box is not None:
                box.close()
        self._outboxes = [Outbox() if node == here and os.path.isdir(SHARED_MEMORY) else None for node in nodes]

    def train(
        self,
        shards: list[tuple[LocalPlan, dict[str, Any]]],
        params: Tensor,
        round_: int,
        backend: str,
        chunk: int,
        history: int,
    ) -> list[tuple[LocalResult, dict[str, Any]]]:
        """Each shard (its plan and its clients' stored state) trained on its own actor on `backend` in chunks of
        `chunk` clients (0: the config's): (result, new state)."""
        ray = self._ray
        shared = ray.put(params)  # once for all actors
        boxes = [
            box.ready(len(plan.clients) * params.numel() * params.element_size())
            if box is not None and params.dtype == torch.float32
            else None
            for box, (plan, _) in zip(self._outboxes, shards, strict=False)
        ]
        refs = [
            handle.train.remote(shared, plan, round_, backend, chunk, state, history, box)
            for handle, (plan, state), box in zip(self.handles, shards, boxes, strict=False)
        ]
        try:
            done = ray.get(refs)
        except ray.exceptions.RayError as err:
            raise FedhetError(
                f"round {round_ + 1}: a Ray actor failed ({_first_line(err)}); the run stopped at its last "
                "checkpoint: continue it with fedhet run --resume"
            ) from None
        with warnings.catch_warnings():  # torch warns of read-only arrays
            warnings.simplefilter("ignore", UserWarning)
            for (result, models, _), actor in zip(done, self._outboxes, strict=False):
                if isinstance(models, tuple):  # written into the actor's outbox: a view of it
                    assert actor is not None
                    result.params = actor.models(models)
                    actor.opened()
                else:  # views of Ray's shared memory, read-only
                    result.params = torch.from_numpy(models)
        return [(result, state) for result, _, state in done]  # `concat_results` copies the models


SHARED_MEMORY = "/dev/shm"  # where outboxes live (memory, not disk)


class Outbox:
    """A file in shared memory that an actor on the driver's machine writes its shard's models into, and the driver
    reads them from in place: the models do not go through Ray's object store (a 64 MB round: 8 ms against 10 to
    70 ms, docs/performance.md "Ray actors"). Made by the driver (a name of its own, not shared with other users),
    opened by the actor on its first call, then unlinked: the two mappings keep it, and nothing is left on disk
    when either process ends. Grows (as a new file) when a shard outgrows it."""

    def __init__(self) -> None:
        self.path: str | None = None  # until the actor has opened it
        self.map: mmap.mmap | None = None
        self.size = 0

    def ready(self, nbytes: int) -> str | None:
        """The file's name for a shard of `nbytes` of models (a new, larger file where the last is too small; None
        where shared memory has no room: the models then go through Ray)."""
        if self.map is None or nbytes > self.size:
            self.close()
            size = max(nbytes + nbytes // 4, mmap.PAGESIZE)
            try:
                fd, path = tempfile.mkstemp(prefix="fedhet-actor-", dir=SHARED_MEMORY)  # 0600, a new name
            except OSError:
                return None
            try:
                os.posix_fallocate(fd, 0, size)  # no room: an error here, not a SIGBUS in the actor's write
                self.map = mmap.mmap(fd, size)
            except OSError:
                os.unlink(path)
                return None
            finally:
                os.close(fd)
            self.path, self.size = path, size
        return self.path or ""  # "": the actor has it open

    def models(self, shape: tuple[int, ...]) -> Tensor:
        """The float32 models of `shape` the actor wrote (a view: copy before the next round)."""
        assert self.map is not None
        return torch.frombuffer(self.map, dtype=torch.float32, count=math.prod(shape)).view(shape)

    def opened(self) -> None:
        """The actor has mapped the file: its name can go."""
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.path = None

    def close(self) -> None:
        self.opened()
        if self.map is not None:
            with contextlib.suppress(BufferError):  # a view still held: the mapping closes when it is freed
                self.map.close()
        self.map, self.size = None, 0


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class Trainer:
    """A Ray actor's body: an `Engine` over the driver's data, built from the run's config as the driver's is."""

    def __init__(self, raw: dict[str, Any], data: FederatedData, threads: int, cwd: str) -> None:
        if os.path.isdir(cwd):
            os.chdir(cwd)  # relative paths (plugins) as the driver's
        torch.set_num_threads(threads)
        self.threads = threads
        config = parse_config(raw)
        parts = components(config)
        model = build_model(config, parts, data.input_shape, data.num_classes, data.task)
        self.engine = make_engine(config, parts, model, data)
        self.chunk_size = config.chunk_size
        self._outbox: mmap.mmap | None = None  # the driver's `Outbox`, once opened

    def ready(self) -> str:
        """The Ray node this actor runs on (where it is the driver's, it writes its models into an `Outbox`)."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def train(
        self,
        params: Tensor,
        plan: LocalPlan,
        round_: int,
        backend: str,
        chunk: int,
        state: dict[str, Any],
        history: int,
        outbox: str | None = None,
    ) -> tuple[LocalResult, np.ndarray | tuple[int, ...], dict[str, Any]]:
        """`Engine.train` of the shard on `backend`, from its clients' stored `state`: the result (its models apart,
        as an array; their shape where they were written into the driver's `outbox`, a file name, "" for the one
        opened last) and their new state."""
        from fedhet.engine.threads import torch_threads

        engine = self.engine
        engine.backend, engine.state_history = backend, history  # type: ignore[assignment]
        engine.chunk_size = chunk or self.chunk_size
        engine.client_state.load_state_dict(state)
        with torch_threads(self.threads):
            result = engine.train(params, plan, round_)
        models, result.params = result.params, result.params[:0].clone()  # not a view: pickling one sends its storage
        if outbox:
            self._outbox = _map_file(outbox)
        box = self._outbox if outbox is not None else None
        if box is None or models.dtype != torch.float32 or 4 * models.numel() > len(box):
            return result, models.numpy(), engine.client_state.state_dict()  # NumPy: into Ray's object store
        torch.frombuffer(box, dtype=torch.float32, count=models.numel()).copy_(models.reshape(-1))
        return result, tuple(models.shape), engine.client_state.state_dict()


def _map_file(path: str) -> mmap.mmap:
    with open(path, "r+b") as f:
        return mmap.mmap(f.fileno(), 0)


class ShardedEngine(Engine):
    """An `Engine` whose `train` shards the cohort over an `ActorPool`; the rest runs here."""

    pool: ActorPool
    spread: int | None = None  # the actors a cohort is spread over (None: all of the pool's; benchmarks set 1)
    _noted = False  # whether the run was told its cohort is fewer chunks than actors

    def place_client_state(
        self, mode: PersonalState, folder: Path | None, claim: Callable[[str], None] | None = None
    ) -> str:
        """The clients' state stays in this process's memory (each shard is sent its clients' rows)."""
        if mode == "disk":
            raise ConfigError(DISK_STATE)
        return super().place_client_state("memory", folder, claim)

    def train(self, global_params: Tensor, plan: LocalPlan, round_: int) -> LocalResult:
        m = len(plan.clients)
        probe = fresh_cohort(plan.rows(torch.arange(min(m, 1))), global_params)  # what the objective needs
        backend = self.backend_for(m, probe.autograd_only, plan.batch_size)
        order, chunk, starts = one_process_chunks(self, plan, backend)
        shards, picked = [], []
        for rows in split_work(plan.steps[order], self.spread or self.pool.count, starts):
            part = plan.rows(order[rows])
            shards.append((part, self.client_state.rows_of(part.clients.tolist())))  # the shard's rows alone
            picked.append(order[rows])
        asked = min(self.spread or self.pool.count, m)
        if len(starts) < asked and not self._noted:  # fewer chunks than actors
            self._noted = True
            warnings.warn(
                f"round {round_ + 1}: the cohort of {m} clients is {len(starts)} chunk(s) of one process's {backend} "
                f"backend ({chunk or 1} clients each), so it trains on {len(shards)} of the {asked} actors; set "
                "chunk_size lower to cut it finer (the same numbers in one process)",
                FedhetNote,
                stacklevel=2,
            )
        trained = self.pool.train(shards, global_params, round_, backend, chunk, self.state_history)
        for _, state in trained:
            self.client_state.update(state)
        self.client_state.prune(self._keep_from(round_))
        self.last_backend = backend
        result = concat_results([result for result, _ in trained])
        where = torch.cat(picked)
        return result if bool((where == torch.arange(m)).all()) else result.rows(torch.argsort(where))


def one_process_chunks(engine: Engine, plan: LocalPlan, backend: str) -> tuple[Tensor, int, list[int]]:
    """How one process would train the plan on `backend`: the order of its clients, its chunk size (0: the
    engine's own), and where its chunks start (in that order) that a shard may start at (`split_work`).

    The dense and conv backends train clients in order of decreasing steps, in chunks of clients whose products
    are batched (and whose path, such as the dense backend's Gram form of the first layer, is chosen per chunk): a
    shard of whole chunks of that size, in that order, is computed on its actor as here. Its start is also a
    multiple of 8 models (32 bytes), where MKL's small matrix products round alike. The others train client by
    client (sequential) or all at once (vectorised: `vmap`'s batched products): any start."""
    m, model = len(plan.clients), engine.model
    workers = torch.get_num_threads()
    if backend == "dense":
        layers = dense_layers(model)
        assert layers is not None
        chunk = engine.chunk_size or dense_chunk(model, m, workers)
        block = max(chunk * workers, DENSE_BLOCK)
        starts = [b + c for b in range(0, m, block) for c in range(0, min(block, m - b), chunk)]
    elif backend == "conv":
        spec = conv_layers(model)
        assert spec is not None
        chunk = engine.chunk_size or conv_chunk(spec, m, workers, plan.batch_size)
        starts = list(range(0, m, chunk))
    else:
        return torch.arange(m), 0, list(range(m))
    words = 8 // math.gcd(model.size, 8)  # models per 32 bytes
    order = torch.argsort(plan.steps, descending=True, stable=True)
    return order, chunk, [s for s in starts if s % words == 0]


def split_work(steps: Tensor, parts: int, starts: list[int] | None = None) -> list[Tensor]:
    """Consecutive index ranges of the cohort, at most `parts` of them and none empty, of about equal local steps
    (each client's, at least one: clients without steps spread too), each starting at one of `starts` (default:
    anywhere)."""
    m = len(steps)
    if m == 0:
        return [torch.arange(0)]
    allowed = torch.tensor(sorted({0, *(starts if starts is not None else range(m))}), dtype=torch.float64)
    work = torch.cat([torch.zeros(1, dtype=torch.float64), steps.clamp_min(1).double().cumsum(0)])
    at = work[allowed.long()]  # the work before each allowed start
    goals = work[-1] * torch.arange(1, parts, dtype=torch.float64) / parts
    nearest = (at.view(1, -1) - goals.view(-1, 1)).abs().argmin(1)
    bounds = sorted({0, *allowed[nearest].long().tolist(), m})
    return [torch.arange(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def concat_results(results: list[LocalResult]) -> LocalResult:
    """The shards' results as one, in the order given (every per-client field)."""
    if len(results) == 1:
        only = results[0]
        only.params = only.params.clone()
        return only

    def cat(pick: Callable[[LocalResult], Tensor | None]) -> Tensor | None:
        parts = [pick(r) for r in results]
        return None if parts[0] is None else torch.cat(parts)  # type: ignore[arg-type]

    first = results[0]
    keys = first.state_delta.keys()
    out = LocalResult(
        torch.cat([r.clients for r in results]),
        torch.cat([r.params for r in results]),
        torch.cat([r.train_loss for r in results]),
        torch.cat([r.steps for r in results]),
        torch.cat([r.lr for r in results]),
        {key: torch.cat([r.state_delta[key] for r in results]) for key in keys},
    )
    out.dropped, out.clipped = cat(lambda r: r.dropped), cat(lambda r: r.clipped)
    return out
