"""The controller of a Kubernetes cluster: ``hotswap controller run`` (foreground, or in-cluster
from the Deployment of ``hotswap controller manifests``).

Level-triggered: watches on Nodes, JobSets and pods only say *something changed*; each wake-up
(or a periodic resync) lists the live objects, rebuilds the core's snapshot from them
(:func:`hotswap.backends.kubernetes.observation.observe`), runs one decision round of the same
core the simulator and the local backend use, and enacts the resulting operations. Nothing is
kept in memory that the cluster does not also hold, so a restarted controller picks up where
the last one stopped.

Only the holder of the ``hotswap-controller`` Lease acts; another instance waits until the
Lease is released or expires (client-go's leader election rules).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from hotswap.api.errors import ConflictError, HotswapError
from hotswap.api.times import iso_utc
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes import operations as ops
from hotswap.backends.kubernetes.client import KubeClient
from hotswap.backends.kubernetes.lease import lease_body, next_step, read_lease, released
from hotswap.backends.kubernetes.observation import Observation, observe
from hotswap.backends.kubernetes.planning import plan
from hotswap.backends.kubernetes.settings import KubeSettings
from hotswap.core.policy import SchedulerConfig
from hotswap.core.scheduler import decide

LEASE_DURATION_S = 15
RENEW_EVERY_S = 5.0
RESYNC_EVERY_S = 30.0
DEBOUNCE_S = 0.1  # let a burst of watch events (a drained pool) become one reconcile


def _log(message: str) -> None:
    print(f"{iso_utc(time.time())} {message}", file=sys.stderr, flush=True)


class LeaderElector:
    """Takes and keeps the controller's Lease; ``is_leader`` says whether we may act."""

    def __init__(self, client: KubeClient, identity: str, clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.identity = identity
        self.clock = clock
        self.is_leader = False

    def tick(self) -> bool:
        now = self.clock()
        current_obj = self.client.get_lease(labels.CONTROLLER_NAME)
        current = read_lease(current_obj) if current_obj is not None else None
        step = next_step(current, self.identity, now, LEASE_DURATION_S)
        was = self.is_leader
        try:
            if step.action == "create":
                self.client.create_lease(lease_body(labels.CONTROLLER_NAME, self.client.namespace, step.record))
                self.is_leader = True
            elif step.action == "update":
                self.client.replace_lease(labels.CONTROLLER_NAME, lease_body(labels.CONTROLLER_NAME, self.client.namespace, step.record))
                self.is_leader = True
            else:
                self.is_leader = False
        except ConflictError:
            self.is_leader = False  # another controller wrote the Lease first: it leads
        if self.is_leader != was:
            holder = self.identity if self.is_leader else (current.holder if current else "?")
            _log(f"leader: {holder}" + (" (this controller)" if self.is_leader else "; waiting"))
        return self.is_leader

    def release(self) -> None:
        if not self.is_leader:
            return
        current_obj = self.client.get_lease(labels.CONTROLLER_NAME)
        if current_obj is None:
            return
        record = released(read_lease(current_obj), self.identity)
        if record is not None:
            try:
                self.client.replace_lease(labels.CONTROLLER_NAME, lease_body(labels.CONTROLLER_NAME, self.client.namespace, record))
            except HotswapError:
                pass  # it expires on its own
        self.is_leader = False


class KubeController:
    def __init__(self, client: KubeClient, cluster: str, clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.cluster = cluster
        self.settings = client.settings
        self.clock = clock
        self.config = SchedulerConfig()

    def observe(self) -> Observation:
        client = self.client
        return observe(
            nodes=client.list_nodes(),
            jobsets=client.list_jobsets(self.cluster),
            jobs=client.list_jobs(),
            pods=client.list_pods(labels.WORKLOAD_LABEL),
            settings=self.settings,
            cluster=self.cluster,
            now=self.clock(),
        )

    def reconcile(self) -> list[ops.Operation]:
        """One round: observe, decide, enact. Returns what it did."""
        observation = self.observe()
        decision = decide(observation.snapshot, observation.events, observation.now, self.config)
        operations = plan(observation, decision)
        for line in ops.decisions_summary(operations):
            _log(line)
        self.enact(operations, observation)
        return operations

    def enact(self, operations: list[ops.Operation], observation: Observation) -> None:
        """Apply operations in order; one failing does not stop the others (the next reconcile
        retries whatever is still out of line)."""
        raw = {name: {"metadata": {"uid": job.uid}} for name, job in observation.jobsets.items()}
        for op in operations:
            try:
                self._enact_one(op, raw, observation.now)
            except HotswapError as error:
                _log(f"warning: {error}")

    def _enact_one(self, op: ops.Operation, raw: dict[str, Any], now: float) -> None:
        client = self.client
        if isinstance(op, ops.SetSuspend):
            client.patch_jobset(op.jobset, {"spec": {"suspend": op.suspend}})
        elif isinstance(op, ops.SetAnnotations):
            client.patch_jobset(op.jobset, {"metadata": {"annotations": op.annotations}})
        elif isinstance(op, ops.RecreateJobs):
            client.delete_jobs(op.jobset, op.replicas)
        elif isinstance(op, ops.ForceDeletePod):
            client.force_delete_pod(op.pod)
        elif isinstance(op, ops.PlacePod):
            spec: dict[str, Any] = {"schedulingGates": [{"name": g} for g in op.gates]}
            if op.node_selector:
                spec["nodeSelector"] = op.node_selector
            client.patch_pod(op.pod, {"metadata": {"annotations": op.annotations}, "spec": spec})
        elif isinstance(op, ops.AnnotatePod):
            client.patch_pod(op.pod, {"metadata": {"annotations": op.annotations}})
        elif isinstance(op, ops.RecordEvent):
            client.record_event(raw.get(op.jobset), op.jobset, op.reason, op.message, op.warning, now)

    def run(self, stop: threading.Event, identity: str) -> None:
        elector = LeaderElector(self.client, identity, self.clock)
        changed = threading.Event()
        watchers = [
            threading.Thread(target=self.client.watch, args=(kind, self.cluster, changed, stop), name=f"watch-{kind}", daemon=True)
            for kind in ("nodes", "jobsets", "pods")
        ]
        # Stopping must wake the loop at once, wherever it waits.
        watchers.append(threading.Thread(target=lambda: (stop.wait(), changed.set()), name="stop", daemon=True))
        for thread in watchers:
            thread.start()
        next_renew = 0.0
        next_resync = 0.0
        try:
            while not stop.is_set():
                now = time.monotonic()
                if now >= next_renew:
                    try:
                        elector.tick()
                    except HotswapError as error:
                        _log(f"warning: lease: {error}")
                        elector.is_leader = False  # cannot prove we lead: do not act
                    next_renew = now + RENEW_EVERY_S
                if elector.is_leader and (changed.is_set() or now >= next_resync):
                    stop.wait(DEBOUNCE_S)
                    changed.clear()
                    try:
                        self.reconcile()
                    except HotswapError as error:
                        _log(f"warning: reconcile: {error}")
                    next_resync = time.monotonic() + RESYNC_EVERY_S
                timeout = max(0.0, min(next_renew, next_resync if elector.is_leader else next_renew) - time.monotonic())
                changed.wait(timeout)
        finally:
            elector.release()


def settings_for(cluster: str, settings: dict[str, Any] | None) -> KubeSettings:
    if settings is not None:
        return KubeSettings.from_options(settings)
    from hotswap.backends.kubernetes.backend import settings_of

    return settings_of(cluster)


def run_kubernetes_controller(cluster: str, settings: dict[str, Any] | None = None) -> None:
    """Run the controller of a Kubernetes cluster in the foreground until SIGTERM or Ctrl-C."""
    resolved = settings_for(cluster, settings)
    client = KubeClient.connect(resolved)
    client.require_apis(labels.JOBSET_API_VERSION, *([labels.KUEUE_API_VERSION] if resolved.kueue else []))
    identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    _log(
        f"hotswap controller for cluster {cluster}: {client.host}, namespace {resolved.namespace}"
        + (", Kueue admits" if resolved.kueue else "")
        + f"; identity {identity}"
    )
    try:
        KubeController(client, cluster).run(stop, identity)
    except KeyboardInterrupt:
        stop.set()  # the Lease was released on the way out
