"""FedAvg + fine-tuning: the global model of FedAvg, tuned by each client for a few local steps before use.

The personalised baseline of MaxFL §5 (Table 3: 5 steps) and of most personalised-FL papers: training is
FedAvg's; a client's personalised model is the global model after ``finetune_steps`` steps of local SGD on its
own training data (with the run's learning rate and batch size), scored by personalised evaluation. Any other
strategy gets the same with ``personal_eval.finetune_steps``.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from torch import Tensor

from fedhet.engine.plan import MAX_STEPS, LocalPlan
from fedhet.strategies.base import STRATEGIES, ServerContext
from fedhet.strategies.fedavg import FedAvg

FINETUNE_STREAM = "personal-eval"


@STRATEGIES.register
class FedAvgFineTuned(FedAvg):
    """FedAvg; each client's model is the global one after ``finetune_steps`` local SGD steps."""

    name: ClassVar[str] = "fedavg_ft"
    description: ClassVar[str] = "FedAvg whose global model each client fine-tunes for a few local steps"
    finetune_steps: int = Field(
        5, ge=1, le=MAX_STEPS, description="local SGD steps from the global model (MaxFL Table 3: 5)"
    )

    def setup(self, ctx: ServerContext) -> None:
        """Refuse fine-tuning whose mini-batches for every client at once would not fit in memory."""
        super().setup(ctx)
        ctx.check_steps("algorithm.finetune_steps", self.finetune_steps, ctx.num_clients)

    def personalization(self, clients: Tensor) -> LocalPlan:
        local = self.ctx.local
        return LocalPlan.uniform(clients, self.finetune_steps, local.lr, local.batch_size, stream=FINETUNE_STREAM)
