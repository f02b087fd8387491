"""`fedhet list` from catalogue.json: the same listing as the registries, without importing torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedhet.cli import catalogue
from fedhet.cli.catalogue import CATALOGUE, builtin_catalogue, component_groups, registered_groups

SRC = Path(__file__).resolve().parents[2] / "src"


def test_catalogue_json_matches_the_registries() -> None:
    listed = json.loads(CATALOGUE.read_text(encoding="utf-8"))
    assert listed == builtin_catalogue(), (
        "src/fedhet/cli/catalogue.json is out of date: run python -m fedhet.cli.catalogue and commit the file"
    )


def test_the_listing_without_plugins_is_the_registries_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalogue, "entry_points", lambda group: [])
    live = {g: {n: v for n, v in entries.items() if v[1] == "fedhet"} for g, entries in registered_groups().items()}
    assert component_groups() == live
    assert list(component_groups()) == list(catalogue.GROUPS)


def test_a_plugin_is_listed_with_its_origin(tmp_path: Path) -> None:
    plugin = tmp_path / "my_schedule.py"
    plugin.write_text(
        "from fedhet.engine.schedules import SCHEDULES, Constant\n\n"
        "@SCHEDULES.register\nclass CatalogueTestSchedule(Constant):\n"
        "    name = 'catalogue_test_schedule'\n    description = 'a test schedule'\n"
    )
    groups = component_groups([str(plugin)])
    text, origin = groups["schedules"]["catalogue_test_schedule"]
    assert text == "a test schedule" and origin.endswith("my_schedule.py")
    assert groups["algorithms"]["fedavg"][1] == "fedhet"


# Each command's exit code and whether torch was imported by the time it answered, in one fresh process.
PROBE = """
import json, sys
from fedhet.cli.main import app
seen = []
for args in ({commands}):
    try:
        app(args)
    except SystemExit as done:
        seen.append([args, done.code, "torch" in sys.modules])
print(json.dumps(seen))
"""


def test_help_list_and_a_config_error_answer_without_importing_torch(tmp_path: Path) -> None:
    commands = [["--help"], ["list"], ["list", "algorithms"], ["run", "--set", "lcoal.lr=0.1"]]
    code = PROBE.format(commands=", ".join(repr(c) for c in commands))
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == [[c, 2 if c[0] == "run" else 0, False] for c in commands]
    assert "unknown key 'lcoal' (did you mean 'local'?)" in done.stderr
    assert not list(tmp_path.iterdir())  # the refused run wrote nothing
