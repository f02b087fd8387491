"""Images by domain (``image_domains``: root/<domain>/<class>/*.png) and the ``domain`` shift: each client's data
from one domain, group = domain, composed with the run's label partition."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhet.datasets import load
from fedhet.errors import ConfigError, DataError
from fedhet.experiments.build import components, federated_data
from fedhet.experiments.config import parse_config
from helpers.domains import DOMAINS, write_domains


def test_domains_are_users_and_classes_are_shared_by_name(tmp_path: Path) -> None:
    data = load(
        {"name": "image_domains", "path": str(write_domains(tmp_path / "d")), "normalize": False, "grayscale": True}
    )
    assert data.user_names == ("cartoon", "photo", "sketch") and data.num_classes == 3  # bird, cat, dog
    assert data.users is not None and torch.bincount(data.users).tolist() == [12, 12, 18]
    assert data.x.shape == (42, 1, 4, 4)
    greys = {round(float(x[0, 3, 3]) * 255) for x in data.x[data.users == 1]}
    assert greys == {200}  # photo
    sketch = data.y[data.users == 2]
    assert torch.bincount(sketch).tolist() == [6, 6, 6]  # bird, cat and dog in the sketches
    assert set(data.y[data.users == 0].tolist()) == {1, 2}  # cat = 1 and dog = 2 in every domain


def test_the_domain_shift_gives_each_client_one_domain_under_any_partition(tmp_path: Path) -> None:
    root = write_domains(tmp_path / "d", per_class=10)
    for partition in ("iid", {"name": "dirichlet", "alpha": 0.5}):
        config = parse_config(
            {
                "dataset": {"name": "image_domains", "path": str(root), "normalize": False, "grayscale": True},
                "partition": partition,
                "num_clients": 6,
                "shift": {"name": "domain", "assign": "random"},
            }
        )
        data = federated_data(config, components(config))
        groups = data.info["group"]
        assert sorted(groups.tolist()) == [0, 0, 1, 1, 2, 2]  # three domains, two clients each
        for k in range(6):
            x, _ = data.train.client(k)
            grey = {round(float(v) * 255) for v in x[:, 0, 3, 3]}
            assert grey == {DOMAINS[("cartoon", "photo", "sketch")[int(groups[k])]]}  # its group's domain only
        assert int(data.train.sizes.sum() + data.test.sizes.sum()) == 70  # every sample once (20 + 20 + 30)


def test_domain_refusals_are_one_line(tmp_path: Path) -> None:
    root = write_domains(tmp_path / "d")
    with pytest.raises(DataError, match="not the dataset's 3 domains"):
        config = parse_config(
            {"dataset": {"name": "image_domains", "path": str(root)}, "num_clients": 3, "shift": "domain"}
        )
        config = parse_config({**config.model_dump(), "shift": {"name": "domain", "groups": 2}})
        federated_data(config, components(config))
    with pytest.raises(ConfigError, match="leave user_pattern out"):
        components(parse_config({"dataset": {"name": "image_domains", "path": str(root), "user_pattern": "x"}}))
    (tmp_path / "one" / "only").mkdir(parents=True)
    with pytest.raises(DataError, match="1 domain subfolder"):
        load({"name": "image_domains", "path": str(tmp_path / "one")})
