"""How a demand gets its slices and which replica runs where, like Kueue's flavor assigner.

The core writes the assignment, the backends apply it (Kueue's split: the scheduler assigns, the
job side enacts). A workload's :attr:`~hotswap.core.workload.Workload.replica_map` says which
slice runs each replica index (JobSet's ``JOB_INDEX``). Every (re)start places replica ``i`` on
``slices[i]``: survivors keep their positions through a hotswap (:func:`fill_positions`). An
elastic scale-down parks the replicas it removes and the others keep their indexes
(:func:`shrink_map`; a shrink for higher-priority work gives up the last replicas,
:func:`give_up_last`), and a grow-back's joiners take the parked indexes, lowest first
(:func:`grow_map`). The actions carry the map after them, so a backend never works it out.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the store's codec reads maps with this module: it need not load the round's capacity
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


class ReplicaMap(tuple[str | None, ...]):
    """A replica map: replica index -> its slice (None: parked), no None at the end; equal to the
    plain tuple of the same slices. It carries its parked indexes (ascending) so that a grow-back
    finds them without walking a map of thousands of replicas: a change costs what it changes
    (and one copy of the map), not a scan of it."""

    parked: tuple[int, ...]


def parked_indexes(replicas: Sequence[str | None]) -> tuple[int, ...]:
    """The indexes of a map's parked replicas, ascending: kept with a :class:`ReplicaMap`, found
    by a scan in any other map (a workload's own slices, a test's tuple)."""
    if isinstance(replicas, ReplicaMap):
        return replicas.parked
    return tuple(i for i, name in enumerate(replicas) if name is None) if None in replicas else ()


def shrink_map(replicas: Sequence[str | None], gone: Collection[str]) -> tuple[ReplicaMap, tuple[int, ...]]:
    """The replica map once the replicas on ``gone`` (each in ``replicas``) are parked, the
    others keeping their indexes; and the indexes parked, in order."""
    parked = tuple(sorted(replicas.index(name) for name in gone))
    after = list(replicas)
    for index in parked:
        after[index] = None
    return _with_parked(after, sorted(parked_indexes(replicas) + parked)), parked


def grow_map(replicas: Sequence[str | None], added: Sequence[str]) -> ReplicaMap:
    """The replica map once ``added`` join: each takes a parked index, lowest first, in order;
    those left over take the indexes after the last."""
    parked = parked_indexes(replicas)
    after = list(replicas)
    for index, joiner in zip(parked, added):
        after[index] = joiner
    after.extend(added[len(parked) :])
    return _with_parked(after, list(parked[len(added) :]))


def kept_map(replicas: ReplicaMap, slices: tuple[str, ...]) -> ReplicaMap | None:
    """What :attr:`Workload.replicas <hotswap.core.workload.Workload.replicas>` keeps of a map:
    None when it is the slices' own (replica i on slices[i]), so one map has one form."""
    return None if replicas == slices else replicas


def recorded_map(recorded: object, slices: tuple[str, ...], size: int) -> ReplicaMap | None:
    """The :attr:`Workload.replicas <hotswap.core.workload.Workload.replicas>` of a stored map
    (a record's ``replicas``: a list, padded with None to the workload's size or not). A record
    without one (an earlier release's), or with one that is not a map of exactly ``slices``
    within ``size`` indexes (edited by hand), gets the slices' own map."""
    if not isinstance(recorded, list) or not all(s is None or isinstance(s, str) for s in recorded):
        return None
    replicas = _trimmed(recorded)
    placed = [s for s in replicas if s is not None]
    if len(replicas) > size or len(placed) != len(slices) or set(placed) != set(slices):
        return None
    return kept_map(replicas, slices)


def _trimmed(replicas: Sequence[str | None]) -> ReplicaMap:
    return _with_parked(list(replicas), [i for i, name in enumerate(replicas) if name is None])


def _with_parked(replicas: list[str | None], parked: list[int]) -> ReplicaMap:
    """``replicas`` without its trailing parked indexes, carrying ``parked`` (ascending: exactly
    the indexes of its Nones)."""
    end = len(replicas)
    while parked and parked[-1] == end - 1:
        parked.pop()
        end -= 1
    if end < len(replicas):
        del replicas[end:]
    trimmed = ReplicaMap(replicas)
    trimmed.parked = tuple(parked)
    return trimmed
