"""Learning tasks: what a model's outputs mean. A task gives the per-sample loss ℓ(z, y) at the outputs z, its
gradient ∂ℓ/∂z, and how predictions are scored; every backend trains and evaluates any task through these methods
without knowing which one it is (the autograd backends call `Task.loss`, the dense and conv backends the closed-form
gradients, evaluation `Task.loss_value`, `Task.correct` and `Task.client_scores`).

* ``classification`` (the default): softmax cross-entropy over C outputs; accuracy.
* ``binary``: one output z, the logit of class 1; ℓ = log(1 + e^z) − y z (binary cross-entropy with logits);
  accuracy, ROC AUC, F1 and balanced accuracy (the positive class is 1).
* ``regression``: d outputs (d target columns, usually 1); ℓ = (1/d) Σ_j (z_j − y_j)² (the squared error); MAE,
  RMSE and R². By default (``standardize``) it trains on standardised targets (y − μ) / s, and every loss and
  metric a run reports is in the targets' own units (`target_powers`; `fedhet.data.dataset.TargetScale`).

The metric definitions are scikit-learn's (``roc_auc_score``, ``f1_score``, ``balanced_accuracy_score``,
``mean_absolute_error``, ``root_mean_squared_error``, ``r2_score``): the pooled values are computed by it, and the
per-client values, computed for every client at once, are tested against it. A task of one's own is a registered
`Task` subclass whose `loss` is differentiable (the default gradient is autograd's; docs/extending.md).
"""

from __future__ import annotations

import warnings
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from scipy.stats import rankdata
from torch import Tensor
from torch.func import grad, vmap

from fedhet.errors import ConfigError
from fedhet.registry import Component, Registry


class Task(Component):
    """A loss at the model's outputs and the scores of its predictions.

    Shapes: outputs z (..., outputs), labels y (...) (class ids, or targets with one output) or (..., outputs).
    Only `loss` is required; the other methods have correct defaults from it.
    """

    accuracy: ClassVar[bool] = True  # predictions are classes: accuracy columns are written
    classes: ClassVar[bool] = True  # labels are class ids (label-based partitioners and label noise apply)
    metrics: ClassVar[tuple[str, ...]] = ()  # the names `client_scores` and `pooled_scores` give
    # the power of the target scale s in each reported value ("loss" and the metrics' names): s² for a squared error
    target_powers: ClassVar[dict[str, int]] = {}

    def standardizes_targets(self) -> bool:
        """Whether a run trains this task on standardised targets (`fedhet.data.arrays.standardise_targets`)."""
        return False

    def outputs(self, num_classes: int) -> int:
        """The model's output width for a dataset of `num_classes` classes (or target columns)."""
        return num_classes

    def loss(self, z: Tensor, y: Tensor) -> Tensor:
        """ℓ(z, y) per sample (...): differentiable, and usable under `torch.func.vmap` (the training objective)."""
        raise NotImplementedError

    def loss_value(self, z: Tensor, y: Tensor) -> Tensor:
        """`loss` where no gradient is needed (evaluation, the losses a backend reports); may be a faster form."""
        return self.loss(z, y)

    def output_grad(self, z: Tensor, y: Tensor) -> Tensor:
        """∂ℓ/∂z per sample (..., outputs); default: autograd of `loss`."""
        rows = z[..., 0].numel()
        flat_z, flat_y = z.detach().reshape(rows, z.shape[-1]), y.reshape(rows, *y.shape[z.dim() - 1 :])
        one = vmap(grad(lambda zi, yi: self.loss(zi.unsqueeze(0), yi.unsqueeze(0)).sum()))
        return one(flat_z, flat_y).reshape(z.shape)

    def loss_grad(self, z: Tensor, y: Tensor, share: Tensor) -> tuple[Tensor, Tensor]:
        """Per-sample losses (...) and share · ∂ℓ/∂z (..., outputs), `share` (...) each row's weight in its batch's
        mean (the conv backend's hand-written backward pass starts from it)."""
        return self.loss_value(z, y), self.output_grad(z, y).mul_(share.unsqueeze(-1))

    def prepare(self, y: Tensor, scale: Tensor, outputs: int) -> Tensor:
        """What `scaled_grad` needs of the labels y (...) and the rows' weights `scale` (..., 1), computed once for
        all of a round's steps (the dense backend); default: the labels."""
        del scale, outputs
        return y

    def scaled_grad(self, z: Tensor, prepared: Tensor, scale: Tensor) -> Tensor:
        """scale · ∂ℓ/∂z (..., outputs) from `prepare`'s tensor (the dense backend's loss gradient at the outputs)."""
        return self.output_grad(z, prepared).mul_(scale)

    def correct(self, z: Tensor, y: Tensor) -> Tensor | None:
        """1 where the prediction is the label (...) (None: the task has no accuracy)."""
        return z.argmax(-1) == y

    def client_scores(self, z: Tensor, y: Tensor, owner: Tensor, clients: int) -> dict[str, Tensor]:
        """The task's own per-client metrics (name → (clients,) float64, NaN where undefined) of outputs z (N, out)
        and labels y of samples owned by `owner` (N,); default: none (accuracy and loss are always there)."""
        del z, y, owner, clients
        return {}

    def pooled_scores(self, z: Tensor, y: Tensor) -> dict[str, float]:
        """The same metrics over all the samples pooled (scikit-learn's definitions); default: none."""
        del z, y
        return {}

    def check_labels(self, y: Tensor, num_classes: int, where: str) -> None:
        """Refuse labels this task cannot learn, in one line."""
        if torch.is_floating_point(y):
            raise ConfigError(
                f"task '{self.name}' needs class labels but {where} has numeric targets; use task: regression"
            )


