"""Checks of a run that config validation cannot make (they need the data), made before the engine is built and
before anything is written: the model must fit the data, and one round's mini-batches must fit in memory."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedhet.data.dataset import FederatedData
from fedhet.engine.functional import FlatModel
from fedhet.engine.objective import DataTerm, LocalTerm
from fedhet.engine.plan import MAX_BATCH_BYTES, batch_bytes
from fedhet.errors import ConfigError
from fedhet.experiments.config import RunConfig
from fedhet.experiments.trackers import validate_track


def check_run(config: RunConfig, data: FederatedData, model: FlatModel) -> None:
    """Refuse, in one line, a run that would fail in its first round (or as its trackers start)."""
    for spec in validate_track(config.track):
        spec.require()  # a tracker whose library is missing: before the run folder is created
    check_batch_memory(config, data)
    check_model_fits(config, data, model)


def check_exits(config: RunConfig, terms: Sequence[LocalTerm], model: FlatModel) -> None:
    """Refuse a local term that reads a multi-exit model's exits (``needs_exits``) on a model without exits, and
    DP-SGD on a multi-exit model (its per-sample gradients are of one output's loss)."""
    if config.local.dp_sgd is not None and model.exits:
        raise ConfigError(
            "local.dp_sgd clips per-sample gradients of one output's loss and cannot train a multi-exit model; use "
            "client-level DP (algorithm: {name: dp, ...}) or a model without exits"
        )
    for term in terms:
        if isinstance(term, DataTerm) and term.needs_exits and not model.exits:
            raise ConfigError(
                f"local term '{term.name}' reads a multi-exit model's exits, and this model has none; use a model "
                "with exits (model: mlp_exits or cnn_exits)"
            )


def local_steps(config: RunConfig, data: FederatedData) -> int:
    """The most local steps a client takes in a round (``local.epochs`` gives larger clients more)."""
    local = config.local
    if local.epochs is None:
        return local.steps
    largest = int(data.train.sizes.max()) if data.num_clients else 0
    return max(1, math.ceil(local.epochs * largest / local.batch_size))


def check_batch_memory(config: RunConfig, data: FederatedData) -> None:
    """Refuse a `local.batch_size` (or steps, epochs) whose padded batches need more than `MAX_BATCH_BYTES` in one
    round."""
    local = config.local
    features = math.prod(data.input_shape) if data.input_shape else 1
    steps = local_steps(config, data)
    need = batch_bytes(config.clients_per_round, steps, local.batch_size, features)
    if need <= MAX_BATCH_BYTES:
        return
    largest = int(data.train.sizes.max()) if data.num_clients else 0
    hint = (
        f"; no client has more than {largest} training samples, so a larger batch only adds padding"
        if local.batch_size > largest
        else ""
    )
    what = f"local.epochs {local.epochs:g} ({steps:,} steps)" if local.epochs is not None else f"local.steps {steps:,}"
    raise ConfigError(
        f"local.batch_size {local.batch_size:,} × {what} × clients_per_round {config.clients_per_round} needs about "
        f"{need / 2**30:,.1f} GiB of mini-batches per round (at most {MAX_BATCH_BYTES / 2**30:.0f}); lower "
        f"local.batch_size or the steps{hint}"
    )


def check_model_fits(config: RunConfig, data: FederatedData, model: FlatModel) -> None:
    """One forward pass of the initial model on two training samples: it must run and give (2, outputs) outputs (the
    task's width: the classes, one logit for binary, the targets for regression).

    Runs under a forked RNG and without gradients, so the run's numbers do not change. Skipped when there are no
    samples here (a Flower server: the nodes hold the data).
    """
    x = data.train.x
    if len(x) == 0:
        return
    name, dataset = config.spec("model")["name"], config.spec("dataset")["name"]
    fit = f"model '{name}' does not fit dataset '{dataset}' (samples of shape {tuple(x.shape[1:])}, {x.dtype})"
    hint = "choose another model (fedhet list models)"
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            logits = model.logits(model.initial_params(), x[:2].cpu())
    except (RuntimeError, ValueError, IndexError, TypeError) as err:
        raise ConfigError(f"{fit}: {_first_line(err)}; {hint}") from None
    expected = (min(2, len(x)), model.task.outputs(data.num_classes))
    if tuple(logits.shape) != expected:
        raise ConfigError(f"{fit}: it gives outputs of shape {tuple(logits.shape)}, not {expected}; {hint}")


def _first_line(err: BaseException, limit: int = 160) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
