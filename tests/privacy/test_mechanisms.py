"""Privacy mechanisms as registered components: a mechanism's client transform, server noise and release, run by
the generic wrapper (``algorithm: private``) and accounted by the generic ledger, against hand-computed numbers
and dp-accounting called directly; Laplace's pure ε; target ε and its refusals."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any, ClassVar

import dp_accounting as dp
import pytest
import torch
from pydantic import Field
from torch import nn

from fedhet.catalog import STRATEGIES
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.privacy import UpdateClip, add_noise, update_noise, update_norms
from fedhet.errors import ConfigError
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import RunState, resume, run
from fedhet.privacy.accounting import Release, epsilon
from fedhet.privacy.mechanisms import MECHANISMS, Mechanism
from fedhet.privacy.strategy import DP, Private
from fedhet.seeding import torch_gen
from helpers.hostile import assert_refused
from helpers.tiny import make_context, tiny_data

DELTA = 1e-5
SRC = Path(__file__).resolve().parents[2] / "src" / "fedhet"


@update_noise("test_laplace")
def _laplace(size: int, generator: torch.Generator) -> torch.Tensor:
    u = torch.rand(2, size, generator=generator)
    return torch.log1p(-u[1]) - torch.log1p(-u[0])


@MECHANISMS.register
class CentralGauss(Mechanism):
    """Clip on the clients, N(0, (zC max_k p_k)²) on the aggregate: every round a Gaussian release of z on the whole
    population (no amplification, add or remove)."""

    name: ClassVar[str] = "test_central_gauss"
    noise_key: ClassVar[str | None] = "algorithm.mechanism.noise_multiplier"
    clips_updates: ClassVar[bool] = True
    clip: float = 0.5
    noise_multiplier: float | None = None

    def client_transform(self, round_: int) -> UpdateClip:
        return UpdateClip(self.clip)

    def needs_weights(self) -> bool:
        return True

    def server_noise(self, round_: int, global_params: Any, result: Any, base: Any) -> torch.Tensor:
        std = self.z * self.clip * float(base.aggregation_weights(round_, result).max())
        return std * torch.randn(global_params.shape, generator=torch_gen(self.context.seed, "test-central", round_))

    def unit(self) -> Any:
        return "round"

    def release(self, z: float, n: int, shape: Any, settings: Any) -> Release:
        return Release(z, "none")


@MECHANISMS.register
class FixedLaplace(Mechanism):
    """Local Laplace noise of a fixed ε₀ per participation: nothing a target ε could set."""

    name: ClassVar[str] = "test_fixed_laplace"
    clips_updates: ClassVar[bool] = True
    epsilon0: float = Field(1.0, gt=0)
    clip: float = 0.1

    def client_transform(self, round_: int) -> UpdateClip:
        size = self.context.engine.initial_params().numel()
        return UpdateClip(self.clip, 2 * self.clip * math.sqrt(size) / self.epsilon0, "test_laplace")

    def release(self, z: float, n: int, shape: Any, settings: Any) -> Release:
        return Release(2 / self.epsilon0, "none", replace=True, kind="laplace")  # the accountant's z: 1/ε₀


def config(mechanism: Any, **changes: Any) -> Any:
    raw: dict[str, Any] = {
        "algorithm": {"name": "private", "base": "fedavg", "mechanism": mechanism},
        "dataset": "digits",
        "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
        "model": "logistic",
        "num_clients": 8,
        "clients_per_round": 3,
        "rounds": 3,
        "local": {"steps": 2, "lr": 0.1, "batch_size": 8},
        "seed": 2,
    }
    raw.update(changes)
    return parse_config(raw)


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def laplace_epsilon(noise: float, count: int) -> float:
    """dp-accounting's RDP composition of `count` Laplace releases, or basic composition's count/noise."""
    rdp = dp.rdp.RdpAccountant().compose(dp.SelfComposedDpEvent(dp.LaplaceDpEvent(noise), count))
    return min(count / noise, float(rdp.get_epsilon(DELTA)))


def test_a_laplace_release_is_the_smaller_of_basic_composition_and_dp_accountings() -> None:
    """ε₀ = 1/z per release: n releases are pure n·ε₀; at δ > 0 dp-accounting's RDP or PLD may be smaller."""
    assert epsilon(Release(2.0, "none", kind="laplace"), 1, DELTA) == pytest.approx(0.5)
    assert epsilon(Release(2.0, "none", replace=True, kind="laplace"), 3, DELTA) == pytest.approx(3.0)  # z/2
    many = epsilon(Release(4.0, "none", kind="laplace"), 400, DELTA)
    assert many == pytest.approx(laplace_epsilon(4.0, 400), rel=1e-9) and many < 400 / 4.0  # RDP wins over 100
    pld = dp.pld.PLDAccountant(value_discretization_interval=1e-3).compose(dp.LaplaceDpEvent(4.0), 400)
    assert epsilon(Release(4.0, "none", kind="laplace"), 400, DELTA, "pld") == pytest.approx(pld.get_epsilon(DELTA))
    assert epsilon(Release(4.0, "none", kind="laplace"), 0, DELTA) == 0.0


