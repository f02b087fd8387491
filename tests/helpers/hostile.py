"""The hostile-input check the CLI tests share: a command refused in one line on stderr, exit code 2, no traceback,
and the folder it ran in exactly as it was (no run folder, not even a half-written one)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from fedhet.cli.main import app


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path below `root`, with a file's bytes (None for a folder)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def assert_refused(args: list[str], fragment: str, root: Path) -> str:
    """Run `fedhet ARGS` in `root` (the current folder): one stderr line holding `fragment`, exit 2, nothing on
    stdout, `root` unchanged. Returns the line."""
    before = snapshot(root)
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert fragment in lines[0], (fragment, lines[0])
    assert snapshot(root) == before  # no run folder, not even a half-written one
    return lines[0]
