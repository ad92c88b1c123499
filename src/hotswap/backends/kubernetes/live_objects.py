"""Live Kubernetes objects as the controller reads them: JobSets, pods of hotswap workloads, and
the pods of other owners that occupy nodes, parsed into the few fields hotswap decides on.

Pure; a missing or malformed field reads as "not there", never as an error, because these
objects are also written by JobSet, the Job controller, Kueue, the kubelet and people.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pydantic

from hotswap.api import worker as contract
from hotswap.api.catalog import GPU_RESOURCE, TPU_RESOURCE
from hotswap.api.phases import WorkloadPhase
from hotswap.api.spec import WorkloadSpec
from hotswap.api.times import parse_iso_utc
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.state_annotation import StateRecord, decode_state, replica_slots

ACCELERATORS = (TPU_RESOURCE, GPU_RESOURCE)


@dataclasses.dataclass(frozen=True)
class LiveJobSet:
    name: str
    uid: str
    resource_version: str | None
    spec: WorkloadSpec | None
    suspended: bool
    terminal: WorkloadPhase | None  # from JobSet's Completed / Failed conditions
    terminal_message: str
    record: StateRecord | None  # its state annotation (None: none, or not a record of its spec's workload)
    rejected: str | None
    created: float
    restarts: int  # JobSet restarts counted against maxRestarts
    restarts_total: int  # every JobSet restart (status.restarts): its restart-attempt
    annotations: dict[str, str]
    touched: float | None = None  # when the controller last touched it (a replica without a Job)

    @property
    def replicas(self) -> list[str | None]:
        """The slice of each replica index (None: parked), as its record says; empty without one."""
        return replica_slots(self.record.workload) if self.record is not None else []


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
    phase: str = "Pending"
    exit_code: int | None = None  # the worker container's, once terminated
    finished_at: float | None = None
    disruption: str | None = None  # the reason of a DisruptionTarget condition
    unschedulable_since: float | None = None  # PodScheduled=False (Unschedulable), counted from the release
    # metadata.deletionTimestamp of a terminating pod: the time the API server gives it to be gone
    # (the delete's time plus its grace period: pkg/registry/rest/delete.go, ``BeforeDelete``).
    deletion_deadline: float | None = None
    # Why the kubelet refused to run it: a pod Failed with no exit code (pkg/kubelet/kubelet.go,
    # ``rejectPod``: status.reason, e.g. UnexpectedAdmissionError when the device plugin cannot
    # allocate its accelerators, and the message; no container ever ran).
    rejected: str | None = None
    uid: str = ""
    created: float = 0.0  # its creationTimestamp

    @property
    def gated(self) -> bool:
        return labels.PLACEMENT_GATE in self.gates

    @property
    def attempt(self) -> int | None:
        """The worker generation the controller released it for (None: never released)."""
        return _int(self.annotations.get(labels.ATTEMPT_ANNOTATION))

    @property
    def running(self) -> bool:
        return self.phase == "Running" and self.node is not None and not self.terminating


@dataclasses.dataclass(frozen=True)
class Occupant:
    """A pod of another owner holding accelerators on a node."""

    name: str
    namespace: str
    node: str


def metadata(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _time(value: Any) -> float | None:
    try:
        return parse_iso_utc(value) if isinstance(value, str) and value else None
    except ValueError:
        return None


def read_jobset(obj: dict[str, Any]) -> LiveJobSet:
    meta = metadata(obj)
    annotations = _dict(meta.get("annotations"))
    spec: WorkloadSpec | None
    try:
        spec = WorkloadSpec.model_validate_json(annotations.get(labels.SPEC_ANNOTATION, ""))
    except (pydantic.ValidationError, ValueError):
        spec = None  # not hotswap's, or edited by hand: listed, never scheduled
    status = _dict(obj.get("status"))
    terminal, message = None, ""
    for condition in status.get("conditions") or []:
        if not isinstance(condition, dict) or condition.get("status") != "True":
            continue
        if condition.get("type") == "Completed":
            terminal, message = WorkloadPhase.SUCCESSFUL, condition.get("message") or "completed"
        elif condition.get("type") == "Failed":
            terminal, message = WorkloadPhase.FAILED, condition.get("message") or "failed"
    # Parsed here, once: observation, planning and the views read the typed record.
    text = annotations.get(labels.STATE_ANNOTATION)
    record = decode_state(text, spec) if isinstance(text, str) and spec is not None else None
    return LiveJobSet(
        name=meta["name"],
        uid=meta.get("uid", ""),
        resource_version=meta.get("resourceVersion"),
        spec=spec,
        suspended=bool(_dict(obj.get("spec")).get("suspend")),
        terminal=terminal,
        terminal_message=message,
        record=record,
        rejected=annotations.get(labels.REJECTED_ANNOTATION),
        created=_time(meta.get("creationTimestamp")) or 0.0,
        restarts=_int(status.get("restartsCountTowardsMax")) or 0,
        restarts_total=_int(status.get("restarts")) or 0,
        annotations=dict(annotations),
        touched=_time(annotations.get(labels.TOUCHED_ANNOTATION)),
    )


def _worker_exit(status: dict[str, Any], name: str) -> tuple[int | None, float | None]:
    for container in status.get("containerStatuses") or []:
        if isinstance(container, dict) and container.get("name") == name:
            terminated = _dict(_dict(container.get("state")).get("terminated"))
            if terminated:
                return _int(terminated.get("exitCode")), _time(terminated.get("finishedAt"))
    return None, None


def worker_env_value(obj: dict[str, Any], variable: str) -> str | None:
    """The value a JobSet gives its workers for ``variable`` (the first replicated job's worker
    container: every replica gets the same environment)."""
    annotations = _dict(metadata(obj).get("annotations"))
    container = container_of(annotations)
    for job in _dict(obj.get("spec")).get("replicatedJobs") or []:
        pod = _dict(_dict(_dict(_dict(job).get("template")).get("spec")).get("template"))
        for item in _dict(pod.get("spec")).get("containers") or []:
            if _dict(item).get("name") != container:
                continue
            for entry in item.get("env") or []:
                if _dict(entry).get("name") == variable and isinstance(entry.get("value"), str):
                    return entry["value"]
        return None
    return None


def container_of(annotations: dict[str, Any]) -> str:
    """The worker container's name in a pod (``--docker-name``, or hotswap's default)."""
    name = annotations.get(labels.CONTAINER_ANNOTATION)
    return name if isinstance(name, str) and name else labels.CONTAINER_NAME


@dataclasses.dataclass(frozen=True)
class CoordinatorPod:
    """The pod of an elastic JobSet's JAX coordination service (render/coordination.py)."""

    name: str
    workload: str
    membership: str | None  # its membership annotation
    live: bool  # neither terminating nor finished
    # When the service it ran went away (it exited, was disrupted or deleted): None while it runs.
    lost_at: float | None = None
    uid: str = ""
    # A terminating pod not yet finished: when its grace period ends (a kubelet that answers
    # has confirmed by then; one on a dead node never does).
    deletion_deadline: float | None = None


