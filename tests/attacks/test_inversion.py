"""Gradient inversion (DLG, iDLG, Geiping et al.) on the zoo MLP and digits 8×8, and its scores (PSNR, SSIM)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch

from fedhet.attacks.inversion import (
    infer_labels,
    invert,
    label_accuracy,
    match_order,
    privatize,
    psnr,
    save_images,
    ssim,
    true_gradient,
)
from fedhet.data.embedded import Digits
from fedhet.engine.functional import FlatModel
from fedhet.models.zoo import MLP, LeNetCifar


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    data = Digits().load(Path("."))
    return data.x, data.y


def mlp(seed: int = 0) -> FlatModel:
    torch.manual_seed(seed)
    return FlatModel(MLP(hidden=[32]).build((64,), 10))


def test_psnr_by_hand() -> None:
    truth = torch.tensor([0.0, 1.0, 0.0, 1.0])  # range 1
    assert psnr(truth, truth + 0.1) == pytest.approx(20.0)  # 10·log10(1 / 0.01)
    assert psnr(truth, truth + 0.1, data_range=2.0) == pytest.approx(20.0 + 20 * math.log10(2))
    assert psnr(truth, truth) == math.inf


def test_ssim_by_hand() -> None:
    """One 2×2 window: μ_a = .5, μ_b = .25, σ²_a = 1/3, σ²_b = 1/12, σ_ab = 1/6 (unbiased), range 1."""
    a = torch.tensor([[0.0, 1.0], [1.0, 0.0]]).reshape(1, 1, 2, 2)
    c1, c2 = 0.01**2, 0.03**2
    expected = (2 * 0.5 * 0.25 + c1) * (2 / 6 + c2) / ((0.25 + 0.0625 + c1) * (1 / 3 + 1 / 12 + c2))
    assert ssim(a, 0.5 * a) == pytest.approx(expected)
    assert ssim(a, a) == pytest.approx(1.0)
    assert ssim(a, 1 - a) < 0  # the negative image: anti-correlated


def test_label_accuracy_and_order() -> None:
    assert label_accuracy(torch.tensor([3, 3, 5]), torch.tensor([5, 3, 1])) == pytest.approx(2 / 3)
    truth = torch.tensor([[0.0, 0.0], [5.0, 5.0]])
    assert torch.equal(match_order(truth, truth.flip(0) + 0.1), truth + 0.1)


def test_privatize_clips_then_adds_noise_of_z_times_c() -> None:
    g = torch.tensor([3.0, 4.0])  # norm 5
    assert torch.allclose(privatize(g, clip=1.0, noise_multiplier=0.0), torch.tensor([0.6, 0.8]))
    assert torch.equal(privatize(g, clip=10.0, noise_multiplier=0.0), g)  # within the bound: unchanged
    noisy = privatize(torch.zeros(20000), clip=2.0, noise_multiplier=0.5, seed=1)
    assert float(noisy.std()) == pytest.approx(1.0, rel=0.03)


def test_idlg_reads_the_label_from_the_output_layer(digits: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = digits
    model = mlp()
    for i in range(10):
        g = true_gradient(model, model.initial_params(), x[i : i + 1], y[i : i + 1], 10)
        assert int(infer_labels(model, g, 10, 1)) == int(y[i])


def test_idlg_reads_the_label_from_lenet_too() -> None:
    """LeNet-5 (ReLU, max-pooling) on a random 3×32×32 image: the label leaks from the output layer."""
    torch.manual_seed(0)
    model = FlatModel(LeNetCifar().build((3, 32, 32), 10))
    x = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    for label in (2, 7):
        g = true_gradient(model, model.initial_params(), x, torch.tensor([label]), 10)
        assert int(infer_labels(model, g, 10, 1)) == label


@pytest.mark.parametrize(
    ("method", "floor"),
    [pytest.param("dlg", 30.0, marks=pytest.mark.slow), ("idlg", 30.0), ("geiping", 20.0)],  # dlg: ~3-5 s
)
def test_inversion_recovers_a_single_image_without_dp(
    digits: tuple[torch.Tensor, torch.Tensor], method: str, floor: float
) -> None:
    """The zoo MLP (64-32-10, ReLU) at initialisation, one image of digits: > 30 dB (DLG, iDLG), > 20 dB with
    Geiping et al.'s cosine objective (scale-invariant: only the direction is matched)."""
    x, y = digits[0][:1], digits[1][:1]
    model = mlp()
    params = model.initial_params()
    g = true_gradient(model, params, x, y, 10)
    steps = 100 if method != "geiping" else 300
    found = invert(model, params, g, (64,), 10, method=method, iterations=steps)  # type: ignore[arg-type]
    assert psnr(x, found.x) > floor
    assert ssim(x.reshape(1, 1, 8, 8), found.x.reshape(1, 1, 8, 8)) > 0.9
    assert label_accuracy(y, found.y) == 1.0


def test_dlg_fails_under_dp_fedavg_noise(digits: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Clip at C = 1 and add N(0, (zC)²) with z = 0.99: DP-FedAvg's noise for ε = 8 at δ = 1e-5 after 100 rounds
    with Poisson sampling q = 0.1 (RDP; `fedhet.privacy.accounting.calibrate`). The reconstruction is noise: < 10 dB."""
    x, y = digits[0][:1], digits[1][:1]
    model = mlp()
    params = model.initial_params()
    g = privatize(true_gradient(model, params, x, y, 10), clip=1.0, noise_multiplier=0.99, seed=0)
    found = invert(model, params, g, (64,), 10, method="dlg", iterations=100)
    assert psnr(x, found.x) < 10.0


def test_save_images_writes_pngs(tmp_path: Path) -> None:
    paths = save_images(tmp_path, "rec", torch.rand(2, 64), (1, 8, 8))
    assert [p.name for p in paths] == ["rec_0.png", "rec_1.png"]
    assert plt.imread(paths[0]).shape[:2] == (8, 8)
