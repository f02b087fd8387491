"""Per-group data shift: seeded groups, exact rotations, per-group label permutations, refusals in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fedhet.cli.main import app
from fedhet.data.dataset import ClientData, FederatedData
from fedhet.data.shift import client_groups, shift_clients
from fedhet.data.shift_config import Shift
from fedhet.errors import ConfigError, DataError
from fedhet.experiments.config import parse_config


def _data(x: torch.Tensor, y: torch.Tensor, sizes: list[int], classes: int = 3) -> FederatedData:
    offsets = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
    part = ClientData(x, y, offsets)
    return FederatedData("t", part, part, classes, torch.ones(len(sizes), dtype=torch.bool))


def test_clients_are_put_in_groups_cyclically_or_in_a_seeded_balanced_order() -> None:
    assert client_groups(7, Shift(name="rotation", groups=3), 0).tolist() == [0, 1, 2, 0, 1, 2, 0]
    shuffled = Shift(name="rotation", groups=3, assign="random")
    drawn = client_groups(7, shuffled, 0)
    assert sorted(drawn.tolist()) == [0, 0, 0, 1, 1, 2, 2]  # the same group sizes
    assert torch.equal(drawn, client_groups(7, shuffled, 0))
    assert not torch.equal(drawn, client_groups(7, shuffled, 1))


def test_rotation_turns_each_groups_images_by_its_angle() -> None:
    image = torch.tensor([[1.0, 2.0, 3.0, 4.0]])  # the 2×2 image [[1, 2], [3, 4]], flat
    data = _data(image.repeat(4, 1), torch.zeros(4, dtype=torch.long), [1, 1, 1, 1])
    out = shift_clients(data, Shift(name="rotation", groups=4), 0)
    assert out.info["group"].tolist() == [0, 1, 2, 3]
    expected = [[1, 2, 3, 4], [2, 4, 1, 3], [4, 3, 2, 1], [3, 1, 4, 2]]  # 0°, 90°, 180°, 270° anticlockwise
    assert out.train.x.tolist() == expected and out.test.x.tolist() == expected
    assert torch.equal(data.train.x, image.repeat(4, 1))  # the input is left as it was


def test_label_permutation_is_the_identity_in_group_zero_and_the_same_in_each_split() -> None:
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    data = _data(torch.zeros(6, 1), y, [3, 3])
    out = shift_clients(data, Shift(name="labels", groups=2), 0)
    assert out.train.y[:3].tolist() == [0, 1, 2]
    assert sorted(out.train.y[3:].tolist()) == [0, 1, 2]  # a permutation of the classes
    assert torch.equal(out.test.y, out.train.y)


def test_no_shift_leaves_the_data_without_groups() -> None:
    data = _data(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), [1, 1])
    assert shift_clients(data, Shift(), 0) is data and "group" not in data.info


@pytest.mark.parametrize(
    ("x", "y", "name", "match"),
    [
        (torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), "rotation", "square images"),
        (torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, dtype=torch.long), "rotation", "tokens"),
        (torch.zeros(2, 4), torch.zeros(2), "labels", "regression"),
    ],
)
def test_a_shift_the_data_cannot_take_is_refused(x: torch.Tensor, y: torch.Tensor, name: str, match: str) -> None:
    with pytest.raises(DataError, match=match):
        shift_clients(_data(x, y, [1, 1]), Shift(name=name, groups=2), 0)  # type: ignore[arg-type]


def test_more_rotation_groups_than_angles_is_refused_by_the_config() -> None:
    with pytest.raises(ConfigError, match="4 distinct angles"):
        parse_config({"shift": {"name": "rotation", "groups": 5}})
    assert parse_config({"shift": {"name": "labels", "groups": 5}}).shift.groups == 5


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--set", "shift={name: rotation, groups: 5}"], "4 distinct angles"),
        (["--set", "shift={name: rotation, groups: 2}", "--dataset", "breast_cancer"], "square images"),
        (["--set", "shift={name: spin}"], "shift"),
    ],
)
def test_the_cli_refuses_a_bad_shift_in_one_line_and_writes_nothing(
    tmp_path: Path, args: list[str], fragment: str
) -> None:
    out = tmp_path / "run"
    base = ["run", "--dataset", "digits", "--rounds", "1", "--set", "num_clients=4", "--quiet", "--out", str(out)]
    result = CliRunner().invoke(app, [*base, *args])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []
