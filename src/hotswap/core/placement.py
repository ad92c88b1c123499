"""How a demand gets its slices and where each replica runs, like Kueue's flavor assigner.

``Workload.slices[i]`` runs replica ``i`` (JobSet's ``JOB_INDEX``), so the order of a
workload's slices is part of what the core decides: survivors keep their positions through a
hotswap, elastic scale-downs give up the last replicas, and growth appends.
"""

from __future__ import annotations

from collections.abc import Collection

from hotswap.core.capacity import Capacity
from hotswap.core.workload import Workload


def reclaim_target(capacity: Capacity, workload: Workload, have: int, want: int, need: int) -> int:
    """How many slices a demand should take from strictly lower-priority work once it got
    ``have`` free slices (lowest ordinal first, :meth:`Capacity.take_free`) of the ``want``
    it asked for: what is missing, up to the healthy slices lower priorities hold; and 0 when
    even that would not reach ``need``, so that nobody is evicted for a demand that cannot be
    served anyway."""
    target = min(want - have, capacity.reclaimable(workload.spec.device_type, int(workload.spec.priority)))
    return target if have + target >= need else 0


def lost_positions(slices: tuple[str, ...], lost: Collection[str]) -> tuple[int, ...]:
    """Replica indices of the ``lost`` slices (each one of ``slices``), in order.

    A workload may hold thousands of slices and loses one or two at a time: they are found by
    position (a C-level scan per lost slice) rather than by testing every slice held."""
    return tuple(sorted(slices.index(name) for name in lost))


def split_at(slices: tuple[str, ...], positions: tuple[int, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The slices that survive a loss (in replica order) and those at ``positions``, gone."""
    if not positions:
        return slices, ()
    keep = list(slices)
    for position in reversed(positions):
        del keep[position]
    return tuple(keep), tuple(slices[p] for p in positions)


def fill_positions(previous: tuple[str, ...], lost_at: tuple[int, ...], got: tuple[str, ...]) -> tuple[str, ...]:
    """The slices of a workload restarted after a loss: each surviving slice keeps its replica
    index, replacements take the lost indices (lowest first), lost indices left without a
    replacement close up, and replacements left over are appended."""
    slices = list(previous)
    replacements = iter(got)
    unfilled = []
    for position in lost_at:
        replacement = next(replacements, None)
        if replacement is None:
            unfilled.append(position)
        else:
            slices[position] = replacement
    for position in reversed(unfilled):
        del slices[position]
    slices.extend(replacements)
    return tuple(slices)


def give_up_last(slices: tuple[str, ...], count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """An elastic workload shrinking by ``count``: the last replicas leave, so the others keep
    their indices. Returns the slices kept and the slices given up."""
    cut = len(slices) - count
    return slices[:cut], slices[cut:]
