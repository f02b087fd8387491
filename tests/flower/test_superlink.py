"""fedhet's launcher of Flower's SuperLink (`python -m fedhet.flower.superlink`): each API's middleware is entered
only for that API's paths, and the SuperLink answers every request as Flower's own does. (Whole deployments through
it give the native numbers: tests/flower/test_worker.py and test_deployment.py start their SuperLink with it.)"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from flwr.superlink import main as flower_main
from flwr.superlink.routers.control.middlewares import CONTROL_SENSITIVE_ROUTE_KEYS
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware

from fedhet.errors import ConfigError
from fedhet.flower import superlink

PATHS = ["/v1/control/start-run", "/v1/control/list-runs", "/v1/fleet/pull-messages", "/v1/fleet/push-messages"]
PATHS += ["/v1/runtime/pull-messages", "/v1/fleet/no-such-route", "/health"]
PATHS += sorted({path for _, path in CONTROL_SENSITIVE_ROUTE_KEYS})  # answered with no-cache headers
BODIES = [(b"", "application/protobuf"), (b"\x08\x01", "application/protobuf"), (b"{}", "application/json")]


def test_a_scoped_layer_sees_its_own_paths_only() -> None:
    seen: list[str] = []

    async def record(request: Any, call_next: Any) -> Any:
        seen.append(request.url.path)
        response = await call_next(request)
        response.headers["x-layer"] = "ran"
        return response

    app = FastAPI(middleware=[Middleware(superlink.Scoped, BaseHTTPMiddleware, "/v1/control/", dispatch=record)])

    @app.get("/{path:path}")
    def echo(path: str) -> dict[str, str]:
        return {"path": path}

    with TestClient(app) as client:
        inside, outside = client.get("/v1/control/a"), client.get("/v1/fleet/b")
    assert seen == ["/v1/control/a"]
    assert inside.json() == {"path": "v1/control/a"} and inside.headers["x-layer"] == "ran"
    assert outside.json() == {"path": "v1/fleet/b"} and "x-layer" not in outside.headers


def test_flowers_middleware_stays_in_its_order_with_six_layers_scoped() -> None:
    flowers = flower_main._get_middleware()
    scoped = superlink.scope_middleware(flowers)
    assert len(scoped) == len(flowers)
    for theirs, ours in zip(flowers, scoped, strict=True):
        prefix = superlink.SCOPES.get(theirs.cls.__name__)
        if prefix is None:
            assert ours is theirs
        else:
            assert ours.cls is superlink.Scoped and ours.args[:2] == (theirs.cls, prefix)
    assert sum(layer.cls is superlink.Scoped for layer in scoped) == 6


@pytest.fixture
def original_middleware(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(flower_main, "_get_middleware", flower_main._get_middleware)  # restored after the test
    yield


def answers() -> list[tuple[str, str, int, str | None, str | None, bytes]]:
    """Every (path, body) answer of a SuperLink app built now: status, type, caching header, and the body of errors
    (a successful answer can hold the time)."""
    out = []
    with TestClient(flower_main.create_app()) as client:
        for path in PATHS:
            for body, kind in BODIES:
                reply = client.post(path, content=body, headers={"content-type": kind})
                error = reply.content if reply.status_code >= 400 else b""
                headers = reply.headers.get("content-type"), reply.headers.get("cache-control")
                out.append((path, kind, reply.status_code, *headers, error))
    return out


def test_the_scoped_superlink_answers_every_request_as_flowers_does(original_middleware: None) -> None:
    flowers = answers()
    superlink.scope_superlink()
    ours = answers()
    assert ours == flowers
    assert {status for _, _, status, *_ in ours} >= {200, 401, 404, 415}  # the cases reach handlers and checks


def test_the_launcher_refuses_another_flower_release(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.43.0" if name == "flwr" else real(name))
    with pytest.raises(ConfigError, match=r"flwr 1\.42\.x, but flwr 1\.43\.0 is installed"):
        superlink.check_flower()


def test_the_launcher_passes_its_arguments_to_flower() -> None:
    command = [sys.executable, "-m", "fedhet.flower.superlink"]
    help_ = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120)
    assert help_.returncode == 0 and "usage: flower-superlink" in help_.stdout
    bad = subprocess.run([*command, "--not-a-flower-option"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--not-a-flower-option" in bad.stderr
