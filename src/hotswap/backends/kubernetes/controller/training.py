"""What the Kubernetes controller learns from the workers' own records each round (the replicas'
Leases, :mod:`hotswap.backends.kubernetes.worker_reports`): hangs, judged by
:func:`hotswap.core.hang.judge` with the local backend's rules, as ``WorkloadHung`` events of the
round, and the first productive step that ends a recovery (``hotswap_recovery_seconds``).

A hang is judged as of the newest time the workload's workers wrote (their heartbeat), never
the controller's clock: a record that arrives late, or a controller that looked late, cannot
make a hang. What is never a hang is :mod:`hotswap.core.hang`'s list, plus: a workload not
RUNNING, an attempt no record speaks of yet, a replica whose record is of an earlier attempt
(its new pods have not stepped yet), a replica the workload does not run (parked), a stopped
worker. Each replica is judged as of its own last write. A hang is reported once per attempt:
the round that decides on it records the next attempt (a refused record: the next round judges
again).
"""

from __future__ import annotations

from collections.abc import Callable

from hotswap.api.phases import WorkloadPhase
from hotswap.backends.kubernetes.client import ForbiddenError
from hotswap.backends.kubernetes.observation import Observation
from hotswap.backends.kubernetes.state_annotation import replica_slots
from hotswap.backends.kubernetes.worker_reports import Reports, first_step_after, rank_progress, reports_by_workload
from hotswap.core import events as ev
from hotswap.core.hang import HangLimits, judge, next_deadline


class TrainingRecords:
    """Reads the records once per round and keeps them for the round's figures."""

    def __init__(self, list_leases: Callable[[], list[dict]], log: Callable[[str], None] = lambda line: None) -> None:
        self.list_leases = list_leases
        self.log = log
        self.refused = False  # said once: the controller's Role cannot list Leases
        self.reports: dict[str, dict[int, object]] = {}
        self.parsed: dict[tuple[str, str], object] = {}  # by (Lease, resourceVersion): an unchanged one is not parsed again
        self.wake_at: float | None = None

    def read(self, observation: Observation) -> list[ev.Event]:
        """This round's records; the hangs found in them (as events for the round's decision)."""
        try:
            leases = self.list_leases()
        except ForbiddenError as error:  # a Role of an earlier release: everything else goes on
            if not self.refused:
                self.log(f"warning: {error}; goodput, MTTR and hangs wait for the workers' records "
                         "(apply `hotswap controller manifests` again)")
            self.refused = True
            leases = []
        else:
            self.refused = False
        self.reports = reports_by_workload(leases, self.parsed)  # type: ignore[arg-type]
        hangs: list[ev.Event] = []
        wakes: list[float] = []
        for name, workload in observation.snapshot.workloads.items():
            reports = self.reports.get(name)
            if workload.phase is not WorkloadPhase.RUNNING or not reports:
                continue
            limits = HangLimits(limit_s=workload.spec.hang_timeout_s)
            active = [index for index, slice_name in enumerate(replica_slots(workload)) if slice_name]
            for rank, written in rank_progress(reports, workload.attempt, active):  # type: ignore[arg-type]
                hang = judge([rank], rank.last_step_at or written, written, limits)
                if hang is not None:  # (again next round only if this round's record was refused)
                    hangs.append(ev.WorkloadHung(name, workload.attempt, hang.reason))
                    break
                due = next_deadline([rank], rank.last_step_at or written, limits)
                if due is not None:  # its heartbeat past that time is what can show the hang
                    wakes.append(observation.now + max(0.0, due - written))
        self.wake_at = min(wakes) if wakes else None
        return hangs

    def first_step(self, workload: str, attempt: int, failed_at: float) -> float | None:
        """When the first productive step after a failure at ``failed_at`` (restarted into
        ``attempt``) was recorded; None while none was."""
        reports: Reports | None = self.reports.get(workload)  # type: ignore[assignment]
        return first_step_after(reports, attempt, failed_at) if reports else None
