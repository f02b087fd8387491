"""The pfl comparator asks pfl for the workload's number of local steps (pfl itself is optional; its
`local_num_steps` stops at the end of a user's data, so longer local training is given as epochs, or as steps
over the user's data repeated)."""

from __future__ import annotations

from comparators.pfl import _local_length

from fedhet.bench.workloads import CAFED, MAXFL, MLP


def test_steps_that_pass_over_the_data_twice_are_two_epochs() -> None:
    assert (MLP.steps, MLP.batch, MLP.samples) == (10, 10, 50)  # 5 batches per user: 10 steps are 2 epochs
    assert _local_length(MLP) == ({"local_num_steps": None, "local_num_epochs": 2}, 1)


def test_other_lengths_are_steps_over_enough_copies_of_the_data() -> None:
    assert (MAXFL.steps, MAXFL.batch, MAXFL.samples) == (10, 32, 200)  # 7 batches per pass: 10 steps need 320 rows
    assert _local_length(MAXFL) == ({"local_num_steps": 10, "local_num_epochs": None}, 2)
    assert (CAFED.steps, CAFED.batch, CAFED.samples) == (10, 32, 100)
    assert _local_length(CAFED) == ({"local_num_steps": 10, "local_num_epochs": None}, 4)
