"""What a local cluster's controller holds between rounds, and what its watchers report for the
next one.

:class:`ClusterState` is what the last committed round left: the core's snapshot, the cluster's
record and its settings (parsed once, with the recovery policy they imply), and whether the
cluster is being deleted. Only a committed round, or the commit that begins a deletion, changes
it; every collaborator reads it.

:class:`Inbox` gathers, between rounds, what the next round decides on: worker exits (from
:class:`~hotswap.backends.local.workers.lifecycle.Workers`) and hangs (from the hang watch) as
the core's events, and the nodes whose GPUs the health monitor found broken.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from hotswap.api.worker import DEFAULT_GRACE_PERIOD_S
from hotswap.backends.local.gpu.backing import Backing
from hotswap.backends.local.settings import LocalSettings
from hotswap.backends.local.tables import WorkerRow
from hotswap.core import events as ev
from hotswap.core.model import Snapshot
from hotswap.core.policy import SchedulerConfig
from hotswap.store.state import ClusterRecord


def scheduler_config(settings: LocalSettings) -> SchedulerConfig:
    """The recovery policy of a cluster: hotswap and elastic unless turned off."""
    return SchedulerConfig(hotswap=settings.hotswap, elastic=settings.elastic)


class ClusterState:
    """The controller's view of its cluster, as of its last committed round (see the module)."""

    def __init__(self, cluster: ClusterRecord, snapshot: Snapshot, deleting: bool = False) -> None:
        self.cluster = cluster
        self.settings = LocalSettings.of(cluster.settings)
        self.config = scheduler_config(self.settings)
        self.snapshot = snapshot
        self.deleting = deleting  # `cluster delete` began: stop every worker, serve nothing, exit

    @property
    def backing(self) -> Backing | None:
        """The GPUs behind the slices; None: an emulated cluster."""
        return self.settings.backing

    def per_host(self) -> int:
        """Worker processes per host: one per GPU of a GPU-backed host, else one."""
        return self.backing.per_host if self.backing is not None else 1

    def grace_s(self, workload: str) -> float:
        record = self.snapshot.workloads.get(workload)
        return record.spec.termination_grace_period_s if record is not None else DEFAULT_GRACE_PERIOD_S

    def record_with(self, settings: LocalSettings) -> ClusterRecord:
        """The cluster's record with these settings (what a round that changes them writes)."""
        return dataclasses.replace(self.cluster, settings=settings.to_settings())

    def committed(self, snapshot: Snapshot, settings: LocalSettings | None = None) -> None:
        """A round committed this snapshot (and, when it changed them, these settings)."""
        self.snapshot = snapshot
        if settings is not None:
            self.cluster, self.settings, self.config = self.record_with(settings), settings, scheduler_config(settings)

    def deletion_begun(self) -> None:
        self.deleting = True


class Inbox:
    """What happened since the last round, for the next one (see the module)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.events: list[ev.Event] = []
        self.failed_nodes: dict[str, str] = {}  # node -> why (the GPU health probe)

    def add(self, events: Iterable[ev.Event]) -> None:
        self.events += events

    def decided(self) -> None:
        """The events were decided on (or are moot: the cluster is being deleted)."""
        self.events = []

    def worker_exited(self, row: WorkerRow, code: int, lost: str | None, attempt_over: bool) -> None:
        """A worker's exit as the core's events: ``lost``, why hotswap lost it (the core restarts
        the workload without charging it), None: the code is judged; ``attempt_over``: no
        worker of its attempt is left."""
        who = row.identity
        if row.state != "stopping" and lost is not None:
            self.events.append(ev.WorkerLost(who.workload, who.attempt, who.slice, who.host, lost))
        elif row.state != "stopping":
            # A worker told to stop (preempted, restarted, scaled away, drained) ends as asked:
            # its exit code says nothing about the workload and is never judged.
            self.events.append(ev.WorkerExited(who.workload, who.attempt, who.slice, who.host, code))
        workload = self.state.snapshot.workloads.get(who.workload)
        if workload is not None and workload.seq == who.seq and attempt_over:
            self.events.append(ev.WorkersStopped(who.workload, who.attempt))

    def fail_nodes(self, failures: list[tuple[str, str]]) -> None:
        """Broken GPUs (the health monitor): their nodes fail in the next round, as after
        ``node fail``: committed first, then their workers are killed."""
        for node, reason in failures:
            if node in self.state.snapshot.nodes:
                self.failed_nodes[node] = reason

    def take_failed_nodes(self) -> dict[str, str]:
        failed, self.failed_nodes = self.failed_nodes, {}
        return failed
