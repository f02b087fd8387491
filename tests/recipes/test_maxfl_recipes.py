"""MaxFL end to end: a small run with appeal-driven participation, Byzantine clients and the appeal metrics."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fedhet.experiments.config import parse_config
from fedhet.experiments.reproduce import deep_merge, run_recipe
from fedhet.experiments.runner import run
from fedhet.recipes import get_recipe
from fedhet.recipes.maxfl import EMBEDDED, METHODS, PAPER

SMALL = {
    "rounds": 12,
    "num_clients": 10,
    "unseen_clients": 6,
    "clients_per_round": 4,
    "availability": {"name": "appeal", "mandatory_rounds": 4},
    "requirements": {"steps": 20},
}


def test_maxfl_run_reports_appeal_metrics_seen_and_unseen() -> None:
    raw = deep_merge(deep_merge(deep_merge(PAPER, EMBEDDED), SMALL), METHODS["MaxFL"])
    raw["attack"] = {"name": "malicious", "fraction": 0.2, "update": "gaussian", "loss_bias": 10.0}
    state = run(parse_config(raw))
    final = state.final
    for key in (
        "gm_appeal",
        "gm_appeal_train",
        "preferred_accuracy",
        "unseen_gm_appeal",
        "unseen_preferred_accuracy",
        "ft_gm_appeal",
        "ft_unseen_test_accuracy",
        "maxfl_q_sum",
    ):
        assert key in final and not math.isnan(final[key]), key
    assert 0.0 <= final["gm_appeal"] <= 1.0
    # after the mandatory rounds only appealing clients are in the pool
    late = [row for row in state.history if row["round"] > 4]
    assert all(row["participants"] <= row["available"] for row in late)
    assert "ft_gm_appeal" not in state.history[0]  # tuning metrics only at the final round by default
    columns = state.client_columns  # clients.csv: each client's requirement, local model and flip flag
    assert torch.equal(columns["label_flipped"].bool(), state.experiment.data.info["corrupted"])
    assert int(columns["label_flipped"].sum()) == round(0.3 * 16)
    assert bool((columns["rho"] > 0).all()) and bool((columns["local_test_accuracy"] <= 1).all())


def test_qffl_rows_use_li_et_al_lipschitz_explicitly() -> None:
    """q-FFL's L = 1/η_l (Li et al.; fedhet's default too), written out so the recipe keeps it if the default moves."""
    for name in ("maxfl-table1", "maxfl-table1-emnist"):
        recipe = get_recipe(name)
        for embedded in (False, True):
            cfg = recipe.config("q-FFL (q=1)", 0, quick=False, embedded=embedded)
            assert cfg["algorithm"]["lipschitz"] == pytest.approx(1 / cfg["local"]["lr"])


def test_byzantine_table_has_attackers_that_opt_in_honestly_and_always() -> None:
    recipe = get_recipe("maxfl-byzantine")
    assert len(recipe.methods) == 8
    honest = recipe.config("MaxFL (Byz=0.1)", 0, quick=False)["attack"]
    always = recipe.config("MaxFL (Byz=0.1, always opt in)", 0, quick=False)["attack"]
    assert "opt_in" not in honest and always == {**honest, "opt_in": "always"}
    assert parse_config(recipe.config("MW-Fed (Byz=0.05, always opt in)", 0, True, True)).spec("attack")["opt_in"] == (
        "always"
    )


@pytest.mark.slow
def test_mean_estimation_recipe_writes_table_and_figure(tmp_path: Path) -> None:
    recipe = get_recipe("maxfl-mean-estimation")
    result = run_recipe(recipe, tmp_path, quick=True, seeds=(0,))
    assert "MaxFL (ReLU)" in result.table and (tmp_path / "table.md").is_file()
    assert (tmp_path / "mean_estimation_two_clients.png").stat().st_size > 10_000


@pytest.mark.slow
def test_maxfl_appeals_to_more_clients_than_every_baseline_when_opt_out_starts() -> None:
    """The embedded Table 1 setting (digits, 30% label-flipped clients) up to the end of the 10 mandatory rounds,
    where every client still takes part: on each seed, MaxFL's global model appeals to more seen and more unseen
    clients (test loss, the GM-appeal of the tables) and more clients opt in (training loss) than any baseline's.

    What this does not check, because it does not hold on this data (docs/maxfl.md): after opt-out starts the
    baselines' pools fill up within ~15 rounds, and at round 200 MaxFL's GM-appeal and accuracy tie FedAvg's.
    """
    for seed in (0, 1, 2):
        finals = {}
        for method, changes in METHODS.items():
            raw = deep_merge(
                deep_merge(deep_merge(PAPER, EMBEDDED), changes), {"rounds": 10, "eval_every": 10, "seed": seed}
            )
            raw["metrics"] = [{"name": "appeal", "finetune_steps": 0}]
            finals[method] = run(parse_config(raw)).final
        maxfl = finals.pop("MaxFL")
        for key in ("gm_appeal", "unseen_gm_appeal", "gm_appeal_train"):
            best = max(final[key] for final in finals.values())
            assert maxfl[key] > best, (seed, key, maxfl[key], {m: f[key] for m, f in finals.items()})


def test_every_maxfl_recipe_builds_on_the_paper_data_and_the_embedded_fallback() -> None:
    from fedhet.experiments.build import components
    from fedhet.experiments.reproduce import RECIPES

    names = [name for name in RECIPES if name.startswith("maxfl-") and name != "maxfl-mean-estimation"]
    assert {"maxfl-table1-emnist", "maxfl-unseen-sent140", "maxfl-participation"} <= set(names)
    for name in names:
        recipe = get_recipe(name)
        for method in recipe.methods:
            for embedded in (False, True):
                raw = recipe.config(method, 0, quick=False, embedded=embedded)
                components(parse_config(raw))  # every component validates (no mixed partition keys)
                if embedded and recipe.fallback is not None:
                    assert raw["dataset"] == "digits" and raw["num_clients"] == 15
                    assert raw["rounds"] == 200
                    assert raw["availability"] == "always" or raw["availability"]["mandatory_rounds"] == 10
    assert get_recipe("maxfl-unseen").config("MaxFL", 0, False, False)["partition"]["name"] == "label_clusters"
    clusters = get_recipe("maxfl-participation").config("MaxFL, opt-out, 2-label clusters", 0, False, True)
    assert clusters["partition"]["name"] == "label_clusters"  # the row's partition survives the fallback
