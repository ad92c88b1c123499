"""A discrete-event simulation of one policy: a heap of events and a virtual clock.

The simulator decides nothing itself. Every scheduling decision comes from
:func:`hotswap.core.scheduler.decide`, the same function the local backend and the Kubernetes
controller call; the simulator only plays the world around it: nodes fail and are repaired,
workers take time to start, restore and stop, training makes progress and checkpoints, jobs
finish. It accounts every slice-second in a :class:`hotswap.core.goodput.Ledger`.

Events are processed per instant: every timer due at the same time fires, then the core decides
once. Only what the core must act on at once is a round of its own; what it only needs to
know (a finished job's deletion, a job's checkpoint schedule, old workers of a Recreate
workload having stopped) travels with the next round.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import gc
import heapq
import itertools
import math
from collections.abc import Callable

from hotswap.api.phases import WorkloadPhase
from hotswap.core import events as ev
from hotswap.core.goodput import Category
from hotswap.core.effects import ActionEffect, Outcome, Placement, effect_of
from hotswap.core.model import Snapshot
from hotswap.core.policy import SchedulerConfig
from hotswap.core.round_state import BLOCKING_RECREATE
from hotswap.core.scheduler import decide
from hotswap.sim import mix
from hotswap.sim.config import SimConfig
from hotswap.sim.jobs import DONE, QUEUED, RECONFIGURING, RUNNING, STARTING, WAITING, Job, Mode


@dataclasses.dataclass
class Counts:
    """What a run counted."""

    preemptions: int = 0
    failures: int = 0
    disruptions: int = 0  # failures that hit a job
    completed: int = 0
    decisions: int = 0
    events: int = 0  # timers fired
    main_restarts: int = 0  # restarts of the main job's workers (hotswap, repair, requeue)
    main_reconfigurations: int = 0  # elastic scale-downs and scale-ups of the main job
    preemption_lost_s: float = 0.0  # slice-seconds of progress preempted jobs threw away


@dataclasses.dataclass
class PolicyResult:
    policy: str
    config: SimConfig
    jobs: dict[str, Job]
    mttr: list[tuple[str, float]]  # (job, seconds from a failure under it to progress again)
    counts: Counts


class _Timer(enum.Enum):
    ARRIVAL = 0
    FAILURE = 1
    REPAIR = 2
    READY = 3
    RECONFIGURED = 4
    FINISHED = 5
    STOPPED = 6
    JOINED = 7


# As module constants: enum member reads are slow on Python 3.11 (see hotswap.core.admission).
_ARRIVAL, _FAILURE, _REPAIR, _READY = _Timer.ARRIVAL, _Timer.FAILURE, _Timer.REPAIR, _Timer.READY
_RECONFIGURED, _FINISHED, _STOPPED, _JOINED = _Timer.RECONFIGURED, _Timer.FINISHED, _Timer.STOPPED, _Timer.JOINED
_WASTED = Category.WASTED_PROGRESS
_PLACE, _SHRINK, _GROW = Placement.PLACE, Placement.SHRINK, Placement.GROW  # (enum member reads are slow on 3.11)
_COMPLETED = Outcome.COMPLETED
_COLLECT_EVERY = 1000  # decisions between runs of the cyclic garbage collector (see run)


class PolicySimulation:
    def __init__(
        self,
        config: SimConfig,
        policy: str,
        scheduler: SchedulerConfig,
        failures: list[tuple[float, str]],
        fillers: mix.FillerMix | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        self.scheduler = scheduler
        self.fillers = fillers or mix.FillerMix(config)
        self.now = 0.0
        self.heap: list[tuple[float, int, _Timer, tuple]] = []
        self._seq = itertools.count()
        self.jobs: dict[str, Job] = {}
        self.response = _JobResponse(self)
        # Sent with the next round: deletions of finished jobs, and the checkpoint schedule of
        # jobs that started making progress (they save every checkpoint_interval_s from then on).
        self.later_events: list[ev.Event] = []
        self.stop_timers: set[tuple[str, int]] = set()  # attempts told to stop, until they are gone
        # Stops the core only needs to know about, not act on at once (see _decide): (when, event).
        self.later_stops: collections.deque[tuple[float, ev.WorkersStopped]] = collections.deque()
        self.mttr: list[tuple[str, float]] = []
        self.counts = Counts(failures=len(failures))
        slices = [ev.SliceAdded(s, config.device_type, mix.nodes_of(s, config)) for s in mix.slice_names(config)]
        self.snapshot = decide(Snapshot.build(), slices, 0.0, scheduler, consume=True).snapshot
        # Failures enter the heap one at a time (each brings its repair and the next failure):
        # a heap of the few live timers instead of every failure of the run.
        self._failures = iter(failures)
        self._next_failure()
        self._at(0.0, _ARRIVAL, (None, 0))
        for stream in range(mix.filler_streams(config)):
            self._at(0.0, _ARRIVAL, (stream, 0))

    # ------------------------------------------------------------------ event loop

    def _at(self, time: float, kind: _Timer, payload: tuple) -> None:
        heapq.heappush(self.heap, (time, next(self._seq), kind, payload))

    def _next_failure(self) -> None:
        failure = next(self._failures, None)
        if failure is not None:
            self._at(failure[0], _FAILURE, (failure[1],))

    def run(self, progress: Callable[[float], None] | None = None) -> PolicyResult:
        # The cyclic collector would scan the cluster's records (nodes, slices, snapshots) over
        # and over: ~8 % of a run at 16,384 nodes. Rounds make no reference cycles, so it runs
        # only every _COLLECT_EVERY decisions, over the young generations, with what existed
        # before the run (the first snapshot included) frozen out of its way.
        # (A caller that froze objects itself, say before forking, keeps them frozen.)
        enabled, freeze = gc.isenabled(), gc.get_freeze_count() == 0
        if freeze:
            gc.freeze()
        gc.disable()
        try:
            return self._run(progress)
        finally:
            if freeze:
                gc.unfreeze()
            if enabled:
                gc.enable()

    def _run(self, progress: Callable[[float], None] | None) -> PolicyResult:
        end = self.config.duration_s
        report_every = end / 200.0
        next_report = report_every
        heap = self.heap
        while heap and heap[0][0] <= end:
            time = heap[0][0]
            self.now = time
            core_events: list[ev.Event] = []
            # Take every timer due at this instant, then decide once.
            while heap and heap[0][0] == time:
                _, _, kind, payload = heapq.heappop(heap)
                self.counts.events += 1
                core_events.extend(self._fire(kind, payload))
            if core_events:
                self._decide(core_events)
                if self.counts.decisions % _COLLECT_EVERY == 0:
                    gc.collect(1)
            if progress is not None and time >= next_report:
                progress(time / end)
                next_report = time + report_every
        self.now = end
        for job in self.jobs.values():
            job.account(self.now, self.config)
        if progress is not None:
            progress(1.0)
        return PolicyResult(self.policy, self.config, self.jobs, self.mttr, self.counts)

    def _fire(self, kind: _Timer, payload: tuple) -> list[ev.Event]:
        if kind is _ARRIVAL:
            stream, index = payload
            return [self._arrive(stream, index)]
        if kind is _FAILURE:
            (node,) = payload
            self._at(self.now + self.config.repair_s, _REPAIR, (node,))
            self._next_failure()
            self._note_disruption(node)
            return [ev.NodeFailed(node)]
        if kind is _REPAIR:
            return [ev.NodeRepaired(payload[0])]
        if kind is _FINISHED:
            return self._finish_due(self.jobs[payload[0]])
        if kind is _STOPPED:
            name, attempt = payload
            self.stop_timers.discard((name, attempt))
            return [ev.WorkersStopped(name, attempt)]
        name, version = payload
        job = self.jobs.get(name)
        if job is not None and kind is _JOINED:
            if job.join_token == version:
                self._join(job)
            return []
        if job is None or job.version != version:
            return []  # a timer of a mode the job has since left
        if kind is _READY or kind is _RECONFIGURED:
            self._set_mode(job, RUNNING)
            return []
        raise AssertionError(kind)

    def _decide(self, events: list[ev.Event]) -> None:
        later = self.later_stops
        while later and later[0][0] <= self.now:
            stopped = later.popleft()[1]
            self.stop_timers.discard((stopped.workload, stopped.attempt))
            events.append(stopped)
        events = self.later_events + events
        self.later_events = []
        # The simulation never looks back at an older snapshot: the round may change it in place.
        decision = decide(self.snapshot, events, self.now, self.scheduler, consume=True)
        self.counts.decisions += 1
        self.snapshot = decision.snapshot
        respond = self.response.enact
        for action in decision.actions:
            job = self.jobs.get(action.workload)
            if job is not None:
                respond(job, effect_of(action))
        # Workers told to stop are gone stop_s later (they save a checkpoint on SIGTERM first).
        # Only a BlockingRecreate workload waits for that to start again, so only its stop is a
        # timer of its own; the others are reported with the first round after it (the core
        # decides the same either way, with a round less per stop).
        gone_at = self.now + self.config.stop_s
        workloads = self.snapshot.workloads
        for action in decision.actions:
            workload = workloads.get(action.workload)
            if workload is None or not workload.stopping:
                continue
            blocking = workload.spec.restart_strategy is BLOCKING_RECREATE
            for attempt in workload.stopping:
                if (workload.name, attempt) not in self.stop_timers:
                    self.stop_timers.add((workload.name, attempt))
                    if blocking:
                        self._at(gone_at, _STOPPED, (workload.name, attempt))
                    else:
                        self.later_stops.append((gone_at, ev.WorkersStopped(workload.name, attempt)))

    # ------------------------------------------------------------------ the world

    def _arrive(self, stream: int | None, index: int) -> ev.Event:
        if stream is None:
            spec = mix.main_spec(self.config)
            job = Job.of(spec, math.inf)
        else:
            filler = self.fillers.job(stream, index)
            spec = filler.spec()
            job = Job.of(spec, filler.work_s, stream, index)
        job.mode_since = job.last = job.arrived = self.now
        self.jobs[job.name] = job
        return ev.WorkloadCreated(spec)

    def _note_disruption(self, node: str) -> None:
        slice_ = self.snapshot.nodes[node].slice
        holder = self.snapshot.holders.get(slice_)
        if holder is None or slice_ in self.snapshot.unhealthy:
            return
        job = self.jobs[holder]
        if job.mode in (STARTING, RUNNING, RECONFIGURING, WAITING):
            self.counts.disruptions += 1
            if job.disrupted_at is None:
                job.disrupted_at = self.now

    def _set_mode(self, job: Job, mode: Mode) -> None:
        job.account(self.now, self.config)
        previous = job.mode
        job.mode = mode
        job.mode_since = self.now
        job.version += 1
        if mode is STARTING:
            restore = self.config.restore_s if job.progress > 0 else 0.0
            self._at(self.now + self.config.startup_s + restore, _READY, (job.name, job.version))
        elif mode is RECONFIGURING:
            self._at(self.now + self.config.elastic_reconfigure_s, _RECONFIGURED, (job.name, job.version))
        elif mode is RUNNING:
            if previous is STARTING:
                job.start_progress(self.now)
                # Its state as restored counts as saved; periodic saves follow from here.
                every = self.config.checkpoint_interval_s
                self.later_events.append(ev.CheckpointRecorded(job.name, int(job.progress), self.now, every))
            if job.disrupted_at is not None:
                self.mttr.append((job.name, self.now - job.disrupted_at))
                job.disrupted_at = None
            self._schedule_finish(job)

    def _retire(self, job: Job) -> None:
        if job.mode is not DONE:  # e.g. the Remove that follows a Complete
            job.retire(self.now, self.config)

    def _join(self, job: Job) -> None:
        job.account(self.now, self.config)
        job.active += job.joining
        job.joining = 0
        self._set_mode(job, RECONFIGURING)

    def _schedule_finish(self, job: Job) -> None:
        if math.isinf(job.work_s) or job.active == 0:
            return
        useful = 1.0 - self.config.checkpoint_block_s / self.config.checkpoint_interval_s
        rate = job.active / job.size * useful
        left = max(0.0, job.work_s - job.progress)
        job.finish_at = finish = self.now + left / rate
        # One timer per job: a job re-enters RUNNING at every elastic change, and a timer per
        # entry would fill the heap with stale ones. Only an earlier finish needs a new timer;
        # a later one is scheduled when the pending timer comes (_finish_due).
        if job.finish_timer is None or job.finish_timer > finish:
            job.finish_timer = finish
            self._at(finish, _FINISHED, (job.name,))

    def _finish_due(self, job: Job) -> list[ev.Event]:
        """A job's finish timer: it finishes now if it ran on since it was due to finish now."""
        if job.finish_timer != self.now:
            return []  # superseded by an earlier timer
        job.finish_timer = None
        if job.mode is not RUNNING:
            return []  # it stopped; its next start schedules its finish again
        if job.finish_at != self.now:  # slowed down since this timer was set
            job.finish_timer = job.finish_at
            self._at(job.finish_at, _FINISHED, (job.name,))
            return []
        return self._finish(job)

    def _finish(self, job: Job) -> list[ev.Event]:
        workload = self.snapshot.workloads[job.name]
        if workload.phase is not WorkloadPhase.RUNNING:
            return []
        job.account(self.now, self.config)
        return [ev.AttemptSucceeded(job.name, workload.attempt)]


