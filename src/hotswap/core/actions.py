"""Actions: what the core decided. Backends enact them; the store records them as the timeline.

What each action asks of the workers:

- ``Admit`` / ``Restart`` with ``start=True``, ``StartWorkers``: start the workers of
  ``attempt`` on ``slices`` (replica ``i`` on ``slices[i]``). ``Restart`` first stops the
  workers of every earlier attempt; with ``start=False`` the new workers wait for a later
  ``StartWorkers`` (BlockingRecreate, or waiting for repair).
- ``Preempt``, ``Requeue``, ``Fail``, ``Remove``: stop every worker of the workload, gracefully
  (SIGTERM, then SIGKILL after the grace period).
- ``ScaleDown``: stop the workers on ``removed``; ``ScaleUp``: start workers of the current
  attempt on ``added``. Both publish membership generation ``membership`` (``slices`` is the new
  active list); surviving workers keep running.
- ``Complete``, ``Reject``: nothing to stop.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class Reject:
    workload: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Admit:
    workload: str
    attempt: int
    slices: tuple[str, ...]
    start: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class Preempt:
    workload: str
    preemptor: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Restart:
    workload: str
    attempt: int
    slices: tuple[str, ...]
    reason: str
    charged: bool  # counts against max_restarts (restartable exit code), never for infrastructure
    start: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class StartWorkers:
    workload: str
    attempt: int
    slices: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Requeue:
    """The workload lost capacity that cannot be replaced now; it waits in the queue."""

    workload: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class ScaleDown:
    workload: str
    removed: tuple[str, ...]
    slices: tuple[str, ...]
    membership: int
    reason: str
    preemptor: str | None = None  # set when it gave slices to higher-priority work


@dataclasses.dataclass(frozen=True, slots=True)
class ScaleUp:
    workload: str
    added: tuple[str, ...]
    slices: tuple[str, ...]
    membership: int


@dataclasses.dataclass(frozen=True, slots=True)
class Fail:
    workload: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Complete:
    workload: str


@dataclasses.dataclass(frozen=True, slots=True)
class Remove:
    """The workload was deleted; its slices are free."""

    workload: str


Action = (
    Reject | Admit | Preempt | Restart | StartWorkers | Requeue | ScaleDown | ScaleUp | Fail | Complete | Remove
)
