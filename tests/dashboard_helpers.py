"""Helpers for the dashboard's tests: a small local cluster in a drill (a stepping high-priority
job, a low-priority one it can preempt, a queued one), and a dashboard served in this process."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from local_helpers import hotswap, wait_until, write_sleeper

# A worker that prints the contract's step line ten times a second.
STEPPER = textwrap.dedent(
    """
    import json, os, time
    events = os.environ.get("HOTSWAP_EVENTS_FILE")  # the records the SDK would write
    step = 0
    while True:
        step += 1
        print(f"step={step} elastic_manager.good_slice_count=1 elastic_manager.elastic_down_event_count=0", flush=True)
        if events:
            with open(events, "a") as handle:
                handle.write(json.dumps({"t": time.time(), "kind": "step", "step": step, "duration_s": 0.1, "slices": 1}) + "\\n")
        time.sleep(0.1)
    """
)


def drill_cluster(home: Path, directory: Path, cluster: str = "c", create: bool = True, first_step: int = 0) -> None:
    """2 slices: ``high`` (stepping, from ``first_step``) on one, ``low`` on the other, ``waiter`` queued."""
    stepper = directory / "stepper.py"
    stepper.write_text(STEPPER.replace("step = 0", f"step = {first_step}"))
    sleeper = write_sleeper(directory)
    if create:
        hotswap(home, "cluster", "create", "--cluster", cluster, "--device-type", "v6e-4", "--num-slices", "2", check=True)
    for name, priority, command in (("high", "high", f"{sys.executable} {stepper}"), ("low", "low", sleeper), ("waiter", "very-low", sleeper)):
        hotswap(home, "workload", "create", "--cluster", cluster, "--workload", name, "--priority", priority, "--command", command, check=True)


@contextlib.contextmanager
def served(home: Path, cluster: str = "c", token: str | None = None, interval_s: float = 0.25) -> Iterator[Any]:
    """A dashboard of ``cluster`` on a free loopback port, in this process."""
    from hotswap.cli.dashboard import start_dashboard

    previous = os.environ.get("HOTSWAP_HOME")
    os.environ["HOTSWAP_HOME"] = str(home)
    board = start_dashboard(cluster, "127.0.0.1", 0, token, interval_s)
    board.start()
    try:
        wait_until(lambda: _answers(board.url), timeout=30, what="the dashboard to answer")
        yield board
    finally:
        board.stop()
        if previous is None:
            os.environ.pop("HOTSWAP_HOME", None)
        else:
            os.environ["HOTSWAP_HOME"] = previous


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url.split("?")[0] + "healthz" + ("?" + url.split("?")[1] if "?" in url else ""), timeout=5):
            return True
    except OSError:
        return False


def state(board: Any, path: str = "api/state", headers: dict[str, str] | None = None) -> dict[str, Any]:
    base = board.url.split("?")[0]
    request = urllib.request.Request(base + path, headers=headers or {})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def holder_of(document: dict[str, Any], workload: str) -> list[str]:
    return [s["name"] for s in document["slices"] if s["holder"] == workload]


def poll(board: Any, predicate: Any, what: str, timeout: float = 60) -> dict[str, Any]:
    """The dashboard's document once ``predicate(document)`` holds."""
    def ready() -> dict[str, Any] | None:
        document = state(board)
        return document if predicate(document) else None

    return wait_until(ready, timeout=timeout, what=what)
