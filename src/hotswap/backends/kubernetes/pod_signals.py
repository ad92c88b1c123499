"""What the pods say about a workload, beyond the nodes' states (pure): worker exits, workers
disrupted or deleted, pinned pods that never schedule, and slices other owners occupy.

**Exits wait before they are judged.** When a node dies, its kubelet stops reporting, but the
node stays Ready for Kubernetes' ``node-monitor-grace-period`` (40 s; 50 s from 1.32). Meanwhile
the other workers of the job lose their peer and exit with ordinary codes (1, or 42 from the
SDK). Judged at once, such an exit would fail the workload (a user error) or restart it in place
charged against ``max_restarts``, on the dying node. So a non-zero exit becomes a
:class:`~hotswap.core.events.WorkerExited` only ``EXIT_HOLD_S`` after it happened: if a node
under the workload fails meanwhile, the loss comes first, the workload is hotswapped (never
charged) and the exit, of an older attempt by then, is ignored. A success (0) counts at once.

**Disruptions** of a worker of the current attempt (a DisruptionTarget condition: preemption by
kube-scheduler, eviction, the taint manager; or a deletion by anyone but hotswap) take its
slice away from the workload for the round, as a cordon would: the core moves it, uncharged.

**A worker whose pod is gone** (deleted or evicted while no controller was watching, so no
trace of it is left) is noticed all the same: its Job creates a new pod for that index, which
waits behind the gate, in a Job whose pods were already released. The gang it belonged to is
broken: the slice is lost for the round, and the workload restarts, uncharged.

**Pinned pods that never schedule** (the slice was taken meanwhile by someone hotswap cannot see)
lose their slice after ``UNSCHEDULABLE_AFTER_S``, unless a pod is still terminating there
(it frees the slice when it is gone), so a workload never waits silently.

**A worker the kubelet rejected** (Failed without an exit code, e.g. UnexpectedAdmissionError
from a device plugin on failing hardware) takes its node's slice away for the round: the core
moves the workload, uncharged. (Its Job does not fail for it: ``backoffLimit`` leaves room for
one such failure per host, :mod:`hotswap.backends.kubernetes.render.jobset`.)

**The JAX coordination service's loss** (an elastic workload's coordinator pod exited, was
disrupted or deleted: render/coordination.py) ends the generation it served: JAX ends each of
its processes. A non-zero exit from ``EXIT_HOLD_S`` before the loss to
``SERVICE_LOSS_WINDOW_S`` after it (a client notices a service that vanished with its node only
after its heartbeat timeout) is the backend's loss, not the workload's
(:class:`~hotswap.core.events.WorkerLost`: a restart in place, not charged); its Job gives the
service a new pod, which serves the next attempt. **Not without end:** a service that dies again
and again would restart the workload forever, and a real failure of the script in a window would
escape ``max_restarts``. Losses in a row (each within ``SERVICE_LOSS_STREAK_GAP_S`` of the one
before: their windows overlap, so the workload never ran a window through between them) are
counted on the JobSet (``hotswap.dev/service-losses-in-a-row``, next to ``service-lost-at``);
the exits that a loss beyond ``UNCHARGED_SERVICE_LOSSES`` in a row explains are charged like a
crash with a restart code (the workload's status and its Restarted or Failed event say so). A
loss after a longer gap starts the count again.

**Other owners' pods** (another namespace, an xpk job) that hold accelerators on a slice's node
make the slice unusable: it is never offered, and a workload holding it loses it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

from hotswap.api.cluster import NodeState
from hotswap.api.phases import WorkloadPhase
from hotswap.api.times import parse_iso_utc
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.deadlines import Deadlines
from hotswap.backends.kubernetes.discovery import Discovery
from hotswap.backends.kubernetes.live_objects import CoordinatorPod, LiveJobSet, LivePod, Occupant, service_losses
from hotswap.core import events as ev
from hotswap.core.workload import Workload

EXIT_HOLD_S = 60.0  # > node-monitor-grace-period (40-50 s) plus the watch's delay
SERVICE_LOSS_WINDOW_S = 300.0  # > twice the JAX clients' heartbeat timeout (render/coordination.py)
UNSCHEDULABLE_AFTER_S = 120.0
UNCHARGED_SERVICE_LOSSES = 3  # losses in a row of the JAX coordination service not charged; the next ones are
# A loss later than this after the one before starts a new count: their windows (an exit from
# EXIT_HOLD_S before a loss to SERVICE_LOSS_WINDOW_S after it) do not overlap, so the workload
# ran with every exit judged as usual in between.
SERVICE_LOSS_STREAK_GAP_S = EXIT_HOLD_S + SERVICE_LOSS_WINDOW_S


@dataclasses.dataclass(frozen=True)
class ServiceLosses:
    """When a workload's JAX coordination service went away (oldest first), and how many losses
    in a row the latest of them ends."""

    times: Sequence[float] = ()
    in_a_row: int = 0

    @property
    def charged(self) -> bool:
        """Whether the exits the latest loss explains are charged (too many in a row)."""
        return self.in_a_row > UNCHARGED_SERVICE_LOSSES


def service_losses_of(job: LiveJobSet, pods: list[CoordinatorPod]) -> ServiceLosses:
    """The JobSet's service losses, counted on from those it records (a loss it does not record
    yet comes after them)."""
    times = service_losses(job, pods)
    recorded = job.annotations.get(labels.SERVICE_LOST_ANNOTATION)
    last = parse_iso_utc(recorded) if recorded else None
    count = job.annotations.get(labels.SERVICE_LOSSES_IN_A_ROW_ANNOTATION) or ""
    in_a_row = (int(count) if count.isdigit() and int(count) > 0 else 1) if last is not None else 0
    for lost in times:
        if last is not None and lost < last + 1.0:  # the recorded loss (to the second), or an earlier one
            continue
        in_a_row = in_a_row + 1 if last is not None and lost - last <= SERVICE_LOSS_STREAK_GAP_S else 1
        last = lost
    return ServiceLosses(times, in_a_row)


@dataclasses.dataclass
class Signals:
    exits: list[ev.WorkerExited | ev.WorkerLost] = dataclasses.field(default_factory=list)
    lost: dict[str, str] = dataclasses.field(default_factory=dict)  # node -> why its slice is lost
    blocked: dict[str, str] = dataclasses.field(default_factory=dict)  # slice -> why it is unusable


def current_pods(workload: Workload, pods: Iterable[LivePod], job_uids: frozenset[str]) -> list[LivePod]:
    """Pods (of the workload) of its current attempt: released by the controller for that
    attempt, owned by a Job that still exists."""
    return [p for p in pods if p.attempt == workload.attempt and p.owner_uid is not None and p.owner_uid in job_uids]


def read_signals(
    workloads: Iterable[Workload],
    pods_of: Callable[[str], list[LivePod]],
    job_uids: frozenset[str],
    failing_jobs: frozenset[str],
    discovery: Discovery,
    occupants: Iterable[Occupant],
    deadlines: Deadlines,
    released: Mapping[str, Mapping[str, frozenset[int]]] | None = None,
    service_losses: Mapping[str, ServiceLosses] | None = None,
) -> Signals:
    """The signals of every workload that holds slices. ``service_losses``: when each
    workload's JAX coordination service went away (its coordinator pods that ended);
    ``deadlines``: the round's time, and where a held exit's or a pod's timer is kept."""
    signals = Signals()
    workloads = list(workloads)
    # Nodes where a pod (of any hotswap workload) is still terminating: it frees them when gone.
    stopping_on = {p.node for w in workloads for p in pods_of(w.name) if p.terminating and not p.finished and p.node is not None}
    for occupant in occupants:
        slice_name = discovery.slice_of_node.get(occupant.node)
        if slice_name is not None:
            signals.blocked.setdefault(slice_name, f"used by pod {occupant.namespace}/{occupant.name} of another owner")
    for workload in workloads:
        if not workload.phase.holds_slices:
            continue
        held = set(workload.slices)
        for slice_name in sorted(held & set(signals.blocked)):
            found = discovery.slice(slice_name)
            if found is not None:
                signals.lost.setdefault(found.nodes[0], f"slice {slice_name} is {signals.blocked[slice_name]}")
        mine = current_pods(workload, pods_of(workload.name), job_uids)
        if workload.phase is WorkloadPhase.RUNNING:
            _exits(workload, mine, failing_jobs, discovery, deadlines, signals, (service_losses or {}).get(workload.name, ServiceLosses()))
            _replaced(pods_of(workload.name), (released or {}).get(workload.name, {}), workload.replica_map, discovery, signals)
        _disruptions(mine, failing_jobs, discovery, held, signals)
        _rejections(mine, discovery, held, signals)
        _unschedulable(mine, stopping_on, discovery, held, deadlines, signals)
    return signals