TASKS: Registry[Task] = Registry("task")


def fast_softmax(z: Tensor) -> Tensor:
    """Softmax over the last dimension. Torch's CPU kernel does not vectorise across rows when there are
    fewer classes than SIMD lanes (16 floats): 53 µs against 14 µs here for 330 rows of 10 classes. The form
    depends on the classes only, never on the number of rows, so that a client's numbers do not depend on how many
    clients train beside it (a run's cohort sharded over processes gives its numbers: `fedhet.experiments.actors`)."""
    if z.shape[-1] >= 16 or z.device.type != "cpu":
        return torch.softmax(z, -1)
    e = z - z.amax(-1, keepdim=True)
    e.exp_()
    return e.div_(e.sum(-1, keepdim=True))


@TASKS.register
class Classification(Task):
    """Multi-class classification: softmax cross-entropy over C outputs (logits); accuracy."""

    name: ClassVar[str] = "classification"
    description: ClassVar[str] = "C classes: softmax cross-entropy on C logits; accuracy"

    def loss(self, z: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(z, y, reduction="none") if z.dim() == 2 else _cross_entropy(z, y)

    def loss_value(self, z: Tensor, y: Tensor) -> Tensor:
        # logsumexp − logit of the label: the same values, faster than F.cross_entropy's log-softmax kernel on CPU
        # (docs/performance.md, "Why the engine's constants")
        return torch.logsumexp(z, -1) - z.gather(-1, y.unsqueeze(-1)).squeeze(-1)

    def output_grad(self, z: Tensor, y: Tensor) -> Tensor:
        g = fast_softmax(z)
        return g.scatter_add_(-1, y.unsqueeze(-1), torch.full_like(g[..., :1], -1.0))

    def loss_grad(self, z: Tensor, y: Tensor, share: Tensor) -> tuple[Tensor, Tensor]:
        lse = torch.logsumexp(z, -1, keepdim=True)
        nll = lse.squeeze(-1) - z.gather(-1, y.unsqueeze(-1)).squeeze(-1)
        g = (z - lse).exp_()
        g.scatter_add_(-1, y.unsqueeze(-1), torch.full_like(g[..., :1], -1.0))
        return nll, g.mul_(share.unsqueeze(-1))

    def prepare(self, y: Tensor, scale: Tensor, outputs: int) -> Tensor:
        """−scale · onehot(y) (..., C)."""
        minus_target = torch.zeros(*y.shape, outputs, device=y.device)
        return minus_target.scatter_(-1, y.unsqueeze(-1), -scale)

    def scaled_grad(self, z: Tensor, prepared: Tensor, scale: Tensor) -> Tensor:
        """(softmax(z) − onehot(y)) · scale."""
        return torch.addcmul(prepared, fast_softmax(z), scale)


def _cross_entropy(z: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1), reduction="none").reshape(y.shape)


