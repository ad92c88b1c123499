"""Goodput accounting: where a workload's accelerator time went.

One ledger per workload, in slice-seconds: a workload of N slices that exists for T seconds owns
N*T slice-seconds, and every one of them lands in exactly one category. Goodput is the
productive share. The categories follow Google's ml-goodput-measurement (its ``BadputType``),
plus the two that a shared, elastic cluster adds (time queued, time running below full size):

=====================  ==========================================================
category               ml-goodput-measurement
=====================  ==========================================================
``productive``         goodput (productive training time)
``queued``             (scheduling goodput: waiting for capacity)
``startup``            TPU_INITIALIZATION + TRAINING_PREP + PROGRAM_STARTUP
``checkpoint_save``    UNPRODUCTIVE_CHECKPOINT_SAVE_TIME
``checkpoint_restore`` UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME
``wasted_progress``    WASTED_PROGRESS_FROM_DISRUPTION (work since the last checkpoint)
``recovery``           INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION
``elastic``            elastic down/up reconfiguration (Pathways' ELASTIC_* badput)
``degraded``           slices missing while an elastic job runs below its size
=====================  ==========================================================

The simulator, the local backend and the Kubernetes controller all fill ledgers through this
module, so a goodput number means the same thing everywhere. A backend that knows when its
workers ran at which size (:class:`Stretch`) and what their records say they spent the time on
(:class:`Spent`) books a run with :func:`account_run`, by the simulator's rule: the slices missing
from a run below its size are ``degraded``, the running ones are what their records say.
"""

from __future__ import annotations

import dataclasses
import enum
import statistics
from collections.abc import Iterable, Mapping


class Category(str, enum.Enum):
    PRODUCTIVE = "productive"
    QUEUED = "queued"
    STARTUP = "startup"
    CHECKPOINT_SAVE = "checkpoint_save"
    CHECKPOINT_RESTORE = "checkpoint_restore"
    WASTED_PROGRESS = "wasted_progress"
    RECOVERY = "recovery"
    ELASTIC = "elastic"
    DEGRADED = "degraded"

    def __str__(self) -> str:
        return self.value


BADPUT = tuple(c for c in Category if c is not Category.PRODUCTIVE)


_NOTHING_YET = dict.fromkeys(Category, 0.0)  # (iterating an Enum is slow; a simulated month opens 16,000 ledgers)


@dataclasses.dataclass
class Ledger:
    """Slice-seconds of one workload (or a sum of workloads) by category."""

    seconds: dict[Category, float] = dataclasses.field(default_factory=_NOTHING_YET.copy)

    def add(self, category: Category, slice_seconds: float) -> None:
        if slice_seconds < 0:
            raise ValueError(f"negative time for {category}: {slice_seconds}")
        self.seconds[category] += slice_seconds

    def waste(self, slice_seconds: float) -> None:
        """Progress made but thrown away (a hard stop after the last checkpoint).

        It was counted as productive when it happened; it moves to ``wasted_progress``.
        """
        moved = min(slice_seconds, self.seconds[Category.PRODUCTIVE])
        self.seconds[Category.PRODUCTIVE] -= moved
        self.seconds[Category.WASTED_PROGRESS] += moved

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    @property
    def goodput(self) -> float:
        total = self.total
        return self.seconds[Category.PRODUCTIVE] / total if total > 0 else 0.0

    def fractions(self) -> dict[str, float]:
        """Each category's share of the total (goodput is the ``productive`` share)."""
        total = self.total
        return {c.value: (v / total if total > 0 else 0.0) for c, v in self.seconds.items()}

    def __iadd__(self, other: Ledger) -> Ledger:
        for category, value in other.seconds.items():
            self.seconds[category] += value
        return self


@dataclasses.dataclass(frozen=True, slots=True)
class Stretch:
    """A while during which one attempt's workers ran on ``slices`` slices (from the records that
    started them, scaled them down or up, and stopped them)."""

    start: float
    stop: float
    slices: int


@dataclasses.dataclass(frozen=True, slots=True)
class Spent:
    """Time the workers' records put in one category, from ``start`` to ``end``, on ``slices``
    slices (None: every running one; a step says how many it ran on)."""

    category: Category
    start: float
    end: float
    slices: int | None = None


def account_run(ledger: Ledger, size: int, stretches: Iterable[Stretch], spent: Iterable[Spent], stepped: bool = True) -> float:
    """Book one attempt of a workload of ``size`` slices, stretch by stretch: the slices missing
    from a stretch are ``degraded``; the running ones are what ``spent`` says, clipped to the
    stretch. Running time no record covers (workers up, neither stepping, saving, restoring nor
    re-forming: stalled or stopping) is ``recovery`` at full size and ``degraded`` below it.
    When the workload's workers never reported a step (``stepped`` False) nobody can tell what
    that time was: it is booked nowhere and returned, in slice-seconds (else 0.0)."""
    spent = list(spent)
    unknown = 0.0
    for stretch in stretches:
        length = stretch.stop - stretch.start
        if length <= 0:
            continue
        running = min(stretch.slices, size)
        ledger.add(Category.DEGRADED, (size - running) * length)
        covered = 0.0
        for item in spent:
            overlap = min(item.end, stretch.stop) - max(item.start, stretch.start)
            if overlap > 0:
                amount = overlap * (running if item.slices is None else min(item.slices, running))
                ledger.add(item.category, amount)
                covered += amount
        uncovered = max(0.0, running * length - covered)
        if not stepped:
            unknown += uncovered
        else:
            ledger.add(Category.RECOVERY if running == size else Category.DEGRADED, uncovered)
    return unknown


def combine(ledgers: Iterable[Ledger]) -> Ledger:
    total = Ledger()
    for ledger in ledgers:
        total += ledger
    return total


def goodput_by(ledgers: Mapping[str, Ledger], group: Mapping[str, str]) -> dict[str, float]:
    """Slice-second weighted goodput of the workloads in each group (e.g. priority level)."""
    grouped: dict[str, Ledger] = {}
    for name, ledger in ledgers.items():
        key = group[name]
        grouped.setdefault(key, Ledger())
        grouped[key] += ledger
    return {key: ledger.goodput for key, ledger in grouped.items()}


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (1-99) of ``values`` (inclusive method); None when there are none."""
    data = sorted(values)
    if len(data) < 2:
        return data[0] if data else None
    return statistics.quantiles(data, n=100, method="inclusive")[round(q) - 1]
