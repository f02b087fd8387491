"""Per-client state for a million clients: each key's rows in one (K, ...) table, in memory or in a file.

`ClientStore` (`fedhet.engine.state`) keeps a Python entry per client and version: fine for thousands of clients,
but a run whose clients each keep a personal model (Ditto, FedRep, ...) over a million clients holds a million
tensors, and a large model's rows outgrow the machine's memory. `TableStore` keeps the same versioned rows with the
same answers: the versions a read of the current round may still need (written from `keep_from` on: this round's)
stay in a small `ClientStore`, and `prune` moves each client's last earlier version into its key's table, a
(K, ...) tensor with the version each row was written in (-1: never written; such a client reads its default).

Where a table lives (``personal_state`` in the run's config, `choose_personal_state`):

- ``memory``: the `ClientStore` alone, as before (only clients that have trained hold rows; ~0.5 KB of Python
  objects per row besides its bytes);
- ``disk``: the tables are memory-mapped files in the run folder (``client-state-<n>.bin``, one per key, created
  through `fedhet.atomic.open_plain`: a link in their place is refused), K × the row's bytes each, sparse on disk
  until written, paged in and out by the kernel; 8 bytes per client of versions in memory;
- ``auto``: disk when a run folder is written and K × the model's bytes (one model-sized row per client) exceed a
  quarter of the memory available at the start, else memory.

The files are scratch space: the checkpoint holds each table's written rows (packed: clients, versions, rows), so a
resumed run (in either mode) reads exactly the rows the interrupted one had.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from fedhet.atomic import open_plain
from fedhet.engine.memory import available_bytes
from fedhet.engine.state import PACKED, ClientStore

PersonalState = Literal["memory", "disk", "auto"]
AUTO_SHARE = 0.25  # `auto` keeps the tables on disk when they would take more than this share of available memory
FILE_PREFIX = "client-state-"


@dataclass
class Table:
    """One key's rows: `rows` (K, ...) and `versions` (K,) int64, the version that wrote each row (-1: none)."""

    rows: Tensor
    versions: np.ndarray
    buffer: mmap.mmap | None = None  # the file mapping behind `rows` (disk)

    def written(self) -> np.ndarray:
        """The clients that have a row, in order."""
        return np.flatnonzero(self.versions >= 0)