def _slice_of(pod: LivePod, discovery: Discovery) -> str | None:
    if pod.node is not None and pod.node in discovery.slice_of_node:
        return discovery.slice_of_node[pod.node]
    return pod.annotations.get(labels.SLICE_ANNOTATION)


def _exits(
    workload: Workload, mine: list[LivePod], failing_jobs: frozenset[str], discovery: Discovery, deadlines: Deadlines,
    signals: Signals, losses: ServiceLosses = ServiceLosses(),
) -> None:
    now = deadlines.now
    for pod in mine:
        if not pod.finished or pod.exit_code is None or pod.terminating or pod.disruption or pod.owner_uid in failing_jobs:
            continue
        slice_name = _slice_of(pod, discovery)
        if slice_name is None or pod.host is None:
            continue
        node = discovery.nodes.get(pod.node or "")
        if node is not None and node.state is not NodeState.READY:
            continue  # on a machine that is gone or going: the node's loss explains it
        if pod.exit_code != 0:
            if not deadlines.due((pod.finished_at if pod.finished_at is not None else now) + EXIT_HOLD_S):
                continue
            exited = pod.finished_at if pod.finished_at is not None else now
            if any(lost - EXIT_HOLD_S <= exited <= lost + SERVICE_LOSS_WINDOW_S for lost in losses.times):
                why = f"exited {pod.exit_code} when the JAX coordination service went away"
                if losses.charged:
                    why += f" ({losses.in_a_row} times in a row; only {UNCHARGED_SERVICE_LOSSES} in a row are not charged)"
                signals.exits.append(ev.WorkerLost(workload.name, workload.attempt, slice_name, pod.host, why, losses.charged))
                continue
        signals.exits.append(ev.WorkerExited(workload.name, workload.attempt, slice_name, pod.host, pod.exit_code))


