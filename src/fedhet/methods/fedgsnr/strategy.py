"""FedGSNR (anonymous ICLR submission, "Accelerating federated learning on non-iid data via maximum gradient
signal to noise ratio"): per-client numbers of local steps from gradient statistics, on top of any strategy.

Each round, every selected client k measures at the received model w₁ the mean g̃_k and the per-coordinate
variance v_k = diag Σ̃_k of B per-sample gradients (1/B normaliser, §3 after Corollary 3.8). The server forms the
global statistics by the laws of total expectation and variance (eqs. 8–9, diagonal), and with

    L = ‖g̃‖² + Σ v/B,   M_k = g̃_kᵀg̃ + Σ √(v_k ⊙ v)/B,   N_k = ‖g̃_k‖² + Σ v_k/B        (§4)

the optimal number of local steps n_k = max(0, M_k/N_k) (Theorem 3.7, diagonal covariances), the GSNR
r_k = max(0, M_k/√(N_k L − M_k²)) (Definition 4.1), and the steps E_k = N·E_const·n_k / Σ_i n_i (§5: a
redistribution of the baseline's N·E_const steps). Clients with no steps are left out of the aggregation; the base
strategy re-normalises its weights over the clients it is given (Algorithm 1's p̃).

A client with fewer than B samples (n_k < B) measures its statistics on all n_k of them and trains on
mini-batches of b_k = min(B, n_k) (the engine's batches never exceed a client's data). B in Theorem 3.7 is the
size of the mini-batch whose gradient one step takes (Lemma 3.2: a step's gradient is the mean of B iid
per-sample gradients, covariance Σ/B), so such a client's n local steps are 𝒩(nη μ_k, n²η² Σ_k/b_k) while the
global step keeps Σ_g/B. Redoing the proof of Theorem 3.7 (App. B.3) with the two batch sizes gives

    L = ‖g̃‖² + Σ v/B,   M_k = g̃_kᵀg̃ + Σ √(v_k ⊙ v)/√(B b_k),   N_k = ‖g̃_k‖² + Σ v_k/b_k,

the paper's formulas when b_k = B (``client_batch: actual``, the default). ``client_batch: configured`` uses B for
every client, as the paper's formulas read literally (and as fedhet did before).

The maths are small pure functions; `GSNR` wraps a base strategy (FedAvg, FedProx, SCAFFOLD, FedNova, ...) and
changes only the number of local steps, as the paper describes ("we just change the number of local updates").
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.strategies.base import STRATEGIES, ServerContext
from fedhet.strategies.fedavg import fedavg_weights
from fedhet.strategies.wrapper import Wrapper

# r is +∞ when the local and global statistics coincide (Appendix C); we cap NL − M² at this share of NL.
GSNR_FLOOR = 1e-12


STATS_BLOCK = 1 << 24  # entries of a (clients × parameters) float64 temporary at most (a large model's: one client)


def _row_blocks(rows: int, width: int) -> list[slice]:
    """Slices of `rows` rows of `width` entries each, at most `STATS_BLOCK` entries (one row at least) a slice."""
    step = max(1, STATS_BLOCK // max(1, width))
    return [slice(lo, lo + step) for lo in range(0, rows, step)]


def global_statistics(means: Tensor, variances: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """Eqs. (8)–(9) on diagonals: g̃ = Σ_k p_k g̃_k and v = Σ_k p_k v_k + Σ_k p_k (g̃_k − g̃)^⊙2.

    `means`, `variances`: (m, P); `weights`: (m,) non-negative, normalised here. Returns float64 (P,) vectors,
    summed over blocks of clients (`_row_blocks`).
    """
    p = weights.double() / weights.double().sum()
    blocks = _row_blocks(*means.shape)
    g = torch.zeros(means.shape[1], dtype=torch.float64)
    for rows in blocks:
        g += p[rows] @ means[rows].double()
    v = torch.zeros_like(g)
    for rows in blocks:
        v += p[rows] @ (variances[rows].double() + (means[rows].double() - g) ** 2)
    return g, v


def gsnr_terms(
    local_mean: Tensor,
    local_var: Tensor,
    global_mean: Tensor,
    global_var: Tensor,
    batch: int,
    local_batch: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """L = ‖R_g‖²_F, M_k = ⟨R_k, R_g⟩_F, N_k = ‖R_k‖²_F of §4 with diagonal covariances (float64).

    tr((Σ_l Σ_g)^{1/2}) is Σ_i √(v_l,i v_g,i) = √v_l · √v_g for diagonal Σ. `local_batch` (m,): each client's own
    mini-batch size b_k (default `batch` for all): R_k holds (Σ_k/b_k)^{1/2}, so M_k divides by √(B b_k) and N_k
    by b_k (module docs). Returns L () and M, N (m,), computed over blocks of clients (`_row_blocks`).
    """
    mu_g, v_g = global_mean.double(), global_var.double().clamp_min(0)
    m = len(local_mean)
    b_k = torch.full((m,), float(batch), dtype=torch.float64) if local_batch is None else local_batch.double()
    big_l = mu_g @ mu_g + v_g.sum() / batch
    big_m = torch.zeros(m, dtype=torch.float64)
    big_n = torch.zeros(m, dtype=torch.float64)
    root_g = v_g.sqrt()
    for rows in _row_blocks(*local_mean.shape):
        mu_l, v_l = local_mean[rows].double(), local_var[rows].double().clamp_min(0)
        big_m[rows] = mu_l @ mu_g + v_l.sqrt() @ root_g / torch.sqrt(batch * b_k[rows])
        big_n[rows] = (mu_l**2).sum(1) + v_l.sum(1) / b_k[rows]
    return big_l, big_m, big_n


def optimal_steps(big_m: Tensor, big_n: Tensor) -> Tensor:
    """n₁^opt = max(0, M/N) (Theorem 3.7); 0 for a client with N = 0 (no gradient, nothing to learn)."""
    return torch.where(big_n > 0, big_m / big_n.clamp_min(torch.finfo(big_n.dtype).tiny), 0.0).clamp_min(0.0)


def min_distance(big_l: Tensor, big_m: Tensor, big_n: Tensor) -> Tensor:
    """Δ² = L − M²/N (Theorem 3.7): the minimal W₂² distance divided by η_r² (L where N = 0)."""
    return torch.where(big_n > 0, big_l - big_m**2 / big_n.clamp_min(torch.finfo(big_n.dtype).tiny), big_l)


def gsnr_ratio(big_l: Tensor, big_m: Tensor, big_n: Tensor) -> Tensor:
    """r(w) = max(0, M / √(N L − M²)) (Definition 4.1), i.e. cot θ between R_l and R_g.

    N L − M² ≥ 0 by Cauchy–Schwarz; it is floored at 1e-12 · N L, so identical statistics give r = 10⁶
    instead of +∞.
    """
    nl = big_n * big_l
    den = torch.sqrt(torch.maximum(nl - big_m**2, GSNR_FLOOR * nl))
    return torch.where(den > 0, big_m / den.clamp_min(torch.finfo(den.dtype).tiny), 0.0).clamp_min(0.0)


def round_preserving_total(exact: Tensor, total: int) -> Tensor:
    """Integers ⌊x_k⌋ plus one for the largest remainders, summing to `total` (= Σ x_k) (largest remainder)."""
    base = torch.floor(exact.double() + 1e-9).long()
    short = total - int(base.sum())
    if short > 0:
        remainder = exact.double() - base.double()
        order = torch.argsort(-remainder, stable=True)  # ties: the lower index first
        base[order[:short]] += 1
    return base


def redistribute_steps(n_opt: Tensor, baseline_steps: Tensor) -> Tensor:
    """E_k = N·E_const·n_k / Σ_i n_i (§5), rounded so that Σ E_k = Σ baseline steps (= N·E_const) exactly.

    `baseline_steps` are the steps the base strategy would give each client (E_const each in the paper). When
    every n_k is 0 (all gradients vanish), the baseline steps are kept.
    """
    total = int(baseline_steps.sum())
    weight = n_opt.double().clamp_min(0)
    if float(weight.sum()) <= 0:
        return baseline_steps.clone()
    return round_preserving_total(total * weight / weight.sum(), total)


def proportional_steps(n_opt: Tensor, baseline_steps: Tensor, max_steps: int = 0, min_steps: int = 0) -> Tensor:
    """E_k = round(n_k · E_const) (Algorithm 1 with M = E_const; Appendix E's E_{k,r}), clamped to
    [`min_steps`, `max_steps`] for clients with n_k > 0 (Appendix E's E_min ≤ E_k ≤ E_max; 0: no bound) and 0
    for n_k = 0. The total is not kept."""
    steps = torch.round(n_opt.double() * baseline_steps.double()).long()
    if max_steps > 0:
        steps = steps.clamp(max=max_steps)
    return torch.where(n_opt > 0, steps.clamp(min=min_steps), 0)


def allocation_entropy(n_opt: Tensor) -> float:
    """H = −Σ_k p_k log p_k with p_k = n_k / Σ_i n_i (§5, Fig. 3), natural log; maximal (log N) for equal n_k."""
    w = n_opt.double().clamp_min(0)
    if float(w.sum()) <= 0:
        return float("nan")
    p = w / w.sum()
    p = p[p > 0]
    return float(-(p * p.log()).sum())


def client_gsnr(
    means: Tensor, variances: Tensor, weights: Tensor, batch: int, local_batch: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Everything from the uploaded statistics: (n₁^opt, r, Δ²) per client (float64 (m,) each); `local_batch`
    as in `gsnr_terms`."""
    g, v = global_statistics(means, variances, weights)
    big_l, big_m, big_n = gsnr_terms(means, variances, g, v, batch, local_batch)
    return optimal_steps(big_m, big_n), gsnr_ratio(big_l, big_m, big_n), min_distance(big_l, big_m, big_n)


def measure(
    ctx: ServerContext, global_params: Tensor, clients: Tensor, samples: int, round_: int
) -> tuple[Tensor, Tensor]:
    """g̃_k and diag Σ̃_k of `samples` per-sample gradients of each client at `global_params` (the engine's
    vectorised per-sample gradients, its "grad-stats" sample stream of round `round_`)."""
    return ctx.engine.gradient_statistics(global_params, clients, samples, round_)


def keep_rows(result: LocalResult, keep: Tensor) -> LocalResult:
    """The clients of `result` where `keep` is true."""
    return result.rows(keep)


@STRATEGIES.register
class GSNR(Wrapper):
    """FedGSNR on a base strategy: per-client steps E_k ∝ n₁^opt (Theorem 3.7, §5), zero-step clients left out.

    The statistics are measured in ``configure`` (before local training, at the received model, by calling the
    engine's per-sample gradient statistics); selection, local rule, aggregation and state are the base's.
    """

    name: ClassVar[str] = "gsnr"
    description: ClassVar[str] = "FedGSNR: local steps from the gradient signal-to-noise ratio, on any base strategy"
    base: str | dict[str, Any] = Field(
        "fedavg", validate_default=True, description="the strategy FedGSNR changes the local steps of"
    )
    samples: int = Field(0, ge=0, description="per-sample gradients per client for the statistics (0: batch size)")
    allocation: Literal["redistribute", "proportional"] = Field(
        "redistribute", description="E_k = N E_const n_k/Σn (§5) or round(n_k E_const) (Algorithm 1, App. E)"
    )
    batch: int = Field(0, ge=0, description="B in L, M, N of Theorem 3.7 (0: the local batch size)")
    max_steps: int = Field(0, ge=0, description="E_max with allocation=proportional (0: none)")
    min_steps: int = Field(0, ge=0, description="E_min for clients with n_opt > 0 with allocation=proportional")
    weighting: Literal["samples", "uniform"] = Field("samples", description="p_k in eqs. (8)–(9)")
    client_batch: Literal["actual", "configured"] = Field(
        "actual", description="b_k in M_k, N_k: min(B, n_k), the client's own mini-batch (actual), or B for all"
    )

    _last: dict[str, Tensor] = PrivateAttr(default_factory=dict)

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        self._last = {}

    def derived(self) -> dict[str, Any]:
        batch = self.ctx.local.batch_size
        out: dict[str, Any] = {key: batch for key in ("samples", "batch") if not getattr(self, key)}
        base = self.inner.derived()
        return {**out, "base": base} if base else out

    def allocate(self, n_opt: Tensor, baseline_steps: Tensor) -> Tensor:
        """The local steps of the cohort from n₁^opt and the base's steps."""
        if self.allocation == "redistribute":
            return redistribute_steps(n_opt, baseline_steps)
        return proportional_steps(n_opt, baseline_steps, self.max_steps, self.min_steps)

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        plan = self.inner.configure(round_, clients, global_params)
        samples = self.samples or plan.batch_size
        means, variances = measure(self.ctx, global_params, clients, samples, round_)
        sizes = self.ctx.train_sizes[clients]
        weights = fedavg_weights(sizes, self.weighting)
        batch = self.batch or plan.batch_size
        local_batch = sizes.clamp(min=1, max=batch) if self.client_batch == "actual" else None
        n_opt, r, _ = client_gsnr(means, variances, weights, batch, local_batch)
        plan.steps = self.allocate(n_opt, plan.steps).to(plan.steps.dtype)
        self._last = {"clients": clients, "n_opt": n_opt, "gsnr": r, "steps": plan.steps}
        return plan

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        keep = result.steps > 0
        if bool(keep.all()):
            return self.inner.aggregate(round_, global_params, result)
        if not bool(keep.any()):
            return global_params.clone()
        return self.inner.aggregate(round_, global_params, keep_rows(result, keep))

    def round_metrics(self) -> dict[str, float]:
        out = dict(self.inner.round_metrics())
        if self._last:
            n_opt, steps, r = self._last["n_opt"], self._last["steps"], self._last["gsnr"]
            out.update(
                {
                    "gsnr_entropy": allocation_entropy(n_opt),
                    "gsnr_entropy_max": math.log(len(n_opt)) if len(n_opt) else float("nan"),
                    "gsnr_mean": float(r.mean()),
                    "gsnr_nopt_mean": float(n_opt.mean()),
                    "gsnr_excluded": float((steps == 0).sum()),
                    "gsnr_steps_max": float(steps.max()),
                    "gsnr_steps_total": float(steps.sum()),
                }
            )
        return out

    def last_allocation(self) -> dict[str, Tensor]:
        """The latest round's clients, n₁^opt, GSNR r and steps (for plots and tests)."""
        return dict(self._last)

    def state_dict(self) -> dict[str, Any]:
        return {"base": self.inner.state_dict()}  # the wrapper has no server step (and no optimiser state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["base"])
