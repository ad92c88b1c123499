"""Which slices a demand gets and where each replica runs, like Kueue's flavor assigner.

``Workload.slices[i]`` runs replica ``i`` (JobSet's ``JOB_INDEX``), so the order of a
workload's slices is part of what the core decides: survivors keep their positions through a
hotswap, elastic scale-downs give up the last replicas, and growth appends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from hotswap.core.capacity import Capacity
from hotswap.core.model import Workload, holder_class


@dataclasses.dataclass(frozen=True, slots=True)
class Assignment:
    """What a demand gets: free slices now, and how many to take from lower-priority work."""

    free: tuple[str, ...]  # free healthy slices, already taken from the pool
    reclaim: int  # slices still to free by preempting or shrinking strictly lower priorities


def assign(capacity: Capacity, workload: Workload, want: int, need: int, may_reclaim: bool) -> Assignment | None:
    """Slices for a demand of ``want`` slices of which ``need`` are the fewest worth having.

    Free healthy slices come first, lowest ordinal first. What they leave short is reclaimed
    from strictly lower-priority holders when ``may_reclaim`` and only when that reaches
    ``need``, so no one is evicted for a demand that could not be served anyway. Returns None,
    with nothing taken, when the demand gets no slice or fewer than ``need``.
    """
    free = capacity.take_free(workload.device_type, want)
    reclaim = 0
    if len(free) < want and may_reclaim:
        target = min(want - len(free), capacity.reclaimable(holder_class(workload)))
        if len(free) + target >= need:
            reclaim = target
    if (free or reclaim) and len(free) + reclaim >= need:
        return Assignment(tuple(free), reclaim)
    capacity.return_free(workload.device_type, free)
    return None


def fill_positions(previous: tuple[str, ...], kept: tuple[str, ...], got: tuple[str, ...]) -> tuple[str, ...]:
    """Keep each surviving slice at its replica index; replacements take the lost indices."""
    kept_set = set(kept)
    replacements = iter(got)
    slices: list[str] = []
    for name in previous:
        if name in kept_set:
            slices.append(name)
        else:
            nxt = next(replacements, None)
            if nxt is not None:
                slices.append(nxt)
    slices.extend(replacements)
    return tuple(slices)


def split_healthy(slices: tuple[str, ...], healthy: Callable[[str], bool]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The slices that survive a loss (in replica order) and those that are gone."""
    return tuple(s for s in slices if healthy(s)), tuple(s for s in slices if not healthy(s))


def give_up_last(slices: tuple[str, ...], count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """An elastic workload shrinking by ``count``: the last replicas leave, so the others keep
    their indices. Returns the slices kept and the slices given up."""
    cut = len(slices) - count
    return slices[:cut], slices[cut:]
