"""The third and last steps of a round, like Kueue's scheduler: serve demands for slices, then
start the workers of workloads that were waiting.

Demands (replacements, queued workloads, elastic growth) are served in
:func:`hotswap.core.ordering.demand_order`. Each gets free healthy slices first, then
(except growth, see :func:`hotswap.core.placement.reclaim_target`) slices of strictly
lower-priority work, chosen by :func:`hotswap.core.preemption.plan_reclaim`: elastic workloads
shrink before anyone is evicted, and the victims are a minimal set.
"""

from __future__ import annotations

from hotswap.core import actions as act
from hotswap.core.demands import Demand, DemandQueue
from hotswap.core.workload import HOLDING, Workload
from hotswap.core.ordering import DemandKind
from hotswap.core.placement import fill_positions, give_up_last, grow_map, kept_map, reclaim_target
from hotswap.core.policy import VictimOrder
from hotswap.core.preemption import Candidates, NewestFirstCandidates, RankedCandidates, plan_reclaim
from hotswap.core.round_state import BLOCKING_RECREATE, QUEUED, RESTARTING, RUNNING, RoundState

HOTSWAPPED_SUFFIX = "; hotswapped"  # ends the message of a restart onto a replacement slice
_RESTARTING = "restarting: "  # RoundState.restart_in_place's message of a restart that waits

# Enum members as module constants: on Python 3.11 each ``Enum.MEMBER`` read goes through the
# enum metaclass's attribute hook (~50 ns), and a simulated month reads them millions of times.
_ADMIT, _REPLACE, _GROW = DemandKind.ADMIT, DemandKind.REPLACE, DemandKind.GROW


def serve_demands(state: RoundState) -> None:
    """Serve every demand for slices (replacements, queued workloads, elastic growth) until
    none is left; each is granted, or refused and parked or requeued."""
    queue = state.queue = DemandQueue(state, state.config.elastic)
    for name in sorted(state.replacing, key=lambda n: state.workloads[n].seq):
        queue.push(state.replacing[name], state.workloads[name])
    queue.open(grow=state.config.elastic, no_grow=set(state.replacing))
    # Each pass either admits, shrinks, evicts or gives up; priorities strictly fall along
    # every preemption chain, so this ends. The guard turns a bug into an error, not a hang.
    # (next_seq bounds the number of workloads there are.)
    budget = 20 * (state.next_seq + 10)
    try:
        while (demand := queue.pop()) is not None:
            budget -= 1
            if budget < 0:
                raise RuntimeError("scheduler did not converge (bug)")
            _serve(state, demand)
    finally:
        # The queue and the state refer to each other: left linked, every round would leave a
        # cycle (the round's overlays and indexes) for the cyclic garbage collector to find.
        state.queue = None


def start_ready(state: RoundState) -> None:
    """Start the workers of workloads that waited (old workers stopping, repair, a floor)."""
    waiting = [state.workloads[name] for name in state.index.restarting]
    if not waiting:
        return
    broken = state.capacity.broken_by_holder()
    for workload in sorted(waiting, key=lambda w: w.seq):
        blocking = workload.spec.restart_strategy is BLOCKING_RECREATE
        if blocking and workload.stopping:
            continue
        if workload.name in broken:
            continue
        if len(workload.slices) < state.floor(workload):
            continue
        state.update(
            workload,
            phase=RUNNING,
            running_since=state.now,
            exited_ok=frozenset(),
            status_message=_started_message(workload),
        )
        state.actions.append(act.StartWorkers(workload.name, workload.attempt, workload.slices))


def _started_message(workload: Workload) -> str:
    """A hotswap that waited (BlockingRecreate) reads as Recreate's once its workers start:
    "restarted: ...; hotswapped", so every view still says HOTSWAPPED."""
    message = workload.status_message
    if message.startswith(_RESTARTING) and message.endswith(HOTSWAPPED_SUFFIX):
        return "restarted: " + message[len(_RESTARTING):]
    return f"running on {len(workload.slices)} slice(s)"


def _queue(state: RoundState) -> DemandQueue:
    assert state.queue is not None, "demands are only pushed while they are served"
    return state.queue


def _admit_demand(state: RoundState, workload: Workload) -> Demand:
    """A queued workload wants its size and needs its floor."""
    return Demand(workload.name, _ADMIT, workload.spec.num_slices, state.floor(workload))


def _still_wanted(state: RoundState, demand: Demand) -> Workload | None:
    """The workload, if the demand still stands (an earlier grant or eviction may end it)."""
    workload = state.workloads.get(demand.workload)
    if workload is None:
        return None
    if demand.kind is _ADMIT:
        return workload if workload.phase is QUEUED else None
    if demand.kind is _REPLACE:
        ok = state.replacing.get(demand.workload) is demand and workload.phase in HOLDING
        return workload if ok else None
    if workload.phase in HOLDING and len(workload.slices) < workload.spec.num_slices:
        demand.want = workload.spec.num_slices - len(workload.slices)
        return workload
    return None


