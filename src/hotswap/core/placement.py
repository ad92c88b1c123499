"""How a demand gets its slices and where each replica runs, like Kueue's flavor assigner.

``Workload.slices[i]`` runs replica ``i`` (JobSet's ``JOB_INDEX``), so the order of a
workload's slices is part of what the core decides: survivors keep their positions through a
hotswap, elastic scale-downs give up the last replicas, and growth appends.
"""

from __future__ import annotations

from collections.abc import Callable

from hotswap.core.capacity import Capacity
from hotswap.core.model import Workload, holder_class


def reclaim_target(capacity: Capacity, workload: Workload, have: int, want: int, need: int) -> int:
    """How many slices a demand should take from strictly lower-priority work once it got
    ``have`` free slices (lowest ordinal first, :meth:`Capacity.take_free`) of the ``want``
    it asked for: what is missing, up to the healthy slices lower priorities hold; and 0 when
    even that would not reach ``need``, so that nobody is evicted for a demand that cannot be
    served anyway."""
    target = min(want - have, capacity.reclaimable(holder_class(workload)))
    return target if have + target >= need else 0


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
