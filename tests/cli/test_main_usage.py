"""Help still reads as typer writes it, now that usage errors are one line (tests/cli/test_main_adversarial.py)."""

from __future__ import annotations

from typer.testing import CliRunner

from fedhet.cli.main import app

runner = CliRunner()


def test_fedhet_alone_shows_its_help() -> None:
    result = runner.invoke(app, [], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "Usage: fedhet [OPTIONS] COMMAND" in result.output and "error:" not in result.output


def test_a_commands_help_lists_its_options() -> None:
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--target-epsilon" in result.output
