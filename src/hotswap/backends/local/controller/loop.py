"""The controller of a local cluster: one daemon per cluster, event-driven.

It waits on one selector for a few things and nothing else: a CLI connecting to its Unix
socket (a new request is in the database), a worker process ending (a pidfd becomes readable),
a line from the GPU health probe of a GPU-backed cluster (``gpu_health.py``), and the next
deadline (a SIGKILL after a grace period, the next look for hangs, a silent probe). Each
wake-up becomes one decision round of the pure core; the round's new state, its timeline and the workers it implies are committed
in one transaction *before* any process is started or signalled, so a controller killed with
-9 at any moment finds, when restarted, everything it needs to finish the job: workers to
start, workers to watch again, requests still to answer.

Exactly one controller serves a cluster: it holds the OS lock of ``backends/local/claim.py``
for its whole life, reads the cluster's state only once it holds it, and checks it before every
commit and every signal. Faults of the machine (a full disk, a locked database) refuse the
request at hand and change nothing; the controller serves on.

This module keeps the loop, the requests and the round (LocalController runs a little past 250
lines on purpose: they share the in-memory snapshot and the open transaction). What a request asks of a round is in
``local_requests.py``; the rest is in ``backends/local``: the socket (``server.py``, speaking
``protocol.py``), worker processes and warm spares (``workers.py``), what actions do to workers
(``effects.py``), taking over after a crash (``recovery.py``), the timeline's text
(``timeline.py``), hang detection (``hangs.py``) and the GPUs behind a GPU-backed cluster's
slices (``gpus.py``).

Run it with ``python -m hotswap.backends.local.controller.loop <cluster-dir>``; the CLI does that
whenever it finds no controller running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import selectors
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

from hotswap.api.worker import DEFAULT_GRACE_PERIOD_S
from hotswap.backends.kit.metrics import ControllerMetrics
from hotswap.backends.local import effects, protocol, timeline
from hotswap.backends.local.claim import AlreadyClaimed, Claim, LostClaim
from hotswap.backends.local.controller.gpu_health import GpuHealthMonitor
from hotswap.backends.local.controller.hangs import HangWatch
from hotswap.backends.local.controller.metrics import LocalFigures
from hotswap.backends.local.controller.recovery import recover
from hotswap.backends.local.controller.requests import Refusal, RoundInputs, round_inputs
from hotswap.backends.local.controller.server import RequestServer
from hotswap.backends.local.effects import Launcher
from hotswap.backends.local.gpus import Backing
from hotswap.backends.local.protocol import RequestKind
from hotswap.backends.local.spares import DEFAULT_PRELOAD
from hotswap.backends.local.supervisor import WorkerLaunch
from hotswap.backends.local.workers import Workers
from hotswap.core import actions as act
from hotswap.core import events as ev
from hotswap.core.model import Snapshot
from hotswap.core.policy import SchedulerConfig
from hotswap.core.scheduler import decide
from hotswap.store import faults
from hotswap.store.codec import workload_to_json
from hotswap.store.paths import ClusterPaths
from hotswap.store.state import ClusterRecord, Request, Store, WorkerRow

class AlreadyRunning(Exception):
    """Another controller holds this cluster's lock."""


class _Withdrawn(Exception):
    """The request was withdrawn by its submitter before this round could commit it."""


@dataclasses.dataclass
class _Outcome:
    status: str = protocol.DONE
    message: str = ""


RETRY_S = 1.0  # after a fault of the machine (a full disk), try the round again
MAX_SLEEP_S = 3600.0  # select() must never get a timeout it cannot hold


