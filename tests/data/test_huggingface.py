"""Hugging Face datasets (saved to disk, or in the local cache by Hub name) as a Dataset (`huggingface`)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

datasets = pytest.importorskip("datasets")  # the `hf` extra (installed in the dev venv, so this runs)

from PIL import Image  # noqa: E402

from fedhet.catalog import DATASETS  # noqa: E402
from fedhet.datasets import load  # noqa: E402
from fedhet.errors import ConfigError, DataError  # noqa: E402

ONE_LINE = "^[^\n]+$"


def hf(**spec: Any) -> Any:
    return load({"name": "huggingface", **spec})


@pytest.fixture(scope="module")
def images_on_disk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DatasetDict with an image column, a ClassLabel, and users, saved with save_to_disk."""
    rng = np.random.default_rng(0)
    features = datasets.Features(
        {
            "img": datasets.Image(),
            "label": datasets.ClassLabel(names=["a", "b", "c", "d"]),
            "writer": datasets.Value("string"),
        }
    )

    def part(n: int) -> Any:
        pixels = [rng.integers(0, 255, (5, 4)).astype(np.uint8) for _ in range(n)]
        return datasets.Dataset.from_dict(
            {
                "img": [Image.fromarray(p) for p in pixels],
                "label": [i % 3 for i in range(n)],
                "writer": [f"w{i % 2}" for i in range(n)],
            },
            features=features,
        )

    folder = tmp_path_factory.mktemp("hf") / "digits_dd"
    datasets.DatasetDict({"train": part(6), "test": part(3)}).save_to_disk(str(folder))
    return folder


def test_saved_dataset_dict_with_images(images_on_disk: Path) -> None:
    data = hf(path=str(images_on_disk), grayscale=True, user="writer", normalize=False)
    assert data.x.shape == (9, 1, 5, 4) and data.num_classes == 4  # from the ClassLabel, not the labels seen
    assert data.y.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2]
    assert data.users is not None and data.users.tolist() == [0, 1, 0, 1, 0, 1, 0, 1, 0]
    assert float(data.x.min()) >= 0.0 and float(data.x.max()) <= 1.0
    assert hf(path=str(images_on_disk), split="test", size=[3, 3], features=["img"]).x.shape == (3, 3, 3, 3)


def test_saved_dataset_with_numeric_and_list_columns(tmp_path: Path) -> None:
    table = datasets.Dataset.from_dict(
        {"a": [1.0, 2.0, 3.0], "v": [[1, 2], [3, 4], [5, 6]], "y": ["no", "yes", "no"], "note": ["x", "y", "z"]}
    )
    table.save_to_disk(str(tmp_path / "t"))
    data = hf(path=str(tmp_path / "t"), label="y", features=["a", "v"])
    assert data.x.tolist() == [[1, 1, 2], [2, 3, 4], [3, 5, 6]] and data.y.tolist() == [0, 1, 0]
    with pytest.raises(DataError, match="column 'note': features are not numeric"):
        hf(path=str(tmp_path / "t"), label="y")


