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

This module keeps the loop: starting, waking and stopping. :class:`LocalController` is one
object whose pieces share the in-memory snapshot and the open transaction: serving requests
(``serving.py``) and one decision round (``rounds.py``); what a request asks of a round is in
``requests.py``. Beside them in this package: the socket (``server.py``, speaking
``backends/local/protocol.py``), taking over after a crash (``recovery.py``), what actions do to
workers (``enactment.py``), hang detection (``hangs.py``) and the GPU health probe
(``gpu_health.py``); elsewhere in ``backends/local``: worker processes and warm spares
(``workers/``), the timeline's text (``timeline.py``) and the GPUs behind a GPU-backed cluster's
slices (``gpu/``).

Run it with ``python -m hotswap.backends.local.controller.entry <cluster-dir>``; the CLI does
that whenever it finds no controller running.
"""

from __future__ import annotations

import contextlib
import resource
import selectors
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

from hotswap.api.worker import DEFAULT_GRACE_PERIOD_S
from hotswap.backends.kit.figures import RecoveryFigures
from hotswap.backends.kit.metrics import ControllerMetrics
from hotswap.backends.local.claim import AlreadyClaimed, Claim
from hotswap.backends.local.controller.gpu_health import GpuHealthMonitor
from hotswap.backends.local.controller.hangs import HangWatch
from hotswap.backends.local.controller.recovery import recover
from hotswap.backends.local.controller.rounds import scheduler_config
from hotswap.backends.local.controller.server import RequestServer
from hotswap.backends.local.controller.serving import RETRY_S, RequestServing
from hotswap.backends.local.controller.enactment import Launcher
from hotswap.backends.local.gpu.backing import Backing
from hotswap.backends.local.workers.spares import DEFAULT_PRELOAD
from hotswap.backends.local.workers.lifecycle import Workers
from hotswap.core import events as ev
from hotswap.core.model import Snapshot
from hotswap.store import faults
from hotswap.store.paths import ClusterPaths
from hotswap.backends.local.tables import LocalStore


class AlreadyRunning(Exception):
    """Another controller holds this cluster's lock."""


MAX_SLEEP_S = 3600.0  # select() must never get a timeout it cannot hold


class LocalController(RequestServing):
    def __init__(self, paths: ClusterPaths, metrics: ControllerMetrics | None = None) -> None:
        self.paths = paths
        self.figures = RecoveryFigures(metrics) if metrics is not None else None  # Prometheus, when served
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
        # A controller that lost the race for the claim wakes the holder with SIGUSR1 as soon as
        # the holder has announced itself, which is before it has taken over from its
        # predecessor: the signal's default action would kill it half-way through recovery.
        signal.signal(signal.SIGUSR1, lambda *_: None)
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
        self.store = LocalStore.open(self.paths.database)
        self.claim.announce(self.store)
        self.cluster = self.store.cluster()
        self.config = scheduler_config(self.cluster)
        settings = self.cluster.settings
        self.backing = Backing.of(settings)  # None: an emulated cluster
        spares = (int(settings.get("warm_workers", 0)), tuple(settings.get("warm_preload", DEFAULT_PRELOAD)))
        self.server = RequestServer(self.paths, self.selector, self.store)
        self.workers = Workers(
            self.store, self.paths, self.selector, spares, self._grace, self._worker_exited,
            exclusive=lambda _: self.backing is not None, zygote=bool(settings.get("zygote", False)),
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
                self.figures.check_recoveries(self.snapshot.workloads, self._running, time.time())
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
