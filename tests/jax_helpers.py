"""Setup shared by the tests of hotswap.train.jax: the repository root (a spawned process's
``PYTHONPATH``), the ``jax`` fixture (skips where ``hotswap[jax]`` is not installed), an orbax
checkpoint directory opened as a worker opens it, and waiting for a spawned process to end."""

from __future__ import annotations

import time
import types
from pathlib import Path

import pytest
from local_helpers import alive

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def jax() -> types.ModuleType:
    return pytest.importorskip("jax", reason="the JAX SDK needs hotswap[jax]")


def checkpoints(directory: Path):  # type: ignore[no-untyped-def]
    from hotswap.train.events import EventLog
    from hotswap.train.jax.checkpoints import OrbaxCheckpoints

    return OrbaxCheckpoints(str(directory), 3, EventLog(None), record_events=False)


def ends(pid: int, within_s: float = 10.0) -> bool:
    """Whether process ``pid`` is gone (or a zombie) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)
