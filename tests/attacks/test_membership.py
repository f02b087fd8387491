"""Membership inference: the loss-threshold attack's AUC and TPR at low FPR, on an overfitted model and on a
model that never saw either side."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhet.attacks.membership import attack_scores, evaluate
from fedhet.data.embedded import Digits
from fedhet.engine.functional import FlatModel
from fedhet.models.zoo import MLP


def test_auc_and_tpr_by_hand() -> None:
    assert evaluate(torch.tensor([3.0, 4.0]), torch.tensor([1.0, 2.0])) == (1.0, 1.0)
    auc, tpr = evaluate(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 4.0]))  # one pair of four ranked right
    assert auc == pytest.approx(0.25)
    assert tpr == 0.0  # no threshold passes a member before the non-member at 4
    assert all(v != v for v in evaluate(torch.zeros(0), torch.ones(2)))  # NaN without members


def test_scores_low_loss_and_calibrated_difference() -> None:
    losses, reference = torch.tensor([0.1, 2.0]), torch.tensor([0.2, 5.0])
    assert torch.equal(attack_scores(losses), torch.tensor([-0.1, -2.0]))
    assert torch.allclose(attack_scores(losses, reference), torch.tensor([0.1, 3.0]))


def train(x: torch.Tensor, y: torch.Tensor, steps: int) -> tuple[FlatModel, torch.Tensor]:
    """A local-only MLP fitted to (x, y) with full-batch Adam (no regularisation: it overfits)."""
    torch.manual_seed(0)
    module = MLP(hidden=[64]).build((64,), 10)
    opt = torch.optim.Adam(module.parameters(), lr=0.02)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(module(x), y).backward()
        opt.step()
    return FlatModel(module), torch.cat([p.detach().reshape(-1) for p in module.parameters()])


@pytest.fixture(scope="module")
def overfitted() -> tuple[FlatModel, torch.Tensor, torch.Tensor, torch.Tensor]:
    data = Digits().load(Path("."))
    perm = torch.randperm(len(data.x), generator=torch.Generator().manual_seed(0))
    x, y = data.x[perm], data.y[perm]
    model, w = train(x[:60], y[:60], steps=150)  # one client's 60 samples
    return model, w, x, y


def test_mia_wins_against_an_overfitted_local_model(
    overfitted: tuple[FlatModel, torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    model, w, x, y = overfitted
    with torch.no_grad():
        member = model.sample_losses(w, x[:60], y[:60])
        nonmember = model.sample_losses(w, x[60:360], y[60:360])
    auc, tpr = evaluate(attack_scores(member), attack_scores(nonmember))
    assert auc > 0.65
    assert 0.0 <= tpr <= 1.0


def test_mia_is_a_coin_flip_on_data_never_trained_on(
    overfitted: tuple[FlatModel, torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    """'Members' and non-members both from held-out samples: AUC 0.5 ± 0.07 (300 against 300)."""
    model, w, x, y = overfitted
    with torch.no_grad():
        fake_member = model.sample_losses(w, x[400:700], y[400:700])
        nonmember = model.sample_losses(w, x[700:1000], y[700:1000])
    auc, _ = evaluate(attack_scores(fake_member), attack_scores(nonmember))
    assert abs(auc - 0.5) < 0.07