def test_local_noise_is_drawn_from_the_distribution_the_clip_names() -> None:
    """b · Laplace draws from client k's own stream (seed, key, round, k), added to its row."""
    params = torch.zeros(2, 5)
    add_noise(params, UpdateClip(1.0, 0.3, "test_laplace"), torch.tensor([4, 7]), 9, 2, "k")
    for i, k in enumerate([4, 7]):
        torch.testing.assert_close(params[i], 0.3 * _laplace(5, torch_gen(9, "k", 2, k)))
    with pytest.raises(ValueError, match="unknown local noise 'nope'"):
        UpdateClip(1.0, 0.3, "nope")
    with pytest.raises(TypeError, match="registered twice"):
        update_noise("test_laplace")(_laplace)


def test_the_wrapper_runs_the_mechanisms_client_transform_and_server_noise_by_hand() -> None:
    """w ← w − (mean_k Δ_k min(1, C/‖Δ_k‖) + zC/m ξ), ξ from the mechanism's stream, for a uniform mean."""
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    engine = Engine(model, tiny_data([6, 9, 4, 12], dim=3, classes=2, seed=1), backend="dense", seed=3)  # type: ignore[arg-type]
    strategy = Private(mechanism={"name": "test_central_gauss", "clip": 0.3, "noise_multiplier": 1.5})
    strategy.setup(make_context(engine, steps=4, lr=0.5, batch=4, m=4))
    w = engine.initial_params()
    clients = torch.arange(4)
    free = engine.train(w, strategy.ctx.local.plan(clients), 1)
    norms = update_norms(free.params, w)
    assert 0 < int((norms > 0.3).sum()) < 4
    clipped = (w - free.params) * (0.3 / norms).clamp(max=1).unsqueeze(1)
    xi = torch.randn(w.shape, generator=torch_gen(0, "test-central", 1))
    result = strategy.local_training(1, clients, w, lambda plan: engine.train(w, plan, 1))
    assert result.clipped is not None and result.clipped.tolist() == (norms > 0.3).tolist()
    expected = w - (clipped.mean(0) + 1.5 * 0.3 / 4 * xi)
    torch.testing.assert_close(strategy.aggregate(1, w, result), expected, atol=1e-6, rtol=1e-5)
    assert strategy.configure(1, clients, w).clip == UpdateClip(0.3)


def test_a_round_mechanisms_epsilon_after_each_round_is_dp_accountings(tmp_path: Path) -> None:
    run(config({"name": "test_central_gauss", "noise_multiplier": 1.3}), tmp_path / "r")
    for row in rows(tmp_path / "r/metrics.csv"):
        rdp = dp.rdp.RdpAccountant().compose(dp.SelfComposedDpEvent(dp.GaussianDpEvent(1.3), int(row["round"])))
        assert float(row["dp_test_central_gauss_epsilon"]) == pytest.approx(rdp.get_epsilon(DELTA), rel=1e-9)
    summary = json.loads((tmp_path / "r/summary.json").read_text())["privacy"]
    last = float(row["dp_test_central_gauss_epsilon"])
    assert summary["test_central_gauss"] == {"epsilon": pytest.approx(last), "noise_multiplier": 1.3}
    clients = rows(tmp_path / "r/clients.csv")
    assert sum(int(c["dp_rounds"]) for c in clients) == 3 * 3 and "dp_test_central_gauss_epsilon" not in clients[0]


def test_a_participation_mechanism_accounts_each_clients_own_rounds(tmp_path: Path) -> None:
    """Pure ε₀ = 0.7 per participation: a client's ε after n rounds is min(0.7n, dp-accounting's Laplace)."""
    state = run(config({"name": "test_fixed_laplace", "epsilon0": 0.7}, rounds=4), tmp_path / "r")
    clients = rows(tmp_path / "r/clients.csv")
    for client in clients:
        n = int(client["dp_rounds"])
        expected = laplace_epsilon(1 / 0.7, n) if n else 0.0
        assert float(client["dp_test_fixed_laplace_epsilon"]) == pytest.approx(expected, rel=1e-9)
    worst = max(float(c["dp_test_fixed_laplace_epsilon"]) for c in clients)
    assert state.final["dp_test_fixed_laplace_epsilon"] == pytest.approx(worst) and worst > 0
    summary = json.loads((tmp_path / "r/summary.json").read_text())["privacy"]
    assert summary["test_fixed_laplace"]["epsilon"] == pytest.approx(worst)


