"""Every ordering the scheduler uses, each written down once.

Like Kueue's ``CandidatesOrdering`` these are sort keys: smaller sorts first.
"""

from __future__ import annotations

import enum

from hotswap.core.model import Workload


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
    2. then the least progress since its last checkpoint (what a stop would throw away);
    3. then the most recently started (it has invested the least in start-up);
    4. then the newest workload (deterministic tie-break).
    A workload that holds slices but has not started its workers has no progress to lose and
    counts as started now.
    """
    started = workload.running_since if workload.running_since is not None else now
    return (int(workload.priority), workload.progress_since_checkpoint(now), -started, -workload.seq)
