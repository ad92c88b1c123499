"""One decision round of the local controller: decide, commit the decision with everything it
implies in one transaction, then act on the workers (kills, stops, starts) — in that order, so a
controller killed at any moment leaves the database saying what is still to do."""

from __future__ import annotations

import dataclasses
import time

from hotswap.api.launch import Launch
from hotswap.backends.kit.figures import RecoveryFigures
from hotswap.backends.local import protocol, timeline
from hotswap.backends.local.controller import enactment as effects
from hotswap.backends.local.claim import Claim
from hotswap.backends.local.controller.gpu_health import GpuHealthMonitor
from hotswap.backends.local.crash_points import crash_at
from hotswap.backends.local.controller.requests import RoundInputs
from hotswap.backends.local.controller.server import RequestServer
from hotswap.backends.local.controller.enactment import Launcher
from hotswap.backends.local.gpu.backing import Backing
from hotswap.backends.local.protocol import RequestKind
from hotswap.backends.local.workers.supervisor import WorkerLaunch
from hotswap.backends.local.tables import LocalStore, Request, WorkerRow
from hotswap.backends.local.workers.lifecycle import Workers
from hotswap.core import events as ev
from hotswap.core.effects import effects_of
from hotswap.core.model import Snapshot
from hotswap.core.policy import SchedulerConfig
from hotswap.core.scheduler import decide
from hotswap.core.workload import Workload
from hotswap.store.codec import workload_to_json
from hotswap.store.state import ClusterRecord


class Withdrawn(Exception):
    """The request was withdrawn by its submitter before this round could commit it."""


@dataclasses.dataclass
class Outcome:
    """How a served request ends: its status and the message its submitter reads."""

    status: str = protocol.DONE
    message: str = ""


