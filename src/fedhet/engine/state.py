"""Per-client state that lives with the client between rounds (SCAFFOLD's control variate c_i).

A strategy that needs such state puts a `ClientStateRule` in its `LocalPlan`; the engine reads the cohort's rows
from its `ClientStore` before training (they give the gradient correction), computes the new rows after training
from the rule, stores them and returns the change Δ to the server in `LocalResult.state_delta`. The server never
holds the rows: natively they stay in the engine (the simulated clients' side); under the Flower adapter each node
keeps its own clients' rows in its Flower context (`fedhet.flower`).

Rows are versioned by the 0-based round that wrote them: reading for round t sees only rows written before t, so a
server that resumes from an older checkpoint finds every client's state as it was at that round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor


def scaffold_client_variates(
    c_i: Tensor, c: Tensor, global_params: Tensor, local_params: Tensor, steps: Tensor, lr: Tensor
) -> Tensor:
    """SCAFFOLD option II (Karimireddy et al. 2020, Algorithm 1 line 12): c_i⁺ = c_i − c + (x − y_i) / (K_i η_l),
    row-wise for the cohort."""
    scale = (steps.double() * lr.double()).clamp_min(1e-30).float().unsqueeze(1)
    return c_i - c.unsqueeze(0) + (global_params.unsqueeze(0) - local_params) / scale


@dataclass(frozen=True)
class ControlVariates:
    """SCAFFOLD's client side: correction c − c_i during the local steps, then c_i ← c_i⁺ (option II).

    `c` is the server's control variate, sent with the plan; c_i is the client's own row of the store.
    """

    c: Tensor
    key: ClassVar[str] = "scaffold/c_i"

    def correction(self, rows: Tensor) -> Tensor:
        return self.c.unsqueeze(0) - rows

    def update(self, rows: Tensor, global_params: Tensor, local_params: Tensor, steps: Tensor, lr: Tensor) -> Tensor:
        return scaffold_client_variates(rows, self.c, global_params, local_params, steps, lr)


ClientStateRule = ControlVariates
STATE_RULES: dict[str, type[ControlVariates]] = {"ControlVariates": ControlVariates}


class ClientStore:
    """Versioned per-client rows: ``{key: {client: [(round, row), ...]}}`` with rounds increasing."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[int, list[tuple[int, Tensor]]]] = {}

    def read(self, key: str, clients: Tensor, round_: int, default: Tensor) -> Tensor:
        """(m, P) rows of `clients` as they were before round `round_` (`default` for a client never written)."""
        table = self._rows.get(key, {})
        out = []
        for k in clients.tolist():
            earlier = [row for r, row in table.get(int(k), []) if r < round_]
            out.append(earlier[-1] if earlier else default)
        return torch.stack(out) if out else default.new_zeros((0, *default.shape))

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
