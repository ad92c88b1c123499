"""From the core's decision to operations on the live objects (pure; :mod:`.operations`).

How actions become operations: admission and resumption unsuspend the JobSet; preemption,
requeueing and failure suspend it (JobSet stops its pods gracefully, the JobSet stays); a
restart deletes its child Jobs so that JobSet recreates them at once, and deletes the pods left
on failed machines (their grace period first; forced once the node is deleted or the grace is
over). New pods carry a scheduling gate; the controller releases each
one (pinned to the slice the core chose for its replica, with the annotations its worker's
environment reads), and only while the workload is RUNNING, which is how BlockingRecreate's
"old workers gone first" holds. A pod that replaces a failed worker of the running attempt
stays behind its gate: the exit is judged first (:mod:`.pod_signals`).

Some operations are edge-triggered, one per action and read off its effect (:func:`enacted`:
its Event; :func:`replaced_jobs`: the Jobs it recreates, committed in the state record and then
deleted); the others are level-triggered, written whenever the live objects differ from the
decision (suspension, the state annotation with the core's replica map, pod release and
membership), so a reconcile that was cut short is completed by the next one, and
one with nothing to change writes nothing. Each action's effect is computed once, by the caller.

With Kueue, only Kueue suspends and unsuspends: what the core preempts or requeues is
restarted in place (its pods wait behind the gate), and a failed workload is stopped by
deactivating its Kueue Workload (:mod:`.kueue_mode`).
"""

from __future__ import annotations

from collections.abc import Sequence

from hotswap.api import worker as contract
from hotswap.api.runs import START_CAUSES
from hotswap.api.catalog import get_device_type
from hotswap.api.cluster import NodeState
from hotswap.api.phases import WorkloadPhase
from hotswap.api.times import iso_utc
from hotswap.api.membership import Membership
from hotswap.backends.kubernetes import child_jobs, labels
from hotswap.backends.kubernetes.child_jobs import ReplacedJobs
from hotswap.backends.kubernetes.live_objects import LiveJobSet
from hotswap.backends.kubernetes.observation import Observation
from hotswap.backends.kubernetes.pod_signals import ServiceLosses
from hotswap.backends.kubernetes.operations import (
    AnnotatePod,
    DeactivateKueueWorkload,
    DeletePod,
    Operation,
    PatchJobSet,
    PlacePod,
    RecordEvent,
    in_order,
)
from hotswap.backends.kubernetes.state_annotation import Released, Retiring, StateRecord, replica_slots, state_of
from hotswap.core.effects import ActionEffect, Placement
from hotswap.core.workload import Workload
from hotswap.core.scheduler import Decision


def plan(observation: Observation, decision: Decision, effects: Sequence[ActionEffect]) -> list[Operation]:
    """The operations that enact a decision (``effects``: its actions' effects, in order) and
    bring the live objects in line with it."""
    operations: list[Operation] = []
    by_workload: dict[str, list[ActionEffect]] = {}
    for effect in effects:
        by_workload.setdefault(effect.action.workload, []).append(effect)
    for name, job in observation.jobsets.items():
        if job.spec is None:
            continue
        mine = by_workload.get(name, [])
        decided = [op for effect in mine for op in enacted(name, effect)]
        replaced = [r for effect in mine if (r := replaced_jobs(effect, observation.managed_admission)) is not None]
        operations.extend(decided)
        if mine:
            operations.extend(RecordEvent(name, "SliceLost", cause, warning=True) for cause in observation.causes.get(name, []))
        workload = _record(observation, decision, name)
        jobs = observation.child_jobs.get(name, [])
        annotations: dict[str, str | None] = {
            labels.REJECTED_ANNOTATION: e.rejection for e in mine if e.rejection is not None
        }
        if workload is not None and not decided and not replaced:
            operations.extend(_replicas_without_jobs(observation, job, workload, jobs, annotations))
        lost = observation.service_losses.get(name, ServiceLosses())
        if lost.times and iso_utc(lost.times[-1]) != job.annotations.get(labels.SERVICE_LOST_ANNOTATION):
            annotations[labels.SERVICE_LOST_ANNOTATION] = iso_utc(lost.times[-1])  # before its pod may go
            annotations[labels.SERVICE_LOSSES_IN_A_ROW_ANNOTATION] = str(lost.in_a_row)
        retiring = child_jobs.retiring_after(job.record, jobs, replaced) if workload is not None else {}
        patch = _jobset_patch(observation, job, workload, mine, annotations, retiring)
        if patch is not None:
            operations.append(patch)
        operations.extend(child_jobs.deletes(name, jobs, retiring))  # after the record (operations.in_order)
        if workload is None:
            continue
        operations.extend(_stuck_pods(observation, name, workload))
        if job.terminal is not None:
            continue
        view = observation.kueue.get(name)
        # Kueue keeps a failed JobSet, and a scaled-down elastic one the core found done (its
        # parked replicas never run, so JobSet never completes it), admitted: deactivate it.
        ended = workload.phase is WorkloadPhase.FAILED or (workload.phase is WorkloadPhase.SUCCESSFUL and job.spec.elastic)
        if not observation.managed_admission and ended and not job.suspended and view and view.active:
            operations.append(DeactivateKueueWorkload(name, view.name))
        if workload.phase is WorkloadPhase.RUNNING:
            if not decided and not replaced:
                owners = {p.owner_uid for p in observation.pods_of(name)}
                operations.extend(child_jobs.repairs(name, jobs, observation.job_uids, owners, observation.deadlines))
            operations.extend(_release(observation, job, workload, mine))
    return in_order(operations)