@TASKS.register
class Binary(Task):
    """Binary classification with one output, the logit of class 1: binary cross-entropy with logits; accuracy,
    ROC AUC, F1 and balanced accuracy (imbalanced data)."""

    name: ClassVar[str] = "binary"
    description: ClassVar[str] = "two classes: one logit, binary cross-entropy; accuracy, AUC, F1, balanced accuracy"
    metrics: ClassVar[tuple[str, ...]] = ("auc", "f1", "balanced_accuracy")

    def outputs(self, num_classes: int) -> int:
        return 1

    def check_labels(self, y: Tensor, num_classes: int, where: str) -> None:
        super().check_labels(y, num_classes, where)
        if num_classes != 2:
            raise ConfigError(
                f"task 'binary' needs two classes but {where} has {num_classes}; use task: classification"
            )

    def loss(self, z: Tensor, y: Tensor) -> Tensor:
        logit = z.squeeze(-1)
        return F.binary_cross_entropy_with_logits(logit, y.to(logit.dtype), reduction="none")

    def output_grad(self, z: Tensor, y: Tensor) -> Tensor:
        return torch.sigmoid(z).sub_(y.to(z.dtype).unsqueeze(-1))

    def correct(self, z: Tensor, y: Tensor) -> Tensor:
        return (z.squeeze(-1) > 0).long() == y

    def client_scores(self, z: Tensor, y: Tensor, owner: Tensor, clients: int) -> dict[str, Tensor]:
        score = z.squeeze(-1).double()
        positive, predicted = y == 1, score > 0
        count = lambda mask: torch.zeros(clients, dtype=torch.float64).index_add_(0, owner, mask.double())  # noqa: E731
        tp, fp = count(positive & predicted), count(~positive & predicted)
        fn, tn = count(positive & ~predicted), count(~positive & ~predicted)
        pos, neg = tp + fn, tn + fp
        f1 = 2 * tp / (2 * tp + fp + fn)  # NaN when the client has no positive and predicts none (0/0)
        recalls = torch.stack([tp / pos, tn / neg])  # NaN for a class the client does not have
        balanced = torch.where(recalls.isnan().all(0), torch.nan, recalls.nansum(0) / (~recalls.isnan()).sum(0))
        return {"auc": client_auc(score, positive, owner, clients), "f1": f1, "balanced_accuracy": balanced}

    def pooled_scores(self, z: Tensor, y: Tensor) -> dict[str, float]:
        from sklearn.metrics import balanced_accuracy_score, f1_score, roc_auc_score

        score, truth = z.squeeze(-1).double().numpy(), y.numpy()
        predicted = (score > 0).astype(np.int64)
        with warnings.catch_warnings():  # one class only: sklearn warns and averages the recall of the other
            warnings.simplefilter("ignore")
            return {
                "auc": float(roc_auc_score(truth, score)) if len(np.unique(truth)) == 2 else float("nan"),
                "f1": float(f1_score(truth, predicted, zero_division=np.nan)),
                "balanced_accuracy": float(balanced_accuracy_score(truth, predicted)),
            }


