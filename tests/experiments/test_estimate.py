"""``--estimate``: a few timed rounds per distinct config at (stand-in) paper scale, a projection, nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from fedhet.engine.engine import Engine
from fedhet.experiments import estimate as estimate_module
from fedhet.experiments import runner
from fedhet.experiments.estimate import (
    ESTIMATE_EVAL_CLIENTS,
    Estimate,
    StandIns,
    estimate_config,
    estimate_header,
    estimate_recipe,
    estimate_rows,
    estimate_run,
    format_duration,
    plan_recipe,
)
from fedhet.experiments.evaluation import evaluate_global
from fedhet.experiments.reproduce import RECIPES, deep_merge
from fedhet.recipes import get_recipe

SMALL: dict[str, Any] = {"local": {"batch_size": 8, "steps": 2}, "data_dir": "no-such-folder", "eval_clients": 1}
QUICK = ["maxfl-table1", "maxfl-finetune-sent140", "fedmgda-bias-attack", "cafed-sensitivity", "fedgsnr-table2"]
GENERATED = {"cafed-sensitivity"}  # synthetic data made from the config
SLOW = sorted(set(RECIPES) - set(QUICK) - {"maxfl-mean-estimation"})


def test_the_projection_adds_set_up_training_and_evaluations() -> None:
    # 200 rounds evaluated every 10: 19 evaluations of 0.2 s and the last one (everyone) of 1 s
    a = Estimate("a", 3, 200, 20, 4.0, 0.5, 0.2, 1.0, 100.0, "dense", True)
    assert a.run_s == pytest.approx(4.0 + 200 * 0.5 + 19 * 0.2 + 1.0)
    assert a.projected_s == pytest.approx(3 * a.run_s)
    b = Estimate("b", 2, 100, 100, 0.0, 3.0, 0.0, 0.0, 300.0, "conv", True)
    rows = estimate_rows([a, b])
    assert rows[0] == ["a", "dense", "0.500", "0.200", "200 × 3", "100", "5.4 min"]
    assert rows[-1] == ["total", "", "", "", "5 runs", "300", "15.4 min"]
    assert estimate_header([a, b])[-2:] == ["peak MB", "projected"]  # no GPU column for runs on the CPU
    on_gpu = Estimate("c", 1, 100, 100, 0.0, 3.0, 0.0, 0.0, 300.0, "conv on cuda", True, gpu_peak_mb=2048.0)
    assert estimate_header([a, on_gpu])[-3:] == ["peak MB", "GPU peak MB", "projected"]
    rows = estimate_rows([a, on_gpu])
    assert rows[0][6] == "" and rows[1][6] == "2,048" and rows[-1][6] == "2,048"
    assert all(len(row) == 8 for row in rows)
    assert [format_duration(s) for s in (5, 90, 7200, 3 * 86400)] == ["5.0 s", "1.5 min", "2.0 h", "3.0 days"]


def _check(name: str, tmp_path: Path) -> None:
    recipe = get_recipe(name)
    plan = plan_recipe(recipe, (0, 1))
    said: list[str] = []
    estimates, note = estimate_recipe(recipe, (0, 1), 0.005, SMALL, say=said.append, budget_s=0)
    assert [e.label for e in estimates] == [label for label, _, _ in plan.configs]
    # each config is announced, then its result (an estimate of hours shows its configs' costs as they come)
    assert [line.startswith("estimating") for line in said] == [True, False] * len(estimates)
    assert all(format_duration(e.projected_s) in said[2 * i + 1] for i, e in enumerate(estimates))
    assert [e.runs for e in estimates] == [runs for _, _, runs in plan.configs]
    assert all(e.train_s > 0 and e.setup_s > 0 and e.eval_s >= 0 and e.peak_mb > 0 for e in estimates)
    assert any(e.stand_in for e in estimates) == (name not in GENERATED)  # generated data needs no stand-in
    assert sum(e.runs for e in estimates) >= 2 * len(estimates) or note  # every config over both seeds
    assert os.listdir(tmp_path) == []  # no run folder, no data folder


@pytest.mark.slow
@pytest.mark.parametrize("name", QUICK)
def test_paper_recipes_are_estimated_on_stand_ins(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _check(name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_every_paper_recipe_runs_at_reduced_size(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each recipe's distinct (dataset, model, partition) on its stand-in, at 0.005 of the paper's size (every
    algorithm runs in its own tests)."""
    monkeypatch.chdir(tmp_path)
    kinds: dict[str, tuple[str, dict[str, Any], int]] = {}
    for label, raw, runs in plan_recipe(get_recipe(name), (0, 1)).configs:
        kind = json.dumps([raw.get("dataset"), raw.get("model"), raw.get("partition")], sort_keys=True, default=str)
        kinds.setdefault(kind, (label, raw, runs))
    stand_ins = StandIns(0.005)
    for label, raw, runs in kinds.values():
        estimate = estimate_config(deep_merge(raw, SMALL), label, runs, stand_ins, budget_s=0)
        assert estimate.train_s > 0 and estimate.final_eval_s >= 0 and estimate.peak_mb > 0, label
    assert os.listdir(tmp_path) == []


