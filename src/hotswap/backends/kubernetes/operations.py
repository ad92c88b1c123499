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
    """Release a gated pod: pin it to a slice (nodeSelector entries added; none under Kueue),
    annotate it (slice, attempt, restart count, membership), lift the gate."""

    pod: str
    node_selector: dict[str, str]
    annotations: dict[str, str]
    gates: tuple[str, ...]  # the scheduling gates that remain


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


Operation = PatchJobSet | RecreateJobs | ForceDeletePod | PlacePod | AnnotatePod | DeactivateKueueWorkload | RecordEvent

# Side effects before the record of them: a controller that dies in between finds the old
# record and repeats the decision, rather than a record of a move that never happened.
_ORDER = {RecreateJobs: 0, ForceDeletePod: 1, DeactivateKueueWorkload: 2, PatchJobSet: 3, RecordEvent: 4, PlacePod: 5, AnnotatePod: 6}


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
        elif isinstance(op, ForceDeletePod):
            lines.append(f"force-delete pod/{op.pod} (its node is gone)")
        elif isinstance(op, PlacePod):
            where = op.annotations.get(labels.SLICE_ANNOTATION)
            lines.append(f"release pod/{op.pod}" + (f" on {where}" if where else ""))
        elif isinstance(op, DeactivateKueueWorkload):
            lines.append(f"deactivate Kueue workload {op.workload} of jobset/{op.jobset}")
        elif isinstance(op, RecordEvent):
            lines.append(f"{op.reason} jobset/{op.jobset}: {op.message}")
    return lines
