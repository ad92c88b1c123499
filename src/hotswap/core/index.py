"""Indexes of workloads that let a round look only at what could have changed.

Kueue keeps its pending workloads in queues and its admitted ones in a cache, so a scheduling
cycle never rescans everything. These are hotswap's equivalents, derived from the workload
records and kept up to date by :class:`WorkloadIndex` at every transition
(:meth:`hotswap.core.round_state.RoundState.update`):

- ``queued``: queued workloads per (device type, priority, num_slices, floor_slices), FIFO,
  and ``queue_levels``: which of those keys hold workloads, per (device type, priority), sorted.
  Grouping by what a workload needs lets admission find the first one that fits without
  trying the others (:mod:`hotswap.core.demands`).
- ``growable``: elastic workloads holding fewer slices than they asked for, per (device
  type, priority), FIFO.
- ``restarting``: workloads that hold slices and wait to start their workers.
- ``ranked``: workloads holding slices per :data:`RankKey`, in preemption order (the order
  of :func:`hotswap.core.ordering.candidates_ordering` within one key), so that choosing
  victims reads the cheapest few instead of sorting every holder.
- ``shrinkable``: slices that running elastic workloads above their floor could give up,
  per (device type, priority).

Ranking. A workload whose workers run is ranked by when it last saved its progress (its
start, or its last checkpoint), then by when it started, then newest first. Most workloads
report each checkpoint; their rank does not change between reports, so they sit in one
sorted tuple (``period`` 0). A workload that declared a checkpoint period (a
:class:`~hotswap.core.events.CheckpointRecorded` with ``every``) saves at ``anchor + k *
every`` without reporting each save; its rank changes with time, but only as a rotation:
sorted by ``anchor % every``, the order at time ``now`` starts just below ``now % every``
and wraps around. Such workloads sit in one sorted tuple per period.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from hotswap.api.phases import WorkloadPhase
from hotswap.core.cow import OwnedSortedPerKey, SortedPerKey
from hotswap.core.records import fast_init
from hotswap.core.workload import Workload

QUEUED = WorkloadPhase.QUEUED
RUNNING = WorkloadPhase.RUNNING
RESTARTING = WorkloadPhase.RESTARTING
INF = float("inf")

# Kinds of holders within one priority level of a device type.
RIGID = 0  # not elastic: it can only be evicted
ELASTIC = 1  # elastic, but cannot give up slices now (at its floor, or workers not running)
SHRINKABLE = 2  # elastic, running above its floor

Level = tuple[str, int]  # (device type, priority value)
QueueKey = tuple[str, int, int, int]  # (device type, priority value, num_slices, floor_slices)
RankKey = tuple[str, int, int, float]  # (device type, priority value, kind, period; 0: none)
Entry = tuple  # (seq, name) in queues; see rank_of for ranks


# The index functions run at every transition of every workload: they read the spec's fields
# directly (``elastic`` and ``floor_slices`` of WorkloadSpec, spelled out) instead of calling
# its properties. A queued workload's key: (device type, priority, num_slices, floor_slices).


def grow_key(workload: Workload) -> Level | None:
    spec = workload.spec
    held = len(workload.slices)
    if held and spec.min_slices is not None and spec.min_slices < spec.num_slices and held < spec.num_slices:
        return (spec.device_type, int(spec.priority))
    return None


def rank_of(workload: Workload) -> tuple[RankKey, Entry] | None:
    """Where a workload holding slices sits in the preemption ranking (None if it holds none).

    Entries with period 0 sort as ``(-saved, -started, -seq, name)``: the latest save first;
    a workload whose workers have not started has nothing to lose and comes before all.
    Entries with a period sort as ``(anchor % period, started, seq, name)``, read backwards
    from ``now % period`` (see the module docstring)."""
    if not workload.slices:
        return None
    spec = workload.spec
    name = spec.name
    priority = int(spec.priority)
    floor = spec.min_slices
    running = workload.phase is RUNNING
    if floor is not None and floor < spec.num_slices:
        kind = SHRINKABLE if running and len(workload.slices) > floor else ELASTIC
    else:
        kind = RIGID
    started = workload.running_since
    if not running or started is None:
        return (spec.device_type, priority, kind, 0.0), (-INF, -INF, -workload.seq, name)
    saved = workload.last_checkpoint_at
    every = workload.checkpoint_every
    if saved is not None and every and saved >= started:
        return (spec.device_type, priority, kind, every), (saved % every, started, workload.seq, name)
    since = saved if saved is not None and saved > started else started
    return (spec.device_type, priority, kind, 0.0), (-since, -started, -workload.seq, name)


def shrink_room(workload: Workload) -> int:
    """Slices a running elastic workload above its floor could give up (its rank says so)."""
    spec = workload.spec
    floor = spec.min_slices
    if floor is not None and floor < spec.num_slices and workload.phase is RUNNING and workload.slices:
        return max(0, len(workload.slices) - floor)
    return 0


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Indexes:
    """The frozen indexes of a snapshot (see the module docstring)."""

    queued: Mapping[QueueKey, tuple[Entry, ...]] = dataclasses.field(default_factory=dict)
    queue_levels: Mapping[Level, tuple[QueueKey, ...]] = dataclasses.field(default_factory=dict)
    growable: Mapping[Level, tuple[Entry, ...]] = dataclasses.field(default_factory=dict)
    restarting: frozenset[str] = frozenset()
    ranked: Mapping[RankKey, tuple[Entry, ...]] = dataclasses.field(default_factory=dict)
    shrinkable: Mapping[Level, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def build(cls, workloads: Mapping[str, Workload]) -> Indexes:
        index = WorkloadIndex(cls())
        for workload in workloads.values():
            index.replace(None, workload)
        return index.freeze()

    def comparable(self) -> tuple:
        """The indexes as plain values, empty entries left out (to compare two of them)."""
        return (
            {k: tuple(v) for k, v in self.queued.items() if v},
            {k: tuple(v) for k, v in self.queue_levels.items() if v},
            {k: tuple(v) for k, v in self.growable.items() if v},
            self.restarting,
            {k: tuple(v) for k, v in self.ranked.items() if v},
            {k: v for k, v in self.shrinkable.items() if v},
        )


class WorkloadIndex:
    """The indexes during one round: copy-on-write over a snapshot's :class:`Indexes`."""

    def __init__(self, frozen: Indexes, consume: bool = False) -> None:
        """``consume``: the caller gave ``frozen`` up; its tuples change in place (hotswap.core.cow)."""
        sorted_per_key = OwnedSortedPerKey if consume else SortedPerKey
        self.queued = sorted_per_key(frozen.queued)
        self.queue_levels = sorted_per_key(frozen.queue_levels)
        self.growable = sorted_per_key(frozen.growable)
        self.ranked = sorted_per_key(frozen.ranked)
        self._restarting_original = frozen.restarting
        self._restarting: set[str] | None = None
        self._shrinkable_original = frozen.shrinkable
        self._shrinkable: dict[Level, int] | None = None

    @property
    def restarting(self) -> frozenset[str] | set[str]:
        return self._restarting if self._restarting is not None else self._restarting_original

    def shrinkable(self, level: Level) -> int:
        source = self._shrinkable if self._shrinkable is not None else self._shrinkable_original
        return source.get(level, 0)

    def replace(self, old: Workload | None, new: Workload | None) -> None:
        """A workload's record changed from ``old`` to ``new`` (None: absent)."""
        if old is not None and new is not None and old.phase is new.phase and old.slices is new.slices:
            # Same phase and slices (a checkpoint, a new attempt's start time): only its rank.
            self._move(self.ranked, rank_of(old), rank_of(new))
            return
        was = _places(old)
        now = _places(new)
        if was[0] != now[0]:
            self._move_queued(was[0], now[0])
        if was[1] != now[1]:
            self._move(self.growable, was[1], now[1])
        if was[2] != now[2]:
            self._move(self.ranked, was[2], now[2])
        if was[3] != now[3]:
            if self._restarting is None:
                self._restarting = set(self._restarting_original)
            if new is not None and now[3]:
                self._restarting.add(new.name)
            elif old is not None:
                self._restarting.discard(old.name)
        if was[4] or now[4]:
            self._shrink_add(old, -was[4])
            self._shrink_add(new, now[4])

    def _move_queued(self, old: tuple[QueueKey, Entry] | None, new: tuple[QueueKey, Entry] | None) -> None:
        """Move a queue entry, and keep ``queue_levels`` to the keys that hold entries."""
        if old == new:
            return
        if old is not None and self.queued.discard(old[0], old[1]):
            key = old[0]
            self.queue_levels.discard((key[0], key[1]), key)
        if new is not None and self.queued.add(new[0], new[1]):
            key = new[0]
            self.queue_levels.add((key[0], key[1]), key)

    @staticmethod
    def _move(target: SortedPerKey, old: tuple | None, new: tuple | None) -> None:
        if old == new:
            return
        if old is not None:
            target.discard(old[0], old[1])
        if new is not None:
            target.add(new[0], new[1])

    def _shrink_add(self, workload: Workload | None, count: int) -> None:
        if workload is None or not count:
            return
        if self._shrinkable is None:
            self._shrinkable = dict(self._shrinkable_original)
        level = (workload.spec.device_type, int(workload.spec.priority))
        self._shrinkable[level] = self._shrinkable.get(level, 0) + count

    def freeze(self) -> Indexes:
        restarting = self._restarting
        return Indexes(
            queued=self.queued.freeze(),
            queue_levels=self.queue_levels.freeze(),
            growable=self.growable.freeze(),
            restarting=frozenset(restarting) if restarting is not None else self._restarting_original,
            ranked=self.ranked.freeze(),
            shrinkable=self._shrinkable if self._shrinkable is not None else self._shrinkable_original,
        )


_NOWHERE = (None, None, None, False, 0)


def _places(workload: Workload | None) -> tuple:
    """Where a workload stands in each index, in one pass (this runs twice per transition):
    (queue key and entry, growable level and entry, rank key and entry, restarting, shrink room)."""
    if workload is None:
        return _NOWHERE
    spec = workload.spec
    phase = workload.phase
    if phase is QUEUED:
        floor = spec.min_slices if spec.min_slices is not None else spec.num_slices
        queue = ((spec.device_type, int(spec.priority), spec.num_slices, floor), (workload.seq, spec.name))
        return (queue, None, None, False, 0)
    if not workload.slices:
        return _NOWHERE
    grow = grow_key(workload)
    return (
        None,
        None if grow is None else (grow, (workload.seq, spec.name)),
        rank_of(workload),
        phase is RESTARTING,
        shrink_room(workload),
    )