class TableStore(ClientStore):
    """A `ClientStore` whose rows older than the current round live in one table per key (module docstring);
    `folder` None keeps the tables in memory, else in files there, each name announced to `claim` before it is
    created (the run folder's marker lists fedhet's files)."""

    def __init__(
        self, num_clients: int, folder: Path | None = None, claim: Callable[[str], None] | None = None
    ) -> None:
        super().__init__()
        self.num_clients = num_clients
        self.folder = folder
        self.claim = claim
        self._tables: dict[str, Table] = {}

    def files(self) -> list[Path]:
        """The tables' files (none in memory)."""
        if self.folder is None:
            return []
        return [self.folder / f"{FILE_PREFIX}{i}.bin" for i in range(len(self._tables))]

    def latest(self, key: str, clients: Tensor, round_: int) -> list[Tensor | None]:
        out = super().latest(key, clients, round_)
        table = self._tables.get(key)
        if table is None:
            return out
        for i, k in enumerate(clients.tolist()):
            if out[i] is None and 0 <= table.versions[k] < round_:
                out[i] = table.rows[k]
        return out

    def prune(self, keep_from: int) -> None:
        """Move each client's last version before `keep_from` into its key's table (the versions from `keep_from`
        on stay as they are: reads from `keep_from` on see what `ClientStore.prune` would leave them)."""
        for key, history_of in self._rows.items():
            moved: list[tuple[int, int, Tensor]] = []
            for k, history in list(history_of.items()):
                earlier = [(r, row) for r, row in history if r < keep_from]
                if not earlier:
                    continue
                moved.append((k, *earlier[-1]))
                later = history[len(earlier) :]
                if later:
                    history_of[k] = later
                else:
                    del history_of[k]
            if moved:
                self._put(key, moved)
        for key in [key for key, history_of in self._rows.items() if not history_of]:
            del self._rows[key]
            self._pending.pop(key, None)
        super().prune(keep_from)

    def _put(self, key: str, moved: list[tuple[int, int, Tensor]]) -> None:
        first = moved[0][2]
        table = self._tables.get(key) or self._new_table(key, first)
        clients = torch.tensor([k for k, _, _ in moved])
        table.rows[clients] = torch.stack([row for _, _, row in moved]).to(table.rows.dtype)
        table.versions[clients.numpy()] = [r for _, r, _ in moved]

    def _new_table(self, key: str, like: Tensor) -> Table:
        shape, dtype = (self.num_clients, *like.shape), like.dtype
        if self.folder is None:
            table = Table(torch.zeros(shape, dtype=dtype), np.full(self.num_clients, -1, dtype=np.int64))
        else:
            name = f"{FILE_PREFIX}{len(self._tables)}.bin"
            if self.claim is not None:
                self.claim(name)
            rows, buffer = mapped_rows(self.folder / name, shape, dtype)
            table = Table(rows, np.full(self.num_clients, -1, dtype=np.int64), buffer)
        self._tables[key] = table
        return table

    def keys(self) -> list[str]:
        return sorted({*self._rows, *self._tables})

    def clients(self, key: str) -> list[int]:
        table = self._tables.get(key)
        written = table.written().tolist() if table is not None else []
        return sorted({*super().clients(key), *written})

    def state_dict(self) -> dict[str, Any]:
        """`ClientStore.state_dict`'s rows of this round, and each table's written rows packed under `PACKED`
        (copies: the tables change in place)."""
        state = super().state_dict()
        for key, table in self._tables.items():
            written = table.written()
            index = torch.from_numpy(written)
            packed = {
                "clients": index,
                "versions": torch.from_numpy(table.versions[written]),
                "rows": table.rows[index],  # advanced indexing: a copy
            }
            state[key] = {**state.get(key, {}), PACKED: packed}
        return state

    def rows_of(self, clients: list[int]) -> dict[str, Any]:
        """`ClientStore.rows_of`, with the tables' rows of `clients` packed as `state_dict` packs them."""
        state = super().rows_of(clients)
        for key, table in self._tables.items():
            index = torch.tensor([k for k in clients if table.versions[k] >= 0], dtype=torch.long)
            packed = {
                "clients": index,
                "versions": torch.from_numpy(table.versions[index.numpy()]),
                "rows": table.rows[index],
            }
            state[key] = {**state.get(key, {}), PACKED: packed}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Rows as `state_dict` (or `ClientStore.state_dict`) gave them: packed ones into the tables."""
        self.close()
        plain = {key: {k: h for k, h in rows.items() if k != PACKED} for key, rows in state.items()}
        super().load_state_dict(plain)
        for key, rows in state.items():
            packed = rows.get(PACKED)
            if packed is None or len(packed["clients"]) == 0:
                continue
            index, versions = packed["clients"].long(), packed["versions"].long()
            table = self._new_table(key, packed["rows"][0])
            table.rows[index] = packed["rows"]
            table.versions[index.numpy()] = versions.numpy()

    def close(self) -> None:
        """Forget the tables (their files stay, as scratch space, until the folder's next run removes them)."""
        tables, self._tables = self._tables, {}
        for table in tables.values():
            if table.buffer is not None:
                table.rows = torch.empty(0)
                with contextlib.suppress(BufferError):  # a view still held: the mapping closes when it is freed
                    table.buffer.close()


def mapped_rows(path: Path, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[Tensor, mmap.mmap]:
    """A zeroed tensor of `shape` mapped onto file `path` (created or emptied; a link there is refused, and nothing
    is written through it), and the mapping."""
    size = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
    fd = open_plain(path, os.O_RDWR | os.O_CREAT, 0o600)  # no O_TRUNC: a hard link is refused before any change
    try:
        os.ftruncate(fd, 0)
        os.ftruncate(fd, max(size, 1))  # a sparse file: no disk used until rows are written
        buffer = mmap.mmap(fd, max(size, 1))
    finally:
        os.close(fd)
    rows = torch.frombuffer(buffer, dtype=torch.uint8, count=size).view(dtype).view(shape)
    return rows, buffer


def projected_bytes(num_clients: int, model_size: int) -> int:
    """The tables' bytes if each client keeps one float32 row of the model's size (a personal model, a term's
    state): what `auto` weighs."""
    return num_clients * model_size * 4


def choose_personal_state(mode: PersonalState, num_clients: int, model_size: int, has_folder: bool) -> str:
    """Where a run's per-client tables live: `mode`, with ``auto`` resolved (module docstring); ``disk`` needs a run
    folder (the caller refuses it without one)."""
    if mode != "auto":
        return mode
    available = available_bytes()
    if not has_folder or available is None:
        return "memory"
    return "disk" if projected_bytes(num_clients, model_size) > AUTO_SHARE * available else "memory"
