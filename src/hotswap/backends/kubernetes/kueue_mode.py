"""Workloads when Kueue admits (``--kueue``), from JobSets and Kueue's Workloads (pure).

Kueue decides *who* may run: admission by quota, queueing and preemption by priority. It
suspends and unsuspends the JobSets, and undoes any suspension it did not decide itself (kueue
pkg/controller/jobframework/reconciler.go, ``ReconcileGenericJob``: an admitted suspended job is
started, an unadmitted running one stopped). hotswap decides *where* and *when*: it places the
pods of an admitted JobSet on whole healthy slices, restarts it when a node under it fails or a
worker fails, and judges exits. So:

- a JobSet Kueue keeps suspended is queued in Kueue, with Kueue's reason; the core never sees
  it, so it is never "admitted" again and again (what looped before);
- a JobSet Kueue has admitted is the core's like any other: queued until the core finds it
  healthy slices (Kueue's quota is not capacity: a broken slice still counts in it), then
  placed and run; preempted or requeued by the core, it is restarted in place and its pods wait
  behind the gate, since only Kueue may suspend it;
- a workload whose worker made a user error is stopped by deactivating its Kueue Workload,
  Kueue's own way to stop a workload for good.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from hotswap.api.phases import WorkloadPhase
from hotswap.backends.kubernetes.live_objects import LiveJobSet
from hotswap.core.workload import Workload


@dataclasses.dataclass(frozen=True)
class KueueView:
    """The Kueue Workload of a JobSet, as far as hotswap reads it."""

    name: str
    active: bool
    status: str  # QUEUED, RUNNING, SUCCESSFUL or FAILED, as workload list shows it
    message: str
    evicted_by: str | None  # the reason of a true Evicted condition (Preempted, Deactivated, ...)


def kueue_views(objects: Iterable[dict[str, Any]]) -> dict[str, KueueView]:
    """JobSet name -> its Kueue Workload (owned by the JobSet)."""
    found: dict[str, KueueView] = {}
    for item in objects:
        meta = item.get("metadata") or {}
        owner = next((o.get("name") for o in meta.get("ownerReferences") or [] if o.get("kind") == "JobSet"), None)
        if owner is None:
            continue
        conditions = {c.get("type"): c for c in (item.get("status") or {}).get("conditions") or [] if isinstance(c, dict)}
        true = {kind: c for kind, c in conditions.items() if c.get("status") == "True"}
        evicted = true.get("Evicted")
        if "Finished" in true:
            status = "FAILED" if true["Finished"].get("reason") == "Failed" else "SUCCESSFUL"
            message = true["Finished"].get("message") or "finished"
        elif evicted is not None:
            status, message = "QUEUED", f"evicted by Kueue ({evicted.get('reason')}): {evicted.get('message') or ''}".rstrip(": ")
        elif "Admitted" in true:
            status, message = "RUNNING", f"admitted by Kueue: {true['Admitted'].get('message') or 'admitted'}"
        else:
            pending = next((c for c in conditions.values() if c.get("status") == "False" and c.get("message")), None)
            status, message = "QUEUED", f"queued in Kueue: {pending.get('message') if pending else 'waiting for Kueue to admit it'}"
        found[owner] = KueueView(
            name=meta.get("name", ""),
            active=(item.get("spec") or {}).get("active", True) is not False,
            status=status,
            message=message,
            evicted_by=evicted.get("reason") if evicted else None,
        )
    return found


def terminal_workload(workload: Workload, job: LiveJobSet) -> Workload:
    """A workload whose JobSet completed or failed (its own conditions)."""
    assert job.terminal is not None
    message = f"{'finished' if job.terminal is WorkloadPhase.SUCCESSFUL else 'failed'}: {job.terminal_message}"
    return dataclasses.replace(
        workload, phase=job.terminal, slices=(), replicas=None, stopping=frozenset(), status_message=message,
        status_time=workload.status_time,
    )


def kueue_queued(
    live: list[LiveJobSet], views: Mapping[str, KueueView], now: float
) -> tuple[list[LiveJobSet], dict[str, Workload]]:
    """The JobSets Kueue has admitted (and finished ones), for the core, and the records of
    those Kueue keeps suspended (when they have one), queued with Kueue's reason: the workloads
    outside the core's scheduling."""
    admitted = []
    outside: dict[str, Workload] = {}
    for job in live:
        if job.spec is None:
            continue
        if not job.suspended or job.terminal is not None:
            admitted.append(job)
            continue
        if job.record is not None:
            outside[job.name] = _queued(job.record.workload, views.get(job.name), now)
    return admitted, outside


def _queued(previous: Workload, view: KueueView | None, now: float) -> Workload:
    """A JobSet Kueue keeps suspended: queued (failed stays failed); evicted by a preemption
    while it ran, that is one more preemption."""
    if previous.phase.terminal:
        return previous
    message = view.message if view else "queued in Kueue"
    preempted = previous.phase.holds_slices and view is not None and view.evicted_by == "Preempted"
    if previous.phase is WorkloadPhase.QUEUED and previous.status_message == message:
        return previous
    return dataclasses.replace(
        previous, phase=WorkloadPhase.QUEUED, slices=(), replicas=None, stopping=frozenset(), running_since=None,
        exited_ok=frozenset(), preemptions=previous.preemptions + (1 if preempted else 0),
        status_message=message, status_time=now,
    )
