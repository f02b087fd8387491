"""Flower's SuperLink with each API's middleware kept to its own API: ``python -m fedhet.flower.superlink ARGS``.

A Flower 1.42 SuperLink serves its Control, Fleet and runtime HTTP APIs from one FastAPI app, and every request
passes through eight Starlette ``BaseHTTPMiddleware`` layers, each of which costs a task group and a pair of memory
streams per request whether it does anything or not. Four of them act on Control API paths (``/v1/control/``)
only and two on Fleet API paths (``/v1/fleet/``) only; on every other path their first step is to hand the request
to the next layer. A deployment round is a few hundred Fleet and runtime requests (polls, pushes and pulls of each
message's objects), so those idle layers made about a fifth of a MaxFL demo round (docs/flower.md).

This runs Flower's own ``flower-superlink`` (same arguments, same app, same middleware in the same order) with each
of those six layers entered only for the paths of its own API; a request on any other path goes straight to the
next layer, which is what the skipped layer would have done. The scopes rest on the code of the flwr release the
``flower`` extra pins, so the launcher checks that release and the layers it expects before it starts, and says
in one line what differs otherwise.
"""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Any

from fedhet.errors import ConfigError
from fedhet.flower import require_flwr_release

CONTROL, FLEET = "/v1/control/", "/v1/fleet/"
SCOPES = {  # Flower's middleware -> the only paths it acts on (its own first test of the request's path)
    "ControlSensitiveResponseMiddleware": CONTROL,
    "ControlAuthenticationMiddleware": CONTROL,
    "ControlLicenseMiddleware": CONTROL,
    "ControlEventLogMiddleware": CONTROL,
    "NodeAuthMiddleware": FLEET,
    "FleetEventLogMiddleware": FLEET,
}


class Scoped:
    """ASGI middleware: HTTP requests under `prefix` go through `middleware`, every other request to `app` itself."""

    def __init__(self, app: Any, middleware: type, prefix: str, *args: Any, **kwargs: Any) -> None:
        from starlette.datastructures import URL

        self.app, self.prefix, self._url = app, prefix, URL
        self.inner = middleware(app, *args, **kwargs)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self._url(scope=scope).path.startswith(self.prefix):
            await self.app(scope, receive, send)  # the layer would only have called the next one
        else:
            await self.inner(scope, receive, send)


def scope_middleware(stack: list[Any]) -> list[Any]:
    """Flower's middleware list with each layer of `SCOPES` wrapped in `Scoped`, in the same order."""
    from starlette.middleware import Middleware

    out = []
    for layer in stack:
        prefix = SCOPES.get(layer.cls.__name__)
        out.append(Middleware(Scoped, layer.cls, prefix, *layer.args, **layer.kwargs) if prefix else layer)
    return out


def check_flower() -> None:
    """Stop with one line unless flwr is the pinned release whose middleware `SCOPES` describes."""
    hint = "or start Flower's own flower-superlink"
    require_flwr_release("SuperLink launcher knows the middleware", hint)
    from flwr.superlink import main
    from flwr.superlink.routers.control.middlewares import CONTROL_SENSITIVE_ROUTE_KEYS

    names = {layer.cls.__name__ for layer in main._get_middleware()}
    sensitive = {path for _, path in CONTROL_SENSITIVE_ROUTE_KEYS}
    if not set(SCOPES) <= names or not all(path.startswith(CONTROL) for path in sensitive):
        version = importlib.metadata.version("flwr")
        raise ConfigError(f"this flwr {version} has other SuperLink middleware than fedhet expects; {hint}")


def scope_superlink() -> None:
    """Make the SuperLink app that ``flwr.superlink.main.create_app`` builds use `scope_middleware`."""
    check_flower()
    from flwr.superlink import main

    flowers = main._get_middleware
    main._get_middleware = lambda: scope_middleware(flowers())  # type: ignore[attr-defined,unused-ignore]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[0])
        print("Every argument goes to flower-superlink; its own help follows.\n")
    try:
        scope_superlink()
    except ConfigError as error:
        sys.exit(f"error: {error}")
    from flwr.superlink.cli import flower_superlink

    sys.argv = ["flower-superlink", *args]
    flower_superlink()


if __name__ == "__main__":
    main()
