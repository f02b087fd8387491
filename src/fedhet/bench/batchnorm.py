"""What batch norm costs in the engine: a FedAvg round of a ResNet-8 with batch norm (its running statistics
carried as model state and averaged) on ``backend: auto``, against the same round written as a plain per-client
PyTorch loop (one module, `torch.optim.SGD`, `state_dict` averaging), on the same mini-batches, timed in turns
(`python -m fedhet.bench.batchnorm` with one torch thread)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fedhet.bench.pairs import CostRow, in_turns, print_rows, round_runners, workload_engine
from fedhet.bench.run import matmul_flop_rate
from fedhet.bench.workloads import Workload
from fedhet.catalog import MODELS
from fedhet.engine.batches import local_batches
from fedhet.engine.engine import Engine
from fedhet.engine.functional import state_dict_of
from fedhet.models.flops import parameter_flops
from fedhet.strategies.base import ServerContext
from fedhet.strategies.fedavg import FedAvg

RESNET = Workload(
    "resnet8",
    "ResNet-8 (BatchNorm2d) on 3×32×32 images, 8 clients × 4 steps of 16",
    {"name": "resnet8"},
    (3, 32, 32),
    clients=8,
    samples=32,
    steps=4,
    batch=16,
    lr=0.05,
)
GOAL = 1.5  # the engine's round may cost at most this many times the plain loop's


class PlainLoop:
    """A FedAvg round as a plain PyTorch script writes it: for each client, the global state dict loaded into one
    module, `steps` SGD steps on the client's mini-batches (the engine's), its state dict kept; then the state
    dicts averaged by sample count (``num_batches_tracked`` rounded)."""

    def __init__(self, engine: Engine, workload: Workload) -> None:
        self.module: nn.Module = MODELS.build(workload.model).build(workload.input_shape, workload.num_classes)
        self.global_state = state_dict_of(engine.model, engine.initial_params())  # the engine's initial model
        self.data = engine.data.train
        self.workload = workload
        clients = torch.arange(workload.clients)
        steps = torch.full((workload.clients,), workload.steps)
        self.index, _ = local_batches(self.data.offsets, clients, steps, workload.batch, engine.seed, 1)

    def round(self) -> dict[str, Tensor]:
        module, data = self.module, self.data
        module.train()
        sizes = self.data.sizes[: self.workload.clients].double()
        weights = sizes / sizes.sum()
        total: dict[str, Tensor] = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in self.global_state.items()}
        for k in range(self.workload.clients):
            module.load_state_dict(self.global_state)
            opt = torch.optim.SGD(module.parameters(), lr=self.workload.lr)
            for t in range(self.workload.steps):
                rows = self.index[k, t]
                loss = nn.functional.cross_entropy(module(data.x[rows]), data.y[rows])
                opt.zero_grad()
                loss.backward()
                opt.step()
            for name, value in module.state_dict().items():
                total[name] += weights[k] * value.double()
        module.eval()
        return {n: v.round().long() if n.endswith("num_batches_tracked") else v.float() for n, v in total.items()}


def resnet_round(reps: int = 3, backend: str = "auto") -> CostRow:
    """A ResNet-8 FedAvg round on the engine (`backend`) against the plain per-client loop."""
    engine = workload_engine(RESNET, backend)
    clients = torch.arange(RESNET.clients)
    strategy = FedAvg()
    strategy.setup(ServerContext(engine, engine.local, 0, RESNET.clients))
    (fedhet_round,) = round_runners([strategy], engine, clients)
    chosen = engine.backend_for(RESNET.clients)
    plain = PlainLoop(engine, RESNET)
    engine_s, plain_s = in_turns(fedhet_round, plain.round, reps)
    name = f"ResNet-8 round with batch norm ({backend}: {chosen})"
    return CostRow(name, "plain PyTorch loop", engine_s, plain_s, GOAL)


def matmul_limit_s(workload: Workload = RESNET) -> float:
    """The machine's limit for the round: its training FLOPs (3× the forward pass's, `fedhet.models.flops`, for
    every sample of every step) at the rate of a large float32 matrix product, a lower bound on any loop's time."""
    module = MODELS.build(workload.model).build(workload.input_shape, workload.num_classes)
    forward = float(parameter_flops(module, workload.input_shape).sum())
    samples = workload.clients * workload.steps * workload.batch
    return 3 * forward * samples / matmul_flop_rate()


def main() -> None:  # pragma: no cover - a measurement, run by hand
    torch.set_num_threads(1)
    print_rows([resnet_round()], "no goal")
    print(f"the machine's limit for this round: {1e3 * matmul_limit_s():.0f} ms (its FLOPs at a 2048² product's rate)")


if __name__ == "__main__":  # pragma: no cover
    main()