def test_a_recipe_plan_counts_methods_by_seeds() -> None:
    recipe = get_recipe("maxfl-table1")
    plan = plan_recipe(recipe, (0, 1, 2))
    assert [label for label, _, _ in plan.configs] == list(recipe.methods)
    assert all(runs == 3 and config["seed"] == 0 for _, config, runs in plan.configs) and not plan.note


def test_a_study_is_planned_from_the_runs_it_hands_its_executor(capsys: pytest.CaptureFixture[str]) -> None:
    plan = plan_recipe(get_recipe("fedgsnr-table2"), (0, 1))
    assert len(plan.configs) == 12 and all(runs == 2 for _, _, runs in plan.configs)
    assert plan.configs[0][0] == "10% | FedAvg" and not plan.note
    staged = plan_recipe(get_recipe("cafed-table1"), (0,))  # tuning first: learning rates do not change the cost
    assert "first, 'tuning'" in staged.note and sum(runs for _, _, runs in staged.configs) > len(staged.configs)
    assert capsys.readouterr().out == ""  # the study's own messages are not shown


@pytest.mark.slow
def test_an_analytic_study_has_nothing_to_estimate() -> None:
    plan = plan_recipe(get_recipe("maxfl-mean-estimation"), (0,))
    assert plan.configs == [] and "nothing to estimate" in plan.note


def test_a_run_with_its_data_present_is_timed_on_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    estimate = estimate_run(
        {"dataset": "digits", "rounds": 40, "num_clients": 6, "model": {"name": "mlp", "hidden": [8]}}
    )
    assert not estimate.stand_in and estimate.rounds == 40 and estimate.evals == 40 and estimate.runs == 1
    assert estimate.projected_s == pytest.approx(
        estimate.setup_s + 40 * estimate.train_s + 39 * estimate.eval_s + estimate.final_eval_s
    )
    assert os.listdir(tmp_path) == []


def test_evaluation_is_timed_on_a_sample_and_grows_to_the_clients_scored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    raw = {"dataset": "digits", "rounds": 30, "num_clients": 40, "eval_clients": 10, "eval_every": 3}
    estimate = estimate_run({**raw, "model": {"name": "mlp", "hidden": [8]}})
    assert estimate.evals == 10 and estimate.eval_s >= 0  # a time difference: it may round to 0 on a fast CPU
    assert estimate.final_eval_s >= estimate.eval_s  # 10 of the 40 clients per evaluation, everyone at the end
    assert os.listdir(tmp_path) == []


def _record_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The most local steps of each cohort `Engine.train` trains from now on, in order."""
    trained: list[int] = []
    train = Engine.train  # the original, bound before the patch

    def recording(self: Engine, params: torch.Tensor, plan: Any, round_: int) -> Any:
        trained.append(int(plan.steps.max()))
        return train(self, params, plan, round_)

    monkeypatch.setattr(Engine, "train", recording)
    return trained


def _record_scored(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many clients each of the runner's global evaluations scores from now on, in order."""
    scored: list[int] = []

    def recording(engine: Any, params: torch.Tensor, clients: torch.Tensor | None = None, count: bool = False) -> Any:
        scored.append(engine.data.num_clients if clients is None else len(clients))
        return evaluate_global(engine, params, clients, count)

    monkeypatch.setattr(runner, "evaluate_global", recording)
    return scored


def test_a_plugin_that_needs_everyone_is_timed_on_the_sample_and_sized_for_everyone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    scored = _record_scored(monkeypatch)
    raw = {"dataset": "digits", "rounds": 30, "num_clients": 40, "eval_clients": 20, "metrics": ["alpha_accuracy"]}
    estimate = estimate_run({**raw, "model": {"name": "mlp", "hidden": [8]}})
    assert scored and set(scored) == {ESTIMATE_EVAL_CLIENTS}  # the run's evaluations scored 10 clients, never 40
    assert estimate.evals == 30
    # the plugin turns the config's sampling off, so each evaluation is sized for everyone, as the last one is
    assert estimate.eval_s == pytest.approx(estimate.final_eval_s)


