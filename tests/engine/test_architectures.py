"""The engine of several architectures: each client trains and is scored on its own member, at its member's cost."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fedhet.engine.architectures import ArchitectureEngine, assign_members, member_blocks
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.objective import Proximal
from fedhet.engine.personal import Personal
from fedhet.engine.plan import LocalPlan
from fedhet.errors import ConfigError
from fedhet.models.architectures import Architectures
from fedhet.systems.base import Capacity, Constant
from helpers.architectures import composite, engine
from helpers.tiny import Shift, tiny_data


def test_blocks_are_the_members_coordinates_one_after_another() -> None:
    model = composite()
    blocks = member_blocks(model)
    assert blocks[0] == slice(0, 4 * 3 + 3 + 3 * 3 + 3)  # body 4->3, head 3->3
    assert blocks[1].start == blocks[0].stop and blocks[1].stop == model.size


@pytest.mark.parametrize("backend", ["sequential", pytest.param("vectorised", marks=pytest.mark.slow), "auto"])
def test_a_mixed_cohort_trains_each_client_as_its_member_alone(backend: str) -> None:
    """Member a's rows equal a plain engine over that member alone; the other members' coordinates are untouched."""
    eng = engine(backend=backend)
    w = eng.initial_params()
    clients = torch.arange(4)
    result = eng.train(w, LocalPlan.uniform(clients, 3, 0.1, 4), 0)
    module = eng.model.module
    for a, block in enumerate(eng.blocks):
        alone = Engine(FlatModel(module.members[a]), eng.data, backend="sequential")  # type: ignore[index]
        own = clients[eng.members == a]
        expected = alone.train(w[block], LocalPlan.uniform(own, 3, 0.1, 4), 0).params
        torch.testing.assert_close(result.params[own][:, block], expected, atol=1e-5, rtol=1e-5)
        others = clients[eng.members != a]
        assert torch.equal(result.params[others][:, block], w[block].expand(len(others), -1))
    assert not torch.isnan(result.train_loss).any()


def test_a_client_costs_its_own_member_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cohort of member-0 clients trains member 0's parameters only: never member 1's, nor the composite."""
    eng = engine(members=[0, 0, 1, 1])
    trained: list[int] = []
    run = Engine._run

    def spy(self: Engine, *args: object, **kwargs: object) -> object:
        trained.append(self.model.size)
        return run(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Engine, "_run", spy)
    eng.train(eng.initial_params(), LocalPlan.uniform(torch.tensor([0, 1]), 2, 0.1, 4), 0)
    assert trained == [eng.blocks[0].stop - eng.blocks[0].start]


def test_personal_models_and_scores_are_routed_and_kept_per_member() -> None:
    eng = engine()
    w = eng.initial_params()
    clients = torch.arange(4)
    personal = Personal("mine")
    trained = eng.train(w, LocalPlan.uniform(clients, 2, 0.1, 4, personal=personal), 0)
    assert torch.equal(trained.params, w.expand(4, -1))  # the whole model is personal: nothing sent
    later = LocalPlan.uniform(clients, 0, 0.1, 4, personal=personal, phase=1)
    starts = eng.personal_starts(w, later, 0)
    assert starts is not None and not torch.equal(starts, w.expand(4, -1))
    own = eng.own_scores(starts, clients)
    routed = eng.personal_scores(w, later, 0)
    torch.testing.assert_close(routed.accuracy, own.accuracy)
    torch.testing.assert_close(routed.loss, own.loss)
    # the state is the members' engines', in a checkpoint and back
    fresh = engine()
    fresh.load_state_dict(eng.state_dict())
    assert fresh.personal_starts(w, later, 0) is not None
    torch.testing.assert_close(fresh.personal_starts(w, later, 0), starts)


def test_the_global_model_is_scored_per_client_by_its_member() -> None:
    eng = engine()
    w = eng.initial_params()
    scores = eng.scores(w)
    for a, block in enumerate(eng.blocks):
        alone = eng.parts[a].scores(w[block])
        mine = eng.members == a
        torch.testing.assert_close(scores.loss[mine], alone.loss[mine])
    some = eng.scores(w, clients=torch.tensor([2, 1]))
    assert torch.isnan(some.loss[[0, 3]]).all() and not torch.isnan(some.loss[[1, 2]]).any()
    torch.testing.assert_close(eng.losses_at(w, torch.tensor([3, 0])), scores.loss[[3, 0]])


def test_representations_are_class_sums_of_each_clients_model() -> None:
    eng = engine()
    w = eng.initial_params()
    clients = torch.tensor([1, 2])
    sums, counts = eng.representations(w, LocalPlan.uniform(clients, 0, 0.1, 4), 0)
    data = eng.data.train
    for i, k in enumerate(clients.tolist()):
        a, block = int(eng.members[k]), eng.blocks[int(eng.members[k])]
        x, y = data.x[data.offsets[k] : data.offsets[k + 1]], data.y[data.offsets[k] : data.offsets[k + 1]]
        member = eng.model.module.members[a]  # type: ignore[index]
        z = torch.func.functional_call(member, eng.parts[a].model.unflatten(w[block]), (x,), {"representation": True})
        assert z.shape[1] == eng.dim
        for c in range(3):
            torch.testing.assert_close(sums[i, c], z[y == c].sum(0))
            assert counts[i, c] == int((y == c).sum())


