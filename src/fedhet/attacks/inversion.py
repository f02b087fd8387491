"""Gradient inversion: reconstruct a client's training images from the gradient (or one-step update) it sends.

- ``dlg`` (Zhu, Liu and Han, "Deep Leakage from Gradients", NeurIPS 2019): optimise a dummy input x' and a dummy
  soft label y' with L-BFGS so that their gradient matches the observed one, min ‖∇_w ℓ(x', y') − ∇_w ℓ(x, y)‖²
  (Eq. 4 of the paper).
- ``idlg`` (Zhao, Mopuri and Bilen, "iDLG: Improved Deep Leakage from Gradients", 2020): the label is read off the
  last layer's weight gradient first (for cross-entropy, row i of ∂ℓ/∂W is (p_i − y_i)·h with h ≥ 0 after a ReLU,
  so only the true label's row sums below zero; §3.1); then DLG's distance is minimised over x' alone.
- ``geiping`` (Geiping, Bauermeister, Dröge and Moeller, "Inverting Gradients", NeurIPS 2020): the labels as iDLG,
  then Adam on 1 − cos(∇_w ℓ(x', y), g) + α·TV(x') (Eq. 4: cosine similarity with a total-variation prior).

`invert` returns the reconstruction; `psnr`, `ssim` and `label_accuracy` score it against the truth and
`save_images` writes PNGs. A gradient g of a single image, or an update Δ = η·g of one local SGD step, can be
attacked alike (pass Δ/η).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from fedhet.engine.functional import FlatModel
from fedhet.errors import ConfigError
from fedhet.seeding import torch_gen

Method = Literal["dlg", "idlg", "geiping"]


@dataclass
class Reconstruction:
    """What an inversion recovered: inputs ``x`` (B, *input_shape), labels ``y`` (B,) and the final distance."""

    x: Tensor
    y: Tensor
    distance: float


def soft_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Mean cross-entropy against soft labels `target` (B, C) (one-hot rows give the usual cross-entropy)."""
    return -(target * F.log_softmax(logits, dim=-1)).sum(-1).mean()


def gradient(model: FlatModel, params: Tensor, x: Tensor, target: Tensor, create_graph: bool = False) -> Tensor:
    """Flat gradient (P,) of the mean soft cross-entropy of the batch (x, target) at `params`."""
    w = params.detach().requires_grad_(True)
    loss = soft_cross_entropy(model.logits(w, x), target)
    (g,) = torch.autograd.grad(loss, w, create_graph=create_graph)
    return g


def true_gradient(model: FlatModel, params: Tensor, x: Tensor, y: Tensor, num_classes: int) -> Tensor:
    """The gradient a client computes on its batch (x, y) with hard labels."""
    return gradient(model, params, x, F.one_hot(y, num_classes).float()).detach()


def last_weight(model: FlatModel) -> slice:
    """The slice of the flat vector holding the last 2-D weight (the output layer's)."""
    names = [n for n, s in zip(model.names, model.shapes, strict=True) if len(s) == 2]
    if not names:
        raise ConfigError("gradient inversion: the model has no linear output layer to read labels from")
    return model.slices[names[-1]]


def infer_labels(model: FlatModel, grad: Tensor, num_classes: int, batch: int) -> Tensor:
    """iDLG's labels: the `batch` classes whose output-layer weight-gradient rows sum lowest (for one image, the
    only negative row; for a batch of distinct labels, a common extension)."""
    rows = grad[last_weight(model)].reshape(num_classes, -1).sum(-1)
    return rows.argsort()[:batch].sort().values


def total_variation(x: Tensor, shape: tuple[int, int, int]) -> Tensor:
    """Mean absolute difference of neighbouring pixels of images `x` reshaped to (B, C, H, W)."""
    img = x.reshape(-1, *shape)
    return (img[..., 1:, :] - img[..., :-1, :]).abs().mean() + (img[..., :, 1:] - img[..., :, :-1]).abs().mean()


