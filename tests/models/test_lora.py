"""LoRA adapters and the small transformer (`fedhet.models.lora`, `fedhet.models.transformer`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from fedhet.engine.functional import FlatModel
from fedhet.errors import ConfigError
from fedhet.models.lora import LoRA, LoRALinear, add_lora
from fedhet.models.transformer import Transformer


def test_the_adapted_layer_computes_wx_plus_scaled_bax() -> None:
    torch.manual_seed(0)
    base = nn.Linear(5, 3)
    layer = LoRALinear(base, rank=2, alpha=6.0)
    with torch.no_grad():
        layer.lora_B.normal_()  # B starts at zero: give it a value to see the adapter
    x = torch.randn(4, 5)
    expected = x @ base.weight.T + base.bias + (6.0 / 2) * x @ layer.lora_A.T @ layer.lora_B.T
    torch.testing.assert_close(layer(x), expected)
    fresh = LoRALinear(base, rank=2, alpha=6.0)
    torch.testing.assert_close(fresh(x), base(x))  # B = 0: the adapted model starts as the base model


def test_only_the_adapters_train_and_targets_must_name_linear_layers() -> None:
    module = Transformer(d_model=8, heads=2, layers=1, lora=LoRA(rank=2, targets=["q", "out"])).build((6,), 10)
    trained = sorted(n for n, p in module.named_parameters() if p.requires_grad)
    assert trained == ["blocks.0.q.lora_A", "blocks.0.q.lora_B", "out.lora_A", "out.lora_B"]
    assert sorted(FlatModel(module).frozen) == sorted(n for n, p in module.named_parameters() if not p.requires_grad)
    with pytest.raises(ConfigError, match="name no Linear layer"):
        add_lora(nn.Sequential(nn.Linear(2, 2)), LoRA(targets=["q"]), "model")


def test_the_transformer_is_causal_and_reads_the_last_position() -> None:
    torch.manual_seed(0)
    module = Transformer(d_model=8, heads=2, layers=2).build((5,), 7)
    x = torch.randint(7, (3, 5))
    y = module(x)
    assert y.shape == (3, 7)
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 7  # the last token matters
    assert not torch.allclose(module(changed), y)
    with pytest.raises(ConfigError, match="token sequences"):
        Transformer().build((3, 4), 7)


def test_base_weights_load_from_a_state_dict_and_a_wrong_one_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    plain = Transformer(d_model=8, heads=2, layers=1).build((5,), 7)
    torch.save(plain.state_dict(), tmp_path / "base.pt")
    spec = Transformer(d_model=8, heads=2, layers=1, base=str(tmp_path / "base.pt"), lora=LoRA(rank=2))
    adapted = spec.build((5,), 7)
    x = torch.randint(7, (3, 5))
    torch.testing.assert_close(adapted(x), plain(x))  # B = 0: exactly the pretrained model
    with pytest.raises(ConfigError, match="another model's state dict"):
        Transformer(d_model=8, heads=2, layers=2, base=str(tmp_path / "base.pt")).build((5,), 7)
    with pytest.raises(ConfigError, match="not a file"):
        Transformer(base=str(tmp_path / "none.pt")).build((5,), 7)
    (tmp_path / "bad.pt").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match="cannot read"):
        Transformer(base=str(tmp_path / "bad.pt")).build((5,), 7)


@pytest.mark.parametrize(
    ("sets", "fragment"),
    [
        (["model.base=missing.pt"], "is not a file"),
        (["model.lora.targets=[zz]"], "name no Linear layer"),
        (["model.lora.rank=0"], "rank"),
        (["model.heads=5"], "must divide d_model"),
    ],
)
def test_bad_transformer_settings_are_refused_before_anything_is_written(
    sets: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers.hostile import assert_refused

    monkeypatch.chdir(tmp_path)
    args = ["run", "--dataset", "markov_text", "--model", "transformer", "--rounds", "1", "--out", "r"]
    for item in sets:
        args += ["--set", item]
    assert_refused(args, fragment, tmp_path)


@pytest.mark.parametrize("backend", ["sequential", "vectorised"])
def test_the_engine_never_trains_a_frozen_base_whatever_the_algorithm(backend: str) -> None:
    """FedAvg on a LoRA model is FedAvg of the factors: the base weights come back exactly as sent."""
    from fedhet.api import run

    config = {
        "dataset": {"name": "markov_text", "vocab": 6, "seq_len": 4, "num_users": 4, "samples_per_user": 20},
        "partition": "natural",
        "model": {"name": "transformer", "d_model": 8, "heads": 2, "layers": 1, "lora": {"rank": 2}},
        "num_clients": 4,
        "clients_per_round": 3,
        "rounds": 2,
        "local": {"steps": 3, "lr": 0.2, "batch_size": 8, "optimizer": {"name": "sgd", "momentum": 0.9}},
        "algorithm": "fedavg",
        "backend": backend,
    }
    result = run(config)
    assert result.state_dict is not None
    names = [n for n in result.state_dict if "lora_" not in n]
    start = run({**config, "rounds": 1, "local": {**config["local"], "lr": 1e-30}}).state_dict  # the initial base
    assert start is not None
    for name in names:
        assert torch.equal(result.state_dict[name], start[name]), name
    assert not torch.equal(result.state_dict["blocks.0.q.lora_B"], torch.zeros(8, 2))  # the adapters trained


def test_a_base_file_is_kept_as_an_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "base.pt").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    assert Transformer(base="base.pt").base == str((tmp_path / "base.pt").resolve())
    assert Transformer(base="missing.pt").base == "missing.pt"  # refused when the model is built
