"""The config's ``label_noise`` settings, apart from the code that corrupts labels (`fedhet.data.labels`), so
that the config validates without importing torch."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from fedhet.registry import Settings


class LabelNoise(Settings):
    """Which clients get corrupted labels, and how.

    Mappings: ``reverse`` y → C−1−y; ``shift`` y → (y+1) mod C; ``permutation`` one fixed random derangement
    of the classes (the same for every affected client); ``pairs`` swaps the listed label pairs;
    ``random`` replaces the label by a uniformly drawn other class (label noise).
    """

    model_config = ConfigDict(extra="forbid")
    fraction: float = Field(0.0, ge=0, le=1, description="share of clients whose labels are corrupted")
    mapping: Literal["reverse", "shift", "permutation", "pairs", "random"] = Field(
        "reverse", description="how labels change: C−1−y, y+1 mod C, a fixed derangement, listed pairs, or random"
    )
    pairs: list[tuple[int, int]] = Field(default_factory=list, description="label pairs swapped by 'pairs'")
    rate: float = Field(1.0, ge=0, le=1, description="share of an affected client's samples that are changed")
    splits: Literal["both", "train"] = Field("both", description="corrupt the train and test split, or train only")
