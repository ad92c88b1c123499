"""From live Kubernetes objects to the core: a snapshot and the events that bring it up to date.

The controller is stateless: every reconcile rebuilds the core's snapshot from the live Nodes,
JobSets, Jobs and Pods, so a restarted controller (or a new leader) re-derives everything. What
only the core knows is read back from each JobSet's state annotation (:mod:`.state_annotation`).

How the live world becomes events:

- a node of a slice held by a running workload that is not Ready is a loss: the snapshot has it
  Ready and the round gets ``NodeFailed`` (machine gone, an accelerator withdrawn) or
  ``NodeCordoned`` (cordon, drain, maintenance, a disrupted worker, a pinned pod that never
  schedules, another owner's pod on the slice: :mod:`.pod_signals`), so the core hotswaps
  exactly as it does locally;
- every other node enters with its live state; free Ready nodes enter as repaired
  (``NodeRepaired``), which makes every reconcile a full scheduling round: queued work is
  admitted onto free capacity, suspended work resumes when capacity returns. A slice another
  owner occupies is not offered;
- worker exits of the current attempt are ``WorkerExited``, non-zero ones after a hold
  (:data:`~.pod_signals.EXIT_HOLD_S`) in which a node failure would explain them;
- a JobSet without a state annotation is new: ``WorkloadCreated``;
- a workload whose earlier attempt's pods are all gone gets ``WorkersStopped`` (what
  BlockingRecreate waits for);
- a slice that vanished under a workload (its node pool was deleted) is ``SliceRemoved``.

Two modes of admission. By default hotswap admits: the workloads are the state annotations'
records. With Kueue (``--kueue``), Kueue decides who may run, by quota and priority
(:mod:`.kueue_mode`): the core sees only the JobSets Kueue has admitted, and places, restarts
and judges them as it does without Kueue (Kueue does not react to node failures under admitted
non-TAS workloads, kueue#12701).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from hotswap.api.catalog import get_device_type
from hotswap.api.cluster import NodeState
from hotswap.api.phases import WorkloadPhase
from hotswap.api.spec import WorkloadSpec
from hotswap.backends.kubernetes.child_jobs import ChildJob, read_child_jobs, retired_uids
from hotswap.backends.kubernetes.deadlines import Deadlines
from hotswap.backends.kubernetes.discovery import Discovery, discover
from hotswap.backends.kubernetes.kueue_mode import KueueView, kueue_queued, kueue_views, terminal_workload
from hotswap.backends.kubernetes.live_objects import (
    CoordinatorPod, LiveJobSet, LivePod, metadata, read_coordinator_pod, read_jobset, read_occupant, read_pod,
)
from hotswap.backends.kubernetes.pod_signals import ServiceLosses, Signals, read_signals, service_losses_of
from hotswap.backends.kubernetes.settings import KubeSettings
from hotswap.core import events as ev
from hotswap.core.model import Node, Slice, Snapshot
from hotswap.core.workload import Workload


@dataclasses.dataclass
class Observation:
    now: float
    cluster: str
    settings: KubeSettings
    discovery: Discovery
    jobsets: dict[str, LiveJobSet]
    pods: list[LivePod]
    job_uids: frozenset[str]
    snapshot: Snapshot
    events: list[ev.Event]
    unmanaged: list[str]  # JobSets with no readable hotswap spec
    causes: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # workload -> why it lost slices
    loss_since: dict[str, float] = dataclasses.field(default_factory=dict)  # workload -> when its loss began
    outside: dict[str, Workload] = dataclasses.field(default_factory=dict)  # Kueue: workloads the core does not schedule
    kueue: dict[str, KueueView] = dataclasses.field(default_factory=dict)  # Kueue: JobSet -> its Workload
    child_jobs: dict[str, list[ChildJob]] = dataclasses.field(default_factory=dict)  # JobSet -> its Jobs
    coordinators: dict[str, list[CoordinatorPod]] = dataclasses.field(default_factory=dict)  # JobSet -> its coordinator pods
    service_losses: dict[str, ServiceLosses] = dataclasses.field(default_factory=dict)  # JobSet -> its JAX service's losses
    _by_workload: dict[str, list[LivePod]] | None = dataclasses.field(default=None, repr=False)

    deadlines: Deadlines = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.deadlines = Deadlines(self.now)

    @property
    def managed_admission(self) -> bool:
        return not self.settings.kueue

    def due(self, at: float) -> bool:
        """Whether the deadline ``at`` has come; one still to come is a wake-up time of the loop
        (:mod:`.deadlines`): every timed check of the observation and the plan asks here."""
        return self.deadlines.due(at)

    @property
    def wake_at(self) -> float | None:
        """When to reconcile again even if nothing changes: the earliest deadline still to come
        that this round's checks (observation and plan) met."""
        return self.deadlines.wake_at

    def old_pods(self, workload: str) -> list[LivePod]:
        """Pods of earlier attempts still alive: terminating, or left by a deleted Job. Pods on a
        machine that is gone count as stopped (they are force-deleted)."""
        found = []
        for pod in self.pods:
            if pod.workload != workload or pod.finished:
                continue
            old = pod.terminating or (pod.owner_uid is not None and pod.owner_uid not in self.job_uids)
            if old and not self._on_failed_node(pod):
                found.append(pod)
        return found

    def _on_failed_node(self, pod: LivePod) -> bool:
        if pod.node is None:
            return False
        node = self.discovery.nodes.get(pod.node)
        return node is not None and node.state is NodeState.FAILED

    def pods_of(self, workload: str) -> list[LivePod]:
        if self._by_workload is None:
            self._by_workload = {}
            for pod in self.pods:
                self._by_workload.setdefault(pod.workload, []).append(pod)
        return self._by_workload.get(workload, [])