def _replicas_without_jobs(
    observation: Observation, job: LiveJobSet, workload: Workload, jobs: list[child_jobs.ChildJob], annotations: dict[str, str | None],
) -> list[Operation]:
    """A RUNNING workload's replica that has no Job (:func:`~.child_jobs.without_jobs`) is a
    stall like a Job without pods: the JobSet is touched (an annotation in its patch), which
    makes JobSet's controller reconcile it at once (it watches its JobSets with no predicate,
    and an event skips the backoff of an earlier failure to create a Job), with one Event."""
    if workload.phase is not WorkloadPhase.RUNNING or job.suspended or job.terminal is not None:
        return []
    since = max(workload.running_since or 0.0, job.touched or 0.0)
    missing = child_jobs.without_jobs(jobs, len(replica_slots(workload)), since, observation.deadlines)
    if not missing:
        return []
    annotations[labels.TOUCHED_ANNOTATION] = child_jobs.touch_stamp(observation.now)
    which = ", ".join(str(index) for index in missing)
    message = (
        f"replica {which} of the running workload: no Job for {int(observation.now - since)} s; "
        "touched the JobSet so that JobSet's controller syncs it again"
    )
    return [RecordEvent(job.name, "JobStalled", message, warning=True)]


def _record(observation: Observation, decision: Decision, name: str) -> Workload | None:
    """What the state annotation must say about a workload after this round."""
    return decision.snapshot.workloads.get(name) or observation.outside.get(name)


def _jobset_patch(
    observation: Observation, job: LiveJobSet, workload: Workload | None, effects: list[ActionEffect],
    annotations: dict[str, str | None], retiring: Retiring,
) -> PatchJobSet | None:
    """The state record (the core's decided workload, its replica map included, with the Jobs
    it retires) and (without Kueue) the suspension, level-triggered, in one patch."""
    assert job.spec is not None
    annotations = dict(annotations)
    suspend = None
    if workload is not None:
        record = state_of(
            workload, job.record, observation.now, _released(observation, job, workload, effects),
            start_cause(effects, job.record), retiring, observation.loss_since.get(job.name),
        )
        if not record.written_as(job.record):
            annotations[labels.STATE_ANNOTATION] = record.encode()
        want_suspended = not workload.phase.holds_slices
        if observation.managed_admission and job.terminal is None and want_suspended != job.suspended:
            suspend = want_suspended
    if not annotations and suspend is None:
        return None
    return PatchJobSet(job.name, suspend, annotations, job.resource_version)


