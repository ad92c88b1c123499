"""What a local cluster's controller does first when it starts: take over from the one before.

The worker table says what a committed decision asked for, whatever became of the controller
that made it (killed with -9 at any moment): live workers are watched again, workers that ended
meanwhile are accounted for, and workers committed but never started are started now. A worker
whose shim was started but whose pid was recorded nowhere yet (neither committed nor written by
the shim) is recognised by its start lock and adopted once its pid file appears (the loop looks
again while it serves: :class:`UnrecordedStarts`): it is never started a second time. A worker that died of the crash (its shim killed before its command ran:
the kill hit the process the controller had just forked) is started again, and one whose shim
died under a running command is reported lost: neither counts against the workload's restarts.
Nor does a worker killed with its shim when the whole host was lost with the controller (a
reboot, or every process of the cluster killed at once): see ``host_loss.py``.
"""

from __future__ import annotations

import time

from hotswap.backends.local.controller.host_loss import HostLoss
from hotswap.backends.local.workers.supervisor import Supervisor
from hotswap.backends.local.workers.lifecycle import Workers
from hotswap.backends.local.tables import LIVE_WORKER_STATES, LocalStore, WorkerRow


def recover(workers: Workers, host_loss: HostLoss) -> UnrecordedStarts:
    """Take over every worker and spare of the table; returns the starts still to be adopted
    (the loop looks at them again: see :class:`UnrecordedStarts`)."""
    store, supervisor, spares = workers.store, workers.supervisor, workers.spares
    unrecorded = UnrecordedStarts(workers, host_loss)
    host_loss.look(store, supervisor)  # before anything new starts
    for row in store.worker_rows.select(LIVE_WORKER_STATES):
        if row.pid is None:  # its start was not recorded: handed to a spare, or started, or neither
            row = _adopt_from_pid_file(store, spares.adopt_after_crash(row))
        if row.pid is None and supervisor.started_unrecorded(row):
            unrecorded.add(row)
            continue
        _take_over_worker(workers, host_loss, row)
    workers.terminate(store.worker_rows.select(("stopping",)))  # the signal may never have been sent
    for row in spares.rows():
        if row.pid is None:
            row = _adopt_from_pid_file(store, row)
        if row.pid is None and supervisor.started_unrecorded(row):
            unrecorded.add(row)
            continue
        _take_over_spare(workers, row)
    spares.refill_after(0.0)
    return unrecorded


POLL_S = 0.05  # how often the loop looks at a start whose shim has not written its pid file


class UnrecordedStarts:
    """Workers and spares whose shim lives, holding its start lock, but has written no pid
    file yet (started by a killed controller an instant before it died; slow on a busy host,
    or stopped). Never waited for in place, which held the cluster unanswered for as long as a
    shim took: the loop wakes every :data:`POLL_S` while any is left (:meth:`next_deadline`)
    and :meth:`check` takes over each once its pid file appears, or starts it again (a spare:
    records it exited) once its shim ended without one."""

    def __init__(self, workers: Workers, host_loss: HostLoss) -> None:
        self.workers = workers
        self.host_loss = host_loss
        self.ids: set[int] = set()

    def add(self, row: WorkerRow) -> None:
        self.ids.add(row.id)

    def next_deadline(self) -> float | None:
        return POLL_S if self.ids else None

    def check(self) -> None:
        store, supervisor = self.workers.store, self.workers.supervisor
        for row_id in sorted(self.ids):
            row = _adopt_from_pid_file(store, store.worker_rows.get(row_id))
            if row.pid is None and supervisor.started_unrecorded(row):
                continue  # not yet
            self.ids.discard(row_id)
            if row.identity.is_spare:
                _take_over_spare(self.workers, row)
                if self.workers.spares.closed:  # the cluster is being deleted: it was killed without a pid
                    self.workers.kill([store.worker_rows.get(row_id)])
                continue
            _take_over_worker(self.workers, self.host_loss, row)
            if row.state == "stopping":  # told to stop while its pid was unknown
                self.workers.terminate([store.worker_rows.get(row_id)])


def _take_over_worker(workers: Workers, host_loss: HostLoss, row: WorkerRow) -> None:
    """Watch a worker again, account for its end, or start it (no start of it is recorded)."""
    if row.pid is None:
        workers.spawn([(row, None)])
        return
    pidfd = workers.supervisor.pidfd(row)
    if pidfd is None:
        workers.ended(row, host_loss.reason(row))  # judged, started again, or lost: see Workers.ended
        return
    workers.watch(pidfd, row.id)
    if row.state == "starting":
        with workers.store.transaction():
            workers.store.worker_rows.update(row.id, state="running")


def _take_over_spare(workers: Workers, row: WorkerRow) -> None:
    pidfd = workers.supervisor.pidfd(row) if row.pid is not None else None
    if pidfd is None:
        with workers.store.transaction():
            workers.store.worker_rows.update(row.id, state="exited", ended_at=time.time())
    else:
        workers.watch(pidfd, row.id)


def _adopt_from_pid_file(store: LocalStore, row: WorkerRow) -> WorkerRow:
    """The row with the pid its shim wrote, for a worker whose start was never recorded."""
    recorded = Supervisor.recorded_start(row)
    if recorded is None:
        return row
    with store.transaction():
        store.worker_rows.update(row.id, pid=recorded[0], start_ticks=recorded[1])
    return store.worker_rows.get(row.id)
