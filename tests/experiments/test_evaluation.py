"""Sampled evaluation (``eval_clients``): what is scored, what it changes (nothing in training), and resumes."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from fedhet.data.dataset import ClientData
from fedhet.engine.evaluate import ClientScores
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.config import dump_yaml, parse_config
from fedhet.experiments.evaluation import evaluate_global, evaluation_sample, group_accuracy, spread_scores
from fedhet.experiments.runner import RunState, resume, run

CONFIG: dict[str, Any] = {
    "dataset": "digits",
    "num_clients": 12,
    "unseen_clients": 3,
    "clients_per_round": 4,
    "rounds": 4,
    "model": {"name": "mlp", "hidden": [8]},
    "local": {"steps": 2},
    "seed": 5,
}


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


class Interrupt(Callback):
    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        if state.round == 2:
            raise KeyboardInterrupt
        return False


def test_the_sample_is_seeded_sorted_and_off_at_zero_or_everyone() -> None:
    first = evaluation_sample(100, 10, seed=3, round_=7)
    assert first is not None and len(first) == 10 and len(set(first.tolist())) == 10
    assert first.tolist() == sorted(first.tolist()) and int(first.max()) < 100
    assert torch.equal(first, evaluation_sample(100, 10, seed=3, round_=7))  # type: ignore[arg-type]
    assert not torch.equal(first, evaluation_sample(100, 10, seed=3, round_=8))  # type: ignore[arg-type]
    assert evaluation_sample(100, 0, 3, 7) is None and evaluation_sample(100, 100, 3, 7) is None


def test_select_gathers_the_rows_of_the_chosen_clients_in_order() -> None:
    data = ClientData.from_parts(
        [torch.full((n, 1), float(k)) for k, n in enumerate((2, 0, 3, 1))],
        [torch.full((n,), k) for k, n in enumerate((2, 0, 3, 1))],
    )
    chosen = data.select(torch.tensor([3, 1, 0]))
    assert chosen.offsets.tolist() == [0, 1, 1, 3]
    assert chosen.y.tolist() == [3, 0, 0] and chosen.x.flatten().tolist() == [3.0, 0.0, 0.0]


def test_sampled_evaluation_is_full_evaluation_restricted_to_the_sample() -> None:
    cfg = parse_config(CONFIG)
    state = run(cfg)
    engine, params = state.experiment.engine, state.params
    full, full_columns, full_test, _ = evaluate_global(engine, params)
    seen_ids = torch.nonzero(engine.data.seen).flatten()
    unseen_id = torch.nonzero(~engine.data.seen).flatten()[0]
    sample = torch.cat([seen_ids[[0, 2, 5, 7]], unseen_id.reshape(1)]).sort().values
    metrics, columns, test, train = evaluate_global(engine, params, sample)
    torch.testing.assert_close(test.loss[sample], full_test.loss[sample])
    others = torch.ones(engine.data.num_clients, dtype=torch.bool)
    others[sample] = False
    assert bool(test.loss[others].isnan().all()) and bool(train.accuracy[others].isnan().all())
    seen = seen_ids[[0, 2, 5, 7]]
    assert metrics["evaluated"] == 4.0 and "evaluated" not in full
    assert metrics["test_accuracy"] == pytest.approx(float(full_columns["test_accuracy"][seen].double().mean()))
    assert metrics["train_loss"] == pytest.approx(float(full_columns["train_loss"][seen].double().mean()))
    assert metrics["unseen_test_loss"] == pytest.approx(float(full_test.loss[unseen_id]))
    assert columns["test_accuracy"][sample].tolist() == full_columns["test_accuracy"][sample].tolist()


def test_training_is_the_same_and_the_last_round_evaluates_everyone(tmp_path: Path) -> None:
    plain = run(parse_config(CONFIG), tmp_path / "all")
    sampled = run(parse_config({**CONFIG, "eval_clients": 5}), tmp_path / "some")
    assert torch.equal(plain.params, sampled.params)  # evaluation draws nothing from the training streams
    every, some = rows(tmp_path / "all/metrics.csv"), rows(tmp_path / "some/metrics.csv")
    assert [r["local_loss"] for r in every] == [r["local_loss"] for r in some]
    assert "evaluated" not in every[0]
    evaluated = [float(r["evaluated"]) for r in some]
    assert all(n <= 5 for n in evaluated[:-1]) and evaluated[-1] == 12.0  # the final round: every seen client
    assert some[-1]["test_accuracy"] == every[-1]["test_accuracy"]
    assert any(s["test_loss"] != e["test_loss"] for s, e in zip(some[:-1], every[:-1], strict=True))
    assert (tmp_path / "some/clients.csv").read_text() == (tmp_path / "all/clients.csv").read_text()
    assert "eval_clients: 5" in (tmp_path / "some/config.yaml").read_text()
    assert "eval_clients" not in dump_yaml(parse_config(CONFIG).model_dump())  # unused: config.yaml as before


def test_a_metric_plugin_that_needs_every_client_turns_sampling_off() -> None:
    state = run(parse_config({**CONFIG, "eval_clients": 5, "metrics": ["accuracy_percentiles"]}))
    assert all(row["evaluated"] == 12.0 for row in state.history)  # every round scored every seen client
    assert all(not math.isnan(row["test_accuracy"]) for row in state.history)


@pytest.mark.parametrize("plugin", ["improved_users", {"name": "contribution", "samples": 2}])
def test_plugins_that_measure_clients_themselves_leave_sampling_on(plugin: Any) -> None:
    state = run(parse_config({**CONFIG, "eval_clients": 5, "metrics": [plugin]}))
    assert all(row["evaluated"] <= 5 for row in state.history[:-1]) and state.history[-1]["evaluated"] == 12


def test_spread_scores_gives_unscored_clients_the_values_of_scored_ones() -> None:
    scores = ClientScores(
        torch.tensor([1.0, math.nan, 3.0, math.nan, math.nan]),
        torch.tensor([0.5, math.nan, 0.25, math.nan, math.nan]),
        torch.tensor([4, 0, 6, 0, 0]),
    )
    spread = spread_scores(scores, torch.tensor([0, 2]))
    assert spread.loss.tolist() == [1.0, 3.0, 3.0, 3.0, 1.0]  # scored clients keep their own; others in turn
    assert spread.accuracy.tolist() == [0.5, 0.25, 0.25, 0.25, 0.5] and spread.count.tolist() == [4, 6, 6, 6, 4]


def test_scoring_the_sample_only_feeds_plugins_finite_scores_and_trains_the_same() -> None:
    raw = {**CONFIG, "eval_clients": 5, "metrics": ["accuracy_percentiles", "alpha_accuracy"]}
    sampled = run(parse_config(raw), score_sample_only=True)
    full = run(parse_config(raw))
    assert all(row["evaluated"] <= 5 for row in sampled.history[:-1])  # seen clients among the 5 sampled
    assert sampled.history[-1]["evaluated"] == 12  # the last scores everyone
    assert all(
        math.isfinite(row["test_accuracy_p5"]) and math.isfinite(row["alpha_test_accuracy"]) for row in sampled.history
    )
    assert torch.equal(sampled.params, full.params)
    assert sampled.history[-1]["alpha_test_accuracy"] == full.history[-1]["alpha_test_accuracy"]


def test_a_resumed_sampled_run_ends_with_the_same_files(tmp_path: Path) -> None:
    cfg = parse_config({**CONFIG, "eval_clients": 4})
    run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut", callbacks=[Interrupt()])
    resume(tmp_path / "cut")
    for name in ("metrics.csv", "clients.csv"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "full" / name).read_bytes()


def _personal_run(algorithm: Any, **personal_eval: Any) -> RunState:
    return run(parse_config({**CONFIG, "algorithm": algorithm, "personal_eval": {"appeal": False, **personal_eval}}))


def test_personalised_evaluation_is_on_for_personalised_methods_and_on_request() -> None:
    assert "personal_test_accuracy" not in _personal_run("fedavg").final
    assert "personal_test_accuracy" not in _personal_run("ditto", enabled=False).final
    ditto = _personal_run("ditto")
    for key in ("personal_test_accuracy_worst10", "personal_test_loss", "unseen_personal_test_accuracy"):
        assert math.isfinite(ditto.final[key]), key
    plain = _personal_run("fedavg", enabled=True)  # no personal model, no fine-tuning: the global model itself
    assert plain.final["personal_test_accuracy"] == pytest.approx(plain.final["test_accuracy"], abs=1e-6)
    assert plain.final["personal_test_loss"] == pytest.approx(plain.final["test_loss"], rel=1e-5)


def test_fine_tuning_before_scoring_is_fedavg_plus_fine_tuning() -> None:
    tuned = _personal_run("fedavg", finetune_steps=5)
    named = _personal_run("fedavg_ft")  # its own default: 5 steps
    assert tuned.final["personal_test_accuracy"] == pytest.approx(named.final["personal_test_accuracy"], abs=1e-7)
    assert tuned.final["personal_test_loss"] != pytest.approx(tuned.final["test_loss"], rel=1e-3)
    assert tuned.final["unseen_personal_test_accuracy"] > 0  # unseen clients are tuned and scored too
    torch.testing.assert_close(tuned.client_columns["personal_test_loss"], named.client_columns["personal_test_loss"])


def test_personal_appeal_compares_with_each_client_s_local_model() -> None:
    state = run(parse_config({**CONFIG, "algorithm": "local_only", "requirements": {"steps": 4}, "rounds": 2}))
    rho = state.experiment.requirements
    assert rho is not None
    loss = state.client_columns["personal_test_loss"]
    seen = state.experiment.data.seen
    expected = float((loss[seen] < rho.rho[seen]).double().mean())
    assert state.final["personal_appeal"] == pytest.approx(expected)
    assert 0.0 <= state.final["unseen_personal_appeal"] <= 1.0


def test_personalised_evaluation_every_nth_evaluation_and_the_last() -> None:
    state = _personal_run("ditto", every=2)
    history = state.history
    assert "personal_test_accuracy" not in history[0] and "personal_test_accuracy" in history[1]
    assert "personal_test_accuracy" in history[-1]


def _constant_predictor() -> tuple[Any, torch.Tensor]:
    """An engine over two clients' regression targets, standardised by their training samples (10, 30, 10, 30: mean
    20, scale 10), and a linear model at zero: it predicts the standardised 0, the training mean 20."""
    from torch import nn

    from fedhet.data.arrays import standardise_targets
    from fedhet.data.dataset import FederatedData
    from fedhet.engine.engine import Engine
    from fedhet.engine.functional import FlatModel
    from fedhet.engine.task import Regression

    def part(ys: list[list[float]]) -> ClientData:
        return ClientData.from_parts([torch.ones(len(y), 1) for y in ys], [torch.tensor(y) for y in ys])

    raw = FederatedData(
        "t", part([[10.0, 30.0], [10.0, 30.0]]), part([[20.0, 50.0], [0.0]]), 1, torch.ones(2, dtype=torch.bool)
    )
    data = standardise_targets(replace(raw, task="regression"))
    engine = Engine(FlatModel(nn.Linear(1, 1), Regression()), data, backend="sequential", seed=0)
    return engine, torch.zeros(2)


def test_a_regression_reports_its_metrics_in_the_targets_units() -> None:
    """By hand: client 0's test targets 20 and 50 against the prediction 20 (errors 0, 30), client 1's 0 (error 20)."""
    engine, params = _constant_predictor()
    metrics, columns, test, _ = evaluate_global(engine, params)
    assert columns["test_loss"].tolist() == pytest.approx([450.0, 400.0], rel=1e-5)  # the squared error, not / 10²
    assert metrics["test_loss"] == pytest.approx(425.0, rel=1e-5)
    assert columns["test_mae"].tolist() == pytest.approx([15.0, 20.0], rel=1e-5)
    assert metrics["test_mae"] == pytest.approx(17.5, rel=1e-5)
    assert metrics["test_rmse"] == pytest.approx((450**0.5 + 20) / 2, rel=1e-5)
    assert metrics["test_r2"] == pytest.approx(-1.0, rel=1e-5)  # client 0 (mean 35); client 1's one target: none
    assert metrics["test_mae_pooled"] == pytest.approx(50 / 3, rel=1e-5)
    assert metrics["test_rmse_pooled"] == pytest.approx((1300 / 3) ** 0.5, rel=1e-5)
    assert metrics["test_r2_pooled"] == pytest.approx(1 - 1300 / (3800 / 3), rel=1e-5)  # scikit-learn's, pooled
    assert test.outputs is not None and test.outputs.flatten().tolist() == pytest.approx([20.0] * 3)
    # the engine itself stays in the units it trains in (the strategies' F_k, the requirements ρ_k)
    assert engine.losses_at(params, torch.tensor([0, 1]), "test").tolist() == pytest.approx([4.5, 4.0], rel=1e-5)


def test_personalised_losses_are_in_the_targets_units_too() -> None:
    from fedhet.engine.plan import LocalPlan
    from fedhet.experiments.evaluation import evaluate_personal

    engine, params = _constant_predictor()
    metrics, columns = evaluate_personal(engine, params, LocalPlan.uniform(torch.tensor([0, 1]), 0, 0.1, 2), 1)
    assert metrics["personal_test_loss"] == pytest.approx(425.0, rel=1e-5)
    assert columns["personal_test_loss"].tolist() == pytest.approx([450.0, 400.0], rel=1e-5)


@pytest.mark.filterwarnings("ignore::fedhet.errors.FedhetNote")  # the table's notes
def test_personalised_models_of_a_binary_task_get_its_auc_f1_and_balanced_accuracy(tmp_path: Path) -> None:
    from helpers.tables import write_patients

    spec = {"name": "table", "path": str(write_patients(tmp_path / "patients.csv")), "label": "outcome"}
    base = {"dataset": {**spec, "user": "site", "missing": "drop"}, "task": "binary", "rounds": 1, "seed": 0}
    names = ("auc", "f1", "balanced_accuracy")
    # the global model itself, fine-tuned copies (each client's own model), a personal head (a split dense model)
    for algorithm, personal in (("fedavg", {"enabled": True}), ("fedavg_ft", {}), ("fedper", {})):
        state = run(parse_config({**base, "algorithm": algorithm, "personal_eval": {"appeal": False, **personal}}))
        for name in names:
            assert 0.0 <= state.final[f"personal_test_{name}"] <= 1.0, (algorithm, name)
            assert 0.0 <= state.final[f"personal_test_{name}_pooled"] <= 1.0, (algorithm, name)
            column = state.client_columns[f"personal_test_{name}"]
            mean = float(column[state.experiment.data.seen].double().nanmean())
            assert state.final[f"personal_test_{name}"] == pytest.approx(mean, rel=1e-6), (algorithm, name)
        if algorithm == "fedavg":  # the clients' model is the global one: its metrics
            for name in names:
                assert state.final[f"personal_test_{name}"] == pytest.approx(state.final[f"test_{name}"], abs=1e-6)
                assert state.final[f"personal_test_{name}_pooled"] == pytest.approx(
                    state.final[f"test_{name}_pooled"], abs=1e-6
                )


def test_group_accuracy_is_each_groups_mean_over_the_chosen_clients_and_the_worst() -> None:
    accuracy = torch.tensor([0.5, 0.7, 0.2, 0.9, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 1])
    seen = torch.tensor([True, True, True, True, False])  # the last client (group 1) is not counted
    out = group_accuracy(accuracy, groups, seen, "test_accuracy")
    assert out == pytest.approx(
        {"test_accuracy_group0": 0.6, "test_accuracy_group1": 0.55, "test_accuracy_worst_group": 0.55}
    )
    assert group_accuracy(accuracy, None, seen, "test_accuracy") == {}
