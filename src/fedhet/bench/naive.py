"""The naive reference: FedAvg written the way typical research code is (a deepcopy of the model and a new
DataLoader per client per round, client-by-client evaluation of the test and train data, as fedhet's rounds
evaluate them). Used only as a comparator in benchmarks."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from fedhet.data.dataset import FederatedData


def naive_round(
    model: nn.Module, data: FederatedData, clients: Tensor, steps: int, lr: float, batch_size: int, eval_clients: Tensor
) -> None:
    """One FedAvg round: local SGD per client on a deep copy, sample-weighted average, then evaluation."""
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