def observe(
    nodes: Iterable[dict[str, Any]],
    jobsets: Iterable[dict[str, Any]],
    jobs: Iterable[dict[str, Any]],
    pods: Iterable[dict[str, Any]],
    settings: KubeSettings,
    cluster: str,
    now: float,
    others: Iterable[dict[str, Any]] = (),
    kueue_objects: Iterable[dict[str, Any]] = (),
) -> Observation:
    """The core's view of the live objects: a snapshot and the events that bring it up to date.
    ``others``: the cluster's unfinished pods of every namespace (for occupancy);
    ``kueue_objects``: Kueue's Workloads (with ``--kueue``)."""
    discovery = discover(nodes, settings)
    live = [read_jobset(obj) for obj in jobsets]
    live.sort(key=lambda j: (j.created, j.name))
    by_name = {j.name: j for j in live}
    pods = list(pods)
    pod_list = [p for p in (read_pod(obj) for obj in pods) if p is not None and p.workload in by_name]
    coordinators: dict[str, list[CoordinatorPod]] = {}
    for found in (read_coordinator_pod(obj) for obj in pods):
        if found is not None and found.workload in by_name:
            coordinators.setdefault(found.workload, []).append(found)
    others = list(others)
    # Any other pod is another owner's. Ours are known by their labels, not only by the list of
    # them read a moment earlier: a pod of our JobSets created in between (a Job recreated, a
    # pod Kueue admitted) is never taken for a foreign one.
    ours = frozenset((settings.namespace, p.name) for p in [*pod_list, *(c for cs in coordinators.values() for c in cs)]) | frozenset(
        (settings.namespace, p.name)
        for obj in others if metadata(obj).get("namespace") == settings.namespace
        for p in (read_pod(obj) or read_coordinator_pod(obj),)
        if p is not None and p.workload in by_name
    )
    occupants = [o for o in (read_occupant(obj, ours) for obj in others) if o is not None]
    job_list = list(jobs)
    # The Jobs a committed decision retires count as gone (:mod:`.child_jobs`), and so does a Job
    # being deleted (in the foreground: it stays until its pods are gone): its pods are an
    # earlier attempt's, as if the Job had vanished.
    job_uids = frozenset(
        metadata(obj).get("uid", "") for obj in job_list if not metadata(obj).get("deletionTimestamp")
    ) - retired_uids(j.record for j in live)
    failing = frozenset(metadata(obj).get("uid", "") for obj in job_list if _failing(obj))
    observation = Observation(
        now=now,
        cluster=cluster,
        settings=settings,
        discovery=discovery,
        jobsets=by_name,
        pods=pod_list,
        job_uids=job_uids,
        snapshot=Snapshot.build(now),
        events=[],
        unmanaged=[j.name for j in live if j.spec is None],
        child_jobs=read_child_jobs(job_list),
        coordinators=coordinators,
    )
    if settings.kueue:
        observation.kueue = kueue_views(kueue_objects)
        live, outside = kueue_queued(live, observation.kueue, observation.now)
        observation.outside.update(outside)
    workloads, created = _managed_workloads(observation, live)
    workloads = _exclusive(workloads)
    released = {j.name: j.record.released for j in live if j.record is not None}
    losses = observation.service_losses = {name: service_losses_of(job, coordinators.get(name, [])) for name, job in by_name.items()}
    signals = read_signals(workloads, observation.pods_of, job_uids, failing, discovery, occupants, observation.deadlines, released, losses)
    observation.snapshot, observation.events = _snapshot(observation, workloads, created, signals)
    return observation


def _failing(job: dict[str, Any]) -> bool:
    """A Job that is failing or failed: it deletes its own pods, JobSet restarts it."""
    return any(
        isinstance(c, dict) and c.get("type") in ("FailureTarget", "Failed") and c.get("status") == "True"
        for c in ((job.get("status") or {}).get("conditions") or [])
    )


