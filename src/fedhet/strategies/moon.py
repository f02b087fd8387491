"""MOON (Li, He, Song, CVPR 2021): model-contrastive local training, a data-space term of the local objective.

Each client adds μ ℓ_con to its loss, with (eq. 3)

    ℓ_con = −log( exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) )

where z, z_glob and z_prev are the representations of the same input under the model being trained, the received
global model and the client's previous local model, and sim is cosine similarity. MOON takes z from a projection
head before the classifier; this term, which works with any model, takes the model's outputs (logits) as the
representation. The client keeps its previous local model as client state (the received model the first time,
when the term is 0 in value and gradient). The term needs autograd: it runs on the sequential and vectorised
backends, and `backend: dense` refuses it.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from fedhet.engine.objective import TERMS, DataTerm, ModelView
from fedhet.engine.plan import LocalPlan
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.fedavg import FedAvg


@TERMS.register
class ModelContrastive(DataTerm):
    """μ ℓ_con of MOON (eq. 3) on the model's outputs."""

    name: ClassVar[str] = "moon"
    description: ClassVar[str] = "MOON's model-contrastive term on the outputs (Li et al. 2021)"
    client_state: ClassVar[tuple[str, ...]] = ("previous",)
    mu: float = Field(1.0, ge=0, description="weight μ of the contrastive term")
    temperature: float = Field(0.5, gt=0, description="temperature τ")

    def initial_state(self, name: str, start: Tensor) -> Tensor:
        return start.clone()

    def update_state(self, name: str, old: Tensor, start: Tensor, final: Tensor, steps: Tensor, lr: Tensor) -> Tensor:
        return final.clone()

    def loss(self, view: ModelView) -> Tensor:
        with torch.no_grad():
            z_glob = view.forward(view.start, view.x)
            z_prev = view.forward(view.client["previous"], view.x)
        positive = F.cosine_similarity(view.logits, z_glob, dim=-1) / self.temperature
        negative = F.cosine_similarity(view.logits, z_prev, dim=-1) / self.temperature
        per_sample = torch.logsumexp(torch.stack([positive, negative]), 0) - positive
        return self.mu * view.mean(per_sample)


@STRATEGIES.register
class Moon(FedAvg):
    """FedAvg whose clients train with MOON's model-contrastive term."""

    name: ClassVar[str] = "moon"
    description: ClassVar[str] = "MOON: FedAvg with a model-contrastive local term (Li et al. 2021)"
    mu: float = Field(1.0, ge=0, description="weight μ of the contrastive term")
    temperature: float = Field(0.5, gt=0, description="temperature τ")

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        term = ModelContrastive(mu=self.mu, temperature=self.temperature)
        return super().configure(round_, clients, global_params).with_terms(term)
