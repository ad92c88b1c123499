"""The controller of a local cluster: one daemon per cluster, event-driven.

It waits on one selector for three things and nothing else: a CLI connecting to its Unix
socket (a new request is in the database), a worker process ending (a pidfd becomes readable),
and the next deadline (a SIGKILL after a grace period). Each wake-up becomes one decision round
of the pure core; the round's new state, its timeline and the workers it implies are committed
in one transaction *before* any process is started or signalled, so a controller killed with
-9 at any moment finds, when restarted, everything it needs to finish the job: workers to
start, workers to watch again, requests still to answer.

Run it with ``python -m hotswap.runtime.local_controller <cluster-dir>``; the CLI does that
whenever it finds no controller running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import resource
import selectors
import signal
import socket
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hotswap.api.catalog import get_device_type
from hotswap.api.cluster import node_name, slice_name
from hotswap.api.spec import WorkloadSpec
from hotswap.api.worker import HOTSWAP_EVENTS_FILE, Membership
from hotswap.backends.local import launch as files
from hotswap.backends.local.spares import DEFAULT_PRELOAD, SpareGone, SparePool
from hotswap.backends.local.supervisor import Supervisor, WorkerLaunch
from hotswap.core import actions as act
from hotswap.core import events as ev
from hotswap.core.model import Snapshot, Workload
from hotswap.core.policy import SchedulerConfig
from hotswap.core.scheduler import decide
from hotswap.store.codec import workload_to_json
from hotswap.store.paths import ClusterPaths, new_dirs_private
from hotswap.store.state import LIVE_WORKER_STATES, Request, Store, WorkerRow

LIVE = LIVE_WORKER_STATES
CANNOT_START_EXIT_CODE = 127  # what a shell reports for a command it cannot run
SPARE_REFILL_DELAY_S = 5.0  # let a failover's workers have the CPU before new spares import torch


class AlreadyRunning(Exception):
    """Another controller holds this cluster's lock."""


@dataclasses.dataclass
class _Outcome:
    status: str = "done"
    message: str = ""


