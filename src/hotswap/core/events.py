"""Events: what happened. Every backend (simulator, local, Kubernetes) reports in these terms."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from hotswap.core.records import fast_init

if TYPE_CHECKING:  # pydantic is loaded only by those who build or validate specs (the CLI's reads stay fast)
    from hotswap.api.spec import WorkloadSpec


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class WorkloadCreated:
    spec: WorkloadSpec


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class WorkloadDeleted:
    workload: str


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class NodeFailed:
    node: str
    reason: str = ""  # what failed, when known (a GPU's XID, ECC errors, a lost GPU)


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class NodeCordoned:
    """Taken out of scheduling. ``reason``: why, when it was not a cordon (a backend that
    saw the node's pods fail to run there, say); empty: it was cordoned."""

    node: str
    reason: str = ""


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class NodeDrained:
    """Cordon plus graceful eviction: the same decision as a cordon, recorded as a drain."""

    node: str


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class NodeRepaired:
    """The node is Ready again (``node uncordon``, or repaired hardware)."""

    node: str


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class SliceAdded:
    name: str
    device_type: str
    nodes: tuple[str, ...]


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class SliceRemoved:
    """The slice leaves the cluster (resize). A holder is moved off it like after a cordon."""

    name: str


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class WorkerExited:
    """One worker process (one host of one slice) of ``attempt`` ended with ``code`` (0-255)."""

    workload: str
    attempt: int
    slice: str
    host: int
    code: int


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class WorkerLost:
    """The backend lost one worker of ``attempt`` for a reason of its own, never the workload's
    (the local controller's crash killed its supervisor under it): the workload restarts in
    place, and that is never charged to max_restarts. ``charged``: the backend will not vouch
    for it any more (the same loss again and again, ``reason`` says why): it is charged like a
    crash with a restart code."""

    workload: str
    attempt: int
    slice: str
    host: int
    reason: str
    charged: bool = False


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class AttemptSucceeded:
    """Every worker of ``attempt`` exited 0 (JobSet's Completed): the same as a ``WorkerExited``
    with code 0 from each worker on the slices the attempt holds, in one event. A job of 64
    hosts finishing is then one report instead of 64 (the simulator finishes ~16,000 jobs a
    month at 16k nodes)."""

    workload: str
    attempt: int


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class WorkersStopped:
    """Every worker of ``attempt`` is gone (what BlockingRecreate waits for)."""

    workload: str
    attempt: int


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class WorkloadHung:
    """The ranks of ``attempt`` stopped completing steps (:mod:`hotswap.core.hang` decided):
    the failure policy applies as to a worker that crashed."""

    workload: str
    attempt: int
    reason: str


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointRecorded:
    """The workload saved a checkpoint of ``step`` at ``at``.

    With ``every`` it also declares that it saves again every ``every`` seconds from ``at``
    on for as long as its current workers run, without reporting each save: the core then
    knows its last save at any time (preemption picks the victim that loses the least). The
    simulator declares its periodic checkpoints this way; a later report replaces the
    declaration, and a restart ends it."""

    workload: str
    step: int
    at: float
    every: float | None = None


ClusterEvent = NodeFailed | NodeCordoned | NodeDrained | NodeRepaired | SliceAdded | SliceRemoved
WorkloadEvent = (
    WorkloadCreated | WorkloadDeleted | WorkerExited | WorkerLost | AttemptSucceeded | WorkersStopped | WorkloadHung
    | CheckpointRecorded
)
Event = ClusterEvent | WorkloadEvent
