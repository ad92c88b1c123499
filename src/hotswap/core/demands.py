"""Demands for slices and the queue a round serves them from, like Kueue's queue manager.

Demands are served in :func:`hotswap.core.ordering.demand_order`: priority, then replacements,
queued workloads and elastic growth, then FIFO. The queue holds two kinds of items:

- explicit demands: replacements for lost slices, and workloads preempted in this round;
- one *bucket* per (kind, device type, priority) for the queued workloads (from the
  ``queued`` index) and the elastic workloads below their size (``growable``). A bucket
  stands in the queue at the order of the first of its workloads that could be served; when
  it comes up it hands out that workload's demand. The others are never looked at: a queued
  workload fits when the slices free or held by strictly lower priorities
  (:meth:`Room.admissible`) cover its floor, and the index groups queued workloads by size,
  so the first one that fits is found without trying those that do not.

A demand that cannot be served now is parked, like Kueue's inadmissible workloads, and comes
back (and every bucket of the type is looked at again from its start) as soon as capacity of
its device type is freed later in the round: an eviction, a shrink, a requeue. Nothing else
can make a refused demand fit within a round, so the result is the same as trying every
workload in order, at the cost of the few that are served.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import heapq
import itertools
import operator
from collections.abc import Iterator
from typing import Any, Protocol

from hotswap.core.index import Level, QueueKey, WorkloadIndex
from hotswap.core.workload import Workload
from hotswap.core.ordering import DemandKind, demand_order

_Order = tuple[int, int, int]
_FLOOR = operator.itemgetter(3)  # of a queue key
_SIZE = operator.itemgetter(2)  # of a queue key
_ADMIT, _GROW = DemandKind.ADMIT, DemandKind.GROW  # (as constants: see hotswap.core.admission)


@dataclasses.dataclass(slots=True)
class Demand:
    workload: str
    kind: DemandKind
    want: int  # slices it would like
    need: int  # fewest that make the demand worth serving
    # For replacements: the slices it had before the loss and the replica indices it lost there
    # (survivors keep theirs), and whether it restarts (non-elastic) or scales (elastic,
    # survivors keep running).
    previous: tuple[str, ...] = ()
    lost_at: tuple[int, ...] = ()
    restart: bool = False
    reason: str = ""


class Room(Protocol):
    """What the round can give a demand now."""

    index: WorkloadIndex

    def admissible(self, device_type: str, priority: int) -> int: ...
    def free_count(self, device_type: str) -> int: ...


@dataclasses.dataclass(slots=True)
class _Group:
    """The queue keys of one level as of its bucket's last (re)queueing, each with what a workload
    under it needs and the index's sorted entries under it (:meth:`SortedPerKey.view`, taken
    again once ``copied`` says a key got a list of its own since)."""

    keys: tuple[QueueKey, ...]
    needs: tuple[int, ...]
    most: int  # the most any of them needs
    members: list[tuple[QueueKey, int, Any]] = dataclasses.field(default_factory=list)
    copied: int = -1


@dataclasses.dataclass(slots=True)
class _Bucket:
    kind: DemandKind
    level: Level
    generation: int = 0  # bumped at every wake: tokens of an older generation are stale


class DemandQueue:
    def __init__(self, room: Room, elastic: bool) -> None:
        """``elastic``: a queued workload needs only its floor (min_slices), else its size."""
        self._room = room
        self._elastic = elastic
        # Items: a Demand, or a bucket's token (bucket, generation).
        self._heap: list[tuple[_Order, int, Any]] = []
        # The counter keeps equal orders first-in first-out, and never compares items.
        self._counter = itertools.count()
        self._parked: dict[str, list[tuple[_Order, Demand]]] = {}
        self._buckets: dict[tuple[DemandKind, Level], _Bucket] = {}
        self._groups: dict[Level, _Group] = {}  # queue keys per level, as of its last (re)queueing
        self._opened = False
        self._grow = False
        self._no_grow: set[str] = set()
        self._deferred: set[str] | None = None  # types woken inside deferred_wakes()

    def push(self, demand: Demand, workload: Workload) -> None:
        self._push(demand_order(workload, demand.kind), demand)

    def _push(self, order: _Order, item: Any) -> None:
        heapq.heappush(self._heap, (order, next(self._counter), item))

    def open(self, grow: bool, no_grow: set[str]) -> None:
        """Queue the buckets of queued (and, with ``grow``, growable) workloads.

        ``no_grow`` names workloads that must not grow in this round (those being replaced)."""
        self._opened = True
        self._grow = grow
        self._no_grow = set(no_grow)
        self._requeue_buckets(None)

    def _requeue_buckets(self, device_type: str | None) -> None:
        """Queue again, from their start, the buckets of ``device_type`` (None: of every type)
        in which a workload could be served now; the others wait for the next wake."""
        room = self._room
        elastic = self._elastic
        admissible = room.admissible
        need_of = _FLOOR if elastic else _SIZE
        for level, keys in sorted(room.index.queue_levels.items()):
            if device_type is not None and level[0] != device_type:
                continue
            # The least any of them needs: its floor when elastic, else its size (keys sort by size).
            least = min(map(_FLOOR, keys)) if elastic else keys[0][2]
            if least <= admissible(level[0], level[1]):
                keys = tuple(keys)  # (a copy: the round may change the index's)
                needs = tuple(map(need_of, keys))
                self._groups[level] = _Group(keys, needs, max(needs))
                self._reset(_ADMIT, level)
        if self._grow:
            for level in sorted(room.index.growable.keys()):
                if (device_type is None or level[0] == device_type) and room.free_count(level[0]):
                    self._reset(_GROW, level)

    def _reset(self, kind: DemandKind, level: Level) -> None:
        bucket = self._buckets.get((kind, level))
        if bucket is None:
            bucket = self._buckets[(kind, level)] = _Bucket(kind, level)
        bucket.generation += 1
        self._push((-level[1], int(kind), -1), (bucket, bucket.generation))

    def pop(self) -> Demand | None:
        """The next demand to serve, None when there is none."""
        heap = self._heap
        while heap:
            order, _, item = heapq.heappop(heap)
            if isinstance(item, Demand):
                return item
            bucket, generation = item
            if generation != bucket.generation:
                continue  # superseded by a wake
            found = self._first_fit(bucket, order[2])
            if found is None:
                continue  # nothing fits: asleep until capacity of its type is freed
            seq, demand = found
            first = (order[0], order[1], seq)
            if heap and heap[0][0] < first:
                self._push(first, item)  # something else comes first
                continue
            # Served now; the bucket comes back after it (from where the next one may be).
            self._push((order[0], order[1], seq + 1), item)
            if demand.kind is _GROW:
                self._no_grow.add(demand.workload)
            return demand
        return None

    def _first_fit(self, bucket: _Bucket, start: int) -> tuple[int, Demand] | None:
        """The bucket's first workload from ``start`` (a seq) on that could be served now."""
        room = self._room
        device_type, priority = bucket.level
        if bucket.kind is _GROW:
            if not room.free_count(device_type):
                return None
            entries = room.index.growable.view(bucket.level)
            for seq, name in entries[bisect.bisect_left(entries, (start,)) :]:
                if name not in self._no_grow:
                    # want is set when it is served (what it misses then)
                    return seq, Demand(name, _GROW, 0, 1)
            return None
        group = self._groups.get(bucket.level)
        if group is None:
            return None
        # What is free is enough to tell when every workload fits (the usual case of a round
        # that admits many); what lower priorities hold is counted only when it is not.
        room_now = room.free_count(device_type)
        if room_now < group.most:
            room_now = room.admissible(device_type, priority)
        # The least entry from ``start`` on under the keys whose workloads fit (this runs at
        # every admission: the keys' entries are held, not looked up again).
        queued = room.index.queued
        if group.copied != queued.copied:
            group.members = [(key, need, queued.view(key)) for key, need in zip(group.keys, group.needs)]
            group.copied = queued.copied
        probe = (start,)
        best: Any = None
        for member in group.members:
            entries = member[2]
            if member[1] <= room_now:
                at = bisect.bisect_left(entries, probe)
                if at < len(entries) and (best is None or entries[at] < best[0]):
                    best = entries[at], member
        if best is None:
            return None
        (seq, name), (key, need, _) = best
        return seq, Demand(name, _ADMIT, key[2], need)

    @contextlib.contextmanager
    def deferred_wakes(self) -> Iterator[None]:
        """Wake once, at the end, for capacity freed inside the block.

        A demand that evicts several victims frees their slices one by one and takes them at
        once: what it leaves free is what may help others, and nothing it frees is looked at
        before it is done anyway (the queue is served one demand at a time)."""
        self._deferred = set()
        try:
            yield
        finally:
            woken, self._deferred = self._deferred, None
            for device_type in sorted(woken):
                self.wake(device_type)

    def park(self, demand: Demand, workload: Workload) -> None:
        """Keep a demand that cannot be served until capacity of its type is freed."""
        self._parked.setdefault(workload.device_type, []).append((demand_order(workload, demand.kind), demand))

    def wake(self, device_type: str) -> None:
        """Capacity of ``device_type`` was freed: its parked demands and buckets are queued again."""
        if self._deferred is not None:
            self._deferred.add(device_type)
            return
        for order, demand in self._parked.pop(device_type, []):
            self._push(order, demand)
        if self._opened:
            self._requeue_buckets(device_type)