def _released(observation: Observation, job: LiveJobSet, workload: Workload, effects: list[ActionEffect]) -> Released:
    """The workers of the running attempt whose pods were released, by current Job: the
    record's, and those seen released (the round after the release, so that the record never
    claims one that did not happen)."""
    if workload.phase is not WorkloadPhase.RUNNING or any(e.replaced for e in effects):
        return {}
    recreated = _recreated(effects)
    pods = observation.pods_of(job.name)
    dropped = {p.owner_uid for p in pods if p.replica in recreated}
    recorded = job.record.released if job.record is not None else {}
    released = {uid: set(hosts) for uid, hosts in recorded.items() if uid in observation.job_uids and uid not in dropped}
    for pod in pods:
        if pod.attempt == workload.attempt and pod.owner_uid in observation.job_uids and pod.owner_uid not in dropped and pod.host is not None:
            released.setdefault(pod.owner_uid, set()).add(pod.host)
    return {uid: frozenset(hosts) for uid, hosts in released.items()}


def _recreated(effects: Sequence[ActionEffect]) -> set[int]:
    """The replica indexes whose Jobs are recreated: those a scale-down parked."""
    return {index for e in effects for index in e.parked}


STRANDED_SERVICE_AFTER_S = 10.0  # past a terminating coordinator pod's grace period


def _stuck_pods(observation: Observation, name: str, workload: Workload) -> list[Operation]:
    """Pods left on machines that failed, by a workload that no longer holds that slice: deleted
    with their grace period first, so that a worker whose kubelet still answers gets SIGTERM and
    saves; force-deleted only once the Node object is deleted, or the grace is over and the pod
    is still there (a kubelet that does not answer never confirms)."""
    held = set(workload.slices) if workload.phase.holds_slices else set()
    discovery = observation.discovery
    operations: list[Operation] = []
    for pod in observation.pods_of(name):
        if pod.node is None or pod.finished:
            continue
        node = discovery.nodes.get(pod.node)
        delete: DeletePod | None = None
        if node is None:
            # No Node object: deleted (a new node, not listed yet, only ever gets pods of held slices).
            if pod.node not in discovery.ignored and (pod.terminating or pod.annotations.get(labels.SLICE_ANNOTATION) not in held):
                delete = DeletePod(name, pod.name, True, f"its node {pod.node} was deleted", pod.uid)
        elif node.state is not NodeState.FAILED or node.slice in held:
            continue
        elif not pod.terminating:
            delete = DeletePod(name, pod.name, False, f"its node {pod.node} failed ({node.reason or 'not ready'}): it gets its grace period first", pod.uid)
        elif pod.deletion_deadline is not None and observation.due(pod.deletion_deadline):
            delete = DeletePod(name, pod.name, True, f"its node {pod.node} failed and its grace period is over", pod.uid)
        if delete is not None:
            what = "force-deleted" if delete.force else "deleted"
            operations += [delete, RecordEvent(name, "PodForceDeleted" if delete.force else "PodDeleted", f"pod {pod.name} {what}: {delete.why}", warning=delete.force)]
    for coordinator in observation.coordinators.get(name, []):
        # The JAX coordination service's pod, evicted from a dead node (render/coordination.py
        # tolerates an unreachable node briefly): its Job replaces it only once it is gone, and
        # that kubelet never confirms. Its grace period over, it is force-deleted.
        deadline = coordinator.deletion_deadline
        if deadline is not None and observation.due(deadline + STRANDED_SERVICE_AFTER_S):
            why = "the JAX coordination service's pod did not end within its grace period (its node does not answer)"
            operations += [
                DeletePod(name, coordinator.name, True, why, coordinator.uid),
                RecordEvent(name, "PodForceDeleted", f"pod {coordinator.name} force-deleted: {why}", warning=True),
            ]
    return operations


