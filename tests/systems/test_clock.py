"""The round clock: what a plan costs each client, and the deadline policies, on hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from fedhet.engine.personal import Personal
from fedhet.engine.plan import LocalPlan, Upload
from fedhet.strategies.scaffold import ControlVariates
from fedhet.systems.base import Profiles
from fedhet.systems.clock import Deadline, RoundClock, SimulatedTime, plan_bytes

# three clients: 1, 2 and 4 ms a sample, 1 MB/s both ways, 0.5 s latency; 100 samples each
PROFILES = Profiles(
    torch.tensor([0.001, 0.002, 0.004], dtype=torch.float64),
    torch.full((3,), 1e6, dtype=torch.float64),
    torch.full((3,), 1e6, dtype=torch.float64),
    torch.full((3,), 0.5, dtype=torch.float64),
)
SIZES = torch.tensor([100, 100, 100])
SIZE = 250_000  # parameters: 1 MB each way, so communication is 2 × (0.5 + 1) = 3 s


def _plan(steps: list[int], **extra: object) -> LocalPlan:
    return LocalPlan(torch.tensor([0, 1, 2]), torch.tensor(steps), torch.full((3,), 0.1), 10, **extra)  # type: ignore[arg-type]


def test_a_round_lasts_until_its_slowest_client() -> None:
    clock = RoundClock(PROFILES, torch.tensor([0, 1, 2]), SIZES)
    plan = clock.schedule(_plan([100, 100, 100]), SIZE, 0).plan  # 1000 samples: 1, 2, 4 s of compute
    assert plan.steps.tolist() == [100, 100, 100]
    assert clock.finish_times().tolist() == pytest.approx([4.0, 5.0, 7.0])
    assert clock.duration() == pytest.approx(7.0)
    assert clock.traffic() == (3e6, 3e6)


def test_drop_leaves_out_who_cannot_finish_and_the_round_lasts_the_deadline() -> None:
    clock = RoundClock(PROFILES, torch.tensor([0, 1, 2]), SIZES, Deadline(seconds=6, policy="drop"))
    plan = clock.schedule(_plan([100, 100, 100]), SIZE, 0).plan
    assert plan.steps.tolist() == [100, 100, 0] and clock.left_out.tolist() == [False, False, True]
    assert clock.duration() == 6.0
    assert math.isinf(float(clock.finish_times()[2]))
    assert clock.traffic() == (3e6, 2e6)  # everyone received the model, two sent theirs


def test_partial_work_takes_the_steps_that_fit() -> None:
    clock = RoundClock(PROFILES, torch.tensor([0, 1, 2]), SIZES, Deadline(seconds=5, policy="partial"))
    plan = clock.schedule(_plan([100, 100, 100]), SIZE, 0).plan
    # 2 s of room after 3 s of communication: 2 / (10 × 0.002) = 100 steps, 2 / (10 × 0.004) = 50
    assert plan.steps.tolist() == [100, 100, 50] and not bool(clock.left_out.any())
    assert clock.finish_times().tolist() == pytest.approx([4.0, 5.0, 5.0])
    assert clock.duration() == pytest.approx(5.0)
    tight = RoundClock(PROFILES, torch.tensor([0, 1, 2]), SIZES, Deadline(seconds=3.015, policy="partial"))
    plan = tight.schedule(_plan([100, 100, 100]), SIZE, 0).plan
    assert plan.steps.tolist() == [1, 0, 0] and tight.left_out.tolist() == [False, True, True]


def test_overselection_keeps_the_first_to_finish() -> None:
    clock = RoundClock(PROFILES, torch.tensor([2, 0, 1]), SIZES, Deadline(seconds=60, policy="overselect"), keep=2)
    plan = LocalPlan(torch.tensor([2, 0, 1]), torch.tensor([100, 100, 100]), torch.full((3,), 0.1), 10)
    plan = clock.schedule(plan, SIZE, 0).plan
    assert plan.steps.tolist() == [0, 100, 100] and clock.left_out.tolist() == [True, False, False]
    assert clock.duration() == pytest.approx(5.0)


def test_several_plans_a_round_charge_compute_each_and_traffic_once() -> None:
    clock = RoundClock(PROFILES, torch.tensor([0, 1, 2]), SIZES)
    clock.schedule(_plan([100, 100, 100]), SIZE, 0)
    clock.schedule(_plan([50, 50, 50], personal=Personal("p"), phase=1), SIZE, SIZE)  # Ditto's personal steps
    assert clock.finish_times().tolist() == pytest.approx([4.5, 6.0, 9.0])
    assert clock.traffic() == (3e6, 3e6)


def test_a_plan_sends_the_shared_part_and_its_terms_tensors() -> None:
    plain = LocalPlan.uniform(torch.tensor([0]), 1, 0.1, 10)
    assert plan_bytes(plain, 1000, 0) == (4000.0, 4000.0)
    assert plan_bytes(plain, 1000, 200) == (3200.0, 3200.0)  # a personal head stays on the client
    scaffold = plain.with_terms(ControlVariates(c=torch.zeros(1000)))
    assert plan_bytes(scaffold, 1000, 0) == (8000.0, 8000.0)  # c down, Δc_i up


def test_the_simulated_time_adds_up_and_round_trips() -> None:
    clock = SimulatedTime()
    clock.advance(2.5, 10.0, 4.0)
    clock.advance(1.0, 1.0, 1.0)
    again = SimulatedTime()
    again.load_state_dict(clock.state_dict())
    assert again.columns() == {"time_s": 3.5, "bytes_down": 11.0, "bytes_up": 5.0}


def test_a_round_is_empty_when_the_deadline_leaves_everyone_out() -> None:
    # communication alone is 3 s (see SIZE): a 2.9 s deadline leaves all three out, 3.2 s only those whose steps
    # do not fit (client 0 fits 10 steps of 10 samples at 1 ms: 0.1 s)
    for seconds, empty in ((2.9, True), (3.2, False)):
        clock = RoundClock(PROFILES, torch.tensor([0, 1, 2]), SIZES, Deadline(seconds=seconds))
        clock.schedule(_plan([10, 10, 10]), SIZE, 0)
        assert clock.emptied() is empty
    assert not RoundClock(PROFILES, torch.tensor([0, 1, 2]), SIZES).emptied()  # no deadline: never
    time = SimulatedTime(1.0, 2.0, 3.0, empty_rounds=2)
    again = SimulatedTime()
    again.load_state_dict(time.state_dict())
    assert again == time
    again.load_state_dict({"time_s": 1.0, "bytes_down": 2.0, "bytes_up": 3.0})  # a checkpoint from before
    assert again.empty_rounds == 0


def test_clients_of_different_architectures_each_pay_their_own() -> None:
    """Sizes 250k, 125k, 250k parameters (half of the first kept personal), shares 1, 0.5, 0.25 of the largest
    architecture's compute: 100 steps of 10 samples at 1, 2, 4 ms a sample are 1, 1, 1 s; the bytes 0.5, 0.5, 1 MB
    each way at 1 MB/s, with 0.5 s latency each way."""
    clock = RoundClock(PROFILES, torch.tensor([0, 1, 2]), SIZES)
    size, personal = torch.tensor([250_000, 125_000, 250_000]), torch.tensor([125_000, 0, 0])
    clock.schedule(_plan([100, 100, 100]), size, personal, torch.tensor([1.0, 0.5, 0.25]))
    assert clock.finish_times().tolist() == pytest.approx([1 + 1 + 1, 1 + 1 + 1, 1 + 1 + 2])
    assert clock.traffic() == (2e6, 2e6)


def test_a_protocols_upload_replaces_the_update_and_its_round_trips_cost_latency() -> None:
    # secure aggregation's 1.5 MB and three more round trips: 0.5 + 1 (down) + 0.5 + 1.5 (up) + 3 × 2 × 0.5 = 6.5 s
    clock = RoundClock(PROFILES, torch.tensor([0, 1, 2]), SIZES)
    clock.schedule(_plan([0, 0, 0], upload=Upload(1.5e6, trips=3)), SIZE, 0)
    assert clock.finish_times().tolist() == pytest.approx([6.5, 6.5, 6.5])
    assert clock.traffic() == (3e6, 4.5e6)
    assert plan_bytes(_plan([1, 1, 1], upload=Upload(1.5e6)), SIZE, 0) == (1e6, 1.5e6)


def test_a_sub_model_per_step_costs_the_mean_share_of_its_steps() -> None:
    """Four parameters of 1, 1, 2 and 4 FLOPs (8 in all); step masks of shares 1/8, 1/4 and 1: a client whose steps
    train shares 1, 1/8 and 1/4 pays (1 + 1/8 + 1/4)/3 of the full model's compute per step (not its union's 1)."""
    flops = torch.tensor([1.0, 1.0, 2.0, 4.0], dtype=torch.float64)
    clock = RoundClock(PROFILES, torch.tensor([0, 1, 2]), SIZES, flops=flops)
    step_masks = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    index = torch.tensor([[2, 0, 1], [1, 1, 0], [0, 0, 0]])
    plan = _plan([3, 2, 0], step_masks=step_masks, step_index=index)
    assert plan.masks is not None and plan.masks.sum(1).tolist() == [4, 2, 0]  # the unions
    share = clock.work_share(plan)
    assert isinstance(share, torch.Tensor)
    assert share.tolist() == pytest.approx([(1 + 1 / 8 + 1 / 4) / 3, 1 / 4, 0.0])