class LocalController:
    def __init__(self, paths: ClusterPaths) -> None:
        self.paths = paths
        self.store = Store.open(paths.database)
        self.cluster = self.store.cluster()
        self.config = self._scheduler_config()
        self.supervisor = Supervisor(self.store)
        self.selector = selectors.DefaultSelector()
        self.watched: dict[int, int] = {}  # pidfd -> worker id
        self.waiters: dict[int, list[socket.socket]] = {}  # request id -> connections
        self.buffers: dict[socket.socket, bytes] = {}
        self.pending_events: list[ev.Event] = []
        # Worker exits seen but not yet committed: they are written in the transaction of the
        # round that decides on them, so a crash in between is repaired by _recover (the
        # worker is then found dead again) and no exit is ever decided on twice or never.
        self.pending_exits: dict[int, tuple[int, float]] = {}  # worker id -> (code, ended at)
        self.shutting_down: int | None = None  # request id of a shutdown in progress
        self.stopped = False
        self.snapshot: Snapshot = self.store.load_snapshot(time.time())
        settings = self.cluster.settings
        self.spares = SparePool(
            self.store,
            self.supervisor,
            paths.root,
            int(settings.get("warm_workers", 0)),
            tuple(settings.get("warm_preload", DEFAULT_PRELOAD)),
        )
        self.refill_at: float | None = None

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> None:
        _raise_descriptor_limit()  # a pidfd per worker: big clusters need many descriptors
        lock = self._lock()
        try:
            if self.store.deleted():
                return  # the cluster is being removed: nothing to serve, ever
            listener = self._listen()
            self.selector.register(listener, selectors.EVENT_READ, ("listener", None))
            # A signal must wake the select (PEP 475 would otherwise resume it): the wakeup
            # fd gets a byte for every signal, and the handler asks the loop to end.
            wake_read, wake_write = socket.socketpair()
            wake_read.setblocking(False)
            wake_write.setblocking(False)
            signal.set_wakeup_fd(wake_write.fileno(), warn_on_full_buffer=False)
            self.selector.register(wake_read, selectors.EVENT_READ, ("signal", None))
            signal.signal(signal.SIGTERM, lambda *_: self._stop_loop())
            signal.signal(signal.SIGINT, lambda *_: self._stop_loop())
            self._recover()
            while not self.stopped:
                timeout = self._next_deadline()
                for key, _ in self.selector.select(timeout):
                    kind, value = key.data
                    if kind == "listener":
                        self._accept(listener)
                    elif kind == "connection":
                        self._read(key.fileobj)  # type: ignore[arg-type]
                    elif kind == "worker":
                        self._worker_ended(key.fd)
                    elif kind == "signal":
                        with contextlib.suppress(BlockingIOError):
                            key.fileobj.recv(64)  # type: ignore[union-attr]
                if self.stopped:
                    break
                self._expire_grace_periods()
                self._refill_spares_if_due()
                self._work()
        finally:
            with contextlib.suppress(OSError):
                self.paths.socket.unlink()
            os.close(lock)

    def _stop_loop(self) -> None:
        self.stopped = True

    def _lock(self) -> int:
        descriptor = os.open(self.paths.lock, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise AlreadyRunning(self.paths.name) from None
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"{os.getpid()}\n".encode())
        return descriptor

    def _listen(self) -> socket.socket:
        with contextlib.suppress(FileNotFoundError):
            self.paths.socket.unlink()  # stale: we hold the lock, nobody else serves it
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.paths.socket))
        os.chmod(self.paths.socket, 0o600)
        listener.listen(128)
        listener.setblocking(False)
        return listener

    # ------------------------------------------------------------------ wake-ups

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except BlockingIOError:
                return
            except OSError:  # out of descriptors: the client retries, we keep serving
                traceback.print_exc()
                return
            connection.setblocking(False)
            self.buffers[connection] = b""
            self.selector.register(connection, selectors.EVENT_READ, ("connection", None))
            self._read(connection)  # its first line has often arrived with it

    def _read(self, connection: socket.socket) -> None:
        try:
            data = connection.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(connection)
            return
        self.buffers[connection] += data
        while b"\n" in self.buffers.get(connection, b""):
            line, rest = self.buffers[connection].split(b"\n", 1)
            self.buffers[connection] = rest
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                self._drop(connection)
                return
            if "ping" in message:
                self._send(connection, {"pong": os.getpid()})
            elif "wait" in message:
                request = self.store.request(int(message["wait"]))
                if request is not None and request.status != "pending":
                    self._send(connection, self._reply(request))
                else:
                    self.waiters.setdefault(int(message["wait"]), []).append(connection)

    def _drop(self, connection: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(connection)
        self.buffers.pop(connection, None)
        for waiting in self.waiters.values():
            if connection in waiting:
                waiting.remove(connection)
        connection.close()

    def _send(self, connection: socket.socket, message: dict[str, Any]) -> None:
        try:
            connection.setblocking(True)
            connection.sendall((json.dumps(message) + "\n").encode())
            connection.setblocking(False)
        except OSError:
            self._drop(connection)

    @staticmethod
    def _reply(request: Request) -> dict[str, Any]:
        return {"id": request.id, "status": request.status, "message": request.message}

    def _answer(self, request_id: int) -> None:
        request = self.store.request(request_id)
        if request is None:
            return
        for connection in self.waiters.pop(request_id, []):
            self._send(connection, self._reply(request))

    def _worker_ended(self, pidfd: int) -> None:
        worker_id = self.watched.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        row = self.store.worker(worker_id)
        if row.state == "warm":  # a spare died before it was used
            with self.store.transaction():
                self.store.update_worker(row.id, state="exited", exit_code=self.supervisor.exit_code(row), ended_at=time.time())
            if self.shutting_down is None:
                self.spares.failures += 1
                self.refill_at = time.time() + 1.0
            return
        self._record_exit(row, self.supervisor.exit_code(row))

    def _record_exit(self, row: WorkerRow, code: int) -> None:
        self.pending_exits[row.id] = (code, time.time())
        if row.state != "stopping":
            # A worker told to stop (preempted, restarted, scaled away, drained) ends as asked:
            # its exit code says nothing about the workload and is never judged.
            self.pending_events.append(ev.WorkerExited(row.workload, row.attempt, row.slice, row.host, code))
        workload = self.snapshot.workloads.get(row.workload)
        if workload is not None and workload.seq == row.seq:
            if not self._live_workers(row.workload, row.seq, row.attempt):
                self.pending_events.append(ev.WorkersStopped(row.workload, row.attempt))

    def _commit_exits(self) -> None:
        """Write the pending exits (inside the caller's transaction)."""
        for worker_id, (code, ended_at) in self.pending_exits.items():
            self.store.update_worker(worker_id, state="exited", exit_code=code, ended_at=ended_at)
        self.pending_exits.clear()

    def _live_workers(self, workload: str, seq: int, attempt: int | None = None) -> list[WorkerRow]:
        return [
            w
            for w in self.store.workers(LIVE, workload)
            if w.seq == seq and (attempt is None or w.attempt == attempt) and w.id not in self.pending_exits
        ]

    def _next_deadline(self) -> float | None:
        deadlines = [w.kill_at for w in self.store.workers(("stopping",)) if w.kill_at is not None]
        if self.refill_at is not None:
            deadlines.append(self.refill_at)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.time())

    def _expire_grace_periods(self) -> None:
        now = time.time()
        for row in self.store.workers(("stopping",)):
            if row.kill_at is not None and row.kill_at <= now:
                self.supervisor.signal(row, signal.SIGKILL)
                with self.store.transaction():
                    self.store.update_worker(row.id, kill_at=None)

    def _scheduler_config(self) -> SchedulerConfig:
        """The recovery policy of this cluster: hotswap and elastic unless turned off."""
        settings = self.cluster.settings
        return SchedulerConfig(hotswap=bool(settings.get("hotswap", True)), elastic=bool(settings.get("elastic", True)))

    def _set_policy(self, hotswap: bool) -> None:
        record = dataclasses.replace(self.cluster, settings={**self.cluster.settings, "hotswap": hotswap})
        self.store.update_cluster(record)
        self.cluster = record
        self.config = self._scheduler_config()

    def _set_spare_pool(self, size: int, preload: list[str] | None) -> None:
        """Resize the pool of warm spares (a cluster setting, kept in its record)."""
        settings = {**self.cluster.settings, "warm_workers": size}
        if preload is not None:
            settings["warm_preload"] = preload
            self.spares.preload = tuple(preload)
        record = dataclasses.replace(self.cluster, settings=settings)
        self.store.update_cluster(record)
        self.cluster = record
        self.spares.size = size
        self.spares.failures = 0
        for row in self.spares.rows()[size:]:
            self.supervisor.signal(row, signal.SIGTERM)
        self.refill_at = time.time()

    def _refill_spares_if_due(self) -> None:
        if self.shutting_down is not None:
            self.refill_at = None  # no new spares for a cluster going away
            return
        if self.refill_at is None or self.refill_at > time.time():
            return
        self.refill_at = None
        for _ in range(self.spares.wanted()):
            row, launch = self.spares.new_spare(time.time())
            self._spawn_rows([(row, launch)])

    # ------------------------------------------------------------------ recovery after a restart

    def _recover(self) -> None:
        """Re-adopt live workers, account for those that ended while nobody watched, and start
        the workers a committed decision asked for but a crash left unstarted."""
        for row in self.store.workers(LIVE):
            if row.pid is None:
                row = self._adopt_from_pid_file(self.spares.adopt_after_crash(row))
            if row.pid is None:
                self._spawn_rows([(row, None)])
                continue
            pidfd = self.supervisor.pidfd(row)
            if pidfd is None:
                self._record_exit(row, self.supervisor.exit_code(row))
                continue
            self._watch(pidfd, row.id)
            if row.state == "starting":
                with self.store.transaction():
                    self.store.update_worker(row.id, state="running")
        for row in self.store.workers(("stopping",)):
            self.supervisor.signal(row, signal.SIGTERM)
        for row in self.spares.rows():
            if row.pid is None:
                row = self._adopt_from_pid_file(row)
            pidfd = self.supervisor.pidfd(row) if row.pid is not None else None
            if pidfd is None:
                with self.store.transaction():
                    self.store.update_worker(row.id, state="exited", ended_at=time.time())
            else:
                self._watch(pidfd, row.id)
        self.refill_at = time.time()

    def _adopt_from_pid_file(self, row: WorkerRow) -> WorkerRow:
        try:
            pid_text, ticks_text = (Path(row.dir) / "pid").read_text().split()
        except (FileNotFoundError, ValueError):
            return row
        pid, ticks = int(pid_text), int(ticks_text)
        with self.store.transaction():
            self.store.update_worker(row.id, pid=pid, start_ticks=ticks)
        return self.store.worker(row.id)

    def _watch(self, pidfd: int, worker_id: int) -> None:
        self.watched[pidfd] = worker_id
        self.selector.register(pidfd, selectors.EVENT_READ, ("worker", worker_id))

    # ------------------------------------------------------------------ the work of a wake-up

    def _work(self) -> None:
        """Serve pending requests one per round, then any remaining worker events."""
        for request in self.store.pending_requests():
            if request.id == self.shutting_down:
                continue  # answered once every worker is gone
            if self.shutting_down is not None:
                self._finish(request, _Outcome("rejected", "the cluster is being deleted"))
                continue
            self._serve(request)
        if self.shutting_down is not None:
            with self.store.transaction():
                self._commit_exits()
            self.pending_events.clear()  # workers are being stopped on purpose: no restarts
            if not self.store.workers(LIVE) and not self.spares.rows():
                self._finish_shutdown()
            return
        if self.pending_events:
            self._round([], None)
        elif self.pending_exits:  # exits nobody decides on (a deleted workload's workers)
            with self.store.transaction():
                self._commit_exits()

    def _serve(self, request: Request) -> None:
        payload = request.payload
        try:
            if request.kind == "create":
                self._round([ev.WorkloadCreated(WorkloadSpec.model_validate(payload["spec"]))], request)
            elif request.kind == "delete":
                if payload["workload"] not in self.snapshot.workloads:
                    self._finish(request, _Outcome("rejected", f"no workload named {payload['workload']} in cluster {self.cluster.name}"))
                    return
                self._round([ev.WorkloadDeleted(payload["workload"])], request)
            elif request.kind == "node":
                self._serve_node(request)
            elif request.kind == "resize":
                if "warm_workers" in payload:
                    self._set_spare_pool(int(payload["warm_workers"]), payload.get("warm_preload"))
                if "hotswap" in payload:
                    self._set_policy(bool(payload["hotswap"]))
                self._round(self._resize_events(int(payload["num_slices"])), request)
            elif request.kind == "shutdown":
                self._begin_shutdown(request)
            else:
                self._finish(request, _Outcome("rejected", f"unknown request {request.kind!r}"))
        except Exception as error:  # a bug: answer, log it, keep serving the other requests
            traceback.print_exc()
            current = self.store.request(request.id)
            if current is not None and current.status == "pending":
                self._finish(request, _Outcome("rejected", f"internal error: {error!r}"))

    def _serve_node(self, request: Request) -> None:
        operation, nodes = request.payload["op"], request.payload["nodes"]
        unknown = [n for n in nodes if n not in self.snapshot.nodes]
        if unknown:
            self._finish(request, _Outcome("rejected", f"no node named {unknown[0]} in cluster {self.cluster.name}"))
            return
        workers = [w for w in self.store.workers(LIVE) if w.node in set(nodes)]
        if operation == "fail":
            for row in workers:  # the hardware is gone: no grace
                self.supervisor.signal(row, signal.SIGKILL)
            events: list[ev.Event] = [ev.NodeFailed(n) for n in nodes]
        elif operation == "drain":
            now = time.time()
            for row in workers:
                self._stop_worker(row, now)
            events = [ev.NodeDrained(n) for n in nodes]
        elif operation == "cordon":
            events = [ev.NodeCordoned(n) for n in nodes]
        else:
            events = [ev.NodeRepaired(n) for n in nodes]
        self._round(events, request)

    def _resize_events(self, num_slices: int) -> list[ev.Event]:
        device = get_device_type(self.cluster.device_type)
        current = sorted(self.snapshot.slices.values(), key=lambda s: s.ordinal)
        if num_slices >= len(current):
            used = {s.name for s in current}
            events: list[ev.Event] = []
            index = 0
            while len(current) + len(events) < num_slices:
                name = slice_name(self.cluster.name, index)
                index += 1
                if name in used:
                    continue
                nodes = tuple(node_name(name, h) for h in range(device.hosts_per_slice))
                events.append(ev.SliceAdded(name, device.name, nodes))
            return events
        # Remove free slices first (highest first), then held ones: their holders are moved
        # by the core like after a cordon, never left half-placed.
        held = self.snapshot.holders
        order = sorted(current, key=lambda s: (s.name in held, -s.ordinal))
        return [ev.SliceRemoved(s.name) for s in order[: len(current) - num_slices]]

    def _begin_shutdown(self, request: Request) -> None:
        self.shutting_down = request.id
        now = time.time()
        for row in self.store.workers(("starting", "running")):
            self._stop_worker(row, now)
        for row in self.spares.rows():
            self.supervisor.signal(row, signal.SIGTERM)

    def _finish_shutdown(self) -> None:
        request_id = self.shutting_down
        assert request_id is not None
        with self.store.transaction():
            self.store.mark_deleted()
            self.store.finish_request(request_id, "done")
        self._answer(request_id)
        self.stopped = True

    def _finish(self, request: Request, outcome: _Outcome) -> None:
        with self.store.transaction():
            self.store.finish_request(request.id, outcome.status, outcome.message)
            if outcome.status == "rejected":
                self.store.record_event(time.time(), "rejected", f"{request.kind}: {outcome.message}")
        self._answer(request.id)

    # ------------------------------------------------------------------ one decision round

    def _round(self, events: list[ev.Event], request: Request | None) -> None:
        now = time.time()
        inputs = self.pending_events + events
        old = self.snapshot
        decision = decide(old, inputs, now, self.config)
        new = decision.snapshot
        outcome = _Outcome()
        to_start: list[WorkerLaunch] = []
        to_stop: list[WorkerRow] = []
        with self.store.transaction():
            for event in inputs:
                if isinstance(event, ev.WorkloadCreated) and event.spec.name in new.workloads:
                    created = new.workloads[event.spec.name]
                    if old.workloads.get(event.spec.name) is not created and request is not None:
                        self.store.add_workload(event.spec.name, workload_to_json(created), request.payload["launch"])
            self.store.save_snapshot(old, new)
            self._record_inputs(inputs, old, new, now)
            for action in decision.actions:
                if isinstance(action, act.Reject) and request is not None and request.kind == "create":
                    outcome = _Outcome("rejected", f"workload {action.workload} rejected: {action.reason}")
                self._record_action(action, old, new, now)
                starts, stops = self._effects(action, old, new, now)
                to_start += starts
                to_stop += stops
            started = [self._add_worker_row(launch, now) for launch in to_start]
            self._commit_exits()
            if request is not None:
                self.store.finish_request(request.id, outcome.status, outcome.message)
        self.pending_events = []
        self.snapshot = new
        if request is not None:
            self._answer(request.id)  # committed: the caller may go on
        # Effects only after the commit: a crash from here on is repaired by _recover. Stops
        # first: they free the CPU the new workers are about to need.
        for row in to_stop:
            self.supervisor.signal(row, signal.SIGTERM)
        self._spawn_rows(started)

    def _effects(
        self, action: act.Action, old: Snapshot, new: Snapshot, now: float
    ) -> tuple[list[WorkerLaunch], list[WorkerRow]]:
        """Workers to start and to stop for one action (rows updated in the open transaction)."""
        workload = new.workloads.get(action.workload) or old.workloads.get(action.workload)
        if workload is None or isinstance(action, (act.Reject, act.Complete)):
            return [], []
        stops: list[WorkerRow] = []
        starts: list[WorkerLaunch] = []
        live = self._live_workers(workload.name, workload.seq)
        if isinstance(action, (act.Preempt, act.Requeue, act.Fail, act.Remove)):
            stops = [w for w in live if w.state != "stopping"]
        elif isinstance(action, act.Restart):
            stops = [w for w in live if w.attempt < action.attempt and w.state != "stopping"]
            if action.start:
                starts = self._launches(workload, action.slices, action.attempt, action.slices, new)
        elif isinstance(action, act.Admit):
            stops = [w for w in live if w.attempt < action.attempt and w.state != "stopping"]
            if action.start:
                starts = self._launches(workload, action.slices, action.attempt, action.slices, new)
        elif isinstance(action, act.StartWorkers):
            starts = self._launches(workload, action.slices, action.attempt, action.slices, new)
        elif isinstance(action, act.ScaleDown):
            removed = set(action.removed)
            stops = [w for w in live if w.slice in removed and w.state != "stopping"]
            self._publish(workload, action.slices, new)
        elif isinstance(action, act.ScaleUp):
            self._publish(workload, action.slices, new)
            starts = self._launches(workload, action.slices, workload.attempt, action.added, new, publish=False)
        for row in stops:
            self._stop_worker(row, now, commit=False)
        return starts, stops

    def _stop_worker(self, row: WorkerRow, now: float, commit: bool = True) -> None:
        grace = self._grace(row.workload)
        fields = {"state": "stopping", "stop_requested_at": now, "kill_at": now + grace}
        if commit:
            with self.store.transaction():
                self.store.update_worker(row.id, **fields)
            self.supervisor.signal(row, signal.SIGTERM)
        else:
            self.store.update_worker(row.id, **fields)

    def _grace(self, workload: str) -> float:
        record = self.snapshot.workloads.get(workload)
        return record.spec.termination_grace_period_s if record is not None else 30.0

    def _publish(self, workload: Workload, slices: tuple[str, ...], snapshot: Snapshot) -> tuple[int, int]:
        """A new membership generation with its own rendezvous port (elastic workloads)."""
        generation, _ = self.store.membership(workload.name)
        port = files.free_port()
        generation += 1
        self.store.set_membership(workload.name, generation, port)
        if workload.spec.min_slices is not None:
            hosts = len(snapshot.slices[slices[0]].nodes) if slices else 1
            files.publish_membership(
                self._workload_dir(workload),
                Membership(generation, tuple(slices), hosts, files.LOCALHOST, port),
            )
        return generation, port

    def _launches(
        self,
        workload: Workload,
        slices: tuple[str, ...],
        attempt: int,
        targets: tuple[str, ...],
        snapshot: Snapshot,
        publish: bool = True,
    ) -> list[WorkerLaunch]:
        if publish:
            self._publish(workload, slices, snapshot)
        _, port = self.store.membership(workload.name)
        launch = self.store.launch(workload.name)
        new_dirs_private(Path(launch["checkpoint_dir"]))  # training state is the owner's alone
        directory = self._workload_dir(workload)
        elastic = workload.spec.min_slices is not None
        launches = []
        for slice_ in targets:
            replica = slices.index(slice_)
            nodes = snapshot.slices[slice_].nodes
            for host, node in enumerate(nodes):
                env = files.worker_environment(
                    base=launch["environ"],
                    user=launch["user_env"],
                    cluster=self.cluster.name,
                    workload=workload.name,
                    slices=slices,
                    num_slices=workload.spec.num_slices,
                    replica=replica,
                    host=host,
                    hosts_per_slice=len(nodes),
                    attempt=attempt,
                    master_port=port,
                    checkpoint_dir=launch["checkpoint_dir"],
                    events_file=None,  # one per worker process, set with its row
                    grace_s=workload.spec.termination_grace_period_s,
                    membership_file=files.membership_path(directory) if elastic else None,
                )
                launches.append(
                    WorkerLaunch(
                        workload=workload.name,
                        seq=workload.seq,
                        attempt=attempt,
                        slice=slice_,
                        replica=replica,
                        host=host,
                        node=node,
                        dir=directory / "workers",  # one per worker process, set with its row
                        log=files.log_path(directory, replica, host),
                        command=workload.spec.command,
                        cwd=launch["cwd"],
                        env=env,
                    )
                )
        return launches

    def _add_worker_row(self, launch: WorkerLaunch, now: float) -> tuple[WorkerRow, WorkerLaunch]:
        """The worker's row, and its launch with a directory and events file of its own (two
        workers of one attempt may share a replica index: a scale-up onto a slice whose old
        worker is still stopping)."""
        worker_id = self.store.add_worker(
            workload=launch.workload,
            seq=launch.seq,
            attempt=launch.attempt,
            slice=launch.slice,
            replica=launch.replica,
            host=launch.host,
            node=launch.node,
            dir=str(launch.dir),
            state="starting",
            started_at=now,
        )
        directory = self.paths.workload_dir(launch.workload, launch.seq)
        events = files.events_path(directory, launch.attempt, launch.replica, launch.host, worker_id)
        launch = dataclasses.replace(
            launch,
            dir=files.worker_dir(directory, worker_id),
            env={**launch.env, HOTSWAP_EVENTS_FILE: str(events)},
        )
        self.store.update_worker(worker_id, dir=str(launch.dir))
        launch.dir.mkdir(parents=True, exist_ok=True)
        launch.log.parent.mkdir(parents=True, exist_ok=True)
        events.parent.mkdir(parents=True, exist_ok=True)
        (launch.dir / "launch.json").write_text(
            json.dumps({"command": launch.command, "cwd": launch.cwd, "env": launch.env, "log": str(launch.log)})
        )
        return self.store.worker(worker_id), launch

    def _spawn_rows(self, rows: list[tuple[WorkerRow, WorkerLaunch | None]]) -> None:
        """Start the processes of committed worker rows (on warm spares where one fits), then
        record their pids at once. A worker that cannot be started ends with 127, like a
        command that cannot be run, and the failure policy decides; the others still start."""
        started: list[tuple[WorkerRow, int, int | None]] = []
        for row, launch in rows:
            try:
                launch = launch or self._saved_launch(row)
                if row.workload and self._start_on_spare(row, launch):
                    continue
                if row.workload:
                    self._log_header(row, launch, warm=False)
                pid, ticks = self.supervisor.spawn(row, launch)
            except OSError as error:
                traceback.print_exc()
                self._cannot_start(row, launch, error)
                continue
            started.append((row, pid, ticks))
        with self.store.transaction():
            for row, pid, ticks in started:
                state = "running" if row.workload else row.state  # a spare stays "warm"
                self.store.update_worker(row.id, pid=pid, start_ticks=ticks, state=state)
        for row, pid, ticks in started:
            current = dataclasses.replace(row, pid=pid, start_ticks=ticks, state="running" if row.workload else row.state)
            pidfd = self.supervisor.pidfd(current)
            if pidfd is None:
                self._record_exit(current, self.supervisor.exit_code(current))
            else:
                self._watch(pidfd, row.id)

    def _cannot_start(self, row: WorkerRow, launch: WorkerLaunch | None, error: OSError) -> None:
        if not row.workload:  # a spare: the pool refills later
            with self.store.transaction():
                self.store.update_worker(row.id, state="exited", exit_code=CANNOT_START_EXIT_CODE)
            return
        if launch is not None:
            with contextlib.suppress(OSError), open(launch.log, "a") as log:
                log.write(f"hotswap: cannot start this worker: {error}\n")
        self._record_exit(row, CANNOT_START_EXIT_CODE)

    def _start_on_spare(self, row: WorkerRow, launch: WorkerLaunch) -> bool:
        """Hand the worker to a warm spare, if one fits and is ready."""
        argv = self.spares.argv_for(launch) if self.spares.size else None
        spare = self.spares.take(launch.env) if argv else None
        if spare is None or argv is None:
            return False
        self._log_header(row, launch, warm=True)
        try:
            self.spares.hand_over(spare, row, launch, argv)
        except SpareGone:
            return False  # it died meanwhile: start the worker cold
        for pidfd, watched in list(self.watched.items()):
            if watched == spare.id:
                self.watched[pidfd] = row.id
        self.refill_at = time.time() + SPARE_REFILL_DELAY_S
        return True

    @staticmethod
    def _log_header(row: WorkerRow, launch: WorkerLaunch, warm: bool) -> None:
        with open(launch.log, "a") as log:
            log.write(
                f"--- hotswap: attempt {row.attempt} of {row.workload} on {row.slice} host {row.host}"
                f" (node {row.node}){' on a warm spare' if warm else ''} at {_iso(time.time())} ---\n"
            )

    @staticmethod
    def _saved_launch(row: WorkerRow) -> WorkerLaunch:
        saved = json.loads((Path(row.dir) / "launch.json").read_text())
        return WorkerLaunch(
            workload=row.workload, seq=row.seq, attempt=row.attempt, slice=row.slice, replica=row.replica,
            host=row.host, node=row.node, dir=Path(row.dir), log=Path(saved["log"]), command=saved["command"],
            cwd=saved["cwd"], env=saved["env"],
        )

    def _workload_dir(self, workload: Workload) -> Path:
        return self.paths.workload_dir(workload.name, workload.seq)

    # ------------------------------------------------------------------ the timeline

    def _record_inputs(self, inputs: list[ev.Event], old: Snapshot, new: Snapshot, now: float) -> None:
        for event in inputs:
            if isinstance(event, (ev.NodeFailed, ev.NodeCordoned, ev.NodeDrained, ev.NodeRepaired)):
                verb = {
                    ev.NodeFailed: "failed",
                    ev.NodeCordoned: "cordoned",
                    ev.NodeDrained: "drained",
                    ev.NodeRepaired: "repaired (uncordoned)",
                }[type(event)]
                node = old.nodes.get(event.node)
                holder = old.holders.get(node.slice) if node else None
                self.store.record_event(now, f"node-{verb.split()[0]}", f"node {event.node} {verb}")
                if holder is not None:
                    held = old.workloads[holder]
                    self.store.record_event(now, "node", f"node {event.node} {verb}", holder, held.seq)
            elif isinstance(event, ev.SliceAdded):
                self.store.record_event(now, "slice-added", f"slice {event.name} added")
            elif isinstance(event, ev.SliceRemoved):
                self.store.record_event(now, "slice-removed", f"slice {event.name} removed")
            elif isinstance(event, ev.WorkloadCreated) and event.spec.name in new.workloads:
                created = new.workloads[event.spec.name]
                if old.workloads.get(event.spec.name) is not created and created.created_at == now:
                    self.store.record_event(now, "created", "created", created.name, created.seq)
            elif isinstance(event, ev.WorkerExited):
                workload = old.workloads.get(event.workload)
                if workload is not None and event.code != 0:
                    self.store.record_event(
                        now,
                        "worker-exited",
                        f"worker {event.slice}/{event.host} of attempt {event.attempt} exited with code {event.code}",
                        workload.name,
                        workload.seq,
                        {"code": event.code, "attempt": event.attempt},
                    )

    def _record_action(self, action: act.Action, old: Snapshot, new: Snapshot, now: float) -> None:
        workload = new.workloads.get(action.workload) or old.workloads.get(action.workload)
        seq = workload.seq if workload is not None else None
        name = action.workload
        match action:
            case act.Reject(reason=reason):
                message, seq = f"rejected: {reason}", None
            case act.Admit(slices=slices, attempt=attempt, start=start):
                message = f"admitted on {', '.join(slices)} (attempt {attempt})" + ("" if start else "; waiting for old workers")
            case act.Preempt(reason=reason):
                message = reason
            case act.Restart(slices=slices, attempt=attempt, reason=reason, start=start):
                message = f"restarted on {', '.join(slices)} (attempt {attempt}): {reason}" + (
                    "" if start else "; waiting to start"
                )
            case act.StartWorkers(slices=slices, attempt=attempt):
                message = f"workers started on {', '.join(slices)} (attempt {attempt})"
            case act.Requeue(reason=reason):
                message = f"requeued: {reason}"
            case act.ScaleDown(removed=removed, slices=slices, reason=reason):
                message = f"scaled down to {len(slices)} slice(s), without {', '.join(removed)}: {reason}"
            case act.ScaleUp(added=added, slices=slices):
                message = f"scaled up to {len(slices)} slice(s), adding {', '.join(added)}"
            case act.Fail(reason=reason):
                message = f"failed: {reason}"
            case act.Complete():
                message = "completed: every worker exited 0"
            case act.Remove():
                message = "deleted"
            case _:
                message = repr(action)
        kind = type(action).__name__.lower()
        self.store.record_event(now, kind, message, name, seq, dataclasses.asdict(action))


def _raise_descriptor_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hotswap.runtime.local_controller <cluster-dir>", file=sys.stderr)
        return 2
    root = Path(args[0])
    paths = ClusterPaths(root.name, root)
    try:
        LocalController(paths).run()
    except (AlreadyRunning, FileNotFoundError):
        return 0  # another controller serves it, or the cluster was deleted meanwhile
    return 0


if __name__ == "__main__":
    sys.exit(main())
