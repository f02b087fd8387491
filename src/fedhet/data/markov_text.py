"""Generated next-token languages, one per user (no file needed): a stand-in for Shakespeare's roles.

Three kinds of first-order Markov chain over a shared vocabulary of V tokens, each row drawn from a
Dirichlet(`concentration`) (a small concentration: peaked, learnable rows), all from the dataset's `seed`:

* G, the *generic* language (``generic: true`` gives every user's text from G: a corpus to pretrain on);
* T = (1 − `shift`) G + `shift` T', the *task* language every user shares (T' a chain of its own);
* U_k, user k's own chain, mixed in with weight `personal`: user k's text follows (1 − `personal`) T + `personal` U_k.

So pretraining on G helps, federation helps (T is shared), and no single model fits every user exactly (U_k).
Each user's text is one sequence of ``samples_per_user + seq_len`` tokens from a uniformly drawn first token;
the samples are its windows of `seq_len` tokens (stride 1) with the next token as the label, and
``Dataset.users`` holds the user of each window (partition ``natural``: one client per user).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from pydantic import Field

from fedhet.data.dataset import Dataset
from fedhet.data.sources import DATASETS, DatasetSource
from fedhet.seeding import numpy_rng


def chain(rng: np.random.Generator, vocab: int, concentration: float) -> np.ndarray:
    """(V, V) transition matrix, each row from Dirichlet(concentration · 1)."""
    return rng.dirichlet(np.full(vocab, concentration), size=vocab)


def sample_texts(rng: np.random.Generator, chains: np.ndarray, length: int) -> np.ndarray:
    """(U, length) one text per user, user u's from the chain ``chains[u]`` (U, V, V), all users stepped together."""
    users, vocab = chains.shape[0], chains.shape[1]
    cumulative = chains.cumsum(axis=2)
    cumulative[..., -1] = 1.0  # no draw beyond the last token by rounding
    texts = np.empty((users, length), dtype=np.int64)
    texts[:, 0] = rng.integers(vocab, size=users)
    rows = np.arange(users)
    for t in range(1, length):
        draw = rng.random((users, 1))
        texts[:, t] = (cumulative[rows, texts[:, t - 1]] < draw).sum(axis=1)
    return texts


@DATASETS.register
class MarkovText(DatasetSource):
    """Per-user generated languages for next-token prediction (see the module doc)."""

    name: ClassVar[str] = "markov_text"
    description: ClassVar[str] = "generated next-token languages, one per user: a shared task chain + a user's own"
    embedded: bool = True
    vocab: int = Field(24, ge=2, le=1024, description="V: tokens in the vocabulary")
    num_users: int = Field(20, ge=1, le=10_000, description="users (one language each)")
    samples_per_user: int = Field(300, ge=1, le=100_000, description="windows (samples) per user")
    seq_len: int = Field(16, ge=1, le=1024, description="tokens per input window")
    concentration: float = Field(0.1, gt=0, le=100, description="Dirichlet concentration of every chain's rows")
    shift: float = Field(0.5, ge=0, le=1, description="how far the shared task language is from the generic one")
    personal: float = Field(0.3, ge=0, le=1, description="weight of each user's own chain in its language")
    generic: bool = Field(False, description="every user's text from the generic language (a pretraining corpus)")
    seed: int = Field(0, ge=0, description="seeds the languages and the texts")

    def languages(self) -> np.ndarray:
        """(U, V, V) each user's transition matrix."""
        rng = numpy_rng(self.seed, "markov-text/chains")
        generic = chain(rng, self.vocab, self.concentration)
        task = (1 - self.shift) * generic + self.shift * chain(rng, self.vocab, self.concentration)
        own = np.stack([chain(rng, self.vocab, self.concentration) for _ in range(self.num_users)])
        if self.generic:
            return np.broadcast_to(generic, own.shape).copy()
        return (1 - self.personal) * task[None] + self.personal * own

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        rng = numpy_rng(self.seed, "markov-text/texts", int(self.generic))
        texts = sample_texts(rng, self.languages(), self.samples_per_user + self.seq_len)
        index = np.arange(self.samples_per_user)[:, None] + np.arange(self.seq_len)[None, :]
        x = texts[:, index].reshape(-1, self.seq_len)  # (U · n, L)
        y = texts[:, self.seq_len :].reshape(-1)  # the token after each window
        users = np.repeat(np.arange(self.num_users), self.samples_per_user)
        return Dataset(self.name, torch.from_numpy(x), torch.from_numpy(y), self.vocab, torch.from_numpy(users))
