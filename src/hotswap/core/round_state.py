"""The working state of one decision round, and the workload transitions its steps share.

A round applies events (:mod:`hotswap.core.apply_events`), handles lost capacity
(:mod:`hotswap.core.losses`) and serves demands for slices (:mod:`hotswap.core.admission`);
all of them change workloads through :class:`RoundState`, which keeps the capacity indexes in
step, checks every phase transition and records the actions.
"""

from __future__ import annotations

from collections.abc import Iterable

from hotswap.api.phases import check_transition
from hotswap.api.spec import RestartStrategy
from hotswap.core import actions as act
from hotswap.core.capacity import Capacity
from hotswap.core.cow import Overlay, Owned
from hotswap.core.demands import Demand, DemandQueue
from hotswap.core.index import QUEUED, RESTARTING, RUNNING, WorkloadIndex
from hotswap.core.model import Snapshot
from hotswap.core.placement import kept_map, shrink_map
from hotswap.core.workload import Workload, replace_workload
from hotswap.core.policy import SchedulerConfig

# As a constant: enum member reads are slow on Python 3.11 (see hotswap.core.admission).
BLOCKING_RECREATE = RestartStrategy.BLOCKING_RECREATE
# Fields of a workload that no index of hotswap.core.index reads: changing only these does not
# move it in any index.
_UNINDEXED = frozenset(
    {"attempt", "stopping", "membership", "restarts", "disruptions", "preemptions", "last_checkpoint_step",
     "exited_ok", "status_message", "status_time", "replicas"}
)


