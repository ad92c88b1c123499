"""Live Kubernetes objects as the controller reads them: JobSets and pods (plain dicts from the
API server) parsed into the few fields hotswap decides on. Pure; a missing or malformed field
reads as "not there", never as an error, because these objects are also written by JobSet,
the Job controller, Kueue and people."""

from __future__ import annotations

import dataclasses
from typing import Any

import pydantic

from hotswap.api.phases import WorkloadPhase
from hotswap.api.spec import WorkloadSpec
from hotswap.api.times import parse_iso_utc
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.state_annotation import decode_state


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


def metadata(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def read_jobset(obj: dict[str, Any]) -> LiveJobSet:
    meta = metadata(obj)
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
    state = decode_state(annotations[labels.STATE_ANNOTATION]) if labels.STATE_ANNOTATION in annotations else None
    created = meta.get("creationTimestamp")
    return LiveJobSet(
        name=meta["name"],
        uid=meta.get("uid", ""),
        spec=spec,
        suspended=bool((obj.get("spec") or {}).get("suspend")),
        terminal=terminal,
        terminal_message=message,
        state=state,
        rejected=annotations.get(labels.REJECTED_ANNOTATION),
        created=parse_iso_utc(created) if created else 0.0,
        restarts=int(status.get("restartsCountTowardsMax") or 0),
        annotations=dict(annotations),
    )


def read_pod(obj: dict[str, Any]) -> LivePod | None:
    """A pod of a hotswap workload, or None for any other pod."""
    meta = metadata(obj)
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
