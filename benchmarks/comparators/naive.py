"""The naive reference: FedAvg written the way typical research code is (a deepcopy of the model, a new
DataLoader and `torch.optim.SGD` per client per round, client-by-client evaluation of the test and train data
through DataLoaders, as fedhet's rounds evaluate them). Used only as a comparator in benchmarks; the plain
loop (`fedhet.bench.plain`) is the fair one."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from fedhet.bench.systems import System, build_module
from fedhet.bench.workloads import Workload
from fedhet.data.dataset import FederatedData


def naive_train(
    model: nn.Module, data: FederatedData, clients: Tensor, steps: int, lr: float, batch_size: int
) -> tuple[list[dict[str, Tensor]], list[int]]:
    """Local SGD per client on a deep copy of `model`: the local state dicts and the clients' sizes."""
    states, sizes = [], []
    for k in clients.tolist():
        local = copy.deepcopy(model)
        x, y = data.train.client(k)
        loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)
        opt = torch.optim.SGD(local.parameters(), lr=lr)
        done = 0
        while done < steps:
            for xb, yb in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(local(xb), yb).backward()
                opt.step()
                done += 1
                if done == steps:
                    break
        states.append(local.state_dict())
        sizes.append(len(y))
    return states, sizes


def naive_finish(
    model: nn.Module, data: FederatedData, trained: tuple[list[dict[str, Tensor]], list[int]], eval_clients: Tensor
) -> None:
    """The sample-weighted average of the local states becomes `model`; every client's test and train loss and
    accuracy, client by client."""
    states, sizes = trained
    total = float(sum(sizes))
    averaged = {key: sum(s[key] * (n / total) for s, n in zip(states, sizes, strict=True)) for key in states[0]}
    model.load_state_dict(averaged)
    model.eval()
    with torch.no_grad():  # every client's test and train loss and accuracy, as fedhet's rounds report them
        for k in eval_clients.tolist():
            for split in (data.test, data.train):
                loss, correct = 0.0, 0
                for xb, yb in DataLoader(TensorDataset(*split.client(k)), batch_size=256):
                    out = model(xb)
                    loss += float(nn.functional.cross_entropy(out, yb, reduction="sum"))
                    correct += int((out.argmax(1) == yb).sum())
    model.train()


def naive_round(
    model: nn.Module, data: FederatedData, clients: Tensor, steps: int, lr: float, batch_size: int, eval_clients: Tensor
) -> None:
    """One FedAvg round: local SGD per client on a deep copy, sample-weighted average, then evaluation."""
    naive_finish(model, data, naive_train(model, data, clients, steps, lr, batch_size), eval_clients)


def naive_system(w: Workload, data: FederatedData) -> System:
    """The naive reference as a system of `fedhet.bench` (timed interleaved with fedhet's backends)."""
    model = build_module(w)
    clients, everyone = torch.arange(w.clients), torch.arange(w.clients + w.eval_only)

    def train(_: int) -> tuple[list[dict[str, Tensor]], list[int]]:
        return naive_train(model, data, clients, w.steps, w.lr, w.batch)

    def finish(trained: tuple[list[dict[str, Tensor]], list[int]]) -> None:
        naive_finish(model, data, trained, everyone)

    return System("naive reference", train, finish, "deepcopy, DataLoader and optimiser per client")
