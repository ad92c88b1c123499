"""`cluster delete` returns as soon as the controller is gone (issue 16, item 4): the CLI must
not keep reconnecting to the socket of a controller that has stopped, or that only stops
workers on a cluster being deleted. The tests count connection attempts, never time."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from hardening_helpers import home  # noqa: F401 (a fixture)
from local_helpers import alive, hotswap, wait_until

from hotswap.backends.local.commands import client
from hotswap.backends.local.claim import Claim
from hotswap.store.paths import ClusterPaths
from hotswap.store.state import Store

# Once the controller it started has exited, the CLI decides at once (the old code: ~20 s of pings).
FEW_PINGS = 5


def _idle_cluster_without_controller(home: Path) -> ClusterPaths:
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v4-8", "--num-slices", "1", check=True)
    paths = ClusterPaths.of("c", home)
    pid = paths.controller_pid()
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not alive(pid), what="the controller to stop")
    return paths


class _CountedPings:
    """Counts the CLI's pings made while no controller it started is still starting: pings
    only a controller that is gone could answer. (Pings while a new controller imports are the
    start-up's normal wait.)"""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.started: list = []
        real_ping, real_start = client.ping, client._start

        def counted(paths: ClusterPaths, timeout: float = 2.0) -> int | None:
            if self.started and self.started[-1].poll() is not None:
                self.count += 1
            return real_ping(paths, timeout)

        def start(paths: ClusterPaths):
            process = real_start(paths)
            self.started.append(process)
            return process

        monkeypatch.setattr(client, "ping", counted)
        monkeypatch.setattr(client, "_start", start)

    def first_controller_exited(self) -> bool:
        return bool(self.started) and self.started[0].poll() is not None


def _in_thread(call) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except Exception as error:  # the test reads it
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def test_a_holder_that_goes_away_is_not_waited_for(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _idle_cluster_without_controller(home)
    pings = _CountedPings(monkeypatch)
    holder = Claim.take(paths)  # a controller that holds the cluster but no longer answers
    thread, outcome = _in_thread(lambda: client.ensure_controller(paths))
    try:
        # The controller the CLI started found the cluster held and exited.
        wait_until(pings.first_controller_exited, timeout=60, what="the new controller to exit")
    finally:
        holder.release()  # ... and then exits
    thread.join(120)
    assert not thread.is_alive()
    assert isinstance(outcome.get("value"), int), outcome
    assert pings.count <= FEW_PINGS, f"{pings.count} pings after the holder had gone"


def test_a_cluster_being_deleted_is_not_waited_for(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _idle_cluster_without_controller(home)
    with Store.open(paths.database) as store:
        store.mark_deleted()
    pings = _CountedPings(monkeypatch)
    holder = Claim.take(paths)  # the controller stopping its workers before it exits
    thread, outcome = _in_thread(lambda: client.ensure_controller(paths))
    try:
        wait_until(lambda: pings.first_controller_exited() or not thread.is_alive(), timeout=60, what="an exit")
    finally:
        holder.release()
    thread.join(120)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), client.ClusterBeingDeleted), outcome
    assert pings.count <= FEW_PINGS, f"{pings.count} pings to a controller that only stops workers"
    assert hotswap(home, "cluster", "delete", "--cluster", "c").returncode == 0
    assert not paths.root.exists()
