"""Hostile DP inputs on the command line (issue 43): each gives exit code 2 and exactly one line on stderr, no
traceback, and writes nothing (the refusals come before the run folder is made)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.hostile import assert_refused

pytest.importorskip("dp_accounting")

FAST = ["--dataset", "digits", "--rounds", "2", "--set", "num_clients=6", "--set", "model.hidden=[8]", "--quiet"]
DP = ["--algorithm", "dp"]
SGD = ["--set", "local.dp_sgd.clip=1.0"]

CASES: dict[str, tuple[list[str], str]] = {
    "z 1e30": ([*DP, "--set", "algorithm.noise_multiplier=1e30"], "algorithm.noise_multiplier 1e+30 is beyond any use"),
    "z inf": ([*DP, "--set", "algorithm.noise_multiplier=.inf"], "noise_multiplier': Input should be a finite number"),
    "DP-SGD z inf": (
        [*SGD, "--set", "local.dp_sgd.noise_multiplier=.inf"],
        "noise_multiplier': Input should be a finite number",
    ),
    "target 1e-9": ([*DP, "--target-epsilon", "1e-9"], "needs a noise multiplier above"),
    "DP-SGD target 1e-9": ([*SGD, "--target-epsilon", "1e-9"], "the smallest ε it can reach is"),
    "clip_lr 1e6": (
        [*DP, "--set", "algorithm.clipping=adaptive", "--set", "algorithm.clip_lr=1e6"],
        "algorithm.clip_lr",
    ),
    "PLD with a fixed cohort": (
        [*DP, "--set", "algorithm.sampling=fixed", "--set", "clients_per_round=3", "--set", "privacy.accountant=pld"],
        "PLD accountant has no sampling without replacement",
    ),
    "DP-SGD on conv": (
        [*SGD, "--model", "cnn_mnist", "--set", "model.hidden=8", "--backend", "conv"],
        "which backend 'conv' does not form",
    ),
    "DP-SGD with dropout": ([*SGD, "--set", "model.dropout=0.5"], "cannot run with dropout"),
    "DP-SGD with MOON": ([*SGD, "--algorithm", "moon"], "cannot run with a data-space term"),
    "DP-SGD with Per-FedAvg": ([*SGD, "--algorithm", "perfedavg"], "cannot run with a local rule"),
    "delta without DP": (["--set", "privacy.delta=1e-6"], "privacy.delta set the accounting of a DP mechanism"),
    "accountant without DP": (["--set", "privacy.accountant=pld"], "and this run has none"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_dp_input_is_one_line_exit_2_and_writes_nothing(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args, fragment = CASES[case]
    monkeypatch.chdir(tmp_path)
    assert_refused(["run", *FAST, *args, "--out", "r"], fragment, tmp_path)
