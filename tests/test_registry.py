"""The component registry: building a component from its config."""

from __future__ import annotations

import sys
from typing import Any, ClassVar

import pytest

from fedhet.errors import ConfigError
from fedhet.registry import Component, Registry


def test_a_component_that_calls_sys_exit_while_built_is_a_config_error() -> None:
    """sys.exit() in a plugin's constructor must not end fedhet as a success: it is one line naming the component."""
    things: Registry[Any] = Registry("thing")

    @things.register
    class Quitter(Component):
        name: ClassVar[str] = "quitter"

        def model_post_init(self, context: Any) -> None:
            sys.exit(0)

    with pytest.raises(ConfigError, match="building thing 'quitter' failed: SystemExit: 0"):
        things.build("quitter")
