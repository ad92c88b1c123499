"""Between live Kubernetes objects and the core (pure): objects -> snapshot and events;
the core's decision -> API operations, as data.

The controller is stateless: every reconcile rebuilds the core's snapshot from the live Nodes,
JobSets, Jobs and Pods, so a restarted controller (or a new leader) re-derives everything. What
only the core knows (queue order, attempts, preemptions, the slices it placed each replica on)
is kept on the JobSet itself, in the ``hotswap.dev/state`` annotation the controller writes.

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

How actions become operations (see the classes below): admission and resumption unsuspend the
JobSet; preemption and requeueing suspend it (JobSet stops its pods gracefully, the JobSet stays
queued); a restart deletes its child Jobs so that JobSet recreates them at once, and force-deletes
pods stuck on machines that are gone. New pods carry a scheduling gate; the controller pins each
one to the slice the core chose for its replica and lifts the gate, and only while the workload
is RUNNING, which is how BlockingRecreate's "old workers gone first" holds.

With Kueue (``--kueue``), Kueue owns admission, quota and suspension: the controller then only
restarts running JobSets that lost a node (the gap Kueue leaves, kueue#12701) and records what
it did; kube-scheduler's priority preemption, scoped by JobSet's priority-aware exclusive
placement, frees the lower-priority slices.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import pydantic

from hotswap.api.catalog import get_device_type
from hotswap.api.cluster import NodeState
from hotswap.api.phases import WorkloadPhase
from hotswap.api.spec import WorkloadSpec
from hotswap.api.worker import Membership
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.discovery import Discovery, discover
from hotswap.backends.kubernetes.settings import KubeSettings
from hotswap.core import actions as act
from hotswap.core import events as ev
from hotswap.core.model import Node, Slice, Snapshot, Workload
from hotswap.core.scheduler import Decision
from hotswap.store.codec import workload_from_json, workload_to_dict

QUEUED = WorkloadPhase.QUEUED
RUNNING = WorkloadPhase.RUNNING
RESTARTING = WorkloadPhase.RESTARTING
_HOLDING = (RUNNING, RESTARTING)


# ---------------------------------------------------------------------- operations (data)


@dataclasses.dataclass(frozen=True)
class SetSuspend:
    jobset: str
    suspend: bool


@dataclasses.dataclass(frozen=True)
class SetAnnotations:
    """Merge-patch JobSet annotations (a None value removes the key)."""

    jobset: str
    annotations: dict[str, str | None]


@dataclasses.dataclass(frozen=True)
class RecreateJobs:
    """Delete child Jobs (all, or the given replica indices) in the background; JobSet recreates
    them with fresh pods, which wait behind the placement gate."""

    jobset: str
    replicas: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class ForceDeletePod:
    """A pod on a machine that is gone can never finish terminating; remove it (grace 0)."""

    pod: str


@dataclasses.dataclass(frozen=True)
class PlacePod:
    """Pin a gated pod to a slice (nodeSelector entries added), annotate it, lift the gate."""

    pod: str
    node_selector: dict[str, str]
    annotations: dict[str, str]
    gates: tuple[str, ...]  # the scheduling gates that remain


@dataclasses.dataclass(frozen=True)
class AnnotatePod:
    pod: str
    annotations: dict[str, str]


@dataclasses.dataclass(frozen=True)
class RecordEvent:
    """A Kubernetes Event on the JobSet (what `kubectl describe jobset` shows)."""

    jobset: str
    reason: str
    message: str
    warning: bool = False


Operation = SetSuspend | SetAnnotations | RecreateJobs | ForceDeletePod | PlacePod | AnnotatePod | RecordEvent


# ---------------------------------------------------------------------- live objects


def timestamp(text: str | None) -> float:
    """An RFC 3339 time of the API (``2026-01-02T03:04:05Z``) as Unix seconds."""
    if not text:
        return 0.0
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclasses.dataclass(frozen=True)
class LiveJobSet:
    name: str
    uid: str
    spec: WorkloadSpec | None
    suspended: bool
    terminal: WorkloadPhase | None  # from JobSet's Completed / Failed conditions
    terminal_message: str
    state: dict[str, Any] | None
    rejected: str | None
    created: float
    restarts: int  # JobSet restarts counted against maxRestarts
    annotations: dict[str, str]


@dataclasses.dataclass(frozen=True)
class LivePod:
    name: str
    workload: str
    replica: int | None
    host: int | None
    node: str | None
    gates: tuple[str, ...]
    terminating: bool
    finished: bool
    owner_uid: str | None
    node_selector: dict[str, str]
    annotations: dict[str, str]

    @property
    def gated(self) -> bool:
        return labels.PLACEMENT_GATE in self.gates


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def read_jobset(obj: dict[str, Any]) -> LiveJobSet:
    meta = _meta(obj)
    annotations = meta.get("annotations") or {}
    spec: WorkloadSpec | None
    try:
        spec = WorkloadSpec.model_validate_json(annotations.get(labels.SPEC_ANNOTATION, ""))
    except (pydantic.ValidationError, ValueError):
        spec = None  # not hotswap's, or edited by hand: listed, never scheduled
    status = obj.get("status") or {}
    terminal, message = None, ""
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Completed":
            terminal, message = WorkloadPhase.SUCCESSFUL, condition.get("message") or "completed"
        elif condition.get("type") == "Failed":
            terminal, message = WorkloadPhase.FAILED, condition.get("message") or "failed"
    state = None
    if labels.STATE_ANNOTATION in annotations:
        try:
            state = json.loads(annotations[labels.STATE_ANNOTATION])
        except ValueError:
            state = None
    return LiveJobSet(
        name=meta["name"],
        uid=meta.get("uid", ""),
        spec=spec,
        suspended=bool((obj.get("spec") or {}).get("suspend")),
        terminal=terminal,
        terminal_message=message,
        state=state,
        rejected=annotations.get(labels.REJECTED_ANNOTATION),
        created=timestamp(meta.get("creationTimestamp")),
        restarts=int(status.get("restartsCountTowardsMax") or 0),
        annotations=dict(annotations),
    )


def read_pod(obj: dict[str, Any]) -> LivePod | None:
    meta = _meta(obj)
    pod_labels = meta.get("labels") or {}
    workload = pod_labels.get(labels.JOBSET_NAME_LABEL) or pod_labels.get(labels.WORKLOAD_LABEL)
    if workload is None:
        return None
    annotations = meta.get("annotations") or {}
    spec = obj.get("spec") or {}
    owner = next((o.get("uid") for o in meta.get("ownerReferences") or [] if o.get("kind") == "Job"), None)
    phase = (obj.get("status") or {}).get("phase")
    return LivePod(
        name=meta["name"],
        workload=workload,
        replica=_int(pod_labels.get(labels.JOB_INDEX_LABEL)),
        host=_int(annotations.get(labels.JOB_COMPLETION_INDEX_ANNOTATION)),
        node=spec.get("nodeName"),
        gates=tuple(g.get("name", "") for g in spec.get("schedulingGates") or []),
        terminating=bool(meta.get("deletionTimestamp")),
        finished=phase in ("Succeeded", "Failed"),
        owner_uid=owner,
        node_selector=dict(spec.get("nodeSelector") or {}),
        annotations=dict(annotations),
    )


# ---------------------------------------------------------------------- observe


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
    job_uids = frozenset(_meta(obj).get("uid", "") for obj in jobs)
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


def state_of(
    workload: Workload, replicas: Sequence[str | None], previous: dict[str, Any] | None, now: float
) -> dict[str, Any]:
    """What the state annotation holds: the core's record without the spec, the replica map,
    and the seconds spent in each phase so far (closed at every phase change, so the annotation
    is rewritten only when something happens)."""
    record = workload_to_dict(workload)
    del record["spec"]
    record["replicas"] = list(replicas)
    ledger = dict((previous or {}).get("phase_seconds") or {})
    since = (previous or {}).get("phase_since", now)
    old_phase = (previous or {}).get("phase")
    if old_phase is not None and old_phase != record["phase"]:
        ledger[old_phase] = ledger.get(old_phase, 0.0) + max(0.0, now - since)
        since = now
    record["phase_seconds"] = ledger
    record["phase_since"] = since
    return record


_EXTRA_STATE = ("replicas", "phase_seconds", "phase_since")


def _from_state(job: LiveJobSet) -> Workload | None:
    assert job.spec is not None and job.state is not None
    record = {key: value for key, value in job.state.items() if key not in _EXTRA_STATE}
    record["spec"] = job.spec.model_dump(mode="json")
    try:
        return workload_from_json(json.dumps(record))
    except (KeyError, TypeError, ValueError, pydantic.ValidationError):
        return None


def _terminal(workload: Workload, job: LiveJobSet) -> Workload:
    assert job.terminal is not None
    message = f"{'finished' if job.terminal is WorkloadPhase.SUCCESSFUL else 'failed'}: {job.terminal_message}"
    return dataclasses.replace(
        workload, phase=job.terminal, slices=(), stopping=frozenset(), status_message=message,
        status_time=workload.status_time,
    )


def _managed_workloads(observation: Observation, live: list[LiveJobSet]) -> tuple[list[Workload], list[WorkloadSpec]]:
    workloads: list[Workload] = []
    created: list[WorkloadSpec] = []
    for job in live:
        if job.spec is None or job.rejected is not None:
            continue
        workload = _from_state(job) if job.state is not None else None
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
        previous = _from_state(job) if job.state is not None else None
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
            phase, slices = QUEUED, ()
        else:
            phase = RUNNING
        base = previous or Workload(spec=job.spec, seq=seq, created_at=job.created)
        workload = dataclasses.replace(
            base,
            phase=phase,
            slices=slices,
            stopping=frozenset(),
            attempt=max(base.attempt, 1) if phase is RUNNING else base.attempt,
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
        if workload.phase in _HOLDING:
            mine = tuple(s for s in workload.slices if s not in taken)
            if len(mine) < len(workload.slices):
                workload = dataclasses.replace(
                    workload, phase=QUEUED, slices=(), stopping=frozenset(), running_since=None,
                    status_message="requeued: another workload holds its slices",
                )
            taken.update(mine)
        result.append(workload)
    result.sort(key=lambda w: w.seq)
    return result


def _snapshot(observation: Observation, workloads: list[Workload], created: list[WorkloadSpec]) -> tuple[Snapshot, list[ev.Event]]:
    discovery = observation.discovery
    held = {s for w in workloads if w.phase in _HOLDING for s in w.slices}
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
    by_slice_type = {s: w.device_type for w in workloads if w.phase in _HOLDING for s in w.slices}
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


# ---------------------------------------------------------------------- plan


def _membership(name: str, workload: Workload, replicas: Sequence[str | None], hosts: int) -> Membership:
    active = [index for index, slice_name in enumerate(replicas) if slice_name is not None]
    first = active[0] if active else 0
    return Membership(
        generation=workload.membership,
        slices=tuple(s for s in replicas if s is not None),
        hosts_per_slice=hosts,
        master_addr=f"{name}-slice-{first}-0.{name}",
        # A new generation rendezvous on its own port, so it never meets the previous group.
        master_port=labels.MASTER_PORT + 1 + workload.membership,
    )


def _replicas_after(actions: Sequence[act.Action], replicas: list[str | None], num_slices: int) -> list[str | None]:
    result = list(replicas) + [None] * (num_slices - len(replicas))
    for action in actions:
        if isinstance(action, (act.Admit, act.Restart)):
            result = list(action.slices) + [None] * (num_slices - len(action.slices))
        elif isinstance(action, act.ScaleDown):
            result = [None if s in action.removed else s for s in result]
        elif isinstance(action, act.ScaleUp):
            added = iter(action.added)
            result = [next(added, None) if s is None else s for s in result]
        elif isinstance(action, (act.Preempt, act.Requeue, act.Fail, act.Complete)):
            result = [None] * num_slices
    return result[:num_slices]


def plan(observation: Observation, decision: Decision) -> list[Operation]:
    """The operations that enact a decision and bring the live objects in line with it."""
    operations: list[Operation] = []
    by_workload: dict[str, list[act.Action]] = {}
    for action in decision.actions:
        by_workload.setdefault(action.workload, []).append(action)
    managed = observation.managed_admission
    discovery = observation.discovery
    pins = {s.name: s.pin for s in discovery.slices}
    for name, job in observation.jobsets.items():
        if job.spec is None:
            continue
        actions = by_workload.get(name, [])
        for action in actions:
            operations.extend(_enact(observation, job, action))
        workload = decision.snapshot.workloads.get(name)
        if workload is None:
            continue
        replicas = _replicas_after(actions, observation.replicas.get(name, []), job.spec.num_slices)
        state = state_of(workload, replicas, job.state, observation.now)
        if state != job.state:
            operations.append(SetAnnotations(name, {labels.STATE_ANNOTATION: json.dumps(state, sort_keys=True)}))
        # Pods left on machines that are gone, by a workload that no longer holds that slice.
        held = set(workload.slices) if workload.phase in _HOLDING else set()
        for pod in observation.pods_of(name):
            if pod.node is None or pod.finished:
                continue
            node = discovery.nodes.get(pod.node)
            if node is not None and node.state is NodeState.FAILED and node.slice not in held:
                operations.append(ForceDeletePod(pod.name))
        if not managed or job.terminal is not None:
            continue
        want_suspended = workload.phase not in _HOLDING
        if want_suspended != job.suspended:
            operations.append(SetSuspend(name, want_suspended))
        if workload.phase is not RUNNING:
            continue
        hosts = _hosts(job.spec)
        membership = _membership(name, workload, replicas, hosts).to_json() if job.spec.elastic else None
        recreated = {i for a in actions if isinstance(a, act.ScaleDown) for i, s in enumerate(observation.replicas.get(name, [])) if s in a.removed}
        restarted = any(isinstance(a, act.Restart) for a in actions)
        for pod in observation.pods_of(name):
            if pod.terminating or pod.finished or pod.replica is None or pod.replica >= len(replicas):
                continue
            current = pod.owner_uid is None or pod.owner_uid in observation.job_uids
            if not current or restarted or pod.replica in recreated:
                continue  # about to be replaced
            slice_name = replicas[pod.replica]
            if pod.gated and slice_name is not None:
                selector = {k: v for k, v in pins[slice_name].items() if k not in pod.node_selector} if slice_name in pins else {}
                annotations = {labels.SLICE_ANNOTATION: slice_name}
                if membership is not None:
                    annotations[labels.MEMBERSHIP_ANNOTATION] = membership
                gates = tuple(g for g in pod.gates if g != labels.PLACEMENT_GATE)
                operations.append(PlacePod(pod.name, selector, annotations, gates))
            elif membership is not None and not pod.gated and pod.annotations.get(labels.MEMBERSHIP_ANNOTATION) != membership:
                operations.append(AnnotatePod(pod.name, {labels.MEMBERSHIP_ANNOTATION: membership}))
    operations.sort(key=lambda op: _ORDER[type(op)])
    return operations


# Side effects before the record of them: a controller that dies in between finds the old
# record and repeats the decision, rather than a record of a move that never happened.
_ORDER = {RecreateJobs: 0, SetSuspend: 1, ForceDeletePod: 2, SetAnnotations: 3, RecordEvent: 4, PlacePod: 5, AnnotatePod: 6}


def _hosts(spec: WorkloadSpec) -> int:
    return get_device_type(spec.device_type).hosts_per_slice


def _enact(observation: Observation, job: LiveJobSet, action: act.Action) -> list[Operation]:
    """Edge-triggered operations of one action (suspension and pod placement are level-triggered
    in :func:`plan`)."""
    name = job.name
    if not observation.managed_admission and isinstance(action, (act.Admit, act.Preempt, act.ScaleUp, act.StartWorkers)):
        return []  # Kueue admits, and kube-scheduler preempts: nothing of ours to do or report
    if isinstance(action, act.Reject):
        return [
            SetAnnotations(name, {labels.REJECTED_ANNOTATION: action.reason}),
            RecordEvent(name, "Rejected", action.reason, warning=True),
        ]
    if isinstance(action, act.Admit):
        return [RecordEvent(name, "Admitted", f"admitted onto {', '.join(action.slices)}")]
    if isinstance(action, act.Preempt):
        return [RecordEvent(name, "Preempted", action.reason, warning=True)]
    if isinstance(action, act.Requeue):
        operations: list[Operation] = [RecordEvent(name, "Requeued", action.reason, warning=True)]
        if not observation.managed_admission:
            operations.insert(0, RecreateJobs(name))  # Kueue keeps it admitted: restart it in place
        return operations
    if isinstance(action, act.Restart):
        where = ", ".join(action.slices)
        return [RecreateJobs(name), RecordEvent(name, "Restarted", f"{action.reason}; restarting on {where}")]
    if isinstance(action, act.ScaleDown):
        previous = observation.replicas.get(name, [])
        lost = tuple(i for i, s in enumerate(previous) if s in action.removed)
        return [
            RecreateJobs(name, lost),
            RecordEvent(name, "ScaledDown", f"{action.reason}; running on {len(action.slices)} slice(s)", warning=True),
        ]
    if isinstance(action, act.ScaleUp):
        return [RecordEvent(name, "ScaledUp", f"grew onto {', '.join(action.added)}")]
    if isinstance(action, act.Fail):
        return [RecordEvent(name, "Failed", action.reason, warning=True)]
    return []


def decisions_summary(operations: Iterable[Operation]) -> list[str]:
    """One line per operation, for the controller's log."""
    lines = []
    for op in operations:
        if isinstance(op, SetSuspend):
            lines.append(f"{'suspend' if op.suspend else 'resume'} jobset/{op.jobset}")
        elif isinstance(op, RecreateJobs):
            which = "all jobs" if op.replicas is None else f"jobs of replicas {list(op.replicas)}"
            lines.append(f"recreate {which} of jobset/{op.jobset}")
        elif isinstance(op, ForceDeletePod):
            lines.append(f"force-delete pod/{op.pod} (its node is gone)")
        elif isinstance(op, PlacePod):
            lines.append(f"place pod/{op.pod} on {op.annotations.get(labels.SLICE_ANNOTATION)}")
        elif isinstance(op, RecordEvent):
            lines.append(f"{op.reason} jobset/{op.jobset}: {op.message}")
    return lines
