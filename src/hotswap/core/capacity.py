"""The capacity a decision round works on, like Kueue's cache: slices, who holds them, what is free.

A :class:`Capacity` starts from a :class:`~hotswap.core.model.Snapshot` and keeps its indexes
up to date while the round applies events and places workloads: the slice and node records,
the slices of each device type, the holder of each slice, the unhealthy slices, the free healthy
slices of each type, and per holder class (device type, priority, elastic) the workloads that
hold slices and how many healthy slices they hold. :meth:`Capacity.freeze` hands them back as
the next snapshot's.

Everything is copy-on-write: a mapping or set of the snapshot is copied the first time the
round changes it, so a round that touches one slice of 10,000 does not copy the others.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Collection, Iterable, Mapping
from typing import Generic, TypeVar

from hotswap.api.cluster import NodeState
from hotswap.core.model import Node, Slice, Snapshot, Workload, holder_class

HolderClass = tuple[str, int, bool]  # see holder_class: device type, priority value, elastic
_K = TypeVar("_K")


class _SetsPerKey(Generic[_K]):
    """A snapshot's sets per key; each is copied the first time the round changes it."""

    def __init__(self, original: Mapping[_K, frozenset[str]]) -> None:
        self._original = original
        self._copies: dict[_K, set[str]] = {}

    def view(self, key: _K) -> Collection[str]:
        found = self._copies.get(key)
        return found if found is not None else self._original.get(key, ())

    def writable(self, key: _K) -> set[str]:
        found = self._copies.get(key)
        if found is None:
            found = set(self._original.get(key, ()))
            self._copies[key] = found
        return found

    def freeze(self) -> dict[_K, frozenset[str]]:
        return {**self._original, **{key: frozenset(names) for key, names in self._copies.items()}}


