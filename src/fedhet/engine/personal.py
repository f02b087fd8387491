"""Personal models: the part of a client's model that stays with the client between rounds.

A `Personal` spec names the part of the model that is the client's own (``parts``: parameter names or patterns,
``"head"`` for the last layer's parameters, ``"body"`` for the rest, ``"*"`` for all of them) and the key its rows
are kept under in the engine's `ClientStore` (on the client's side: natively in the engine, under Flower on the
node that holds the client). A plan with a `Personal` spec starts each client from its own model: the received
global model on the shared coordinates, the client's stored rows on the personal ones (the model's initial values
for a client that has none yet); after training, the engine stores the personal coordinates and sends back only
the shared part (the personal coordinates of `LocalResult.params` are the received model's: zero update), so any
strategy aggregates only what is shared. Ditto keeps a whole personal model (``"*"``), FedPer and FedRep a head
(``"head"``), LG-FedAvg a body (``"body"``).

A client without stored rows starts from the model's initial values on the personal part (``fresh:
"initial"``: the same start as a local model trained alone), or from the global model it receives (``"global"``).
``mix`` names a per-client scalar α kept beside the rows: the client's personal model is then the interpolation
α·v + (1 − α)·w of its rows v and the global model w (APFL's mixed model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

import torch
from torch import Tensor

from fedhet.engine.functional import FlatModel
from fedhet.errors import ConfigError

HEAD, BODY = "head", "body"


@dataclass(frozen=True)
class Personal:
    """Which part of each client's model is its own, and where the engine keeps it (see the module docstring)."""

    key: str = "personal"
    parts: tuple[str, ...] = ("*",)
    fresh: Literal["initial", "global"] = "initial"  # the rows of a client that has none yet
    mix: str | None = None  # a per-client scalar α: the personal model is α·v + (1 − α)·w
    mix_initial: float = 0.5  # α of a client that has none yet

    @property
    def what(self) -> str:
        """How errors name it."""
        return f"the personal part '{self.key}'"

    def mask(self, model: FlatModel) -> Tensor:
        """(P,) bool: the personal coordinates."""
        return parameter_mask(model, self.parts, self.what)


def head_names(model: FlatModel) -> list[str]:
    """The parameters of the model's last module that has parameters (its output layer)."""
    owners = [name.rpartition(".")[0] for name in model.names]
    last = owners[-1]
    return [name for name, owner in zip(model.names, owners, strict=True) if owner == last]


def parameter_names(model: FlatModel, patterns: Sequence[str], what: str) -> list[str]:
    """The model's parameters matched by `patterns` (names, shell-style patterns such as ``"fc2.*"``, ``"head"`` or
    ``"body"``), in the model's order; a pattern that matches nothing is a one-line `ConfigError` naming `what`."""
    head = head_names(model)
    chosen: set[str] = set()
    for pattern in patterns:
        if pattern == HEAD:
            found = set(head)
        elif pattern == BODY:
            found = set(model.names) - set(head)
        else:
            found = {n for n in model.names if fnmatchcase(n, pattern)}
        if not found:
            raise ConfigError(
                f"{what}: '{pattern}' matches none of the model's parameters ({', '.join(model.names)}); give "
                "parameter names or patterns such as 'head', 'body' or 'fc2.*'"
            )
        chosen |= found
    return [n for n in model.names if n in chosen]


def parameter_mask(model: FlatModel, patterns: Sequence[str], what: str) -> Tensor:
    """(P,) bool: the coordinates of the parameters `patterns` match (see `parameter_names`)."""
    mask = torch.zeros(model.size, dtype=torch.bool)
    for name in parameter_names(model, patterns, what):
        mask[model.slices[name]] = True
    return mask


def spans(mask: Tensor) -> list[slice]:
    """The contiguous runs of True in a (P,) mask, as slices (a personal part is a few whole parameters)."""
    edges = torch.diff(mask.int(), prepend=torch.zeros(1, dtype=torch.int), append=torch.zeros(1, dtype=torch.int))
    begins, ends = torch.nonzero(edges == 1).flatten().tolist(), torch.nonzero(edges == -1).flatten().tolist()
    return [slice(b, e) for b, e in zip(begins, ends, strict=True)]


def gather(rows: Tensor, parts: list[slice]) -> Tensor:
    """rows[:, mask] for the mask whose runs are `parts` (a view when it is one run)."""
    if len(parts) == 1:
        return rows[:, parts[0]]
    return torch.cat([rows[:, part] for part in parts], dim=1)


def scatter_(out: Tensor, parts: list[slice], values: Tensor) -> Tensor:
    """out[:, mask] = values (m, |mask|) for the mask whose runs are `parts`; returns `out`."""
    at = 0
    for part in parts:
        width = part.stop - part.start
        out[:, part] = values[:, at : at + width]
        at += width
    return out
