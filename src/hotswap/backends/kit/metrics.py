"""The controllers' Prometheus metrics: one definition of each figure (name, kind, help, buckets)
for every controller that serves them (the Kubernetes controller and the local one, through the
same :class:`ControllerMetrics`), and the HTTP endpoint (``prometheus-client``, imported only
here and only when metrics are created). The cluster's state (workloads by status, slices by
state) is set from the core's snapshot after every round, the same way on both backends: what
``hotswap dashboard`` shows, for teams that would rather use Grafana.

========================================  =========  ============================================
name                                      kind       what
========================================  =========  ============================================
``hotswap_reconcile_duration_seconds``    histogram  one reconcile: observe, decide, enact
``hotswap_reconcile_writes``              histogram  write calls of one reconcile (0 when steady)
``hotswap_hotswaps_total``                counter    workloads restarted on other capacity after
                                                     losing a slice (never charged)
``hotswap_preemptions_total``             counter    workloads preempted whole for higher-priority
                                                     work (by hotswap or, under Kueue, by Kueue)
``hotswap_recovery_seconds``              histogram  from a node failure under a running workload
                                                     to its first productive step after it,
                                                     from the workers' records (both backends)
``hotswap_leader``                        gauge      1 while this controller holds the Lease
``hotswap_workloads{status}``             gauge      workloads by status (QUEUED, RUNNING, ...)
``hotswap_slices{state}``                 gauge      slices by state: held, spare, unhealthy
========================================  =========  ============================================

A local controller counts as its "writes" the worker processes a round started or stopped (its
effects); a Kubernetes controller, its write calls to the API server.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from typing import Any

from hotswap.api.errors import ConflictError
from hotswap.api.phases import WorkloadPhase
from hotswap.core.model import Snapshot


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str  # counter, gauge or histogram
    help: str
    buckets: tuple[float, ...] = ()
    labels: tuple[str, ...] = ()


RECONCILE_DURATION = MetricSpec(
    "hotswap_reconcile_duration_seconds", "histogram", "Time one reconcile took: observe, decide, enact.",
    (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
RECONCILE_WRITES = MetricSpec(
    "hotswap_reconcile_writes", "histogram", "Write calls one reconcile made to the cluster (0 in steady state).",
    (0, 1, 2, 5, 10, 20, 50, 100, 250),
)
HOTSWAPS = MetricSpec("hotswap_hotswaps_total", "counter", "Workloads restarted on other capacity after losing a slice.")
PREEMPTIONS = MetricSpec("hotswap_preemptions_total", "counter", "Workloads preempted whole for higher-priority work.")
RECOVERY = MetricSpec(
    "hotswap_recovery_seconds", "histogram",
    "From a node failure under a running workload to its first productive step after it, from the workers' records (a job that reports no step has none).",
    (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200),
)
LEADER = MetricSpec("hotswap_leader", "gauge", "1 while this controller holds the leader Lease, else 0.")

WORKLOADS = MetricSpec("hotswap_workloads", "gauge", "Workloads by status (QUEUED, RUNNING, RESTARTING, SUCCESSFUL, FAILED).", labels=("status",))
SLICES = MetricSpec("hotswap_slices", "gauge", "Slices by state: held by a workload, spare (free and healthy), unhealthy.", labels=("state",))

METRICS = (RECONCILE_DURATION, RECONCILE_WRITES, HOTSWAPS, PREEMPTIONS, RECOVERY, LEADER, WORKLOADS, SLICES)
SLICE_STATES = ("held", "spare", "unhealthy")


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9090`` for IPv6) as (host, port); raises ValueError. ``:PORT``
    is every interface (0.0.0.0), which ``controller run`` allows only with --expose-metrics."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


class ControllerMetrics:
    """The metrics of one controller process, in their own registry."""

    def __init__(self) -> None:
        import prometheus_client

        self.registry = prometheus_client.CollectorRegistry()
        self._metrics: dict[str, Any] = {}
        for spec in METRICS:
            if spec.kind == "counter":
                metric = prometheus_client.Counter(spec.name.removesuffix("_total"), spec.help, registry=self.registry)
            elif spec.kind == "gauge":
                metric = prometheus_client.Gauge(spec.name, spec.help, spec.labels, registry=self.registry)
            else:
                metric = prometheus_client.Histogram(spec.name, spec.help, buckets=spec.buckets, registry=self.registry)
            self._metrics[spec.name] = metric
        self.server: Any = None

    def reconciled(self, seconds: float, writes: int) -> None:
        self._metrics[RECONCILE_DURATION.name].observe(seconds)
        self._metrics[RECONCILE_WRITES.name].observe(writes)

    def hotswapped(self, count: int = 1) -> None:
        self._metrics[HOTSWAPS.name].inc(count)

    def preempted(self, count: int = 1) -> None:
        self._metrics[PREEMPTIONS.name].inc(count)

    def recovered(self, seconds: float) -> None:
        self._metrics[RECOVERY.name].observe(seconds)

    def leading(self, leader: bool) -> None:
        self._metrics[LEADER.name].set(1 if leader else 0)

    def observed(self, snapshot: Snapshot) -> None:
        """The cluster's state after a round: workloads by status, slices by state."""
        statuses = Counter(w.phase.value for w in snapshot.workloads.values())
        for phase in WorkloadPhase:
            self._metrics[WORKLOADS.name].labels(status=phase.value).set(statuses.get(phase.value, 0))
        held = set(snapshot.holders)
        states = Counter(
            "held" if name in held else ("unhealthy" if name in snapshot.unhealthy else "spare") for name in snapshot.slices
        )
        for state in SLICE_STATES:
            self._metrics[SLICES.name].labels(state=state).set(states.get(state, 0))

    def serve(self, address: str) -> tuple[str, int]:
        """Serve ``/metrics`` on ``HOST:PORT`` (port 0: any free one); returns where."""
        import prometheus_client

        host, port = parse_address(address)
        self.server, _ = prometheus_client.start_http_server(port, addr=host, registry=self.registry)
        bound_host, bound_port = self.server.server_address[:2]
        return str(bound_host), int(bound_port)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def exposition(self) -> str:
        """The metrics as Prometheus' text format (what a scrape returns)."""
        import prometheus_client

        return prometheus_client.generate_latest(self.registry).decode()


def serve_metrics(cluster: str, address: str) -> ControllerMetrics:
    """The metrics of ``controller run --metrics-address``, served, and a line saying where."""
    metrics = ControllerMetrics()
    try:
        host, port = metrics.serve(address)
    except OSError as error:
        raise ConflictError(f"--metrics-address {address}: {error.strerror or error}") from None
    print(f"hotswap controller for cluster {cluster}: metrics on http://{host}:{port}/metrics", file=sys.stderr, flush=True)
    return metrics