class Capacity:
    """The mutable capacity indexes of one round. The class is the cache's whole bookkeeping:
    every index it keeps must change together with the others, so they live in one place."""

    def __init__(self, snapshot: Snapshot, workloads: Mapping[str, Workload]) -> None:
        # The round's live workloads: read to find the holder class of a slice's holder.
        self.workloads = workloads
        self.slices = snapshot.slices
        self.nodes = snapshot.nodes
        self.slices_by_type = snapshot.slices_by_type
        self._owned: set[str] = set()
        self.next_ordinal = snapshot.next_ordinal
        self.holders: dict[str, str] = dict(snapshot.holders)
        self.unhealthy: set[str] = set(snapshot.unhealthy)
        self.removed: set[str] = set()  # slices leaving the cluster; dropped by drop_removed()
        self.class_held: dict[HolderClass, int] = dict(snapshot.class_held)
        self._free = _SetsPerKey(snapshot.free_by_type)
        self._members = _SetsPerKey(snapshot.class_members)
        # Free healthy slices of a type as a heap by ordinal, built when first taken from.
        self._free_heaps: dict[str, list[tuple[int, str]]] = {}

    def _own(self, name: str) -> None:
        """Copy a record mapping of the snapshot before its first change in this round."""
        if name not in self._owned:
            self._owned.add(name)
            setattr(self, name, dict(getattr(self, name)))

    # ------------------------------------------------------------------ queries

    def healthy(self, name: str) -> bool:
        return name not in self.unhealthy

    def members(self, key: HolderClass) -> Collection[str]:
        """Workloads of a holder class that hold slices (healthy or not)."""
        return self._members.view(key)

    def reclaimable(self, key: HolderClass) -> int:
        """Healthy slices of the class's device type held by strictly lower priorities."""
        device_type, priority, _ = key
        return sum(held for (t, p, _), held in self.class_held.items() if t == device_type and p < priority)

    def levels_below(self, key: HolderClass) -> list[int]:
        """Priority values below the class's that hold slices of its device type, lowest first."""
        device_type, priority, _ = key
        return sorted({p for (t, p, _) in self.class_held if t == device_type and p < priority})

    def broken_by_holder(self) -> dict[str, int]:
        """Unhealthy slices per holder (there are few unhealthy slices: count those)."""
        broken: dict[str, int] = {}
        for name in self.unhealthy:
            holder = self.holders.get(name)
            if holder is not None:
                broken[holder] = broken.get(holder, 0) + 1
        return broken

    # ------------------------------------------------------------------ holding

    def set_holding(self, workload: Workload, holding: bool) -> None:
        """Record whether ``workload`` holds any slice (its holder class lists it if so)."""
        members = self._members.writable(holder_class(workload))
        if holding:
            members.add(workload.name)
        else:
            members.discard(workload.name)

    def hold(self, workload: Workload, names: Iterable[str]) -> None:
        """Give slices taken from the free pool to ``workload``."""
        key = holder_class(workload)
        for name in names:
            self.holders[name] = workload.name
            if self.healthy(name):
                self.class_held[key] = self.class_held.get(key, 0) + 1

    def release(self, workload: Workload, names: Iterable[str]) -> bool:
        """Take slices back from ``workload``; healthy ones return to the free pool.

        Returns whether any did (capacity that waiting demands of the type may use)."""
        key = holder_class(workload)
        freed: list[str] = []
        for name in names:
            if self.holders.get(name) != workload.name:
                continue
            del self.holders[name]
            if self.healthy(name):
                self.class_held[key] -= 1
                freed.append(name)
        if not freed:
            return False
        self.return_free(workload.device_type, freed)
        return True

    # ------------------------------------------------------------------ the free pool

    def take_free(self, device_type: str, count: int) -> list[str]:
        """Up to ``count`` free healthy slices, lowest ordinal first (the placement order)."""
        heap = self._free_heaps.get(device_type)
        if heap is None:
            heap = [(self.slices[n].ordinal, n) for n in self._free.writable(device_type)]
            heapq.heapify(heap)
            self._free_heaps[device_type] = heap
        taken = [heapq.heappop(heap)[1] for _ in range(min(count, len(heap)))]
        self._free.writable(device_type).difference_update(taken)
        return taken

    def return_free(self, device_type: str, names: Iterable[str]) -> None:
        """Put free healthy slices back in the pool (slices taken but not given to anyone)."""
        free = self._free.writable(device_type)
        heap = self._free_heaps.get(device_type)
        for name in names:
            free.add(name)
            if heap is not None:
                heapq.heappush(heap, (self.slices[name].ordinal, name))

    def _leave_free(self, device_type: str, name: str) -> None:
        self._free.writable(device_type).discard(name)
        # The heap can no longer be trusted; rebuilt from the set when next taken from.
        self._free_heaps.pop(device_type, None)

    def _join_free(self, device_type: str, name: str) -> None:
        self._free.writable(device_type).add(name)
        self._free_heaps.pop(device_type, None)

    # ------------------------------------------------------------------ health and topology

    def mark_unhealthy(self, name: str) -> None:
        if name in self.unhealthy:
            return
        self.unhealthy.add(name)
        holder = self.holders.get(name)
        if holder is not None:
            self.class_held[holder_class(self.workloads[holder])] -= 1
        else:
            self._leave_free(self.slices[name].device_type, name)

    def mark_healthy(self, name: str) -> None:
        if name not in self.unhealthy:
            return
        self.unhealthy.discard(name)
        holder = self.holders.get(name)
        if holder is not None:
            key = holder_class(self.workloads[holder])
            self.class_held[key] = self.class_held.get(key, 0) + 1
        else:
            self._join_free(self.slices[name].device_type, name)

    def set_node_state(self, name: str, state: NodeState) -> tuple[Slice, Slice] | None:
        """Record a node's new state. Returns its slice before and after, or None when the
        node is unknown (a stale event) or already in that state. Slice health is left to the
        caller (a slice that goes down is a loss for its holder)."""
        node = self.nodes.get(name)
        if node is None or node.state is state:
            return None
        self._own("nodes")
        self._own("slices")
        self.nodes[name] = dataclasses.replace(node, state=state)
        before = self.slices[node.slice]
        down = before.down_nodes - {name} if state is NodeState.READY else before.down_nodes | {name}
        after = dataclasses.replace(before, down_nodes=down)
        self.slices[after.name] = after
        return before, after

    def add_slice(self, name: str, device_type: str, nodes: tuple[str, ...]) -> None:
        """A new healthy, free slice, placed after every existing one."""
        if name in self.slices or any(n in self.nodes for n in nodes):
            raise ValueError(f"slice {name} or one of its nodes already exists")
        self._own("slices")
        self._own("nodes")
        self._own("slices_by_type")
        for host, node in enumerate(nodes):
            self.nodes[node] = Node(node, name, host)
        self.slices[name] = Slice(name, device_type, tuple(nodes), self.next_ordinal)
        self.next_ordinal += 1
        self.slices_by_type[device_type] = self.slices_by_type.get(device_type, frozenset()) | {name}
        self._join_free(device_type, name)

    def remove_slice(self, name: str) -> bool:
        """Start removing a slice: no longer counted for its type, unhealthy until dropped.
        Returns False when it is unknown or already leaving."""
        item = self.slices.get(name)
        if item is None or name in self.removed:
            return False
        self._own("slices_by_type")
        self.slices_by_type[item.device_type] = self.slices_by_type[item.device_type] - {name}
        self.removed.add(name)
        self.mark_unhealthy(name)
        return True

    def drop_removed(self) -> None:
        """Forget removed slices and their nodes (their holders have let go of them by now)."""
        if not self.removed:
            return
        self._own("slices")
        self._own("nodes")
        for name in sorted(self.removed):
            item = self.slices.pop(name)
            for node in item.nodes:
                self.nodes.pop(node, None)
            self.unhealthy.discard(name)
            assert name not in self.holders, f"removed slice {name} is still held"

    def freeze(self, now: float, workloads: Mapping[str, Workload], next_seq: int) -> Snapshot:
        return Snapshot(
            now=now,
            slices=self.slices,
            nodes=self.nodes,
            workloads=workloads,
            next_seq=next_seq,
            next_ordinal=self.next_ordinal,
            slices_by_type=self.slices_by_type,
            holders=self.holders,
            unhealthy=frozenset(self.unhealthy),
            free_by_type=self._free.freeze(),
            class_members=self._members.freeze(),
            class_held=self.class_held,
        )