def invert(
    model: FlatModel,
    params: Tensor,
    grad: Tensor,
    input_shape: tuple[int, ...],
    num_classes: int,
    batch: int = 1,
    method: Method = "dlg",
    iterations: int = 300,
    seed: int = 0,
    lr: float | None = None,
    tv_weight: float = 1e-2,
    image: tuple[int, int, int] | None = None,
) -> Reconstruction:
    """Reconstruct `batch` inputs from the gradient `grad` (P,) of the model at `params`.

    `lr`: L-BFGS's step (dlg, idlg: 1.0) or Adam's (geiping: 0.1); `tv_weight` (geiping) weighs TV(x') over the
    image shape `image` (C, H, W) (default: a square grey image of the flattened input).
    """
    target = grad.detach()
    x = torch.randn(batch, *input_shape, generator=torch_gen(seed, "inversion-x")).requires_grad_(True)
    if method == "dlg":
        label_logits = torch.randn(batch, num_classes, generator=torch_gen(seed, "inversion-y")).requires_grad_(True)
        variables = [x, label_logits]

        def soft() -> Tensor:
            return F.softmax(label_logits, dim=-1)
    else:
        labels = infer_labels(model, target, num_classes, batch)
        onehot = F.one_hot(labels, num_classes).float()
        variables = [x]

        def soft() -> Tensor:
            return onehot

    if method in ("dlg", "idlg"):
        opt = torch.optim.LBFGS(
            variables,
            lr=lr or 1.0,
            max_iter=iterations,
            history_size=100,
            tolerance_grad=1e-12,
            tolerance_change=1e-14,
            line_search_fn="strong_wolfe",
        )

        def closure() -> Tensor:
            opt.zero_grad()
            dist = (gradient(model, params, x, soft(), create_graph=True) - target).pow(2).sum()
            dist.backward()
            return dist

        opt.step(closure)
        final = float((gradient(model, params, x, soft()) - target).pow(2).sum())
    else:
        side = math.isqrt(math.prod(input_shape))
        shape = image or (1, side, side)
        if math.prod(shape) != math.prod(input_shape):
            raise ConfigError(f"gradient inversion: image shape {shape} does not hold inputs of shape {input_shape}")
        adam = torch.optim.Adam(variables, lr=lr or 0.1)
        for _ in range(iterations):
            adam.zero_grad()
            g = gradient(model, params, x, soft(), create_graph=True)
            objective = 1 - F.cosine_similarity(g, target, dim=0) + tv_weight * total_variation(x, shape)
            objective.backward()
            adam.step()
        final = float(1 - F.cosine_similarity(gradient(model, params, x, soft()), target, dim=0))
    return Reconstruction(x.detach(), soft().detach().argmax(-1), final)


def match_order(truth: Tensor, guess: Tensor) -> Tensor:
    """`guess` reordered so that each true image is paired with its nearest reconstruction (greedy, by MSE)."""
    if len(truth) == 1:
        return guess
    flat_t, flat_g = truth.reshape(len(truth), -1), guess.reshape(len(guess), -1)
    cost = torch.cdist(flat_t, flat_g)
    order: list[int] = []
    for i in range(len(truth)):
        row = cost[i].clone()
        row[order] = math.inf
        order.append(int(row.argmin()))
    return guess[order]


def psnr(truth: Tensor, guess: Tensor, data_range: float | None = None) -> float:
    """Peak signal-to-noise ratio 10·log10(R² / MSE) in dB, R the range of `truth` (inf for a perfect match)."""
    r = float(truth.max() - truth.min()) if data_range is None else data_range
    mse = float((truth.double() - guess.double()).pow(2).mean())
    return math.inf if mse == 0 else 10 * math.log10(r * r / mse)


def ssim(truth: Tensor, guess: Tensor, data_range: float | None = None, window: int = 7) -> float:
    """Mean structural similarity (Wang et al. 2004, Eq. 13) over uniform `window`×`window` windows (skimage's
    default) of images (B, C, H, W), constants K1 = 0.01, K2 = 0.03; the window shrinks to fit small images."""
    a, b = truth.double(), guess.double()
    r = float(a.max() - a.min()) if data_range is None else data_range
    k = min(window, a.shape[-1], a.shape[-2])
    c1, c2 = (0.01 * r) ** 2, (0.03 * r) ** 2

    def mean(t: Tensor) -> Tensor:
        return F.avg_pool2d(t.reshape(-1, 1, *t.shape[-2:]), k, stride=1)

    n = k * k
    unbias = n / (n - 1) if n > 1 else 1.0
    mu_a, mu_b = mean(a), mean(b)
    var_a = (mean(a * a) - mu_a**2) * unbias
    var_b = (mean(b * b) - mu_b**2) * unbias
    cov = (mean(a * b) - mu_a * mu_b) * unbias
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return float(s.mean())


def label_accuracy(truth: Tensor, guess: Tensor) -> float:
    """Share of the true labels recovered (as multisets: order does not matter)."""
    hits = sum(min(int((truth == c).sum()), int((guess == c).sum())) for c in truth.unique().tolist())
    return hits / len(truth)


def save_images(out: Path, prefix: str, images: Tensor, shape: tuple[int, int, int]) -> list[Path]:
    """Write each image (B, ...) reshaped to `shape` (C, H, W) as ``{prefix}_{i}.png`` (grey or RGB, min–max
    scaled together); returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    imgs = images.detach().double().reshape(-1, *shape)
    lo, hi = float(imgs.min()), float(imgs.max())
    imgs = (imgs - lo) / (hi - lo) if hi > lo else imgs * 0
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, img in enumerate(imgs):
        path = out / f"{prefix}_{i}.png"
        if shape[0] == 1:
            plt.imsave(path, img[0].numpy(), cmap="gray", vmin=0, vmax=1)
        else:
            plt.imsave(path, img.permute(1, 2, 0).numpy())
        paths.append(path)
    return paths


def privatize(grad: Tensor, clip: float, noise_multiplier: float, seed: int = 0) -> Tensor:
    """DP-FedAvg's treatment of one update (McMahan et al. 2018): scale to norm ≤ `clip`, add N(0, (z·clip)²)."""
    clipped = grad * min(1.0, clip / max(float(grad.norm()), 1e-12))
    if noise_multiplier <= 0:
        return clipped
    noise = torch.randn(grad.shape, generator=torch_gen(seed, "inversion-dp"))
    return clipped + noise_multiplier * clip * noise