def test_a_dataset_in_the_local_cache_by_hub_name(tmp_path: Path) -> None:
    """The cache layout a Hub download leaves (<cache>/<owner>___<name>/<config>/<version>/<hash>/) is read
    offline; here it is made by loading a local folder and naming its cache entry like a Hub dataset's."""
    raw = tmp_path / "toy"
    raw.mkdir()
    (raw / "train.csv").write_text("f1,f2,label\n1,2,0\n3,4,1\n5,6,1\n")
    (raw / "test.csv").write_text("f1,f2,label\n7,8,0\n")
    cache = tmp_path / "cache"
    datasets.load_dataset(str(raw), cache_dir=str(cache))
    shutil.copytree(cache / "toy", cache / "someone___toy")
    offline_before = datasets.config.HF_HUB_OFFLINE
    data = hf(hub="someone/toy", cache_dir=str(cache), split=["train", "test"])
    assert data.x.tolist() == [[1, 2], [3, 4], [5, 6], [7, 8]] and data.y.tolist() == [0, 1, 1, 0]
    assert offline_before == datasets.config.HF_HUB_OFFLINE  # offline only while fedhet reads the cache
    with pytest.raises(
        DataError, match="'someone/other' is not in the local Hugging Face cache; rerun with --download"
    ):
        hf(hub="someone/other", cache_dir=str(cache))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"label": "digit"}, "has no label column 'digit'"),
        ({"user": "author"}, "has no user column 'author'; it has: img, label, writer"),
        ({"features": ["img", "writer"]}, "image column 'img' must be the only feature column"),
        ({"split": "validation"}, "no split 'validation'; it has: train, test"),
    ],
)
def test_bad_mappings_are_one_line_errors(images_on_disk: Path, spec: dict[str, Any], message: str) -> None:
    with pytest.raises(DataError, match=ONE_LINE) as err:
        hf(path=str(images_on_disk), **spec)
    assert message in str(err.value), str(err.value)


def test_mixed_image_sizes_and_bad_folders(tmp_path: Path) -> None:
    mixed = datasets.Dataset.from_dict(
        {"img": [Image.new("L", (2, 2)), Image.new("L", (3, 2))], "label": [0, 1]},
        features=datasets.Features({"img": datasets.Image(), "label": datasets.Value("int64")}),
    )
    mixed.save_to_disk(str(tmp_path / "mixed"))
    with pytest.raises(DataError, match=r"images differ in size: 'row 0' is 2x2, 'row 1' is 2x3.*set size"):
        hf(path=str(tmp_path / "mixed"))
    assert hf(path=str(tmp_path / "mixed"), size=[2, 2]).x.shape == (2, 3, 2, 2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="is not a folder written by save_to_disk"):
        hf(path=str(tmp_path / "empty"))


def test_exactly_one_of_path_and_hub() -> None:
    with pytest.raises(ConfigError, match="give exactly one of 'path'"):
        DATASETS.build({"name": "huggingface"})
    with pytest.raises(ConfigError, match="give exactly one of 'path'"):
        DATASETS.build({"name": "huggingface", "path": "a", "hub": "b"})


def test_natural_partition_from_a_user_column(images_on_disk: Path) -> None:
    from fedhet.data.federate import federate
    from fedhet.data.partition import PARTITIONERS

    data = hf(path=str(images_on_disk), user="writer")
    fed = federate(data, PARTITIONERS.build("natural"), 2, test_fraction=0.25)
    assert fed.num_clients == 2 and int(fed.train.sizes.sum() + fed.test.sizes.sum()) == 9
    assert torch.is_floating_point(fed.train.x)


def test_a_split_of_a_dataset_without_splits_is_refused(tmp_path: Path) -> None:
    datasets.Dataset.from_dict({"a": [1.0, 2.0, 3.0, 4.0], "label": [0, 1, 0, 1]}).save_to_disk(str(tmp_path / "t"))
    with pytest.raises(DataError, match=r"is one dataset without splits; leave out split \(given: nope\)"):
        hf(path=str(tmp_path / "t"), split="nope")


@pytest.mark.parametrize("damaged", ["state.json", "dataset_info.json", "arrow"])
def test_a_damaged_saved_dataset_is_one_line(tmp_path: Path, damaged: str) -> None:
    datasets.Dataset.from_dict({"a": [1.0, 2.0, 3.0, 4.0], "label": [0, 1, 0, 1]}).save_to_disk(str(tmp_path / "t"))
    files = {"arrow": next((tmp_path / "t").glob("*.arrow"))}
    target = files.get(damaged, tmp_path / "t" / damaged)
    target.write_bytes(target.read_bytes()[: len(target.read_bytes()) // 2])  # cut in the middle
    with pytest.raises(DataError, match=ONE_LINE) as info:
        hf(path=str(tmp_path / "t"))
    assert "dataset 'huggingface'" in str(info.value)