class RoundState:
    """Mutable state of one round; frozen into the next Snapshot at the end."""

    def __init__(self, snapshot: Snapshot, now: float, config: SchedulerConfig, consume: bool = False) -> None:
        self.now = now
        self.config = config
        self.actions: list[act.Action] = []
        self.needs_scheduling = False
        # consume: the caller gave the snapshot up, the round changes it in place (see decide).
        self.workloads: Overlay[str, Workload] | Owned = (Owned.of if consume else Overlay)(snapshot.workloads)
        self.index = WorkloadIndex(snapshot.index, consume)
        self.next_seq = snapshot.next_seq
        self.capacity = Capacity(snapshot, self.workloads, consume)
        # What demands can get (demands.Room): the capacity's own answers, asked thousands of
        # times per round (bound here rather than wrapped).
        self.admissible = self.capacity.admissible
        self.free_count = self.capacity.free_count
        self.queue: DemandQueue | None = None  # while demands are served (admission)
        # Losses seen this round: workload -> {slice: reason}, in the order seen.
        self.lost: dict[str, dict[str, str]] = {}
        # Replacements wanted by workloads that lost slices, served with the other demands.
        self.replacing: dict[str, Demand] = {}
        self._workers: dict[tuple[str, int, int], int] = {}

    def freeze(self) -> Snapshot:
        return self.capacity.freeze(self.now, self.workloads.freeze(), self.next_seq, self.index.freeze())

    # ------------------------------------------------------------------ policy of a workload

    def floor(self, workload: Workload) -> int:
        """The fewest slices it runs on."""
        spec = workload.spec
        return spec.floor_slices if self.config.elastic else spec.num_slices

    def elastic(self, workload: Workload) -> bool:
        return self.config.elastic and workload.spec.elastic

    def workers_of(self, workload: Workload) -> int:
        """Workers (hosts) on the slices a workload holds (counted once per round: a job's
        completion is one report per worker)."""
        key = (workload.name, workload.attempt, workload.membership)
        count = self._workers.get(key)
        if count is None:
            slices = self.capacity.slices
            count = self._workers[key] = sum(len(slices[s].nodes) for s in workload.slices)
        return count

    # ------------------------------------------------------------------ transitions

    def update(self, workload: Workload, **changes: object) -> Workload:
        """Replace a workload's record; the phase transition is checked, indexes follow."""
        if "status_message" in changes and changes["status_message"] != workload.status_message:
            changes.setdefault("status_time", self.now)
        new = replace_workload(workload, changes)
        if new.phase is not workload.phase or "phase" in changes:
            check_transition(workload.phase, new.phase)
        self.workloads[new.name] = new
        if not _UNINDEXED.issuperset(changes):
            self.index.replace(workload, new)
        return new

    def add(self, workload: Workload) -> None:
        """A new workload (created in this round)."""
        self.workloads[workload.name] = workload
        self.index.replace(None, workload)

    def remove(self, workload: Workload) -> None:
        """A workload leaves (deleted); its slices must have been released."""
        del self.workloads[workload.name]
        self.index.replace(workload, None)

    def release(self, workload: Workload, names: Iterable[str]) -> None:
        """Free slices; healthy ones go back to the free pool and wake up waiting demands."""
        if self.capacity.release(workload, names) and self.queue is not None:
            self.queue.wake(workload.device_type)

    def mark_lost(self, slice_name: str, reason: str) -> None:
        """The slice is unhealthy; its holder (if any) has lost it for ``reason``."""
        self.capacity.mark_unhealthy(slice_name)
        holder = self.capacity.holders.get(slice_name)
        if holder is not None:
            self.lost.setdefault(holder, {}).setdefault(slice_name, reason)

    def stopping_after_stop(self, workload: Workload) -> frozenset[int]:
        """Attempts still alive once the current one is told to stop."""
        if workload.phase is RUNNING:
            return workload.stopping | {workload.attempt}
        return workload.stopping

    def restart_in_place(self, workload: Workload, reason: str, charged: bool, wait_for_repair: bool = False) -> None:
        """Restart every worker on the slices the workload holds now, replica i on slices[i].

        The new workers start at once, unless BlockingRecreate makes them wait for the old ones
        to stop or ``wait_for_repair`` for the workload's broken slices to be repaired.
        """
        blocking = workload.spec.restart_strategy is BLOCKING_RECREATE
        waiting = blocking or wait_for_repair
        attempt = workload.attempt + 1
        self.update(
            workload,
            phase=RESTARTING if waiting else RUNNING,
            replicas=None,
            attempt=attempt,
            stopping=self.stopping_after_stop(workload),
            restarts=workload.restarts + (1 if charged else 0),
            running_since=None if waiting else self.now,
            exited_ok=frozenset(),
            status_message=f"restarting: {reason}" if waiting else f"restarted: {reason}",
        )
        self.actions.append(
            act.Restart(workload.name, attempt, workload.slices, reason, charged, start=not waiting)
        )
        self.needs_scheduling = True

    def requeue(self, workload: Workload, reason: str) -> None:
        """Stop the workload and put it back in the queue without its slices."""
        self.release(workload, workload.slices)
        self.update(
            workload,
            phase=QUEUED,
            slices=(),
            replicas=None,
            stopping=self.stopping_after_stop(workload),
            running_since=None,
            exited_ok=frozenset(),
            status_message=f"requeued: {reason}",
        )
        self.actions.append(act.Requeue(workload.name, reason))

    def scale_down(
        self, workload: Workload, keep: tuple[str, ...], gone: tuple[str, ...], reason: str, preemptor: str | None = None
    ) -> Workload:
        """An elastic workload goes on without ``gone``; survivors keep running, and their
        replica indexes (those of ``gone`` are parked)."""
        self.release(workload, gone)
        membership = workload.membership + 1
        left = set(gone)
        exited = workload.exited_ok
        replicas, parked = shrink_map(workload.replica_map, gone)
        workload = self.update(
            workload,
            slices=keep,
            replicas=kept_map(replicas, keep),
            membership=membership,
            exited_ok=frozenset(k for k in exited if k[0] not in left) if exited else exited,
            status_message=f"scaled down to {len(keep)} slice(s): {reason}",
        )
        self.actions.append(act.ScaleDown(workload.name, gone, keep, membership, reason, replicas, parked, preemptor))
        return workload
