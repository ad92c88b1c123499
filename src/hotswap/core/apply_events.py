"""The first step of a round: apply what happened (nodes, slices, workloads, workers)."""

from __future__ import annotations

import dataclasses

from hotswap.api.cluster import NodeState
from hotswap.api.errors import never_fits
from hotswap.api.phases import WorkloadPhase
from hotswap.core import actions as act
from hotswap.core import events as ev
from hotswap.core.workload import Workload
from hotswap.core.policy import ExitVerdict, FailurePolicy
from hotswap.core.round_state import RESTARTING, RUNNING, RoundState

_CLUSTER_EVENTS = frozenset(
    {ev.NodeFailed, ev.NodeCordoned, ev.NodeDrained, ev.NodeRepaired, ev.SliceAdded, ev.SliceRemoved}
)
_FAILED, _SUCCESSFUL = WorkloadPhase.FAILED, WorkloadPhase.SUCCESSFUL  # (enum member reads are slow on 3.11)
_RESTART = ExitVerdict.RESTART


def apply_events(state: RoundState, events: list[ev.Event]) -> None:
    """Apply cluster events, then workload events, each in the order given.

    Cluster events go first so that a worker exit reported with the failure that caused it is
    seen as a consequence of the loss, which is never charged to max_restarts.
    """
    cluster = _CLUSTER_EVENTS
    for event in events:
        if type(event) in cluster:
            _apply_cluster_event(state, event)
    done = _Done(state)
    exited, succeeded = ev.WorkerExited, ev.AttemptSucceeded
    for event in events:
        kind = type(event)
        if kind is exited:
            if not (event.code == 0 and done.add(event)):
                _worker_exited(state, event, done)
        elif kind is succeeded:
            _attempt_succeeded(state, event, done)
        elif kind not in cluster:
            done.write(event.spec.name if kind is ev.WorkloadCreated else event.workload)
            _apply_workload_event(state, event)
    done.write_all()


@dataclasses.dataclass(slots=True)
class _Exits:
    workload: Workload  # its record when the first exit was accepted
    held: frozenset[str]
    workers: set[tuple[str, int]]
    expected: int


class _Done:
    """Workers that exited 0 in this round, per workload. A job of 64 hosts finishing is 64
    reports: the first is checked in full, the others only against the slices it held then,
    and its record is written once, before any other event about it and at the end."""

    def __init__(self, state: RoundState) -> None:
        self.state = state
        self.exits: dict[str, _Exits] = {}

    def accept(self, workload: Workload, worker: tuple[str, int]) -> None:
        """A worker of ``workload``'s current attempt, checked in full, exited 0."""
        exits = self.exits.get(workload.name)
        if exits is None:
            exits = self.exits[workload.name] = _Exits(
                workload, frozenset(workload.slices), set(workload.exited_ok), self.state.workers_of(workload)
            )
        self._count(exits, worker)

    def add(self, event: ev.WorkerExited) -> bool:
        """Count an exit of an attempt already seen in this round; False when it needs a full check."""
        exits = self.exits.get(event.workload)
        if exits is None or exits.workload.attempt != event.attempt or event.slice not in exits.held:
            return False
        exits.workers.add((event.slice, event.host))
        if len(exits.workers) >= exits.expected:
            self._done(exits)
        return True

    def accept_all(self, workload: Workload, workers: list[tuple[str, int]]) -> None:
        """``accept`` for each of ``workers``, in one go."""
        if not workers:
            return
        exits = self.exits.get(workload.name)
        if exits is None:
            exits = self.exits[workload.name] = _Exits(
                workload, frozenset(workload.slices), set(workload.exited_ok), self.state.workers_of(workload)
            )
        exits.workers.update(workers)
        if len(exits.workers) >= exits.expected:
            self._done(exits)

    def _count(self, exits: _Exits, worker: tuple[str, int]) -> None:
        exits.workers.add(worker)
        if len(exits.workers) >= exits.expected:
            self._done(exits)

    def _done(self, exits: _Exits) -> None:
        del self.exits[exits.workload.name]
        _complete(self.state, exits.workload, frozenset(exits.workers), exits.expected)

    def write(self, name: str) -> None:
        exits = self.exits.pop(name, None)
        if exits is not None:
            self.state.update(self.state.workloads[name], exited_ok=frozenset(exits.workers))

    def write_all(self) -> None:
        for name in list(self.exits):
            self.write(name)


