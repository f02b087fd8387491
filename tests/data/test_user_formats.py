"""Every user-data format works with every partitioner, label noise, unseen clients and the per-client split."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fedhet.catalog import PARTITIONERS
from fedhet.experiments.build import components, federated_data
from fedhet.experiments.config import parse_config

N, CLASSES, USERS = 200, 10, 8


def samples() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    y = np.arange(N) % CLASSES
    x = (rng.normal(size=(N, 2, 2)) + y[:, None, None]).astype(np.float32)
    users = np.arange(N) % USERS
    return x, y, users


def arrays_spec(tmp: Path) -> dict[str, Any]:
    x, y, users = samples()
    np.savez(tmp / "d.npz", x=x, y=y, users=users)
    return {"name": "arrays", "path": str(tmp / "d.npz"), "users": "users"}


def table_spec(tmp: Path) -> dict[str, Any]:
    x, y, users = samples()
    with (tmp / "d.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["a", "b", "c", "d", "kind", "user", "label"])
        for i in range(N):
            writer.writerow([*x[i].reshape(-1), "ab"[i % 2], f"u{users[i]}", f"class{y[i]}"])
    return {"name": "table", "path": str(tmp / "d.csv"), "label": "label", "user": "user", "categorical": ["kind"]}


def images_spec(tmp: Path) -> dict[str, Any]:
    x, y, users = samples()
    for i in range(N):
        folder = tmp / "img" / f"c{y[i]}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.clip(x[i] * 40 + 120, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"u{users[i]}_{i}.png")
    return {"name": "image_folder", "path": str(tmp / "img"), "grayscale": True, "user_pattern": "^(u\\d+)_"}


def hf_spec(tmp: Path) -> dict[str, Any]:
    datasets = pytest.importorskip("datasets")
    x, y, users = samples()
    datasets.Dataset.from_dict({"x": x.reshape(N, -1), "label": y, "who": users}).save_to_disk(str(tmp / "hf"))
    return {"name": "huggingface", "path": str(tmp / "hf"), "user": "who"}


FORMATS = {"arrays": arrays_spec, "table": table_spec, "image_folder": images_spec, "huggingface": hf_spec}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_partitioner_label_noise_and_unseen_clients(tmp_path: Path, fmt: str) -> None:
    dataset = FORMATS[fmt](tmp_path)
    for partition in PARTITIONERS.names():
        clients = USERS if partition == "natural" else 6
        raw = {
            "dataset": dataset,
            "partition": partition,
            "num_clients": clients - 2,
            "unseen_clients": 2,
            "test_fraction": 0.25,
            "label_noise": {"fraction": 0.5, "mapping": "shift"},
        }
        cfg = parse_config(raw)
        data = federated_data(cfg, components(cfg))
        assert data.num_clients == clients and int(data.seen.sum()) == clients - 2, partition
        assert int(data.train.sizes.sum() + data.test.sizes.sum()) == N, partition
        assert bool((data.test.sizes >= 1).all()), partition
        assert data.num_classes == CLASSES
        assert int(data.info["corrupted"].sum()) > 0, partition
        if partition == "natural":  # every client is exactly one user's samples
            assert sorted((data.train.sizes + data.test.sizes).tolist()) == [N // USERS] * USERS
