"""Choosing what to take from lower-priority work: shrink first, then a minimal victim set.

Pure and separate from the scheduler so that it can be tested on its own, as Kueue tests its
preemption targets: :func:`find_candidates` lists the holders a plan may touch (from the
capacity indexes), :func:`plan_reclaim` chooses among them.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterator, Sequence

from hotswap.api.phases import WorkloadPhase
from hotswap.core.capacity import Capacity
from hotswap.core.model import HOLDING, Workload, holder_class
from hotswap.core.ordering import candidates_ordering

_RUNNING = WorkloadPhase.RUNNING  # looked up once: a class attribute of an enum is slow to read


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


def find_candidates(capacity: Capacity, workload: Workload, deficit: int, now: float, elastic: bool) -> list[Candidate]:
    """Strictly lower-priority holders of the workload's type that a plan may need.

    The plan evicts in :func:`candidates_ordering` order, lowest priority first, and every
    victim frees at least one slice, so it never evicts more than ``deficit`` workloads:
    from the lowest levels only the ``deficit`` cheapest are listed, and once they cover
    the deficit the higher levels can only contribute by shrinking, so only elastic
    holders are listed there. Every elastic holder that can shrink is listed (shrinks go
    in the same order across levels). The plan is the same as over every holder. With
    ``elastic`` off (the cluster does not scale workloads), nobody can shrink.
    """
    key = holder_class(workload)
    device_type = key[0]
    broken = capacity.broken_by_holder()
    found: list[Candidate] = []
    covered = 0
    for level in capacity.levels_below(key):
        evictable: list[Candidate] = []
        for members_key in ((device_type, level, False), (device_type, level, True)):
            if covered >= deficit and not (members_key[2] and elastic):
                continue
            for name in capacity.members(members_key):
                other = capacity.workloads[name]
                if other.phase not in HOLDING:
                    continue
                healthy = len(other.slices) - broken.get(name, 0)
                if healthy <= 0:
                    continue
                shrinkable = 0
                if members_key[2] and elastic and other.phase is _RUNNING:
                    shrinkable = max(0, min(healthy, len(other.slices) - other.spec.floor_slices))
                candidate = Candidate(other, healthy, shrinkable)
                if covered < deficit:
                    evictable.append(candidate)
                elif shrinkable:
                    found.append(candidate)
        if evictable:
            need = deficit - covered
            cheapest = heapq.nsmallest(need, evictable, key=lambda c: candidates_ordering(c.workload, now))
            chosen = {id(c) for c in cheapest}
            found.extend(cheapest)
            found.extend(c for c in evictable if c.shrinkable and id(c) not in chosen)
            covered += sum(c.healthy for c in cheapest)
    return found


def plan_reclaim(deficit: int, candidates: Sequence[Candidate], now: float) -> ReclaimPlan | None:
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
    shrink_pool = sum(c.shrinkable for c in candidates)
    if shrink_pool >= deficit:
        shrinkable = sorted((c for c in candidates if c.shrinkable), key=lambda c: candidates_ordering(c.workload, now))
        return ReclaimPlan((), _shrinks(shrinkable, deficit, excluded=set()))

    victims: list[Candidate] = []
    freed = 0
    for candidate in _in_order(candidates, now):
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

    excluded = {id(c) for c in victims}
    remaining = deficit - freed
    shrinks: tuple[tuple[Workload, int], ...] = ()
    if remaining > 0:
        shrinkable = sorted((c for c in candidates if c.shrinkable), key=lambda c: candidates_ordering(c.workload, now))
        shrinks = _shrinks(shrinkable, remaining, excluded)
    return ReclaimPlan(tuple(c.workload for c in victims), shrinks)


def _in_order(candidates: Sequence[Candidate], now: float) -> Iterator[Candidate]:
    """Candidates in :func:`candidates_ordering` order, sorting one priority level at a time.

    The ordering is priority first, so a plan that is covered by the lowest levels never pays
    for sorting the others (at 2,000 workloads this is most of a decision's time).
    """
    levels: dict[int, list[Candidate]] = {}
    for candidate in candidates:
        levels.setdefault(int(candidate.workload.spec.priority), []).append(candidate)
    for level in sorted(levels):
        yield from sorted(levels[level], key=lambda c: candidates_ordering(c.workload, now))


def _shrinks(
    ordered: Sequence[Candidate], deficit: int, excluded: set[int]
) -> tuple[tuple[Workload, int], ...]:
    taken: list[tuple[Workload, int]] = []
    for candidate in ordered:
        if deficit <= 0:
            break
        if id(candidate) in excluded or candidate.shrinkable == 0:
            continue
        give = min(candidate.shrinkable, deficit)
        taken.append((candidate.workload, give))
        deficit -= give
    return tuple(taken)
