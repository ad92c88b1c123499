"""The recovery figures both controllers count, one definition of each (the metrics they feed
are :mod:`hotswap.backends.kit.metrics`'s):

- a *hotswap*: an action whose effect counts as one (a restart on other capacity, never charged);
- a *preemption*: one more in a workload's preemption count than was recorded before the round
  (the core's preemptions and, under Kueue, Kueue's evictions alike);
- a *recovery*: from the loss that caused a hotswap (or the hotswap, when the loss's time is
  not known) until the first productive step after it, from the workers' records
  (:mod:`hotswap.core.recovery`'s MTTR, on both backends); a controller that cannot read them
  ends it when every worker of the workload's attempt runs (:func:`expected_workers`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from hotswap.api.catalog import get_device_type
from hotswap.backends.kit.metrics import ControllerMetrics
from hotswap.core.effects import ActionEffect
from hotswap.core.model import Snapshot
from hotswap.core.workload import Workload


def expected_workers(workload: Workload) -> int:
    """How many workers a running workload has: one per host of each of its active slices."""
    return len(workload.slices) * get_device_type(workload.device_type).hosts_per_slice


def preemptions_between(before: Mapping[str, object], after: Mapping[str, Workload | None]) -> int:
    """Preemptions that happened between two records of the workloads' preemption counts
    (a workload with no count before, new or of an earlier release, counts none)."""
    count = 0
    for name, workload in after.items():
        previous = before.get(name)
        if workload is not None and isinstance(previous, int) and workload.preemptions > previous:
            count += workload.preemptions - previous
    return count


class RecoveryFigures:
    """Hotswaps, preemptions and recovery times, counted into ``metrics``."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self.metrics = metrics
        self.recovering: dict[str, tuple[float, int]] = {}  # workload -> (loss began, attempt restarted into)

    def account_round(
        self,
        effects: Iterable[ActionEffect],
        preemptions_before: Mapping[str, object],
        after: Mapping[str, Workload | None],
        snapshot: Snapshot,
        now: float,
        *,
        seconds: float,
        writes: int,
        loss_since: Mapping[str, float] | None = None,
    ) -> None:
        """Everything a controller reports of one round, in the same shape on both backends: how
        long it took and how many writes it made, what it decided (:meth:`round_done`), and the
        cluster's state after it (``snapshot``)."""
        self.metrics.reconciled(seconds, writes)
        self.round_done(effects, preemptions_before, after, now, loss_since)
        self.metrics.observed(snapshot)

    def round_done(
        self,
        effects: Iterable[ActionEffect],
        preemptions_before: Mapping[str, object],
        after: Mapping[str, Workload | None],
        now: float,
        loss_since: Mapping[str, float] | None = None,
    ) -> None:
        """Count a round's hotswaps (their recoveries begin: at ``loss_since[workload]`` when the
        loss's time is known) from its actions' ``effects``, and its preemptions
        (``preemptions_before``: each workload's count before the round; ``after``: the
        workloads after it)."""
        for effect in effects:
            if effect.hotswap and effect.attempt is not None:
                name = effect.action.workload
                began = min((loss_since or {}).get(name, now), self.recovering.get(name, (now, 0))[0])
                self.recovering[name] = (began, effect.attempt)
                self.metrics.hotswapped()
        preempted = preemptions_between(preemptions_before, after)
        if preempted:
            self.metrics.preempted(preempted)

    def check_recoveries(
        self, workloads: Mapping[str, Workload], running: Callable[[Workload], int], now: float,
        first_step: Callable[[str, int, float], float | None] | None = None,
    ) -> None:
        """End the recoveries whose workloads now run all their workers (``running(workload)``:
        how many workers of the workload's current attempt run); with ``first_step`` (the
        workers' records: when the first productive step after a failure at a time, restarted
        into an attempt, was made, or None), at that step instead, timed by its record
        (:mod:`hotswap.core.recovery`'s definition)."""
        for name, (began, attempt) in list(self.recovering.items()):
            workload = workloads.get(name)
            if workload is None or workload.phase.terminal:
                del self.recovering[name]
                continue
            if workload.attempt < attempt:
                continue
            if first_step is not None:
                stepped = first_step(name, attempt, began)
                if stepped is not None:
                    del self.recovering[name]
                    self.metrics.recovered(max(0.0, stepped - began))
                continue
            expected = expected_workers(workload)
            if expected and running(workload) >= expected:
                del self.recovering[name]
                self.metrics.recovered(max(0.0, now - began))
