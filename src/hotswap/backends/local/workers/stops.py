"""Stopping a local cluster's workers, and deciding on their ends (for ``lifecycle.py``, whose
module says how a worker stops): the SIGTERM, the SIGKILL at the grace deadline, how an ended
worker ended and whether it is judged, started again or reported lost, and its exit held until
the round that decides on it commits it.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable, Iterable

from hotswap.backends.local.workers.gpu_handover import GpuHandOver
from hotswap.backends.local.workers.supervisor import Ending, Supervisor
from hotswap.backends.local.tables import LIVE_WORKER_STATES, LocalStore, WorkerRow

CANNOT_START_EXIT_CODE = 127  # what a shell reports for a command it cannot run
MAX_START_AGAIN = 3  # starts of one worker made again (its shim killed before its command ran)
REAP_POLL_S = 0.05  # how often the loop looks whether what a killed shim left has died
LOST_REASON = "was lost: its shim was killed while the command ran (not the workload's fault)"


class WorkerStops:
    """Stopping workers, and holding their exits until the round that decides on them commits
    them (see the module). Owned by :class:`Workers`, which hands it what it stops with."""

    def __init__(
        self,
        store: LocalStore,
        supervisor: Supervisor,
        hand_over: GpuHandOver,
        grace_s: Callable[[str], float],
        on_exit: Callable[[WorkerRow, int, str | None, bool], None],
    ) -> None:
        self.store = store
        self.supervisor = supervisor
        self.hand_over = hand_over
        self.grace_s = grace_s
        self.on_exit = on_exit
        # Exits seen but not yet committed: they are written in the transaction of the round
        # that decides on them, so a crash in between is repaired by recovery (the worker is
        # then found dead again) and no exit is ever decided on twice or never.
        self.pending_exits: dict[int, tuple[int, float]] = {}  # worker id -> (code, ended at)
        self.started_again: dict[int, int] = {}  # worker id -> starts made again (see ended)
        self.dying: dict[int, tuple[WorkerRow, str | None, tuple[int, Ending]]] = {}  # see ended

    def live(self, workload: str, seq: int, attempt: int | None = None) -> list[WorkerRow]:
        """The workload's workers that are, or may be, alive (and not seen ended)."""
        return [
            w
            for w in self.store.worker_rows.select(LIVE_WORKER_STATES, workload)
            if w.identity.seq == seq
            and (attempt is None or w.identity.attempt == attempt)
            and w.id not in self.pending_exits
        ]

    def mark_stopping(self, rows: Iterable[WorkerRow], now: float, grace_s: float | None = None) -> None:
        """Record that the workers must stop, and their SIGKILL deadline: their workload's grace
        period, or ``grace_s`` (0 for a failed node's workers). In the caller's transaction;
        :meth:`terminate` (or :meth:`kill`) them once it is committed."""
        for row in rows:
            grace = self.grace_s(row.identity.workload) if grace_s is None else grace_s
            self.store.worker_rows.update(row.id, state="stopping", stop_requested_at=now, kill_at=now + grace)

    def terminate(self, rows: Iterable[WorkerRow]) -> None:
        for row in rows:
            if self._never_started(row):
                continue
            self.supervisor.signal(row, signal.SIGTERM)
            self.supervisor.signal(row, signal.SIGCONT)  # a stopped (SIGSTOP, hung) process acts on it

    def stop(self, rows: list[WorkerRow], now: float) -> None:
        """Stop workers gracefully, outside a round: mark them, commit, SIGTERM."""
        with self.store.transaction():
            self.mark_stopping(rows, now)
        self.terminate(rows)

    def kill(self, rows: Iterable[WorkerRow]) -> None:
        for row in rows:
            if not self._never_started(row):
                self.supervisor.signal(row, signal.SIGKILL)

    def _never_started(self, row: WorkerRow) -> bool:
        """A waiting worker told to stop ends without having run (its exit is never judged)."""
        if not self.hand_over.release(row.id):
            return False
        self.exited(dataclasses.replace(row, state="stopping"), 0)
        return True

    def expire_grace_periods(self) -> None:
        now = time.time()
        for row in self.store.worker_rows.select(("stopping",)):
            if row.kill_at is not None and row.kill_at <= now:
                self.supervisor.signal(row, signal.SIGKILL)
                with self.store.transaction():
                    self.store.worker_rows.update(row.id, kill_at=None)

    def exited(self, row: WorkerRow, code: int, lost: str | None = None) -> None:
        """A worker has ended: hold its exit for the next round, and tell the controller (and
        whether its attempt has no live worker left)."""
        self.pending_exits[row.id] = (code, time.time())
        who = row.identity
        self.on_exit(row, code, lost, not self.live(who.workload, who.seq, who.attempt))

    def ended(self, row: WorkerRow, host_lost: str | None = None, how: tuple[int, Ending] | None = None) -> list[WorkerRow]:
        """A worker's process is gone; returns it if it is to be started again. Only its
        command's exit is the workload's to answer for: a start whose shim was killed before
        the command ran is made again (it never counts), and a worker whose shim was killed
        while the command ran on is reported lost, which restarts the workload without
        charging it (see :class:`~hotswap.backends.local.workers.supervisor.Ending`), as is
        one killed with its shim when recovery found the host lost with it (``host_lost``
        says why: see ``controller/host_loss.py``). What a killed shim left is decided on once
        it has died (:meth:`finish_dying`; never waited for in place)."""
        code, ending = how or self.supervisor.ending(row)
        if ending in (Ending.NEVER_RAN, Ending.ORPHANED) and not self.supervisor.group_gone(row):
            self.dying[row.id] = (row, host_lost, (code, ending))
        elif row.state == "stopping" or row.identity.is_spare:
            self.exited(row, code)  # told to stop: how it ended is never judged
        elif ending is Ending.KILLED and host_lost is not None:
            self.exited(row, code, host_lost)
        elif ending is Ending.NEVER_RAN and self.started_again.get(row.id, 0) < MAX_START_AGAIN:
            self.started_again[row.id] = self.started_again.get(row.id, 0) + 1
            with self.store.transaction():  # a start committed without a pid again (see recovery)
                self.store.worker_rows.update(row.id, pid=None, start_ticks=None)
            return [dataclasses.replace(row, pid=None, start_ticks=None)]
        elif ending is Ending.NEVER_RAN:  # (as a command that cannot be run)
            self.exited(row, CANNOT_START_EXIT_CODE)
        else:
            self.exited(row, code, LOST_REASON if ending is Ending.ORPHANED else None)
        return []

    def finish_dying(self) -> list[WorkerRow]:
        """Decide on the ended workers whose killed processes have all died since; returns
        those to start again."""
        gone = [i for i, (row, _, _) in self.dying.items() if self.supervisor.group_gone(row)]
        return [again for worker_id in gone for again in self.ended(*self.dying.pop(worker_id))]

    def commit_exits(self) -> list[int]:
        """Write the pending exits (inside the caller's transaction); returns the workers to
        hand to :meth:`exits_committed` once that transaction has committed (an exit whose
        write was rolled back stays pending)."""
        for worker_id, (code, ended_at) in self.pending_exits.items():
            self.store.worker_rows.update(worker_id, state="exited", exit_code=code, ended_at=ended_at)
        return list(self.pending_exits)

    def exits_committed(self, worker_ids: Iterable[int]) -> None:
        for worker_id in worker_ids:
            self.pending_exits.pop(worker_id, None)
