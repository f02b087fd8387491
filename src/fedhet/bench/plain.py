"""The honest references: FedAvg as the best simple code a researcher would write, without fedhet.

* `PlainLoop`: one `nn.Module`; each client's weights copied in (`vector_to_parameters`), manual SGD
  (``p -= lr * p.grad``) on mini-batches of a permutation drawn per epoch, no DataLoader, no optimiser, no
  model copies; the sample-weighted mean of the local models; evaluation with one forward pass over each
  client's test and train tensors.
* `VmapLoop`: the same round with `torch.func`: one `vmap(grad(loss))` step for the whole cohort over its
  stacked parameters, and evaluation with one forward pass over all the clients' data.

Both draw their mini-batches with torch's generator (epochs without replacement, batches of min(batch, n)
samples, as fedhet does); tests pass them fedhet's own mini-batches and check that they compute fedhet's
numbers. `VmapLoop` needs clients of equal sizes (as the bench's workloads have).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from fedhet.data.dataset import FederatedData


def draw_batches(sizes: list[int], steps: int, batch: int, gen: torch.Generator) -> list[Tensor]:
    """Per client, (steps, min(batch, n)) row indices into its own n samples: successive random permutations
    (the last n mod batch samples of each are left out, as fedhet does)."""
    out = []
    for n in sizes:
        b = min(batch, n)
        epochs = -(-steps // (n // b))
        order = torch.cat([torch.randperm(n, generator=gen)[: n - n % b] for _ in range(epochs)])
        out.append(order[: steps * b].view(steps, b))
    return out


class PlainLoop:
    """FedAvg client by client on one module (see the module docstring)."""

    def __init__(self, module: nn.Module, data: FederatedData, clients: int, steps: int, lr: float, batch: int) -> None:
        self.module, self.data = module, data
        self.params = list(module.parameters())
        self.clients, self.steps, self.lr, self.batch = clients, steps, lr, batch
        self.global_ = parameters_to_vector(self.params).detach().clone()
        self.train_parts = [data.train.client(k) for k in range(clients)]
        self.eval_parts = [(data.test.client(k), data.train.client(k)) for k in range(data.num_clients)]
        self.gen = torch.Generator().manual_seed(0)

    def train(self, batches: list[Tensor] | None = None) -> Tensor:
        """Every client's local model after its SGD steps (clients, P)."""
        sizes = [len(y) for _, y in self.train_parts]
        batches = batches if batches is not None else draw_batches(sizes, self.steps, self.batch, self.gen)
        local = torch.empty(self.clients, len(self.global_))
        self.module.train()
        for k, (x, y) in enumerate(self.train_parts):
            with torch.no_grad():  # the parameters become views of the copy (never of the global model)
                vector_to_parameters(self.global_.clone(), self.params)
            for rows in batches[k]:
                loss = F.cross_entropy(self.module(x[rows]), y[rows])
                for p in self.params:
                    p.grad = None
                loss.backward()
                with torch.no_grad():
                    for p in self.params:
                        p -= self.lr * p.grad  # type: ignore[operator,misc]
            local[k] = parameters_to_vector(self.params).detach()
        return local

    def scores(self, local: Tensor) -> list[tuple[float, float, float, float]]:
        """The sample-weighted mean becomes the global model; every client's test and train loss and accuracy."""
        sizes = torch.tensor([len(y) for _, y in self.train_parts], dtype=torch.float32)
        self.global_ = (local * (sizes / sizes.sum()).unsqueeze(1)).sum(0)
        scores = []
        self.module.eval()
        with torch.no_grad():
            vector_to_parameters(self.global_, self.params)
            for (xt, yt), (xs, ys) in self.eval_parts:
                out_t, out_s = self.module(xt), self.module(xs)
                scores.append(
                    (
                        float(F.cross_entropy(out_t, yt)),
                        float((out_t.argmax(1) == yt).float().mean()),
                        float(F.cross_entropy(out_s, ys)),
                        float((out_s.argmax(1) == ys).float().mean()),
                    )
                )
        return scores


class VmapLoop:
    """FedAvg with `torch.func.vmap` over the cohort's stacked parameters (see the module docstring)."""

    def __init__(self, module: nn.Module, data: FederatedData, clients: int, steps: int, lr: float, batch: int) -> None:
        self.module, self.data = module, data
        self.clients, self.steps, self.lr, self.batch = clients, steps, lr, batch
        self.global_ = {k: v.detach().clone() for k, v in module.named_parameters()}
        n = int(data.train.sizes[0])
        self.x = data.train.x[: clients * n].view(clients, n, *data.train.x.shape[1:])
        self.y = data.train.y[: clients * n].view(clients, n)
        self.gen = torch.Generator().manual_seed(0)

        def loss(p: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
            return F.cross_entropy(functional_call(module, p, (x,)), y)

        self.step = vmap(grad(loss), randomness="different")

    def train(self, batches: Tensor | None = None) -> dict[str, Tensor]:
        """The cohort's local models as stacked parameters {name: (clients, *shape)}."""
        m, n = self.y.shape
        if batches is None:
            b = min(self.batch, n)
            epochs = -(-self.steps // (n // b))
            order = torch.rand(m, epochs, n, generator=self.gen).argsort(2)[:, :, : n - n % b].reshape(m, -1)
            batches = order[:, : self.steps * b].view(m, self.steps, b)
        who = torch.arange(m).unsqueeze(1)
        p = {k: v.expand(m, *v.shape).clone() for k, v in self.global_.items()}
        self.module.train()
        for t in range(self.steps):
            rows = batches[:, t]
            g = self.step(p, self.x[who, rows], self.y[who, rows])
            p = {k: v - self.lr * g[k] for k, v in p.items()}
        return p

    def scores(self, local: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The mean of the local models (equal client sizes) becomes the global model; every client's test and
        train loss and accuracy from one forward pass per split."""
        self.global_ = {k: v.mean(0) for k, v in local.items()}
        self.module.eval()
        out = []
        with torch.no_grad():
            for split in (self.data.test, self.data.train):
                logits = functional_call(self.module, self.global_, (split.x,))
                losses = F.cross_entropy(logits, split.y, reduction="none")
                hits = (logits.argmax(1) == split.y).float()
                k = split.num_clients
                out += [losses.view(k, -1).mean(1), hits.view(k, -1).mean(1)]
        return out[0], out[1], out[2], out[3]
