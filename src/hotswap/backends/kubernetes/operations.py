"""What the controller does to the cluster, as data: the operations :func:`~.planning.plan`
emits and :class:`~hotswap.backends.kubernetes.controller.loop.KubeController` applies, in the order they
must happen, and the log line each leaves."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from hotswap.backends.kubernetes import labels


@dataclasses.dataclass(frozen=True)
class PatchJobSet:
    """One merge patch of a JobSet: its suspension and annotations (a None value removes the
    key), guarded by the resourceVersion the controller read, so a decision taken on a stale
    read is refused (409) and taken again on fresh objects. Suspension and the state record of
    why travel together."""

    jobset: str
    suspend: bool | None = None  # None: leave as is
    annotations: dict[str, str | None] = dataclasses.field(default_factory=dict)
    resource_version: str | None = None


@dataclasses.dataclass(frozen=True)
class RecreateJobs:
    """The decision to replace child Jobs (all, or the given replica indices): JobSet recreates
    them with fresh pods, which wait behind the placement gate. Committed in the state record's
    ``retiring`` (the Jobs' UIDs) by the JobSet's patch, carried out by :class:`DeleteJob`
    (:mod:`.child_jobs`); nothing to write of its own."""

    jobset: str
    replicas: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class DeleteJob:
    """Delete one child Job by name, only if it is still the one of this UID (a precondition: a
    Job JobSet recreated under the same name is never deleted), in the background."""

    jobset: str
    name: str
    uid: str
    why: str = "retired"  # for the log: "retired" (replaced by a decision), "stalled" (no pods)


@dataclasses.dataclass(frozen=True)
class TouchJob:
    """Bump an annotation of a Job that has created no pods, so that the Job controller syncs it
    again (:mod:`.child_jobs`)."""

    jobset: str
    name: str
    stamp: str


@dataclasses.dataclass(frozen=True)
class DeletePod:
    """Delete a pod left on a machine that failed. First a normal delete: the kubelet, if it
    still answers, gives the worker SIGTERM and its terminationGracePeriodSeconds to save a
    checkpoint. Forced (grace 0) only once the node is known gone (its Node object deleted) or
    that grace is over and the pod is still there: a kubelet that does not answer never confirms
    the deletion, and the pod would hold its Job's place forever. ``why`` says which."""

    pod: str
    force: bool
    why: str
    uid: str = ""  # a precondition: never another pod that took the name


@dataclasses.dataclass(frozen=True)
class PlacePod:
    """Release a gated pod: pin it to a slice (nodeSelector entries added; none under Kueue),
    annotate it (slice, attempt, restart count, membership), lift the gate."""

    pod: str
    node_selector: dict[str, str]
    annotations: dict[str, str]
    gates: tuple[str, ...]  # the scheduling gates that remain


@dataclasses.dataclass(frozen=True)
class RecreateGatedPod:
    """A pod of a RUNNING workload left behind its gate for :data:`~.child_jobs.STALL_S`: if
    its release (the :class:`PlacePod` before it) fails again, delete it (by UID; it is
    unscheduled, so it goes at once) for its Job to create a new one, and record why."""

    jobset: str
    pod: str
    uid: str
    message: str


@dataclasses.dataclass(frozen=True)
class AnnotatePod:
    pod: str
    annotations: dict[str, str]


@dataclasses.dataclass(frozen=True)
class DeactivateKueueWorkload:
    """Stop a Kueue-admitted workload for good (``spec.active: false``): Kueue evicts it and
    suspends its JobSet, and does not requeue it."""

    jobset: str
    workload: str


@dataclasses.dataclass(frozen=True)
class RecordEvent:
    """A Kubernetes Event on the JobSet (what `kubectl describe jobset` shows)."""

    jobset: str
    reason: str
    message: str
    warning: bool = False


Operation = (
    PatchJobSet | RecreateJobs | DeleteJob | TouchJob | DeletePod | PlacePod | RecreateGatedPod | AnnotatePod
    | DeactivateKueueWorkload | RecordEvent
)

# The record first: the JobSet's patch (guarded by the resourceVersion the decision was taken
# on) commits the decision, with the Jobs it retires; the side effects follow, and only if it
# was accepted (:meth:`KubeController.enact`). JobSet recreating a deleted Job and writing its
# status between two of these writes cannot make the controller take the decision again, and a
# controller that dies after the record finds it and completes the deletes it lists
# (:mod:`.child_jobs`). The Events right after the record: one per committed decision, even
# if the controller dies before the side effects.
_ORDER = {
    PatchJobSet: 0, RecordEvent: 1, RecreateJobs: 2, DeleteJob: 3, TouchJob: 4, DeletePod: 5, DeactivateKueueWorkload: 6,
    PlacePod: 7, RecreateGatedPod: 8, AnnotatePod: 9,
}


def in_order(operations: Iterable[Operation]) -> list[Operation]:
    """The operations in the order they must be applied (stable within a kind)."""
    return sorted(operations, key=lambda op: _ORDER[type(op)])


def decisions_summary(operations: Iterable[Operation]) -> list[str]:
    """One line per operation, for the controller's log. Annotation writes only record what the
    other operations do, and are not logged."""
    lines = []
    for op in operations:
        if isinstance(op, PatchJobSet) and op.suspend is not None:
            lines.append(f"{'suspend' if op.suspend else 'resume'} jobset/{op.jobset}")
        elif isinstance(op, RecreateJobs):
            which = "all jobs" if op.replicas is None else f"jobs of replicas {list(op.replicas)}"
            lines.append(f"recreate {which} of jobset/{op.jobset}")
        elif isinstance(op, DeleteJob) and op.why != "retired":
            lines.append(f"recreate job/{op.name} of jobset/{op.jobset} ({op.why})")
        elif isinstance(op, TouchJob):
            lines.append(f"touch job/{op.name} of jobset/{op.jobset} (it has created no pods)")
        elif isinstance(op, DeletePod):
            lines.append(f"{'force-delete' if op.force else 'delete'} pod/{op.pod} ({op.why})")
        elif isinstance(op, PlacePod):
            where = op.annotations.get(labels.SLICE_ANNOTATION)
            lines.append(f"release pod/{op.pod}" + (f" on {where}" if where else ""))
        elif isinstance(op, DeactivateKueueWorkload):
            lines.append(f"deactivate Kueue workload {op.workload} of jobset/{op.jobset}")
        elif isinstance(op, RecordEvent):
            lines.append(f"{op.reason} jobset/{op.jobset}: {op.message}")
    return lines
