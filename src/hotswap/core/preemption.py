"""Choosing what to take from lower-priority work: shrink first, then a minimal victim set.

Pure and separate from the scheduler so that it can be tested on its own, as Kueue tests its
preemption targets. :func:`plan_reclaim` chooses from :class:`Candidates`: every strictly
lower-priority holder of the wanted device type, in
:func:`hotswap.core.ordering.candidates_ordering` order, read lazily. The scheduler's
:class:`RankedCandidates` reads them from the ranking index (:mod:`hotswap.core.index`), so a
plan costs the few candidates it looks at, not the number of holders: every victim frees at
least one slice more than the shrinks it forgoes, so a plan for ``deficit`` slices never looks
at more than ``deficit`` victims.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
from collections.abc import Iterator
from typing import Protocol

from hotswap.core.capacity import Capacity
from hotswap.core.index import INF, SHRINKABLE, RankKey, WorkloadIndex, shrink_room
from hotswap.core.ordering import newest_first_ordering
from hotswap.core.workload import Workload


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """A strictly lower-priority workload holding slices of the wanted device type."""

    workload: Workload
    healthy: int  # healthy slices it frees if evicted
    shrinkable: int  # slices it can give up by scaling down (elastic, above min_slices)


@dataclasses.dataclass(frozen=True, slots=True)
class ReclaimPlan:
    victims: tuple[Workload, ...]  # evicted whole
    shrinks: tuple[tuple[Workload, int], ...]  # (workload, slices it gives up)


class Candidates(Protocol):
    """The holders a plan may take from, in candidates order (lowest priority first)."""

    @property
    def shrink_pool(self) -> int:
        """Slices all of them together could give up by shrinking."""

    def in_order(self) -> Iterator[Candidate]:
        """Every candidate that holds a healthy slice."""

    def shrinkable_in_order(self) -> Iterator[Candidate]:
        """The candidates that can shrink."""


def plan_reclaim(deficit: int, candidates: Candidates) -> ReclaimPlan | None:
    """Free ``deficit`` slices from ``candidates``, or return None when they cannot.

    Rules, in order:
    1. shrink before evict: if elastic candidates can give up enough slices, nobody is evicted;
    2. otherwise evict candidates in :func:`candidates_ordering` order until the victims' slices
       plus what the remaining elastic candidates can give up cover the deficit;
    3. the victim set is minimal: every victim whose eviction turns out unnecessary (checked
       from the last added backwards, as Kueue does) is spared;
    4. the rest of the deficit is covered by shrinking, again in candidates order.
    """
    if deficit <= 0:
        return ReclaimPlan((), ())
    shrink_pool = candidates.shrink_pool
    if shrink_pool >= deficit:
        return ReclaimPlan((), _shrinks(candidates.shrinkable_in_order(), deficit, excluded=set()))

    victims: list[Candidate] = []
    freed = 0
    for candidate in candidates.in_order():
        victims.append(candidate)
        freed += candidate.healthy
        shrink_pool -= candidate.shrinkable
        if freed + shrink_pool >= deficit:
            break
    else:
        return None

    # The last victim added is needed (we stopped right after it); try sparing each earlier one.
    for index in range(len(victims) - 2, -1, -1):
        spared = victims[index]
        if freed - spared.healthy + shrink_pool + spared.shrinkable >= deficit:
            victims.pop(index)
            freed -= spared.healthy
            shrink_pool += spared.shrinkable

    remaining = deficit - freed
    shrinks: tuple[tuple[Workload, int], ...] = ()
    if remaining > 0:
        excluded = {c.workload.name for c in victims}
        shrinks = _shrinks(candidates.shrinkable_in_order(), remaining, excluded)
    return ReclaimPlan(tuple(c.workload for c in victims), shrinks)


def _shrinks(ordered: Iterator[Candidate], deficit: int, excluded: set[str]) -> tuple[tuple[Workload, int], ...]:
    taken: list[tuple[Workload, int]] = []
    for candidate in ordered:
        if deficit <= 0:
            break
        if candidate.workload.name in excluded or candidate.shrinkable == 0:
            continue
        give = min(candidate.shrinkable, deficit)
        taken.append((candidate.workload, give))
        deficit -= give
    return tuple(taken)


class RankedCandidates:
    """Strictly lower-priority holders of a device type, read from the ranking index.

    A holder's shrinkable slices are its slices above its floor when it runs, elastic, and
    holds no broken slice: an elastic workload gives up its *last* replicas (so the others keep
    their indices), and one that still holds a broken slice is in the middle of a loss, not a
    donor (its last replicas might be the broken ones, which free nothing)."""

    def __init__(
        self, capacity: Capacity, index: WorkloadIndex, workload: Workload, now: float, elastic: bool
    ) -> None:
        self._capacity = capacity
        self._now = now
        self._elastic = elastic
        device_type, priority = workload.spec.device_type, int(workload.spec.priority)
        self._keys: dict[int, list[RankKey]] = {}
        for key in sorted(index.ranked.keys()):
            if key[0] == device_type and key[1] < priority:
                self._keys.setdefault(key[1], []).append(key)
        self._ranked = index.ranked
        self._broken = capacity.broken_by_holder()
        pool = 0
        if elastic:
            pool = sum(index.shrinkable((device_type, level)) for level in self._keys)
            for name in self._broken:  # their room was counted in the index: take it back
                holder = capacity.workloads[name]
                if holder.spec.device_type == device_type and int(holder.spec.priority) < priority:
                    pool -= shrink_room(holder)
        self._pool = pool

    @property
    def shrink_pool(self) -> int:
        return self._pool

    def _candidate(self, name: str) -> Candidate:
        workload = self._capacity.workloads[name]
        broken = self._broken.get(name, 0)
        shrinkable = shrink_room(workload) if self._elastic and not broken else 0
        return Candidate(workload, len(workload.slices) - broken, shrinkable)

    def _level(self, keys: list[RankKey]) -> Iterator[str]:
        """Names of one priority level's holders under ``keys``, in candidates order."""
        streams = [self._stream(key) for key in keys]
        if len(streams) == 1:
            return (name for _, name in streams[0])
        return (name for _, name in heapq.merge(*streams))

    def _stream(self, key: RankKey) -> Iterator[tuple[tuple[float, float, int], str]]:
        entries = self._ranked.view(key)
        period = key[3]
        if not period:
            now = self._now
            return (((now + e[0], e[1], e[2]), e[3]) for e in entries)
        return _rotated(entries, period, self._now)

    def in_order(self) -> Iterator[Candidate]:
        for level in sorted(self._keys):
            for name in self._level(self._keys[level]):
                candidate = self._candidate(name)
                if candidate.healthy > 0:
                    yield candidate

    def shrinkable_in_order(self) -> Iterator[Candidate]:
        if not self._elastic:
            return
        for level in sorted(self._keys):
            keys = [k for k in self._keys[level] if k[2] == SHRINKABLE]
            for name in self._level(keys):
                candidate = self._candidate(name)
                if candidate.shrinkable > 0:
                    yield candidate


