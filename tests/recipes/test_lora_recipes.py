"""The lora recipe (`fedhet.recipes.lora`): valid configs, and its quick version's table on the generated languages."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from fedhet.experiments.config import parse_config
from fedhet.experiments.reproduce import run_recipe
from fedhet.recipes import get_recipe
from fedhet.recipes.lora import METHODS, _finetune_config, settings


def test_both_stages_are_valid_configs_on_either_dataset() -> None:
    for embedded in (True, False):
        pretrain, finetune = settings(quick=False, embedded=embedded)
        assert parse_config({**pretrain, "seed": 0}).spec("model").get("lora") is None
        for changes in METHODS.values():
            config = parse_config(_finetune_config(finetune, changes, Path("base.pt"), 0))
            assert config.spec("model")["lora"]["rank"] == 16 and config.eval_every == config.rounds
    assert settings(quick=False, embedded=True)[0]["dataset"]["generic"] is True  # pretraining: the generic corpus
    assert settings(quick=False, embedded=False)[1]["dataset"]["name"] == "shakespeare_text"


@pytest.mark.slow
def test_the_quick_version_gives_each_ranks_share_and_accuracy(tmp_path: Path) -> None:
    result = run_recipe(get_recipe("lora"), tmp_path / "out", quick=True, seeds=(0,), embedded=True, say=str)
    cell = r"([\d.]+)(?: ± [\d.]+)?"
    pattern = rf"^\| (\d+) \| {cell} \| {cell} \| {cell} \| {cell} \| {cell} \|$"
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(pattern, result.table, flags=re.M)}
    assert sorted(rows, key=int) == ["2", "4", "8", "16"]
    for share, *accuracies in rows.values():
        assert float(share) == pytest.approx(0.25)
        assert all(float(a) > 1 / 16 for a in accuracies)  # above chance (16 tokens)
    methods = dict(re.findall(r"^\| ([^|]+?) \| ([\d.]+) \|$", result.table, flags=re.M))
    assert set(methods) == set(METHODS)
    base = float(methods["pretrained base, no fine-tuning"])
    for tuned in ("FlexLoRA, ranks {2, 4, 8, 16}", "FlexLoRA, all at rank 16", "FedAvg of the factors, rank 16"):
        assert float(methods[tuned]) > base + 0.05, tuned  # fine-tuning the adapters lifts the pretrained base
    assert (tmp_path / "out" / "base-seed0.pt").is_file()
    assert "markov_text" in (tmp_path / "out" / "table.md").read_text()


def _complete_works(path: Path) -> None:
    """A Complete Works stand-in in Gutenberg's newer layout: 20 speaking roles of about 3,600 characters each."""
    rng = np.random.default_rng(0)
    words = ["thou", "art", "the", "sun", "and", "moon", "my", "lord", "good", "night", "sweet", "prince"]
    parts = ["ACT I\n\nSCENE I. A street.\n"]
    for _ in range(30):
        parts += [f"ROLE{chr(65 + r)}.\n" + " ".join(rng.choice(words, 20)) + ".\n" for r in range(20)]
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(parts))


@pytest.mark.slow
def test_with_shakespeares_file_present_the_recipe_runs_on_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _complete_works(tmp_path / "data" / "shakespeare_text" / "pg100.txt")
    monkeypatch.chdir(tmp_path)
    result = run_recipe(get_recipe("lora"), tmp_path / "out", quick=True, seeds=(0,), say=str)
    assert "Shakespeare (shakespeare_text)" in result.table
    assert re.search(r"^\| 16 \| 0\.2500 ", result.table, flags=re.M)