def _apply_cluster_event(state: RoundState, event: ev.ClusterEvent) -> None:
    match event:
        case ev.NodeFailed(node=node, reason=reason):
            _set_node(state, node, NodeState.FAILED, f"node {node} failed" + (f": {reason}" if reason else ""))
        case ev.NodeCordoned(node=node, reason=reason):
            _set_node(state, node, NodeState.CORDONED, f"node {node}: {reason}" if reason else f"node {node} was cordoned")
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
        case ev.WorkloadHung():
            _hung(state, event)
        case ev.WorkerLost():
            _worker_lost(state, event)
        case ev.WorkersStopped():
            workload = state.workloads.get(event.workload)
            if workload is not None and event.attempt in workload.stopping:
                state.update(workload, stopping=workload.stopping - {event.attempt})
                # Only a workload waiting to start (BlockingRecreate) can act on it: nothing
                # else that could be decided depends on whether old workers are still alive.
                state.needs_scheduling |= workload.phase is RESTARTING
        case ev.CheckpointRecorded():
            workload = state.workloads.get(event.workload)
            if workload is not None and (
                workload.last_checkpoint_at is None or event.at >= workload.last_checkpoint_at
            ):
                state.update(
                    workload,
                    last_checkpoint_at=event.at,
                    last_checkpoint_step=event.step,
                    checkpoint_every=event.every,
                )


def _create(state: RoundState, event: ev.WorkloadCreated) -> None:
    spec = event.spec
    if spec.name in state.workloads:
        state.actions.append(act.Reject(spec.name, f"a workload named {spec.name} already exists"))
        return
    never = never_fits(spec.num_slices, spec.device_type, state.capacity.type_size(spec.device_type))
    if never is not None:
        state.actions.append(act.Reject(spec.name, never))
        return
    state.add(
        Workload(
            spec=spec,
            seq=state.next_seq,
            created_at=state.now,
            status_message=f"queued: waiting for {spec.num_slices} slice(s) of {spec.device_type}",
            status_time=state.now,
        )
    )
    state.next_seq += 1
    state.needs_scheduling = True


def _delete(state: RoundState, name: str) -> None:
    workload = state.workloads.get(name)
    if workload is None:
        return
    state.release(workload, workload.slices)
    state.remove(workload)
    state.lost.pop(name, None)
    state.replacing.pop(name, None)
    state.actions.append(act.Remove(name))
    state.needs_scheduling = True


def _worker_exited(state: RoundState, event: ev.WorkerExited, done: _Done) -> None:
    workload = _workload_of_current_worker(state, event)
    if workload is None:
        return
    if event.code == 0:  # (what FailurePolicy.judge says of 0, without building a policy per worker)
        done.accept(workload, (event.slice, event.host))
        return
    verdict, why = FailurePolicy.of(workload.spec).judge(event.code, workload.restarts)
    done.write(workload.name)
    workload = state.workloads[workload.name]
    where = f"worker {event.slice}/{event.host}"
    if verdict is _RESTART:
        state.restart_in_place(workload, f"{where} {why}", charged=True)
    else:
        _fail(state, workload, f"{where} {why}")


def _worker_lost(state: RoundState, event: ev.WorkerLost) -> None:
    """A worker the backend lost (never the workload's doing): restart in place, not charged,
    with the same checks as an exit (a stale attempt, or a loss already handled, does nothing).
    A loss the backend charges is judged like a hang: a crash with a restart code."""
    workload = _workload_of_current_worker(state, event)
    if workload is None:
        return
    where = f"worker {event.slice}/{event.host} {event.reason}"
    if not event.charged:
        state.restart_in_place(workload, f"{where}; not charged", charged=False)
        return
    _charge(state, workload, f"{where}; charged")


