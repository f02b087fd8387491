"""A DP run's accounting: ε after each round against dp-accounting called directly, target ε, refusals, the cost
by client group, DP-SGD's per-client ε, and a resumed run's identical files."""

from __future__ import annotations

import builtins
import csv
import json
import math
from pathlib import Path
from typing import Any

import dp_accounting as dp
import pytest
import torch

from fedhet.errors import ConfigError
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import RunState, resume, run
from fedhet.privacy.ledger import group_mean, size_quartiles, worst_pairs

DELTA = 1e-5


def config(algorithm: Any = None, **changes: Any) -> Any:
    raw: dict[str, Any] = {
        "algorithm": algorithm
        or {"name": "dp", "base": "fedavg", "clip": 0.5, "noise_multiplier": 1.2, "sampling": "fixed"},
        "dataset": "digits",
        "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
        "model": "logistic",
        "num_clients": 12,
        "clients_per_round": 4,
        "rounds": 4,
        "local": {"steps": 3, "lr": 0.1, "batch_size": 8},
        "seed": 1,
    }
    raw.update(changes)
    return parse_config(raw)


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def direct(event: Any, relation: Any = None, accountant: str = "rdp") -> float:
    if accountant == "pld":
        return float(dp.pld.PLDAccountant(value_discretization_interval=1e-3).compose(event).get_epsilon(DELTA))
    kwargs = {} if relation is None else {"neighboring_relation": relation}
    return float(dp.rdp.RdpAccountant(**kwargs).compose(event).get_epsilon(DELTA))


def test_epsilon_after_each_round_is_dp_accountings_for_fixed_size_sampling(tmp_path: Path) -> None:
    """4 of 12 clients without replacement, noise 1.2 C: replace-one, the accountant's multiplier 0.6."""
    run(config(), tmp_path / "r")
    for row in rows(tmp_path / "r/metrics.csv"):
        t = int(row["round"])
        event = dp.SelfComposedDpEvent(dp.SampledWithoutReplacementDpEvent(12, 4, dp.GaussianDpEvent(0.6)), t)
        assert float(row["dp_epsilon"]) == pytest.approx(direct(event, dp.NeighboringRelation.REPLACE_ONE), rel=1e-9)
    summary = json.loads((tmp_path / "r/summary.json").read_text())
    assert summary["privacy"]["client"]["epsilon"] == pytest.approx(float(row["dp_epsilon"]))
    assert summary["privacy"]["delta"] == DELTA


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_epsilon_after_each_round_is_dp_accountings_for_poisson_sampling(tmp_path: Path, accountant: str) -> None:
    algorithm = {"name": "dp", "base": "fedavg", "clip": 0.5, "noise_multiplier": 1.2, "sampling": "poisson"}
    run(config(algorithm, privacy={"accountant": accountant}), tmp_path / "r")
    for row in rows(tmp_path / "r/metrics.csv"):
        event = dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(4 / 12, dp.GaussianDpEvent(1.2)), int(row["round"]))
        assert float(row["dp_epsilon"]) == pytest.approx(direct(event, accountant=accountant), rel=1e-9)


def test_local_noise_counts_each_clients_own_rounds(tmp_path: Path) -> None:
    algorithm = {"name": "dp", "base": "fedavg", "clip": 0.5, "noise_multiplier": 3.0, "noise": "local"}
    run(config({**algorithm, "sampling": "fixed"}), tmp_path / "r")
    clients = rows(tmp_path / "r/clients.csv")
    worst = 0.0
    for client in clients:
        n = int(client["dp_rounds"])
        expected = direct(dp.SelfComposedDpEvent(dp.GaussianDpEvent(1.5), n)) if n else 0.0
        assert float(client["dp_epsilon"]) == pytest.approx(expected, rel=1e-9)
        worst = max(worst, expected)
    assert sum(int(c["dp_rounds"]) for c in clients) == 4 * 4
    assert float(rows(tmp_path / "r/metrics.csv")[-1]["dp_epsilon"]) == pytest.approx(worst)


