"""Per-client state in tables (memory or memory-mapped files): the same rows as `ClientStore`, links refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from fedhet.atomic import LinkError
from fedhet.engine.state import ClientStore
from fedhet.engine.state_store import TableStore, choose_personal_state, mapped_rows, projected_bytes
from helpers.hostile import assert_refused


def _stores(tmp_path: Path) -> list[ClientStore]:
    return [ClientStore(), TableStore(6), TableStore(6, tmp_path)]


def test_tables_read_what_the_client_store_reads(tmp_path: Path) -> None:
    """A run's pattern (read, write, prune each round; some clients twice a round) gives the same rows in each."""
    stores = _stores(tmp_path)
    g = torch.Generator().manual_seed(0)
    for round_ in range(6):
        clients = torch.randperm(6, generator=g)[:3]
        rows = torch.randn(3, 4, generator=g)
        seen = [s.read("k", clients, round_, torch.full((3, 4), -1.0)) for s in stores]
        for other in seen[1:]:
            torch.testing.assert_close(other, seen[0], rtol=0, atol=0)
        fresh = [s.stacked("k", clients, round_, lambda: torch.zeros(4)) for s in stores]
        for other in fresh[1:]:
            torch.testing.assert_close(other, fresh[0], rtol=0, atol=0)
        for s in stores:
            s.write("k", clients, rows, round_, keep_from=round_)
            s.write("k", clients[:1], rows[:1] * 2, round_ + 1, keep_from=round_)  # a later phase of the round
            s.prune(round_)
    assert stores[1].clients("k") == stores[0].clients("k")
    assert (tmp_path / "client-state-0.bin").stat().st_size == 6 * 4 * 4  # K rows of 4 float32
    final = torch.arange(6)
    expected = stores[0].read("k", final, 99, torch.zeros(6, 4))
    (tmp_path / "again").mkdir()
    for store in stores[1:]:  # and through the checkpoint's form (packed tables), into each kind of store
        for s in (store, TableStore(6), TableStore(6, tmp_path / "again"), ClientStore()):
            if s is not store:
                s.load_state_dict(store.state_dict())
            torch.testing.assert_close(s.read("k", final, 99, torch.zeros(6, 4)), expected, rtol=0, atol=0)


def test_a_table_holds_the_last_row_before_the_round_and_the_store_this_rounds() -> None:
    store = TableStore(4)
    store.write("k", torch.tensor([1]), torch.tensor([[1.0]]), 0)
    store.prune(8)  # round 1 starts: version 0 moves into the table
    assert store._tables["k"].versions.tolist() == [-1, 0, -1, -1] and not store._rows
    store.write("k", torch.tensor([1]), torch.tensor([[2.0]]), 9)
    read = lambda t: store.read("k", torch.tensor([1, 2]), t, torch.zeros(2, 1)).flatten().tolist()  # noqa: E731
    assert read(9) == [1.0, 0.0]  # version 9 is not visible to a read of version 9
    assert read(10) == [2.0, 0.0]
    assert store.state_dict()["k"][1] == [(9, torch.tensor([2.0]))]


def test_a_link_in_place_of_a_state_file_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"precious")
    (tmp_path / "run").mkdir()
    os.symlink(outside, tmp_path / "run/client-state-0.bin")
    with pytest.raises(LinkError, match="symbolic link"):
        mapped_rows(tmp_path / "run/client-state-0.bin", (10, 3), torch.float32)
    os.unlink(tmp_path / "run/client-state-0.bin")
    os.link(outside, tmp_path / "run/client-state-0.bin")
    with pytest.raises(LinkError, match="hard link"):
        mapped_rows(tmp_path / "run/client-state-0.bin", (10, 3), torch.float32)
    assert outside.read_bytes() == b"precious"


def test_auto_chooses_disk_when_the_rows_would_fill_a_quarter_of_memory() -> None:
    assert projected_bytes(1_000_000, 130) == 520_000_000
    assert choose_personal_state("auto", 10, 130, has_folder=True) == "memory"
    assert choose_personal_state("auto", 10**9, 10**6, has_folder=True) == "disk"
    assert choose_personal_state("auto", 10**9, 10**6, has_folder=False) == "memory"  # no folder to put it in
    assert choose_personal_state("disk", 10, 130, has_folder=True) == "disk"


@pytest.mark.parametrize(
    ("sets", "fragment"),
    [
        (["--set", "personal_state=tape"], "personal_state"),
        (["--set", "precision=float8"], "precision"),
        (["--set", "algorithm={name: ditto, personal: [nothing]}"], "'nothing' matches none of the model's"),
        (["--set", "algorithm={name: ditto, personal: []}"], "personal"),
        (["--set", "precision=bfloat16", "--set", "backend=dense"], "precision bfloat16"),
    ],
)
def test_hostile_state_and_precision_settings_are_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sets: list[str], fragment: str
) -> None:
    monkeypatch.chdir(tmp_path)
    tiny = ["--dataset", "digits", "--rounds", "1", "--quiet", "--set", "num_clients=4", "--set", "local.steps=1"]
    assert_refused(["run", *tiny, *sets, "--out", "run"], fragment, tmp_path)


@pytest.mark.parametrize("tables", [False, True])
def test_rows_of_some_clients_load_as_their_part_of_the_whole_state(tables: bool) -> None:
    """`rows_of` (what `--actors` sends a shard) holds those clients' rows alone, and an engine that loads it reads
    for them what one that loads the whole `state_dict` reads (rows in the tables, packed, and this round's)."""
    store = TableStore(6) if tables else ClientStore()
    for r in range(3):
        clients = torch.tensor([r, r + 1, 5])
        store.write("t.c", clients, torch.arange(3.0).view(3, 1) + 10 * r, r)
        store.prune(r)
    part = store.rows_of([1, 2, 4])
    assert set(part) == {"t.c"}
    held = {k for k in part["t.c"] if k != "#packed"}
    if "#packed" in part["t.c"]:
        held |= set(part["t.c"]["#packed"]["clients"].tolist())
    assert held == {1, 2}
    one, whole = ClientStore(), ClientStore()
    one.load_state_dict(part)
    whole.load_state_dict(store.state_dict())
    asked = torch.tensor([1, 2, 4])
    for r in (2, 3):
        for a, b in zip(one.latest("t.c", asked, r), whole.latest("t.c", asked, r), strict=True):
            assert (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