def _disruptions(mine: list[LivePod], failing_jobs: frozenset[str], discovery: Discovery, held: set[str], signals: Signals) -> None:
    for pod in mine:
        if not (pod.disruption or pod.terminating) or pod.owner_uid in failing_jobs or pod.node is None:
            continue
        node = discovery.nodes.get(pod.node)
        if node is None or node.slice not in held or node.state is not NodeState.READY:
            continue  # the node's own state tells the core already
        why = f"its pod {pod.name} was disrupted ({pod.disruption})" if pod.disruption else f"its pod {pod.name} was deleted"
        signals.lost.setdefault(pod.node, f"a worker on node {pod.node} stopped: {why}")


def _replaced(
    pods: list[LivePod], released: Mapping[str, frozenset[int]], replicas: Sequence[str | None], discovery: Discovery, signals: Signals
) -> None:
    """A gated pod for a worker that was released: its predecessor is gone (``replicas``: the
    workload's replica map)."""
    gone = {(p.owner_uid, p.replica, p.host) for p in pods if p.finished or p.terminating}  # the visible ones speak for themselves
    for pod in pods:
        if not pod.gated or pod.terminating or pod.owner_uid is None or pod.host not in released.get(pod.owner_uid, frozenset()):
            continue
        if (pod.owner_uid, pod.replica, pod.host) in gone:
            continue
        slice_name = replicas[pod.replica] if pod.replica is not None and 0 <= pod.replica < len(replicas) else None
        found = discovery.slice(slice_name) if slice_name is not None else None
        if found is None:
            continue
        signals.lost.setdefault(
            found.nodes[0], f"the pod of worker {pod.replica}/{pod.host} is gone (deleted or evicted): its Job replaced it"
        )


def _rejections(mine: list[LivePod], discovery: Discovery, held: set[str], signals: Signals) -> None:
    """A worker the kubelet refused to run (no exit code: a device plugin that cannot allocate
    the node's accelerators, UnexpectedAdmissionError) is the node's failure, not the user's."""
    for pod in mine:
        if pod.rejected is None or pod.node is None:
            continue
        node = discovery.nodes.get(pod.node)
        if node is None or node.slice not in held:
            continue
        signals.lost.setdefault(pod.node, f"the kubelet of node {pod.node} rejected pod {pod.name} ({pod.rejected})")


def _unschedulable(
    mine: list[LivePod], stopping_on: set[str], discovery: Discovery, held: set[str], deadlines: Deadlines, signals: Signals,
) -> None:
    for pod in mine:
        if pod.node is not None or pod.gated or pod.terminating or pod.unschedulable_since is None:
            continue
        slice_name = pod.annotations.get(labels.SLICE_ANNOTATION)
        if slice_name not in held:
            continue
        found = discovery.slice(slice_name)
        if found is None:
            continue  # the slice is gone: its removal is the loss
        nodes = found.nodes
        if stopping_on & set(nodes):
            continue  # a pod is still terminating there: it frees the slice when it is gone
        if not deadlines.due(pod.unschedulable_since + UNSCHEDULABLE_AFTER_S):
            continue
        waited = int(deadlines.now - pod.unschedulable_since)
        signals.lost.setdefault(nodes[0], f"pod {pod.name} pinned to slice {slice_name} has not been scheduled for {waited} s")
