"""Label corruption: mappings by hand, the share of clients, determinism."""

from __future__ import annotations

import numpy as np
import torch

from fedhet.data.labels import LabelNoise, corrupt_labels, label_map
from helpers.tiny import tiny_data


def test_mappings() -> None:
    rng = np.random.default_rng(0)
    assert label_map(LabelNoise(mapping="reverse"), 4, rng).tolist() == [3, 2, 1, 0]
    assert label_map(LabelNoise(mapping="shift"), 4, rng).tolist() == [1, 2, 3, 0]
    assert label_map(LabelNoise(mapping="pairs", pairs=[(0, 2)]), 4, rng).tolist() == [2, 1, 0, 3]
    perm = label_map(LabelNoise(mapping="permutation"), 10, rng)
    assert sorted(perm.tolist()) == list(range(10)) and bool((perm != torch.arange(10)).all())
    assert label_map(LabelNoise(mapping="random"), 4, rng) is None


def test_fraction_of_clients_flipped_on_both_splits() -> None:
    data = tiny_data([6] * 10, classes=3)
    out = corrupt_labels(data, LabelNoise(fraction=0.3, mapping="reverse"), seed=1)
    flags = out.info["corrupted"]
    assert int(flags.sum()) == 3
    for k in range(10):
        _, y_old = data.train.client(k)
        _, y_new = out.train.client(k)
        expected = 2 - y_old if flags[k] else y_old
        assert torch.equal(y_new, expected)
        assert torch.equal(out.test.client(k)[1], 2 - data.test.client(k)[1] if flags[k] else data.test.client(k)[1])
    again = corrupt_labels(data, LabelNoise(fraction=0.3, mapping="reverse"), seed=1)
    assert torch.equal(again.info["corrupted"], flags)


def test_random_noise_changes_every_chosen_label_and_train_only() -> None:
    data = tiny_data([50] * 4, classes=5)
    out = corrupt_labels(data, LabelNoise(fraction=1.0, mapping="random", rate=0.2, splits="train"), seed=0)
    changed = float((out.train.y != data.train.y).float().mean())
    assert 0.1 < changed < 0.3
    assert torch.equal(out.test.y, data.test.y)
