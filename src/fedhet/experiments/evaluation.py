"""Per-round evaluation of the global model on every client (seen and unseen), or on a seeded sample of them
(``eval_clients``), and of each client's personalised model (``personal_eval``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from fedhet.data.dataset import TargetScale
from fedhet.engine.architectures import ARCHITECTURE
from fedhet.engine.evaluate import ClientScores, scores_of_some
from fedhet.engine.plan import LocalPlan, LocalSettings
from fedhet.engine.protocol import EngineProtocol, Split
from fedhet.engine.task import Task
from fedhet.experiments.config import PersonalEvalConfig
from fedhet.metrics.clients import distribution, pooled
from fedhet.requirements import ClientRequirements
from fedhet.seeding import numpy_rng
from fedhet.strategies.base import Strategy

EVAL_STREAM = "eval-clients"
PERSONAL_STREAM = "personal-eval"  # the mini-batches of fine-tuning before personalised scores


def evaluation_sample(num_clients: int, count: int, seed: int, round_: int) -> Tensor | None:
    """The clients evaluated after round `round_` when ``eval_clients`` is `count`: `count` of the `num_clients`
    drawn uniformly without replacement from the run's own stream (sorted; training draws are untouched); None
    (everyone) when `count` is 0 or at least `num_clients`."""
    if count <= 0 or count >= num_clients:
        return None
    chosen = numpy_rng(seed, EVAL_STREAM, round_).choice(num_clients, size=count, replace=False)
    return torch.as_tensor(np.sort(chosen), dtype=torch.long)


def evaluate_global(
    engine: EngineProtocol, params: Tensor, clients: Tensor | None = None, count: bool = False
) -> tuple[dict[str, float], dict[str, Tensor], ClientScores, ClientScores]:
    """Round metrics (see `fedhet.metrics.METRICS`), per-client columns, and test/train scores of the global
    model on every client, or on `clients` only (the others NaN in the columns; the metrics are those of the
    clients evaluated, and ``evaluated`` says how many seen clients that was; with `count` also when all were).
    With a validation split, the same on each client's validation data (``val_*``). A task without accuracy
    (regression) writes no accuracy columns, and a task's own metrics (`fedhet.engine.task`) join them; a
    regression's losses and metrics are in its targets' units (`in_target_units`)."""
    data, task = engine.data, engine.model.task

    def scores(split: Split) -> ClientScores:
        return in_target_units(engine.scores(params, split, clients), task, data.target_scale)

    test, train = scores("test"), scores("train")
    rows = None if clients is None else clients.sort().values  # the metrics read these clients' entries only

    def of(values: Tensor) -> Tensor:
        return values if rows is None else values[rows]

    def everywhere(mask: Tensor) -> Tensor:
        """A mask over `rows` as a (K,) mask (for a task's own metrics)."""
        if rows is None:
            return mask
        out = torch.zeros(data.num_clients, dtype=torch.bool)
        out[rows[mask]] = True
        return out

    scored = ~torch.isnan(of(test.loss))  # not evaluated, or a client a remote engine could not reach
    in_seen = of(data.seen)
    seen, unseen = in_seen & scored, ~in_seen & scored
    metrics: dict[str, float] = {}
    if task.accuracy:
        metrics.update(distribution(of(test.accuracy)[seen], "test_accuracy"))
        metrics["test_accuracy_pooled"] = pooled(of(test.accuracy)[seen], of(test.count)[seen])
    metrics["test_loss"] = float(of(test.loss)[seen].double().mean())
    if test.extra or test.outputs is not None:
        metrics.update(task_metrics(task, test, everywhere(seen), "test"))
    metrics["train_loss"] = float(of(train.loss)[seen].double().mean())
    if task.accuracy:
        metrics["train_accuracy"] = float(of(train.accuracy)[seen].double().mean())
    if clients is not None or count:
        metrics["evaluated"] = float(seen.sum())
    if bool(unseen.any()):
        if task.accuracy:
            metrics["unseen_test_accuracy"] = float(of(test.accuracy)[unseen].double().mean())
        metrics["unseen_test_loss"] = float(of(test.loss)[unseen].double().mean())
        if test.extra:
            metrics.update(task_metrics(task, test, everywhere(unseen), "unseen_test", pooled=False))
    if task.accuracy:
        metrics.update(group_accuracy(test.accuracy, data.info.get("group"), everywhere(seen), "test_accuracy"))
        metrics.update(architecture_accuracy(test.accuracy, data.info, everywhere(seen), "test_accuracy"))
    columns = {
        **{key: data.info[key] for key in ("group", "shift_level", ARCHITECTURE) if key in data.info},
        "seen": data.seen,  # whether the client trains (1) or not (0), also when it was not scored (a lost node's)
        "train_samples": train.count,
        "test_samples": test.count,
        **({"test_accuracy": test.accuracy} if task.accuracy else {}),
        "test_loss": test.loss,
        **{f"test_{name}": values for name, values in test.extra.items()},
        **({"train_accuracy": train.accuracy} if task.accuracy else {}),
        "train_loss": train.loss,
    }
    if data.val is not None:
        val = scores("val")
        if task.accuracy:
            metrics["val_accuracy"] = float(of(val.accuracy)[seen].double().mean())
        metrics["val_loss"] = float(of(val.loss)[seen].double().mean())
        if val.extra or val.outputs is not None:
            metrics.update(task_metrics(task, val, everywhere(seen), "val"))
        columns["val_samples"] = val.count
        columns.update({"val_accuracy": val.accuracy} if task.accuracy else {})
        columns["val_loss"] = val.loss
    return metrics, columns, test, train


def group_accuracy(
    accuracy: Tensor, groups: Tensor | None, clients: Tensor, prefix: str, label: str = "group"
) -> dict[str, float]:
    """With ground-truth groups (``shift``): ``<prefix>_group<g>``, the mean of the (K,) `accuracy` over the
    `clients` (a (K,) mask) of each group g, and ``<prefix>_worst_group``, the lowest of them; none without. The
    clients' architectures (``model: architectures``) are groups too (`label` ``arch``)."""
    if groups is None:
        return {}
    out = {}
    for g in torch.unique(groups[clients]).tolist():
        out[f"{prefix}_{label}{g}"] = float(accuracy[clients & (groups == g)].double().mean())
    if out:
        out[f"{prefix}_worst_{label}"] = min(out.values())
    return out


def architecture_accuracy(accuracy: Tensor, info: dict[str, Tensor], clients: Tensor, prefix: str) -> dict[str, float]:
    """``<prefix>_arch<a>``: the mean accuracy of the `clients` of each architecture a (``model: architectures``)."""
    return group_accuracy(accuracy, info.get(ARCHITECTURE), clients, prefix, "arch")


def target_factor(task: Task, scale: TargetScale | None, name: str) -> float:
    """What a reported value `name` ("loss" or one of the task's metrics) of a model trained on targets standardised
    by `scale` is multiplied by to be in the targets' units: s^p, p the task's `Task.target_powers` (1 without a
    scale)."""
    return scale.scale ** task.target_powers.get(name, 0) if scale is not None else 1.0


def in_target_units(scores: ClientScores, task: Task, scale: TargetScale | None) -> ClientScores:
    """`scores` in the targets' own units (`target_factor`: a squared error × s², MAE and RMSE × s, R² as it is),
    the scored outputs and labels mapped back for the pooled metrics; `scores` itself without a scale. The engine's
    losses stay in the units it trains in (the F_k of the strategies, the requirements ρ_k)."""
    if scale is None:
        return scores
    extra = {name: values * target_factor(task, scale, name) for name, values in scores.extra.items()}
    out = replace(scores, loss=scores.loss * target_factor(task, scale, "loss"), extra=extra)
    if scores.outputs is not None and scores.labels is not None:
        out.outputs, out.labels = scale.original(scores.outputs), scale.original(scores.labels)
    return out


def task_metrics(
    task: Task, scores: ClientScores, clients: Tensor, prefix: str, pooled: bool = True
) -> dict[str, float]:
    """The task's own metrics of `scores` over `clients` (a (K,) mask): ``<prefix>_<name>``, the mean over those
    clients where it is defined (AUC needs both classes), and ``<prefix>_<name>_pooled`` over their samples pooled."""
    out = {}
    for name, values in scores.extra.items():
        defined = values[clients][~torch.isnan(values[clients])]
        out[f"{prefix}_{name}"] = float(defined.double().mean()) if len(defined) else float("nan")
    if pooled:
        out.update({f"{prefix}_{name}_pooled": value for name, value in scores.pooled(task, clients).items()})
    return out


def spread_scores(scores: ClientScores, clients: Tensor) -> ClientScores:
    """`scores` with every client outside `clients` given the values of one of `clients` (in turn): finite,
    plausible scores for a metric plugin whose cost, not its values, matters (``--estimate``)."""
    if len(clients) == 0:
        return scores
    k = len(scores.loss)
    source = clients[torch.arange(k) % len(clients)]
    source[clients] = clients
    return ClientScores(scores.loss[source], scores.accuracy[source], scores.count[source])


def scores_personal(strategy: Strategy, settings: PersonalEvalConfig) -> bool:
    """Whether a run scores its clients' personalised models: as ``personal_eval.enabled`` says, else when the
    strategy has personalised models or the run fine-tunes before scoring."""
    if settings.enabled is not None:
        return settings.enabled
    return settings.finetune_steps > 0 or strategy.personalization(torch.zeros(0, dtype=torch.long)) is not None


def personal_plan(
    strategy: Strategy, settings: PersonalEvalConfig, local: LocalSettings, clients: Tensor
) -> LocalPlan | None:
    """The plan that makes `clients`' personalised models, or None when the run does not score them: the
    strategy's own (`Strategy.personalization`: a stored personal part, steps from the global model), or the
    global model; with ``finetune_steps``, that many plain SGD steps from there instead of the strategy's own."""
    if not scores_personal(strategy, settings):
        return None
    plan = strategy.personalization(clients)
    if plan is None:
        plan = LocalPlan.uniform(clients, 0, local.lr, local.batch_size)
    if settings.finetune_steps:
        lr = settings.lr if settings.lr is not None else local.lr
        tuned = LocalPlan.uniform(clients, settings.finetune_steps, lr, local.batch_size, stream=PERSONAL_STREAM)
        plan = replace(tuned, personal=plan.personal, starts=plan.starts)
    return plan


def evaluate_personal(
    engine: EngineProtocol,
    params: Tensor,
    plan: LocalPlan,
    round_: int,
    requirements: ClientRequirements | None = None,
) -> tuple[dict[str, float], dict[str, Tensor]]:
    """Round metrics and per-client columns of the personalised models `plan` makes from the global model `params`
    (after round `round_`), each scored on its client's own test data: ``personal_test_accuracy`` (mean, std,
    worst and best 10%), ``personal_test_loss``, the task's own metrics as for the global model (`task_metrics`:
    ``personal_test_auc``, ``_f1``, ``_balanced_accuracy`` of a binary task, and their ``_pooled`` values) and, with
    `requirements`, ``personal_appeal`` (the share of clients whose personalised model's loss is below their
    requirement ρ_k, MaxFL's appeal); the same for unseen clients (``unseen_`` prefix, not pooled); NaN in the
    columns for clients not in the plan."""
    data, task = engine.data, engine.model.task
    scores = scores_of_some(engine.personal_scores(params, plan, round_, "test"), plan.clients, data.test.sizes)
    scored = ~torch.isnan(scores.loss)
    rho = requirements.rho if requirements is not None else None
    seen, unseen = data.seen & scored, ~data.seen & scored
    reported = in_target_units(scores, task, data.target_scale)  # losses and metrics in the targets' units
    metrics = distribution(scores.accuracy[seen], "personal_test_accuracy")  # the spread over seen clients
    for prefix, group in (("", seen), ("unseen_", unseen)):
        if bool(group.any()):
            metrics[f"{prefix}personal_test_accuracy"] = float(scores.accuracy[group].double().mean())
            metrics[f"{prefix}personal_test_loss"] = float(reported.loss[group].double().mean())
            metrics.update(task_metrics(task, reported, group, f"{prefix}personal_test", pooled=not prefix))
            if rho is not None:  # ρ_k is in the units the engine trains in, as its losses are
                appealing = scores.loss[group] < rho[group]  # MaxFL's appeal (eq. 1): loss below the requirement
                metrics[f"{prefix}personal_appeal"] = float(appealing.double().mean())
    if task.accuracy:
        metrics.update(group_accuracy(scores.accuracy, data.info.get("group"), seen, "personal_test_accuracy"))
        metrics.update(architecture_accuracy(scores.accuracy, data.info, seen, "personal_test_accuracy"))
    columns = {"personal_test_accuracy": scores.accuracy, "personal_test_loss": reported.loss}
    columns.update({f"personal_test_{name}": values for name, values in reported.extra.items()})
    return metrics, columns
