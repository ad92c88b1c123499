"""The capacity a decision round works on, like Kueue's cache: slices, who holds them, what is free.

A :class:`Capacity` starts from a :class:`~hotswap.core.model.Snapshot` and keeps its indexes
up to date while the round applies events and places workloads: the slice and node records,
the slices of each device type, the holder of each slice, the unhealthy slices, the free healthy
slices of each type in placement order, and the healthy slices held per (device type,
priority). :meth:`Capacity.freeze` hands them back as the next snapshot's.

Everything is copy-on-write (:mod:`hotswap.core.cow`): a round that touches one slice of
100,000 copies neither the slices, the nodes, nor the holders.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from hotswap.api.cluster import NodeState
from hotswap.core.cow import Overlay, Owned, OwnedSortedPerKey, SortedPerKey
from hotswap.core.index import Indexes, Level
from hotswap.core.model import Node, Slice, Snapshot
from hotswap.core.workload import Workload


def level_of(workload: Workload) -> Level:
    return (workload.spec.device_type, int(workload.spec.priority))


class Capacity:
    """The mutable capacity indexes of one round. The class is the cache's whole bookkeeping:
    every index it keeps must change together with the others, so they live in one place."""

    def __init__(
        self, snapshot: Snapshot, workloads: Mapping[str, Workload] | Overlay | Owned, consume: bool = False
    ) -> None:
        # The round's live workloads: read to find the level of a slice's holder.
        self.workloads = workloads
        # consume: the caller gave the snapshot up; its mappings change in place (hotswap.core.cow).
        view = Owned.of if consume else Overlay
        self.slices: Overlay[str, Slice] | Owned = view(snapshot.slices)
        self.nodes: Overlay[str, Node] | Owned = view(snapshot.nodes)
        self.holders: Overlay[str, str] | Owned = view(snapshot.holders)
        self._by_type_original = snapshot.slices_by_type
        self._by_type: dict[str, set[str]] = {}
        self.next_ordinal = snapshot.next_ordinal
        self.unhealthy: set[str] = set(snapshot.unhealthy)
        self.removed: set[str] = set()  # slices leaving the cluster; dropped by drop_removed()
        self.held: dict[Level, int] = dict(snapshot.held_by_level)
        self._free = (OwnedSortedPerKey if consume else SortedPerKey)(snapshot.free_by_type)
        # admissible() per device type and priority, valid while nothing is held, released or
        # freed (the demand queue asks for several levels, and again after every grant).
        self._admissible: dict[str, dict[int, int]] = {}

    # ------------------------------------------------------------------ queries

    def healthy(self, name: str) -> bool:
        return name not in self.unhealthy

    def type_size(self, device_type: str) -> int:
        """Slices of a type in the cluster (not counting those being removed)."""
        found = self._by_type.get(device_type)
        return len(found if found is not None else self._by_type_original.get(device_type, ()))

    def free_count(self, device_type: str) -> int:
        return len(self._free.view(device_type))

    def reclaimable(self, device_type: str, priority: int) -> int:
        """Healthy slices of the type held by strictly lower priorities."""
        total = 0
        for (held_type, held_priority), held in self.held.items():
            if held_priority < priority and held_type == device_type:
                total += held
        return total

    def admissible(self, device_type: str, priority: int) -> int:
        """The most slices a demand at ``priority`` could get now: free, or reclaimed."""
        levels = self._admissible.get(device_type)
        if levels is None:
            levels = self._admissible[device_type] = {}
        found = levels.get(priority)
        if found is None:
            found = levels[priority] = self.free_count(device_type) + self.reclaimable(device_type, priority)
        return found

    def broken_by_holder(self) -> dict[str, int]:
        """Unhealthy slices per holder (there are few unhealthy slices: count those)."""
        broken: dict[str, int] = {}
        for name in self.unhealthy:
            holder = self.holders.get(name)
            if holder is not None:
                broken[holder] = broken.get(holder, 0) + 1
        return broken

    # ------------------------------------------------------------------ holding

    def _count(self, holder: str, change: int) -> None:
        self._admissible.clear()
        level = level_of(self.workloads[holder])
        self.held[level] = self.held.get(level, 0) + change

    def hold(self, workload: Workload, names: Iterable[str]) -> None:
        """Give slices taken from the free pool to ``workload``."""
        names = tuple(names)
        self.holders.set_all(names, workload.name)
        healthy = len(names) - len(self.unhealthy.intersection(names)) if self.unhealthy else len(names)
        if healthy:
            self._admissible.clear()
            level = level_of(workload)
            self.held[level] = self.held.get(level, 0) + healthy

    def release(self, workload: Workload, names: Iterable[str]) -> bool:
        """Take slices back from ``workload``; healthy ones return to the free pool.

        Returns whether any did (capacity that waiting demands of the type may use)."""
        holders, unhealthy, name_of = self.holders, self.unhealthy, workload.name
        freed: list[str] = []
        for name in names:
            if holders.get(name) != name_of:
                continue
            del holders[name]
            if name not in unhealthy:
                freed.append(name)
        if not freed:
            return False
        self._admissible.clear()
        level = level_of(workload)
        self.held[level] -= len(freed)
        self.return_free(workload.device_type, freed)
        return True

    # ------------------------------------------------------------------ the free pool

    def take_free(self, device_type: str, count: int) -> list[str]:
        """Up to ``count`` free healthy slices, lowest ordinal first (the placement order)."""
        if count <= 0:
            return []
        self._admissible.clear()
        return [name for _, name in self._free.take_last(device_type, count)]

    def return_free(self, device_type: str, names: Iterable[str]) -> None:
        """Put free healthy slices back in the pool (slices taken but not given to anyone)."""
        self._admissible.clear()
        slices = self.slices
        self._free.add_all(device_type, [(-slices[name].ordinal, name) for name in names])

    # ------------------------------------------------------------------ health and topology

    def mark_unhealthy(self, name: str) -> None:
        if name in self.unhealthy:
            return
        self.unhealthy.add(name)
        holder = self.holders.get(name)
        if holder is not None:
            self._count(holder, -1)
        else:
            self._admissible.clear()
            item = self.slices[name]
            self._free.discard(item.device_type, (-item.ordinal, name))

    def mark_healthy(self, name: str) -> None:
        if name not in self.unhealthy:
            return
        self.unhealthy.discard(name)
        holder = self.holders.get(name)
        if holder is not None:
            self._count(holder, 1)
        else:
            self.return_free(self.slices[name].device_type, (name,))

    def set_node_state(self, name: str, state: NodeState) -> tuple[Slice, Slice] | None:
        """Record a node's new state. Returns its slice before and after, or None when the
        node is unknown (a stale event) or already in that state. Slice health is left to the
        caller (a slice that goes down is a loss for its holder)."""
        node = self.nodes.get(name)
        if node is None or node.state is state:
            return None
        self.nodes[name] = dataclasses.replace(node, state=state)
        before = self.slices[node.slice]
        down = before.down_nodes - {name} if state is NodeState.READY else before.down_nodes | {name}
        after = dataclasses.replace(before, down_nodes=down)
        self.slices[after.name] = after
        return before, after

    def _type_set(self, device_type: str) -> set[str]:
        found = self._by_type.get(device_type)
        if found is None:
            found = set(self._by_type_original.get(device_type, ()))
            self._by_type[device_type] = found
        return found

    def add_slice(self, name: str, device_type: str, nodes: tuple[str, ...]) -> None:
        """A new healthy, free slice, placed after every existing one."""
        if name in self.slices or any(n in self.nodes for n in nodes):
            raise ValueError(f"slice {name} or one of its nodes already exists")
        for host, node in enumerate(nodes):
            self.nodes[node] = Node(node, name, host)
        self.slices[name] = Slice(name, device_type, tuple(nodes), self.next_ordinal)
        self.next_ordinal += 1
        self._type_set(device_type).add(name)
        self.return_free(device_type, (name,))

    def remove_slice(self, name: str) -> bool:
        """Start removing a slice: no longer counted for its type, unhealthy until dropped.
        Returns False when it is unknown or already leaving."""
        item = self.slices.get(name)
        if item is None or name in self.removed:
            return False
        self._type_set(item.device_type).discard(name)
        self.removed.add(name)
        self.mark_unhealthy(name)
        return True

    def drop_removed(self) -> None:
        """Forget removed slices and their nodes (their holders have let go of them by now)."""
        for name in sorted(self.removed):
            item = self.slices.pop(name)
            for node in item.nodes:
                self.nodes.pop(node, None)
            self.unhealthy.discard(name)
            assert name not in self.holders, f"removed slice {name} is still held"

    def freeze(self, now: float, workloads: Mapping[str, Workload], next_seq: int, index: Indexes) -> Snapshot:
        by_type = self._by_type_original
        if self._by_type:
            by_type = {**by_type, **{t: frozenset(names) for t, names in self._by_type.items()}}
        return Snapshot(
            now=now,
            slices=self.slices.freeze(),
            nodes=self.nodes.freeze(),
            workloads=workloads,
            next_seq=next_seq,
            next_ordinal=self.next_ordinal,
            slices_by_type=by_type,
            holders=self.holders.freeze(),
            unhealthy=frozenset(self.unhealthy),
            free_by_type=self._free.freeze(),
            held_by_level=self.held,
            index=index,
        )
