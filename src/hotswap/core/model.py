"""The core's view of the world: an immutable snapshot of slices, nodes and workloads.

Records are frozen dataclasses; the mappings inside a :class:`Snapshot` are never mutated after
it is built (the core copies a mapping before it changes it). A snapshot also carries three
indexes derived from the records (which slices each device type has, who holds each slice,
which slices are unhealthy) so that a decision round does not rescan 10,000 slices; they are
maintained by the core and rebuilt by :meth:`Snapshot.build`, and :meth:`Snapshot.check` proves
them consistent in tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from hotswap.api.cluster import NodeState
from hotswap.api.phases import WorkloadPhase
from hotswap.api.priority import Priority
from hotswap.api.spec import WorkloadSpec


# The phases in which a workload holds slices (``WorkloadPhase.holds_slices``) as a set: the core
# tests this for thousands of workloads per round, and a set lookup is an order of magnitude
# cheaper than the enum property.
HOLDING = frozenset({WorkloadPhase.RUNNING, WorkloadPhase.RESTARTING})


@dataclasses.dataclass(frozen=True, slots=True)
class Node:
    name: str
    slice: str
    host: int
    state: NodeState = NodeState.READY


@dataclasses.dataclass(frozen=True, slots=True)
class Slice:
    """A slice: a group of hosts that one workload replica owns whole."""

    name: str
    device_type: str
    nodes: tuple[str, ...]
    ordinal: int  # placement order: free slices are handed out lowest ordinal first
    down_nodes: frozenset[str] = frozenset()  # nodes that are not Ready

    @property
    def healthy(self) -> bool:
        return not self.down_nodes


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    """A workload's scheduling state. ``slices[i]`` runs replica ``i`` (JobSet's JOB_INDEX)."""

    spec: WorkloadSpec
    seq: int  # creation order; FIFO tie-break within a priority level
    created_at: float
    phase: WorkloadPhase = WorkloadPhase.QUEUED
    slices: tuple[str, ...] = ()
    attempt: int = 0  # generation of workers; bumped at every (re)start
    stopping: frozenset[int] = frozenset()  # attempts whose workers may still be alive
    membership: int = 0  # elastic membership generation; bumped at every scale change
    restarts: int = 0  # restarts charged to max_restarts (restartable exit codes only)
    disruptions: int = 0  # restarts caused by node failures, cordons, drains (never charged)
    preemptions: int = 0
    running_since: float | None = None  # when the current attempt's workers started
    last_checkpoint_at: float | None = None
    last_checkpoint_step: int | None = None
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

    def progress_since_checkpoint(self, now: float) -> float:
        """Seconds of work that a hard stop now would lose (0 when not running)."""
        if self.phase is not WorkloadPhase.RUNNING or self.running_since is None:
            return 0.0
        since = self.running_since
        if self.last_checkpoint_at is not None and self.last_checkpoint_at > since:
            since = self.last_checkpoint_at
        return max(0.0, now - since)


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    slices: Mapping[str, Slice]
    nodes: Mapping[str, Node]
    workloads: Mapping[str, Workload]  # live workloads, terminal ones included until deleted
    next_seq: int = 0
    next_ordinal: int = 0
    # Derived indexes, maintained by the core (see module docstring).
    slices_by_type: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    holders: Mapping[str, str] = dataclasses.field(default_factory=dict)
    unhealthy: frozenset[str] = frozenset()
    # Free healthy slices per device type, and per holder class (device type, priority, elastic):
    # the workloads holding slices and the healthy slices they hold. Preemption reads only the
    # classes below the preemptor instead of scanning every workload.
    free_by_type: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    class_members: Mapping[tuple[str, int, bool], frozenset[str]] = dataclasses.field(default_factory=dict)
    class_held: Mapping[tuple[str, int, bool], int] = dataclasses.field(default_factory=dict)

    @classmethod
    def build(
        cls,
        now: float = 0.0,
        slices: Iterable[Slice] = (),
        nodes: Iterable[Node] = (),
        workloads: Iterable[Workload] = (),
        next_seq: int | None = None,
        next_ordinal: int | None = None,
    ) -> Snapshot:
        """Assemble a snapshot from records, computing the derived indexes."""
        node_map = {node.name: node for node in nodes}
        slice_map: dict[str, Slice] = {}
        for item in slices:
            down = frozenset(n for n in item.nodes if node_map[n].state is not NodeState.READY)
            slice_map[item.name] = dataclasses.replace(item, down_nodes=down)
        workload_map = {w.name: w for w in workloads}
        by_type: dict[str, set[str]] = {}
        for item in slice_map.values():
            by_type.setdefault(item.device_type, set()).add(item.name)
        holders = {s: w.name for w in workload_map.values() for s in w.slices}
        unhealthy = frozenset(s.name for s in slice_map.values() if not s.healthy)
        free = {t: frozenset(n for n in names if n not in holders and n not in unhealthy) for t, names in by_type.items()}
        members: dict[tuple[str, int, bool], set[str]] = {}
        held: dict[tuple[str, int, bool], int] = {}
        for w in workload_map.values():
            if w.slices:
                key = holder_class(w)
                members.setdefault(key, set()).add(w.name)
                held[key] = held.get(key, 0) + sum(1 for s in w.slices if s not in unhealthy)
        seq = next_seq if next_seq is not None else max((w.seq + 1 for w in workload_map.values()), default=0)
        if next_ordinal is None:
            next_ordinal = max((s.ordinal + 1 for s in slice_map.values()), default=0)
        return cls(
            now=now,
            slices=slice_map,
            nodes=node_map,
            workloads=workload_map,
            next_seq=seq,
            next_ordinal=next_ordinal,
            slices_by_type={t: frozenset(names) for t, names in by_type.items()},
            holders=holders,
            unhealthy=unhealthy,
            free_by_type={t: f for t, f in free.items() if f},
            class_members={k: frozenset(v) for k, v in members.items()},
            class_held=held,
        )

    def check(self) -> None:
        """Assert that the derived indexes match the records (used by tests)."""
        rebuilt = Snapshot.build(
            self.now, self.slices.values(), self.nodes.values(), self.workloads.values(), self.next_seq,
            self.next_ordinal,
        )
        assert all(s.ordinal < self.next_ordinal for s in self.slices.values()), "ordinal reused"
        assert dict(rebuilt.slices_by_type) == dict(self.slices_by_type), "slices_by_type drifted"
        assert dict(rebuilt.holders) == dict(self.holders), "holders drifted"
        assert rebuilt.unhealthy == self.unhealthy, "unhealthy drifted"
        assert _nonempty(rebuilt.free_by_type) == _nonempty(self.free_by_type), "free_by_type drifted"
        assert _nonempty(rebuilt.class_members) == _nonempty(self.class_members), "class_members drifted"
        assert _nonzero(rebuilt.class_held) == _nonzero(self.class_held), "class_held drifted"
        for item in self.slices.values():
            assert rebuilt.slices[item.name].down_nodes == item.down_nodes, "down_nodes drifted"

    def free_healthy(self, device_type: str) -> frozenset[str]:
        """Slices of a type that are healthy and held by nobody."""
        return self.free_by_type.get(device_type, frozenset())

    def workloads_in(self, *phases: WorkloadPhase) -> list[Workload]:
        return [w for w in self.workloads.values() if w.phase in phases]


def holder_class(workload: Workload) -> tuple[str, int, bool]:
    """The index key of a workload holding slices: device type, priority value, elastic."""
    spec = workload.spec
    return (spec.device_type, int(spec.priority), spec.min_slices is not None)


def _nonempty(mapping: Mapping) -> dict:
    return {k: frozenset(v) for k, v in mapping.items() if v}


def _nonzero(mapping: Mapping) -> dict:
    return {k: v for k, v in mapping.items() if v}
