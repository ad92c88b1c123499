"""Every ordering the scheduler uses, each written down once.

Like Kueue's ``CandidatesOrdering`` these are sort keys: smaller sorts first.
"""

from __future__ import annotations

import enum
import math

from hotswap.core.index import RUNNING
from hotswap.core.workload import Workload


class DemandKind(enum.IntEnum):
    """What a demand for slices is for; the value breaks ties within one priority level."""

    REPLACE = 0  # a running workload lost slices: it already holds the rest, serve it first
    ADMIT = 1  # a queued workload
    GROW = 2  # an elastic workload below its size: after queued work of the same priority


def queue_order(workload: Workload) -> tuple[int, int]:
    """The queue: higher priority first, then first created first (FIFO within a level)."""
    return (-int(workload.priority), workload.seq)


def demand_order(workload: Workload, kind: DemandKind) -> tuple[int, int, int]:
    """Order in which a decision round serves demands for slices.

    Priority first (so no lower-priority demand is served while a higher one that fits
    waits), then replacements of running work, then queued work, then elastic growth, then FIFO.
    """
    return (-int(workload.priority), int(kind), workload.seq)


def candidates_ordering(workload: Workload, now: float) -> tuple[int, float, float, int]:
    """Order of preemption candidates: the first loses the least work.

    1. lowest priority first;
    2. then the least progress since its last save (:func:`at_risk`: what a stop would throw
       away); a workload whose workers have not started has nothing to lose and comes first;
    3. then the most recently started (it has invested the least in start-up);
    4. then the newest workload (deterministic tie-break).

    :mod:`hotswap.core.index` keeps holders in this order without sorting them each round.
    """
    if workload.phase is not RUNNING or workload.running_since is None:
        return (int(workload.priority), -math.inf, -math.inf, -workload.seq)
    return (int(workload.priority), at_risk(workload, now), -workload.running_since, -workload.seq)


def newest_first_ordering(workload: Workload) -> tuple[int, float, int]:
    """Kueue's order of preemption candidates, for comparison (``VictimOrder.NEWEST_FIRST``):
    lowest priority first, then the most recently admitted (here: whose workers started last;
    one whose workers have not started yet was admitted last), then the newest workload. What a
    stop would throw away plays no part."""
    started = workload.running_since
    return (int(workload.priority), -math.inf if started is None else -started, -workload.seq)


def at_risk(workload: Workload, now: float) -> float:
    """Seconds of progress a hard stop at ``now`` would lose: since its start or last save.

    With a declared checkpoint period the last save is the latest ``anchor + k * every``; the
    expression is the one :mod:`hotswap.core.index` ranks by, so both agree exactly."""
    started = workload.running_since
    assert started is not None
    saved = workload.last_checkpoint_at
    every = workload.checkpoint_every
    if saved is not None and every and saved >= started:
        return (now % every - saved % every) % every
    since = saved if saved is not None and saved > started else started
    return now - since
