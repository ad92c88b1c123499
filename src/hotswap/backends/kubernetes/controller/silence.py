"""A frozen process on Kubernetes: a replica whose record stops being renewed while its pod runs.

A worker that stops stepping but lives is judged by its own heartbeats (:mod:`.training`). One
that cannot write at all (SIGSTOP, a process in D-state, the whole interpreter deadlocked) writes
no heartbeat, so its record keeps saying what it said last; the local backend would call it hung
once its last step is older than the hang rule allows (:mod:`hotswap.core.hang`, as of the
controller's clock, because it reads the events file itself). Here the controller sees only the
record, so it calls the silence a hang when, by its own observation, the record was not renewed
for longer than the hang rule still allowed at the last write, plus :data:`MISSED_HEARTBEATS`
heartbeat intervals (the interval the record says its writer keeps: one heartbeat lost on the
way is forgiven), plus :data:`MARGIN_S` for a slow API server; and only while the replica's first
pod is Running.

No false hang, by construction:

- The silence is measured on the controller's own clock between its own reads, never against
  the worker's clock: from just after the first list that showed this record (a record first
  seen late, or written by a worker whose clock is off, only shortens it) to just before the
  current list. The Leases are listed from the API server itself (a consistent read, no watch
  cache), so two lists showing the same record prove nothing was written between them.
- Only a record the replica's running pod wrote counts: one the controller saw before it saw
  that pod run, or written before the pod was created, is an earlier pod's (an elastic replica
  grown back), and a process that has not written yet has no step to be late with.
- The controller's own absence suspends the measure: a round that failed on the API server
  (unreachable, 5xx: the workers may not have reached it either), a refused list, or more than
  :data:`MAX_READ_GAP_S` between two lists (a controller that was not leading, stopped, or
  starved) restart every silence from the next list.
- A worker refused its record (404: the Lease is gone, so no record is listed; 403: someone
  changed the workers' Role or RoleBinding, each said once by the worker, which trains on) is
  not hung: before a silence becomes a hang, the controller reads the two objects and judges
  only if they still let the workers write that record (otherwise it says so once).
"""

from __future__ import annotations

import dataclasses

from hotswap.api.worker_report import WorkerReport

MISSED_HEARTBEATS = 2  # heartbeat intervals a silence must last beyond the hang rule's allowance
MARGIN_S = 30.0  # beyond that: a slow API server, a write's timeout and retries (train/report_channel.py)
MAX_READ_GAP_S = 60.0  # two resyncs (controller/loop.py): a longer gap between lists restarts every silence


def allowance_s(report: WorkerReport, deadline: float) -> float:
    """How long the record may go unrenewed before its worker is called frozen: what the hang
    rule still allowed at its last write (``deadline``: :func:`hotswap.core.hang.next_deadline`
    on the worker's clock), plus the missed heartbeats and the margin."""
    return max(0.0, deadline - report.published_at) + MISSED_HEARTBEATS * report.interval_s + MARGIN_S


@dataclasses.dataclass
class Renewals:
    """When this controller first saw each replica's current record, and since when it has been
    watching without a gap (see the module)."""

    seen: dict[tuple[str, int], tuple[float, float]] = dataclasses.field(default_factory=dict)  # -> (published_at, first seen)
    pods: dict[tuple[str, int], tuple[str, float]] = dataclasses.field(default_factory=dict)  # -> (its first pod's uid, first seen running)
    watched_since: float | None = None
    listed_at: float | None = None  # when the last list was issued

    def interrupted(self) -> None:
        """The controller's view broke off (a failed round, a refused list): start again."""
        self.watched_since = None

    def saw(self, reports: dict[str, dict[int, WorkerReport]], listed_at: float, answered_at: float) -> None:
        """One list of the records, issued at ``listed_at`` and answered at ``answered_at``."""
        if self.watched_since is None or self.listed_at is None or listed_at - self.listed_at > MAX_READ_GAP_S:
            self.watched_since = answered_at
        seen: dict[tuple[str, int], tuple[float, float]] = {}
        for workload, by_replica in reports.items():
            for replica, report in by_replica.items():
                before = self.seen.get((workload, replica))
                same = before is not None and before[0] == report.published_at
                seen[(workload, replica)] = before if same and before is not None else (report.published_at, answered_at)
        self.seen, self.listed_at = seen, listed_at
        self.pods = {key: pod for key, pod in self.pods.items() if key in seen}

    def unrenewed_since(self, workload: str, replica: int, pod_uid: str) -> float | None:
        """From when this controller has seen the replica's record unrenewed while its first pod
        ``pod_uid`` ran; None when not listed, or when the record was first seen before that pod
        ran: it is an earlier pod's (an elastic replica grown back: the record its lost pod
        left), and the pod's own process has yet to write."""
        found = self.seen.get((workload, replica))
        if found is None or self.watched_since is None or self.listed_at is None:
            return None
        pod = self.pods.get((workload, replica))
        if pod is None or pod[0] != pod_uid:
            pod = self.pods[(workload, replica)] = (pod_uid, self.listed_at)
        if found[1] < pod[1]:
            return None
        return max(found[1], self.watched_since)
