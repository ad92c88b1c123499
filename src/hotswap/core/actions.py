"""Actions: what the core decided. Backends enact them; the store records them as the timeline.

What each action asks of the workers:

- ``Admit`` / ``Restart`` with ``start=True``, ``StartWorkers``: start the workers of
  ``attempt`` on ``slices`` (replica ``i`` on ``slices[i]``). ``Restart`` first stops the
  workers of every earlier attempt; with ``start=False`` the new workers wait for a later
  ``StartWorkers`` (BlockingRecreate, or waiting for repair).
- ``Preempt``, ``Requeue``, ``Fail``, ``Remove``: stop every worker of the workload, gracefully
  (SIGTERM, then SIGKILL after the grace period).
- ``ScaleDown``: stop the workers on ``removed`` (replica indexes ``parked``); ``ScaleUp``: start
  workers of the current attempt on ``added``. Both publish membership generation ``membership``
  (``slices`` is the new active list) and carry the replica map after them (``replicas``:
  replica i on ``replicas[i]``, None where parked); surviving workers keep running.
- ``Complete``, ``Reject``: nothing to stop.

The same, as data that the backends and the simulator enact: :func:`hotswap.core.effects.effect_of`.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Protocol, TypeVar

from hotswap.core.records import fast_init


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Reject:
    workload: str
    reason: str


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Admit:
    workload: str
    attempt: int
    slices: tuple[str, ...]
    start: bool = True


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Preempt:
    workload: str
    preemptor: str
    reason: str


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Restart:
    workload: str
    attempt: int
    slices: tuple[str, ...]
    reason: str
    charged: bool  # counts against max_restarts (restartable exit code), never for infrastructure
    start: bool = True


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class StartWorkers:
    workload: str
    attempt: int
    slices: tuple[str, ...]


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Requeue:
    """The workload lost capacity that cannot be replaced now; it waits in the queue."""

    workload: str
    reason: str


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class ScaleDown:
    workload: str
    removed: tuple[str, ...]
    slices: tuple[str, ...]
    membership: int
    reason: str
    replicas: tuple[str | None, ...]  # the replica map after it
    parked: tuple[int, ...]  # the replica indexes of ``removed``, in order
    preemptor: str | None = None  # set when it gave slices to higher-priority work


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class ScaleUp:
    workload: str
    added: tuple[str, ...]
    slices: tuple[str, ...]
    membership: int
    replicas: tuple[str | None, ...]  # the replica map after it: the joiners took parked indexes


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Fail:
    workload: str
    reason: str


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Complete:
    workload: str


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Remove:
    """The workload was deleted; its slices are free."""

    workload: str


Action = (
    Reject | Admit | Preempt | Restart | StartWorkers | Requeue | ScaleDown | ScaleUp | Fail | Complete | Remove
)


_T_co = TypeVar("_T_co", covariant=True)


class ActionHandler(Protocol[_T_co]):
    """What a backend or the simulator does for each kind of action. Every enactment of a
    decision goes through :func:`dispatch`, so a new action type is a missing method
    everywhere at once (a type error, and :data:`HANDLER_METHODS` checked in the tests), not a
    branch forgotten in one ``isinstance`` chain."""

    def on_reject(self, action: Reject) -> _T_co: ...
    def on_admit(self, action: Admit) -> _T_co: ...
    def on_preempt(self, action: Preempt) -> _T_co: ...
    def on_restart(self, action: Restart) -> _T_co: ...
    def on_start_workers(self, action: StartWorkers) -> _T_co: ...
    def on_requeue(self, action: Requeue) -> _T_co: ...
    def on_scale_down(self, action: ScaleDown) -> _T_co: ...
    def on_scale_up(self, action: ScaleUp) -> _T_co: ...
    def on_fail(self, action: Fail) -> _T_co: ...
    def on_complete(self, action: Complete) -> _T_co: ...
    def on_remove(self, action: Remove) -> _T_co: ...


HANDLER_METHODS: dict[type, str] = {
    Reject: "on_reject",
    Admit: "on_admit",
    Preempt: "on_preempt",
    Restart: "on_restart",
    StartWorkers: "on_start_workers",
    Requeue: "on_requeue",
    ScaleDown: "on_scale_down",
    ScaleUp: "on_scale_up",
    Fail: "on_fail",
    Complete: "on_complete",
    Remove: "on_remove",
}
ACTION_TYPES: tuple[type, ...] = typing.get_args(Action)


def dispatch(action: Action, handler: ActionHandler[_T_co]) -> _T_co:
    """Call the handler's method for ``action``'s type."""
    return getattr(handler, HANDLER_METHODS[type(action)])(action)


def handler_table(handler: ActionHandler[_T_co]) -> dict[type, typing.Callable[[typing.Any], _T_co]]:
    """:func:`dispatch` for one handler with its methods looked up once:
    ``table[type(action)](action)`` is ``dispatch(action, handler)``, for a caller that
    dispatches hundreds of thousands of actions (the simulator, through ``effect_of``)."""
    return {kind: getattr(handler, method) for kind, method in HANDLER_METHODS.items()}
