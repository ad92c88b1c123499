"""The local controller's Prometheus figures (the definitions are ``backends/kit/metrics.py``'s, shared
with the Kubernetes controller): what each round decided, and when a hotswapped workload's new
workers are all running, which ends its recovery."""

from __future__ import annotations

from collections.abc import Callable

from hotswap.api.catalog import get_device_type
from hotswap.core import actions as act
from hotswap.core.model import Snapshot
from hotswap.backends.kit.metrics import ControllerMetrics


class LocalFigures:
    def __init__(self, metrics: ControllerMetrics) -> None:
        self.metrics = metrics
        self.recovering: dict[str, tuple[float, int]] = {}  # workload -> (loss time, attempt)

    def round_done(self, actions: list[act.Action], snapshot: Snapshot, now: float, seconds: float, writes: int) -> None:
        self.metrics.reconciled(seconds, writes)
        for action in actions:
            if isinstance(action, act.Restart) and not action.charged:
                began = self.recovering.get(action.workload, (now, 0))[0]
                self.recovering[action.workload] = (began, action.attempt)
                self.metrics.hotswapped()
            elif isinstance(action, act.Preempt):
                self.metrics.preempted()
        self.metrics.observed(snapshot)

    def check_recoveries(self, snapshot: Snapshot, running: Callable[[str, int, int], int], now: float) -> None:
        """``running(workload, seq, attempt)``: how many of that attempt's workers run."""
        for name, (began, attempt) in list(self.recovering.items()):
            workload = snapshot.workloads.get(name)
            if workload is None or workload.phase.terminal or workload.attempt != attempt:
                if workload is None or workload.phase.terminal:
                    del self.recovering[name]
                continue
            expected = len(workload.slices) * get_device_type(workload.device_type).hosts_per_slice
            if expected and running(name, workload.seq, attempt) >= expected:
                del self.recovering[name]
                self.metrics.recovered(max(0.0, now - began))
