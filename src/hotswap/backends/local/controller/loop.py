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

This module keeps the loop: waking, stepping and stopping. :class:`LocalController` is given
its collaborators, each built once with what it needs (``assembly.py``, which the entry point
calls, claims the cluster, builds them and takes over from a crashed predecessor): the state
between rounds and the inbox of what happened since (``state.py``), serving requests
(``serving.py``, which asks ``round_inputs.py`` what a request asks of a round), one decision
round (``rounds.py``), the socket (``server.py``, speaking ``backends/local/protocol.py``), what
actions do to workers (``enactment.py``), and the watchers: hang detection (``hangs.py``) and
the GPU health probe (``gpu_health.py``). Elsewhere in ``backends/local``: the requests and the
settings as typed records (``requests.py``, ``settings.py``), worker processes and warm spares
(``workers/``), the timeline's text (``timeline.py``) and the GPUs behind a GPU-backed
cluster's slices (``gpu/``).

Run it with ``python -m hotswap.backends.local.controller.entry <cluster-dir>``; the CLI does
that whenever it finds no controller running.
"""

from __future__ import annotations

import contextlib
import selectors
import signal
import socket
import time
from collections.abc import Callable

from hotswap.backends.kit.figures import RecoveryFigures
from hotswap.backends.local.worker_events import first_step_after
from hotswap.backends.local.claim import Claim
from hotswap.backends.local.controller.gpu_health import GpuHealthMonitor
from hotswap.backends.local.controller.hangs import HangWatch
from hotswap.backends.local.controller.recovery import UnrecordedStarts
from hotswap.backends.local.controller.host_loss import Liveness
from hotswap.backends.local.controller.server import RequestServer
from hotswap.backends.local.controller.serving import RETRY_S, RequestServing
from hotswap.backends.local.controller.state import ClusterState, Inbox
from hotswap.backends.local.workers.lifecycle import Workers
from hotswap.core.workload import Workload
from hotswap.store import faults

MAX_SLEEP_S = 3600.0  # select() must never get a timeout it cannot hold
RECOVERY_LOOK_S = 0.5  # while a recovery is open, how often the workers' records are read for its end


class LocalController:
    """The loop of one cluster's controller, over the collaborators it is given; ``closing``
    closes them (the probe, the socket, the store, then the claim) when the loop ends."""

    def __init__(
        self,
        claim: Claim,
        selector: selectors.BaseSelector,
        state: ClusterState,
        inbox: Inbox,
        server: RequestServer,
        workers: Workers,
        hangs: HangWatch,
        health: GpuHealthMonitor,
        serving: RequestServing,
        closing: contextlib.ExitStack,
        figures: RecoveryFigures | None = None,
        liveness: Liveness | None = None,
        unrecorded: UnrecordedStarts | None = None,
    ) -> None:
        self.claim = claim
        self.selector = selector  # each registration's data is its callback
        self.state = state
        self.inbox = inbox
        self.server = server
        self.workers = workers
        self.hangs = hangs
        self.health = health
        self.serving = serving
        self.closing = closing
        self.figures = figures  # Prometheus, when served
        self.liveness = liveness  # beaten every second, also while idle (see host_loss.py)
        self.unrecorded = unrecorded  # starts recovery found without a pid yet (see recovery.py)
        self.stopped = False
        self.retry_at: float | None = None
        self.wake: tuple[socket.socket, socket.socket] | None = None  # see _wake_on_signals

    def run(self) -> None:
        """Serve until a signal stops the loop, or the cluster's deletion is done."""
        if self.figures is not None:
            self.figures.metrics.observed(self.state.snapshot)
        self.wake = _wake_on_signals(self.selector, self._stop_loop)
        self.step()  # what was queued while no controller ran
        due_at: float | None = None  # when the next step is due if nothing happens before
        while not self.stopped:
            now = time.time()
            if due_at is None:
                sleep_s = self._sleep_s()
                due_at = now + sleep_s if sleep_s is not None else now + MAX_SLEEP_S
            timeout = max(0.0, due_at - now)
            if self.liveness is not None:  # a beat is due every second, also while idle
                timeout = min(timeout, self.liveness.due_in(now))
            ready = self.selector.select(timeout)
            if self.liveness is not None:
                self.liveness.beat(time.time())
            for key, _ in ready:
                key.data(key.fileobj)
            if not self.stopped and (ready or time.time() >= due_at):
                self.step()
                due_at = None

    def step(self) -> None:
        """One wake-up: everything that is due, after checking that the cluster is still ours."""
        self.claim.verify()
        try:
            now = time.time()
            self.server.ensure_listening()
            self.claim.keep_pid_file()
            self.health.tick(now)
            if self.unrecorded is not None:
                self.unrecorded.check()
            self.workers.finish_dying()
            self.workers.expire_grace_periods()
            self.workers.start_waiting()
            if not self.state.deleting:
                self.workers.refill_spares_if_due()
                self.inbox.add(self.hangs.check(self.state.snapshot, now))
            if self.serving.work():
                self.stopped = True  # the deletion stopped every worker
            if self.figures is not None:
                self.figures.check_recoveries(self.state.snapshot.workloads, self._running, time.time(), self._first_step)
            self.retry_at = None
        except Exception as error:
            if not faults.is_fault(error):
                raise
            faults.log(f"hotswap: {faults.explain(error)}; retrying")
            self.retry_at = time.time() + RETRY_S

    def close(self) -> None:
        self.closing.close()

    def _sleep_s(self) -> float | None:
        now = time.time()
        try:
            due = (
                self.workers.next_deadline(now),
                None if self.state.deleting else self.hangs.next_deadline(self.state.snapshot, now),
                self.health.next_deadline(now),
                self.unrecorded.next_deadline() if self.unrecorded is not None else None,
                RECOVERY_LOOK_S if self.figures is not None and self.figures.recovering else None,
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

    def _first_step(self, name: str, attempt: int, failed_at: float) -> float | None:
        """The end of a recovery for the metrics: the first productive step after the failure,
        from the workers' records (the MTTR ``describe`` and the dashboard show)."""
        workload = self.state.snapshot.workloads.get(name)
        if workload is None:
            return None
        return first_step_after(self.hangs.paths.workload_dir(name, workload.seq), attempt, failed_at)

    def _running(self, workload: Workload) -> int:
        """How many workers of the workload's current attempt run."""
        return sum(1 for row in self.workers.live(workload.name, workload.seq, workload.attempt) if row.pid is not None)


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