def _managed_workloads(observation: Observation, live: list[LiveJobSet]) -> tuple[list[Workload], list[WorkloadSpec]]:
    """hotswap admits: each JobSet's workload is its state record; one without is new."""
    workloads: list[Workload] = []
    created: list[WorkloadSpec] = []
    for job in live:
        if job.spec is None or job.rejected is not None:
            continue
        workload = job.record.workload if job.record is not None else None
        if workload is None:
            if job.terminal is None:
                created.append(job.spec)
            continue
        if job.terminal is not None:
            workload = terminal_workload(workload, job)
        workloads.append(workload)
    return workloads, created


def _exclusive(workloads: list[Workload]) -> list[Workload]:
    """One holder per slice. Records written by two controllers at once (never with the Lease,
    but a hand edit can do it) must not reach the core: the higher priority keeps the slice,
    the other is requeued."""
    taken: set[str] = set()
    result = []
    for workload in sorted(workloads, key=lambda w: (-int(w.priority), w.seq)):
        if workload.phase.holds_slices:
            mine = tuple(s for s in workload.slices if s not in taken)
            if len(mine) < len(workload.slices):
                workload = dataclasses.replace(
                    workload, phase=WorkloadPhase.QUEUED, slices=(), replicas=None, stopping=frozenset(), running_since=None,
                    status_message="requeued: another workload holds its slices",
                )
            taken.update(mine)
        result.append(workload)
    result.sort(key=lambda w: w.seq)
    return result


def _snapshot(
    observation: Observation, workloads: list[Workload], created: list[WorkloadSpec], signals: Signals
) -> tuple[Snapshot, list[ev.Event]]:
    discovery = observation.discovery
    holder = {s: w.name for w in workloads if w.phase.holds_slices for s in w.slices}
    known = {s.name for s in discovery.slices}
    slices = [Slice(s.name, s.device_type, s.nodes, ordinal) for ordinal, s in enumerate(discovery.slices)]
    nodes: list[Node] = []
    events: list[ev.Event] = []
    for item in discovery.slices:
        for name in item.nodes:
            node = discovery.nodes[name]
            if item.name in holder:
                nodes.append(Node(name, item.name, node.host, NodeState.READY))
                why = _loss(node.state, node.reason, signals.lost.get(name))
                if why is not None:
                    kind, reason = why
                    # A loss only the pods tell (never scheduled, a worker disrupted) is no
                    # cordon: the decision's message says what happened.
                    said = reason if node.state is NodeState.READY else ""
                    events.append(ev.NodeFailed(name) if kind is NodeState.FAILED else ev.NodeCordoned(name, said))
                    _cause(observation, holder[item.name], f"node {name}: {reason}", node.since if kind is NodeState.FAILED else None)
            elif node.state is NodeState.READY and item.name not in signals.blocked:
                nodes.append(Node(name, item.name, node.host, NodeState.CORDONED))
                events.append(ev.NodeRepaired(name))
            else:
                nodes.append(Node(name, item.name, node.host, NodeState.CORDONED if node.state is NodeState.READY else node.state))
    # Slices a workload holds that no longer exist (node pool deleted): present them whole and
    # Ready, then removed, so the core moves the workload as after any loss.
    ordinal = len(slices)
    by_slice_type = {s: w.device_type for w in workloads if w.phase.holds_slices for s in w.slices}
    for name in sorted(set(holder) - known):
        device = by_slice_type[name]
        hosts = get_device_type(device).hosts_per_slice
        members = tuple(f"{name}#gone-{host}" for host in range(hosts))
        slices.append(Slice(name, device, members, ordinal))
        nodes.extend(Node(member, name, host) for host, member in enumerate(members))
        events.append(ev.SliceRemoved(name))
        _cause(observation, holder[name], f"slice {name} was removed from the cluster", None)
        ordinal += 1
    for workload in workloads:
        if workload.stopping and not observation.old_pods(workload.name):
            events.extend(ev.WorkersStopped(workload.name, attempt) for attempt in sorted(workload.stopping))
    events.extend(signals.exits)
    events.extend(ev.WorkloadCreated(spec) for spec in created)
    snapshot = Snapshot.build(observation.now, slices, nodes, workloads)
    return snapshot, events


def _loss(state: NodeState, reason: str, signal: str | None) -> tuple[NodeState, str] | None:
    """How a node of a held slice is lost this round, if it is: its live state first, then
    what its pods say."""
    if state is not NodeState.READY:
        return state, reason or state.value.lower()
    if signal is not None:
        return NodeState.CORDONED, signal
    return None


def _cause(observation: Observation, workload: str, reason: str, since: float | None) -> None:
    observation.causes.setdefault(workload, []).append(reason)
    began = since if since is not None else observation.now
    observation.loss_since[workload] = min(observation.loss_since.get(workload, began), began)
