"""FedRolex (Alam, Liu, Yan, Zhang, NeurIPS 2022): rolling sub-model extraction.

As HeteroFL (`fedhet.strategies.heterofl`: capacity levels, Eq. 2's per-coordinate aggregation, the optional
scaler), but the sub-model of a client of level r in round t is a window that rolls over the hidden units: in a
hidden layer of width d it trains the ⌈r·d⌉ units (t mod d), (t mod d) + 1, … taken cyclically (mod d), so that
over d rounds every unit is trained by clients of every level (FedRolex §3, its rolling index i = t mod d). The
global model is scored at the first ⌈r·d⌉ units of each level (``test_accuracy_level<r>``), as HeteroFL's.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field
from torch import Tensor

from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.heterofl import HeteroFL
from fedhet.strategies.submodels import kept


def rolling_units(width: int, level: float, round_: int) -> Tensor:
    """(d,) bool: the ⌈r·d⌉ units from t mod d on, cyclically (FedRolex's window of round t)."""
    start = round_ % width
    return (torch.arange(width) - start) % width < kept(width, level)


@STRATEGIES.register
class FedRolex(HeteroFL):
    """HeteroFL with a rolling window of units in place of the static first ⌈r·d⌉."""

    name: ClassVar[str] = "fedrolex"
    description: ClassVar[str] = "FedRolex: rolling sub-model windows per client capacity (Alam et al. 2022)"
    scaler: bool = Field(False, description="HeteroFL's scaler: hidden outputs divided by the level r in training")

    def unit_sets(self, round_: int, client: int, level: float) -> list[Tensor]:
        """Every client of level r trains the window of ⌈r·d⌉ units from t mod d on, in each hidden layer."""
        return [rolling_units(d, level, round_) for d in self._widths]
