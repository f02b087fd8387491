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

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

PACKED = "#packed"  # a key's rows packed as tensors (clients, versions, rows): how `TableStore` checkpoints a table


class ClientStore:
    """Versioned per-client rows: ``{key: {client: [(round, row), ...]}}`` with rounds increasing."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[int, list[tuple[int, Tensor]]]] = {}
        self._adopted: set[str] = set()  # keys written with `adopt` (the only ones `prune` compacts)
        self._pending: dict[str, set[int]] = {}  # clients with more than one version: the only ones `prune` visits
        self._dropped: dict[str, int] = {}  # rows of adopted tensors forgotten since the key's last compaction

    def read(self, key: str, clients: Tensor, round_: int, default: Tensor) -> Tensor:
        """(m, ...) rows of `clients` as they were before round `round_`, written into `default` (m, ...) in place
        (the caller's fresh tensor: its row i stays for a client never written) and returned."""
        for i, row in enumerate(self.latest(key, clients, round_)):
            if row is not None:
                default[i] = row
        return default

    def stacked(self, key: str, clients: Tensor, round_: int, fresh: Callable[[], Tensor]) -> Tensor:
        """(m, ...) rows of `clients` as they were before round `round_`, the row `fresh()` for a client never
        written: a view of the store's memory where the rows lie in order in one adopted tensor (`write`; not to
        be written into), else one new tensor, each row copied once."""
        rows = self.latest(key, clients, round_)
        block = _as_block(rows)
        if block is not None:
            return block
        once = functools.cache(fresh)  # worked out only for a client without rows, and once
        return torch.stack([once() if row is None else row for row in rows])

    def latest(self, key: str, clients: Tensor, round_: int) -> list[Tensor | None]:
        """Each client's last row written before round `round_` (None: none), the store's own tensors."""
        table = self._rows.get(key, {})
        out: list[Tensor | None] = []
        for k in clients.tolist():
            earlier = [row for r, row in table.get(int(k), []) if r < round_]
            out.append(earlier[-1] if earlier else None)
        return out

    def write(
        self, key: str, clients: Tensor, rows: Tensor, round_: int, keep_from: int | None = None, adopt: bool = False
    ) -> None:
        """Store `rows` as written in round `round_`, replacing any row from that round or later. With
        `keep_from`, also forget the versions of these clients that `prune(keep_from)` would, and copy the new
        rows into their memory (no fresh allocation per row in a steady run). With `adopt`, keep the rows' own
        memory instead of copying them (the caller gives `rows` up: nothing writes into it again); `prune` copies
        out the rows of an adopted tensor that is mostly forgotten, so that it is freed."""
        table = self._rows.setdefault(key, {})
        if adopt:
            self._adopted.add(key)
        for k, row in zip(clients.tolist(), rows.detach(), strict=True):
            history = table.get(int(k), [])
            kept: list[tuple[int, Tensor | None]] = [(r, v) for r, v in history if r < round_]
            kept.append((round_, None))  # None: the new row's place
            if keep_from is not None:
                kept = _visible_from(kept, keep_from)
            if adopt:
                new = row
            else:
                alive = {id(v) for _, v in kept}
                spare = (v for _, v in history if id(v) not in alive and _same_layout(v, row) and _own_memory(v))
                buffer = next(spare, None)
                new = buffer.copy_(row) if buffer is not None else row.clone()
            table[int(k)] = [(r, new if v is None else v) for r, v in kept]
            self._forgot(key, int(k), history, table[int(k)])

    def _forgot(self, key: str, k: int, before: list[tuple[int, Tensor]], after: list[tuple[int, Tensor]]) -> None:
        """Note client k's history change: rows of adopted tensors it forgot, and whether `prune` must visit it."""
        if len(after) > 1:
            self._pending.setdefault(key, set()).add(k)
        kept = {id(v) for _, v in after}
        gone = sum(1 for _, v in before if id(v) not in kept and not _own_memory(v))
        if gone:
            self._dropped[key] = self._dropped.get(key, 0) + gone

    def prune(self, keep_from: int) -> None:
        """Forget versions no read from round `keep_from` on can see (keep the last one before it), and copy out
        the rows still kept of an adopted tensor that is more than half forgotten (the store then holds at most
        about 2.5 times the memory of its rows). Visits only the clients with several versions, and compacts a key
        once the rows forgotten since its last compaction reach a quarter of its clients (so a round's cost
        follows its cohort, not the number of clients with rows)."""
        for key, table in self._rows.items():
            for k in self._pending.pop(key, set()):
                if k in table:
                    before = table[k]
                    table[k] = _visible_from(before, keep_from)
                    self._forgot(key, k, before, table[k])
            if key in self._adopted and 4 * self._dropped.get(key, 0) >= max(1, len(table)):
                _compact(table)
                self._dropped[key] = 0

    def keys(self) -> list[str]:
        return sorted(self._rows)

    def clients(self, key: str) -> list[int]:
        return sorted(self._rows.get(key, {}))

    def state_dict(self) -> dict[str, Any]:
        """The rows as they are now: references, as torch's `state_dict` (later writes may reuse their memory;
        save or clone them before training on)."""
        return {key: {k: list(history) for k, history in table.items()} for key, table in self._rows.items()}

    def rows_of(self, clients: list[int]) -> dict[str, Any]:
        """`state_dict` of `clients` alone (every key, with the rows of those of them that have some): what a shard
        trained by another engine needs (`fedhet.experiments.actors`), read in time that follows `clients`, not the
        number of clients with rows."""
        return {key: {k: list(table[k]) for k in clients if k in table} for key, table in self._rows.items()}

    def update(self, state: dict[str, Any]) -> None:
        """Replace the rows of the clients `state` holds (a `state_dict` of some clients: those another engine
        trained, `fedhet.experiments.actors`) with its rows; the other clients keep theirs."""
        for key, table in state.items():
            mine = self._rows.setdefault(key, {})
            self._adopted.add(key)  # its rows may be rows of one tensor (as sent): `prune` copies them out
            for k, history in table.items():
                mine[int(k)] = [(int(r), v) for r, v in history]
                if len(history) > 1:  # several versions: `prune` visits it
                    self._pending.setdefault(key, set()).add(int(k))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Rows as `state_dict` gave them (or `TableStore.state_dict`: its packed rows, one entry per client)."""
        self._adopted, self._rows, self._dropped, self._pending = set(), {}, {}, {}
        for key, table in state.items():
            rows = {int(k): [(int(r), v.clone()) for r, v in history] for k, history in table.items() if k != PACKED}
            packed = table.get(PACKED)
            if packed is not None:
                clients, versions = packed["clients"].tolist(), packed["versions"].tolist()
                for k, r, v in zip(clients, versions, packed["rows"], strict=True):
                    rows[k] = [(r, v.clone()), *rows.get(k, [])]
            self._rows[key] = rows
            self._pending[key] = {k for k, history in rows.items() if len(history) > 1}


V = TypeVar("V")


def _visible_from(history: list[tuple[int, V]], keep_from: int) -> list[tuple[int, V]]:
    """The versions a read from round `keep_from` on can see: the last one before it and all from it on."""
    before = [i for i, (r, _) in enumerate(history) if r < keep_from]
    return history[before[-1] :] if len(before) > 1 else history


def _same_layout(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device


def _own_memory(row: Tensor) -> bool:
    """Whether `row` is all of its memory (not a row of an adopted tensor)."""
    return row.untyped_storage().nbytes() == row.numel() * row.element_size()


def _as_block(rows: list[Tensor | None]) -> Tensor | None:
    """The rows as one (m, ...) view where they lie in order, evenly spaced, in one tensor's memory (rows of an
    adopted tensor, read in the order they were written); else None."""
    if len(rows) < 2 or any(row is None for row in rows):
        return None
    first, second = rows[0], rows[1]
    assert first is not None and second is not None
    where, step = first.untyped_storage().data_ptr(), second.storage_offset() - first.storage_offset()
    if step < first.numel() or not first.is_contiguous():
        return None
    for i, row in enumerate(rows):
        assert row is not None
        same = row.untyped_storage().data_ptr() == where and _same_layout(row, first) and row.is_contiguous()
        if not same or row.storage_offset() != first.storage_offset() + i * step:
            return None
    return first.as_strided((len(rows), *first.shape), (step, *first.stride()), first.storage_offset())


def _compact(table: dict[int, list[tuple[int, Tensor]]]) -> None:
    """Copy out the rows of each adopted tensor whose kept rows fill less than half of it."""
    kept: dict[int, int] = {}
    size: dict[int, int] = {}
    for history in table.values():
        for _, row in history:
            if not _own_memory(row):
                where = row.untyped_storage().data_ptr()
                kept[where] = kept.get(where, 0) + row.numel() * row.element_size()
                size[where] = row.untyped_storage().nbytes()
    sparse = {where for where, used in kept.items() if 2 * used < size[where]}
    if not sparse:
        return
    for k, history in table.items():
        table[k] = [(r, row.clone() if row.untyped_storage().data_ptr() in sparse else row) for r, row in history]
