"""The config's ``shift`` settings, apart from the code that shifts the clients' data (`fedhet.data.shift`), so
that the config validates without importing torch."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from fedhet.registry import Settings

ROTATIONS = 4  # k·90°, k = 0..3: the distinct exact rotations of a square image


class Shift(Settings):
    """A per-group shift of the clients' data, on top of any label partition: each client belongs to one of
    ``groups`` ground-truth groups (stated in clients.csv's ``group`` column), and the data of group g is
    transformed by the group's own transform (both its train and test samples).

    ``rotation``: each image of group g is rotated by g·90° (feature shift; at most 4 groups).
    ``labels``: the labels of group g are permuted by a seeded permutation of the classes, the identity for group 0
    (concept shift: the same image means a different class in each group).
    """

    model_config = ConfigDict(extra="forbid")
    name: Literal["none", "rotation", "labels"] = Field(
        "none", description="none, rotation (images by g·90°) or labels (a class permutation per group)"
    )
    groups: int = Field(4, ge=1, le=64, description="G: the number of ground-truth groups")
    assign: Literal["cyclic", "random"] = Field(
        "cyclic", description="client k in group k mod G (cyclic), or that balanced assignment seeded-shuffled"
    )

    @model_validator(mode="after")
    def _fits(self) -> Shift:
        if self.name == "rotation" and self.groups > ROTATIONS:
            raise ValueError(f"rotation has {ROTATIONS} distinct angles (k·90°): give groups ≤ {ROTATIONS}")
        return self

    @property
    def active(self) -> bool:
        return self.name != "none"
