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
again). A worker that writes nothing at all any more while its pod runs (a frozen process) is
judged by the controller's own observation of its silence (:mod:`.silence`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hotswap.api.errors import HotswapError
from hotswap.api.phases import WorkloadPhase
from hotswap.api.worker_report import WorkerReport, report_name
from hotswap.backends.kubernetes.client import ForbiddenError
from hotswap.backends.kubernetes.controller.silence import MAX_READ_GAP_S, Renewals, allowance_s
from hotswap.backends.kubernetes.observation import Observation
from hotswap.backends.kubernetes.render.reports import grants_report_update, worker_service_account
from hotswap.backends.kubernetes.state_annotation import replica_slots
from hotswap.backends.kubernetes.worker_reports import Reports, first_step_after, rank_progress, reports_by_workload
from hotswap.core import events as ev
from hotswap.core.hang import HangLimits, judge, next_deadline
from hotswap.core.workload import Workload

Access = tuple[dict[str, Any] | None, dict[str, Any] | None]  # the workers' Role and RoleBinding


class TrainingRecords:
    """Reads the records once per round and keeps them for the round's figures."""

    def __init__(
        self, list_leases: Callable[[], list[dict]], log: Callable[[str], None] = lambda line: None,
        clock: Callable[[], float] = time.time, read_access: Callable[[str], Access] | None = None, namespace: str = "default",
    ) -> None:
        self.list_leases = list_leases
        self.log = log
        self.clock = clock
        self.read_access = read_access  # None: silences are never judged (nothing to tell a refused worker by)
        self.namespace = namespace
        self.renewals = Renewals()
        self.unwritable: set[tuple[str, int, float]] = set()  # (workload, replica, record) whose writers were refused: said once
        self.refused = False  # said once: the controller's Role cannot list Leases
        self.reports: dict[str, dict[int, WorkerReport]] = {}
        self.leases: list[dict[str, Any]] = []  # this round's record Leases, as listed
        self.parsed: dict[tuple[str, str], WorkerReport | None] = {}  # by (Lease, resourceVersion): an unchanged one is not parsed again
        self.wake_at: float | None = None

    def read(self, observation: Observation) -> list[ev.Event]:
        """This round's records; the hangs found in them (as events for the round's decision)."""
        listed_at = self.clock()
        try:
            leases = self.list_leases()
        except ForbiddenError as error:  # a Role of an earlier release: everything else goes on
            if not self.refused:
                self.log(f"warning: {error}; goodput, MTTR and hangs wait for the workers' records "
                         "(apply `hotswap controller manifests` again)")
            self.refused = True
            leases = []
            self.renewals.interrupted()
        else:
            self.refused = False
        self.leases = leases
        self.reports = reports_by_workload(leases, self.parsed)
        if not self.refused:
            self.renewals.saw(self.reports, listed_at, self.clock())
        hangs: list[ev.Event] = []
        wakes: list[float] = []
        for name, workload in observation.snapshot.workloads.items():
            reports = self.reports.get(name)
            if workload.phase is not WorkloadPhase.RUNNING or not reports:
                continue
            limits = HangLimits(limit_s=workload.spec.hang_timeout_s)
            active = [index for index, slice_name in enumerate(replica_slots(workload)) if slice_name]
            for replica, rank, report in rank_progress(reports, workload.attempt, active):
                written = report.published_at
                hang = judge([rank], rank.last_step_at or written, written, limits)
                if hang is not None:  # (again next round only if this round's record was refused)
                    hangs.append(ev.WorkloadHung(name, workload.attempt, hang.reason))
                    break
                due = next_deadline([rank], rank.last_step_at or written, limits)
                if due is None:
                    continue
                wakes.append(observation.now + max(0.0, due - written))  # its heartbeat past that time is what can show the hang
                frozen, wake = self._silence(observation, workload, replica, report, due, listed_at)
                if frozen is not None:
                    hangs.append(ev.WorkloadHung(name, workload.attempt, frozen))
                    break
                if wake is not None:
                    wakes.append(wake)
        self.wake_at = min(wakes) if wakes else None
        return hangs

    def interrupted(self) -> None:
        """A round failed on the API server: the silences it was measuring start again."""
        self.renewals.interrupted()

    def _silence(
        self, observation: Observation, workload: Workload, replica: int, report: WorkerReport, deadline: float, listed_at: float,
    ) -> tuple[str | None, float | None]:
        """The hang of a replica whose record this controller saw unrenewed too long while its
        first pod runs (:mod:`.silence`), or when to look again."""
        pod = next((p for p in observation.pods_of(workload.name)
                    if p.running and p.replica == replica and p.host == 0 and p.attempt == workload.attempt), None)
        if pod is None or self.read_access is None:
            return None, None  # no pod to be frozen in: its end is the pod signals' to judge
        if report.published_at < pod.created:
            return None, None  # an earlier pod's record: this one's process has yet to write
        since = self.renewals.unrenewed_since(workload.name, replica, pod.uid or pod.name)
        if since is None:
            return None, None
        allowed = allowance_s(report, deadline)
        silent = listed_at - since
        if silent <= allowed:
            return None, min(since + allowed + 1.0, listed_at + MAX_READ_GAP_S / 2)  # (a wake-up also keeps the lists gapless)
        key = (workload.name, replica, report.published_at)
        if key in self.unwritable:
            return None, None
        try:
            role, binding = self.read_access(worker_service_account(workload.name))
        except HotswapError as error:  # cannot tell a frozen worker from a refused one: not judged
            self.log(f"warning: {error}; replica {replica} of {workload.name} has not renewed its record for {silent:.0f}s: not judged")
            self.unwritable.add(key)
            return None, None
        if not grants_report_update(role, binding, workload.name, self.namespace, report_name(workload.name, replica)):
            self.log(f"warning: replica {replica} of {workload.name} has not renewed its record for {silent:.0f}s, and its workers "
                     f"may no longer write it (Role or RoleBinding {worker_service_account(workload.name)} changed): not judged a hang")
            self.unwritable.add(key)
            return None, None
        last = f"step {report.progress.last_step}" if report.progress.last_step is not None else "no step"
        return (f"rank replica {replica}/host 0: its record was not renewed for {silent:.1f}s while its pod runs "
                f"(allowed {allowed:.1f}s: heartbeat every {report.interval_s:g}s; {last} its last): the process is frozen"), None

    def first_step(self, workload: str, attempt: int, failed_at: float) -> float | None:
        """When the first productive step after a failure at ``failed_at`` (restarted into
        ``attempt``) was recorded; None while none was."""
        reports: Reports | None = self.reports.get(workload)
        return first_step_after(reports, attempt, failed_at) if reports else None
