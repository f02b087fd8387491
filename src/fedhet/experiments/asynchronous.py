"""Asynchronous runs on the simulated clock: an event queue of clients in flight (`fedhet.strategies.asynchronous`).

The server keeps C clients training. A client dispatched at time t₀ when the server's model is version τ arrives at
t₀ + (download + local steps + upload) (`fedhet.systems.clock`); the queue takes arrivals in order of time (ties:
in order of dispatch), puts each in the buffer, and when the buffer holds K updates the server steps to version
τ + 1 (`AsynchronousStrategy.aggregate_buffer`): one "round" of the run. Slots freed by arrivals are refilled
before the clock moves on (so clients that arrive together are replaced together, from the newest model), with
clients drawn from those available and not in flight.

Clients train together, in one engine call, when the first of them is needed (it is about to arrive): all the
clients in flight that have not trained yet, each from the model version it was sent (`LocalPlan.starts`), when the
local objective looks at the received model only as a start (`LocalPlan.anchor_free`: plain local SGD, FedBuff's
and FedAsync's), else those sent from one version (trained, at the latest, when the version is replaced):
asynchrony does not mean one client at a time.
Every draw is seeded; the queue, its trained results and the buffer are part of the checkpoint, so a resumed run
is byte-identical to an uninterrupted one.

Rounds are server versions: availability processes step once per version, evaluation happens every
``eval_every`` versions, and the engine's mini-batch streams are keyed by the training call (each unique).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedhet.engine.plan import LocalResult
from fedhet.seeding import numpy_rng
from fedhet.strategies.asynchronous import AsynchronousStrategy
from fedhet.systems.base import Profiles
from fedhet.systems.clock import SimulatedTime, plan_bytes


@dataclass(order=True)
class Flight:
    """A client in flight: when its update arrives, the order it was sent in, and where it started from."""

    finish: float
    seq: int
    client: int = field(compare=False)
    version: int = field(compare=False)  # the model version it trains from
    steps: int = field(compare=False)
    lr: float = field(compare=False)
    down: float = field(compare=False)  # bytes it received
    up: float = field(compare=False)  # bytes it will send


@dataclass
class Arrived:
    """A client's trained update: its local model, mean loss and steps, and the version it started from."""

    client: int
    version: int
    params: Tensor
    loss: float
    steps: int
    lr: float


@dataclass
class AsyncQueue:
    """The clients in flight, their trained results, the buffer and the counters (checkpointed)."""

    flights: list[Flight] = field(default_factory=list)  # a heap
    results: dict[int, tuple[Tensor, float]] = field(default_factory=dict)  # seq -> (local model, mean loss)
    buffer: list[Arrived] = field(default_factory=list)
    dispatched: int = 0  # clients sent so far (their seq)
    calls: int = 0  # training calls so far (the engine's round key)
    refills: int = 0  # refills at the current version (their sampling streams)
    starts: dict[int, Tensor] = field(default_factory=dict)  # version -> the model clients in flight started from

    def state_dict(self) -> dict[str, Any]:
        flights = sorted(self.flights)
        return {
            "flights": torch.tensor(
                [[f.finish, f.seq, f.client, f.version, f.steps, f.lr, f.down, f.up] for f in flights],
                dtype=torch.float64,
            ).reshape(-1, 8),
            "results": {int(seq): (params.clone(), float(loss)) for seq, (params, loss) in self.results.items()},
            "buffer": [
                {
                    "client": a.client,
                    "version": a.version,
                    "params": a.params,
                    "loss": a.loss,
                    "steps": a.steps,
                    "lr": a.lr,
                }
                for a in self.buffer
            ],
            "counters": [self.dispatched, self.calls, self.refills],
            "starts": dict(self.starts),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.flights = [
            Flight(float(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4]), float(r[5]), float(r[6]), float(r[7]))
            for r in state["flights"].tolist()
        ]
        heapq.heapify(self.flights)
        self.results = {int(seq): (params, float(loss)) for seq, (params, loss) in state["results"].items()}
        self.buffer = [
            Arrived(int(a["client"]), int(a["version"]), a["params"], float(a["loss"]), int(a["steps"]), float(a["lr"]))
            for a in state["buffer"]
        ]
        self.dispatched, self.calls, self.refills = (int(v) for v in state["counters"])
        self.starts = {int(v): params for v, params in state["starts"].items()}


@dataclass
class Step:
    """What one server version's worth of events did: the updates aggregated, and when."""

    result: LocalResult | None  # the aggregated updates (None: nobody could be dispatched)
    staleness: Tensor
    available: Tensor


