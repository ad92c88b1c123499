"""Workload phases and the table of legal transitions between them.

A workload is QUEUED until admitted; RUNNING while its workers run on the slices it holds;
RESTARTING while it holds slices but its workers are not (yet) started: old workers are still
stopping (BlockingRecreate) or a slice it waits for is being repaired (no hotswap). SUCCESSFUL
and FAILED are terminal. Every phase change anywhere in hotswap goes through
:func:`check_transition`, so an illegal one is a bug that fails loudly, not a silent state.
"""

from __future__ import annotations

import enum


class WorkloadPhase(str, enum.Enum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    SUCCESSFUL = "SUCCESSFUL"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        return self in (WorkloadPhase.SUCCESSFUL, WorkloadPhase.FAILED)

    @property
    def holds_slices(self) -> bool:
        return self in (WorkloadPhase.RUNNING, WorkloadPhase.RESTARTING)

    def __str__(self) -> str:
        return self.value


_Q, _RUN, _RST, _OK, _FAIL = (
    WorkloadPhase.QUEUED,
    WorkloadPhase.RUNNING,
    WorkloadPhase.RESTARTING,
    WorkloadPhase.SUCCESSFUL,
    WorkloadPhase.FAILED,
)

# (from, to) -> what causes it. RUNNING -> RUNNING is a restart (Recreate), a scale-down or a
# scale-up: the workload keeps running, possibly on other slices.
TRANSITIONS: dict[tuple[WorkloadPhase, WorkloadPhase], str] = {
    (_Q, _RUN): "admitted, workers started",
    (_Q, _RST): "admitted, waiting for its previous workers to stop before starting",
    (_Q, _FAIL): "rejected or failed while queued",
    (_RUN, _RUN): "restarted (Recreate), scaled down or scaled up",
    (_RUN, _RST): "restart waiting for old workers to stop (BlockingRecreate) or for repair",
    (_RUN, _Q): "preempted, or lost capacity that cannot be replaced",
    (_RUN, _OK): "all workers exited 0",
    (_RUN, _FAIL): "a worker failed with a non-restartable code, or max restarts exceeded",
    (_RST, _RUN): "old workers gone and slices healthy: new workers started",
    (_RST, _RST): "a reserved slice was replaced while waiting",
    (_RST, _Q): "preempted while restarting, or lost capacity that cannot be replaced",
    (_RST, _FAIL): "failed while restarting",
}


class IllegalTransitionError(RuntimeError):
    """A phase change that the table above does not allow: a bug, never user input."""


def check_transition(source: WorkloadPhase, target: WorkloadPhase) -> None:
    if (source, target) not in TRANSITIONS:
        raise IllegalTransitionError(f"illegal workload phase transition {source} -> {target}")


def is_legal(source: WorkloadPhase, target: WorkloadPhase) -> bool:
    return (source, target) in TRANSITIONS
