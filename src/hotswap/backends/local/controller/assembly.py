"""How a local cluster's controller is put together: claim the cluster, and only then read it;
build each collaborator once, giving it what it needs; take over from the controller before.

:func:`serve` is a controller's whole life in this process (``entry.py`` calls it, for the
daemon and for ``hotswap controller run``); :func:`open_controller` is everything before the
loop, which tests also call to drive a real controller step by step.

What is built, and what each is given: the claim and the store; the state between rounds and
the inbox of what happened since (``state.py``); the socket (``server.py``); the workers
(``workers/lifecycle.py``: they ask the state for a workload's grace period and tell the inbox
of every exit); the launcher of new workers (``enactment.py``); the watchers, which report to
the inbox (``hangs.py``, ``gpu_health.py``); the round runner (``rounds.py``) and the request
serving (``serving.py``); and the loop over them all (``loop.py``).
"""

from __future__ import annotations

import contextlib
import resource
import selectors
import signal
import time
from collections.abc import Callable
from typing import Any

from hotswap.backends.kit.figures import RecoveryFigures
from hotswap.backends.kit.metrics import ControllerMetrics
from hotswap.backends.local.claim import AlreadyClaimed, Claim
from hotswap.backends.local.controller.enactment import Launcher
from hotswap.backends.local.controller.gpu_health import GpuHealthMonitor, Record
from hotswap.backends.local.controller.hangs import HangWatch
from hotswap.backends.local.controller.host_loss import HostLoss, Liveness, Predecessor
from hotswap.backends.local.controller.loop import LocalController
from hotswap.backends.local.controller.recovery import recover
from hotswap.backends.local.controller.rounds import RoundRunner
from hotswap.backends.local.controller.server import RequestServer
from hotswap.backends.local.controller.serving import RequestServing
from hotswap.backends.local.controller.state import ClusterState, Inbox
from hotswap.backends.local.tables import LocalStore
from hotswap.backends.local.workers.lifecycle import Workers
from hotswap.store.paths import ClusterPaths


class AlreadyRunning(Exception):
    """Another controller holds this cluster's lock."""


def serve(paths: ClusterPaths, metrics: Callable[[], ControllerMetrics] | None = None) -> None:
    """Serve the cluster from this process until a signal stops it, or its deletion is done;
    ``metrics`` serves the Prometheus metrics, once the cluster is this controller's."""
    _raise_descriptor_limit()  # a pidfd per worker: big clusters need many descriptors
    # A controller that lost the race for the claim wakes the holder with SIGUSR1 as soon as
    # the holder has announced itself, which is before it has taken over from its
    # predecessor: the signal's default action would kill it half-way through recovery.
    signal.signal(signal.SIGUSR1, lambda *_: None)
    controller = open_controller(paths, metrics)
    try:
        controller.run()
    finally:
        controller.close()


def open_controller(paths: ClusterPaths, served_metrics: Callable[[], ControllerMetrics] | None = None) -> LocalController:
    """Claim the cluster, and only then read its state: a controller that read first could act
    on a view older than its predecessor's last commit. Then build the collaborators, listen
    and take over (``recovery.py``). :class:`AlreadyRunning` when another controller holds it,
    before anything is served (``served_metrics`` starts the metrics server, once claimed)."""
    try:
        claim = Claim.take(paths)
    except AlreadyClaimed:
        raise AlreadyRunning(paths.name) from None
    with contextlib.ExitStack() as closing:  # what is open so far is closed again if a step fails
        closing.callback(claim.release)
        metrics = served_metrics() if served_metrics is not None else None
        if metrics is not None:
            closing.callback(metrics.close)
        store = LocalStore.open(paths.database)
        closing.callback(store.close)
        predecessor = Predecessor.read(store, paths.root)  # before this controller's record replaces it
        claim.announce(store)
        state = ClusterState(store.cluster(), store.load_snapshot(time.time()), deleting=store.deleted())
        inbox = Inbox(state)
        selector = selectors.DefaultSelector()  # each registration's data is its callback
        server = RequestServer(paths, selector, store)
        closing.callback(server.close)
        spares = (state.settings.warm_workers, state.settings.warm_preload)
        workers = Workers(
            store, paths, selector, spares, state.grace_s, inbox.worker_exited,
            exclusive=lambda _: state.backing is not None, zygote=state.settings.zygote,
        )
        launcher = Launcher(store, paths, lambda: state.backing)
        hangs = HangWatch(paths, lambda w: workers.live(w.name, w.seq, w.attempt), state.per_host)
        health = GpuHealthMonitor(selector, _on_timeline(store), inbox.fail_nodes)
        closing.callback(health.close)
        figures = RecoveryFigures(metrics) if metrics is not None else None
        rounds = RoundRunner(store, claim, state, inbox, workers, launcher, server, health, figures)
        serving = RequestServing(store, state, inbox, rounds, server, workers, health)
        server.open()
        launcher.publish_committed(state.snapshot.workloads.values())  # its predecessor may have died before
        unrecorded = recover(workers, HostLoss(predecessor))  # waits for nothing: see recovery.UnrecordedStarts
        health.watch(None if state.deleting else state.backing)
        if state.deleting:  # a controller stopped half-way through `cluster delete`: finish it
            workers.stop_everything(time.time())
        return LocalController(
            claim, selector, state, inbox, server, workers, hangs, health, serving, closing.pop_all(), figures,
            Liveness(paths.root), unrecorded,
        )


def _on_timeline(store: LocalStore) -> Record:
    """What the GPU health monitor says, written to the cluster's timeline at once."""

    def record(kind: str, message: str, data: dict[str, Any]) -> None:
        with store.transaction():
            store.record_event(time.time(), kind, message, data=data)

    return record


def _raise_descriptor_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