def _workload_of_current_worker(state: RoundState, event: ev.WorkerExited | ev.WorkerLost) -> Workload | None:
    """The running workload the worker of ``event`` belongs to now, or None when the event is
    stale: an earlier attempt, a slice it no longer holds, or a workload that lost capacity in
    this round. Such an exit or loss is a consequence of something the core already handles
    (the loss restarts or rescales it), and it is never charged to max_restarts."""
    workload = state.workloads.get(event.workload)
    if (
        workload is None
        or workload.phase is not RUNNING
        or workload.attempt != event.attempt
        or event.slice not in workload.slices
        or not state.capacity.healthy(event.slice)
        or event.workload in state.lost
    ):
        return None
    return workload


def _attempt_succeeded(state: RoundState, event: ev.AttemptSucceeded, done: _Done) -> None:
    """Each worker of the attempt's slices exited 0: as that many ``WorkerExited`` (code 0),
    with the same checks (a stale attempt, or a workload that lost capacity, counts nothing)."""
    workload = state.workloads.get(event.workload)
    if workload is None or workload.phase is not RUNNING or workload.attempt != event.attempt or event.workload in state.lost:
        return
    capacity = state.capacity
    slices = capacity.slices
    held = workload.slices
    if held and not workload.exited_ok and event.workload not in done.exits and capacity.unhealthy.isdisjoint(held):
        # The usual case, in one step: no worker reported before, every slice healthy, so every
        # worker is done (what accept_all concludes, without counting them one by one).
        exited = frozenset((s, h) for s in held for h in range(len(slices[s].nodes)))
        _complete(state, workload, exited, len(exited))
        return
    workers = [(s, h) for s in held if capacity.healthy(s) for h in range(len(slices[s].nodes))]
    done.accept_all(workload, workers)


def _hung(state: RoundState, event: ev.WorkloadHung) -> None:
    """A hang is judged like a crash with a restart code: restart in place, charged."""
    workload = state.workloads.get(event.workload)
    if workload is None or workload.phase is not RUNNING or workload.attempt != event.attempt or event.workload in state.lost:
        return  # a stale attempt, or one already being replaced
    _charge(state, workload, f"hung: {event.reason}")


def _charge(state: RoundState, workload: Workload, what: str) -> None:
    """Judged like a crash with a restart code (a hang, a loss the backend charges): restart in
    place charged, or fail once max_restarts is used up."""
    verdict, why = FailurePolicy.of(workload.spec).judge_hang(workload.restarts)
    if verdict is _RESTART:
        state.restart_in_place(workload, f"{what}; {why}", charged=True)
    else:
        _fail(state, workload, f"{what}; {why}")


def _fail(state: RoundState, workload: Workload, reason: str) -> None:
    state.release(workload, workload.slices)
    state.update(
        workload,
        phase=_FAILED,
        slices=(),
        replicas=None,
        stopping=state.stopping_after_stop(workload),
        status_message=f"failed: {reason}",
    )
    state.actions.append(act.Fail(workload.name, reason))
    state.needs_scheduling = True


def _complete(state: RoundState, workload: Workload, exited: frozenset[tuple[str, int]], workers: int) -> None:
    """Every worker of the workload's slices exited 0: it is done.

    ``exited_ok`` only ever holds workers of the slices held now (it is reset at every start
    and trimmed at every scale-down), so its size is the count of workers done."""
    state.release(workload, workload.slices)
    state.update(
        workload,
        phase=_SUCCESSFUL,
        slices=(),
        replicas=None,
        exited_ok=exited,
        status_message=f"finished: all {workers} workers exited 0",
    )
    state.actions.append(act.Complete(workload.name))
    state.needs_scheduling = True