class RoundRunner:
    """The round, and the controller's state it reads and replaces (set by
    :meth:`~hotswap.backends.local.controller.loop.LocalController.start`)."""

    claim: Claim | None
    store: LocalStore
    cluster: ClusterRecord
    config: SchedulerConfig
    backing: Backing | None  # None: an emulated cluster
    snapshot: Snapshot
    pending_events: list[ev.Event]
    figures: RecoveryFigures | None
    server: RequestServer
    workers: Workers
    launcher: Launcher
    health: GpuHealthMonitor

    # ------------------------------------------------------------------ one decision round

    def _worker_exited(self, row: WorkerRow, code: int, lost: str | None) -> None:
        """A worker's exit as the core's events (for the next round); ``lost``: why hotswap lost
        it (the core restarts the workload without charging it), None: the code is judged."""
        who = row.identity
        if row.state != "stopping" and lost is not None:
            self.pending_events.append(ev.WorkerLost(who.workload, who.attempt, who.slice, who.host, lost))
        elif row.state != "stopping":
            # A worker told to stop (preempted, restarted, scaled away, drained) ends as asked:
            # its exit code says nothing about the workload and is never judged.
            self.pending_events.append(ev.WorkerExited(who.workload, who.attempt, who.slice, who.host, code))
        workload = self.snapshot.workloads.get(who.workload)
        if workload is not None and workload.seq == who.seq:
            if not self.workers.live(who.workload, who.seq, who.attempt):
                self.pending_events.append(ev.WorkersStopped(who.workload, who.attempt))

    def _round(self, inputs: RoundInputs, request: Request | None) -> None:
        """Decide, commit the decision with everything it implies, then act (see
        :class:`~hotswap.backends.local.controller.requests.RoundInputs` for what a request adds)."""
        assert self.claim is not None
        now, began = time.time(), time.perf_counter()
        events = self.pending_events + inputs.events
        old, cluster, hit = self.snapshot, inputs.cluster, inputs.hit
        config = scheduler_config(cluster) if cluster is not None else self.config
        decision = decide(old, events, now, config)
        new = decision.snapshot
        decided = effects_of(decision.actions)  # once per action: the timeline, the workers and the figures read it
        outcome = Outcome()
        to_start: list[WorkerLaunch] = []
        to_stop: list[WorkerRow] = []
        with self.store.transaction():
            self.claim.verify()  # under the database's write lock: nobody else acts meanwhile
            if request is not None and not self.store.requests.is_pending(request.id):
                raise Withdrawn()
            if cluster is not None:
                self.store.update_cluster(cluster)
            if request is not None:
                self._register_created(events, old, new, request)
            self.store.save_snapshot(old, new)
            for entry in timeline.input_entries(events, old, new, now):
                self.store.record_event(now, *entry)
            for effect in decided:
                name = effect.action.workload
                if effect.rejection is not None and request is not None and request.kind == RequestKind.CREATE:
                    outcome = Outcome(protocol.REJECTED, f"workload {name} {effect.message}")
                self.store.record_event(now, *timeline.action_entry(effect, old, new))
                workload = new.workloads.get(name) or old.workloads.get(name)
                if workload is None:
                    continue
                plan = effects.plan(effect, workload, self.workers.live(workload.name, workload.seq))
                self.workers.mark_stopping(plan.stop, now)
                to_stop += plan.stop
                to_start += self.launcher.launches(workload, plan, new)
            self.workers.mark_stopping(hit, now, grace_s=0.0 if inputs.kill else None)
            started = [self.workers.add(launch, now) for launch in to_start]
            exits = self.workers.commit_exits()
            if request is not None:
                self.store.requests.finish(request.id, outcome.status, outcome.message)
        crash_at("committed")  # (test-only: see crash_points.py)
        self.workers.exits_committed(exits)
        self.pending_events = []
        self.snapshot = new
        if cluster is not None:
            self.cluster, self.config = cluster, config
            backing = Backing.of(cluster.settings)
            if backing != self.backing:
                self.backing = backing
                self.health.watch(backing)
        if request is not None:
            self.server.answer(request.id)  # committed: the caller may go on
        # Effects only after the commit: a crash from here on is repaired by recovery. Kills
        # first, then stops: they free the CPU the new workers are about to need.
        killed = {row.id for row in hit} if inputs.kill else set()
        self.workers.kill(row for row in hit if row.id in killed)
        self.workers.terminate(row for row in {r.id: r for r in to_stop + hit}.values() if row.id not in killed)
        if started:
            crash_at("before-spawn")
        self.workers.spawn(started)
        if self.figures is not None:
            writes = len(started) + len({r.id for r in to_stop + hit})
            before = {name: workload.preemptions for name, workload in old.workloads.items()}
            self.figures.account_round(
                decided, before, new.workloads, new, now, seconds=time.perf_counter() - began, writes=writes
            )

    def _running(self, workload: Workload) -> int:
        """How many workers of the workload's current attempt run."""
        return sum(1 for row in self.workers.live(workload.name, workload.seq, workload.attempt) if row.pid is not None)

    def _register_created(self, inputs: list[ev.Event], old: Snapshot, new: Snapshot, request: Request) -> None:
        """Store the launch record of a workload this round created (before its record)."""
        assert request.payload is not None
        for event in inputs:
            if isinstance(event, ev.WorkloadCreated) and event.spec.name in new.workloads:
                created = new.workloads[event.spec.name]
                if old.workloads.get(event.spec.name) is not created:
                    self.store.launches.add(
                        event.spec.name, workload_to_json(created), Launch.from_dict(request.payload["launch"])
                    )

    def _commit_exits(self) -> None:
        with self.store.transaction():
            written = self.workers.commit_exits()
        self.workers.exits_committed(written)


def scheduler_config(cluster: ClusterRecord) -> SchedulerConfig:
    """The recovery policy of a cluster: hotswap and elastic unless turned off."""
    settings = cluster.settings
    return SchedulerConfig(hotswap=bool(settings.get("hotswap", True)), elastic=bool(settings.get("elastic", True)))
