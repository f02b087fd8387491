"""Shell-safe folder names for run labels."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedhet.experiments.naming import MAX_LENGTH, safe_name


@pytest.mark.parametrize(
    ("label", "name"),
    [
        ("FedAvg", "FedAvg"),
        ("CA-Fed (code)", "CA-Fed-code"),
        ("FedProx (μ=0.01)", "FedProx-mu-0.01"),
        ("MaxFL τ_l=50", "MaxFL-tau_l-50"),
        ("ε=0 (FedAvg)", "epsilon-0-FedAvg"),
        ("α = 0.5", "alpha-0.5"),
        ("Σ x", "Sigma-x"),
        ("FedMGDA+ (η=1, decay 0.1)", "FedMGDA-eta-1-decay-0.1"),
        ("attacked ×10", "attacked-x10"),
        ("γ_G²", "gamma_G2"),
        ("µ=1", "mu-1"),  # the micro sign, not the Greek letter
        ("café", "cafe"),
        ("20%", "20"),
        ("a/b\\c", "a-b-c"),
        (".hidden", "hidden"),
        ("", "unnamed"),
        ("()", "unnamed"),
    ],
)
def test_labels_become_shell_safe_names(label: str, name: str) -> None:
    assert safe_name(label) == name


def test_long_labels_are_cut() -> None:
    assert safe_name("x" * 300) == "x" * MAX_LENGTH


@given(st.text(max_size=200))
def test_any_label_gives_a_safe_name(label: str) -> None:
    name = safe_name(label)
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", name), name
    assert len(name) <= MAX_LENGTH and not name.endswith(("-", "."))
