"""Client state kept with the clients: versioned rows, and the engine's new client-side entry points."""

from __future__ import annotations

import torch

from fedhet.engine.engine import Engine
from fedhet.engine.local import gradient_statistics
from fedhet.engine.state import ClientStore
from helpers.tiny import linear_model, tiny_data


def test_store_reads_the_latest_row_written_before_the_round() -> None:
    store = ClientStore()
    store.write("c", torch.tensor([3]), torch.tensor([[1.0, 1.0]]), 0)
    store.write("c", torch.tensor([3]), torch.tensor([[2.0, 2.0]]), 4)
    rows = lambda t: store.read("c", torch.tensor([3, 5]), t, torch.zeros(2, 2))  # noqa: E731  (the defaults)
    torch.testing.assert_close(rows(0), torch.zeros(2, 2))  # nothing was written before round 0
    torch.testing.assert_close(rows(4), torch.tensor([[1.0, 1.0], [0.0, 0.0]]))  # round 4 sees round 0's row
    torch.testing.assert_close(rows(5), torch.tensor([[2.0, 2.0], [0.0, 0.0]]))
    store.write("c", torch.tensor([3]), torch.tensor([[9.0, 9.0]]), 2)  # a rewound run rewrites round 2
    torch.testing.assert_close(rows(5), torch.tensor([[9.0, 9.0], [0.0, 0.0]]))  # and round 4's row is gone
    store.prune(3)
    torch.testing.assert_close(rows(3), torch.tensor([[9.0, 9.0], [0.0, 0.0]]))
    again = ClientStore()
    again.load_state_dict(store.state_dict())
    into = torch.zeros(1, 2)
    assert again.read("c", torch.tensor([3]), 3, into) is into  # filled in place
    torch.testing.assert_close(into, torch.tensor([[9.0, 9.0]]))
    assert again.clients("c") == [3]


def test_store_writes_into_the_memory_of_versions_it_forgets() -> None:
    store, clients = ClientStore(), torch.tensor([0, 1])
    read = lambda t: store.read("c", clients, t, torch.full((2, 3), -1.0))  # noqa: E731
    for round_ in range(4):  # keep one round of history, as the engine does (`Engine.state_history`)
        store.write("c", clients, torch.full((2, 3), float(round_)) + clients.view(2, 1), round_, keep_from=round_)
        torch.testing.assert_close(read(round_ + 1), torch.tensor([[0.0] * 3, [1.0] * 3]) + round_)
        if round_ > 0:
            torch.testing.assert_close(read(round_), torch.tensor([[0.0] * 3, [1.0] * 3]) + round_ - 1)
    before = {k: [v.data_ptr() for _, v in store._rows["c"][k]] for k in (0, 1)}
    store.write("c", clients, torch.zeros(2, 3), 4, keep_from=4)  # round 2's rows are forgotten: their memory reused
    after = {k: [v.data_ptr() for _, v in store._rows["c"][k]] for k in (0, 1)}
    assert all(after[k] == [before[k][1], before[k][0]] for k in (0, 1))
    torch.testing.assert_close(read(4), torch.tensor([[3.0] * 3, [4.0] * 3]))  # round 3's rows are intact
    torch.testing.assert_close(read(5), torch.zeros(2, 3))
    store.write("c", torch.tensor([0]), torch.ones(1, 3), 4, keep_from=4)  # a rewritten round reuses its own row
    torch.testing.assert_close(read(5), torch.tensor([[1.0] * 3, [0.0] * 3]))
    store.write("c", torch.tensor([7]), torch.ones(1, 3), 4, keep_from=4)  # a new client gets a fresh row
    assert store.clients("c") == [0, 1, 7]


def test_engine_statistics_and_sampled_losses_use_the_client_streams() -> None:
    data = tiny_data([5, 7, 4], seed=1)
    engine = Engine(linear_model(), data, seed=3)
    w = engine.initial_params()
    clients = torch.tensor([2, 0])
    mean, var = engine.gradient_statistics(w, clients, 3, 1)
    ref_mean, ref_var = gradient_statistics(engine.model, data.train, w, clients, 3, 3, 1)
    torch.testing.assert_close(mean, ref_mean)
    torch.testing.assert_close(var, ref_var)
    whole = engine.sampled_losses(w, clients, 100, 0, "any")  # a batch larger than the data: the full loss
    torch.testing.assert_close(whole, engine.losses_at(w, clients, "train"))
    one = engine.sampled_losses(w, clients, 2, 0, "any")
    torch.testing.assert_close(one, engine.sampled_losses(w, clients, 2, 0, "any"))  # a fixed stream
    assert not torch.allclose(one, whole)


