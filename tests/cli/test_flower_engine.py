"""`fedhet run --engine flower` without Flower installed: one clear line that says how to install it."""

from __future__ import annotations

import importlib.util

import pytest
from typer.testing import CliRunner

from fedhet.cli.main import app


@pytest.mark.skipif(importlib.util.find_spec("flwr") is not None, reason="Flower is installed here")
def test_flower_engine_without_flower_says_how_to_install_it(tmp_path: object) -> None:
    result = CliRunner().invoke(app, ["run", "--engine", "flower", "--rounds", "1", "--quiet"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install 'fedhet[flower]'" in lines[0]


def test_unknown_engine_is_refused() -> None:
    result = CliRunner().invoke(app, ["run", "--engine", "spark", "--rounds", "1", "--quiet"])
    assert result.exit_code == 2 and "native, flower" in result.output
