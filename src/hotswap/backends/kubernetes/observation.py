"""From live Kubernetes objects to the core: a snapshot and the events that bring it up to date.

The controller is stateless: every reconcile rebuilds the core's snapshot from the live Nodes,
JobSets, Jobs and Pods, so a restarted controller (or a new leader) re-derives everything. What
only the core knows is read back from each JobSet's state annotation (:mod:`.state_annotation`).

How the live world becomes events:

- a node of a slice held by a running workload that is not Ready is a loss: the snapshot has it
  Ready and the round gets ``NodeFailed`` (machine gone) or ``NodeCordoned`` (cordon, drain,
  maintenance), so the core hotswaps exactly as it does locally;
- every other node enters with its live state; free Ready nodes enter as repaired
  (``NodeRepaired``), which makes every reconcile a full scheduling round: queued work is
  admitted onto free capacity, suspended work resumes when capacity returns;
- a JobSet without a state annotation is new: ``WorkloadCreated``;
- a workload whose earlier attempt's pods are all gone gets ``WorkersStopped`` (what
  BlockingRecreate waits for);
- a slice that vanished under a workload (its node pool was deleted) is ``SliceRemoved``.

Two modes of admission. By default hotswap admits: the workloads are the state annotations'
records. With Kueue (``--kueue``), Kueue owns admission, quota and suspension: a JobSet Kueue
has unsuspended is running where its pods are, and the controller only restarts running
JobSets that lost a node (the gap Kueue leaves, kueue#12701).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from hotswap.api.catalog import get_device_type
from hotswap.api.cluster import NodeState
from hotswap.api.phases import WorkloadPhase
from hotswap.api.spec import WorkloadSpec
from hotswap.backends.kubernetes.discovery import Discovery, discover
from hotswap.backends.kubernetes.live_objects import LiveJobSet, LivePod, metadata, read_jobset, read_pod
from hotswap.backends.kubernetes.settings import KubeSettings
from hotswap.backends.kubernetes.state_annotation import workload_from_state
from hotswap.core import events as ev
from hotswap.core.model import Node, Slice, Snapshot, Workload


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
    replicas: dict[str, list[str | None]]  # workload -> slice of each replica index (None: parked)
    unmanaged: list[str]  # JobSets with no readable hotswap spec

    @property
    def managed_admission(self) -> bool:
        return not self.settings.kueue

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
        return [p for p in self.pods if p.workload == workload]


def observe(
    nodes: Iterable[dict[str, Any]],
    jobsets: Iterable[dict[str, Any]],
    jobs: Iterable[dict[str, Any]],
    pods: Iterable[dict[str, Any]],
    settings: KubeSettings,
    cluster: str,
    now: float,
) -> Observation:
    """The core's view of the live objects: a snapshot and the events that bring it up to date."""
    discovery = discover(nodes, settings)
    live = [read_jobset(obj) for obj in jobsets]
    live.sort(key=lambda j: (j.created, j.name))
    by_name = {j.name: j for j in live}
    pod_list = [p for p in (read_pod(obj) for obj in pods) if p is not None and p.workload in by_name]
    job_uids = frozenset(metadata(obj).get("uid", "") for obj in jobs)
    unmanaged = [j.name for j in live if j.spec is None]
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
        replicas={},
        unmanaged=unmanaged,
    )
    if settings.kueue:
        workloads, created = _kueue_workloads(observation, live), []
    else:
        workloads, created = _managed_workloads(observation, live)
    workloads = _exclusive(workloads)
    observation.snapshot, observation.events = _snapshot(observation, workloads, created)
    return observation


def _terminal(workload: Workload, job: LiveJobSet) -> Workload:
    assert job.terminal is not None
    message = f"{'finished' if job.terminal is WorkloadPhase.SUCCESSFUL else 'failed'}: {job.terminal_message}"
    return dataclasses.replace(
        workload, phase=job.terminal, slices=(), stopping=frozenset(), status_message=message,
        status_time=workload.status_time,
    )


def _managed_workloads(observation: Observation, live: list[LiveJobSet]) -> tuple[list[Workload], list[WorkloadSpec]]:
    """hotswap admits: each JobSet's workload is its state record; one without is new."""
    workloads: list[Workload] = []
    created: list[WorkloadSpec] = []
    for job in live:
        if job.spec is None or job.rejected is not None:
            continue
        workload = workload_from_state(job.spec, job.state) if job.state is not None else None
        if workload is None:
            if job.terminal is None:
                created.append(job.spec)
            continue
        if job.terminal is not None:
            workload = _terminal(workload, job)
        replicas = list((job.state or {}).get("replicas") or workload.slices)
        replicas += [None] * (job.spec.num_slices - len(replicas))
        observation.replicas[job.name] = replicas[: job.spec.num_slices]
        workloads.append(workload)
    return workloads, created


