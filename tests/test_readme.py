"""The README's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.strategies.base import STRATEGIES

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_strategy_example_registers_and_runs() -> None:
    (code,) = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    exec(compile(code, "README.md", "exec"), {})
    assert "my_trimmed_avg" in [c.name for c in STRATEGIES]
    state = run(parse_config({"algorithm": {"name": "my_trimmed_avg", "trim": 0.2}, "rounds": 3}))
    assert 0.0 < state.final["test_accuracy"] <= 1.0
    assert state.final["participants"] == 10


def test_every_recipe_the_readme_names_exists() -> None:
    from fedhet.recipes import RECIPES

    named = set(re.findall(r"fedhet reproduce ([a-z0-9-]+)", README.read_text()))
    assert named and named <= set(RECIPES), named - set(RECIPES)
