"""The documentation site: the generated configuration reference covers every key, and the site builds in
strict mode (a broken link, anchor or API reference fails)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel

from fedhet.experiments.config import RunConfig

ROOT = Path(__file__).resolve().parents[2]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_reference", ROOT / "docs" / "gen_config_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        out.append(f"{prefix}{name}")
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out += keys(field.annotation, f"{prefix}{name}.")
    return out


def table_keys(section: str) -> set[str]:
    return set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.M))


def test_every_run_key_is_listed_with_type_default_and_range() -> None:
    page = generator().render()
    run_keys = page.split("## Run keys", 1)[1].split("\n## ", 1)[0]
    expected = keys(RunConfig)
    assert table_keys(run_keys) == set(expected)
    assert "| `rounds` | `int` | `20` | ≥ 1, ≤ 1,000,000 |" in run_keys
    assert "| `test_fraction` | `float` | `0.2` | ≥ 0, < 1 |" in run_keys
    assert "| `local.lr` | `float` | `0.05` | > 0 | local learning rate |" in run_keys


def test_every_registered_component_and_parameter_is_listed() -> None:
    gen = generator()
    page = gen.render()
    for title, key, registry in gen.groups():
        assert f"## {title}" in page
        for cls in registry:
            heading = f"### `{cls.name}` {{#{gen.anchor(key, cls.name)}}}"
            assert heading in page, heading
            section = page.split(heading, 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
            assert table_keys(section) == set(keys(cls)), (key, cls.name)
    table = page.split("### `table` {#dataset-table}", 1)[1].split("\n### ", 1)[0]
    assert "| `path` | `str` | **required** |  | the .csv/.tsv or .parquet file |" in table
    assert "| `categorical` | `list[str]` | `[]` |" in table


def test_type_names_by_hand() -> None:
    from typing import Annotated, Literal

    from pydantic import Field

    gen = generator()
    assert gen.type_name(int | None) == "int | None"
    assert gen.type_name(Literal["a", "b"]) == '"a" | "b"'
    assert gen.type_name(list[Annotated[int, Field(gt=0)]]) == "list[int]"
    assert gen.type_name(tuple[int, ...]) == "tuple[int, ...]"


def test_every_run_key_has_a_description() -> None:
    page = generator().render()
    run_keys = page.split("## Run keys", 1)[1].split("\n## ", 1)[0]
    empty = [row for row in run_keys.splitlines() if row.startswith("| `") and row.rstrip().endswith("|  |")]
    assert not empty, empty


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")  # the `docs` extra (part of `dev`)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "Run one experiment, as" in api and "load_run" in api
    config = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    assert 'id="dataset-table"' in config and 'id="algorithm-fedavg"' in config
