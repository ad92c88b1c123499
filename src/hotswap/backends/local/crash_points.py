"""Test-only fault injection: a controller killed with -9 at a chosen moment.

``HOTSWAP_TEST_CRASH_AT=<point>`` in a controller's environment makes it SIGKILL itself (no
clean-up of any kind, exactly as ``kill -9`` from outside) the first time it reaches ``<point>``;
``<point>@<file>`` does so only if it can create ``<file>``, so that of all the controllers
started with it (the CLI starts another when one dies) only the first crashes.
It exists for the crash drill (``tests/test_controller_crash_drill.py``): a kill at random
moments finds the narrow windows only now and then, these points find them every time. Never
set it outside tests; nothing else reads it and an unknown point does nothing.

The points, in the order a start goes through them:

- ``committed``: a round's decision is committed (new worker rows, no pid yet); the request
  is not answered.
- ``before-spawn``: the request is answered, old workers are signalled, none started yet.
- ``after-spawn``: the first worker's shim is forked; its pid is committed nowhere.
- ``with-child``: as ``after-spawn``, and the kill also hits the forked child once it has
  written its pid file (a ``kill -9`` of every process with the controller's command line sees
  the child until it has become the shim).
- ``with-child-running``: as ``with-child``, once the child's command runs.
- ``spawned``: the started workers' pids are committed, they are not watched yet.

And of a warm spare's start and of ``cluster delete`` (issue 36):

- ``spare-spawned``: a spare's shim is started (forked by the zygote, or cold); its pid is
  committed nowhere.
- ``zygote-spawned``: the zygote is started; its pid is written nowhere.
- ``deletion-committed``: the deletion is committed; ``cluster delete`` is not answered.
- ``deletion-answered``: it is answered; no worker or spare is signalled yet.
- ``deletion-signalled``: every worker and spare is signalled; none is seen gone yet.

Not a moment of every start (so not in :data:`POINTS`): ``staged``, inside a round's transaction,
once an elastic workload's new membership generation is written beside its file, before the
commit (``tests/test_drain_crash_drill.py``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CRASH_AT = "HOTSWAP_TEST_CRASH_AT"
POINTS = ("committed", "before-spawn", "after-spawn", "with-child", "with-child-running", "spawned")
DELETION_POINTS = ("spare-spawned", "zygote-spawned", "deletion-committed", "deletion-answered", "deletion-signalled")
CHILD_WAIT_S = 10.0

_chosen, _, _once = (os.environ.get(CRASH_AT) or "").partition("@")


def crash_at(point: str, child: tuple[int, Path] | None = None) -> None:
    """SIGKILL this process if ``point`` is the chosen one; ``child``: the pid and directory of
    the worker just forked, for the points that kill it too."""
    if _chosen != point:
        return
    if _once:
        try:
            os.close(os.open(_once, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            return
    if child is not None and point in ("with-child", "with-child-running"):
        pid, directory = child
        mark = directory / ("pid" if point == "with-child" else "started")
        deadline = time.monotonic() + CHILD_WAIT_S
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(pid, signal.SIGKILL)  # the child alone, as a kill by pid (its group lives on)
    os.kill(os.getpid(), signal.SIGKILL)


def crash_at_spawn(pid: int, directory: Path) -> None:
    """The points of a worker's shim just forked (pid ``pid``, its directory ``directory``)."""
    if _chosen in ("after-spawn", "with-child", "with-child-running"):
        crash_at(_chosen, (pid, directory))
