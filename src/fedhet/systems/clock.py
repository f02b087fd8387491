"""The simulated clock of a run with a system model: what a round's plans cost each client, and deadlines.

A client's round is download + compute + upload (`Profiles.durations`):

* download: what the server sends for the plan, 4 bytes per float: the shared part of the model (a personal part
  stays on the client, `fedhet.engine.personal`; a sub-model's coordinates alone, ``plan.masks``) and the terms'
  server tensors (SCAFFOLD's c);
* compute: the samples of its local steps (steps × min(batch, its samples)) times its seconds per sample, times
  its sub-model's share of the full model's FLOPs where it trains one (``plan.masks``, `fedhet.models.flops`; with a
  sub-model per step, ``plan.step_masks``, the mean share over its steps);
* upload: the shared part of its model and the state rows its terms report (SCAFFOLD's Δc_i); under a protocol
  (``plan.upload``: secure aggregation) the protocol's bytes instead of the model's, and the latency of its extra
  message round trips.

A round of several plans (Ditto's two, FedRep's two phases) charges each client once for what it receives and
sends (the largest plan's) and for the compute of all its plans. A synchronous round lasts until its last client
has sent its update, unless a `Deadline` is set (seconds after the round starts):

* ``drop``: clients that cannot finish by then are left out (they do no work); the round lasts the deadline when
  anyone is left out (the server waits for them until then), else until the last update;
* ``partial``: each client takes the steps that fit before the deadline (FedNova and FedGSNR weigh unequal steps;
  a client that fits none is left out);
* ``overselect``: the server selects ⌈(1 + r)·m⌉ clients and keeps the m that finish first (FedScale's and
  Bonawitz et al.'s over-selection); the round lasts until the m-th.

The policies are registered components (`fedhet.systems.deadline`): one call, `RoundClock.schedule`, asks the
round's policy and says who takes part in a plan, with how many steps, and when each update arrives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from fedhet.engine.plan import LocalPlan
from fedhet.systems.base import Profiles
from fedhet.systems.deadline import Deadline

FLOAT_BYTES = 4


def plan_bytes(plan: LocalPlan, size: int, personal: int) -> tuple[float, float]:
    """Bytes a client of `plan` receives and sends: the shared part of a model of `size` parameters (`personal` of
    them stay on the client) and the terms' server tensors down, the shared part (a protocol's bytes instead,
    ``plan.upload``) and the reported state rows up."""
    shared = size - personal
    down = shared + sum(t.numel() for term in plan.terms for t in term.server_tensors().values())
    reported = sum(size * len(term.client_state) for term in plan.terms if term.reports_state)
    sent = plan.upload.sent if plan.upload is not None else FLOAT_BYTES * shared
    return float(FLOAT_BYTES * down), float(sent + FLOAT_BYTES * reported)


@dataclass
class Scheduled:
    """A plan as the round's clock lets it run: the steps each client takes (0 for a client left out), which of
    its clients are left out (`late`: no update of theirs arrives in time), and when each update arrives (seconds
    after the round starts, so far: inf for a client left out)."""

    plan: LocalPlan
    late: Tensor  # (m,) bool, rows of the plan
    arrives: Tensor  # (m,) float64 seconds


@dataclass
class RoundClock:
    """What one synchronous round costs its clients so far, plan by plan (see the module docstring)."""

    profiles: Profiles
    clients: Tensor  # (m,) the round's cohort
    sizes: Tensor  # (K,) each client's training samples
    deadline: Deadline = field(default_factory=Deadline)
    keep: int | None = None  # over-selection: the clients kept (the run's m)
    flops: Tensor | None = None  # (P,) forward FLOPs owed to each parameter (`fedhet.models.flops`): sub-models
    down: Tensor = field(init=False)  # (m,) bytes received
    up: Tensor = field(init=False)  # (m,) bytes sent
    compute: Tensor = field(init=False)  # (m,) seconds of local steps
    trips: Tensor = field(init=False)  # (m,) a protocol's message round trips besides the update (`plan.upload`)
    left_out: Tensor = field(init=False)  # (m,) bool: no update of theirs arrives in time

    def __post_init__(self) -> None:
        m = len(self.clients)
        self.down, self.up, self.compute, self.trips = (torch.zeros(m, dtype=torch.float64) for _ in range(4))
        self.left_out = torch.zeros(m, dtype=torch.bool)
        self.planned = False  # whether a plan was scheduled already (over-selection ranks by the first)

    def rows(self, plan: LocalPlan) -> Tensor:
        """The rows of the cohort that `plan`'s clients are."""
        position = {int(k): i for i, k in enumerate(self.clients.tolist())}
        return torch.as_tensor([position[int(k)] for k in plan.clients.tolist()], dtype=torch.long)

    def schedule(
        self, plan: LocalPlan, size: int | Tensor, personal: int | Tensor, share: Tensor | None = None
    ) -> Scheduled:
        """Charge `plan` to its clients (rows of the cohort): the steps the deadline's policy allows them
        (``partial``: those that fit), none for the clients it leaves out (``drop``; ``overselect``: all but the
        `keep` that the round's first plan makes finish first), and when their updates arrive. Clients of different
        architectures (``model: architectures``) give each row its own model's `size` and `personal` part (m,) and
        its `share` (m,) of the compute of the largest architecture."""
        rows = self.rows(plan)
        rule = self.deadline.rule
        if isinstance(size, Tensor):  # each client its own architecture's model
            server = sum(t.numel() for term in plan.terms for t in term.server_tensors().values())
            reported = sum(len(term.client_state) for term in plan.terms if term.reports_state)
            shared = (size - personal).double()
            sent = FLOAT_BYTES * torch.stack([shared + server, shared + reported * size.double()], 1)
        else:
            down, up = plan_bytes(plan, size, int(personal))
            sent = torch.tensor([down, up], dtype=torch.float64).expand(len(rows), 2)
        if plan.masks is not None:  # a sub-model travels alone: its coordinates instead of the whole model's
            sent = sent + FLOAT_BYTES * (plan.masks.sum(1).double().cpu() - (size - personal)).unsqueeze(1)
        self.down[rows] = torch.maximum(self.down[rows], sent[:, 0])
        self.up[rows] = torch.maximum(self.up[rows], sent[:, 1])
        if plan.upload is not None:
            self.trips[rows] = self.trips[rows].clamp_min(float(plan.upload.trips))
        batch = torch.minimum(self.sizes[plan.clients], torch.tensor(plan.batch_size)).double()
        work = self.work_share(plan) if share is None else share.double()
        per_step = batch * self.profiles.sample_s[plan.clients].double() * work
        steps = plan.steps.clone()
        seconds = self.deadline.seconds
        if seconds is not None and rule.cuts_at_deadline:
            comm = self._comm(rows)
            room = seconds - comm - self.compute[rows]
            fits = torch.floor(room / per_step.clamp_min(1e-300)).clamp(min=0).long()
            steps = rule.steps(steps, fits)
            late = (steps == 0) & (plan.steps > 0)
            self.left_out[rows] |= late
        if self.keep is not None and not self.planned:
            self.compute[rows] += steps.double() * per_step  # rank by this plan's finish times, keep the first
            self.keep_first(self.keep)
            self.compute[rows] -= steps.double() * per_step
        self.planned = True
        late = self.left_out[rows].clone()
        steps = torch.where(late, torch.zeros_like(steps), steps)
        self.compute[rows] += steps.double() * per_step
        return Scheduled(replace(plan, steps=steps), late, self.finish_times()[rows])

    def work_share(self, plan: LocalPlan) -> Tensor | float:
        """(m,) each client's share of the full model's FLOPs: that of the coordinates its sub-model trains
        (``plan.masks``), 1 for the full model; with a sub-model per step (``plan.step_masks``), the mean over its
        steps of theirs."""
        if plan.masks is None or self.flops is None:
            return 1.0
        flops = self.flops.to(plan.masks.device)  # of the parameters: running statistics (after them) cost none
        share = (plan.masks[:, : len(flops)].double() @ flops / flops.sum()).cpu()
        if plan.step_masks is None or plan.step_index is None:
            return share
        each = (plan.step_masks[:, : len(flops)].double() @ flops.to(plan.step_masks.device) / flops.sum()).cpu()
        taken = torch.arange(plan.step_index.shape[1]).unsqueeze(0) < plan.steps.unsqueeze(1)
        mean = torch.where(taken, each[plan.step_index], 0.0).sum(1) / plan.steps.clamp_min(1)
        return torch.where(plan.steps > 0, mean, share)

    def _comm(self, rows: Tensor | slice = slice(None)) -> Tensor:
        lat = 2 * (1 + self.trips[rows]) * self.profiles.latency_s[self.clients[rows]].double()
        return (
            lat
            + self.down[rows] / self.profiles.down_bps[self.clients[rows]]
            + self.up[rows] / (self.profiles.up_bps[self.clients[rows]])
        )

    def finish_times(self) -> Tensor:
        """(m,) seconds after the round's start at which each client's update arrives (inf: left out)."""
        times = self._comm() + self.compute
        return torch.where(self.left_out, torch.full_like(times, math.inf), times)

    def keep_first(self, count: int) -> None:
        """Over-selection: leave out all but the `count` clients whose updates arrive first (ties: lower row)."""
        order = torch.argsort(self.finish_times(), stable=True)
        self.left_out[order[count:]] = True

    def duration(self) -> float:
        """How long the round lasted: until its last update arrived, or its deadline where clients were left out
        by it (``drop``, ``partial``)."""
        times = self.finish_times()
        arrived = times[~self.left_out]
        last = float(arrived.max()) if len(arrived) else 0.0
        seconds = self.deadline.seconds
        if seconds is not None and self.deadline.rule.cuts_at_deadline and bool(self.left_out.any()):
            return float(seconds)
        return last

    def emptied(self) -> bool:
        """Whether the deadline left out every client of the round (none of their updates arrived)."""
        return self.deadline.seconds is not None and len(self.clients) > 0 and bool(self.left_out.all())

    def traffic(self) -> tuple[float, float]:
        """Bytes sent to the clients and received from those whose update arrived."""
        return float(self.down.sum()), float(self.up[~self.left_out].sum())


@dataclass
class SimulatedTime:
    """A run's simulated clock and its traffic so far (the columns ``time_s``, ``bytes_down``, ``bytes_up``), and
    the rounds whose deadline left out every client selected (``empty_rounds``: the model did not move)."""

    seconds: float = 0.0
    bytes_down: float = 0.0
    bytes_up: float = 0.0
    empty_rounds: int = 0

    def advance(self, seconds: float, down: float, up: float) -> None:
        self.seconds += seconds
        self.bytes_down += down
        self.bytes_up += up

    def columns(self) -> dict[str, float]:
        return {"time_s": self.seconds, "bytes_down": self.bytes_down, "bytes_up": self.bytes_up}

    def state_dict(self) -> dict[str, float]:
        return {**self.columns(), "empty_rounds": float(self.empty_rounds)}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.seconds, self.bytes_down, self.bytes_up = (float(state[k]) for k in ("time_s", "bytes_down", "bytes_up"))
        self.empty_rounds = int(state.get("empty_rounds", 0))  # a checkpoint from before it was counted: none
