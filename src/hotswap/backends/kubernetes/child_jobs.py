"""A JobSet's child Jobs as the controller sees them, the Jobs an earlier attempt leaves to
retire, and Jobs that exist but create no pods.

Retiring Jobs (one failure, one hotswap): a decision that replaces Jobs (a restart, a
preemption under Kueue, a scale-down) is committed first, in the JobSet's state record
(``retiring``: the UIDs and names of the Jobs it replaces), with the resourceVersion the
decision was taken on; only then are those Jobs deleted, each by name with its UID as a
precondition, in the foreground (the Job stays, with a deletionTimestamp, until its pods are
gone). JobSet recreates a deleted Job under the same name within milliseconds of its going
(never while the name is taken: jobset_controller.go ``shouldCreateJob``) and writes its
status; neither can make the controller redo the decision: a refused record write means
nothing was done (the next round decides again on fresh objects), and a committed one is never
taken again (the record is at the new attempt). A Job that JobSet already recreated is never
deleted (its UID differs). The record keeps a retired Job until the Job of that UID is gone; a
Job being deleted is not deleted again, nor counted as live or stalled. A controller that dies
between the two writes leaves the record; the next round deletes what it lists and still
exists, and forgets the rest. The Jobs the record retires count as gone for everything else
(their pods are old ones).

Stalled Jobs: a current Job of a RUNNING workload that has no pod :data:`STALL_S` after its
creation (kube-controller-manager's Job controller keys its expectations of pod creations by
the Job's name: when a Job is deleted and recreated under the same name while its creations are
in flight, they are never observed, and it creates no pods for the new Job until they expire,
five minutes later; job_controller.go ``addPod``/``resolveControllerRef``,
``SatisfiedExpectations``) is touched: an annotation bump that makes the Job controller sync
it again (enough once they have expired, for a Job no other event wakes). If it still has none
:data:`STALL_S` after the touch, it is deleted (by UID): the Job controller finds the name free
and drops the expectations (``syncJob``: ``DeleteExpectations``), and JobSet recreates it. Each
repair leaves one Event on the JobSet.

Replicas without a Job: a replica index of a RUNNING workload's JobSet with no Job at all
:data:`STALL_S` after the workload started running (JobSet could not create it: a refused
creation is retried with controller-runtime's exponential backoff, up to 1000 s) gets its
JobSet touched, an annotation in its record's patch; any event on a JobSet makes JobSet's
controller reconcile it at once (jobset_controller.go ``SetupWithManager``: ``For(&JobSet{})``
with no predicate), one Event per touch. A replica whose Job is still being deleted waits for
it: its pods' own deadlines (their grace, then a force delete) end that.

Stalled pods: a pod of a RUNNING workload that should be released but is still behind its gate
:data:`STALL_S` after it was created (or the workload started running) and whose release fails
again is deleted (by UID) for its Job to create a new one, with one Event.

Every such deadline is a wake-up time of the controller's loop (:mod:`.deadlines`): neither a
Job's touch nor its deletion reaches the controller's watches (it watches no Jobs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from hotswap.api import worker as contract
from hotswap.api.times import iso_utc, parse_iso_utc
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.deadlines import Deadlines
from hotswap.backends.kubernetes.live_objects import LivePod, metadata
from hotswap.backends.kubernetes.operations import DeleteJob, Operation, RecordEvent, RecreateGatedPod, TouchJob
from hotswap.backends.kubernetes.state_annotation import Retiring, StateRecord

STALL_S = 30.0  # a Job with no pod this long after its creation (or touch) is repaired


@dataclasses.dataclass(frozen=True)
class ReplacedJobs:
    """A decision to replace a JobSet's child Jobs (all, or those of the given replica indexes):
    JobSet recreates them, their pods behind the placement gate. Not an operation of its own:
    planning commits it in the state record (``retiring``, :func:`retiring_after`) and the
    deletes follow (:func:`deletes`)."""

    replicas: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class ChildJob:
    name: str
    uid: str
    jobset: str
    index: int | None  # the replica index (JobSet's job-index label)
    created: float
    touched: float | None  # when the controller last touched it (TOUCHED_ANNOTATION)
    deleting: bool
    suspended: bool
    finished: bool


def read_child_jobs(jobs: Iterable[dict[str, Any]]) -> dict[str, list[ChildJob]]:
    """JobSet name -> its child Jobs, by name."""

    def when(text: Any) -> float | None:
        try:
            return parse_iso_utc(text) if isinstance(text, str) and text else None
        except ValueError:
            return None

    found: dict[str, list[ChildJob]] = {}
    for obj in jobs:
        meta = metadata(obj)
        job_labels = meta.get("labels") or {}
        jobset = job_labels.get(labels.JOBSET_NAME_LABEL)
        if not isinstance(jobset, str) or not meta.get("name") or not meta.get("uid"):
            continue
        if job_labels.get(labels.REPLICATED_JOB_NAME_LABEL) == contract.COORDINATOR_JOB:
            continue  # not a slice's: never retired with a replica (render/coordination.py)
        index = job_labels.get(labels.JOB_INDEX_LABEL)
        touched = (meta.get("annotations") or {}).get(labels.TOUCHED_ANNOTATION)
        status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
        finished = any(
            isinstance(c, dict) and c.get("type") in ("Complete", "Failed", "FailureTarget", "SuccessCriteriaMet") and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        found.setdefault(jobset, []).append(ChildJob(
            name=meta["name"], uid=meta["uid"], jobset=jobset,
            index=int(index) if isinstance(index, str) and index.isdigit() else None,
            created=when(meta.get("creationTimestamp")) or 0.0, touched=when(touched),
            deleting="deletionTimestamp" in meta, suspended=bool((obj.get("spec") or {}).get("suspend")), finished=finished,
        ))
    for items in found.values():
        items.sort(key=lambda j: j.name)
    return found


def retired_uids(records: Iterable[StateRecord | None]) -> frozenset[str]:
    """The Job UIDs the JobSets' records retire (they count as gone)."""
    return frozenset(uid for record in records if record is not None for uid in record.retiring)