class NewestFirstCandidates:
    """The same holders as ``ranked``, offered for eviction newest first within a priority level
    (Kueue's order, :func:`hotswap.core.ordering.newest_first_ordering`) instead of least lost
    work first. Shrinking is offered as before. For the comparison of the two rules only
    (``SchedulerConfig.victims``): it reads every candidate and sorts them, where the ranking
    reads a few."""

    def __init__(self, ranked: RankedCandidates) -> None:
        self._ranked = ranked

    @property
    def shrink_pool(self) -> int:
        return self._ranked.shrink_pool

    def in_order(self) -> Iterator[Candidate]:
        return iter(sorted(self._ranked.in_order(), key=lambda c: newest_first_ordering(c.workload)))

    def shrinkable_in_order(self) -> Iterator[Candidate]:
        return self._ranked.shrinkable_in_order()


def _rotated(entries: tuple | list, period: float, now: float) -> Iterator[tuple[tuple[float, float, int], str]]:
    """Holders that save every ``period`` seconds, least progress since their last save first:
    entries sorted by ``anchor % period``, read backwards from ``now % period``, wrapping."""
    phase = now % period
    split = bisect.bisect_right(entries, (phase, INF))
    for index in itertools.chain(range(split - 1, -1, -1), range(len(entries) - 1, split - 1, -1)):
        anchor_phase, started, seq, name = entries[index]
        yield ((phase - anchor_phase) % period, -started, -seq), name
