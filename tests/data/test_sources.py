"""Stand-ins (`DatasetSource.stand_in`, for ``--estimate``): the real shapes, classes and users, at any scale."""

from __future__ import annotations

import pytest
import torch

from fedhet.catalog import DATASETS
from fedhet.data.sources import random_dataset


@pytest.mark.parametrize(
    ("spec", "size", "shape", "classes", "users"),
    [
        ({"name": "mnist"}, 70_000, (1, 28, 28), 10, 0),
        ({"name": "fashion_mnist", "flatten": True}, 70_000, (784,), 10, 0),
        ({"name": "emnist", "split": "byclass"}, 814_255, (1, 28, 28), 62, 0),
        ({"name": "cifar10"}, 60_000, (3, 32, 32), 10, 0),
        ({"name": "femnist"}, 805_263, (1, 28, 28), 62, 3_550),
        ({"name": "shakespeare"}, 4_226_158, (80,), 80, 1_129),
        ({"name": "sent140"}, 927 * 80, (200,), 2, 927),
        ({"name": "adult"}, 45_222, (104,), 2, 2),
        ({"name": "swapped_groups", "base": "mnist", "clients": 24}, 70_000, (784,), 10, 24),
    ],
)
def test_a_stand_in_has_the_real_shapes_at_scale(
    spec: dict[str, object], size: int, shape: tuple[int, ...], classes: int, users: int
) -> None:
    data = DATASETS.build(spec).stand_in(0.01)
    assert data is not None
    assert len(data) == round(size * 0.01) and tuple(data.x.shape[1:]) == shape and data.num_classes == classes
    assert int(data.y.max()) < classes and int(data.y.min()) >= 0
    if users:
        assert data.users is not None and len(data.users.unique()) <= users


def test_tokens_stay_below_the_vocabulary_and_owners_shrink_with_scale() -> None:
    data = random_dataset("t", 10_000, (5,), 3, scale=0.5, users=100, vocabulary=7)
    assert data.x.dtype == torch.int64 and int(data.x.max()) < 7 and len(data) == 5_000
    assert data.users is not None and len(data.users.unique()) == 50


def test_a_source_without_files_of_its_own_has_no_stand_in() -> None:
    assert DATASETS.build({"name": "arrays", "path": "x.npz"}).stand_in() is None
