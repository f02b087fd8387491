"""A run's privacy ledger: what each round released, ε at δ after it, and what privacy cost which clients.

The ledger knows mechanisms only through their hooks (`fedhet.privacy.mechanisms.Mechanism`): each declares its
release and what counts as one (a round of the run, a client's participation, a client's local step); the ledger
counts them, composes them with dp-accounting, sets the first mechanism's noise from a target ε, and reports each
mechanism's ε under its own names. The run's mechanisms: those the strategy's wrappers run
(`fedhet.privacy.strategy.MechanismWrapper`), then DP-SGD's (``local.dp_sgd``). The built-in two:

Client level (``algorithm: {name: dp, ...}``, `fedhet.privacy.strategy`): every round is one Gaussian release of
noise multiplier z (`fedhet.privacy.accounting.Release`): with central noise on a fixed-size sample of m of the K
seen clients (sampling without replacement, replace-one adjacency), or a Poisson sample of rate q = m/K (add or
remove); without amplification (``privacy.amplification: false``) on every client. With local noise each client's
own updates are releases (replace-one, no amplification: the server knows who took part), so ε is per client and
the run reports the largest.

Example level (``local.dp_sgd``): every local step of client k is a release on its n_k samples: Poisson-sampled at
q_k = min(1, B/n_k) with ``sampling: poisson``; with ``shuffle`` a sample is in at most one batch per pass over the
client's data, and each such batch counts in full (replace-one, no amplification). ε is per client; the run reports
the largest.

The accountant assumes a uniform sample of clients each round: a run whose availability process, attack or
strategy decides who takes part is refused in one line, unless the user accepts an accounting without
amplification. The ledger keeps counts (rounds, participations, steps), not an accountant's state, and ε is
computed from them afresh, so a resumed run reports the same numbers (its counts are in the checkpoint).

What privacy costs heterogeneous clients: the test accuracy of the global model by quartile of the clients'
training-set sizes, and for clients whose updates were clipped in at least half of their rounds against the others
(clipping biases clients whose updates are large), beside the worst 10% (``test_accuracy_worst10``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedhet.engine.evaluate import ClientScores
from fedhet.engine.objective import DataTerm
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.engine.privacy import ExampleDP, refuse_with
from fedhet.engine.protocol import EngineProtocol
from fedhet.errors import ConfigError
from fedhet.privacy.accounting import NOISE_CEILING, calibrate, check_accountant, epsilon, require_dp_accounting
from fedhet.privacy.mechanisms import Mechanism, RunShape, example_level
from fedhet.privacy.settings import DPSGDConfig, PrivacyConfig
from fedhet.privacy.strategy import MechanismWrapper
from fedhet.strategies.base import Strategy
from fedhet.strategies.wrapper import Wrapper

__all__ = ["PrivacyLedger", "RunShape", "run_mechanisms"]

QUARTILES = 4


def sampling_problem(strategy: Strategy, availability: str, attack: str, deadline: bool = False) -> str | None:
    """Why the cohort is not a uniform sample of the seen clients each round (None: it is); `deadline`: a round's
    deadline leaves slow clients out of the aggregate."""
    if deadline:
        return "the round's deadline leaves slow clients out"
    if availability != "always":
        return f"availability '{availability}' decides who can be sampled"
    if attack != "none":
        return f"attack '{attack}' changes who takes part"
    for part in strategy.parts():
        keeps = isinstance(part, Wrapper) and part.keeps_base_selection  # its base is among the parts, checked
        if type(part).select is not Strategy.select and not keeps:
            return f"strategy '{part.name}' chooses its clients itself"
    return None


def check_sampling(
    settings: PrivacyConfig, strategy: Strategy, availability: str, attack: str, deadline: bool = False
) -> None:
    """Refuse, in one line, central client-level DP whose accountant would assume a uniform sample of the clients
    each round where the run does not draw one, unless the user accepts an accounting without amplification."""
    if not any(m.assumes_uniform_cohort(settings) for m in strategy_mechanisms(strategy)):
        return
    problem = sampling_problem(strategy, availability, attack, deadline)
    if problem is not None:
        raise ConfigError(
            f"client-level DP's accountant assumes a uniform sample of clients each round, but {problem}; use "
            "availability: always and the base's own selection, or accept an accounting without amplification "
            "by sampling: privacy.amplification: false"
        )


def check_noise(key: str, z: float, limit: float, rule: str) -> None:
    """Refuse, in one line, a noise multiplier beyond any use (`limit`: the model would be noise, whatever the run)."""
    if not z <= limit:
        raise ConfigError(
            f"{key} {z:.4g} is beyond any use: above {limit:.4g} ({rule}) the noise the run adds to each "
            "coordinate exceeds the most the clipped updates can move it (docs/privacy.md, Refusals); lower it"
        )


def check_unused_privacy(settings: PrivacyConfig) -> None:
    """Refuse, in one line, ``privacy`` settings in a run without a DP mechanism (they would account nothing)."""
    if settings.target_epsilon is not None:
        raise ConfigError(
            "privacy.target_epsilon (--target-epsilon) sets the noise of a DP mechanism, and this run has none: "
            "use algorithm dp (client level), local.dp_sgd (example level) or algorithm private (a mechanism)"
        )
    default = PrivacyConfig()
    given = [key for key in PrivacyConfig.model_fields if getattr(settings, key) != getattr(default, key)]
    if given:
        raise ConfigError(
            f"privacy.{', privacy.'.join(given)} set the accounting of a DP mechanism, and this run has none: use "
            "algorithm dp (client level), local.dp_sgd (example level) or algorithm private (a mechanism), or leave "
            "privacy out"
        )


def check_dp_sgd(backend: str, strategy: Strategy, engine: EngineProtocol, seen: Tensor) -> None:
    """Refuse, in one line and before the run, DP-SGD where its per-sample gradients cannot be had: a backend that
    forms batch gradients by hand, or a plan with a data-space term, a local rule or dropout (`refuse_with`; the
    strategy's first plan, on a seen client)."""
    if backend == "conv":
        raise ConfigError(
            f"local.dp_sgd clips per-sample gradients, which backend '{backend}' does not form (it computes batch "
            "gradients by hand); use backend auto, vectorised or sequential"
        )
    clients = torch.nonzero(seen).flatten()[:1]
    if not len(clients):
        return
    plan = strategy.configure(0, clients, engine.initial_params())
    data_terms = any(isinstance(term, DataTerm) for term in plan.terms)
    refuse_with(ExampleDP(1.0), data_terms, plan.rule is not None, engine.model.has_dropout)


def planned_participations(strategy: Strategy, seen: Tensor, rounds: int) -> Tensor:
    """(K,) the rounds each client will take part in, drawn before the run from the strategy's own selection on
    the seen clients (a uniform sample keyed by the seed and the round: `sampling_problem` is None)."""
    counts = torch.zeros(len(seen), dtype=torch.long)
    for t in range(rounds):
        counts[strategy.select(t, seen)] += 1
    return counts


def strategy_mechanisms(strategy: Strategy) -> list[Mechanism]:
    """The privacy mechanisms the strategy's parts run (outermost first): a mechanism wrapper's, or a part that is a
    mechanism itself and active in its configuration (`Mechanism.active`)."""
    out = []
    for part in strategy.parts():
        if isinstance(part, MechanismWrapper):
            out.append(part.privacy_mechanism())
        elif isinstance(part, Mechanism) and part.active():
            out.append(part)
    return out


def run_mechanisms(strategy: Strategy, dp_sgd: DPSGDConfig | None) -> list[Mechanism]:
    """The run's privacy mechanisms: the strategy's, then DP-SGD's (``local.dp_sgd``)."""
    return [*strategy_mechanisms(strategy), *example_level(dp_sgd)]


def size_quartiles(sizes: Tensor, seen: Tensor) -> Tensor:
    """(K,) 1..4: the quartile of each seen client's training-set size (1: the smallest; equal counts, ties by id),
    0 for unseen clients."""
    out = torch.zeros(len(sizes), dtype=torch.long)
    ids = torch.nonzero(seen).flatten()
    order = ids[torch.as_tensor(np.argsort(sizes[ids].numpy(), kind="stable"))]
    for q, block in enumerate(np.array_split(order.numpy(), QUARTILES), start=1):
        out[torch.as_tensor(block, dtype=torch.long)] = q
    return out


def worst_pairs(pairs: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (n, count) pairs no other pair dominates: ε grows with the sampling rate B/n and with the count, so a pair
    with at least as large a rate (n no larger) and count elsewhere is no worse; only the others can be the worst."""
    kept: list[tuple[int, int]] = []
    for n, count in sorted(pairs, key=lambda p: (p[0], -p[1])):
        if not kept or count > max(c for _, c in kept):
            kept.append((n, count))
    return kept


def group_mean(values: Tensor, members: Tensor) -> float:
    """The mean of the finite `values` of the clients `members` selects (NaN if none)."""
    picked = values[members]
    picked = picked[torch.isfinite(picked)]
    return float(picked.double().mean()) if len(picked) else float("nan")


class PrivacyLedger:
    """The privacy of one run: its mechanisms' noise (the first one's set from a target ε when asked), the counts
    that determine what each spent, and the metrics and client columns that say it (module docstring)."""

    def __init__(self, settings: PrivacyConfig, mechanisms: list[Mechanism], shape: RunShape) -> None:
        require_dp_accounting()
        self.settings, self.mechanisms, self.shape = settings, mechanisms, shape
        names = [m.block() for m in mechanisms] + [m.metric_prefix() for m in mechanisms]
        if len(set(names)) < len(names):
            raise ConfigError(
                f"the run has two privacy mechanisms reported under one name ({', '.join(m.name for m in mechanisms)})"
                ": keep one of them"
            )
        k = len(shape.train_sizes)
        self.rounds = 0
        self.participations = torch.zeros(k, dtype=torch.long)
        self.clipped = torch.zeros(k, dtype=torch.long)
        self.steps = {m.block(): torch.zeros(k, dtype=torch.long) for m in mechanisms if m.unit() == "step"}
        target = settings.target_epsilon
        for i, mechanism in enumerate(mechanisms):
            check_accountant(mechanism.release(1.0, 1, shape, settings), settings.accountant)
            limit = mechanism.noise_limit(shape)
            if target is not None and i == 0:
                self.calibrate(mechanism, target, NOISE_CEILING if limit is None else limit[0])
            if limit is not None and mechanism.noise_key is not None:
                check_noise(mechanism.noise_key, mechanism.z, *limit)
            mechanism.refuse_unusable()

    def calibrate(self, mechanism: Mechanism, target: float, ceiling: float) -> None:
        """Set the mechanism's noise so that the worst client's ε after the run is the target (refused, in one
        line, where the mechanism has no noise to set or the config sets it)."""
        if mechanism.noise_key is None:
            raise ConfigError(
                "privacy.target_epsilon sets the noise of the run's first privacy mechanism, and "
                f"'{mechanism.name}' has none to set; leave the target out and set its own parameters"
            )
        if mechanism.noise_given():
            raise ConfigError(f"give {mechanism.noise_key} or privacy.target_epsilon, not both")
        mechanism.use_noise_multiplier(calibrate(lambda z: self.planned_epsilon(mechanism, z), target, ceiling))

    # -- accounting -----------------------------------------------------------------------------------------------
    def epsilon_at(self, mechanism: Mechanism, z: float, n: int, count: int) -> float:
        """ε after `count` releases of `mechanism` at noise multiplier z for a client with `n` samples."""
        release = mechanism.release(z, n, self.shape, self.settings)
        return epsilon(release, count, self.settings.delta, self.settings.accountant)

    def counts(self, mechanism: Mechanism) -> Tensor:
        """(K,) the releases each client has had so far: the run's rounds, its own rounds, or its steps."""
        unit = mechanism.unit()
        if unit == "round":
            return torch.full((len(self.participations),), self.rounds, dtype=torch.long)
        return self.participations if unit == "participation" else self.steps[mechanism.block()]

    def epsilons(self, mechanism: Mechanism) -> Tensor:
        """(K,) each client's ε so far."""
        z, sizes, counts = mechanism.z, self.shape.train_sizes.tolist(), self.counts(mechanism).tolist()
        return torch.tensor(
            [self.epsilon_at(mechanism, z, n, c) for n, c in zip(sizes, counts, strict=True)], dtype=torch.float64
        )

    def worst(self, eps: Tensor) -> float:
        """The largest ε of a seen client (0 without any)."""
        return float(eps[self.shape.seen].max()) if bool(self.shape.seen.any()) else 0.0

    def planned_epsilon(self, mechanism: Mechanism, z: float) -> float:
        """The largest client's ε after the run at noise multiplier z (the bound a target ε calibrates z to): every
        seen client (with data, for steps) takes part in the rounds planned for it (`RunShape.planned`)."""
        shape, unit = self.shape, mechanism.unit()
        members = shape.seen & (shape.train_sizes > 0) if unit == "step" else shape.seen
        clients = torch.nonzero(members).flatten()
        if unit == "round":
            counts = torch.full((len(clients),), shape.rounds, dtype=torch.long)
        elif unit == "participation":
            counts = shape.planned()[clients]
        else:
            counts = mechanism.step_counts(clients, shape.steps[clients], shape) * shape.planned()[clients]
        pairs = {(int(shape.train_sizes[k]), int(c)) for k, c in zip(clients.tolist(), counts.tolist(), strict=True)}
        return max((self.epsilon_at(mechanism, z, n, c) for n, c in worst_pairs(pairs)), default=0.0)

    def clips(self) -> bool:
        """Whether a mechanism clips the clients' updates (the ledger then says whom it clipped)."""
        return any(m.clips_updates for m in self.mechanisms)

    # -- the run's hooks ------------------------------------------------------------------------------------------
    def training_plan(self, plan: LocalPlan) -> LocalPlan:
        """A plan the round trains, with the mechanisms' local steps (DP-SGD's; their count joins the ledger)."""
        for mechanism in self.mechanisms:
            if mechanism.unit() == "step":
                self.steps[mechanism.block()][plan.clients] += mechanism.step_counts(
                    plan.clients, plan.steps, self.shape
                )
            plan = mechanism.local_steps(plan)
        return plan

    def record(self, result: LocalResult | None) -> None:
        """A round has ended; `result` holds the updates the server aggregated (None: nobody trained)."""
        self.rounds += 1
        if result is None:
            return
        self.participations[result.clients] += 1
        if result.clipped is not None:
            self.clipped[result.clients] += result.clipped.long()

    def round_metrics(self, test: ClientScores) -> dict[str, float]:
        """ε at δ so far, and the global model's test accuracy by client group (`test`: every client's scores)."""
        shape, out = self.shape, {}
        accuracy = test.accuracy
        for mechanism in self.mechanisms:
            out[f"{mechanism.metric_prefix()}_epsilon"] = self.worst(self.epsilons(mechanism))
            out.update(mechanism.accounting_metrics())
        quartile = size_quartiles(shape.train_sizes, shape.seen)
        for q in range(1, QUARTILES + 1):
            out[f"test_accuracy_size_q{q}"] = group_mean(accuracy, quartile == q)
        if self.clips():
            trained = shape.seen & (self.participations > 0)
            often = trained & (2 * self.clipped >= self.participations)
            out["dp_clipped_often"] = float(often.sum()) / max(1, int(trained.sum()))
            out["test_accuracy_clipped_often"] = group_mean(accuracy, often)
            out["test_accuracy_clipped_rarely"] = group_mean(accuracy, trained & ~often)
        return out

    def client_columns(self) -> dict[str, Tensor]:
        """Per-client columns of clients.csv: size quartile, rounds taken part in, clipped updates and their rate,
        and each mechanism's count of steps and ε where they are the client's own."""
        columns = {"size_quartile": size_quartiles(self.shape.train_sizes, self.shape.seen)}
        if self.clips():
            rate = self.clipped.double() / self.participations.double()
            columns.update({"dp_rounds": self.participations, "dp_clipped": self.clipped, "dp_clip_rate": rate})
        for mechanism in self.mechanisms:
            prefix, unit = mechanism.metric_prefix(), mechanism.unit()
            if unit == "step":
                columns[f"{prefix}_steps"] = self.steps[mechanism.block()]
            if unit != "round":
                columns[f"{prefix}_epsilon"] = self.epsilons(mechanism)
        return columns

    def summary(self) -> dict[str, Any]:
        """The privacy block of summary.json: the accounting, each mechanism and its ε."""
        out: dict[str, Any] = {"delta": self.settings.delta, "accountant": self.settings.accountant}
        if self.settings.target_epsilon is not None:
            out["target_epsilon"] = self.settings.target_epsilon
        out["amplification"] = self.settings.amplification
        for mechanism in self.mechanisms:
            eps = self.worst(self.epsilons(mechanism))
            out[mechanism.block()] = {"epsilon": eps, **mechanism.report(self.rounds)}
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "participations": self.participations.clone(),
            "clipped": self.clipped.clone(),
            "steps": {block: steps.clone() for block, steps in self.steps.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds = int(state["rounds"])
        self.participations = state["participations"].clone()
        self.clipped = state["clipped"].clone()
        steps = state.get("steps", {"example": state.get("sgd_steps")})  # a checkpoint of fedhet 0.4's ledger
        for block in self.steps:
            self.steps[block] = steps[block].clone()
