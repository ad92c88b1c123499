"""What the controller does to the cluster, as data: the operations :func:`~.planning.plan`
emits and :class:`~hotswap.backends.kubernetes.controller.loop.KubeController` applies, in the order they
must happen, and the log line each leaves. Each one is a write to the API server; what is only
decided (the Jobs a decision replaces: :class:`~.child_jobs.ReplacedJobs`) is planned into them.
Each names the JobSet it is done for (``jobset``): once that JobSet's record is refused, none of
its other operations is applied in that round."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable
from typing import Protocol, TypeVar

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
class DeleteJob:
    """Delete one child Job by name, only if it is still the one of this UID (a precondition: a
    Job JobSet recreated under the same name is never deleted), in the foreground (the client's
    :meth:`delete_job`); one a decision retires, or one that created no pods (:mod:`.child_jobs`)."""

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

    jobset: str
    pod: str
    force: bool
    why: str
    uid: str = ""  # a precondition: never another pod that took the name


@dataclasses.dataclass(frozen=True)
class PlacePod:
    """Release a gated pod: pin it to a slice (nodeSelector entries added; none under Kueue),
    annotate it (slice, attempt, restart count, membership), lift the gate."""

    jobset: str
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
    jobset: str
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
    PatchJobSet | DeleteJob | TouchJob | DeletePod | PlacePod | RecreateGatedPod | AnnotatePod | DeactivateKueueWorkload
    | RecordEvent
)
OPERATION_TYPES: tuple[type, ...] = typing.get_args(Operation)

_T_co = TypeVar("_T_co", covariant=True)


class OperationHandler(Protocol[_T_co]):
    """What is done with each kind of operation: the controller applies them
    (:class:`~hotswap.backends.kubernetes.controller.enactment.Enactment`), the log tells them
    (:func:`decisions_summary`). As with actions (:func:`hotswap.core.actions.dispatch`), every
    use goes through :func:`dispatch`, so a new operation is a missing method everywhere at
    once, not a branch forgotten in one ``isinstance`` chain."""

    def on_patch_jobset(self, op: PatchJobSet) -> _T_co: ...
    def on_delete_job(self, op: DeleteJob) -> _T_co: ...
    def on_touch_job(self, op: TouchJob) -> _T_co: ...
    def on_delete_pod(self, op: DeletePod) -> _T_co: ...
    def on_place_pod(self, op: PlacePod) -> _T_co: ...
    def on_recreate_gated_pod(self, op: RecreateGatedPod) -> _T_co: ...
    def on_annotate_pod(self, op: AnnotatePod) -> _T_co: ...
    def on_deactivate_kueue_workload(self, op: DeactivateKueueWorkload) -> _T_co: ...
    def on_record_event(self, op: RecordEvent) -> _T_co: ...


HANDLER_METHODS: dict[type, str] = {
    PatchJobSet: "on_patch_jobset",
    DeleteJob: "on_delete_job",
    TouchJob: "on_touch_job",
    DeletePod: "on_delete_pod",
    PlacePod: "on_place_pod",
    RecreateGatedPod: "on_recreate_gated_pod",
    AnnotatePod: "on_annotate_pod",
    DeactivateKueueWorkload: "on_deactivate_kueue_workload",
    RecordEvent: "on_record_event",
}


def dispatch(op: Operation, handler: OperationHandler[_T_co]) -> _T_co:
    """Call the handler's method for ``op``'s type."""
    return getattr(handler, HANDLER_METHODS[type(op)])(op)


# The record first: the JobSet's patch (guarded by the resourceVersion the decision was taken
# on) commits the decision, with the Jobs it retires; the side effects follow, and only if it
# was accepted (:meth:`KubeController.enact`). JobSet recreating a deleted Job and writing its
# status between two of these writes cannot make the controller take the decision again, and a
# controller that dies after the record finds it and completes the deletes it lists
# (:mod:`.child_jobs`). The Events right after the record: one per committed decision, even
# if the controller dies before the side effects.
_ORDER = {
    PatchJobSet: 0, RecordEvent: 1, DeleteJob: 2, TouchJob: 3, DeletePod: 4, DeactivateKueueWorkload: 5,
    PlacePod: 6, RecreateGatedPod: 7, AnnotatePod: 8,
}


def in_order(operations: Iterable[Operation]) -> list[Operation]:
    """The operations in the order they must be applied (stable within a kind)."""
    return sorted(operations, key=lambda op: _ORDER[type(op)])


def decisions_summary(operations: Iterable[Operation]) -> list[str]:
    """One line per operation, for the controller's log. Annotation writes only record what the
    other operations do, and are not logged."""
    return [line for line in (dispatch(op, _SUMMARY) for op in operations) if line is not None]


class _Summary:
    """The log line of each operation (None: not logged)."""

    def on_patch_jobset(self, op: PatchJobSet) -> str | None:
        return None if op.suspend is None else f"{'suspend' if op.suspend else 'resume'} jobset/{op.jobset}"

    def on_delete_job(self, op: DeleteJob) -> str | None:
        return f"recreate job/{op.name} of jobset/{op.jobset} ({op.why})"

    def on_touch_job(self, op: TouchJob) -> str | None:
        return f"touch job/{op.name} of jobset/{op.jobset} (it has created no pods)"

    def on_delete_pod(self, op: DeletePod) -> str | None:
        return f"{'force-delete' if op.force else 'delete'} pod/{op.pod} ({op.why})"

    def on_place_pod(self, op: PlacePod) -> str | None:
        where = op.annotations.get(labels.SLICE_ANNOTATION)
        return f"release pod/{op.pod}" + (f" on {where}" if where else "")

    def on_recreate_gated_pod(self, op: RecreateGatedPod) -> str | None:
        return None  # enacted only if its release fails again: its Event says so

    def on_annotate_pod(self, op: AnnotatePod) -> str | None:
        return None

    def on_deactivate_kueue_workload(self, op: DeactivateKueueWorkload) -> str | None:
        return f"deactivate Kueue workload {op.workload} of jobset/{op.jobset}"

    def on_record_event(self, op: RecordEvent) -> str | None:
        return f"{op.reason} jobset/{op.jobset}: {op.message}"


_SUMMARY = _Summary()
