"""A run's per-client columns in its checkpoint: packed to the clients that differ, unpacked bit for bit."""

from __future__ import annotations

import pytest
import torch

from fedhet.experiments.state import pack_columns, unpack_columns


def test_a_sampled_evaluation_checkpoints_its_sample_only_and_restores_every_bit() -> None:
    k = 1000
    loss = torch.full((k,), float("nan"))
    loss[[3, 500, 999]] = torch.tensor([0.25, -0.0, 2.0])  # three clients evaluated
    seen = torch.ones(k, dtype=torch.int32)
    seen[7] = 0  # one unseen client
    zeros = torch.zeros(k, dtype=torch.float64)
    zeros[9] = -0.0  # a signed zero is not 0.0
    dense = torch.arange(k, dtype=torch.float32)
    columns = {"test_loss": loss, "seen": seen, "zeros": zeros, "dense": dense, "flag": torch.arange(k) == 5}
    packed = pack_columns(columns)
    assert packed["test_loss"]["rows"].tolist() == [3, 500, 999]  # type: ignore[index]
    assert packed["seen"]["rows"].tolist() == [7] and packed["zeros"]["rows"].tolist() == [9]  # type: ignore[index]
    assert packed["flag"]["rows"].tolist() == [5] and torch.equal(packed["dense"], dense)  # type: ignore[index,arg-type]
    back = unpack_columns(packed)
    for name, column in columns.items():
        assert back[name].dtype == column.dtype
        assert torch.equal(back[name].view(-1).double().nan_to_num(7.0), column.double().nan_to_num(7.0))
        assert torch.equal(torch.signbit(back[name].double()), torch.signbit(column.double()))


def test_a_checkpoint_of_columns_kept_whole_and_a_corrupt_one() -> None:
    whole = {"test_loss": torch.tensor([0.5, 1.0])}
    assert unpack_columns(whole) is not whole and torch.equal(unpack_columns(whole)["test_loss"], whole["test_loss"])
    with pytest.raises(TypeError):
        unpack_columns({"test_loss": {"fill": torch.zeros(1), "rows": [1]}})
    with pytest.raises(TypeError):
        unpack_columns({"test_loss": [0.5, 1.0]})


def test_the_evaluated_clients_give_the_rows_and_a_wrong_hint_is_not_trusted() -> None:
    loss = torch.full((100,), float("nan"))
    loss[[10, 40]] = torch.tensor([1.0, 2.0])
    packed = pack_columns({"loss": loss}, torch.tensor([10, 20, 40]))  # client 20 was scored but lost (NaN)
    assert packed["loss"]["rows"].tolist() == [10, 40]  # type: ignore[index]
    packed = pack_columns({"loss": loss}, torch.tensor([10, 20]))  # client 40 lies outside the hint: searched for
    assert packed["loss"]["rows"].tolist() == [10, 40]  # type: ignore[index]
    assert torch.equal(unpack_columns(packed)["loss"].nan_to_num(7.0), loss.nan_to_num(7.0))


def test_an_unchanged_column_is_packed_once_and_a_changed_one_again() -> None:
    seen = torch.ones(100, dtype=torch.bool)
    seen[3] = False
    first = pack_columns({"seen": seen})["seen"]
    assert pack_columns({"seen": seen})["seen"] is first  # the same tensor, unchanged: packed once
    seen[5] = False  # changed in place
    assert pack_columns({"seen": seen})["seen"]["rows"].tolist() == [3, 5]  # type: ignore[index]