@pytest.mark.parametrize("sampling", [pytest.param("fixed", marks=pytest.mark.slow), "poisson"])
def test_a_target_epsilon_sets_the_noise_before_the_run_within_one_percent(tmp_path: Path, sampling: str) -> None:
    algorithm = {"name": "dp", "base": "fedavg", "clip": 0.5, "sampling": sampling}
    state = run(config(algorithm, privacy={"target_epsilon": 3.0}), tmp_path / "r")
    assert state.final["dp_epsilon"] == pytest.approx(3.0, rel=0.01) and state.final["dp_epsilon"] <= 3.0 + 1e-9
    summary = json.loads((tmp_path / "r/summary.json").read_text())
    assert summary["privacy"]["client"]["noise_multiplier"] == pytest.approx(state.final["dp_noise_multiplier"])
    assert "target_epsilon: 3.0" in (tmp_path / "r/config.yaml").read_text()


@pytest.mark.parametrize(
    ("algorithm", "dp_sgd", "key"),
    [
        pytest.param("fedavg", {"clip": 1.0}, "example", marks=pytest.mark.slow),
        ({"name": "dp", "base": "fedavg", "clip": 0.5, "noise": "local"}, None, "client"),
        ({"name": "dp", "base": "fedavg", "clip": 0.5, "noise": "local", "sampling": "fixed"}, None, "client"),
    ],
    ids=["dp-sgd", "local noise, poisson", "local noise, fixed"],
)
def test_a_target_epsilon_lands_on_the_target_with_a_part_of_the_clients_a_round(
    tmp_path: Path, algorithm: Any, dp_sgd: Any, key: str
) -> None:
    """4 of 12 clients a round for 6 rounds: each client's ε counts the rounds it took part in, and the target
    calibrates for the most frequent participant's (drawn before the run), not for one in every round."""
    local = {"steps": 3, "lr": 0.1, "batch_size": 8, **({"dp_sgd": dp_sgd} if dp_sgd else {})}
    run(config(algorithm, local=local, rounds=6, privacy={"target_epsilon": 4.0}), tmp_path / "r")
    clients = rows(tmp_path / "r/clients.csv")
    assert max(int(c["dp_rounds"] if key == "client" else c["dp_sgd_steps"]) for c in clients) < 6 * (
        1 if key == "client" else 3
    )  # nobody took part in every round: a calibration for that would land below the target
    summary = json.loads((tmp_path / "r/summary.json").read_text())["privacy"]
    assert summary["target_epsilon"] == 4.0
    assert 4.0 * 0.995 <= summary[key]["epsilon"] <= 4.0 + 1e-9


def test_a_target_epsilon_with_a_noise_multiplier_or_without_a_mechanism_is_refused() -> None:
    with pytest.raises(ConfigError, match="not both"):
        run(config(privacy={"target_epsilon": 3.0}))
    with pytest.raises(ConfigError, match="sets the noise of a DP mechanism, and this run has none"):
        run(config("fedavg", privacy={"target_epsilon": 3.0}))


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"availability": {"name": "markov", "pi": 0.5}}, "availability 'markov' decides who can be sampled"),
        ({"availability": "appeal"}, "availability 'appeal' decides who can be sampled"),  # MaxFL's opt-outs
        (
            {"algorithm": {"name": "dp", "base": "cafed", "noise_multiplier": 1.0, "sampling": "fixed"}},
            "strategy 'cafed' chooses its clients",
        ),
        ({"attack": {"name": "malicious", "fraction": 0.2}}, "attack 'malicious' changes who takes part"),
        (  # refused by configuration: this deadline is long enough that nobody is late
            {"system": "lognormal", "deadline": {"seconds": 1e6, "policy": "drop"}},
            "the round's deadline leaves slow clients out",
        ),
    ],
)
def test_a_sample_the_accountant_does_not_assume_is_refused_unless_accepted(
    tmp_path: Path, changes: dict, reason: str
) -> None:
    changes = dict(changes)
    algorithm = changes.pop("algorithm", {"name": "dp", "base": "fedavg", "noise_multiplier": 1.0, "sampling": "fixed"})
    with pytest.raises(ConfigError, match=f"uniform sample of clients each round, but {reason}.*amplification: false"):
        run(config(algorithm, **changes))
    if algorithm["base"] == "cafed":  # no declared weights for central noise: with local noise any base runs
        algorithm = {**algorithm, "noise": "local"}
    state = run(config(algorithm, privacy={"amplification": False}, rounds=2, **changes), tmp_path / "ok")
    # without amplification each round counts in full: a Gaussian of multiplier z/2 (replace-one), twice
    expected = direct(dp.SelfComposedDpEvent(dp.GaussianDpEvent(0.5), 2))
    assert state.final["dp_epsilon"] == pytest.approx(expected, rel=1e-9)