def test_assignment_fix_splits_in_proportions_and_system_follows_capacity() -> None:
    model = composite()
    spec = Architectures(members=[{"name": "mlp", "hidden": []}, {"name": "mlp", "hidden": [5]}], proportions=[1, 3])
    fixed = assign_members(spec, model, 8, 0, None)
    assert torch.bincount(fixed).tolist() == [2, 6]
    assert torch.equal(fixed, assign_members(spec, model, 8, 0, None))  # seeded
    system = Constant(capacity=Capacity(levels=[1.0, 0.5, 0.1], proportions=[1, 1, 1]))
    system.setup(30, 0)
    by_capacity = Architectures(members=spec.members, assignment="system", levels=[0.5, 1.0])
    members = assign_members(by_capacity, model, 30, 0, system.capacities())
    capacity = system.capacities()
    assert torch.equal(members[capacity == 1.0], torch.ones(int((capacity == 1.0).sum()), dtype=torch.long))
    assert bool((members[capacity < 1.0] == 0).all())  # 0.5 fits member 0; 0.1 fits none: the smallest
    with pytest.raises(ConfigError, match=r"set system\.capacity"):
        assign_members(by_capacity, model, 30, 0, None)


def test_default_levels_are_parameter_shares() -> None:
    model = composite()
    spec = Architectures(members=[{"name": "mlp", "hidden": []}, {"name": "mlp", "hidden": [5]}], assignment="system")
    system = Constant(capacity=Capacity(levels=[1.0, 0.9], proportions=[1, 1]))
    system.setup(10, 0)
    members = assign_members(
        spec, model, 10, 0, system.capacities()
    )  # member 0 is about 0.6 of member 1: 0.9 holds member 0
    assert torch.equal(members, (system.capacities() == 1.0).long())


def test_refusals_in_one_line() -> None:
    with pytest.raises(ConfigError, match="batch-norm running statistics"):
        ArchitectureEngine(composite([{"name": "resnet8"}], inputs=3 * 8 * 8), tiny_data([4], dim=192, classes=3))
    eng = engine()
    w, clients = eng.initial_params(), torch.arange(2)
    with pytest.raises(ConfigError, match="sends vectors of the model's size"):

        class Sized(Shift):
            def server_tensors(self) -> dict[str, torch.Tensor]:
                return {"c": torch.zeros(3)}

        eng.train(w, LocalPlan.uniform(clients, 1, 0.1, 4, terms=(Sized(),)), 0)
    masks = torch.ones(2, eng.model.size, dtype=torch.bool)
    with pytest.raises(ConfigError, match="sub-model"):
        eng.train(w, replace(LocalPlan.uniform(clients, 1, 0.1, 4), masks=masks), 0)
    with pytest.raises(ConfigError, match="in memory"):
        eng.place_client_state("disk", None)
    # a proximal term (no tensors of its own) is fine: it pulls each member towards its own received block
    eng.train(w, LocalPlan.uniform(clients, 1, 0.1, 4, terms=(Proximal(mu=0.1),)), 0)


def test_members_train_on_the_backends_of_their_kind() -> None:
    """An MLP member trains on the dense backend and a CNN member on conv, as the zoo's models do (`auto`)."""
    model = composite(
        [{"name": "mlp", "hidden": [5]}, {"name": "cnn_mnist", "channels": [2, 3], "hidden": 4}], inputs=16
    )
    eng = ArchitectureEngine(model, tiny_data([5, 6], dim=16, classes=3))
    eng.assign(torch.tensor([0, 1]))
    eng.train(eng.initial_params(), LocalPlan.uniform(torch.arange(2), 1, 0.1, 4), 0)
    assert [part.last_backend for part in eng.parts] == ["dense", "conv"]
    assert eng.last_backend == "dense+conv"


def test_the_clock_charges_each_client_its_own_architecture() -> None:
    """Sizes and personal parts per member, and the share of the largest member's FLOPs per sample: a 4-3 linear
    body and a 3-3 head (2·(12 + 9) + 6 = 48 FLOPs) against a 4-5-3 body and the head (2·(20 + 15 + 9) + 11 = 99)."""
    eng = engine()
    plan = LocalPlan.uniform(torch.tensor([1, 2]), 1, 0.1, 4, personal=Personal("x", ("body",)))
    size, personal, share = eng.clock_costs(plan)
    assert size.tolist() == [eng.blocks[1].stop - eng.blocks[1].start, eng.blocks[0].stop - eng.blocks[0].start]
    assert personal.tolist() == [20 + 5 + 15 + 3, 12 + 3]  # the bodies
    torch.testing.assert_close(share, torch.tensor([1.0, 48 / 99], dtype=torch.float64))
    _, none, _ = eng.clock_costs(replace(plan, personal=None))
    assert none.tolist() == [0, 0]
