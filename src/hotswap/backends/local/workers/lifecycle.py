"""The worker processes of a local cluster, as its controller runs them.

How a worker starts: its row is committed first (state ``starting``, its launch saved beside it),
then its process starts, on a warm spare where one fits (``spares.py``), else cold under the
shim (``supervisor.py``); its pid and kernel start time are recorded and its pidfd is watched.

How a worker stops: :meth:`Workers.mark_stopping` marks its row ``stopping`` with a deadline
(now + its workload's grace period) in the transaction that decides it; after the commit,
:meth:`Workers.terminate` sends SIGTERM (the worker checkpoints) and
:meth:`Workers.expire_grace_periods` SIGKILL at the deadline. A failed node's workers get
SIGKILL at once (:meth:`Workers.kill`): the hardware is gone. However a worker ends, its pidfd
becomes readable; the exit waits in :attr:`WorkerStops.pending_exits` until the round that decides
on it commits it, and the exit code of a worker told to stop is never judged. Only the exit
of a worker's command is the workload's: a worker whose shim was killed before its start was
complete (the kill of a crashing controller can hit the child it has just forked) is started
again, and one whose shim was killed under its running command is reported lost (the core
restarts the workload uncharged): see :meth:`Workers.ended`.

On a GPU-backed slice a GPU is held by a process until it exits, as a Kubernetes device plugin
holds it for a pod until the pod is gone: a worker whose node still runs another worker (a
preempted job saving its state, the previous attempt) waits, committed but not started, until
that one has exited (``gpu_handover.py``). Never two processes on one GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import selectors
import time
from collections.abc import Callable, Collection, Iterable

from hotswap.api.times import iso_utc
from hotswap.api.worker import HOTSWAP_EVENTS_FILE
from hotswap.backends.local import workload_files
from hotswap.backends.local.crash_points import crash_at, crash_at_spawn
from hotswap.backends.local.workers.gpu_handover import GpuHandOver
from hotswap.backends.local.workers.stops import CANNOT_START_EXIT_CODE, REAP_POLL_S, WorkerStops
from hotswap.backends.local.workers.spares import SpareGone, SparePool, preload_modules, spare_environment, starts_like
from hotswap.backends.local.workers.zygotes import Zygote, ZygoteUnusable
from hotswap.backends.local.workers.supervisor import AlreadyStarted, Supervisor, WorkerLaunch
from hotswap.store import faults
from hotswap.store.paths import ClusterPaths, new_dirs_private, open_private
from hotswap.backends.local.tables import LIVE_WORKER_STATES, LocalStore, WorkerRow

ZYGOTE_WAIT_S = 0.5  # a refill waits this long (again) while the zygote still imports


class Workers:
    """The workers of one cluster: starting them (and their warm spares), watching them end."""

    def __init__(
        self,
        store: LocalStore,
        paths: ClusterPaths,
        selector: selectors.BaseSelector,
        spares: tuple[int, tuple[str, ...]],
        grace_s: Callable[[str], float],
        on_exit: Callable[[WorkerRow, int, str | None, bool], None],
        exclusive: Callable[[str], bool] = lambda slice_name: False,
        zygote: bool = False,
    ) -> None:
        """``spares``: the size and preload list of the warm pool; ``grace_s``: a workload's
        grace period; ``on_exit``: told of every worker exit (not of spares'), with why hotswap
        lost the worker when the workload is not to blame (None: judge the code) and whether
        its attempt has no live worker left; ``exclusive``: whether a slice's nodes run one
        worker at a time (GPU-backed slices); ``zygote``: whether workers and spares are forked
        from the cluster's zygote (zygotes.py)."""
        self.store = store
        self.paths = paths
        self.selector = selector
        self.hand_over = GpuHandOver(exclusive)
        self.supervisor = Supervisor(store)
        self.stops = WorkerStops(store, self.supervisor, self.hand_over, grace_s, on_exit)
        self.spares = SparePool(store, self.supervisor, paths.root, *spares)
        self.watched: dict[int, int] = {}  # pidfd -> worker id
        self.zygote = None
        self.use_zygote(zygote)

    # ------------------------------------------------------------------ stopping (the stops' verbs)

    def live(self, workload: str, seq: int, attempt: int | None = None) -> list[WorkerRow]:
        return self.stops.live(workload, seq, attempt)

    def mark_stopping(self, rows: Iterable[WorkerRow], now: float, grace_s: float | None = None) -> None:
        self.stops.mark_stopping(rows, now, grace_s)

    def terminate(self, rows: Iterable[WorkerRow]) -> None:
        self.stops.terminate(rows)

    def kill(self, rows: Iterable[WorkerRow]) -> None:
        self.stops.kill(rows)

    def expire_grace_periods(self) -> None:
        self.stops.expire_grace_periods()

    def stop_everything(self, now: float) -> None:
        """The cluster is being deleted: stop every worker and spare, start no new spare."""
        self.stops.stop(self.store.worker_rows.select(("starting", "running")), now)
        self.kill(self.spares.close())  # a spare has nothing to save
        self.use_zygote(False)

    # ------------------------------------------------------------------ watching

    def on_nodes(self, nodes: Collection[str]) -> list[WorkerRow]:
        return [w for w in self.store.worker_rows.select(LIVE_WORKER_STATES) if w.identity.node in nodes]

    def all_gone(self) -> bool:
        return not self.store.worker_rows.select(LIVE_WORKER_STATES) and not self.spares.rows()

    def next_deadline(self, now: float) -> float | None:
        """Seconds until something is due: a SIGKILL at the end of a grace period, or a refill."""
        deadlines = [w.kill_at for w in self.store.worker_rows.select(("stopping",)) if w.kill_at is not None]
        if self.spares.refill_at is not None:
            deadlines.append(self.spares.refill_at)
        deadlines += [now + REAP_POLL_S] if self.stops.dying else []
        return max(0.0, min(deadlines) - now) if deadlines else None

    # ------------------------------------------------------------------ starting

    def add(self, launch: WorkerLaunch, now: float) -> tuple[WorkerRow, WorkerLaunch]:
        """The worker's row (in the caller's transaction), and its launch with a directory and
        events file of its own (two workers of one attempt may share a replica index: a
        scale-up onto a slice whose old worker is still stopping)."""
        worker_id = self.store.worker_rows.add(
            launch.identity, dir=str(launch.dir), state="starting", started_at=now
        )
        who = launch.identity
        directory = self.paths.workload_dir(who.workload, who.seq)
        events = workload_files.events_path(directory, who.attempt, who.replica, who.host, worker_id)
        launch = dataclasses.replace(
            launch,
            dir=workload_files.worker_dir(directory, worker_id),
            env={**launch.env, HOTSWAP_EVENTS_FILE: str(events)},
            local=tuple(
                dataclasses.replace(p, env={**p.env, HOTSWAP_EVENTS_FILE: str(workload_files.local_events_path(events, rank))})
                for rank, p in enumerate(launch.local, start=1)
            ),
        )
        self.store.worker_rows.update(worker_id, dir=str(launch.dir))
        for needed in (launch.dir, launch.log.parent, events.parent):
            new_dirs_private(needed)
        launch.save()
        return self.store.worker_rows.get(worker_id), launch

    def spawn(self, rows: Iterable[tuple[WorkerRow, WorkerLaunch | None]]) -> None:
        """Start the processes of committed worker rows (on warm spares where one fits; a row
        without a launch has it saved), then record their pids at once. A worker that cannot
        be started ends with 127, like a command that cannot be run, and the failure policy
        decides; the others still start. A worker whose node is still held waits (see the
        module)."""
        started: list[tuple[WorkerRow, int, int | None]] = []
        for row, launch in rows:
            if self._must_wait(row, launch):
                continue
            try:
                launch = launch or WorkerLaunch.saved(row)
                if not row.identity.is_spare and self._start_on_spare(row, launch):
                    continue
                if not row.identity.is_spare:
                    _log_header(row, launch, warm=False)
                pid, ticks = self.supervisor.spawn(row, launch, _forker(self.zygote, self.spares, row, launch))
                if not row.identity.is_spare:  # (test-only: see crash_points.py)
                    crash_at_spawn(pid, launch.dir)
                else:
                    crash_at("spare-spawned")
            except AlreadyStarted:  # its shim lives (a killed controller started it): adopt it
                recorded = self.supervisor.recorded_start(row)
                if recorded is not None:
                    started.append((row, *recorded))
                continue  # (no pid file yet: the next controller's recovery awaits it)
            except (OSError, ValueError, KeyError) as error:  # a launch no process can have (a NUL), or lost
                faults.log()
                self._cannot_start(row, launch, error)
                continue
            started.append((row, pid, ticks))
        with self.store.transaction():
            for row, pid, ticks in started:
                self.store.worker_rows.update(row.id, pid=pid, start_ticks=ticks, state=_started_state(row))
        if started:
            crash_at("spawned")
        for row, pid, ticks in started:
            current = dataclasses.replace(row, pid=pid, start_ticks=ticks, state=_started_state(row))
            pidfd = self.supervisor.pidfd(current)
            if pidfd is None:
                self.ended(current)
            else:
                self.watch(pidfd, row.id)

    def _must_wait(self, row: WorkerRow, launch: WorkerLaunch | None) -> bool:
        """Hold the worker back while another process still runs on its exclusive node."""
        who = row.identity
        if who.is_spare or not self.hand_over.exclusive(who.slice):
            return False
        holder = next(
            (
                w for w in self.store.worker_rows.select(LIVE_WORKER_STATES)
                if w.identity.node == who.node and w.id != row.id and w.pid is not None and w.id not in self.stops.pending_exits
            ),
            None,
        )
        return self.hand_over.wait_for(holder, row, launch)

    def start_waiting(self) -> None:
        """Start the waiting workers whose node is free now (after an exit)."""
        if self.hand_over.waiting:
            self.spawn(self.hand_over.pending())

    def _start_on_spare(self, row: WorkerRow, launch: WorkerLaunch) -> bool:
        """Hand the worker to a warm spare, if one fits and is ready."""
        argv = self.spares.argv_for(launch) if self.spares.size else None
        spare = self.spares.take(launch.env) if argv else None
        if spare is None or argv is None:
            return False
        _log_header(row, launch, warm=True)
        try:
            self.spares.hand_over(spare, row, launch, argv)
        except SpareGone:
            return False  # it died meanwhile: start the worker cold
        for pidfd, watched in list(self.watched.items()):
            if watched == spare.id:
                self.watched[pidfd] = row.id
        if self.zygote is not None and self.zygote.usable():
            self.spares.refill_after(0.0)  # a fork: it takes no CPU from the failover's workers
        return True

    def _cannot_start(self, row: WorkerRow, launch: WorkerLaunch | None, error: Exception) -> None:
        if row.identity.is_spare:  # the pool refills later
            with self.store.transaction():
                self.store.worker_rows.update(row.id, state="exited", exit_code=CANNOT_START_EXIT_CODE)
            return
        if launch is not None:
            with contextlib.suppress(OSError), os.fdopen(open_private(launch.log), "a") as log:
                log.write(f"hotswap: cannot start this worker: {error}\n")
        self.stops.exited(row, CANNOT_START_EXIT_CODE)

    # ------------------------------------------------------------------ ending

    def watch(self, pidfd: int, worker_id: int) -> None:
        self.watched[pidfd] = worker_id
        self.selector.register(pidfd, selectors.EVENT_READ, self._ended)

    def _ended(self, pidfd: int) -> None:
        worker_id = self.watched.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        row = self.store.worker_rows.get(worker_id)
        if row.state == "warm":  # a spare died before it was used
            with self.store.transaction():
                self.store.worker_rows.update(row.id, state="exited", exit_code=self.supervisor.exit_code(row), ended_at=time.time())
            self.spares.died()
            return
        self.ended(row)

    def ended(self, row: WorkerRow, host_lost: str | None = None) -> None:
        """A worker's process is gone (seen by this controller or found by recovery): judged,
        or started again (see :meth:`WorkerStops.ended`)."""
        self.spawn([(again, None) for again in self.stops.ended(row, host_lost)])

    def finish_dying(self) -> None:
        self.spawn([(again, None) for again in self.stops.finish_dying()])

    # ------------------------------------------------------------------ warm spares

    def resize_spares(self, size: int, preload: tuple[str, ...] | None) -> None:
        self.terminate(self.spares.resize(size, preload))
        if self.zygote is not None and preload is not None:
            self.zygote.modules = preload_modules(preload)
            self.zygote.start()  # a new one where the modules changed

    def use_zygote(self, on: bool) -> None:
        """Keep the cluster's zygote (start it, or adopt the one left by a killed controller), or not."""
        if on and self.zygote is None:
            self.zygote = Zygote(self.paths.root, preload_modules(self.spares.preload), spare_environment())
            self.zygote.start()
        elif not on and self.zygote is not None:
            self.zygote.stop()
            self.zygote = None

    def refill_spares_if_due(self) -> None:
        if not self.spares.refill_due():
            return
        if self.zygote is not None and self.zygote.importing():
            self.spares.refill_after(ZYGOTE_WAIT_S)  # a fork soon, rather than an import now
            return
        for _ in range(self.spares.wanted()):
            self.spawn([self.spares.new_spare(time.time())])


def _forker(
    zygote: Zygote | None, spares: SparePool, row: WorkerRow, launch: WorkerLaunch
) -> Callable[[int], tuple[int, int | None] | None] | None:
    """How the zygote would start this worker or spare (None: it cannot; start it cold)."""
    if zygote is None:
        return None
    what: dict[str, object]
    if row.identity.is_spare:
        what = {"spare": str(launch.dir)}
    else:
        argv = spares.argv_for(launch)
        if argv is None or not starts_like(zygote.environment, launch.env, True):
            return None  # not a Python script the zygote's interpreter runs as it would
        what = {"assignment": {"argv": argv, "env": launch.env, "cwd": launch.cwd, "log": str(launch.log)}}

    def fork(lock: int) -> tuple[int, int | None] | None:
        try:
            return zygote.fork(launch, lock, what)
        except ZygoteUnusable as error:
            zygote.say_once(str(error))
            return None

    return fork


def _started_state(row: WorkerRow) -> str:
    return row.state if row.identity.is_spare else "running"  # a spare stays "warm"


def _log_header(row: WorkerRow, launch: WorkerLaunch, warm: bool) -> None:
    who = row.identity
    with os.fdopen(open_private(launch.log), "a") as log:
        log.write(
            f"--- hotswap: attempt {who.attempt} of {who.workload} on {who.slice} host {who.host}"
            f" (node {who.node}){' on a warm spare' if warm else ''} at {iso_utc(time.time(), 2)} ---\n"
        )