def test_dp_sgd_accounts_each_client_at_its_own_sampling_rate(tmp_path: Path) -> None:
    local = {"steps": 3, "lr": 0.1, "batch_size": 8, "dp_sgd": {"clip": 1.0, "noise_multiplier": 1.1}}
    run(config("fedavg", local=local, num_clients=6), tmp_path / "r")
    clients = rows(tmp_path / "r/clients.csv")
    for client in clients:
        n, steps = int(client["train_samples"]), int(client["dp_sgd_steps"])
        event = dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(min(1.0, 8 / n), dp.GaussianDpEvent(1.1)), steps)
        assert float(client["dp_sgd_epsilon"]) == pytest.approx(direct(event) if steps else 0.0, rel=1e-9)
    assert sum(int(c["dp_sgd_steps"]) for c in clients) == 4 * 4 * 3
    worst = max(float(c["dp_sgd_epsilon"]) for c in clients)
    assert float(rows(tmp_path / "r/metrics.csv")[-1]["dp_sgd_epsilon"]) == pytest.approx(worst)


def test_dp_sgd_with_shuffled_batches_counts_a_batch_per_pass_in_full(tmp_path: Path) -> None:
    dp_sgd = {"clip": 1.0, "noise_multiplier": 2.0, "sampling": "shuffle"}
    local = {"steps": 7, "lr": 0.1, "batch_size": 8, "dp_sgd": dp_sgd}
    run(config("fedavg", local=local, rounds=2), tmp_path / "r")
    for client in rows(tmp_path / "r/clients.csv"):
        n, taken = int(client["train_samples"]), int(client["dp_sgd_steps"])
        rounds = taken // -(-7 // max(1, n // min(8, n)))  # passes a round: ⌈7 / ⌊n/8⌋⌉
        assert taken == rounds * -(-7 // max(1, n // min(8, n)))
        expected = direct(dp.SelfComposedDpEvent(dp.GaussianDpEvent(1.0), taken)) if taken else 0.0
        assert float(client["dp_sgd_epsilon"]) == pytest.approx(expected, rel=1e-9)


@pytest.mark.slow
def test_a_dp_sgd_target_calibrates_for_a_client_in_every_round(tmp_path: Path) -> None:
    local = {"steps": 3, "lr": 0.1, "batch_size": 8, "dp_sgd": {"clip": 1.0}}
    state = run(
        config("fedavg", local=local, num_clients=6, clients_per_round=6, privacy={"target_epsilon": 4.0}),
        tmp_path / "r",
    )
    assert state.final["dp_sgd_epsilon"] == pytest.approx(4.0, rel=0.01)


def test_a_dp_run_without_dp_accounting_fails_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    real = builtins.__import__

    def no_dp(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "dp_accounting" or name.startswith("dp_accounting."):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_dp)
    with pytest.raises(ConfigError, match=r"dp-accounting .*pip install 'fedhet\[privacy\]'") as err:
        run(config())
    assert "\n" not in str(err.value)
    run(config("fedavg", rounds=1))  # a run without DP does not need it


def test_only_undominated_clients_can_be_the_worst() -> None:
    """ε grows with the rate B/n and the count: (20, 5) is no worse than (10, 5), nor (40, 9) than (30, 9)."""
    assert worst_pairs({(10, 5), (20, 5), (5, 3), (30, 9), (30, 2), (40, 9)}) == [(5, 3), (10, 5), (30, 9)]


def test_size_quartiles_and_group_means_by_hand() -> None:
    sizes = torch.tensor([5, 50, 7, 20, 9, 3, 100, 8, 1])
    seen = torch.tensor([True] * 8 + [False])
    assert size_quartiles(sizes, seen).tolist() == [1, 4, 2, 3, 3, 1, 4, 2, 0]
    accuracy = torch.tensor([0.1, 0.9, float("nan"), 0.5, 0.7, 0.3, 0.8, 0.2, 1.0])
    assert group_mean(accuracy, size_quartiles(sizes, seen) == 2) == pytest.approx(0.2)  # the NaN is not scored
    assert math.isnan(group_mean(accuracy, torch.zeros(9, dtype=torch.bool)))  # an empty group


def test_the_cost_across_clients_is_in_the_metrics_and_clients_csv(tmp_path: Path) -> None:
    algorithm = {"name": "dp", "base": "fedavg", "clip": 0.2, "noise_multiplier": 0.5}
    state = run(config(algorithm, rounds=6), tmp_path / "r")
    clients = rows(tmp_path / "r/clients.csv")
    for client in clients:
        taken, clipped = int(client["dp_rounds"]), int(client["dp_clipped"])
        assert 0 <= clipped <= taken and 1 <= int(client["size_quartile"]) <= 4
        if taken:
            assert float(client["dp_clip_rate"]) == pytest.approx(clipped / taken)
    often = [c for c in clients if int(c["dp_rounds"]) and 2 * int(c["dp_clipped"]) >= int(c["dp_rounds"])]
    trained = [c for c in clients if int(c["dp_rounds"])]
    assert state.final["dp_clipped_often"] == pytest.approx(len(often) / len(trained))
    if often:
        mean = sum(float(c["test_accuracy"]) for c in often) / len(often)
        assert state.final["test_accuracy_clipped_often"] == pytest.approx(mean)
    q4 = [float(c["test_accuracy"]) for c in clients if c["size_quartile"] == "4"]
    assert state.final["test_accuracy_size_q4"] == pytest.approx(sum(q4) / len(q4))
    assert "test_accuracy_worst10" in state.final


class Interrupt(Callback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        if state.round == self.at:
            raise KeyboardInterrupt
        return False


@pytest.mark.parametrize(
    "algorithm",
    [
        {"name": "dp", "base": "fedavg", "clip": 0.1, "clipping": "adaptive", "noise_multiplier": 0.1},
        {"name": "dp", "base": "fedavg", "clip": 0.5, "noise_multiplier": 1.0, "noise": "local", "sampling": "poisson"},
    ],
    ids=["adaptive-central", "local-poisson"],
)
def test_a_resumed_dp_run_writes_the_files_of_an_uninterrupted_one(tmp_path: Path, algorithm: dict) -> None:
    local = {"steps": 3, "lr": 0.1, "batch_size": 8, "dp_sgd": {"clip": 2.0, "noise_multiplier": 3.0}}
    cfg = config(algorithm, rounds=5, local=local, checkpoint_every=2)
    run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut", callbacks=[Interrupt(at=3)])
    resume(tmp_path / "cut")
    for name in ("metrics.csv", "clients.csv"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "full" / name).read_bytes(), name
    summaries = [json.loads((tmp_path / f / "summary.json").read_text()) for f in ("cut", "full")]
    assert summaries[0]["privacy"] == summaries[1]["privacy"]
    assert summaries[0]["final"] == summaries[1]["final"]
