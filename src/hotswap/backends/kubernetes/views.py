"""What ``workload list`` and ``describe`` show about JobSets: the same rows and JSON as the local
backend (see :mod:`hotswap.backends.local.queries.views`), built from live objects (pure)."""

from __future__ import annotations

import json
from typing import Any

from hotswap.api.times import parse_iso_utc
from hotswap.api.xpk_status import with_xpk_words
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.discovery import Discovery
from hotswap.backends.kubernetes.kueue_mode import kueue_views
from hotswap.backends.kubernetes.live_objects import LiveJobSet, LivePod, read_jobset
from hotswap.backends.views import FINISHED, PlacementRow, TimelineEntry, WorkerView, WorkloadRow, iso


def kueue_status(workloads: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """JobSet name -> (status, message) from Kueue's Workload objects (owned by the JobSet)."""
    return {name: (view.status, view.message) for name, view in kueue_views(workloads).items()}


def workload_view(obj: dict[str, Any], kueue: dict[str, tuple[str, str]] | None = None) -> WorkloadRow:
    """One row of ``workload list --output json`` for a JobSet."""
    job = read_jobset(obj)
    return view_of(job, kueue or {})


def view_of(job: LiveJobSet, kueue: dict[str, tuple[str, str]]) -> WorkloadRow:
    spec = job.spec
    workload = job.record.workload if job.record is not None else None
    status, message, when = _status(job, kueue)
    return with_xpk_words({
        "name": job.name,
        "priority": spec.priority.label if spec else (job.annotations.get(labels.PRIORITY_NAME_LABEL) or "unknown"),
        "status": status,
        "status_message": message,
        "status_time": iso(when),
        "created_time": iso(job.created),
        "slices": [] if status in FINISHED or status == "QUEUED" or workload is None else list(workload.slices),
        "num_slices": spec.num_slices if spec else None,
        "min_slices": spec.min_slices if spec else None,
        "device_type": spec.device_type if spec else None,
        # Restarts charged to --max-restarts: the controller's (restart codes) and JobSet's own.
        "restarts": (workload.restarts if workload else 0) + job.restarts,
        "preemptions": workload.preemptions if workload else 0,
        "disruptions": workload.disruptions if workload else 0,
        "attempt": workload.attempt if workload else 0,
        "command": spec.command if spec else None,
        **_run(job),
    })


def failed_run(job: LiveJobSet) -> tuple[str, str] | None:
    """(run id, why) of a JobSet whose run ended FAILED as its row says (JobSet's Failed
    condition, or hotswap's own judgement: a hang, restarts exhausted); None otherwise."""
    status, message, _ = _status(job, {})
    run_id = _run(job)["run_id"]
    return (run_id, message) if status == "FAILED" and run_id else None


def _run(job: LiveJobSet) -> dict[str, Any]:
    """``run_id`` and ``resumed_from`` from the JobSet's run annotation (None without one)."""
    try:
        run = json.loads(job.annotations.get(labels.RUN_ANNOTATION) or "{}")
    except ValueError:
        run = {}
    run = run if isinstance(run, dict) else {}
    origin = run.get("resumed_from")
    return {"run_id": run.get("id") if isinstance(run.get("id"), str) else None, "resumed_from": origin if isinstance(origin, dict) else None}


def _status(job: LiveJobSet, kueue: dict[str, tuple[str, str]]) -> tuple[str, str, float | None]:
    workload = job.record.workload if job.record is not None else None
    since = (workload.status_time or None) if workload is not None else None
    if job.terminal is not None:
        verb = "finished" if job.terminal.value == "SUCCESSFUL" else "failed"
        return job.terminal.value, f"{verb}: {job.terminal_message}", since
    if job.spec is None:
        return "FAILED", f"not a hotswap workload (no readable {labels.SPEC_ANNOTATION} annotation)", None
    if job.rejected is not None:
        return "FAILED", f"rejected: {job.rejected}", None
    if workload is not None and workload.phase.terminal:  # hotswap's judgement of the workers' exits
        return workload.phase.value, workload.status_message, since
    if job.name in kueue:
        status, message = kueue[job.name]
        return status, message, since
    if workload is None:
        return "QUEUED", "waiting for the hotswap controller (`hotswap controller run`)", job.created
    return workload.phase.value, workload.status_message, since


def slice_holders(views: list[WorkloadRow]) -> dict[str, str]:
    """Slice -> the workload holding it, from ``workload list`` rows."""
    return {slice_name: view["name"] for view in views for slice_name in view["slices"]}


def placement_view(replicas: list[str | None], discovery: Discovery) -> list[PlacementRow]:
    """``describe``'s placement: each placed replica's slice and the state of its nodes."""
    return [
        {
            "replica": index,
            "slice": slice_name,
            "nodes": [{"name": n, "state": discovery.nodes[n].state.value} for s in discovery.slices if s.name == slice_name for n in s.nodes],
        }
        for index, slice_name in enumerate(replicas)
        if slice_name
    ]


def workers_view(pods: list[LivePod], discovery: Discovery, attempt: int) -> list[WorkerView]:
    """``describe``'s workers: one row per pod, in replica and host order (the pod's name
    stands where the local backend shows a pid)."""
    return [
        {
            "attempt": attempt if p.attempt is None else p.attempt,  # the generation it was released for
            "replica": p.replica,
            "host": p.host,
            "slice": discovery.slice_of_node.get(p.node or "", None),
            "pid": p.name,
            "state": _pod_state(p),
            "exit_code": p.exit_code if p.finished else None,
        }
        for p in sorted(pods, key=lambda p: (p.replica or 0, p.host or 0))
    ]


def _pod_state(pod: LivePod) -> str:
    """A worker's state in the local backend's words: "running" once its pod runs (the
    kubelet's record: phase Running), "exited" once its container ended (with its exit code)."""
    if pod.terminating:
        return "terminating"
    if pod.finished:
        return "exited"
    if pod.running:
        return "running"
    return "gated" if pod.gated else ("scheduled" if pod.node else "pending")


def timeline_view(events: list[dict[str, Any]], uid: str) -> list[TimelineEntry]:
    """``describe``'s timeline: the Events recorded on the JobSet (hotswap's decisions, and
    JobSet's and Kueue's own), oldest first; those of an earlier JobSet of the same name are
    left out."""
    entries: list[tuple[float, TimelineEntry]] = []
    for event in events:
        involved = event.get("involvedObject") or {}
        if uid and involved.get("uid") not in (None, "", uid):
            continue
        meta = event.get("metadata") or {}
        stamp = next((t for t in (event.get("eventTime"), event.get("lastTimestamp"), event.get("firstTimestamp"), meta.get("creationTimestamp")) if isinstance(t, str) and t), None)
        try:
            t = parse_iso_utc(stamp) if stamp else 0.0
        except ValueError:
            t = 0.0
        count = event.get("count")
        message = str(event.get("message") or "")
        if isinstance(count, int) and count > 1:
            message += f" (x{count})"
        entries.append((t, {"time": iso(t), "event": str(event.get("reason") or event.get("type") or ""), "message": message}))
    entries.sort(key=lambda item: item[0])
    return [entry for _, entry in entries]
