"""A node's partition file (`fedhet.flower.node.load_partition`): anything but a partition fedhet wrote is one line
naming the file, read without running code."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from flower_helpers import small_config

from fedhet.errors import DataError
from fedhet.experiments.build import components, federated_data
from fedhet.flower.node import load_partition, node_clients, save_partition


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch pwned",))


def _saved(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def test_a_partition_round_trips(tmp_path: Path) -> None:
    config = small_config()
    data = federated_data(config, components(config))
    save_partition(tmp_path / "node-0.pt", data, node_clients(data.num_clients, 0, 2))
    loaded, clients = load_partition(tmp_path / "node-0.pt")
    assert clients.tolist() == node_clients(data.num_clients, 0, 2).tolist()
    assert loaded.num_clients == data.num_clients and loaded.train.sizes[3:].sum() == 0


def _partition(tmp_path: Path) -> dict[str, Any]:
    config = small_config()
    data = federated_data(config, components(config))
    save_partition(tmp_path / "good.pt", data, node_clients(data.num_clients, 0, 2))
    loaded: dict[str, Any] = torch.load(tmp_path / "good.pt", weights_only=True)
    return loaded


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (lambda p: b"", "is not a fedhet node partition"),
        (lambda p: b"garbage" * 100, "is not a fedhet node partition"),
        (lambda p: _saved(p)[:2000], "is not a fedhet node partition"),
        (lambda p: _saved({"params": _Evil()}), "is not a fedhet node partition"),
        (lambda p: _saved([1, 2]), "format 'list'"),
        (lambda p: _saved({**p, "train": {"x": p["train"]["x"]}}), "is a damaged fedhet node partition"),
        (lambda p: _saved({**p, "clients": torch.tensor([0, 99])}), "client ids are out of range"),
        (
            lambda p: _saved({**p, "test": {**p["test"], "offsets": p["test"]["offsets"].flip(0)}}),
            "offsets do not cut its samples",
        ),
    ],
)
def test_a_damaged_or_crafted_partition_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: Any, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "node.pt").write_bytes(content(_partition(tmp_path)))
    with pytest.raises(DataError, match=r"^'node.pt' [^\n]+$") as info:
        load_partition(Path("node.pt"))
    assert message in str(info.value) and not (tmp_path / "pwned").exists()


def test_a_missing_partition_says_how_to_write_it(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"python -m fedhet\.flower\.partitions CONFIG NODES DIR"):
        load_partition(tmp_path / "missing.pt")
