"""The shift registry and the built-in shifts beyond rotation: noise, blur, contrast, colour, label swaps, levels per
group or per client, a plugin's shift, and their refusals (hand-computed where a value is pinned)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar

import pytest
import torch
import yaml

from fedhet.data.dataset import ClientData, FederatedData
from fedhet.data.shift import assign_clients, shift_clients
from fedhet.data.shift_config import SHIFTS, Blur, Colour, Noise, Shift, ShiftComponent
from fedhet.data.shift_transforms import Assignment, gaussian_blur, gaussian_kernel
from fedhet.errors import ConfigError, DataError
from fedhet.experiments.build import components, federated_data
from fedhet.experiments.config import parse_config
from helpers.hostile import assert_refused


def _data(x: torch.Tensor, y: torch.Tensor, sizes: list[int], classes: int = 3) -> FederatedData:
    offsets = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
    part = ClientData(x, y, offsets)
    return FederatedData("t", part, part, classes, torch.ones(len(sizes), dtype=torch.bool))


def test_every_builtin_shift_is_registered_and_the_config_names_one() -> None:
    assert {"none", "rotation", "labels", "noise", "blur", "contrast", "colour", "domain"} <= set(SHIFTS.names())
    assert parse_config({"shift": "noise"}).shift.component() == Noise()  # a name alone, as other components
    with pytest.raises(ConfigError, match=r"unknown key 'shift\.sigma'"):
        parse_config({"shift": {"name": "noise", "sigma": 1}})


def test_levels_are_evenly_spaced_from_zero_listed_or_drawn_per_client() -> None:
    assert Noise(groups=3, strength=1.0).group_levels() == [0.0, 0.5, 1.0]
    assert Noise(groups=2, levels=[0.3, 0.1]).group_levels() == [0.3, 0.1]
    groups, levels = assign_clients(Noise(groups=3, strength=1.0), 5, 0)
    assert groups.tolist() == [0, 1, 2, 0, 1] and levels is not None
    assert levels.tolist() == [0.0, 0.5, 1.0, 0.0, 0.5]
    groups, levels = assign_clients(Noise(groups=3, strength=2.0, per_client=True), 50, 0)
    assert levels is not None and levels.min() >= 0 and levels.max() <= 2 and len(set(levels.tolist())) == 50
    nearest = (levels[:, None] - torch.tensor([0.0, 1.0, 2.0])).abs().argmin(dim=1)
    assert torch.equal(groups, nearest)  # a client's group: the nearest group level


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"name": "noise", "groups": 2, "levels": [0.1]}, "levels lists 1 values for 2 groups"),
        ({"name": "noise", "groups": 2, "levels": [0.1, 0.2], "per_client": True}, "give one of them"),
        ({"name": "contrast", "strength": 1.5}, "less than or equal to 1"),
        ({"name": "blur", "levels": [0, 0, 0, 100]}, "blur sigma must be within"),
        ({"name": "noise", "strength": -1}, "greater than or equal to 0"),
    ],
)
def test_a_level_out_of_range_is_refused_by_the_config(spec: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config({"shift": spec})


def test_noise_adds_each_groups_std_its_own_draws_per_split() -> None:
    x = torch.zeros(4000, 4)
    data = _data(x, torch.zeros(4000, dtype=torch.long), [2000, 2000])
    data = FederatedData("t", data.train, ClientData(x.clone(), data.train.y, data.train.offsets), 3, data.seen)
    out = shift_clients(data, Noise(groups=2, strength=0.5), 0)
    assert torch.equal(out.train.x[:2000], x[:2000])  # group 0: level 0
    assert out.train.x[2000:].std().item() == pytest.approx(0.5, rel=0.03)
    assert not torch.equal(out.train.x[2000:], out.test.x[2000:])  # the test split's own noise
    assert torch.equal(out.train.x, shift_clients(data, Noise(groups=2, strength=0.5), 0).train.x)  # seeded
    assert out.info["shift_level"].tolist() == [0.0, 0.5]


def test_blur_of_a_point_is_the_gaussian_and_keeps_a_flat_image() -> None:
    kernel = gaussian_kernel(1.0)  # t = −3..3, e^{−t²/2} / Σ: Σ = 1 + 2(e^{−1/2} + e^{−2} + e^{−9/2}) = 2.505950
    assert len(kernel) == 7 and kernel[3].item() == pytest.approx(1 / 2.505950, rel=1e-6)
    point = torch.zeros(1, 1, 9, 9)
    point[0, 0, 4, 4] = 1.0
    blurred = gaussian_blur(point, 1.0)
    assert blurred[0, 0, 4, 4].item() == pytest.approx((1 / 2.505950) ** 2, rel=1e-5)  # 0.159241
    assert blurred[0, 0, 4, 5].item() == pytest.approx(math.exp(-0.5) / 2.505950**2, rel=1e-5)
    assert blurred.sum().item() == pytest.approx(1.0, abs=1e-6)  # the whole kernel within the image
    flat = torch.full((1, 3, 5, 5), 0.7)
    assert torch.allclose(gaussian_blur(flat, 2.0), flat)  # the edges repeated: nothing leaks in
    images = torch.rand(4, 16)  # flat 4×4 images, two clients of two groups
    out = shift_clients(_data(images, torch.zeros(4, dtype=torch.long), [2, 2]), Blur(groups=2, strength=1.0), 0)
    assert torch.equal(out.train.x[:2], images[:2])
    assert torch.allclose(out.train.x[2:], gaussian_blur(images[2:].view(2, 1, 4, 4), 1.0).view(2, 16))


def test_contrast_pulls_each_image_to_its_mean() -> None:
    image = torch.tensor([[0.0, 2.0, 4.0, 6.0]])  # 2×2, mean 3
    data = _data(image.repeat(2, 1), torch.zeros(2, dtype=torch.long), [1, 1])
    out = shift_clients(data, Shift(name="contrast", groups=2, strength=0.5), 0)
    assert out.train.x.tolist() == [[0.0, 2.0, 4.0, 6.0], [1.5, 2.5, 3.5, 4.5]]  # 3 + (1 − 0.5)(x − 3)


def test_colour_casts_each_group_by_its_level_in_a_seeded_direction() -> None:
    rgb = torch.zeros(2, 3, 2, 2)
    data = _data(rgb, torch.zeros(2, dtype=torch.long), [1, 1])
    out = shift_clients(data, Colour(groups=2, strength=0.4), 0).train.x
    assert torch.equal(out[0], rgb[0])
    cast = out[1, :, 0, 0]
    assert torch.all(out[1] == cast.view(3, 1, 1))  # one cast per channel, every pixel alike
    assert cast.abs().max().item() == pytest.approx(0.4)  # the largest channel moved by the level
    grey = shift_clients(_data(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), [1, 1]), Colour(groups=2), 0)
    assert grey.train.x[1].abs().tolist() == [1.0] * 4  # one channel: a brightness change of ±level


def test_label_swaps_exchange_disjoint_pairs_in_every_group_but_the_first() -> None:
    y = torch.arange(10).repeat(3)
    data = _data(torch.zeros(30, 1), y, [10, 10, 10], classes=10)
    out = shift_clients(data, Shift(name="labels", groups=3, mode="swap", pairs=2), 0).train.y
    assert out[:10].tolist() == list(range(10))
    for g in (1, 2):
        table = out[10 * g : 10 * g + 10]
        assert torch.equal(table[table], torch.arange(10))  # an involution: pairs swapped
        assert int((table != torch.arange(10)).sum()) == 4  # 2 pairs, 4 classes moved
    with pytest.raises(DataError, match="needs 12 classes"):
        shift_clients(data, Shift(name="labels", groups=2, mode="swap", pairs=6), 0)


def test_label_permutations_compose_with_any_partition_of_any_dataset() -> None:
    for partition in ({"name": "dirichlet", "alpha": 0.3}, {"name": "shards"}, {"name": "pareto"}):
        config = parse_config(
            {"dataset": "breast_cancer", "partition": partition, "num_clients": 4, "shift": {"name": "labels"}}
        )
        plain = federated_data(parse_config({**config.model_dump(), "shift": "none"}), components(config))
        shifted = federated_data(config, components(config))
        assert torch.equal(shifted.train.x, plain.train.x)  # the same split, only the labels changed
        assert shifted.info["group"].tolist() == [0, 1, 2, 3]


class Invert(ShiftComponent):
    """A plugin's shift: group g ≥ 1 negates its inputs."""

    name: ClassVar[str] = "test_invert"

    def transform(self, part: ClientData, who: Assignment) -> ClientData:
        sign = 1.0 - 2.0 * (who.rows(part) > 0).float()
        return ClientData(part.x * sign[:, None], part.y, part.offsets)


