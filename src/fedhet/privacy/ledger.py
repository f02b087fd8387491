"""A run's privacy ledger: what each round released, ε at δ after it, and what privacy cost which clients.

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

import math
from dataclasses import dataclass, replace
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
from fedhet.privacy.accounting import Release, calibrate, check_accountant, epsilon, require_dp_accounting
from fedhet.privacy.settings import DPSGDConfig, PrivacyConfig
from fedhet.privacy.strategy import DEFAULT_NOISE_MULTIPLIER, DP
from fedhet.strategies.base import Strategy
from fedhet.strategies.wrapper import Wrapper

QUARTILES = 4


@dataclass
class RunShape:
    """What accounting needs of a run besides its mechanisms."""

    rounds: int
    clients_per_round: int
    train_sizes: Tensor  # (K,) training samples per client
    seen: Tensor  # (K,) bool: the clients that train
    steps: Tensor  # (K,) local steps per round under the run's local settings
    batch_size: int
    participations: Tensor | None = None  # (K,) rounds each client will take part in (None: not known, every round)

    def planned(self) -> Tensor:
        """(K,) the rounds each client takes part in: as planned where the cohorts are known before the run (a
        uniform sample from the run's seed, `planned_participations`), else every round (an upper bound)."""
        if self.participations is not None:
            return self.participations
        return torch.full((len(self.train_sizes),), self.rounds, dtype=torch.long)


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
    client = find_dp(strategy)
    if client is None or client.noise != "central" or not settings.amplification:
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
            "use algorithm dp (client level) or local.dp_sgd (example level)"
        )
    default = PrivacyConfig()
    given = [key for key in PrivacyConfig.model_fields if getattr(settings, key) != getattr(default, key)]
    if given:
        raise ConfigError(
            f"privacy.{', privacy.'.join(given)} set the accounting of a DP mechanism, and this run has none: use "
            "algorithm dp (client level) or local.dp_sgd (example level), or leave privacy out"
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


def find_dp(strategy: Strategy) -> DP | None:
    """The client-level DP wrapper among the strategy's parts, if any."""
    return next((part for part in strategy.parts() if isinstance(part, DP)), None)


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
    """The privacy of one run: its mechanisms' noise (set from a target ε when asked), the counts that determine
    what was spent, and the metrics and client columns that say it (module docstring)."""

    def __init__(self, settings: PrivacyConfig, client: DP | None, sgd: DPSGDConfig | None, shape: RunShape) -> None:
        require_dp_accounting()
        self.settings, self.client, self.shape = settings, client, shape
        k = len(shape.train_sizes)
        self.rounds = 0
        self.participations = torch.zeros(k, dtype=torch.long)
        self.clipped = torch.zeros(k, dtype=torch.long)
        self.sgd_steps = torch.zeros(k, dtype=torch.long)  # DP-SGD steps taken (Poisson) or batches a sample may be in
        self.sgd: ExampleDP | None = None
        target = settings.target_epsilon
        if client is not None:
            check_accountant(self.client_release(1.0), settings.accountant)
            if target is not None:
                if client.noise_multiplier is not None:
                    raise ConfigError("give algorithm.noise_multiplier or privacy.target_epsilon, not both")
                client.use_noise_multiplier(calibrate(self.planned_client_epsilon, target, self.client_z_limit()))
            check_noise("algorithm.noise_multiplier", client.z, self.client_z_limit(), self.client_limit_text())
            client.update_z  # noqa: B018 - refuses, before the run, a count noise that leaves the updates none
        if sgd is not None:
            z = sgd.noise_multiplier
            calibrated = target is not None and client is None  # a target sets DP-SGD's noise without algorithm dp
            if z is not None and calibrated:
                raise ConfigError("give local.dp_sgd.noise_multiplier or privacy.target_epsilon, not both")
            self.sgd = ExampleDP(sgd.clip, DEFAULT_NOISE_MULTIPLIER if z is None else z, sgd.sampling)
            limit = self.sgd_z_limit()
            if calibrated:
                assert target is not None
                self.sgd = replace(self.sgd, noise_multiplier=calibrate(self.planned_sgd_epsilon, target, limit))
            check_noise("local.dp_sgd.noise_multiplier", self.sgd.noise_multiplier, limit, self.sgd_limit_text())

    # -- client level ---------------------------------------------------------------------------------------------
    def client_release(self, z: float) -> Release:
        """One round's release of client-level DP at noise multiplier z."""
        client, shape = self.client, self.shape
        assert client is not None
        fixed = client.sampling == "fixed"
        if client.noise == "local" or not self.settings.amplification:
            return Release(z, "none", replace=fixed or client.noise == "local")
        population = int(shape.seen.sum())
        m = min(shape.clients_per_round, population)
        if fixed:
            return Release(z, "fixed", population=population, sample=m)
        return Release(z, "poisson", rate=m / max(population, 1))

    def planned_client_epsilon(self, z: float) -> float:
        """ε after the run (the bound a target ε calibrates z to): central noise, the run's rounds; local noise,
        the rounds the most frequent participant takes part in."""
        assert self.client is not None
        shape = self.shape
        planned = shape.planned()[shape.seen]
        rounds = shape.rounds if self.client.noise == "central" or not len(planned) else int(planned.max())
        return self.client_epsilon_at(z, rounds)

    def client_z_limit(self) -> float:
        """The largest useful noise multiplier of client-level DP: beyond it the noise the run adds to one
        coordinate of the model, √T·zC/m (central; local: √T·zC/√m), exceeds the most T clipped mean updates can
        move it, T·C: z > m√T (central), √(mT) (local)."""
        assert self.client is not None
        m = max(1, min(self.shape.clients_per_round, int(self.shape.seen.sum())))
        cohort = m if self.client.noise == "central" else math.sqrt(m)
        return cohort * math.sqrt(max(1, self.shape.rounds))

    def client_limit_text(self) -> str:
        assert self.client is not None
        central = self.client.noise == "central"
        m, rounds = self.shape.clients_per_round, self.shape.rounds
        return f"{'m' if central else '√m'}·√T, m = {m} clients a round, T = {rounds} rounds"

    def client_epsilon_at(self, z: float, rounds: int) -> float:
        """ε after `rounds` rounds in which a client takes part (central: the rounds of the run)."""
        return epsilon(self.client_release(z), rounds, self.settings.delta, self.settings.accountant)

    def client_epsilons(self) -> Tensor:
        """(K,) each client's ε so far: the run's under central noise, its own participations' under local noise."""
        assert self.client is not None
        z = self.client.z
        if self.client.noise == "central":
            return torch.full((len(self.participations),), self.client_epsilon_at(z, self.rounds), dtype=torch.float64)
        counts = self.participations.tolist()
        return torch.tensor([self.client_epsilon_at(z, c) for c in counts], dtype=torch.float64)

    # -- example level --------------------------------------------------------------------------------------------
    def sgd_release(self, z: float, n: int) -> Release:
        """One DP-SGD step (Poisson) or batch (shuffle) of a client with `n` samples."""
        assert self.sgd is not None
        if self.sgd.sampling == "shuffle":
            return Release(z, "none", replace=True)
        rate = min(1.0, self.shape.batch_size / max(n, 1))
        return Release(z, "poisson" if self.settings.amplification else "none", rate=rate)

    def sgd_counts(self, clients: Tensor, steps: Tensor) -> Tensor:
        """What `steps` local steps of `clients` add to their counts: the steps (Poisson), or with shuffled batches
        the passes they start over their data, ⌈τ / ⌊n_k / b_k⌋⌉ (a sample is in one batch a pass)."""
        assert self.sgd is not None
        if self.sgd.sampling == "poisson":
            return steps.long()
        n = self.shape.train_sizes[clients].long()
        per_pass = (n // n.clamp(min=1, max=self.shape.batch_size)).clamp(min=1)
        return -(-steps.long() // per_pass)

    def planned_sgd_epsilon(self, z: float) -> float:
        """The largest client's ε after the run if every seen client with data trains its local steps in the rounds
        it takes part in (`RunShape.planned`; the bound a target ε calibrates DP-SGD's noise to)."""
        shape = self.shape
        clients = torch.nonzero(shape.seen & (shape.train_sizes > 0)).flatten()
        counts = self.sgd_counts(clients, shape.steps[clients]) * shape.planned()[clients]
        pairs = {(int(shape.train_sizes[k]), int(c)) for k, c in zip(clients.tolist(), counts.tolist(), strict=True)}
        return max((self.sgd_epsilon_at(z, n, c) for n, c in worst_pairs(pairs)), default=0.0)

    def sgd_z_limit(self) -> float:
        """The largest useful noise multiplier of DP-SGD: beyond it the noise on one coordinate over a client's
        S = τT steps, √S·zC/B, exceeds the most S clipped mean gradients can move it, S·C: z > B√S."""
        steps = int(self.shape.steps.max()) if len(self.shape.steps) else 1
        return self.shape.batch_size * math.sqrt(max(1, steps * self.shape.rounds))

    def sgd_limit_text(self) -> str:
        return f"B·√(τT), batch size B = {self.shape.batch_size}, τT local steps in all"

    def sgd_epsilon_at(self, z: float, n: int, count: int) -> float:
        release = self.sgd_release(z, n)
        return epsilon(release, count, self.settings.delta, self.settings.accountant)

    def sgd_epsilons(self) -> Tensor:
        """(K,) each client's DP-SGD ε so far."""
        assert self.sgd is not None
        z, sizes = self.sgd.noise_multiplier, self.shape.train_sizes.tolist()
        counts = self.sgd_steps.tolist()
        return torch.tensor(
            [self.sgd_epsilon_at(z, n, c) for n, c in zip(sizes, counts, strict=True)], dtype=torch.float64
        )

    # -- the run's hooks ------------------------------------------------------------------------------------------
    def training_plan(self, plan: LocalPlan) -> LocalPlan:
        """A plan the round trains, with DP-SGD in its steps (their count joins the clients' ledger)."""
        if self.sgd is None:
            return plan
        self.sgd_steps[plan.clients] += self.sgd_counts(plan.clients, plan.steps)
        return replace(plan, dp_sgd=self.sgd)

    def record(self, result: LocalResult | None) -> None:
        """A round has ended; `result` holds the updates the server aggregated (None: nobody trained)."""
        self.rounds += 1
        if result is None or self.client is None:
            return
        self.participations[result.clients] += 1
        if result.clipped is not None:
            self.clipped[result.clients] += result.clipped.long()

    def round_metrics(self, test: ClientScores) -> dict[str, float]:
        """ε at δ so far, and the global model's test accuracy by client group (`test`: every client's scores)."""
        shape, out = self.shape, {}
        accuracy = test.accuracy
        if self.client is not None:
            eps = self.client_epsilons()
            out["dp_epsilon"] = float(eps[shape.seen].max()) if bool(shape.seen.any()) else 0.0
        if self.sgd is not None:
            eps_sgd = self.sgd_epsilons()
            out["dp_sgd_epsilon"] = float(eps_sgd[shape.seen].max()) if bool(shape.seen.any()) else 0.0
            out["dp_sgd_noise_multiplier"] = self.sgd.noise_multiplier
        quartile = size_quartiles(shape.train_sizes, shape.seen)
        for q in range(1, QUARTILES + 1):
            out[f"test_accuracy_size_q{q}"] = group_mean(accuracy, quartile == q)
        if self.client is not None:
            trained = shape.seen & (self.participations > 0)
            often = trained & (2 * self.clipped >= self.participations)
            out["dp_clipped_often"] = float(often.sum()) / max(1, int(trained.sum()))
            out["test_accuracy_clipped_often"] = group_mean(accuracy, often)
            out["test_accuracy_clipped_rarely"] = group_mean(accuracy, trained & ~often)
        return out

    def client_columns(self) -> dict[str, Tensor]:
        """Per-client columns of clients.csv: size quartile, rounds taken part in, clipped updates and their rate,
        each client's ε (local noise) and DP-SGD's."""
        columns = {"size_quartile": size_quartiles(self.shape.train_sizes, self.shape.seen)}
        if self.client is not None:
            rate = self.clipped.double() / self.participations.double()
            columns.update({"dp_rounds": self.participations, "dp_clipped": self.clipped, "dp_clip_rate": rate})
            if self.client.noise == "local":
                columns["dp_epsilon"] = self.client_epsilons()
        if self.sgd is not None:
            columns["dp_sgd_steps"] = self.sgd_steps
            columns["dp_sgd_epsilon"] = self.sgd_epsilons()
        return columns

    def summary(self) -> dict[str, Any]:
        """The privacy block of summary.json: the accounting, each mechanism and its ε."""
        out: dict[str, Any] = {"delta": self.settings.delta, "accountant": self.settings.accountant}
        if self.settings.target_epsilon is not None:
            out["target_epsilon"] = self.settings.target_epsilon
        out["amplification"] = self.settings.amplification
        if self.client is not None:
            eps = self.client_epsilons()
            out["client"] = {
                "epsilon": float(eps[self.shape.seen].max()) if bool(self.shape.seen.any()) else 0.0,
                "noise_multiplier": self.client.z,
                "noise": self.client.noise,
                "sampling": self.client.sampling,
                "clipping": self.client.clipping,
                "clip": self.client.initial_bound(),
                "clip_final": self.client.bound,
                "rounds": self.rounds,
            }
        if self.sgd is not None:
            eps_sgd = self.sgd_epsilons()
            out["example"] = {
                "epsilon": float(eps_sgd.max()) if len(eps_sgd) else 0.0,
                "noise_multiplier": self.sgd.noise_multiplier,
                "clip": self.sgd.clip,
                "sampling": self.sgd.sampling,
            }
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "participations": self.participations.clone(),
            "clipped": self.clipped.clone(),
            "sgd_steps": self.sgd_steps.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds = int(state["rounds"])
        self.participations = state["participations"].clone()
        self.clipped = state["clipped"].clone()
        self.sgd_steps = state["sgd_steps"].clone()
