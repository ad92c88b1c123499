"""What a local cluster's controller does first when it starts: take over from the one before.

The worker table says what a committed decision asked for, whatever became of the controller
that made it (killed with -9 at any moment): live workers are watched again, workers that ended
meanwhile are accounted for, and workers committed but never started are started now.
"""

from __future__ import annotations

import time
from pathlib import Path

from hotswap.backends.local.workers import Workers
from hotswap.store.state import LIVE_WORKER_STATES, Store, WorkerRow


def recover(workers: Workers) -> None:
    store, supervisor, spares = workers.store, workers.supervisor, workers.spares
    for row in store.workers(LIVE_WORKER_STATES):
        if row.pid is None:  # its start was not recorded: handed to a spare, or started, or neither
            row = _adopt_from_pid_file(store, spares.adopt_after_crash(row))
        if row.pid is None:
            workers.spawn([(row, None)])
            continue
        pidfd = supervisor.pidfd(row)
        if pidfd is None:
            workers.exited(row, supervisor.exit_code(row))
            continue
        workers.watch(pidfd, row.id)
        if row.state == "starting":
            with store.transaction():
                store.update_worker(row.id, state="running")
    workers.terminate(store.workers(("stopping",)))  # the signal may never have been sent
    for row in spares.rows():
        if row.pid is None:
            row = _adopt_from_pid_file(store, row)
        pidfd = supervisor.pidfd(row) if row.pid is not None else None
        if pidfd is None:
            with store.transaction():
                store.update_worker(row.id, state="exited", ended_at=time.time())
        else:
            workers.watch(pidfd, row.id)
    spares.refill_after(0.0)


def _adopt_from_pid_file(store: Store, row: WorkerRow) -> WorkerRow:
    """The row with the pid its shim wrote, for a worker whose start was never recorded."""
    try:
        pid_text, ticks_text = (Path(row.dir) / "pid").read_text().split()
    except (FileNotFoundError, ValueError):
        return row
    with store.transaction():
        store.update_worker(row.id, pid=int(pid_text), start_ticks=int(ticks_text))
    return store.worker(row.id)
