"""The Flower comparator: a bench workload written the way a typical Flower user writes it (Flower's
"Get started" tutorial: a `NumPyClient` with a torch model and DataLoaders, `ClientApp(client_fn=...)`, the
built-in `FedAvg` strategy and `run_simulation`), run in Flower's Simulation Runtime (Ray actors).

Each round: `clients` nodes train `steps` SGD steps of `batch` samples, FedAvg aggregates, and every node
(seen and unseen) evaluates the new model on its train and test data, as the fedhet rounds do. Flower samples
the training nodes at random among all nodes (the same amount of work as training the seen clients). The
time of a round is the time between the ends of two consecutive federated evaluations, as measured by the
strategy, split at the end of the round's fit aggregation into training and the rest (aggregation and
evaluation); the first round (actors starting) is dropped. Only used when `flwr` is importable.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from typing import Any

import numpy as np

from fedhet.bench.workloads import Workload
from fedhet.data.dataset import FederatedData


def flower_available() -> bool:
    """Whether Flower's simulation (flwr with its Ray extra) can be imported."""
    return importlib.util.find_spec("flwr") is not None and importlib.util.find_spec("ray") is not None


def flower_round_times(
    w: Workload, data: FederatedData, rounds: int = 4, cpus_per_node: float = 1.0
) -> tuple[list[float], list[float], list[float]]:
    """Seconds of each round of `w` in Flower's simulation after the first (which starts the actors): whole
    rounds, their training parts and the rest."""
    for key, value in (
        ("FLWR_TELEMETRY_ENABLED", "0"),
        ("RAY_USAGE_STATS_ENABLED", "0"),
        ("RAY_DEDUP_LOGS", "0"),
        ("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0"),
    ):
        os.environ.setdefault(key, value)
    import torch
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import Context, ndarrays_to_parameters
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from fedhet.catalog import MODELS

    def make_net() -> nn.Module:
        torch.manual_seed(0)
        return MODELS.build(w.model).build(w.input_shape, w.num_classes)

    def get_weights(net: nn.Module) -> list[np.ndarray]:
        return [v.cpu().numpy() for v in net.state_dict().values()]

    def set_weights(net: nn.Module, weights: list[np.ndarray]) -> None:
        state = {k: torch.tensor(v) for k, v in zip(net.state_dict().keys(), weights, strict=True)}
        net.load_state_dict(state, strict=True)

    def test(net: nn.Module, loader: DataLoader) -> tuple[float, float]:
        loss, correct, seen = 0.0, 0, 0
        with torch.no_grad():
            for xb, yb in loader:
                out = net(xb)
                loss += float(nn.functional.cross_entropy(out, yb, reduction="sum"))
                correct += int((out.argmax(1) == yb).sum())
                seen += len(yb)
        return loss / max(seen, 1), correct / max(seen, 1)

    class BenchClient(NumPyClient):  # type: ignore[misc,unused-ignore]  # flwr may be untyped
        def __init__(self, k: int) -> None:
            self.net = make_net()
            self.samples = len(data.train.client(k)[1])
            self.train = DataLoader(TensorDataset(*data.train.client(k)), batch_size=w.batch, shuffle=True)
            self.test_samples = len(data.test.client(k)[1])
            self.test = DataLoader(TensorDataset(*data.test.client(k)), batch_size=256)
            self.train_eval = DataLoader(TensorDataset(*data.train.client(k)), batch_size=256)

        def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict]:
            set_weights(self.net, parameters)
            opt = torch.optim.SGD(self.net.parameters(), lr=w.lr)
            self.net.train()
            done = 0
            while done < w.steps:
                for xb, yb in self.train:
                    opt.zero_grad()
                    nn.functional.cross_entropy(self.net(xb), yb).backward()
                    opt.step()
                    done += 1
                    if done == w.steps:
                        break
            return get_weights(self.net), self.samples, {}

        def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[float, int, dict]:
            set_weights(self.net, parameters)
            self.net.eval()
            loss, accuracy = test(self.net, self.test)
            train_loss, train_accuracy = test(self.net, self.train_eval)
            metrics = {"accuracy": accuracy, "train_loss": train_loss, "train_accuracy": train_accuracy}
            return loss, self.test_samples, metrics

    def client_fn(context: Context) -> Any:
        return BenchClient(int(context.node_config["partition-id"])).to_client()

    total = w.clients + w.eval_only
    ends: list[float] = []
    fitted: list[float] = []

    class TimedFedAvg(FedAvg):  # type: ignore[misc,unused-ignore]
        def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
            out = super().aggregate_fit(server_round, results, failures)
            fitted.append(time.perf_counter())
            return out

        def aggregate_evaluate(self, server_round: int, results: Any, failures: Any) -> Any:
            out = super().aggregate_evaluate(server_round, results, failures)
            ends.append(time.perf_counter())
            return out

    def server_fn(context: Context) -> Any:
        strategy = TimedFedAvg(
            fraction_fit=w.clients / total,
            fraction_evaluate=1.0,
            min_fit_clients=w.clients,
            min_evaluate_clients=total,
            min_available_clients=total,
            initial_parameters=ndarrays_to_parameters(get_weights(make_net())),
        )
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))

    logging.getLogger("flwr").setLevel(logging.WARNING)
    backend = {
        "client_resources": {"num_cpus": cpus_per_node, "num_gpus": 0.0},
        "init_args": {"include_dashboard": False, "logging_level": "error", "log_to_driver": False},
    }
    run_simulation(
        server_app=ServerApp(server_fn=server_fn),
        client_app=ClientApp(client_fn=client_fn),
        num_supernodes=total,
        backend_config=backend,
    )
    if len(ends) < 2 or len(fitted) != len(ends):
        raise RuntimeError(f"the Flower simulation finished {len(ends)} of {rounds} rounds; see its log above")
    whole = np.diff(ends).tolist()
    train = [f - e for f, e in zip(fitted[1:], ends[:-1], strict=True)]
    rest = [e - f for e, f in zip(ends[1:], fitted[1:], strict=True)]
    return whole, train, rest
