"""The clusters-rotation and clusters-labels recipes: valid configs, and the quick version's claims (IFCA and CFL
find the 4 groups and lift the worst clients above FedAvg's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedhet.experiments.config import parse_config
from fedhet.experiments.reproduce import run_recipe
from fedhet.recipes import get_recipe

RECIPES = ("clusters-rotation", "clusters-labels")


@pytest.mark.parametrize("name", RECIPES)
def test_every_method_is_a_valid_config_with_four_groups(name: str) -> None:
    recipe = get_recipe(name)
    for method in recipe.methods:
        config = parse_config(recipe.config(method, 0, quick=False))
        assert config.shift.groups == 4 and config.clients_per_round == config.num_clients == 20
    assert parse_config(recipe.config("IFCA (k=4)", 0, quick=False)).spec("algorithm")["k"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("name", RECIPES)
def test_the_quick_version_finds_the_groups_and_lifts_the_worst_clients(name: str, tmp_path: Path) -> None:
    result = run_recipe(get_recipe(name), tmp_path / "out", quick=True, seeds=(0,), say=lambda _: None)
    values = {method: {column: v[0] for column, v in columns.items()} for method, columns in result.values.items()}
    for method in ("IFCA (k=4)", "CFL"):
        assert values[method]["ari"] >= 0.9, method
        worst = "personal_test_accuracy_worst10"
        assert values[method][worst] > values["FedAvg"][worst], method
    assert (tmp_path / "out" / "personal_accuracy.png").is_file()