def _release(observation: Observation, job: LiveJobSet, workload: Workload, effects: list[ActionEffect]) -> list[Operation]:
    """Release the gated pods of a RUNNING workload's current Jobs, each onto the slice the
    core's replica map gives its replica index, and keep the elastic membership of its running
    pods current."""
    assert job.spec is not None
    name = job.name
    hosts = get_device_type(job.spec.device_type).hosts_per_slice
    membership = elastic_membership(name, workload, hosts).to_json() if job.spec.elastic else None
    if any(e.replaced for e in effects):
        return []  # its Jobs are being replaced
    replicas = replica_slots(workload)
    recreated = _recreated(effects)
    failed = {
        (p.owner_uid, p.replica, p.host) for p in observation.pods_of(name)
        if p.finished and p.attempt == workload.attempt and p.exit_code != 0
    }
    restart_count = str(workload.attempt - 1 + job.restarts_total)
    cause = start_cause(effects, job.record)
    operations: list[Operation] = []
    for pod in observation.pods_of(name):
        if pod.terminating or pod.finished or pod.replica is None or pod.replica >= len(replicas):
            continue
        if pod.owner_uid is None or pod.owner_uid not in observation.job_uids or pod.replica in recreated:
            continue  # about to be replaced
        slice_name = replicas[pod.replica]
        if pod.gated:
            if slice_name is None:
                continue  # a parked replica (elastic, scaled down)
            if (pod.owner_uid, pod.replica, pod.host) in failed:
                continue  # replaces a failed worker of this attempt: its exit is judged first
            annotations = {
                labels.ATTEMPT_ANNOTATION: str(workload.attempt),
                labels.RESTART_COUNT_ANNOTATION: restart_count,
                labels.SLICE_ANNOTATION: slice_name,
                labels.RELEASED_AT_ANNOTATION: iso_utc(observation.now),
            }
            if cause:
                annotations[labels.START_CAUSE_ANNOTATION] = cause
            found = observation.discovery.slice(slice_name)
            selector = {k: v for k, v in (found.pin if found else {}).items() if k not in pod.node_selector}
            if membership is not None:
                annotations[labels.MEMBERSHIP_ANNOTATION] = membership
            gates = tuple(g for g in pod.gates if g != labels.PLACEMENT_GATE)
            operations.append(PlacePod(name, pod.name, selector, annotations, gates))
            operations.extend(child_jobs.gated_too_long(name, pod, workload.running_since, observation.deadlines))
        elif membership is not None and pod.annotations.get(labels.MEMBERSHIP_ANNOTATION) != membership:
            operations.append(AnnotatePod(name, pod.name, {labels.MEMBERSHIP_ANNOTATION: membership}))
    for coordinator in observation.coordinators.get(name, []):  # it serves each generation the workers get
        if membership is not None and coordinator.live and coordinator.membership != membership:
            operations.append(AnnotatePod(name, coordinator.name, {labels.MEMBERSHIP_ANNOTATION: membership}))
    return operations


def start_cause(effects: Sequence[ActionEffect], record: StateRecord | None) -> str | None:
    """Why the workload's current attempt started (START_CAUSES): this round's actions' effects,
    else what the state record remembers."""
    cause = record.start_cause if record is not None else None
    for effect in effects:
        cause = effect.cause or cause
    return cause if cause in START_CAUSES else None


def elastic_membership(name: str, workload: Workload, hosts: int) -> Membership:
    """The elastic membership record of a workload's active replicas (its replica map); the
    lowest active replica's first host coordinates."""
    replicas = workload.replica_map
    active = [index for index, slice_name in enumerate(replicas) if slice_name is not None]
    first = active[0] if active else 0
    return Membership(
        generation=workload.membership,
        slices=tuple(s for s in replicas if s is not None),
        hosts_per_slice=hosts,
        master_addr=contract.coordinator_host(name, first),
        # A new generation rendezvous on its own port, so it never meets the previous group.
        master_port=contract.DEFAULT_MASTER_PORT + 1 + workload.membership,
    )


def enacted(name: str, effect: ActionEffect) -> list[Operation]:
    """The edge-triggered operations of one action of JobSet ``name``, read off its effect: its
    Event (the reason and message are the effect's, as in a local timeline)."""
    if effect.event is None:
        return []
    return [RecordEvent(name, effect.event, effect.message, warning=effect.warning)]


def replaced_jobs(effect: ActionEffect, suspends: bool) -> ReplacedJobs | None:
    """The Jobs one action replaces, read off its effect: a restart's all, a scale-down's the
    parked replicas'. ``suspends``: hotswap admits (no Kueue), so a workload stopped whole
    keeps its JobSet suspended (level-triggered); under Kueue, which keeps an admitted JobSet
    running, its Jobs are recreated instead and the new pods wait behind the gate until the
    core places it again."""
    if effect.placement is Placement.SHRINK:
        return ReplacedJobs(tuple(sorted(effect.parked)))  # only the parked replicas' Jobs
    if (effect.replaced and effect.placement is Placement.PLACE) or (effect.requeued and not suspends):
        return ReplacedJobs()
    return None