class _JobResponse:
    """What the simulated world does when the core acts on a job: it enacts the action's
    :class:`~hotswap.core.effects.ActionEffect` (the job's workers start, stop, or re-form).
    One per simulation: the hot path allocates nothing but the effect."""

    __slots__ = ("sim",)

    def __init__(self, simulation: PolicySimulation) -> None:
        self.sim = simulation

    def enact(self, job: Job, effect: ActionEffect) -> None:
        main = job.stream is None
        placement = effect.placement
        if effect.outcome is not None:
            self._end(job, effect.outcome is _COMPLETED)
        elif placement is _SHRINK:
            self._shrink(job, effect, main)
        elif placement is _GROW:
            self._grow(job, effect, main)
        elif effect.replaced or effect.preemption:
            # The simulator injects only node failures, so every replacement follows a hard stop.
            sim = self.sim
            if not effect.graceful:
                sim.counts.main_restarts += main
            if effect.preemption:
                sim.counts.preemptions += 1
                # A victim saves on SIGTERM unless the config says it cannot (then it loses the
                # progress since its last checkpoint: what the choice of victims decides).
                wasted = job.ledger.seconds[_WASTED]
                job.stop(sim.now, sim.config, not (effect.graceful and sim.config.preemption_saves))
                sim.counts.preemption_lost_s += job.ledger.seconds[_WASTED] - wasted
            else:
                job.stop(sim.now, sim.config, not effect.graceful)
            if placement is _PLACE:
                self._start(job, effect)
            else:
                job.active = 0
                sim._set_mode(job, QUEUED)
        elif effect.replicas:
            self._start(job, effect)

    def _start(self, job: Job, effect: ActionEffect) -> None:
        job.active = len(effect.replicas)
        self.sim._set_mode(job, WAITING if effect.held else STARTING)

    def _shrink(self, job: Job, effect: ActionEffect, main: bool) -> None:
        # Survivors keep running. After a failure they go back to their last in-memory snapshot;
        # a shrink that gives slices to higher-priority work is coordinated and loses nothing.
        sim = self.sim
        sim.counts.main_reconfigurations += main
        if effect.graceful:
            job.account(sim.now, sim.config)
        else:
            job.lose_slices(sim.now, sim.config)
        active = len(effect.generation or ())
        job.joining = max(0, min(job.joining, active - job.active))
        job.active = min(job.active, active - job.joining)
        if job.mode in (RUNNING, RECONFIGURING):
            sim._set_mode(job, RECONFIGURING)

    def _grow(self, job: Job, effect: ActionEffect, main: bool) -> None:
        # New workers start first; they join (and everyone re-forms) once they are up.
        sim = self.sim
        sim.counts.main_reconfigurations += main
        job.account(sim.now, sim.config)
        active = len(effect.generation or ())
        if job.mode in (STARTING, WAITING, QUEUED):
            job.active = active
        else:
            job.joining = active - job.active
            job.join_token += 1
            sim._at(sim.now + sim.config.startup_s, _JOINED, (job.name, job.join_token))

    def _end(self, job: Job, completed: bool) -> None:
        sim = self.sim
        sim._retire(job)
        if not completed:
            return
        sim.later_events.append(ev.WorkloadDeleted(job.name))
        sim.counts.completed += 1
        if job.stream is not None:
            think = sim.fillers.job(job.stream, job.index).think_s
            sim._at(sim.now + think, _ARRIVAL, (job.stream, job.index + 1))