def _serve(state: RoundState, demand: Demand) -> None:
    workload = _still_wanted(state, demand)
    if workload is None:
        return
    device_type = workload.device_type
    got = state.capacity.take_free(device_type, demand.want)
    if len(got) < demand.want and demand.kind is not _GROW:
        target = reclaim_target(state.capacity, workload, len(got), demand.want, demand.need)
        if target:
            got.extend(_reclaim(state, workload, target))
    if got and len(got) >= demand.need:
        _grant(state, workload, demand, tuple(got))
        return
    state.capacity.return_free(device_type, got)
    _refuse(state, workload, demand)


def _reclaim(state: RoundState, workload: Workload, target: int) -> list[str]:
    """Free ``target`` slices of lower-priority work and take them."""
    ranked = RankedCandidates(state.capacity, state.index, workload, state.now, state.config.elastic)
    candidates: Candidates = NewestFirstCandidates(ranked) if state.config.victims is VictimOrder.NEWEST_FIRST else ranked
    plan = plan_reclaim(target, candidates)
    if plan is None:  # cannot happen: the held slices counted cover the target
        return []
    with _queue(state).deferred_wakes():
        for victim in plan.victims:
            _preempt(state, victim, workload)
        for donor, count in plan.shrinks:
            donor = state.workloads[donor.name]
            keep, given = give_up_last(donor.slices, count)
            reason = f"gave {count} slice(s) to {workload.name} (priority {workload.priority.label})"
            state.scale_down(donor, keep, given, reason, preemptor=workload.name)
        return state.capacity.take_free(workload.device_type, target)


def _preempt(state: RoundState, victim: Workload, preemptor: Workload) -> None:
    victim = state.workloads[victim.name]
    state.release(victim, victim.slices)
    state.replacing.pop(victim.name, None)
    reason = f"preempted by {preemptor.name} (priority {preemptor.priority.label})"
    state.update(
        victim,
        phase=QUEUED,
        slices=(),
        replicas=None,
        stopping=state.stopping_after_stop(victim),
        preemptions=victim.preemptions + 1,
        running_since=None,
        exited_ok=frozenset(),
        status_message=reason,
    )
    state.actions.append(act.Preempt(victim.name, preemptor.name, reason))
    _queue(state).push(_admit_demand(state, victim), victim)


def _grant(state: RoundState, workload: Workload, demand: Demand, got: tuple[str, ...]) -> None:
    state.capacity.hold(workload, got)
    name = workload.name
    if demand.kind is _ADMIT:
        _admit(state, workload, got)
        return
    state.replacing.pop(name, None)
    if workload.phase is RESTARTING:
        # Workers not started yet: only the reservation changes (replica i on slices[i], as
        # restart_in_place placed them); StartWorkers carries it.
        slices = fill_positions(demand.previous, demand.lost_at, got) if demand.previous else workload.slices + got
        state.update(workload, slices=slices)
    elif demand.kind is _GROW or not demand.restart:
        # Elastic: the running replicas keep their indices; the joiners take the parked ones.
        slices = workload.slices + got
        replicas = grow_map(workload.replica_map, got)
        membership = workload.membership + 1
        state.update(
            workload,
            slices=slices,
            replicas=kept_map(replicas, slices),
            membership=membership,
            status_message=f"running on {len(slices)} of {workload.spec.num_slices} slice(s)",
        )
        state.actions.append(act.ScaleUp(name, got, slices, membership, replicas))
    else:
        # Hotswap: every worker restarts, each replacement in a lost replica's position.
        slices = fill_positions(demand.previous, demand.lost_at, got)
        workload = state.update(workload, slices=slices, replicas=None)
        state.restart_in_place(workload, f"{demand.reason}{HOTSWAPPED_SUFFIX}", charged=False)


def _admit(state: RoundState, workload: Workload, got: tuple[str, ...]) -> None:
    blocked = workload.spec.restart_strategy is BLOCKING_RECREATE and workload.stopping
    attempt = workload.attempt + 1
    state.update(
        workload,
        phase=RESTARTING if blocked else RUNNING,
        slices=got,
        attempt=attempt,
        running_since=None if blocked else state.now,
        exited_ok=frozenset(),
        status_message=(
            "admitted: waiting for its previous workers to stop" if blocked else f"running on {len(got)} slice(s)"
        ),
    )
    state.actions.append(act.Admit(workload.name, attempt, got, start=not blocked))


def _refuse(state: RoundState, workload: Workload, demand: Demand) -> None:
    if demand.kind is _REPLACE and demand.need > 0:
        state.replacing.pop(workload.name, None)
        state.requeue(workload, f"{demand.reason}; no healthy capacity to replace it, waiting in the queue")
        # It cannot fit now, but capacity released later in this round may change that.
        _queue(state).park(_admit_demand(state, workload), workload)
        return
    # Optional (it can run without it): wait for capacity of this type to be released later in the round.
    _queue(state).park(demand, workload)
