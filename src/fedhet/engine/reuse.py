"""Products of a round's mini-batches that a second training of the same clients may reuse.

The dense backend's Gram path (`fedhet.engine.dense._GramFirstLayer`) starts each chunk of clients with products
that depend only on the chunk's input rows X — X itself and its Gram matrices X Xᵀ (+ 1) — and on one model's
first layer W, b — X Wᵀ + b. A second training in the same round that draws the same mini-batches (Ditto's personal
steps after its global ones: the same batch stream; Ditto's pull towards the received model needs X Aᵀ + a with A
the model the global steps started from) finds them here instead of computing them again.

Entries are found by what they were computed from (the input rows' indices, the layer's values), never by where
they came from, so a hit is always the same numbers; the store holds at most `budget` bytes and is emptied when a
new round starts (`Reuse.start_round`).
"""

from __future__ import annotations

from collections.abc import Callable
from threading import Lock

import torch
from torch import Tensor

REUSE_BYTES = 64 << 20  # a round's reusable products kept at most (the MLP workload's 100 clients need 21 MB)

Key = tuple[object, ...]


class Reuse:
    """Products of the current round's inputs, by what they were computed from (see the module docstring)."""

    def __init__(self, budget: int = REUSE_BYTES) -> None:
        self.budget = budget
        self._round: int | None = None
        self._inputs: dict[Key, tuple[Tensor, Tensor]] = {}
        self._outputs: dict[Key, list[tuple[Tensor, Tensor | None, Tensor]]] = {}
        self._bytes = 0
        self._lock = Lock()  # chunks run on threads

    def start_round(self, round_: int) -> None:
        """Forget the entries of another round than `round_`."""
        if round_ != self._round:
            self._round = round_
            self._inputs, self._outputs, self._bytes = {}, {}, 0

    def inputs(self, key: Key, compute: Callable[[], tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
        """(X, X Xᵀ (+ 1)) of the rows `key` names (`rows_key`), computed by `compute` unless kept."""
        found = self._inputs.get(key)
        if found is None:
            found = compute()
            if self._room(sum(_size(t) for t in found)):
                self._inputs[key] = found
        return found

    def outputs(self, key: Key, weight: Tensor, bias: Tensor | None, compute: Callable[[], Tensor]) -> Tensor:
        """X Wᵀ + b of the rows `key` names and the layer (`weight`, `bias`), computed by `compute` unless kept for
        a layer of the same values."""
        for kept_weight, kept_bias, z in self._outputs.get(key, []):
            same_bias = bias is None if kept_bias is None else bias is not None and torch.equal(kept_bias, bias)
            if same_bias and torch.equal(kept_weight, weight):
                return z
        z = compute()
        if self._room(_size(weight) + _size(z)):  # the layer's values are kept to compare with: copied
            entry = (weight.clone(), None if bias is None else bias.clone(), z)
            self._outputs.setdefault(key, []).append(entry)
        return z

    def _room(self, size: int) -> bool:
        """Whether `size` more bytes fit in the budget (then counted as kept)."""
        with self._lock:
            if self._bytes + size > self.budget:
                return False
            self._bytes += size
            return True


def rows_key(x_all: Tensor, rows: Tensor, bias: bool) -> Key:
    """What names the input rows `rows` of `x_all` (and whether the layer's Gram matrices carry a bias's + 1)."""
    return (x_all.data_ptr(), tuple(x_all.shape), x_all.dtype, bias, tuple(rows.shape), rows.cpu().numpy().tobytes())


def _size(t: Tensor) -> int:
    return t.numel() * t.element_size()
