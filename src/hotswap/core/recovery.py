"""Recoveries from the records: each failure under a workload until its first productive step
after it (MTTR's one definition; the local backend's ``workload describe`` and the dashboard
show what this computes). Pure: the caller passes the records' times.

A step is past a failure when a later attempt made it, or when the attempt that was running
re-formed (an elastic change recorded at or after the failure) before the step began: a step
the old workers finish after the failure is not a recovery. Failures while one recovery is
open belong to it; a failure nothing recovered from yet stays open and counts in no mean.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Recovery:
    failed_at: float
    recovered_at: float | None  # the first productive step after the failure; None: not yet

    @property
    def seconds(self) -> float | None:
        return None if self.recovered_at is None else max(0.0, self.recovered_at - self.failed_at)


@dataclasses.dataclass(frozen=True)
class StepDone:
    t: float  # when the step finished
    attempt: int
    began: float  # when it began (t less its duration)
    step: int = 0


def recoveries(
    failures: Sequence[tuple[float, int]], steps: Sequence[StepDone], reforms: Sequence[tuple[float, int]] = ()
) -> list[Recovery]:
    """``failures``: (time, attempt running then); ``steps``: every step reported, any order;
    ``reforms``: (time, attempt) of elastic re-formations."""
    ordered = sorted(steps, key=lambda s: s.t)
    found: list[Recovery] = []
    open_until: float | None = None  # a recovery still open (or ended at this time)
    for failed_at, attempt in sorted(failures):
        if found and (found[-1].recovered_at is None or failed_at < (open_until or 0.0)):
            continue  # within the recovery already open
        reformed = min((t for t, a in reforms if a == attempt and t >= failed_at), default=None)
        first = next(
            (s for s in ordered if s.t > failed_at and (s.attempt > attempt or (
                s.attempt == attempt and reformed is not None and s.began >= reformed))),
            None,
        )
        found.append(Recovery(failed_at, first.t if first else None))
        open_until = first.t if first else None
    return found


def mean_seconds(found: Sequence[Recovery]) -> float | None:
    """MTTR: the mean of the recoveries that ended."""
    ended = [r.seconds for r in found if r.seconds is not None]
    return sum(ended) / len(ended) if ended else None


def as_view(found: Sequence[Recovery]) -> dict[str, Any]:
    """MTTR and each recovery, to the millisecond, as ``describe``'s ``progress`` shows them on
    both backends."""
    mttr = mean_seconds(found)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    return {
        "mttr_s": ms(mttr),
        "recoveries": [{"failed_at": ms(r.failed_at), "recovered_at": ms(r.recovered_at), "seconds": ms(r.seconds)} for r in found],
    }
