"""The decision round: a snapshot and events in, a new snapshot and actions out.

``decide`` is pure: no I/O, no clock (``now`` is an argument), no threads, no randomness, and
nothing in it depends on set or hash order, so the same inputs always give the same actions.
Like Kueue's scheduler it works in three steps: take the snapshot, compute the targets
(:func:`hotswap.core.preemption.plan_reclaim`), and return the effects as data for a backend to
enact.

One round:

1. apply cluster events (nodes, slices), then workload events, in the order given;
2. handle lost capacity: a workload whose slice became unhealthy scales down (elastic), is
   marked for replacement (hotswap) or waits for repair holding its slices;
3. serve demands for slices in :func:`hotswap.core.ordering.demand_order`: replacements,
   queued workloads, elastic growth. Each takes free healthy slices first, then (except growth)
   slices of strictly lower-priority work: elastic workloads shrink before anyone is evicted,
   and the victims are a minimal set chosen by :func:`hotswap.core.ordering.candidates_ordering`;
4. start the workers of workloads that were waiting (BlockingRecreate, repair) once they can.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Iterable, Mapping

from hotswap.api.cluster import NodeState
from hotswap.api.phases import WorkloadPhase, check_transition
from hotswap.api.spec import RestartStrategy
from hotswap.core import actions as act
from hotswap.core import events as ev
from hotswap.core.model import Node, Slice, Snapshot, Workload, holder_class
from hotswap.core.ordering import DemandKind, candidates_ordering, demand_order
from hotswap.core.policy import DEFAULT_CONFIG, ExitVerdict, FailurePolicy, SchedulerConfig
from hotswap.core.preemption import Candidate, plan_reclaim

QUEUED = WorkloadPhase.QUEUED
RUNNING = WorkloadPhase.RUNNING
RESTARTING = WorkloadPhase.RESTARTING
_HOLDING = frozenset({RUNNING, RESTARTING})

_CLUSTER_EVENTS = (
    ev.NodeFailed,
    ev.NodeCordoned,
    ev.NodeDrained,
    ev.NodeRepaired,
    ev.SliceAdded,
    ev.SliceRemoved,
)


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    snapshot: Snapshot
    actions: tuple[act.Action, ...]


def decide(
    snapshot: Snapshot,
    events: Iterable[ev.Event],
    now: float,
    config: SchedulerConfig = DEFAULT_CONFIG,
) -> Decision:
    """Apply ``events`` to ``snapshot`` at time ``now`` and decide what to do."""
    round_ = _Round(snapshot, now, config)
    round_.apply(list(events))
    if round_.needs_scheduling:
        round_.schedule()
    return Decision(round_.freeze(), tuple(round_.actions))


@dataclasses.dataclass(slots=True)
class _Demand:
    workload: str
    kind: DemandKind
    want: int  # slices it would like
    need: int  # fewest that make the demand worth serving
    # For replacements: the slices it had before the loss (positions are kept) and whether it
    # restarts (non-elastic) or scales (elastic, survivors keep running).
    previous: tuple[str, ...] = ()
    restart: bool = False
    reason: str = ""


class _Round:
    """Mutable working state of one decision round; frozen into a Snapshot at the end."""

    def __init__(self, snapshot: Snapshot, now: float, config: SchedulerConfig) -> None:
        self.now = now
        self.config = config
        self.actions: list[act.Action] = []
        self.needs_scheduling = False
        # Copy-on-write: big mappings are copied only when this round changes them.
        self.slices = snapshot.slices
        self.nodes = snapshot.nodes
        self.slices_by_type = snapshot.slices_by_type
        self._owned: set[str] = set()
        self.workloads: dict[str, Workload] = dict(snapshot.workloads)
        self.holders: dict[str, str] = dict(snapshot.holders)
        self.unhealthy: set[str] = set(snapshot.unhealthy)
        self.next_seq = snapshot.next_seq
        self.next_ordinal = snapshot.next_ordinal
        # Losses seen this round: workload -> {slice: reason}, in the order seen.
        self.lost: dict[str, dict[str, str]] = {}
        self.removed: set[str] = set()
        self.replacing: dict[str, _Demand] = {}
        # Capacity indexes (see Snapshot): copied per key on first change (copy-on-write).
        self._free_in: Mapping[str, frozenset[str]] = snapshot.free_by_type
        self._members_in: Mapping[tuple[str, int, bool], frozenset[str]] = snapshot.class_members
        self._free_sets: dict[str, set[str]] = {}
        self._member_sets: dict[tuple[str, int, bool], set[str]] = {}
        self.class_held: dict[tuple[str, int, bool], int] = dict(snapshot.class_held)
        # Per device type, built on first use: free healthy slices as a heap by ordinal.
        self._free_heaps: dict[str, list[tuple[int, str]]] = {}
        self._failed: dict[str, list[_Demand]] = {}
        self._heap: list[tuple[tuple[int, int, int], int, _Demand]] = []
        self._counter = itertools.count()

    # ------------------------------------------------------------------ bookkeeping helpers

    def _own(self, name: str) -> None:
        if name not in self._owned:
            self._owned.add(name)
            setattr(self, name, dict(getattr(self, name)))

    def _update(self, workload: Workload, **changes: object) -> Workload:
        if "status_message" in changes and changes["status_message"] != workload.status_message:
            changes.setdefault("status_time", self.now)
        new = dataclasses.replace(workload, **changes)
        if new.phase is not workload.phase or "phase" in changes:
            check_transition(workload.phase, new.phase)
        if bool(new.slices) != bool(workload.slices):
            members = self._members(holder_class(new))
            if new.slices:
                members.add(new.name)
            else:
                members.discard(new.name)
        self.workloads[new.name] = new
        return new

    def _free_set(self, device_type: str) -> set[str]:
        found = self._free_sets.get(device_type)
        if found is None:
            found = set(self._free_in.get(device_type, ()))
            self._free_sets[device_type] = found
        return found

    def _members(self, key: tuple[str, int, bool]) -> set[str]:
        found = self._member_sets.get(key)
        if found is None:
            found = set(self._members_in.get(key, ()))
            self._member_sets[key] = found
        return found

    def _members_view(self, key: tuple[str, int, bool]) -> Iterable[str]:
        found = self._member_sets.get(key)
        return found if found is not None else self._members_in.get(key, ())

    def _floor(self, workload: Workload) -> int:
        spec = workload.spec
        return spec.floor_slices if self.config.elastic else spec.num_slices

    def _elastic(self, workload: Workload) -> bool:
        return self.config.elastic and workload.spec.elastic

    def _healthy(self, name: str) -> bool:
        return name not in self.unhealthy

    def _hold(self, workload: Workload, names: Iterable[str]) -> None:
        """Give slices taken from the free pool to ``workload``."""
        key = holder_class(workload)
        for name in names:
            self.holders[name] = workload.name
            if self._healthy(name):
                self.class_held[key] = self.class_held.get(key, 0) + 1

    def _release(self, workload: Workload, names: Iterable[str]) -> None:
        """Free slices; healthy ones go back to the free pool and wake up waiting demands."""
        key = holder_class(workload)
        freed = False
        for name in names:
            if self.holders.get(name) != workload.name:
                continue
            del self.holders[name]
            if not self._healthy(name):
                continue
            self.class_held[key] -= 1
            self._return_free(workload.device_type, name)
            freed = True
        if freed:
            for demand in self._failed.pop(workload.device_type, []):
                self._push(demand)

    def _return_free(self, device_type: str, name: str) -> None:
        self._free_set(device_type).add(name)
        heap = self._free_heaps.get(device_type)
        if heap is not None:
            heapq.heappush(heap, (self.slices[name].ordinal, name))

    def _take_free(self, device_type: str, count: int) -> list[str]:
        """Up to ``count`` free healthy slices, lowest ordinal first."""
        heap = self._free_heaps.get(device_type)
        if heap is None:
            heap = [(self.slices[n].ordinal, n) for n in self._free_set(device_type)]
            heapq.heapify(heap)
            self._free_heaps[device_type] = heap
        taken = [heapq.heappop(heap)[1] for _ in range(min(count, len(heap)))]
        self._free_set(device_type).difference_update(taken)
        return taken

    def _set_unhealthy(self, name: str) -> None:
        if name in self.unhealthy:
            return
        self.unhealthy.add(name)
        holder = self.holders.get(name)
        if holder is not None:
            self.class_held[holder_class(self.workloads[holder])] -= 1
        else:
            self._free_set(self.slices[name].device_type).discard(name)

    def _set_healthy(self, name: str) -> None:
        if name not in self.unhealthy:
            return
        self.unhealthy.discard(name)
        holder = self.holders.get(name)
        if holder is not None:
            key = holder_class(self.workloads[holder])
            self.class_held[key] = self.class_held.get(key, 0) + 1
        else:
            self._free_set(self.slices[name].device_type).add(name)

    def _stopping_after_stop(self, workload: Workload) -> frozenset[int]:
        """Attempts still alive once the current one is told to stop."""
        if workload.phase is RUNNING:
            return workload.stopping | {workload.attempt}
        return workload.stopping

    # ------------------------------------------------------------------ events

    def apply(self, events: list[ev.Event]) -> None:
        for event in events:
            if isinstance(event, _CLUSTER_EVENTS):
                self._apply_cluster(event)
        for event in events:
            if not isinstance(event, _CLUSTER_EVENTS):
                self._apply_workload(event)

    def _apply_cluster(self, event: ev.ClusterEvent) -> None:
        if isinstance(event, ev.NodeFailed):
            self._set_node(event.node, NodeState.FAILED, f"node {event.node} failed")
        elif isinstance(event, ev.NodeCordoned):
            self._set_node(event.node, NodeState.CORDONED, f"node {event.node} was cordoned")
        elif isinstance(event, ev.NodeDrained):
            self._set_node(event.node, NodeState.CORDONED, f"node {event.node} was drained")
        elif isinstance(event, ev.NodeRepaired):
            self._set_node(event.node, NodeState.READY, "")
        elif isinstance(event, ev.SliceAdded):
            self._add_slice(event)
        elif isinstance(event, ev.SliceRemoved):
            self._remove_slice(event.name)

    def _set_node(self, name: str, state: NodeState, reason: str) -> None:
        node = self.nodes.get(name)
        if node is None or node.state is state:
            return  # unknown (stale) node, or nothing changes
        self._own("nodes")
        self._own("slices")
        self.nodes[name] = dataclasses.replace(node, state=state)
        item = self.slices[node.slice]
        down = item.down_nodes - {name} if state is NodeState.READY else item.down_nodes | {name}
        self.slices[item.name] = dataclasses.replace(item, down_nodes=down)
        self.needs_scheduling = True
        if item.healthy and down:
            self._mark_lost(item.name, reason)
        elif not item.healthy and not down and item.name not in self.removed:
            self._set_healthy(item.name)

    def _mark_lost(self, slice_name: str, reason: str) -> None:
        self._set_unhealthy(slice_name)
        holder = self.holders.get(slice_name)
        if holder is not None:
            self.lost.setdefault(holder, {}).setdefault(slice_name, reason)

    def _add_slice(self, event: ev.SliceAdded) -> None:
        if event.name in self.slices or any(n in self.nodes for n in event.nodes):
            raise ValueError(f"slice {event.name} or one of its nodes already exists")
        self._own("slices")
        self._own("nodes")
        self._own("slices_by_type")
        for host, node in enumerate(event.nodes):
            self.nodes[node] = Node(node, event.name, host)
        self.slices[event.name] = Slice(event.name, event.device_type, tuple(event.nodes), self.next_ordinal)
        self.next_ordinal += 1
        members = self.slices_by_type.get(event.device_type, frozenset())
        self.slices_by_type[event.device_type] = members | {event.name}
        self._free_set(event.device_type).add(event.name)
        self.needs_scheduling = True

    def _remove_slice(self, name: str) -> None:
        item = self.slices.get(name)
        if item is None or name in self.removed:
            return
        self._own("slices_by_type")
        self.slices_by_type[item.device_type] = self.slices_by_type[item.device_type] - {name}
        self.removed.add(name)
        self._mark_lost(name, f"slice {name} was removed from the cluster")
        self.needs_scheduling = True

    def _apply_workload(self, event: ev.WorkloadEvent) -> None:
        if isinstance(event, ev.WorkloadCreated):
            self._create(event)
        elif isinstance(event, ev.WorkloadDeleted):
            self._delete(event.workload)
        elif isinstance(event, ev.WorkerExited):
            self._worker_exited(event)
        elif isinstance(event, ev.WorkersStopped):
            workload = self.workloads.get(event.workload)
            if workload is not None and event.attempt in workload.stopping:
                self._update(workload, stopping=workload.stopping - {event.attempt})
                self.needs_scheduling = True
        elif isinstance(event, ev.CheckpointRecorded):
            workload = self.workloads.get(event.workload)
            if workload is not None and (
                workload.last_checkpoint_at is None or event.at >= workload.last_checkpoint_at
            ):
                self._update(workload, last_checkpoint_at=event.at, last_checkpoint_step=event.step)

    def _create(self, event: ev.WorkloadCreated) -> None:
        spec = event.spec
        if spec.name in self.workloads:
            self.actions.append(act.Reject(spec.name, f"a workload named {spec.name} already exists"))
            return
        have = len(self.slices_by_type.get(spec.device_type, ()))
        if have < spec.num_slices:
            where = f"only {have}" if have else "none"
            self.actions.append(
                act.Reject(
                    spec.name,
                    f"it needs {spec.num_slices} slice(s) of {spec.device_type} and the cluster has"
                    f" {where}; it could never run",
                )
            )
            return
        self.workloads[spec.name] = Workload(
            spec=spec,
            seq=self.next_seq,
            created_at=self.now,
            status_message=f"queued: waiting for {spec.num_slices} slice(s) of {spec.device_type}",
            status_time=self.now,
        )
        self.next_seq += 1
        self.needs_scheduling = True

    def _delete(self, name: str) -> None:
        workload = self.workloads.pop(name, None)
        if workload is None:
            return
        self.workloads[name] = workload  # _release reads it; removed below
        self._release(workload, workload.slices)
        self._members(holder_class(workload)).discard(name)
        del self.workloads[name]
        self.lost.pop(name, None)
        self.replacing.pop(name, None)
        self.actions.append(act.Remove(name))
        self.needs_scheduling = True

    def _worker_exited(self, event: ev.WorkerExited) -> None:
        workload = self.workloads.get(event.workload)
        if (
            workload is None
            or workload.phase is not RUNNING
            or workload.attempt != event.attempt
            or event.slice not in workload.slices
            or not self._healthy(event.slice)
            or event.workload in self.lost
        ):
            # A stale attempt, a slice it no longer holds, or a workload that lost capacity in
            # this round: the exit is a consequence of something the core already handles (the
            # loss restarts or rescales it), and it is never charged to max_restarts.
            return
        verdict, why = FailurePolicy.of(workload.spec).judge(event.code, workload.restarts)
        where = f"worker {event.slice}/{event.host}"
        if verdict is ExitVerdict.SUCCEEDED:
            done = workload.exited_ok | {(event.slice, event.host)}
            held = set(workload.slices)
            expected = sum(len(self.slices[s].nodes) for s in workload.slices)
            if sum(1 for s, _ in done if s in held) >= expected:
                self._release(workload, workload.slices)
                self._update(
                    workload,
                    phase=WorkloadPhase.SUCCESSFUL,
                    slices=(),
                    exited_ok=done,
                    status_message=f"finished: all {expected} workers exited 0",
                )
                self.actions.append(act.Complete(workload.name))
                self.needs_scheduling = True
            else:
                self._update(workload, exited_ok=done)
        elif verdict is ExitVerdict.RESTART:
            self._restart_in_place(workload, f"{where} {why}", charged=True)
        else:
            self._release(workload, workload.slices)
            self._update(
                workload,
                phase=WorkloadPhase.FAILED,
                slices=(),
                stopping=self._stopping_after_stop(workload),
                status_message=f"failed: {where} {why}",
            )
            self.actions.append(act.Fail(workload.name, f"{where} {why}"))
            self.needs_scheduling = True

    def _restart_in_place(self, workload: Workload, reason: str, charged: bool) -> None:
        """Restart every worker on the slices the workload holds now."""
        blocking = workload.spec.restart_strategy is RestartStrategy.BLOCKING_RECREATE
        attempt = workload.attempt + 1
        self._update(
            workload,
            phase=RESTARTING if blocking else RUNNING,
            attempt=attempt,
            stopping=self._stopping_after_stop(workload),
            restarts=workload.restarts + (1 if charged else 0),
            running_since=None if blocking else self.now,
            exited_ok=frozenset(),
            status_message=f"restarting: {reason}" if blocking else f"restarted: {reason}",
        )
        self.actions.append(
            act.Restart(workload.name, attempt, workload.slices, reason, charged, start=not blocking)
        )
        self.needs_scheduling = True

    # ------------------------------------------------------------------ scheduling

    def schedule(self) -> None:
        self._handle_losses()
        self._serve_demands()
        self._start_ready()
        self._drop_removed_slices()

    def _handle_losses(self) -> None:
        for name in sorted(self.lost, key=lambda n: self.workloads[n].seq):
            workload = self.workloads[name]
            lost = self.lost[name]
            reason = "; ".join(lost.values())
            keep = tuple(s for s in workload.slices if self._healthy(s))
            gone = tuple(s for s in workload.slices if not self._healthy(s))
            removed = any(s in self.removed for s in gone)
            if workload.phase is RESTARTING:
                # Workers not started: adjust the reservation, nothing to stop.
                if self.config.hotswap or removed:
                    self._release(workload, gone)
                    self._update(workload, slices=keep)
                    self._want_replacement(workload, keep, workload.slices, reason, restart=True)
                continue
            self._update(workload, disruptions=workload.disruptions + 1)
            workload = self.workloads[name]
            if self._elastic(workload) and len(keep) >= self._floor(workload):
                self._release(workload, gone)
                membership = workload.membership + 1
                self._update(
                    workload,
                    slices=keep,
                    membership=membership,
                    exited_ok=frozenset(k for k in workload.exited_ok if k[0] in keep),
                    status_message=f"scaled down to {len(keep)} slice(s): {reason}",
                )
                self.actions.append(act.ScaleDown(name, gone, keep, membership, reason))
                if self.config.hotswap:
                    self._want_replacement(self.workloads[name], keep, workload.slices, reason, restart=False)
            elif self.config.hotswap:
                self._release(workload, gone)
                self._update(workload, slices=keep)
                self._want_replacement(self.workloads[name], keep, workload.slices, reason, restart=True)
            elif removed:
                self._requeue(workload, f"{reason}; it cannot wait for repair")
            else:
                self._restart_in_place(workload, f"{reason}; waiting for repair", charged=False)
                workload = self.workloads[name]
                if workload.phase is RUNNING:  # Recreate: still must wait for the repair
                    self._update(workload, phase=RESTARTING, running_since=None)
                    self.actions[-1] = dataclasses.replace(self.actions[-1], start=False)

    def _want_replacement(
        self,
        workload: Workload,
        keep: tuple[str, ...],
        previous: tuple[str, ...],
        reason: str,
        restart: bool,
    ) -> None:
        """Ask for slices to bring ``workload`` back to its size after losing some.

        ``need`` is what it must get to run at all (its floor minus what it kept); when it
        kept enough (elastic), the replacement is welcome but optional.
        """
        want = workload.spec.num_slices - len(keep)
        if want <= 0:
            return
        need = self._floor(workload) - len(keep)
        self.replacing[workload.name] = _Demand(
            workload.name, DemandKind.REPLACE, want, need, previous, restart, reason
        )

    def _requeue(self, workload: Workload, reason: str) -> None:
        self._release(workload, workload.slices)
        self._update(
            workload,
            phase=QUEUED,
            slices=(),
            stopping=self._stopping_after_stop(workload),
            running_since=None,
            exited_ok=frozenset(),
            status_message=f"requeued: {reason}",
        )
        self.actions.append(act.Requeue(workload.name, reason))

    # -- demands

    def _push(self, demand: _Demand) -> None:
        workload = self.workloads[demand.workload]
        heapq.heappush(self._heap, (demand_order(workload, demand.kind), next(self._counter), demand))

    def _serve_demands(self) -> None:
        for workload in self.workloads.values():
            name = workload.name
            if name in self.replacing:
                self._push(self.replacing[name])
            elif workload.phase is QUEUED:
                spec = workload.spec
                self._push(_Demand(name, DemandKind.ADMIT, spec.num_slices, self._floor(workload)))
            elif (
                len(workload.slices) < workload.spec.num_slices
                and workload.phase in _HOLDING
                and self._elastic(workload)
            ):
                missing = workload.spec.num_slices - len(workload.slices)
                self._push(_Demand(name, DemandKind.GROW, missing, 1))
        # Each pass either admits, shrinks, evicts or gives up; priorities strictly fall along
        # every preemption chain, so this ends. The guard turns a bug into an error, not a hang.
        budget = 20 * (len(self.workloads) + 10)
        while self._heap:
            budget -= 1
            if budget < 0:
                raise RuntimeError("scheduler did not converge (bug)")
            _, _, demand = heapq.heappop(self._heap)
            self._serve(demand)

    def _still_wanted(self, demand: _Demand) -> Workload | None:
        workload = self.workloads.get(demand.workload)
        if workload is None:
            return None
        if demand.kind is DemandKind.ADMIT:
            return workload if workload.phase is QUEUED else None
        if demand.kind is DemandKind.REPLACE:
            ok = self.replacing.get(demand.workload) is demand and workload.phase in _HOLDING
            return workload if ok else None
        if workload.phase in _HOLDING and len(workload.slices) < workload.spec.num_slices:
            demand.want = workload.spec.num_slices - len(workload.slices)
            return workload
        return None

    def _broken_by_holder(self) -> dict[str, int]:
        """Unhealthy slices per holder (there are few unhealthy slices: count those)."""
        broken: dict[str, int] = {}
        for name in self.unhealthy:
            holder = self.holders.get(name)
            if holder is not None:
                broken[holder] = broken.get(holder, 0) + 1
        return broken

    def _reclaimable(self, workload: Workload) -> int:
        """Healthy slices of the workload's type held by strictly lower priorities."""
        device_type, priority, _ = holder_class(workload)
        return sum(
            held for (t, p, _), held in self.class_held.items() if t == device_type and p < priority
        )

    def _candidates(self, workload: Workload, deficit: int) -> list[Candidate]:
        """Strictly lower-priority holders of the workload's type that a plan may need.

        The plan evicts in :func:`candidates_ordering` order, lowest priority first, and every
        victim frees at least one slice, so it never evicts more than ``deficit`` workloads:
        from the lowest levels only the ``deficit`` cheapest are listed, and once they cover
        the deficit the higher levels can only contribute by shrinking, so only elastic
        holders are listed there. Every elastic holder that can shrink is listed (shrinks go
        in the same order across levels). The plan is the same as over every holder.
        """
        device_type, priority, _ = holder_class(workload)
        levels = sorted({k[1] for k in self.class_held if k[0] == device_type and k[1] < priority})
        broken = self._broken_by_holder()
        elastic = self.config.elastic
        found: list[Candidate] = []
        covered = 0
        for level in levels:
            evictable: list[Candidate] = []
            for key in ((device_type, level, False), (device_type, level, True)):
                if covered >= deficit and not (key[2] and elastic):
                    continue
                for name in self._members_view(key):
                    other = self.workloads[name]
                    if other.phase not in _HOLDING:
                        continue
                    healthy = len(other.slices) - broken.get(name, 0)
                    if healthy <= 0:
                        continue
                    shrinkable = 0
                    if key[2] and elastic and other.phase is RUNNING:
                        shrinkable = max(0, min(healthy, len(other.slices) - other.spec.floor_slices))
                    candidate = Candidate(other, healthy, shrinkable)
                    if covered < deficit:
                        evictable.append(candidate)
                    elif shrinkable:
                        found.append(candidate)
            if evictable:
                need = deficit - covered
                cheapest = heapq.nsmallest(need, evictable, key=lambda c: candidates_ordering(c.workload, self.now))
                chosen = {id(c) for c in cheapest}
                found.extend(cheapest)
                found.extend(c for c in evictable if c.shrinkable and id(c) not in chosen)
                covered += sum(c.healthy for c in cheapest)
        return found

    def _serve(self, demand: _Demand) -> None:
        workload = self._still_wanted(demand)
        if workload is None:
            return
        device_type = workload.device_type
        wanted = demand.want
        got = self._take_free(device_type, wanted)
        if len(got) < wanted and demand.kind is not DemandKind.GROW:
            got.extend(self._reclaim(workload, demand, wanted - len(got), len(got)))
        if got and len(got) >= demand.need:
            self._grant(workload, demand, tuple(got))
            return
        for name in got:
            self._return_free(device_type, name)
        self._refuse(workload, demand)

    def _reclaim(self, workload: Workload, demand: _Demand, deficit: int, have: int) -> list[str]:
        """Take up to ``deficit`` slices from strictly lower-priority work, if that suffices."""
        bound = self._reclaimable(workload)
        target = min(deficit, bound)
        if target == 0 or have + target < demand.need:
            return []
        plan = plan_reclaim(target, self._candidates(workload, target), self.now)
        if plan is None:  # cannot happen: the held slices counted cover the target
            return []
        for victim in plan.victims:
            self._preempt(victim, workload)
        for donor, count in plan.shrinks:
            self._shrink(donor, count, workload)
        return self._take_free(workload.device_type, target)

    def _preempt(self, victim: Workload, preemptor: Workload) -> None:
        victim = self.workloads[victim.name]
        self._release(victim, victim.slices)
        self.replacing.pop(victim.name, None)
        reason = f"preempted by {preemptor.name} (priority {preemptor.priority.label})"
        self._update(
            victim,
            phase=QUEUED,
            slices=(),
            stopping=self._stopping_after_stop(victim),
            preemptions=victim.preemptions + 1,
            running_since=None,
            exited_ok=frozenset(),
            status_message=reason,
        )
        self.actions.append(act.Preempt(victim.name, preemptor.name, reason))
        self._push(_Demand(victim.name, DemandKind.ADMIT, victim.spec.num_slices, self._floor(victim)))

    def _shrink(self, donor: Workload, count: int, preemptor: Workload) -> None:
        donor = self.workloads[donor.name]
        keep, given = donor.slices[: len(donor.slices) - count], donor.slices[len(donor.slices) - count :]
        self._release(donor, given)
        membership = donor.membership + 1
        reason = f"gave {count} slice(s) to {preemptor.name} (priority {preemptor.priority.label})"
        self._update(
            donor,
            slices=keep,
            membership=membership,
            exited_ok=frozenset(k for k in donor.exited_ok if k[0] in keep),
            status_message=f"scaled down to {len(keep)} slice(s): {reason}",
        )
        self.actions.append(act.ScaleDown(donor.name, given, keep, membership, reason, preemptor.name))

    def _grant(self, workload: Workload, demand: _Demand, got: tuple[str, ...]) -> None:
        self._hold(workload, got)
        name = workload.name
        if demand.kind is DemandKind.ADMIT:
            self._admit(workload, got)
        elif workload.phase is RESTARTING:
            # Workers not started yet: only the reservation changes; StartWorkers carries it.
            self.replacing.pop(name, None)
            slices = _fill_positions(demand.previous, workload.slices, got) if demand.previous else workload.slices + got
            self._update(workload, slices=slices)
        elif demand.kind is DemandKind.GROW or not demand.restart:
            self.replacing.pop(name, None)
            slices = workload.slices + got
            membership = workload.membership + 1
            self._update(
                workload,
                slices=slices,
                membership=membership,
                status_message=f"running on {len(slices)} of {workload.spec.num_slices} slice(s)",
            )
            self.actions.append(act.ScaleUp(name, got, slices, membership))
        else:
            self.replacing.pop(name, None)
            slices = _fill_positions(demand.previous, workload.slices, got)
            self._update(workload, slices=slices)
            self._restart_in_place(self.workloads[name], f"{demand.reason}; hotswapped", charged=False)

    def _admit(self, workload: Workload, got: tuple[str, ...]) -> None:
        blocked = (
            workload.spec.restart_strategy is RestartStrategy.BLOCKING_RECREATE and workload.stopping
        )
        attempt = workload.attempt + 1
        self._update(
            workload,
            phase=RESTARTING if blocked else RUNNING,
            slices=got,
            attempt=attempt,
            running_since=None if blocked else self.now,
            exited_ok=frozenset(),
            status_message=(
                "admitted: waiting for its previous workers to stop"
                if blocked
                else f"running on {len(got)} slice(s)"
            ),
        )
        self.actions.append(act.Admit(workload.name, attempt, got, start=not blocked))

    def _refuse(self, workload: Workload, demand: _Demand) -> None:
        if demand.kind is DemandKind.REPLACE and demand.need > 0:
            self.replacing.pop(workload.name, None)
            self._requeue(
                workload, f"{demand.reason}; no healthy capacity to replace it, waiting in the queue"
            )
            # It cannot fit now, but capacity released later in this round may change that.
            spec = workload.spec
            admit = _Demand(workload.name, DemandKind.ADMIT, spec.num_slices, self._floor(workload))
            self._failed.setdefault(workload.device_type, []).append(admit)
            return
        # Optional (it can run without it): wait for capacity of this type to be released later in the round.
        self._failed.setdefault(workload.device_type, []).append(demand)

    def _start_ready(self) -> None:
        for workload in list(self.workloads.values()):
            if workload.phase is not RESTARTING:
                continue
            blocking = workload.spec.restart_strategy is RestartStrategy.BLOCKING_RECREATE
            if blocking and workload.stopping:
                continue
            if not all(self._healthy(s) for s in workload.slices):
                continue
            if len(workload.slices) < self._floor(workload):
                continue
            self._update(
                workload,
                phase=RUNNING,
                running_since=self.now,
                exited_ok=frozenset(),
                status_message=f"running on {len(workload.slices)} slice(s)",
            )
            self.actions.append(act.StartWorkers(workload.name, workload.attempt, workload.slices))

    def _drop_removed_slices(self) -> None:
        if not self.removed:
            return
        self._own("slices")
        self._own("nodes")
        for name in sorted(self.removed):
            item = self.slices.pop(name)
            for node in item.nodes:
                self.nodes.pop(node, None)
            self.unhealthy.discard(name)
            assert name not in self.holders, f"removed slice {name} is still held"

    def freeze(self) -> Snapshot:
        return Snapshot(
            now=self.now,
            slices=self.slices,
            nodes=self.nodes,
            workloads=self.workloads,
            next_seq=self.next_seq,
            next_ordinal=self.next_ordinal,
            slices_by_type=self.slices_by_type,
            holders=self.holders,
            unhealthy=frozenset(self.unhealthy),
            free_by_type={
                **self._free_in,
                **{t: frozenset(names) for t, names in self._free_sets.items()},
            },
            class_members={
                **self._members_in,
                **{k: frozenset(names) for k, names in self._member_sets.items()},
            },
            class_held=self.class_held,
        )


def _fill_positions(
    previous: tuple[str, ...], kept: tuple[str, ...], got: tuple[str, ...]
) -> tuple[str, ...]:
    """Keep each surviving slice at its replica index; replacements take the lost indices."""
    kept_set = set(kept)
    replacements = iter(got)
    slices: list[str] = []
    for name in previous:
        if name in kept_set:
            slices.append(name)
        else:
            nxt = next(replacements, None)
            if nxt is not None:
                slices.append(nxt)
    slices.extend(replacements)
    return tuple(slices)
