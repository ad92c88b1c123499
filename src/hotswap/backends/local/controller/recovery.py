"""What a local cluster's controller does first when it starts: take over from the one before.

The worker table says what a committed decision asked for, whatever became of the controller
that made it (killed with -9 at any moment): live workers are watched again, workers that ended
meanwhile are accounted for, and workers committed but never started are started now. A worker
whose shim was started but whose pid was recorded nowhere yet (neither committed nor written by
the shim) is recognised by its start lock and adopted once its pid file appears: it is never
started a second time. A worker that died of the crash (its shim killed before its command ran:
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


def recover(workers: Workers, host_loss: HostLoss) -> None:
    store, supervisor, spares = workers.store, workers.supervisor, workers.spares
    host_loss.look(store, supervisor)  # before anything new starts
    for row in store.worker_rows.select(LIVE_WORKER_STATES):
        if row.pid is None:  # its start was not recorded: handed to a spare, or started, or neither
            row = _adopt_from_pid_file(store, spares.adopt_after_crash(row))
        if row.pid is None and supervisor.started_unrecorded(row):
            row = _await_pid_file(store, supervisor, row)
        if row.pid is None:
            workers.spawn([(row, None)])
            continue
        pidfd = supervisor.pidfd(row)
        if pidfd is None:
            workers.ended(row, host_loss.reason(row))  # judged, started again, or lost: see Workers.ended
            continue
        workers.watch(pidfd, row.id)
        if row.state == "starting":
            with store.transaction():
                store.worker_rows.update(row.id, state="running")
    workers.terminate(store.worker_rows.select(("stopping",)))  # the signal may never have been sent
    for row in spares.rows():
        if row.pid is None:
            row = _adopt_from_pid_file(store, row)
        if row.pid is None and supervisor.started_unrecorded(row):
            row = _await_pid_file(store, supervisor, row)
        pidfd = supervisor.pidfd(row) if row.pid is not None else None
        if pidfd is None:
            with store.transaction():
                store.worker_rows.update(row.id, state="exited", ended_at=time.time())
        else:
            workers.watch(pidfd, row.id)
    spares.refill_after(0.0)


def _adopt_from_pid_file(store: LocalStore, row: WorkerRow) -> WorkerRow:
    """The row with the pid its shim wrote, for a worker whose start was never recorded."""
    recorded = Supervisor.recorded_start(row)
    if recorded is None:
        return row
    with store.transaction():
        store.worker_rows.update(row.id, pid=recorded[0], start_ticks=recorded[1])
    return store.worker_rows.get(row.id)


PID_FILE_WAIT_S = 60.0  # a shim writes its pid file first thing; only a stopped one takes longer


def _await_pid_file(store: LocalStore, supervisor: Supervisor, row: WorkerRow) -> WorkerRow:
    """The row of a worker whose shim lives but has not written its pid file yet, once it has
    (or, if the shim ended first, as it is: then it is started again)."""
    deadline = time.monotonic() + PID_FILE_WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.01)
        row = _adopt_from_pid_file(store, row)
        if row.pid is not None or not supervisor.started_unrecorded(row):
            return row
    raise TimeoutError(f"worker {row.id}'s shim holds its start lock but wrote no pid in {PID_FILE_WAIT_S:.0f} s")