def still_retiring(record: StateRecord | None, jobs: Iterable[ChildJob]) -> dict[str, str]:
    """The record's retiring Jobs that still exist."""
    alive = {job.uid for job in jobs}
    return {uid: name for uid, name in (record.retiring if record is not None else {}).items() if uid in alive}


def to_retire(jobs: Iterable[ChildJob], replicas: tuple[int, ...] | None, retired: Iterable[str]) -> dict[str, str]:
    """The Jobs a decision replaces: all of them, or those of the given replica indices; not
    those already being retired or deleted."""
    skip = set(retired)
    return {
        job.uid: job.name for job in jobs
        if job.uid not in skip and not job.deleting and (replicas is None or job.index in replicas)
    }


def stall_deadline(job: ChildJob) -> float:
    return (job.touched if job.touched is not None else job.created) + STALL_S


def stalled(jobs: Iterable[ChildJob], current: frozenset[str], pod_owners: set[str | None], deadlines: Deadlines) -> list[ChildJob]:
    """Current Jobs (not retiring, deleting, suspended or finished) with no pod at all past
    their deadline (one still to come is a wake-up time)."""
    return [
        job for job in jobs
        if job.uid in current and not (job.deleting or job.suspended or job.finished)
        and job.uid not in pod_owners and deadlines.due(stall_deadline(job))
    ]


def touch_stamp(now: float) -> str:
    return iso_utc(now)


def retiring_after(record: StateRecord | None, jobs: list[ChildJob], replaced: Iterable[ReplacedJobs]) -> Retiring:
    """What the record must retire after this round: what it retired and still exists, and the
    Jobs this round's decisions replace."""
    retiring = still_retiring(record, jobs)
    for decision in replaced:
        retiring.update(to_retire(jobs, decision.replicas, retiring))
    return retiring


def deletes(jobset: str, jobs: list[ChildJob], retiring: Retiring) -> list[Operation]:
    """A delete (by UID) for each retiring Job not yet being deleted."""
    deleting = {job.uid for job in jobs if job.deleting}
    return [DeleteJob(jobset, name, uid) for uid, name in sorted(retiring.items(), key=lambda item: item[1]) if uid not in deleting]


def repairs(jobset: str, jobs: list[ChildJob], current: frozenset[str], pod_owners: set[str | None], deadlines: Deadlines) -> list[Operation]:
    """A touch, then a recreation, of each stalled Job, with one Event each. Neither write
    reaches the controller's watches (it watches no Jobs), so each repair's own deadline (the
    touched Job's, the recreated one's) is a wake-up time too."""
    now = deadlines.now
    operations: list[Operation] = []
    for job in stalled(jobs, current, pod_owners, deadlines):
        deadlines.wake(now + STALL_S)
        waited = int(now - job.created)
        if job.touched is None:
            operations.append(TouchJob(jobset, job.name, touch_stamp(now)))
            message = f"job {job.name} has created no pods in {waited} s: touched it so that the Job controller syncs it again"
        else:
            operations.append(DeleteJob(jobset, job.name, job.uid, "stalled"))
            message = f"job {job.name} has created no pods in {waited} s, even after a touch: recreating it"
        operations.append(RecordEvent(jobset, "JobStalled", message, warning=True))
    return operations


def without_jobs(jobs: list[ChildJob], replicas: int, since: float, deadlines: Deadlines) -> list[int]:
    """The replica indexes of a running JobSet that have had no Job at all since ``since`` (the
    workload's start, or the JobSet's last touch) plus :data:`STALL_S`. A replica whose Job is
    still being deleted is not one: it waits for that Job's pods, whose deadlines (grace, then a
    force delete) are wake-ups of their own."""
    present = {job.index for job in jobs}
    missing = [index for index in range(replicas) if index not in present]
    if not missing or not deadlines.due(since + STALL_S):
        return []
    deadlines.wake(deadlines.now + STALL_S)  # the touch reaches no watch of the controller
    return missing


def gated_too_long(jobset: str, pod: LivePod, running_since: float | None, deadlines: Deadlines) -> list[Operation]:
    """The repair of a pod whose release keeps failing (enacted only if this round's release
    of it fails too; a failed release changes nothing the controller watches, so the stall
    time is a wake-up time)."""
    since = max(pod.created, running_since or 0.0)
    if not pod.uid or not pod.created or not deadlines.due(since + STALL_S):
        return []
    message = f"pod {pod.name} has been waiting for its release for {int(deadlines.now - since)} s: recreating it"
    return [RecreateGatedPod(jobset, pod.name, pod.uid, message)]