def client_auc(score: Tensor, positive: Tensor, owner: Tensor, clients: int) -> Tensor:
    """Each client's ROC AUC (clients,) by the rank-sum (Mann–Whitney) formula, ties counted ½: the probability
    that one of its positive samples scores above one of its negative ones; NaN for a client without both."""
    if len(score) == 0:
        return torch.full((clients,), float("nan"), dtype=torch.float64)
    level = np.unique(score.numpy(), return_inverse=True)[1].reshape(-1)  # ties share a level
    key = owner.numpy().astype(np.int64) * (int(level.max()) + 1) + level  # ordered by client, then score
    ranks = torch.as_tensor(rankdata(key, method="average"), dtype=torch.float64)
    sizes = torch.bincount(owner, minlength=clients).double()
    before = torch.cumsum(sizes, 0) - sizes  # samples of the clients ranked before each client
    within = ranks - before[owner]  # 1-based ranks inside the client (ties averaged)
    n_pos = torch.zeros(clients, dtype=torch.float64).index_add_(0, owner, positive.double())
    rank_sum = torch.zeros(clients, dtype=torch.float64).index_add_(0, owner, within * positive.double())
    n_neg = sizes - n_pos
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)  # 0/0 → NaN for a client with one class


@TASKS.register
class Regression(Task):
    """Regression of d numeric targets with d outputs: the squared error (1/d) Σ_j (z_j − y_j)²; MAE, RMSE and
    R² (scikit-learn's definitions; R² against each client's own mean, averaged over the targets)."""

    name: ClassVar[str] = "regression"
    description: ClassVar[str] = "numeric targets: squared error (MSE); MAE, RMSE and R²"
    accuracy: ClassVar[bool] = False
    classes: ClassVar[bool] = False
    metrics: ClassVar[tuple[str, ...]] = ("mae", "rmse", "r2")
    target_powers: ClassVar[dict[str, int]] = {"loss": 2, "mae": 1, "rmse": 1}  # R²: none (scale-free)
    standardize: bool = Field(
        True,
        description="train on (y − mean) / std of the training targets; losses and metrics stay in the targets' units",
    )

    def standardizes_targets(self) -> bool:
        return self.standardize

    def loss(self, z: Tensor, y: Tensor) -> Tensor:
        return (z - y.to(z.dtype).reshape(z.shape)).square().mean(-1)

    def output_grad(self, z: Tensor, y: Tensor) -> Tensor:
        return (z - y.to(z.dtype).reshape(z.shape)).mul_(2.0 / z.shape[-1])

    def correct(self, z: Tensor, y: Tensor) -> None:
        return None

    def check_labels(self, y: Tensor, num_classes: int, where: str) -> None:
        if not torch.is_floating_point(y):
            raise ConfigError(
                f"task 'regression' needs numeric targets but {where} has class labels; use task: classification "
                "(a table's label column of numbers with decimals is a regression target)"
            )

    def client_scores(self, z: Tensor, y: Tensor, owner: Tensor, clients: int) -> dict[str, Tensor]:
        z, y = z.double(), y.double().reshape(z.shape)
        sizes = torch.bincount(owner, minlength=clients).double().unsqueeze(1)

        def per_client(values: Tensor) -> Tensor:  # sums per client and output (clients, d)
            return torch.zeros(clients, values.shape[1], dtype=torch.float64).index_add_(0, owner, values)

        error = z - y
        mean_y = per_client(y) / sizes
        total = per_client((y - mean_y[owner]).square())
        squared = per_client(error.square())
        return {
            "mae": (per_client(error.abs()) / sizes).mean(1),
            "rmse": (squared / sizes).sqrt().mean(1),
            "r2": torch.where(total > 0, 1 - squared / total, torch.nan).mean(1),  # NaN: a constant target
        }

    def pooled_scores(self, z: Tensor, y: Tensor) -> dict[str, float]:
        from sklearn.metrics import mean_absolute_error, r2_score, root_mean_squared_error

        pred, truth = z.double().numpy(), y.double().reshape(z.shape).numpy()
        return {
            "mae": float(mean_absolute_error(truth, pred)),
            "rmse": float(root_mean_squared_error(truth, pred)),
            "r2": float(r2_score(truth, pred)) if len(truth) > 1 else float("nan"),
        }


CLASSIFICATION = Classification()