def test_a_plugins_shift_is_used_by_name_and_must_keep_the_clients() -> None:
    if "test_invert" not in SHIFTS.names():
        SHIFTS.register(Invert)
    data = _data(torch.ones(2, 3), torch.zeros(2, dtype=torch.long), [1, 1])
    out = shift_clients(data, Shift(name="test_invert", groups=2), 0)
    assert out.train.x.tolist() == [[1.0] * 3, [-1.0] * 3]

    class Lossy(Invert):
        name: ClassVar[str] = "test_lossy"

        def transform(self, part: ClientData, who: Assignment) -> ClientData:
            return ClientData(part.x[:1], part.y[:1], part.offsets[:2])

    with pytest.raises(DataError, match="must return the clients' samples"):
        shift_clients(data, Lossy(groups=2), 0)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--dataset", "breast_cancer", "--set", "shift={name: blur}"], "not images"),
        (["--dataset", "breast_cancer", "--set", "shift={name: contrast}"], "not images"),
        (["--dataset", "digits", "--set", "shift={name: domain}"], "has no domains"),
        (["--dataset", "digits", "--set", "shift={name: noise, groups: 2, levels: [1]}"], "levels lists"),
        (["--dataset", "digits", "--set", "shift={name: noise, per_client: maybe}"], "shift.per_client"),
    ],
)
def test_the_cli_refuses_a_shift_the_data_cannot_take(
    args: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert_refused(
        ["run", *args, "--rounds", "1", "--set", "num_clients=4", "--quiet", "--out", "r"], fragment, tmp_path
    )


def test_a_run_states_each_clients_group_and_level_in_clients_csv(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fedhet.cli.main import app

    out = tmp_path / "run"
    args = ["run", "--dataset", "digits", "--rounds", "1", "--set", "num_clients=4", "--set", "model.hidden=[4]"]
    args += ["--set", "shift={name: blur, groups: 2, strength: 1.5}", "--quiet", "--threads", "1", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = (out / "clients.csv").read_text().splitlines()
    header = lines[0].split(",")
    rows = [dict(zip(header, line.split(","), strict=True)) for line in lines[1:]]
    assert [(r["group"], float(r["shift_level"])) for r in rows] == [("0", 0), ("1", 1.5), ("0", 0), ("1", 1.5)]
    written = yaml.safe_load((out / "config.yaml").read_text())["shift"]
    assert written == {
        "name": "blur",
        "groups": 2,
        "assign": "cyclic",
        "strength": 1.5,
        "levels": None,
        "per_client": False,
    }