def service_losses(job: LiveJobSet, pods: list[CoordinatorPod]) -> list[float]:
    """When the JobSet's JAX coordination service went away: its pods' ends, and the one
    recorded on the JobSet (which outlives a pod deleted since)."""
    recorded = _time(job.annotations.get(labels.SERVICE_LOST_ANNOTATION))
    return sorted({t for t in [recorded, *(c.lost_at for c in pods)] if t is not None})


def _workload_of(meta: dict[str, Any]) -> tuple[str | None, bool]:
    """The workload a pod belongs to (None: not a hotswap pod), and whether it is the workload's
    coordinator rather than a worker."""
    pod_labels = _dict(meta.get("labels"))
    workload = pod_labels.get(labels.JOBSET_NAME_LABEL) or pod_labels.get(labels.WORKLOAD_LABEL)
    return workload, pod_labels.get(labels.REPLICATED_JOB_NAME_LABEL) == contract.COORDINATOR_JOB


def read_coordinator_pod(obj: dict[str, Any]) -> CoordinatorPod | None:
    """A workload's coordinator pod, or None for any other pod."""
    meta = metadata(obj)
    workload, coordinator = _workload_of(meta)
    if workload is None or not coordinator:
        return None
    status = _dict(obj.get("status"))
    phase = status.get("phase")
    ended = [_worker_exit(status, contract.COORDINATOR_JOB)[1], _time(meta.get("deletionTimestamp"))]
    ended += [
        _time(c.get("lastTransitionTime")) for c in status.get("conditions") or []
        if isinstance(c, dict) and c.get("type") == labels.DISRUPTION_TARGET and c.get("status") == "True"
    ]
    known = [t for t in ended if t is not None]
    live = not meta.get("deletionTimestamp") and phase not in ("Succeeded", "Failed")
    return CoordinatorPod(
        name=meta["name"],
        workload=workload,
        membership=_dict(meta.get("annotations")).get(labels.MEMBERSHIP_ANNOTATION),
        live=live,
        lost_at=None if live and not known else (min(known) if known else None),
        uid=str(meta.get("uid") or ""),
        deletion_deadline=_time(meta.get("deletionTimestamp")) if phase not in ("Succeeded", "Failed") else None,
    )


