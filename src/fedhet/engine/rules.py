"""Local update rules other than plain SGD, for personalisation baselines (Per-FedAvg, pFedMe).

A rule is one pure function of a client's parameters and ``batches_per_step`` mini-batches, run for the whole
cohort under `vmap` whichever backend is chosen (so both give the same numbers). ``grad_fn(w, i)``
returns the gradient (plus the plan's L2 penalty λw) and the loss of the i-th mini-batch of the step at ``w``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

Tree = dict[str, Tensor]
GradFn = Callable[[Tree, int], tuple[Tree, Tensor]]


def _axpy(w: Tree, scale: float | Tensor, d: Tree) -> Tree:
    """w + scale · d, leaf by leaf."""
    return {n: w[n] + scale * d[n] for n in w}


@dataclass(frozen=True)
class PerFedAvgRule:
    """Per-FedAvg's local step (Fallah, Mokhtari, Ozdaglar 2020, Algorithm 1 with eqs. 8–10).

        w̃ = w − α ∇f(w; D)                         (personalisation step, batch D)
        FO: w ← w − β ∇f(w̃; D')                     (first-order MAML, batch D')
        HF: w ← w − β (∇f(w̃; D') − α d),  d = [∇f(w + δv; D'') − ∇f(w − δv; D'')] / 2δ,  v = ∇f(w̃; D')

    β is the plan's local learning rate; HF replaces the Hessian-vector product ∇²f(w; D'')v by a finite difference.
    """

    alpha: float
    hessian_free: bool = False
    delta: float = 1e-3

    @property
    def batches_per_step(self) -> int:
        return 3 if self.hessian_free else 2

    def step(self, grad_fn: GradFn, w: Tree, lr: Tensor) -> tuple[Tree, Tensor]:
        g, loss = grad_fn(w, 0)
        v, _ = grad_fn(_axpy(w, -self.alpha, g), 1)
        if self.hessian_free:
            plus, _ = grad_fn(_axpy(w, self.delta, v), 2)
            minus, _ = grad_fn(_axpy(w, -self.delta, v), 2)
            v = {n: v[n] - self.alpha * (plus[n] - minus[n]) / (2 * self.delta) for n in v}
        return _axpy(w, -lr, v), loss


@dataclass(frozen=True)
class PFedMeRule:
    """pFedMe's local step (Dinh, Tran, Nguyen 2020, Algorithm 1, eqs. 7–8) on one mini-batch D:

        θ̂ ≈ argmin_θ f(θ; D) + (λ/2)‖θ − w‖²   (K gradient steps of size `inner_lr` from θ = w)
        w ← w − η λ (w − θ̂)                     (η: the plan's local learning rate)

    θ starts from the current local model at every step (stateless clients; the authors' code warm-starts it
    from the previous step's θ̂).
    """

    lam: float
    inner_steps: int
    inner_lr: float

    @property
    def batches_per_step(self) -> int:
        return 1

    def step(self, grad_fn: GradFn, w: Tree, lr: Tensor) -> tuple[Tree, Tensor]:
        theta, loss = dict(w), None
        for _ in range(self.inner_steps):
            g, value = grad_fn(theta, 0)
            loss = value if loss is None else loss
            theta = {n: theta[n] - self.inner_lr * (g[n] + self.lam * (theta[n] - w[n])) for n in w}
        assert loss is not None
        return {n: w[n] - lr * self.lam * (w[n] - theta[n]) for n in w}, loss


LocalRule = PerFedAvgRule | PFedMeRule
