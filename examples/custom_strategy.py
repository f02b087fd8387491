"""A custom strategy from Python: weight each client's update by its local loss (worse-off clients count more).

Run: python examples/custom_strategy.py

A strategy is a registered component: its pydantic fields are its parameters (validated like any config
key), and it overrides the round's hooks (`select`, `configure`, `aggregate`). Here only `aggregate`.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

import fedhet
from fedhet.strategies.base import STRATEGIES, Strategy


@STRATEGIES.register
class LossWeighted(Strategy):
    """x ← x + η_g Σ_k p_k (x_k − x), p_k ∝ n_k · loss_k^q: q = 0 is FedAvg, larger q favours clients the model
    serves worst (in the spirit of q-FFL)."""

    name: ClassVar[str] = "loss_weighted"
    description: ClassVar[str] = "FedAvg with weights n_k * loss_k^q (example of a custom strategy)"
    q: float = Field(1.0, ge=0, description="how strongly high-loss clients are favoured")

    def aggregate(self, round_, global_params, result):  # type: ignore[no-untyped-def]
        sizes = self.ctx.train_sizes[result.clients].double()
        weights = sizes * result.train_loss.double().clamp_min(1e-12) ** self.q
        weights = (weights / weights.sum()).float()
        update = weights @ (result.params - global_params)
        return global_params + self.server_lr * update


def main() -> None:
    base = {
        "dataset": "digits",
        "partition": {"name": "dirichlet", "alpha": 0.1},  # strong label skew: some clients are served badly
        "model": {"name": "mlp", "hidden": [32]},
        "num_clients": 20,
        "clients_per_round": 10,
        "rounds": 10,
        "local": {"steps": 5, "lr": 0.05},
        "seed": 1,
    }
    # by name (as in YAML), by name with parameters, or as an object
    for algorithm in ("fedavg", {"name": "loss_weighted", "q": 2.0}, LossWeighted(q=5.0)):
        result = fedhet.run({**base, "algorithm": algorithm})
        final = result.final
        label = result.config["algorithm"]
        print(
            f"{label['name']:<14} q={label.get('q', 0):<4} mean accuracy {final['test_accuracy']:.3f}, "
            f"worst 10% of clients {final['test_accuracy_worst10']:.3f}"
        )


if __name__ == "__main__":
    main()