def read_pod(obj: dict[str, Any]) -> LivePod | None:
    """A worker pod of a hotswap workload, or None for any other pod (its coordinator's too)."""
    meta = metadata(obj)
    workload, coordinator = _workload_of(meta)
    if workload is None or coordinator:
        return None
    pod_labels = _dict(meta.get("labels"))
    annotations = _dict(meta.get("annotations"))
    spec = _dict(obj.get("spec"))
    status = _dict(obj.get("status"))
    owner = next((o.get("uid") for o in meta.get("ownerReferences") or [] if isinstance(o, dict) and o.get("kind") == "Job"), None)
    phase = status.get("phase") or "Pending"
    exit_code, finished_at = _worker_exit(status, container_of(annotations))
    disruption, unschedulable = None, None
    for condition in status.get("conditions") or []:
        if not isinstance(condition, dict):
            continue
        if condition.get("type") == labels.DISRUPTION_TARGET and condition.get("status") == "True":
            disruption = condition.get("reason") or labels.DISRUPTION_TARGET
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False" and condition.get("reason") == "Unschedulable":
            unschedulable = _unschedulable_since(condition, annotations)
    return LivePod(
        name=meta["name"],
        workload=workload,
        replica=_int(pod_labels.get(labels.JOB_INDEX_LABEL)),
        host=_int(annotations.get(labels.JOB_COMPLETION_INDEX_ANNOTATION)),
        node=spec.get("nodeName"),
        gates=tuple(g.get("name", "") for g in spec.get("schedulingGates") or [] if isinstance(g, dict)),
        terminating=bool(meta.get("deletionTimestamp")),
        finished=phase in ("Succeeded", "Failed"),
        owner_uid=owner,
        node_selector=dict(_dict(spec.get("nodeSelector"))),
        annotations=dict(annotations),
        phase=phase,
        exit_code=exit_code,
        finished_at=finished_at,
        disruption=disruption,
        unschedulable_since=unschedulable,
        uid=str(meta.get("uid") or ""),
        created=_time(meta.get("creationTimestamp")) or 0.0,
        deletion_deadline=_time(meta.get("deletionTimestamp")),
        rejected=_rejection(status) if phase == "Failed" and exit_code is None and disruption is None else None,
    )


def _rejection(status: dict[str, Any]) -> str | None:
    """The kubelet's reason for a pod that failed before any of its containers ran."""
    if any(_dict(_dict(c).get("state")).get("terminated") for c in status.get("containerStatuses") or []):
        return None
    reason, message = status.get("reason") or "", status.get("message") or ""
    return f"{reason}: {message}".strip(": ") or "failed without an exit code"


def _unschedulable_since(condition: dict[str, Any], annotations: dict[str, Any]) -> float | None:
    """Since when a released pod waits for a node: from the release of the gate, never before.
    PodScheduled's lastTransitionTime is no measure of that: the API server sets the condition
    (False, SchedulingGated) when a gated pod is created (pkg/registry/core/pod/strategy.go,
    ``applySchedulingGatedCondition``), and the scheduler's Unschedulable keeps that time, the
    status staying False (pkg/api/v1/pod/util.go, ``UpdatePodCondition``)."""
    since = _time(condition.get("lastTransitionTime"))
    released = _time(annotations.get(labels.RELEASED_AT_ANNOTATION))
    if released is None:
        return since
    return released if since is None else max(since, released)


def read_occupant(obj: dict[str, Any], ours: frozenset[tuple[str, str]]) -> Occupant | None:
    """A pod not in ``ours`` ((namespace, name) of hotswap's pods), bound to a node, not
    finished, that requests accelerators: it occupies that node's slice."""
    meta = metadata(obj)
    spec = _dict(obj.get("spec"))
    node = spec.get("nodeName")
    if not node or _dict(obj.get("status")).get("phase") in ("Succeeded", "Failed"):
        return None
    namespace = meta.get("namespace", "")
    if (namespace, meta.get("name")) in ours:
        return None
    for container in spec.get("containers") or []:
        resources = _dict(_dict(container).get("resources"))
        wanted = {**_dict(resources.get("limits")), **_dict(resources.get("requests"))}
        if any(_int(wanted.get(name)) for name in ACCELERATORS):
            return Occupant(meta.get("name", ""), namespace, node)
    return None