class LocalController:
    def __init__(self, paths: ClusterPaths, metrics: ControllerMetrics | None = None) -> None:
        self.paths = paths
        self.figures = LocalFigures(metrics) if metrics is not None else None  # Prometheus, when served
        self.claim: Claim | None = None
        self.selector = selectors.DefaultSelector()  # each registration's data is its callback
        self.pending_events: list[ev.Event] = []
        self.failed_gpu_nodes: dict[str, str] = {}  # node -> why (the health probe), for the next round
        self.deleting = False  # `cluster delete` began: stop every worker, serve nothing, exit
        self.stopped = False
        self.retry_at: float | None = None
        self.wake: tuple[socket.socket, socket.socket] | None = None  # see _wake_on_signals

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> None:
        _raise_descriptor_limit()  # a pidfd per worker: big clusters need many descriptors
        try:
            self.start()
            if self.figures is not None:
                self.figures.metrics.observed(self.snapshot)
            self.wake = _wake_on_signals(self.selector, self._stop_loop)
            self.step()  # what was queued while no controller ran
            while not self.stopped:
                for key, _ in self.selector.select(self._sleep_s()):
                    key.data(key.fileobj)
                if not self.stopped:
                    self.step()
        finally:
            self.close()

    def start(self) -> None:
        """Claim the cluster, and only then read its state: a controller that read first could
        act on a view older than its predecessor's last commit. Then listen and take over."""
        try:
            self.claim = Claim.take(self.paths)
        except AlreadyClaimed:
            raise AlreadyRunning(self.paths.name) from None
        self.store = Store.open(self.paths.database)
        self.claim.announce(self.store)
        self.cluster = self.store.cluster()
        self.config = _scheduler_config(self.cluster)
        settings = self.cluster.settings
        self.backing = Backing.of(settings)  # None: an emulated cluster
        spares = (int(settings.get("warm_workers", 0)), tuple(settings.get("warm_preload", DEFAULT_PRELOAD)))
        self.server = RequestServer(self.paths, self.selector, self.store)
        self.workers = Workers(
            self.store, self.paths, self.selector, spares, self._grace, self._worker_exited,
            exclusive=lambda _: self.backing is not None,
        )
        self.launcher = Launcher(self.store, self.paths, lambda: self.backing)
        self.hangs = HangWatch(
            self.paths,
            lambda w: self.workers.live(w.name, w.seq, w.attempt),
            lambda: self.backing.per_host if self.backing else 1,
        )
        self.health = GpuHealthMonitor(self.selector, self._note, self._fail_nodes)
        self.snapshot: Snapshot = self.store.load_snapshot(time.time())
        self.deleting = self.store.deleted()
        self.server.open()
        recover(self.workers)
        self.health.watch(None if self.deleting else self.backing)
        if self.deleting:  # a controller stopped half-way through `cluster delete`: finish it
            self.workers.stop_everything(time.time())

    def step(self) -> None:
        """One wake-up: everything that is due, after checking that the cluster is still ours."""
        assert self.claim is not None
        self.claim.verify()
        try:
            now = time.time()
            self.server.ensure_listening()
            self.claim.keep_pid_file()
            self.health.tick(now)
            self.workers.expire_grace_periods()
            self.workers.start_waiting()
            if not self.deleting:
                self.workers.refill_spares_if_due()
                self.pending_events += self.hangs.check(self.snapshot, now)
            self._work()
            if self.figures is not None:
                self.figures.check_recoveries(self.snapshot, self._running, time.time())
            self.retry_at = None
        except Exception as error:
            if not faults.is_fault(error):
                raise
            faults.log(f"hotswap: {faults.explain(error)}; retrying")
            self.retry_at = time.time() + RETRY_S

    def close(self) -> None:
        if self.claim is None:
            return
        if hasattr(self, "server"):
            self.health.close()
            self.server.close()
            self.store.close()
        self.claim.release()

    def _sleep_s(self) -> float | None:
        now = time.time()
        try:
            due = (
                self.workers.next_deadline(now),
                None if self.deleting else self.hangs.next_deadline(self.snapshot, now),
                self.health.next_deadline(now),
            )
            deadline = min((d for d in due if d is not None), default=None)
        except Exception as error:
            if not faults.is_fault(error):
                raise
            deadline = RETRY_S
        if self.retry_at is not None:
            deadline = min(deadline if deadline is not None else MAX_SLEEP_S, max(0.0, self.retry_at - now))
        return None if deadline is None else min(deadline, MAX_SLEEP_S)

    def _stop_loop(self) -> None:
        self.stopped = True

    # ------------------------------------------------------------------ settings

    def _fail_nodes(self, failures: list[tuple[str, str]]) -> None:
        """Broken GPUs (the health monitor): their nodes fail in the next round, as after
        ``node fail`` — committed first, then their workers are killed."""
        for node, reason in failures:
            if node in self.snapshot.nodes:
                self.failed_gpu_nodes[node] = reason

    def _note(self, kind: str, message: str, data: dict[str, Any]) -> None:
        with self.store.transaction():
            self.store.record_event(time.time(), kind, message, data=data)

    def _grace(self, workload: str) -> float:
        record = self.snapshot.workloads.get(workload)
        return record.spec.termination_grace_period_s if record is not None else DEFAULT_GRACE_PERIOD_S

    # ------------------------------------------------------------------ requests

    def _work(self) -> None:
        """Serve pending requests one per round, then any remaining worker events."""
        for request in self.store.pending_requests():
            if self.deleting:
                self._finish(request, _Outcome(protocol.REJECTED, f"cluster {self.cluster.name} is being deleted"))
                continue
            self._serve(request)
        if self.deleting:
            self._commit_exits()
            self.pending_events.clear()  # workers are being stopped on purpose: no restarts
            if self.workers.all_gone():
                self.stopped = True
            return
        if self.failed_gpu_nodes:
            failed, self.failed_gpu_nodes = self.failed_gpu_nodes, {}
            self._round(
                RoundInputs(
                    [ev.NodeFailed(node, reason) for node, reason in failed.items()],
                    hit=self.workers.on_nodes(set(failed)),
                    kill=True,
                ),
                None,
            )
        elif self.pending_events:
            self._round(RoundInputs([]), None)
        elif self.workers.pending_exits:  # exits nobody decides on (a deleted workload's workers)
            self._commit_exits()

    def _commit_exits(self) -> None:
        with self.store.transaction():
            written = self.workers.commit_exits()
        self.workers.exits_committed(written)

    def _serve(self, request: Request) -> None:
        try:
            kind = protocol.check_payload(request.kind, request.payload)
        except protocol.ProtocolError as problem:
            self._finish(request, _Outcome(protocol.REJECTED, f"refused: {problem}"))
            return
        try:
            if kind is RequestKind.SHUTDOWN:
                self._begin_shutdown(request)
                return
            inputs = round_inputs(request, kind, self.snapshot, self.cluster, self.workers.on_nodes)
            if isinstance(inputs, Refusal):
                self._finish(request, _Outcome(protocol.REJECTED, inputs.message))
                return
            self._round(inputs, request)
            if inputs.warm_workers is not None:  # committed: now the pool may change
                self.workers.resize_spares(inputs.warm_workers, inputs.warm_preload)
            if inputs.repaired:  # committed: a repaired GPU may be judged afresh
                self.health.repaired(inputs.repaired)
        except _Withdrawn:
            self.server.answer(request.id)
        except LostClaim:
            raise
        except Exception as error:
            if faults.is_fault(error):  # a full disk, a locked database: refuse, change nothing
                self._refuse(request, str(faults.explain(error)))
                return
            faults.log()  # a bug: answer, log it, keep serving the other requests
            self._finish(request, _Outcome(protocol.REJECTED, f"internal error: {error!r}"))

    def _refuse(self, request: Request, message: str) -> None:
        """Refuse a request whose round could not be committed; if even the refusal cannot be
        written, tell the waiting CLI so (it stays queued) and try again soon."""
        faults.log(f"hotswap: request {request.id} ({request.kind}): {message}")
        try:
            with self.store.transaction():
                if self.store.is_pending(request.id):
                    self.store.finish_request(request.id, protocol.FAULT, message)
        except Exception as error:
            if not faults.is_fault(error):
                raise
            self.server.fail(request.id, message)
            self.retry_at = time.time() + RETRY_S
            return
        self.server.answer(request.id)

    def _begin_shutdown(self, request: Request) -> None:
        """`cluster delete`: commit that the cluster is being deleted (so that any controller
        from now on finishes the job, and a re-run of the command can), answer, then stop every
        worker; the loop ends once they are all gone."""
        with self.store.transaction():
            if not self.store.is_pending(request.id):
                raise _Withdrawn()
            self.store.mark_deleted()
            self.store.finish_request(request.id, protocol.DONE, "stopping every worker")
        self.server.answer(request.id)
        self.deleting = True
        self.workers.stop_everything(time.time())

    def _finish(self, request: Request, outcome: _Outcome) -> None:
        with self.store.transaction():
            if not self.store.is_pending(request.id):
                return  # withdrawn meanwhile: its submitter has its answer
            self.store.finish_request(request.id, outcome.status, outcome.message)
            if outcome.status == protocol.REJECTED:
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

    def _round(self, inputs: RoundInputs, request: Request | None) -> None:
        """Decide, commit the decision with everything it implies, then act (see
        :class:`~hotswap.backends.local.controller.requests.RoundInputs` for what a request adds)."""
        assert self.claim is not None
        now, began = time.time(), time.perf_counter()
        events = self.pending_events + inputs.events
        old, cluster, hit = self.snapshot, inputs.cluster, inputs.hit
        config = _scheduler_config(cluster) if cluster is not None else self.config
        decision = decide(old, events, now, config)
        new = decision.snapshot
        outcome = _Outcome()
        to_start: list[WorkerLaunch] = []
        to_stop: list[WorkerRow] = []
        with self.store.transaction():
            self.claim.verify()  # under the database's write lock: nobody else acts meanwhile
            if request is not None and not self.store.is_pending(request.id):
                raise _Withdrawn()
            if cluster is not None:
                self.store.update_cluster(cluster)
            if request is not None:
                self._register_created(events, old, new, request)
            self.store.save_snapshot(old, new)
            for entry in timeline.input_entries(events, old, new, now):
                self.store.record_event(now, *entry)
            for action in decision.actions:
                if isinstance(action, act.Reject) and request is not None and request.kind == RequestKind.CREATE:
                    outcome = _Outcome(protocol.REJECTED, f"workload {action.workload} rejected: {action.reason}")
                self.store.record_event(now, *timeline.action_entry(action, old, new))
                workload = new.workloads.get(action.workload) or old.workloads.get(action.workload)
                if workload is None:
                    continue
                plan = effects.plan(action, workload, self.workers.live(workload.name, workload.seq))
                self.workers.mark_stopping(plan.stop, now)
                to_stop += plan.stop
                to_start += self.launcher.launches(workload, plan, new)
            self.workers.mark_stopping(hit, now, grace_s=0.0 if inputs.kill else None)
            started = [self.workers.add(launch, now) for launch in to_start]
            exits = self.workers.commit_exits()
            if request is not None:
                self.store.finish_request(request.id, outcome.status, outcome.message)
        self.workers.exits_committed(exits)
        self.pending_events = []
        self.snapshot = new
        if cluster is not None:
            self.cluster, self.config = cluster, config
            backing = Backing.of(cluster.settings)
            if backing != self.backing:
                self.backing = backing
                self.health.watch(backing)
        if request is not None:
            self.server.answer(request.id)  # committed: the caller may go on
        # Effects only after the commit: a crash from here on is repaired by recovery. Kills
        # first, then stops: they free the CPU the new workers are about to need.
        killed = {row.id for row in hit} if inputs.kill else set()
        self.workers.kill(row for row in hit if row.id in killed)
        self.workers.terminate(row for row in {r.id: r for r in to_stop + hit}.values() if row.id not in killed)
        self.workers.spawn(started)
        if self.figures is not None:
            writes = len(started) + len({r.id for r in to_stop + hit})
            self.figures.round_done(decision.actions, new, now, time.perf_counter() - began, writes)

    def _running(self, workload: str, seq: int, attempt: int) -> int:
        return sum(1 for row in self.workers.live(workload, seq, attempt) if row.pid is not None)

    def _register_created(self, inputs: list[ev.Event], old: Snapshot, new: Snapshot, request: Request) -> None:
        """Store the launch record of a workload this round created (before its record)."""
        assert request.payload is not None
        for event in inputs:
            if isinstance(event, ev.WorkloadCreated) and event.spec.name in new.workloads:
                created = new.workloads[event.spec.name]
                if old.workloads.get(event.spec.name) is not created:
                    self.store.add_workload(event.spec.name, workload_to_json(created), request.payload["launch"])


