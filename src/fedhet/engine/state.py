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

from typing import Any

from torch import Tensor


class ClientStore:
    """Versioned per-client rows: ``{key: {client: [(round, row), ...]}}`` with rounds increasing."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[int, list[tuple[int, Tensor]]]] = {}

    def read(self, key: str, clients: Tensor, round_: int, default: Tensor) -> Tensor:
        """(m, ...) rows of `clients` as they were before round `round_`; row i of `default` (m, ...) for a client
        never written."""
        table = self._rows.get(key, {})
        out = default.clone()
        for i, k in enumerate(clients.tolist()):
            earlier = [row for r, row in table.get(int(k), []) if r < round_]
            if earlier:
                out[i] = earlier[-1]
        return out

    def write(self, key: str, clients: Tensor, rows: Tensor, round_: int) -> None:
        """Store `rows` as written in round `round_`, replacing any row from that round or later."""
        table = self._rows.setdefault(key, {})
        for k, row in zip(clients.tolist(), rows, strict=True):
            history = [(r, v) for r, v in table.get(int(k), []) if r < round_]
            history.append((round_, row.detach().clone()))
            table[int(k)] = history

    def prune(self, keep_from: int) -> None:
        """Forget versions no read from round `keep_from` on can see (keep the last one before it)."""
        for table in self._rows.values():
            for k, history in table.items():
                before = [i for i, (r, _) in enumerate(history) if r < keep_from]
                if len(before) > 1:
                    table[k] = history[before[-1] :]

    def keys(self) -> list[str]:
        return sorted(self._rows)

    def clients(self, key: str) -> list[int]:
        return sorted(self._rows.get(key, {}))

    def state_dict(self) -> dict[str, Any]:
        return {
            key: {k: [(r, v.clone()) for r, v in history] for k, history in table.items()}
            for key, table in self._rows.items()
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rows = {
            key: {int(k): [(int(r), v.clone()) for r, v in history] for k, history in table.items()}
            for key, table in state.items()
        }