def _kueue_workloads(observation: Observation, live: list[LiveJobSet]) -> list[Workload]:
    """Kueue admits: a JobSet it has unsuspended is running where its pods are."""
    workloads: list[Workload] = []
    next_seq = 1 + max((int(j.state.get("seq", -1)) for j in live if j.state), default=-1)
    for job in live:
        if job.spec is None:
            continue
        previous = workload_from_state(job.spec, job.state) if job.state is not None else None
        seq = previous.seq if previous is not None else next_seq
        if previous is None:
            next_seq += 1
        replicas: list[str | None] = [None] * job.spec.num_slices
        for pod in observation.pods_of(job.name):
            if pod.node is None or pod.terminating or pod.finished or pod.replica is None:
                continue
            slice_name = observation.discovery.slice_of_node.get(pod.node)
            if slice_name is not None and 0 <= pod.replica < len(replicas):
                replicas[pod.replica] = slice_name
        slices = tuple(s for s in replicas if s is not None)
        if job.terminal is not None:
            phase, slices = job.terminal, ()
        elif job.suspended:
            phase, slices = WorkloadPhase.QUEUED, ()
        else:
            phase = WorkloadPhase.RUNNING
        base = previous or Workload(spec=job.spec, seq=seq, created_at=job.created)
        workload = dataclasses.replace(
            base,
            phase=phase,
            slices=slices,
            stopping=frozenset(),
            attempt=max(base.attempt, 1) if phase is WorkloadPhase.RUNNING else base.attempt,
            restarts=job.restarts,
        )
        if job.terminal is not None:
            workload = _terminal(workload, job)
        observation.replicas[job.name] = replicas
        workloads.append(workload)
    return workloads


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
                    workload, phase=WorkloadPhase.QUEUED, slices=(), stopping=frozenset(), running_since=None,
                    status_message="requeued: another workload holds its slices",
                )
            taken.update(mine)
        result.append(workload)
    result.sort(key=lambda w: w.seq)
    return result


def _snapshot(observation: Observation, workloads: list[Workload], created: list[WorkloadSpec]) -> tuple[Snapshot, list[ev.Event]]:
    discovery = observation.discovery
    held = {s for w in workloads if w.phase.holds_slices for s in w.slices}
    known = {s.name for s in discovery.slices}
    slices = [Slice(s.name, s.device_type, s.nodes, ordinal) for ordinal, s in enumerate(discovery.slices)]
    nodes: list[Node] = []
    events: list[ev.Event] = []
    for item in discovery.slices:
        for name in item.nodes:
            node = discovery.nodes[name]
            if item.name in held:
                nodes.append(Node(name, item.name, node.host, NodeState.READY))
                if node.state is NodeState.FAILED:
                    events.append(ev.NodeFailed(name))
                elif node.state is NodeState.CORDONED:
                    events.append(ev.NodeCordoned(name))
            elif node.state is NodeState.READY:
                nodes.append(Node(name, item.name, node.host, NodeState.CORDONED))
                events.append(ev.NodeRepaired(name))
            else:
                nodes.append(Node(name, item.name, node.host, node.state))
    # Slices a workload holds that no longer exist (node pool deleted): present them whole and
    # Ready, then removed, so the core moves the workload as after any loss.
    ordinal = len(slices)
    by_slice_type = {s: w.device_type for w in workloads if w.phase.holds_slices for s in w.slices}
    for name in sorted(held - known):
        device = by_slice_type[name]
        hosts = get_device_type(device).hosts_per_slice
        members = tuple(f"{name}#gone-{host}" for host in range(hosts))
        slices.append(Slice(name, device, members, ordinal))
        nodes.extend(Node(member, name, host) for host, member in enumerate(members))
        events.append(ev.SliceRemoved(name))
        ordinal += 1
    for workload in workloads:
        if observation.managed_admission and workload.stopping and not observation.old_pods(workload.name):
            events.extend(ev.WorkersStopped(workload.name, attempt) for attempt in sorted(workload.stopping))
    events.extend(ev.WorkloadCreated(spec) for spec in created)
    snapshot = Snapshot.build(observation.now, slices, nodes, workloads)
    return snapshot, events
