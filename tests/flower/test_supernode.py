"""fedhet's launcher of Flower's SuperNode (`python -m fedhet.flower.supernode`): its waits back off from 10 ms
instead of sleeping Flower's 3 s, on Flower's own SuperNode loop. (A whole deployment through it gives the native
numbers: tests/flower/test_worker.py, whose `process` isolation starts every node with it.)"""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest
from flwr.supernode import start_client_internal as loop

from fedhet.flower import supernode


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    waits: list[float] = []
    monkeypatch.setattr(supernode.time, "sleep", waits.append)
    return waits


def test_idle_polls_back_off_from_the_first_wait_to_the_cap(slept: list[float]) -> None:
    backoff = supernode.Backoff(first=0.01, cap=0.05)
    for _ in range(6):
        backoff.sleep(3)  # Flower's wait between two polls of the SuperLink
    assert slept == pytest.approx([0.01, 0.015, 0.0225, 0.03375, 0.05, 0.05])
    backoff.reset()  # a message came: the next idle wait is short again
    backoff.sleep(3)
    assert slept[-1] == pytest.approx(0.01)


def test_waits_for_the_local_reply_stay_short_and_leave_the_idle_backoff_alone(slept: list[float]) -> None:
    backoff = supernode.Backoff(first=0.01, cap=3.0)
    backoff.sleep(3)
    backoff.sleep(3)
    backoff.sleep(0.5)  # Flower's wait for the ClientApp's reply in the node's own state
    backoff.sleep(0.005)
    backoff.sleep(3)
    assert slept == pytest.approx([0.01, 0.015, 0.01, 0.005, 0.0225])
    assert backoff.monotonic is supernode.time.monotonic  # the rest of `time` is time's


def test_shorten_waits_patches_flowers_supernode_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("time", "_push_messages", "pull_objects"):
        monkeypatch.setattr(loop, name, getattr(loop, name))  # restored after the test
    calls: list[float] = []
    monkeypatch.setattr(loop, "_push_messages", lambda **kwargs: calls.append(loop.time.next))
    backoff = supernode.shorten_waits(first_s=0.02, cap_s=1.5)
    assert loop.time is backoff and backoff.cap == 1.5
    backoff.next = 0.7  # after some idle waits, a message came
    loop._push_messages()  # pushing its reply resets the idle backoff
    assert calls == [0.7] and backoff.next == 0.02
    assert isinstance(loop.pull_objects, functools.partial)
    assert loop.pull_objects.keywords == {"initial_backoff": 0.02, "backoff_cap": 1.5}


def test_the_launcher_checks_its_own_argument_and_passes_the_rest_to_flower() -> None:
    command = [sys.executable, "-m", "fedhet.flower.supernode"]
    bad = subprocess.run([*command, "--poll-max", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--poll-max must be a positive number of seconds" in bad.stderr
    flower = subprocess.run([*command, "--insecure", "--not-a-flower-option"], capture_output=True, text=True)
    assert flower.returncode != 0 and "flower-supernode" in flower.stderr and "--not-a-flower-option" in flower.stderr