def test_methods_that_differ_only_in_learning_rates_are_timed_once() -> None:
    recipe = get_recipe("fedmgda-shakespeare")
    plan = plan_recipe(recipe, (0, 1))
    assert sum(runs for _, _, runs in plan.configs) == 2 * len(recipe.methods)  # every run is counted
    assert len(plan.configs) < len(recipe.methods)
    labels = [label for label, _, _ in plan.configs]
    # Table 14's FedAvg rows with momentum 0.5 (η_l = 0.25, 0.5, 0.8, 1) cost the same per round; momentum 0 does not
    assert "FedAvg (η_l=0.25, momentum 0.5) (+3 alike)" in labels and "FedAvg (η_l=0.8, momentum 0)" in labels


def test_methods_that_differ_only_in_the_size_of_a_rules_coefficient_are_timed_once() -> None:
    plan = plan_recipe(get_recipe("fedmgda-femnist-b20"), (0,))
    labels = [label for label, _, _ in plan.configs]
    assert sum(runs for _, _, runs in plan.configs) == len(get_recipe("fedmgda-femnist-b20").methods)
    # Table 12: six q-FedAvg rows (q, L), three FedProx rows (μ), the decays of FedMGDA+ and FedAvg-n: one each
    assert "q-FedAvg (q=0.1, L=0.1) (+5 alike)" in labels and "FedProx (μ=0.01) (+2 alike)" in labels
    assert not any(label.startswith("q-FedAvg (q=0.5") for label in labels)
    base = {"algorithm": {"name": "fedprox", "mu": 0.1}, "local": {"steps": 5}}
    assert estimate_module._cost_key(base) == estimate_module._cost_key(
        {**base, "algorithm": {"name": "fedprox", "mu": 2.0}}
    )
    off = {**base, "algorithm": {"name": "fedprox", "mu": 0.0}}  # a term switched off can change the work
    assert estimate_module._cost_key(base) != estimate_module._cost_key(off)
    more = {**base, "local": {"steps": 50}}
    assert estimate_module._cost_key(base) != estimate_module._cost_key(more)


def test_a_round_of_many_steps_is_timed_with_fewer_and_scaled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(estimate_module, "MAX_TIMED_STEPS", 4)
    trained = _record_steps(monkeypatch)
    raw = {"dataset": "digits", "rounds": 30, "num_clients": 6, "local": {"steps": 12}}
    estimate = estimate_run({**raw, "model": {"name": "mlp", "hidden": [8]}})
    # the probe's round takes one step; the timed rounds four, the most a timed round takes here
    assert trained[0] == 1 and set(trained[1:]) == {4} and estimate.steps_timed == (4, 12)
    trained.clear()
    assert estimate_run({**raw, "local": {"steps": 3}}).steps_timed is None and set(trained[1:]) == {3}


def test_only_the_local_training_of_a_round_is_scaled_to_the_configs_steps() -> None:
    # a round of 5 s, 1 s of it local training with 1 of 20 steps: the other 4 s (a strategy's own measurements,
    # aggregation, writes) do not grow with the steps
    pair = estimate_module._Pair(train_s=5.0, local_s=1.0, eval_s=0.0, eval_writes_s=0.0)
    assert pair.train_at(20.0) == pytest.approx(24.0) and pair.train_at(1.0) == pytest.approx(5.0)


def test_the_probe_fits_the_timed_steps_and_evaluation_sample_to_their_budgets() -> None:
    probe = estimate_module._Probe(step_s=2.0, eval_client_s=3.0)  # budgets of 10 s each
    assert probe.timed_steps(20) == 5 and probe.timed_steps(3) == 3 and probe.eval_clients() == 3
    slow = estimate_module._Probe(step_s=30.0, eval_client_s=40.0)  # one step and two clients at least
    assert slow.timed_steps(20) == 1 and slow.eval_clients() == 2
    fast = estimate_module._Probe(step_s=0.001, eval_client_s=0.0)
    assert fast.timed_steps(300) == estimate_module.MAX_TIMED_STEPS and fast.eval_clients() == ESTIMATE_EVAL_CLIENTS


def test_a_long_round_is_timed_with_one_step_and_a_long_evaluation_on_two_clients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(estimate_module, "ROUND_BUDGET_S", 1e-9)
    monkeypatch.setattr(estimate_module, "EVAL_BUDGET_S", 1e-9)
    trained, scored = _record_steps(monkeypatch), _record_scored(monkeypatch)
    raw = {"dataset": "digits", "rounds": 30, "num_clients": 20, "local": {"steps": 12}}
    estimate = estimate_run({**raw, "model": {"name": "mlp", "hidden": [8]}})
    assert set(trained) == {1} and estimate.steps_timed == (1, 12)
    assert estimate.train_s > 0
    assert scored and set(scored) == {2}  # the run's timed evaluations scored two of the 20 clients
    assert estimate.final_eval_s >= estimate.eval_s > 0 and estimate.train_s > 0
    assert os.listdir(tmp_path) == []
