"""The core's view of the world: an immutable snapshot of slices, nodes and workloads.

Records are frozen dataclasses (slices and nodes here, workloads in :mod:`hotswap.core.workload`);
the mappings inside a :class:`Snapshot` are never mutated after it is built (a round writes
through :class:`hotswap.core.cow.Overlay` and freezes a new version). A snapshot also carries
indexes derived from the records, so that a decision round at 100,000 slices looks only at what
could have changed: the slices of each device type, who holds each slice, the unhealthy slices,
the free healthy slices of each type in placement order, the healthy slices held per (device
type, priority), and the workload indexes of :mod:`hotswap.core.index`. They are maintained by
the core and rebuilt by :meth:`Snapshot.build`; :meth:`Snapshot.check` proves them consistent
in tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from hotswap.api.cluster import NodeState
from hotswap.api.phases import WorkloadPhase
from hotswap.core.cow import Layered
from hotswap.core.index import Indexes, Level
from hotswap.core.records import fast_init
from hotswap.core.workload import Workload


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Node:
    name: str
    slice: str
    host: int
    state: NodeState = NodeState.READY


@fast_init
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


@fast_init
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
    # Free healthy slices per device type as sorted (-ordinal, name): placement order backwards,
    # so that the next slice to place is at the end (taking it does not move the others).
    free_by_type: Mapping[str, tuple[tuple[int, str], ...]] = dataclasses.field(default_factory=dict)
    # Healthy slices held per (device type, priority value): what preemption can reclaim.
    held_by_level: Mapping[Level, int] = dataclasses.field(default_factory=dict)
    index: Indexes = dataclasses.field(default_factory=Indexes)

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
        free = {
            t: tuple(sorted((-slice_map[n].ordinal, n) for n in names if n not in holders and n not in unhealthy))
            for t, names in by_type.items()
        }
        held: dict[Level, int] = {}
        for w in workload_map.values():
            if w.slices:
                level = (w.spec.device_type, int(w.spec.priority))
                held[level] = held.get(level, 0) + sum(1 for s in w.slices if s not in unhealthy)
        seq = next_seq if next_seq is not None else max((w.seq + 1 for w in workload_map.values()), default=0)
        if next_ordinal is None:
            next_ordinal = max((s.ordinal + 1 for s in slice_map.values()), default=0)
        return cls(
            now=now,
            slices=Layered.adopt(slice_map),
            nodes=Layered.adopt(node_map),
            workloads=Layered.adopt(workload_map),
            next_seq=seq,
            next_ordinal=next_ordinal,
            slices_by_type={t: frozenset(names) for t, names in by_type.items()},
            holders=Layered.adopt(holders),
            unhealthy=unhealthy,
            free_by_type={t: f for t, f in free.items() if f},
            held_by_level=held,
            index=Indexes.build(workload_map),
        )

    def check(self) -> None:
        """Assert that the derived indexes match the records (used by tests)."""
        rebuilt = Snapshot.build(
            self.now, self.slices.values(), self.nodes.values(), self.workloads.values(), self.next_seq,
            self.next_ordinal,
        )
        assert all(s.ordinal < self.next_ordinal for s in self.slices.values()), "ordinal reused"
        assert _nonempty(rebuilt.slices_by_type) == _nonempty(self.slices_by_type), "slices_by_type drifted"
        assert dict(rebuilt.holders) == dict(self.holders), "holders drifted"
        assert rebuilt.unhealthy == self.unhealthy, "unhealthy drifted"
        assert _nonempty(rebuilt.free_by_type) == _nonempty(self.free_by_type), "free_by_type drifted"
        assert _nonzero(rebuilt.held_by_level) == _nonzero(self.held_by_level), "held_by_level drifted"
        assert rebuilt.index.comparable() == self.index.comparable(), "workload indexes drifted"
        for item in self.slices.values():
            assert rebuilt.slices[item.name].down_nodes == item.down_nodes, "down_nodes drifted"
        for w in self.workloads.values():
            placed = [s for s in w.replica_map if s is not None]
            assert sorted(placed) == sorted(w.slices) and len(set(placed)) == len(placed), f"{w.name}'s replica map drifted"
            assert len(w.replica_map) <= w.spec.num_slices, f"{w.name} has replicas past its size"
            assert w.replicas is None or (w.replicas != w.slices and w.replicas[-1] is not None), f"{w.name}'s map has two forms"
            if not w.slices:
                continue
            workers = {(s, h) for s in w.slices for h in range(len(self.slices[s].nodes))}
            assert w.exited_ok <= workers, f"{w.name} counts exits of workers it does not have"

    def free_healthy(self, device_type: str) -> tuple[str, ...]:
        """Slices of a type that are healthy and held by nobody, in placement order."""
        return tuple(name for _, name in reversed(self.free_by_type.get(device_type, ())))

    def workloads_in(self, *phases: WorkloadPhase) -> list[Workload]:
        return [w for w in self.workloads.values() if w.phase in phases]


def _nonempty(mapping: Mapping) -> dict:
    return {k: tuple(sorted(v)) for k, v in mapping.items() if v}


def _nonzero(mapping: Mapping) -> dict:
    return {k: v for k, v in mapping.items() if v}
