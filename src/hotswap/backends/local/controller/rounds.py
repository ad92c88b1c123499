"""One decision round of the local controller: decide, commit the decision with everything it
implies in one transaction, then act on the workers (kills, stops, starts) — in that order, so a
controller killed at any moment leaves the database saying what is still to do.

:class:`RoundRunner` is given its collaborators (``assembly.py`` builds them), so a round can be
run against fakes of them, without a daemon."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from hotswap.api.launch import Launch
from hotswap.backends.kit.figures import RecoveryFigures
from hotswap.backends.local import protocol, timeline, workload_files
from hotswap.backends.local.controller import enactment as effects
from hotswap.backends.local.claim import Claim
from hotswap.backends.local.controller.gpu_health import GpuHealthMonitor
from hotswap.backends.local.crash_points import crash_at
from hotswap.backends.local.controller.round_inputs import RoundInputs
from hotswap.backends.local.controller.server import RequestServer
from hotswap.backends.local.controller.state import ClusterState, Inbox, scheduler_config
from hotswap.backends.local.controller.enactment import Launcher
from hotswap.backends.local.workers.supervisor import WorkerLaunch
from hotswap.backends.local.tables import LocalStore, Request, WorkerRow
from hotswap.backends.local.workers.lifecycle import Workers
from hotswap.core import events as ev
from hotswap.core.effects import Outcome as WorkloadOutcome, effects_of
from hotswap.core.model import Snapshot
from hotswap.core.workload import Workload
from hotswap.core.scheduler import decide
from hotswap.store.codec import workload_to_json


class Withdrawn(Exception):
    """The request was withdrawn by its submitter before this round could commit it."""


@dataclasses.dataclass
class Outcome:
    """How a served request ends: its status and the message its submitter reads."""

    status: str = protocol.DONE
    message: str = ""


class RoundRunner:
    """The rounds of one cluster's controller. It decides on the inbox's events and a request's
    inputs, commits with the cluster's store (after checking its claim), replaces the state,
    answers the request on the socket, then acts on the workers (new ones built by the
    launcher); a resize that changes the GPUs behind the slices is told to the GPU health
    monitor. ``figures``: Prometheus', when served."""

    def __init__(
        self,
        store: LocalStore,
        claim: Claim,
        state: ClusterState,
        inbox: Inbox,
        workers: Workers,
        launcher: Launcher,
        server: RequestServer,
        health: GpuHealthMonitor,
        figures: RecoveryFigures | None = None,
    ) -> None:
        self.store = store
        self.claim = claim
        self.state = state
        self.inbox = inbox
        self.workers = workers
        self.launcher = launcher
        self.server = server
        self.health = health
        self.figures = figures

    def run(self, inputs: RoundInputs, request: Request | None = None) -> None:
        """Decide, commit the decision with everything it implies, then act (see
        :class:`~hotswap.backends.local.controller.round_inputs.RoundInputs` for what a request adds)."""
        now, began = time.time(), time.perf_counter()
        events = self.inbox.events + inputs.events
        old, settings, hit = self.state.snapshot, inputs.settings, inputs.hit
        config = scheduler_config(settings) if settings is not None else self.state.config
        self.launcher.publish_committed()  # drops what a round that rolled back had staged
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
            if settings is not None:
                self.store.update_cluster(self.state.record_with(settings))
            if inputs.created is not None:
                self._register_created(events, old, new, inputs.created)
            self.store.save_snapshot(old, new)
            for entry in timeline.input_entries(events, old, new, now):
                self.store.record_event(now, *entry)
            for effect in decided:
                name = effect.action.workload
                if effect.rejection is not None and inputs.created is not None:
                    outcome = Outcome(protocol.REJECTED, f"workload {name} {effect.message}")
                self.store.record_event(now, *timeline.action_entry(effect, old, new))
                workload = new.workloads.get(name) or old.workloads.get(name)
                if workload is None:
                    continue
                if effect.outcome is WorkloadOutcome.FAILED:  # before its workers get SIGTERM and save
                    self._record_failed_run(workload, now)
                plan = effects.plan(effect, workload, self.workers.live(workload.name, workload.seq))
                self.workers.mark_stopping(plan.stop, now)
                to_stop += plan.stop
                to_start += self.launcher.launches(workload, plan, new)
            self.workers.mark_stopping(hit, now, grace_s=0.0 if inputs.kill else None)
            started = [self.workers.add(launch, now) for launch in to_start if still_wanted(launch, new)]
            exits = self.workers.stops.commit_exits()
            if request is not None:
                self.store.requests.finish(request.id, outcome.status, outcome.message)
        crash_at("committed")  # (test-only: see crash_points.py)
        self.workers.stops.exits_committed(exits)
        self.inbox.decided()
        backing = self.state.backing
        self.state.committed(new, settings)
        self.launcher.publish_committed()  # the new generations, to the workers, before any signal
        if self.state.backing != backing:  # a resize changed the GPUs behind the slices
            self.health.watch(self.state.backing)
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

    def commit_exits(self) -> None:
        """Commit the worker exits that no round decides on (a deleted workload's workers)."""
        with self.store.transaction():
            written = self.workers.stops.commit_exits()
        self.workers.stops.exits_committed(written)

    def _record_failed_run(self, workload: Workload, now: float) -> None:
        """Mark the run of a workload this round ended failed in its checkpoint directory (a
        hang kill, or the stop of a failed attempt's other workers, is a SIGTERM: their save says
        resume), so the next ``workload create`` of its name starts fresh; said in its timeline
        if it cannot be."""
        launch = self.store.launches.get(workload.name)
        if launch.run is None:  # a workload of a release without runs: its checkpoints are never resumed
            return
        problem = workload_files.record_run_failed(Path(launch.checkpoint_dir))
        if problem is not None:
            message = f"{problem}: a later run of this name may resume this failed run's checkpoint; create it with --fresh"
            self.store.record_event(now, "warning", message, workload.name, workload.seq)

    def _register_created(self, inputs: list[ev.Event], old: Snapshot, new: Snapshot, launch: Launch) -> None:
        """Store the launch record of a workload this round created (before its record)."""
        for event in inputs:
            if isinstance(event, ev.WorkloadCreated) and event.spec.name in new.workloads:
                created = new.workloads[event.spec.name]
                if old.workloads.get(event.spec.name) is not created:
                    self.store.launches.add(event.spec.name, workload_to_json(created), launch)


def still_wanted(launch: WorkerLaunch, snapshot: Snapshot) -> bool:
    """Whether a start a round planned still stands once the round's every action is applied
    (``snapshot``: the round's result). A later action of the same round may have preempted,
    restarted again or moved the workload (a worker's exit restarts it, then a higher priority
    takes its slice), and that action's stops see only the workers already recorded, never the
    starts planned before it: such a start would run a queued workload on a slice another holds."""
    workload = snapshot.workloads.get(launch.identity.workload)
    return (
        workload is not None
        and workload.seq == launch.identity.seq
        and workload.attempt == launch.identity.attempt
        and workload.phase.holds_slices
        and launch.identity.slice in workload.slices
    )
