"""The first step of a round: apply what happened (nodes, slices, workloads, workers)."""

from __future__ import annotations

from hotswap.api.cluster import NodeState
from hotswap.api.phases import WorkloadPhase
from hotswap.core import actions as act
from hotswap.core import events as ev
from hotswap.core.model import Workload
from hotswap.core.policy import ExitVerdict, FailurePolicy
from hotswap.core.round_state import RUNNING, RoundState

_CLUSTER_EVENTS = (
    ev.NodeFailed,
    ev.NodeCordoned,
    ev.NodeDrained,
    ev.NodeRepaired,
    ev.SliceAdded,
    ev.SliceRemoved,
)


def apply_events(state: RoundState, events: list[ev.Event]) -> None:
    """Apply cluster events, then workload events, each in the order given.

    Cluster events go first so that a worker exit reported with the failure that caused it is
    seen as a consequence of the loss, which is never charged to max_restarts.
    """
    for event in events:
        if isinstance(event, _CLUSTER_EVENTS):
            _apply_cluster_event(state, event)
    for event in events:
        if not isinstance(event, _CLUSTER_EVENTS):
            _apply_workload_event(state, event)


def _apply_cluster_event(state: RoundState, event: ev.ClusterEvent) -> None:
    match event:
        case ev.NodeFailed(node=node, reason=reason):
            _set_node(state, node, NodeState.FAILED, f"node {node} failed" + (f": {reason}" if reason else ""))
        case ev.NodeCordoned(node=node):
            _set_node(state, node, NodeState.CORDONED, f"node {node} was cordoned")
        case ev.NodeDrained(node=node):
            _set_node(state, node, NodeState.CORDONED, f"node {node} was drained")
        case ev.NodeRepaired(node=node):
            _set_node(state, node, NodeState.READY, "")
        case ev.SliceAdded(name=name, device_type=device_type, nodes=nodes):
            state.capacity.add_slice(name, device_type, nodes)
            state.needs_scheduling = True
        case ev.SliceRemoved(name=name):
            if state.capacity.remove_slice(name):
                state.mark_lost(name, f"slice {name} was removed from the cluster")
                state.needs_scheduling = True


def _set_node(state: RoundState, name: str, node_state: NodeState, reason: str) -> None:
    changed = state.capacity.set_node_state(name, node_state)
    if changed is None:
        return  # unknown (stale) node, or nothing changes
    before, after = changed
    state.needs_scheduling = True
    if before.healthy and not after.healthy:
        state.mark_lost(after.name, reason)
    elif not before.healthy and after.healthy and after.name not in state.capacity.removed:
        state.capacity.mark_healthy(after.name)


def _apply_workload_event(state: RoundState, event: ev.WorkloadEvent) -> None:
    match event:
        case ev.WorkloadCreated():
            _create(state, event)
        case ev.WorkloadDeleted():
            _delete(state, event.workload)
        case ev.WorkerExited():
            _worker_exited(state, event)
        case ev.WorkloadHung():
            _hung(state, event)
        case ev.WorkersStopped():
            workload = state.workloads.get(event.workload)
            if workload is not None and event.attempt in workload.stopping:
                state.update(workload, stopping=workload.stopping - {event.attempt})
                state.needs_scheduling = True
        case ev.CheckpointRecorded():
            workload = state.workloads.get(event.workload)
            if workload is not None and (
                workload.last_checkpoint_at is None or event.at >= workload.last_checkpoint_at
            ):
                state.update(workload, last_checkpoint_at=event.at, last_checkpoint_step=event.step)


def _create(state: RoundState, event: ev.WorkloadCreated) -> None:
    spec = event.spec
    if spec.name in state.workloads:
        state.actions.append(act.Reject(spec.name, f"a workload named {spec.name} already exists"))
        return
    have = len(state.capacity.slices_by_type.get(spec.device_type, ()))
    if have < spec.num_slices:
        where = f"only {have}" if have else "none"
        state.actions.append(
            act.Reject(
                spec.name,
                f"it needs {spec.num_slices} slice(s) of {spec.device_type} and the cluster has"
                f" {where}; it could never run",
            )
        )
        return
    state.workloads[spec.name] = Workload(
        spec=spec,
        seq=state.next_seq,
        created_at=state.now,
        status_message=f"queued: waiting for {spec.num_slices} slice(s) of {spec.device_type}",
        status_time=state.now,
    )
    state.next_seq += 1
    state.needs_scheduling = True


def _delete(state: RoundState, name: str) -> None:
    workload = state.workloads.get(name)
    if workload is None:
        return
    state.release(workload, workload.slices)
    state.capacity.set_holding(workload, False)
    del state.workloads[name]
    state.lost.pop(name, None)
    state.replacing.pop(name, None)
    state.actions.append(act.Remove(name))
    state.needs_scheduling = True


def _worker_exited(state: RoundState, event: ev.WorkerExited) -> None:
    workload = state.workloads.get(event.workload)
    if (
        workload is None
        or workload.phase is not RUNNING
        or workload.attempt != event.attempt
        or event.slice not in workload.slices
        or not state.capacity.healthy(event.slice)
        or event.workload in state.lost
    ):
        # A stale attempt, a slice it no longer holds, or a workload that lost capacity in
        # this round: the exit is a consequence of something the core already handles (the
        # loss restarts or rescales it), and it is never charged to max_restarts.
        return
    verdict, why = FailurePolicy.of(workload.spec).judge(event.code, workload.restarts)
    where = f"worker {event.slice}/{event.host}"
    if verdict is ExitVerdict.SUCCEEDED:
        _worker_succeeded(state, workload, (event.slice, event.host))
    elif verdict is ExitVerdict.RESTART:
        state.restart_in_place(workload, f"{where} {why}", charged=True)
    else:
        _fail(state, workload, f"{where} {why}")


def _hung(state: RoundState, event: ev.WorkloadHung) -> None:
    """A hang is judged like a crash with a restart code: restart in place, charged."""
    workload = state.workloads.get(event.workload)
    if workload is None or workload.phase is not RUNNING or workload.attempt != event.attempt or event.workload in state.lost:
        return  # a stale attempt, or one already being replaced
    verdict, why = FailurePolicy.of(workload.spec).judge_hang(workload.restarts)
    if verdict is ExitVerdict.RESTART:
        state.restart_in_place(workload, f"hung: {event.reason}; {why}", charged=True)
    else:
        _fail(state, workload, f"hung: {event.reason}; {why}")


def _fail(state: RoundState, workload: Workload, reason: str) -> None:
    state.release(workload, workload.slices)
    state.update(
        workload,
        phase=WorkloadPhase.FAILED,
        slices=(),
        stopping=state.stopping_after_stop(workload),
        status_message=f"failed: {reason}",
    )
    state.actions.append(act.Fail(workload.name, reason))
    state.needs_scheduling = True


def _worker_succeeded(state: RoundState, workload: Workload, worker: tuple[str, int]) -> None:
    """One worker is done; the workload is complete when every worker of its slices is."""
    done = workload.exited_ok | {worker}
    held = set(workload.slices)
    expected = sum(len(state.capacity.slices[s].nodes) for s in workload.slices)
    if sum(1 for s, _ in done if s in held) < expected:
        state.update(workload, exited_ok=done)
        return
    state.release(workload, workload.slices)
    state.update(
        workload,
        phase=WorkloadPhase.SUCCESSFUL,
        slices=(),
        exited_ok=done,
        status_message=f"finished: all {expected} workers exited 0",
    )
    state.actions.append(act.Complete(workload.name))
    state.needs_scheduling = True