def test_a_target_epsilon_sets_the_first_mechanisms_noise(tmp_path: Path) -> None:
    state = run(config("test_central_gauss", privacy={"target_epsilon": 5.0}), tmp_path / "r")
    assert state.final["dp_test_central_gauss_epsilon"] == pytest.approx(5.0, rel=0.01)
    assert state.final["dp_test_central_gauss_epsilon"] <= 5.0 + 1e-9


@pytest.mark.parametrize(
    ("mechanism", "fragment"),
    [
        ("test_fixed_laplace", "and 'test_fixed_laplace' has none to set"),
        ("{name: test_central_gauss, noise_multiplier: 2}", "give algorithm.mechanism.noise_multiplier or privacy"),
        ("nope", "unknown privacy mechanism 'nope'"),
        ("dp_sgd", "set local.dp_sgd, not a mechanism"),
    ],
)
def test_a_target_the_mechanism_cannot_meet_is_refused_in_one_line(
    mechanism: str, fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["run", "--dataset", "digits", "--rounds", "2", "--set", "num_clients=6", "--quiet"]
    args += ["--algorithm", "private", "--set", f"algorithm.mechanism={mechanism}", "--target-epsilon", "3"]
    assert_refused([*args, "--out", "r"], fragment, tmp_path)


@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
def test_local_gaussian_is_dp_with_local_noise_on_the_bases_selection(tmp_path: Path, sampling: str) -> None:
    """The built-in local mechanism under ``private`` gives dp's numbers (noise: local, fixed clipping): the same
    clipped, noised updates, the same ε per client (with dp's fixed sampling, the base's cohort)."""
    mechanism = {"name": "local_gaussian", "clip": 0.5, "noise_multiplier": 2.0}
    run(config(mechanism), tmp_path / "private")
    dp_spec = {"name": "dp", "base": "fedavg", "clip": 0.5, "noise_multiplier": 2.0, "noise": "local"}
    run(config({}, algorithm={**dp_spec, "sampling": sampling}), tmp_path / "dp")
    private, dp_rows = rows(tmp_path / "private/clients.csv"), rows(tmp_path / "dp/clients.csv")
    if sampling == "fixed":
        for a, b in zip(private, dp_rows, strict=True):
            assert a["dp_local_gaussian_epsilon"] == b["dp_epsilon"] and a["test_loss"] == b["test_loss"]
    z = 2.0 / 2  # replace-one: the accountant's multiplier z/2
    for client in private:
        n = int(client["dp_rounds"])
        event = dp.SelfComposedDpEvent(dp.GaussianDpEvent(z), n)
        expected = dp.rdp.RdpAccountant().compose(event).get_epsilon(DELTA) if n else 0.0
        assert float(client["dp_local_gaussian_epsilon"]) == pytest.approx(expected, rel=1e-9)
    assert STRATEGIES.build("private").privacy_mechanism().name == "local_gaussian"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"name": "private", "base": "dp"}, "the base of private runs a privacy mechanism of its own ('dp')"),
        ({"name": "dp", "base": "private"}, "the base of dp runs a privacy mechanism of its own ('private')"),
        ({"name": "private", "base": "fedbuff"}, "'fedbuff' is asynchronous"),
    ],
)
def test_a_base_the_wrapper_cannot_run_a_mechanism_on_is_refused(spec: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        STRATEGIES.build(spec)


def test_the_dp_wrapper_is_a_mechanism_and_the_ledger_names_none() -> None:
    """Client-level DP is one mechanism among others; the generic layers know mechanisms only by their hooks."""
    assert isinstance(DP(), Mechanism) and DP().privacy_mechanism() is not None
    for path in ["privacy/ledger.py", "engine/engine.py", "strategies/base.py", "strategies/wrapper.py"]:
        text = (SRC / path).read_text()
        assert not re.search(r"\bgsnr\b|isinstance\([^)]*\bDP\b|\bDP\(|import DP\b", text), path


class Interrupt(Callback):
    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        if state.round == 3:
            raise KeyboardInterrupt
        return False


def test_a_resumed_run_of_a_plugin_mechanism_writes_the_files_of_an_uninterrupted_one(tmp_path: Path) -> None:
    local = {"steps": 2, "lr": 0.1, "batch_size": 8, "dp_sgd": {"clip": 2.0, "noise_multiplier": 3.0}}
    cfg = config({"name": "test_fixed_laplace", "epsilon0": 2.0}, rounds=5, local=local, checkpoint_every=2)
    run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut", callbacks=[Interrupt()])
    resume(tmp_path / "cut")
    for name in ("metrics.csv", "clients.csv"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "full" / name).read_bytes(), name
    summaries = [json.loads((tmp_path / f / "summary.json").read_text())["privacy"] for f in ("cut", "full")]
    assert summaries[0] == summaries[1] and set(summaries[0]) >= {"test_fixed_laplace", "example"}