class AsyncRunner:
    """Advances an asynchronous run to its next server version (see the module docstring)."""

    def __init__(
        self,
        strategy: AsynchronousStrategy,
        engine: Any,
        profiles: Any,
        seen: Tensor,
        sizes: Tensor,
        seed: int,
        queue: AsyncQueue,
        clock: SimulatedTime,
    ) -> None:
        self.strategy, self.engine, self.profiles_of = strategy, engine, profiles
        self.seen, self.sizes, self.seed = seen, sizes, seed
        self.queue, self.clock = queue, clock

    # -- dispatch ----------------------------------------------------------------------------------------------

    def _draw(self, version: int, pool: Tensor, count: int) -> Tensor:
        """`count` clients of `pool`: the strategy's selection for a version's first refill (so that C = K and
        equal speeds give FedAvg's cohorts), a uniform draw from the dispatch stream for later refills."""
        queue, ctx = self.queue, self.strategy.ctx
        if queue.refills == 0:
            m = ctx.clients_per_round
            ctx.clients_per_round = count
            try:
                return self.strategy.select(version, pool)
            finally:
                ctx.clients_per_round = m
        candidates = torch.nonzero(pool).flatten()
        picked = numpy_rng(self.seed, "dispatch", version, queue.refills).choice(len(candidates), count, replace=False)
        return candidates[torch.as_tensor(np.sort(picked), dtype=torch.long)]

    def refill(self, version: int, params: Tensor, available: Tensor) -> None:
        """Send clients until C are in flight (as many as are available and not in flight)."""
        queue = self.queue
        busy = torch.zeros_like(available)
        busy[torch.as_tensor([f.client for f in queue.flights], dtype=torch.long)] = True
        pool = available & self.seen & ~busy
        count = min(self.strategy.concurrency - len(queue.flights), int(pool.sum()))
        if count <= 0:
            return
        clients = self._draw(version, pool, count)
        queue.refills += 1
        plan = self.strategy.configure(version, clients, params)
        model = self.engine.model
        personal = int(plan.personal.mask(model).sum()) if plan.personal is not None else 0
        down, up = plan_bytes(plan, model.size, personal)
        profiles: Profiles = self.profiles_of(version)
        batch = torch.minimum(self.sizes[clients], torch.tensor(plan.batch_size))
        t_down, t_compute, t_up = profiles.durations(clients, plan.steps * batch, down, up)
        finish = self.clock.seconds + t_down + t_compute + t_up
        if version not in queue.starts:
            queue.starts[version] = params.clone()
        self.clock.bytes_down += down * len(clients)
        for i, k in enumerate(clients.tolist()):
            flight = Flight(
                float(finish[i]), queue.dispatched, k, version, int(plan.steps[i]), float(plan.lr[i]), down, up
            )
            heapq.heappush(queue.flights, flight)
            queue.dispatched += 1

    # -- training ----------------------------------------------------------------------------------------------

    def train_version(self, version: int) -> None:
        """Train every client in flight from `version` that has not trained yet, in one engine call."""
        self._train([f for f in self.queue.flights if f.version == version])

    def train_for(self, flight: Flight) -> None:
        """Train `flight` (about to arrive) with every other client in flight that has not trained yet and can train
        with it: all of them when the plan looks at the received model only as a start (`LocalPlan.anchor_free`:
        each starts from its own version), else those sent from the same version."""
        plan = self.strategy.configure(flight.version, torch.tensor([flight.client]), self.queue.starts[flight.version])
        self._train(
            self.queue.flights if plan.anchor_free else [f for f in self.queue.flights if f.version == flight.version]
        )

    def _train(self, flights: list[Flight]) -> None:
        """The flights among `flights` not trained yet, in one engine call (each from its own version's model)."""
        queue = self.queue
        todo = sorted((f for f in flights if f.seq not in queue.results), key=lambda f: f.seq)
        if not todo:
            return
        versions = {f.version for f in todo}
        first = queue.starts[todo[0].version]
        clients = torch.as_tensor([f.client for f in todo], dtype=torch.long)
        plan = replace(
            self.strategy.configure(todo[0].version, clients, first),
            steps=torch.as_tensor([f.steps for f in todo], dtype=torch.long),
            lr=torch.as_tensor([f.lr for f in todo], dtype=torch.float32),
        )
        if len(versions) > 1:
            plan = replace(plan, starts=torch.stack([queue.starts[f.version] for f in todo]))
        result = self.engine.train(first, plan, queue.calls)
        queue.calls += 1
        for i, flight in enumerate(todo):  # rows of the call's result (saved apart in a checkpoint: `state_dict`)
            queue.results[flight.seq] = (result.params[i], float(result.train_loss[i]))

    # -- one server version -------------------------------------------------------------------------------------

    def step(self, version: int, params: Tensor, available: Tensor) -> tuple[Tensor, Step]:
        """Run the events up to the server's next step; the new model and what was aggregated."""
        queue = self.queue
        K = self.strategy.buffer
        while len(queue.buffer) < K:
            if not queue.flights or queue.flights[0].finish > self.clock.seconds:
                self.refill(version, params, available)
            if not queue.flights:
                return params, Step(None, torch.zeros(0), available)  # nobody available: the model stays
            if queue.flights[0].seq not in queue.results:
                self.train_for(queue.flights[0])
            flight = heapq.heappop(queue.flights)
            self.clock.seconds = max(self.clock.seconds, flight.finish)
            local, loss = queue.results.pop(flight.seq)
            self.clock.bytes_up += flight.up
            queue.buffer.append(Arrived(flight.client, flight.version, local, loss, flight.steps, flight.lr))
        if not self.strategy.configure(version, torch.zeros(0, dtype=torch.long), params).anchor_free:
            self.train_version(version)  # the version is about to be replaced: its clients train from it now
        arrived, queue.buffer = queue.buffer[:K], queue.buffer[K:]
        result = LocalResult(
            torch.as_tensor([a.client for a in arrived], dtype=torch.long),
            torch.stack([a.params for a in arrived]),
            torch.as_tensor([a.loss for a in arrived], dtype=torch.float32),
            torch.as_tensor([a.steps for a in arrived], dtype=torch.long),
            torch.as_tensor([a.lr for a in arrived], dtype=torch.float32),
        )
        starts = torch.stack([queue.starts[a.version] for a in arrived])
        staleness = torch.as_tensor([version - a.version for a in arrived], dtype=torch.long)
        new = self.strategy.aggregate_buffer(version, params, result, starts, staleness).detach()
        queue.refills = 0
        live = {f.version for f in queue.flights} | {a.version for a in queue.buffer}
        queue.starts = {v: w for v, w in queue.starts.items() if v in live}
        return new, Step(result, staleness.double(), available)