def _scheduler_config(cluster: ClusterRecord) -> SchedulerConfig:
    """The recovery policy of a cluster: hotswap and elastic unless turned off."""
    settings = cluster.settings
    return SchedulerConfig(hotswap=bool(settings.get("hotswap", True)), elastic=bool(settings.get("elastic", True)))


def _wake_on_signals(selector: selectors.BaseSelector, stop: Callable[[], None]) -> tuple[socket.socket, socket.socket]:
    """A signal must wake the select (PEP 475 would otherwise resume it): the wakeup fd gets a
    byte for every signal. SIGTERM and SIGINT call ``stop``; SIGUSR1 only wakes the loop (the
    CLI found no socket: the next step listens again). Returns the socket pair, which must live
    as long as the loop."""
    wake_read, wake_write = socket.socketpair()
    wake_read.setblocking(False)
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno(), warn_on_full_buffer=False)
    selector.register(wake_read, selectors.EVENT_READ, _drain)
    signal.signal(signal.SIGTERM, lambda *_: stop())
    signal.signal(signal.SIGINT, lambda *_: stop())
    signal.signal(signal.SIGUSR1, lambda *_: None)
    return wake_read, wake_write


def _drain(wake: socket.socket) -> None:
    with contextlib.suppress(BlockingIOError):
        wake.recv(64)


def _raise_descriptor_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
