"""model: architectures: the spec's checks, and members that share a representation dimension and a head shape."""

from __future__ import annotations

import pytest
import torch

from fedhet.catalog import MODELS
from fedhet.errors import ConfigError
from fedhet.models.architectures import Architectures, Composite


def build(**spec: object) -> Architectures:
    return MODELS.build({"name": "architectures", **spec}, where="model")  # type: ignore[return-value]


def test_members_share_the_representation_and_head_shapes() -> None:
    spec = build(
        members=[{"name": "mlp", "hidden": [7]}, {"name": "cnn_mnist", "channels": [2, 3], "hidden": 5}], dim=6
    )
    module = spec.build((1, 8, 8), 4)
    assert isinstance(module, Composite) and len(module.members) == 2
    x = torch.randn(5, 64)
    for member in module.members:
        assert member(x).shape == (5, 4)
        z = member(x, representation=True)
        assert z.shape == (5, 6) and bool((z >= 0).all())  # ReLU(g(x))
        assert member.head.weight.shape == (4, 6)
    torch.testing.assert_close(module(x), (module.members[0](x) + module.members[1](x)) / 2)
    assert build(**spec.model_dump()).model_dump() == spec.model_dump()  # the resolved spec rebuilds it


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"members": []}, "model.members"),
        ({"members": [{"name": "nope"}]}, "nope"),
        ({"members": [{"name": "architectures", "members": [{"name": "mlp"}]}]}, "cannot itself be"),
        ({"members": [{"name": "mlp"}], "proportions": [1, 2]}, "one share"),
        ({"members": [{"name": "mlp"}], "levels": [2.0]}, "one capacity level"),
        ({"members": [{"name": "mlp"}], "dim": 0}, "model.dim"),
        ({"members": [{"name": "mlp"}], "assignment": "dynamic"}, "model.assignment"),
    ],
)
def test_bad_specs_are_refused_in_one_line(spec: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as err:
        build(**spec)
    assert "\n" not in str(err.value)
