"""Checks of a built experiment that config validation cannot make, run before a run folder is written."""

from __future__ import annotations

import math

import torch

from fedhet.errors import ConfigError
from fedhet.experiments.build import Experiment

MAX_BATCH_BYTES = 4 << 30  # the mini-batches of one round's cohort: indices, weights and gathered inputs


def check_experiment(experiment: Experiment) -> None:
    """Refuse, in one line, an experiment that would fail in its first round: the model does not fit the data, or
    one round's mini-batches would not fit in memory."""
    check_batch_memory(experiment)
    check_model_fits(experiment)


def batch_bytes(clients: int, steps: int, batch: int, features: int) -> int:
    """Bytes of one round's padded mini-batches: (clients, steps, batch) int64 indices and float32 weights, and the
    float32 inputs they gather (the engine pads every batch to `batch` rows; see `fedhet.engine.batches`)."""
    return clients * steps * batch * (12 + 4 * features)


def check_batch_memory(experiment: Experiment) -> None:
    """Refuse a `local.batch_size` whose padded batches need more than `MAX_BATCH_BYTES` in one round."""
    cfg, data = experiment.config, experiment.data
    features = math.prod(data.input_shape) if data.input_shape else 1
    need = batch_bytes(cfg.clients_per_round, cfg.local.steps, cfg.local.batch_size, features)
    if need <= MAX_BATCH_BYTES:
        return
    largest = int(data.train.sizes.max()) if data.num_clients else 0
    hint = (
        f"; no client has more than {largest} training samples, so a larger batch only adds padding"
        if cfg.local.batch_size > largest
        else ""
    )
    raise ConfigError(
        f"local.batch_size {cfg.local.batch_size} × local.steps {cfg.local.steps} × clients_per_round "
        f"{cfg.clients_per_round} needs about {need / 2**30:,.1f} GiB of mini-batches per round (at most "
        f"{MAX_BATCH_BYTES / 2**30:.0f}); lower local.batch_size{hint}"
    )


def check_model_fits(experiment: Experiment) -> None:
    """One forward pass of the initial model on two training samples: it must run and give (2, classes) logits.

    Runs under a forked RNG and without gradients, so the run's numbers do not change. Skipped when the engine
    holds no samples (a remote engine: the nodes have the data).
    """
    engine, data, cfg = experiment.engine, experiment.data, experiment.config
    x = getattr(data.train, "x", None)
    if not isinstance(x, torch.Tensor) or len(x) == 0:
        return
    model, dataset = cfg.spec("model")["name"], cfg.spec("dataset")["name"]
    fit = f"model '{model}' does not fit dataset '{dataset}' (samples of shape {tuple(x.shape[1:])}, {x.dtype})"
    hint = "choose another model (fedhet list models)"
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            logits = engine.model.logits(engine.initial_params(), x[:2].cpu())
    except (RuntimeError, ValueError, IndexError, TypeError) as err:
        reason = _first_line(err)
        raise ConfigError(f"{fit}: {reason}; {hint}") from None
    expected = (min(2, len(x)), data.num_classes)
    if tuple(logits.shape) != expected:
        raise ConfigError(f"{fit}: it gives outputs of shape {tuple(logits.shape)}, not {expected}; {hint}")


def _first_line(err: BaseException, limit: int = 160) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