def test_adopted_rows_are_kept_without_a_copy_and_read_back_as_one_view() -> None:
    store, clients = ClientStore(), torch.tensor([2, 5, 7])
    block = torch.arange(12.0).view(3, 4)
    store.write("p", clients, block, 0, keep_from=0, adopt=True)
    fresh = lambda: torch.full((4,), -1.0)  # noqa: E731
    same = store.stacked("p", clients, 1, fresh)
    assert same.data_ptr() == block.data_ptr()  # the rows in the order written: a view, no copy
    torch.testing.assert_close(same, block)
    other = store.stacked("p", torch.tensor([7, 2, 9]), 1, fresh)  # another order, a client without rows: a copy
    assert other.data_ptr() != block.data_ptr()
    torch.testing.assert_close(other, torch.stack([block[2], block[0], fresh()]))
    copied = torch.ones(3, 4)
    store.write("q", clients, copied, 0, keep_from=0)  # not adopted: the store copies
    assert store.stacked("q", clients, 1, fresh).data_ptr() != copied.data_ptr()


def test_a_mostly_forgotten_adopted_tensor_is_copied_out_so_that_it_is_freed() -> None:
    store, clients = ClientStore(), torch.arange(4)
    block = torch.ones(4, 3)
    store.write("p", clients, block, 0, keep_from=0, adopt=True)
    store.write("p", clients[:3], torch.full((3, 3), 2.0), 8, keep_from=9, adopt=True)  # clients 0-2 forget round 0
    store.prune(9)
    (last,) = store.latest("p", torch.tensor([3]), 9)
    assert last is not None and last.untyped_storage().data_ptr() != block.untyped_storage().data_ptr()
    torch.testing.assert_close(last, torch.ones(3))  # client 3's row, copied out of the forgotten tensor
    expected = torch.tensor([[2.0] * 3] * 3 + [[1.0] * 3])
    torch.testing.assert_close(store.stacked("p", clients, 9, lambda: torch.zeros(3)), expected)


def test_prune_visits_only_clients_with_several_versions() -> None:
    """A round's pruning follows its cohort: a client with one version is not visited again (1,000 rounds of 100
    Ditto clients pruned in 2 s instead of 208 s; docs/performance.md)."""
    store = ClientStore()
    store.write("k", torch.arange(1000), torch.zeros(1000, 2), 0, keep_from=0)
    store.prune(8)
    assert not store._pending.get("k")
    store.write("k", torch.tensor([5]), torch.ones(1, 2), 9, keep_from=8)  # client 5: versions 0 and 9
    assert store._pending["k"] == {5}
    store.prune(16)  # version 0 of client 5 is no longer visible to any read from version 16 on
    assert not store._pending.get("k") and [r for r, _ in store.state_dict()["k"][5]] == [9]
    assert [r for r, _ in store.state_dict()["k"][6]] == [0]


def test_update_replaces_the_rows_of_the_clients_given_only() -> None:
    """What an actor sends back (`fedhet.experiments.actors`): its clients' histories replace theirs, the others'
    stay, and a key seen first there is added."""
    store = ClientStore()
    store.write("c", torch.tensor([0, 1]), torch.tensor([[1.0], [2.0]]), 0)
    other = ClientStore()
    other.write("c", torch.tensor([1]), torch.tensor([[5.0]]), 0)
    other.write("c", torch.tensor([1]), torch.tensor([[6.0]]), 1)
    other.write("d", torch.tensor([1]), torch.tensor([[7.0]]), 1)
    store.update(other.state_dict())
    assert store.read("c", torch.tensor([0, 1]), 2, torch.zeros(2, 1)).view(-1).tolist() == [1.0, 6.0]
    assert store.read("c", torch.tensor([1]), 1, torch.zeros(1, 1)).item() == 5.0  # the history came too
    assert store.keys() == ["c", "d"] and store.clients("d") == [1]
