"""The core's record of one workload: its scheduling state (:class:`Workload`), and the fast
way every transition copies it (:func:`replace_workload`).

Records are frozen dataclasses; :mod:`hotswap.core.model` holds them in a snapshot, and
:mod:`hotswap.core.index` indexes them.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING

from hotswap.api.phases import WorkloadPhase
from hotswap.api.priority import Priority
from hotswap.core.records import fast_init

if TYPE_CHECKING:  # pydantic is loaded only by those who build or validate specs (the CLI's reads stay fast)
    from hotswap.api.spec import WorkloadSpec

# The phases in which a workload holds slices (``WorkloadPhase.holds_slices``) as a set: the core
# tests this for thousands of workloads per round, and a set lookup is an order of magnitude
# cheaper than the enum property.
HOLDING = frozenset({WorkloadPhase.RUNNING, WorkloadPhase.RESTARTING})


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    """A workload's scheduling state: the slices it holds, and which replica index (JobSet's
    JOB_INDEX) each one runs, :attr:`replica_map`."""

    spec: WorkloadSpec
    seq: int  # creation order; FIFO tie-break within a priority level
    created_at: float
    phase: WorkloadPhase = WorkloadPhase.QUEUED
    slices: tuple[str, ...] = ()
    # The replica map where it is not ``slices`` itself: replica i runs on replicas[i], None where
    # an elastic scale-down parked it (the survivors keep their indexes), nothing past its end.
    # None: replica i runs on slices[i], the map of every (re)start (see replica_map).
    replicas: tuple[str | None, ...] | None = None
    attempt: int = 0  # generation of workers; bumped at every (re)start
    stopping: frozenset[int] = frozenset()  # attempts whose workers may still be alive
    membership: int = 0  # elastic membership generation; bumped at every scale change
    restarts: int = 0  # restarts charged to max_restarts (restartable exit codes only)
    disruptions: int = 0  # restarts caused by node failures, cordons, drains (never charged)
    preemptions: int = 0
    running_since: float | None = None  # when the current attempt's workers started
    last_checkpoint_at: float | None = None
    last_checkpoint_step: int | None = None
    # Set when the workload declared that it saves every this many seconds from
    # last_checkpoint_at on, without reporting each save (see CheckpointRecorded.every).
    checkpoint_every: float | None = None
    exited_ok: frozenset[tuple[str, int]] = frozenset()  # (slice, host) of this attempt done
    status_message: str = ""
    status_time: float = 0.0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def priority(self) -> Priority:
        return self.spec.priority

    @property
    def device_type(self) -> str:
        return self.spec.device_type

    @property
    def replica_map(self) -> tuple[str | None, ...]:
        """The slice each replica index runs on (None: parked), as the core assigned it: every
        backend starts each slice's workers as the replica this map gives them."""
        return self.slices if self.replicas is None else self.replicas


_WORKLOAD_FIELDS = tuple(f.name for f in dataclasses.fields(Workload))
_FIELD_INDEX = {name: index for index, name in enumerate(_WORKLOAD_FIELDS)}
_ALL_FIELDS = operator.attrgetter(*_WORKLOAD_FIELDS)


def replace_workload(workload: Workload, changes: Mapping[str, object]) -> Workload:
    """``dataclasses.replace(workload, **changes)``, several times faster: every transition of
    every workload goes through it. (Workload has no ``__post_init__`` or init-only field, so
    its fields in order are all its ``__init__`` takes; that ``__init__``, :func:`fast_init`'s,
    fills the slots directly: one call costs less than filling them here one by one.)"""
    values = list(_ALL_FIELDS(workload))
    for name, value in changes.items():
        values[_FIELD_INDEX[name]] = value
    return Workload(*values)
