"""FedProto: prototype aggregation (eq. 6) and one local step with the prototype term (eq. 8), by hand."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedhet.catalog import STRATEGIES
from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.errors import ConfigError, FedhetNote
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.strategies.fedproto import PERSONAL, FedProto, PrototypeTerm, global_prototypes
from helpers.architectures import context, engine
from helpers.tiny import linear_model, make_context, tiny_data


def test_global_prototypes_two_clients_by_hand() -> None:
    """Client 1: class 0 twice, sum (2, 4) (prototype (1, 2)); client 2: class 0 once (3, 0), class 1 once (1, 1)."""
    sums = torch.tensor([[[2.0, 4.0], [0.0, 0.0], [0.0, 0.0]], [[3.0, 0.0], [1.0, 1.0], [0.0, 0.0]]])
    counts = torch.tensor([[2.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    weighted, present = global_prototypes(sums, counts)
    torch.testing.assert_close(weighted[0], torch.tensor([5 / 3, 4 / 3]))  # (2·(1, 2) + 1·(3, 0)) / 3
    torch.testing.assert_close(weighted[1], torch.tensor([1.0, 1.0]))
    assert present.tolist() == [True, True, False]
    uniform, _ = global_prototypes(sums, counts, "uniform")
    torch.testing.assert_close(uniform[0], torch.tensor([2.0, 1.0]))  # ((1, 2) + (3, 0)) / 2
    torch.testing.assert_close(uniform[1], torch.tensor([1.0, 1.0]))


def test_one_local_step_with_the_prototype_term_by_hand() -> None:
    """Two clients of two architectures, one full-batch step each: θ ← θ − η ∇(CE + λ mean_b mean_d (z_b −
    C̄_{y_b})²·[y_b has C̄]), with z = ReLU(A x + a) (client 0) and z = ReLU(B ReLU(A x + a) + c) (client 1),
    logits = H z + h, written out."""
    eng = engine(members=[0, 1], sizes=[4, 3])
    w = eng.initial_params()
    prototypes = torch.tensor([[0.5, -0.2, 0.1], [0.3, 0.3, 0.3], [0.0, 0.0, 0.0]])
    present = torch.tensor([True, True, False])
    lam, lr = 2.0, 0.3
    term = PrototypeTerm(lam=lam).with_prototypes(prototypes, present)
    plan = LocalPlan.uniform(torch.tensor([0, 1]), 1, lr, 4, terms=(term,), personal=PERSONAL)
    eng.train(w, plan, 0)
    trained = eng.personal_starts(w, replace(plan, phase=1), 0)
    assert trained is not None
    data = eng.data.train

    def body0(x: torch.Tensor, t: list[torch.Tensor]) -> torch.Tensor:
        return torch.relu(x @ t[0].T + t[1])

    def body1(x: torch.Tensor, t: list[torch.Tensor]) -> torch.Tensor:
        return torch.relu(torch.relu(x @ t[0].T + t[1]) @ t[2].T + t[3])

    for k, body in enumerate((body0, body1)):
        block = eng.blocks[k]
        theta = [t.clone().requires_grad_(True) for t in eng.parts[k].model.unflatten(w[block]).values()]
        x, y = data.x[data.offsets[k] : data.offsets[k + 1]], data.y[data.offsets[k] : data.offsets[k + 1]]
        z = body(x, theta[:-2])
        loss = F.cross_entropy(z @ theta[-2].T + theta[-1], y)
        loss = loss + lam * (((z - prototypes[y]) ** 2).mean(1) * present[y].float()).mean()
        grads = torch.autograd.grad(loss, theta)
        expected = torch.cat([(t - lr * g).reshape(-1) for t, g in zip(theta, grads, strict=True)]).detach()
        torch.testing.assert_close(trained[k, block], expected, atol=1e-6, rtol=1e-5)
        other = eng.blocks[1 - k]
        assert torch.equal(trained[k, other], w[other])  # the other architecture: untouched


def test_the_term_is_zero_without_prototypes_so_round_one_is_local_training() -> None:
    eng_a, eng_b = engine(), engine()
    proto = FedProto(lam=5.0)
    proto.setup(context(eng_a))
    w, clients = eng_a.initial_params(), torch.arange(4)
    proto.local_training(0, clients, w, lambda plan: eng_a.train(w, plan, 0))
    plain = LocalPlan.uniform(clients, 2, 0.1, 4, personal=PERSONAL)
    eng_b.train(w, plain, 0)
    later = replace(plain, steps=torch.zeros(4, dtype=torch.long), phase=1)
    torch.testing.assert_close(eng_a.personal_starts(w, later, 0), eng_b.personal_starts(w, later, 0))


def test_a_round_sets_the_global_prototypes_from_the_trained_models() -> None:
    eng = engine()
    proto = FedProto()
    proto.setup(context(eng))
    w, clients = eng.initial_params(), torch.tensor([0, 1, 3])
    result = proto.local_training(0, clients, w, lambda plan: eng.train(w, plan, 0))
    assert torch.equal(proto.aggregate(0, w, result), w)  # no weights shared
    after = LocalPlan.uniform(clients, 0, 0.1, 4, personal=PERSONAL, phase=1)
    sums, counts = eng.representations(w, after, 0)  # the trained models' representations
    expected = sums.sum(0) / counts.sum(0).clamp_min(1).unsqueeze(-1)
    prototypes, present = proto.prototypes
    torch.testing.assert_close(prototypes[present], expected[counts.sum(0) > 0])
    assert proto.round_metrics()["prototype_classes"] == float((counts.sum(0) > 0).sum())
    # kept in a checkpoint
    again = FedProto()
    again.setup(context(engine()))
    again.load_state_dict(proto.state_dict())
    torch.testing.assert_close(again.prototypes[0], prototypes)
    # a class no client of the next round holds keeps its prototype
    empty = replace(result, clients=torch.tensor([2]))
    proto._counts = torch.zeros_like(proto._counts)  # type: ignore[arg-type]
    proto.aggregate(1, w, empty)
    torch.testing.assert_close(proto.prototypes[0], prototypes)


def test_sequential_and_vectorised_agree() -> None:
    out = []
    for backend in ("sequential", "vectorised"):
        eng = engine(backend=backend)
        proto = FedProto()
        proto.setup(context(eng))
        w, clients = eng.initial_params(), torch.arange(4)
        for t in range(2):

            def train(plan: LocalPlan, t: int = t, eng: Engine = eng, w: torch.Tensor = w) -> LocalResult:
                return eng.train(w, plan, t)

            proto.aggregate(t, w, proto.local_training(t, clients, w, train))
        out.append(proto.prototypes[0])
    torch.testing.assert_close(out[0], out[1], atol=1e-5, rtol=1e-5)


def test_a_model_without_architectures_is_refused() -> None:
    plain = Engine(linear_model(3, 2), tiny_data([4, 5]))
    with pytest.raises(ConfigError, match="use model: architectures"):
        FedProto().setup(make_context(plain))


def test_nearest_prototype_inference_by_hand() -> None:
    """Each test sample is given the class of the nearest global prototype among those present."""
    eng = engine()
    proto = FedProto(prototype_accuracy=True)
    ctx = context(eng)
    proto.setup(ctx)
    w, clients = eng.initial_params(), torch.arange(4)
    proto.aggregate(0, w, proto.local_training(0, clients, w, lambda plan: eng.train(w, plan, 0)))
    proto._present = torch.tensor([True, False, True])  # class 1 has no prototype: never predicted
    got = proto.nearest_prototype_accuracy(0, w, clients)
    prototypes = proto.prototypes[0]
    data = eng.data.test
    after = eng.personal_starts(w, replace(proto.personalization(clients), phase=1), 0)
    assert after is not None
    for k in range(4):
        a = int(eng.members[k])
        x, y = data.x[data.offsets[k] : data.offsets[k + 1]], data.y[data.offsets[k] : data.offsets[k + 1]]
        z = eng.parts[a].model.representation(eng.parts[a].model.unflatten(after[k, eng.blocks[a]]), x)
        d0, d2 = ((z - prototypes[0]) ** 2).sum(1), ((z - prototypes[2]) ** 2).sum(1)
        predicted = torch.where(d0 <= d2, 0, 2)
        assert float(got[k]) == pytest.approx(float((predicted == y).float().mean()))
    ctx.params, ctx.round = w, 0
    assert proto.round_metrics()["personal_test_accuracy_prototypes"] == pytest.approx(float(got.mean()))


@pytest.mark.parametrize("name", ["fedproto", "fedgh", "feddf"])
@pytest.mark.parametrize("setting", [{"server_lr": 0.5}, {"server_optimizer": "adam"}])
def test_a_server_step_is_refused_not_ignored(name: str, setting: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="takes no server step"):
        STRATEGIES.build({"name": name, **setting}, where="algorithm")


def test_a_config_without_a_model_trains_three_architectures_and_says_so(tmp_path: Path) -> None:
    """`fedhet run --algorithm fedproto` on its own trains three MLPs of different widths (any input shape)."""
    with pytest.warns(FedhetNote, match=r"trains model \{name: architectures, members: .*hidden: \[128, 64\]"):
        state = run(
            parse_config({"algorithm": "fedproto", "num_clients": 6, "clients_per_round": 3, "rounds": 1}),
            tmp_path / "r",
        )
    assert len(state.experiment.engine.parts) == 3  # type: ignore[attr-defined]
    assert "name: architectures" in (tmp_path / "r/config.yaml").read_text()
