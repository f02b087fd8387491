"""Per-client state that lives with the clients between rounds (a term's rows such as SCAFFOLD's c_i or FedDyn's
∇L_k(θ_k), a persistent optimiser's buffers).

The engine reads the cohort's rows from its `ClientStore` before training and writes the new rows afterwards; the
server never holds them: natively they stay in the engine (the simulated clients' side); under the Flower adapter
each node keeps its own clients' rows (`fedhet.flower`). Rows are stored by name (``"<term>.<state>"``,
``"optimizer.<name>.<state>"``), so checkpoints and nodes serialise them without knowing what they are.

Rows are versioned by the 0-based round that wrote them: reading for round t sees only rows written before t, so a
server that resumes from an older checkpoint finds every client's state as it was at that round.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
from torch import Tensor


class ClientStore:
    """Versioned per-client rows: ``{key: {client: [(round, row), ...]}}`` with rounds increasing."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[int, list[tuple[int, Tensor]]]] = {}

    def read(self, key: str, clients: Tensor, round_: int, default: Tensor) -> Tensor:
        """(m, ...) rows of `clients` as they were before round `round_`, written into `default` (m, ...) in place
        (the caller's fresh tensor: its row i stays for a client never written) and returned."""
        for i, row in enumerate(self.latest(key, clients, round_)):
            if row is not None:
                default[i] = row
        return default

    def stacked(self, key: str, clients: Tensor, round_: int, fresh: Tensor) -> Tensor:
        """(m, ...) rows of `clients` as they were before round `round_`, `fresh` (one row) for a client never
        written: one new tensor, each row copied once."""
        return torch.stack([fresh if row is None else row for row in self.latest(key, clients, round_)])

    def latest(self, key: str, clients: Tensor, round_: int) -> list[Tensor | None]:
        """Each client's last row written before round `round_` (None: none), the store's own tensors."""
        table = self._rows.get(key, {})
        out: list[Tensor | None] = []
        for k in clients.tolist():
            earlier = [row for r, row in table.get(int(k), []) if r < round_]
            out.append(earlier[-1] if earlier else None)
        return out

    def write(self, key: str, clients: Tensor, rows: Tensor, round_: int, keep_from: int | None = None) -> None:
        """Store `rows` as written in round `round_`, replacing any row from that round or later. With
        `keep_from`, also forget the versions of these clients that `prune(keep_from)` would, and copy the new
        rows into their memory (no fresh allocation per row in a steady run)."""
        table = self._rows.setdefault(key, {})
        for k, row in zip(clients.tolist(), rows.detach(), strict=True):
            history = table.get(int(k), [])
            kept: list[tuple[int, Tensor | None]] = [(r, v) for r, v in history if r < round_]
            kept.append((round_, None))  # None: the new row's place
            if keep_from is not None:
                kept = _visible_from(kept, keep_from)
            alive = {id(v) for _, v in kept}
            spare = (v for _, v in history if id(v) not in alive and _same_layout(v, row))
            buffer = next(spare, None)
            new = buffer.copy_(row) if buffer is not None else row.clone()
            table[int(k)] = [(r, new if v is None else v) for r, v in kept]

    def prune(self, keep_from: int) -> None:
        """Forget versions no read from round `keep_from` on can see (keep the last one before it)."""
        for table in self._rows.values():
            for k, history in table.items():
                table[k] = _visible_from(history, keep_from)

    def keys(self) -> list[str]:
        return sorted(self._rows)

    def clients(self, key: str) -> list[int]:
        return sorted(self._rows.get(key, {}))

    def state_dict(self) -> dict[str, Any]:
        """The rows as they are now: references, as torch's `state_dict` (later writes may reuse their memory;
        save or clone them before training on)."""
        return {key: {k: list(history) for k, history in table.items()} for key, table in self._rows.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rows = {
            key: {int(k): [(int(r), v.clone()) for r, v in history] for k, history in table.items()}
            for key, table in state.items()
        }


V = TypeVar("V")


def _visible_from(history: list[tuple[int, V]], keep_from: int) -> list[tuple[int, V]]:
    """The versions a read from round `keep_from` on can see: the last one before it and all from it on."""
    before = [i for i, (r, _) in enumerate(history) if r < keep_from]
    return history[before[-1] :] if len(before) > 1 else history


def _same_layout(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
