"""The generated per-user languages (`fedhet.data.markov_text`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedhet.data.markov_text import MarkovText


def test_the_dataset_is_seeded_and_windows_predict_the_next_token() -> None:
    spec = MarkovText(num_users=3, samples_per_user=5, seq_len=4, vocab=6)
    a, b = spec.load(Path()), spec.load(Path())
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(a.x, MarkovText(num_users=3, samples_per_user=5, seq_len=4, vocab=6, seed=1).load(Path()).x)
    assert a.x.shape == (15, 4) and a.num_classes == 6
    assert torch.equal(a.users, torch.tensor([0] * 5 + [1] * 5 + [2] * 5))
    # consecutive windows of one user's text: the next window starts one token later, its label is its successor
    assert torch.equal(a.x[1, :-1], a.x[0, 1:]) and a.y[0] == a.x[1, -1]


def test_languages_mix_a_shared_task_chain_with_each_users_own() -> None:
    shared = MarkovText(num_users=4, personal=0.0).languages()
    assert np.allclose(shared, shared[0])  # no personal part: one language
    mixed = MarkovText(num_users=4, personal=0.5).languages()
    assert not np.allclose(mixed[0], mixed[1])
    assert np.allclose(mixed.sum(axis=2), 1.0)
    generic = MarkovText(num_users=4, generic=True).languages()
    assert np.allclose(generic, generic[0]) and not np.allclose(generic[0], shared[0])
