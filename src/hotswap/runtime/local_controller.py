"""The controller of a local cluster: one daemon per cluster, event-driven.

It waits on one selector for a few things and nothing else: a CLI connecting to its Unix
socket (a new request is in the database), a worker process ending (a pidfd becomes readable),
a line from the GPU health probe of a GPU-backed cluster (``gpu_health.py``), and the next
deadline (a SIGKILL after a grace period, the next look for hangs, a silent probe). Each
wake-up becomes one decision round of the pure core; the round's new state, its timeline and the workers it implies are committed
in one transaction *before* any process is started or signalled, so a controller killed with
-9 at any moment finds, when restarted, everything it needs to finish the job: workers to
start, workers to watch again, requests still to answer.

This module keeps the loop, the requests and the round. The rest is in ``backends/local``:
the socket (``server.py``, speaking ``protocol.py``), worker processes and warm spares
(``workers.py``), what actions do to workers (``effects.py``), taking over after a crash
(``recovery.py``), the timeline's text (``timeline.py``), hang detection (``hangs.py``) and
the GPUs behind a GPU-backed cluster's slices (``gpus.py``).

Run it with ``python -m hotswap.runtime.local_controller <cluster-dir>``; the CLI does that
whenever it finds no controller running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import resource
import selectors
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hotswap.api.catalog import get_device_type
from hotswap.api.cluster import node_name, slice_name
from hotswap.api.errors import ConflictError
from hotswap.api.spec import WorkloadSpec
from hotswap.api.worker import DEFAULT_GRACE_PERIOD_S
from hotswap.backends.local import effects, timeline
from hotswap.backends.local.effects import Launcher
from hotswap.backends.local.gpus import Backing
from hotswap.backends.local.hangs import HangWatch
from hotswap.backends.local.protocol import NodeOperation, RequestKind
from hotswap.backends.local.recovery import recover
from hotswap.backends.local.server import RequestServer
from hotswap.backends.local.spares import DEFAULT_PRELOAD
from hotswap.backends.local.supervisor import WorkerLaunch
from hotswap.backends.local.workers import Workers
from hotswap.core import actions as act
from hotswap.core import events as ev
from hotswap.core.model import Snapshot
from hotswap.core.policy import SchedulerConfig
from hotswap.core.scheduler import decide
from hotswap.runtime.gpu_health import GpuHealthMonitor
from hotswap.store import registry
from hotswap.store.codec import workload_to_json
from hotswap.store.paths import ClusterPaths
from hotswap.store.state import ClusterRecord, Request, Store, WorkerRow

NODE_EVENTS: dict[NodeOperation, Callable[[str], ev.Event]] = {
    NodeOperation.FAIL: ev.NodeFailed,
    NodeOperation.DRAIN: ev.NodeDrained,
    NodeOperation.CORDON: ev.NodeCordoned,
    NodeOperation.UNCORDON: ev.NodeRepaired,
}


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
        self.selector = selectors.DefaultSelector()  # each registration's data is its callback
        self.server = RequestServer(paths, self.selector, self.store)
        settings = self.cluster.settings
        self.backing = Backing.of(settings)  # None: an emulated cluster
        spares = (int(settings.get("warm_workers", 0)), tuple(settings.get("warm_preload", DEFAULT_PRELOAD)))
        self.workers = Workers(
            self.store, paths, self.selector, spares, self._grace, self._worker_exited,
            exclusive=lambda _: self.backing is not None,
        )
        self.launcher = Launcher(self.store, paths, lambda: self.backing)
        self.hangs = HangWatch(
            paths, lambda w: self.workers.live(w.name, w.seq, w.attempt), lambda: self.backing.per_host if self.backing else 1
        )
        self.health = GpuHealthMonitor(self.selector, self._note, self._fail_nodes)
        self.pending_events: list[ev.Event] = []
        self.shutting_down: int | None = None  # request id of a shutdown in progress
        self.stopped = False
        self.wake: tuple[socket.socket, socket.socket] | None = None  # see _wake_on_signals
        self.snapshot: Snapshot = self.store.load_snapshot(time.time())
        self._handlers: dict[RequestKind, Callable[[Request], None]] = {
            RequestKind.CREATE: self._create,
            RequestKind.DELETE: self._delete,
            RequestKind.NODE: self._node,
            RequestKind.RESIZE: self._resize,
            RequestKind.SHUTDOWN: self._begin_shutdown,
        }

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> None:
        _raise_descriptor_limit()  # a pidfd per worker: big clusters need many descriptors
        lock = self._lock()
        try:
            if self.store.deleted():
                return  # the cluster is being removed: nothing to serve, ever
            self.server.open()
            self.wake = self._wake_on_signals()
            recover(self.workers)
            self.health.watch(self.backing)
            while not self.stopped:
                for key, _ in self.selector.select(self._timeout(time.time())):
                    key.data(key.fileobj)
                if self.stopped:
                    break
                now = time.time()
                self.health.tick(now)
                self.workers.expire_grace_periods()
                self.workers.start_waiting()
                self.workers.refill_spares_if_due()
                if self.shutting_down is None:
                    self.pending_events += self.hangs.check(self.snapshot, now)
                self._work()
        finally:
            self.health.close()
            self.server.close()
            os.close(lock)

    def _timeout(self, now: float) -> float | None:
        """Seconds until the earliest thing due: a SIGKILL, a refill, a look for hangs, the probe."""
        due = [
            d for d in (
                self.workers.next_deadline(now), self.hangs.next_deadline(self.snapshot, now), self.health.next_deadline(now)
            )
            if d is not None
        ]
        return min(due, default=None)

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

    def _wake_on_signals(self) -> tuple[socket.socket, socket.socket]:
        """A signal must wake the select (PEP 475 would otherwise resume it): the wakeup fd gets
        a byte for every signal, and the handler asks the loop to end. Returns the socket pair,
        which must live as long as the loop."""
        wake_read, wake_write = socket.socketpair()
        wake_read.setblocking(False)
        wake_write.setblocking(False)
        signal.set_wakeup_fd(wake_write.fileno(), warn_on_full_buffer=False)
        self.selector.register(wake_read, selectors.EVENT_READ, _drain)
        signal.signal(signal.SIGTERM, lambda *_: self._stop_loop())
        signal.signal(signal.SIGINT, lambda *_: self._stop_loop())
        return wake_read, wake_write

    # ------------------------------------------------------------------ settings

    def _scheduler_config(self) -> SchedulerConfig:
        """The recovery policy of this cluster: hotswap and elastic unless turned off."""
        settings = self.cluster.settings
        return SchedulerConfig(hotswap=bool(settings.get("hotswap", True)), elastic=bool(settings.get("elastic", True)))

    def _update_settings(self, changes: dict[str, Any]) -> None:
        record = dataclasses.replace(self.cluster, settings={**self.cluster.settings, **changes})
        self.store.update_cluster(record)
        self.cluster = record
        self.config = self._scheduler_config()

    def _grace(self, workload: str) -> float:
        record = self.snapshot.workloads.get(workload)
        return record.spec.termination_grace_period_s if record is not None else DEFAULT_GRACE_PERIOD_S

    # ------------------------------------------------------------------ requests

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
                self.workers.commit_exits()
            self.pending_events.clear()  # workers are being stopped on purpose: no restarts
            if self.workers.all_gone():
                self._finish_shutdown()
            return
        if self.pending_events:
            self._round([], None)
        elif self.workers.pending_exits:  # exits nobody decides on (a deleted workload's workers)
            with self.store.transaction():
                self.workers.commit_exits()

    def _serve(self, request: Request) -> None:
        try:
            kind = RequestKind(request.kind)
        except ValueError:
            self._finish(request, _Outcome("rejected", f"unknown request {request.kind!r}"))
            return
        try:
            self._handlers[kind](request)
        except Exception as error:  # a bug: answer, log it, keep serving the other requests
            traceback.print_exc()
            current = self.store.request(request.id)
            if current is not None and current.status == "pending":
                self._finish(request, _Outcome("rejected", f"internal error: {error!r}"))

    def _create(self, request: Request) -> None:
        self._round([ev.WorkloadCreated(WorkloadSpec.model_validate(request.payload["spec"]))], request)

    def _delete(self, request: Request) -> None:
        name = request.payload["workload"]
        if name not in self.snapshot.workloads:
            self._finish(request, _Outcome("rejected", f"no workload named {name} in cluster {self.cluster.name}"))
            return
        self._round([ev.WorkloadDeleted(name)], request)

    def _node(self, request: Request) -> None:
        operation, nodes = NodeOperation(request.payload["op"]), request.payload["nodes"]
        unknown = [n for n in nodes if n not in self.snapshot.nodes]
        if unknown:
            self._finish(request, _Outcome("rejected", f"no node named {unknown[0]} in cluster {self.cluster.name}"))
            return
        hit = self.workers.on_nodes(set(nodes))
        if operation is NodeOperation.FAIL:
            self.workers.kill(hit)  # the hardware is gone: no grace
        elif operation is NodeOperation.DRAIN:
            self.workers.stop(hit, time.time())
        elif operation is NodeOperation.UNCORDON:
            self.health.repaired(nodes)
        self._round([NODE_EVENTS[operation](n) for n in nodes], request)

    def _fail_nodes(self, failures: list[tuple[str, str]]) -> None:
        """Broken GPUs (the health monitor): their nodes fail as after ``node fail``, with why."""
        known = [(node, reason) for node, reason in failures if node in self.snapshot.nodes]
        self.workers.kill(self.workers.on_nodes({node for node, _ in known}))
        self.pending_events += [ev.NodeFailed(node, reason) for node, reason in known]

    def _note(self, kind: str, message: str, data: dict[str, Any]) -> None:
        with self.store.transaction():
            self.store.record_event(time.time(), kind, message, data=data)

    def _resize(self, request: Request) -> None:
        payload = request.payload
        events = resize_events(self.snapshot, self.cluster, int(payload["num_slices"]))
        backing = self.backing
        if backing is not None:
            try:  # checked before anything changes; recorded before a worker could need it
                backing = backing.after_resize(events, payload.get("gpus"))
            except ConflictError as error:
                self._finish(request, _Outcome("rejected", error.message))
                return
        if "warm_workers" in payload:
            size, preload = int(payload["warm_workers"]), payload.get("warm_preload")
            settings: dict[str, Any] = {"warm_workers": size}
            if preload is not None:
                settings["warm_preload"] = preload
            self._update_settings(settings)
            self.workers.resize_spares(size, None if preload is None else tuple(preload))
        if "hotswap" in payload:
            self._update_settings({"hotswap": bool(payload["hotswap"])})
        if backing is not None:
            self.backing = backing
            self._update_settings({"gpus": backing.to_settings()})
            self.health.watch(backing)
        self._round(events, request)

    def _begin_shutdown(self, request: Request) -> None:
        self.shutting_down = request.id
        self.workers.stop_everything(time.time())

    def _finish_shutdown(self) -> None:
        request_id = self.shutting_down
        assert request_id is not None
        with self.store.transaction():
            self.store.mark_deleted()
            self.store.finish_request(request_id, "done")
        self.server.answer(request_id)
        self.stopped = True

    def _finish(self, request: Request, outcome: _Outcome) -> None:
        with self.store.transaction():
            self.store.finish_request(request.id, outcome.status, outcome.message)
            if outcome.status == "rejected":
                self.store.record_event(time.time(), "rejected", f"{request.kind}: {outcome.message}")
        self.server.answer(request.id)

    # ------------------------------------------------------------------ one decision round

    def _worker_exited(self, row: WorkerRow, code: int) -> None:
        """A worker's exit as the core's events (for the next round)."""
        who = row.identity
        if row.state != "stopping":
            # A worker told to stop (preempted, restarted, scaled away, drained) ends as asked:
            # its exit code says nothing about the workload and is never judged.
            self.pending_events.append(ev.WorkerExited(who.workload, who.attempt, who.slice, who.host, code))
        workload = self.snapshot.workloads.get(who.workload)
        if workload is not None and workload.seq == who.seq:
            if not self.workers.live(who.workload, who.seq, who.attempt):
                self.pending_events.append(ev.WorkersStopped(who.workload, who.attempt))

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
            if request is not None:
                self._register_created(inputs, old, new, request)
            self.store.save_snapshot(old, new)
            for entry in timeline.input_entries(inputs, old, new, now):
                self.store.record_event(now, *entry)
            for action in decision.actions:
                if isinstance(action, act.Reject) and request is not None and request.kind == RequestKind.CREATE:
                    outcome = _Outcome("rejected", f"workload {action.workload} rejected: {action.reason}")
                self.store.record_event(now, *timeline.action_entry(action, old, new))
                workload = new.workloads.get(action.workload) or old.workloads.get(action.workload)
                if workload is None:
                    continue
                plan = effects.plan(action, workload, self.workers.live(workload.name, workload.seq))
                self.workers.mark_stopping(plan.stop, now)
                to_stop += plan.stop
                to_start += self.launcher.launches(workload, plan, new)
            started = [self.workers.add(launch, now) for launch in to_start]
            self.workers.commit_exits()
            if request is not None:
                self.store.finish_request(request.id, outcome.status, outcome.message)
        self.pending_events = []
        self.snapshot = new
        if request is not None:
            self.server.answer(request.id)  # committed: the caller may go on
        # Effects only after the commit: a crash from here on is repaired by recovery. Stops
        # first: they free the CPU the new workers are about to need.
        self.workers.terminate(to_stop)
        self.workers.spawn(started)

    def _register_created(self, inputs: list[ev.Event], old: Snapshot, new: Snapshot, request: Request) -> None:
        """Store the launch record of a workload this round created (before its record)."""
        for event in inputs:
            if isinstance(event, ev.WorkloadCreated) and event.spec.name in new.workloads:
                created = new.workloads[event.spec.name]
                if old.workloads.get(event.spec.name) is not created:
                    self.store.add_workload(event.spec.name, workload_to_json(created), request.payload["launch"])


def resize_events(snapshot: Snapshot, cluster: ClusterRecord, num_slices: int) -> list[ev.Event]:
    """The slices to add (new names, as few as needed) or remove to give the cluster
    ``num_slices`` slices. Free slices go first (highest first), then held ones: their holders
    are moved by the core like after a cordon, never left half-placed."""
    device = get_device_type(cluster.device_type)
    current = sorted(snapshot.slices.values(), key=lambda s: s.ordinal)
    if num_slices >= len(current):
        used = {s.name for s in current}
        events: list[ev.Event] = []
        index = 0
        while len(current) + len(events) < num_slices:
            name = slice_name(cluster.name, index)
            index += 1
            if name in used:
                continue
            nodes = tuple(node_name(name, h) for h in range(device.hosts_per_slice))
            events.append(ev.SliceAdded(name, device.name, nodes))
        return events
    held = snapshot.holders
    order = sorted(current, key=lambda s: (s.name in held, -s.ordinal))
    return [ev.SliceRemoved(s.name) for s in order[: len(current) - num_slices]]


def _drain(wake: socket.socket) -> None:
    with contextlib.suppress(BlockingIOError):
        wake.recv(64)


def _raise_descriptor_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


def run_local_controller(cluster: str) -> None:
    """``hotswap controller run`` for a local cluster: serve it from this process until a
    signal ends it (a one-line error when a controller serves it already)."""
    paths = registry.existing(cluster)
    try:
        LocalController(paths).run()
    except AlreadyRunning:
        raise ConflictError(
            f"the controller of cluster {cluster} is already running (pid {paths.controller_pid()})"
        ) from None


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
