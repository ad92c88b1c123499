"""A discrete-event simulation of one policy: a heap of events and a virtual clock.

The simulator decides nothing itself. Every scheduling decision comes from
:func:`hotswap.core.scheduler.decide`, the same function the local backend and the Kubernetes
controller call; the simulator only plays the world around it: nodes fail and are repaired,
workers take time to start, restore and stop, training makes progress and checkpoints, jobs
finish. It accounts every slice-second in a :class:`hotswap.core.goodput.Ledger`.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import itertools
import math
from collections.abc import Callable

from hotswap.api.phases import WorkloadPhase
from hotswap.core import actions as act
from hotswap.core import events as ev
from hotswap.core.goodput import Ledger
from hotswap.core.model import Snapshot
from hotswap.core.policy import SchedulerConfig
from hotswap.core.scheduler import decide
from hotswap.sim import mix
from hotswap.sim.config import SimConfig
from hotswap.sim.jobs import Job, Mode


@dataclasses.dataclass
class PolicyResult:
    policy: str
    ledgers: dict[str, Ledger]
    priorities: dict[str, str]
    mttr_s: list[float]
    mttr_by_priority: dict[str, list[float]]
    preemptions: int
    failures: int
    disruptions: int
    completed: int
    decisions: int
    main_timeline: list[tuple[float, int]]  # (time, slices the main job makes progress on)
    jobs: dict[str, Job]


class _Timer(enum.Enum):
    ARRIVAL = 0
    FAILURE = 1
    REPAIR = 2
    READY = 3
    RECONFIGURED = 4
    FINISHED = 5
    STOPPED = 6
    JOINED = 7


class PolicySimulation:
    def __init__(
        self,
        config: SimConfig,
        policy: str,
        scheduler: SchedulerConfig,
        failures: list[tuple[float, str]],
    ) -> None:
        self.config = config
        self.policy = policy
        self.scheduler = scheduler
        self.now = 0.0
        self.heap: list[tuple[float, int, _Timer, tuple]] = []
        self._seq = itertools.count()
        self.jobs: dict[str, Job] = {}
        self.live: dict[str, Job] = {}  # jobs not done yet
        self.finished: list[ev.Event] = []  # deletions of finished jobs, sent with the next round
        self.stop_timers: set[tuple[str, int]] = set()
        self.mttr: list[tuple[str, float]] = []
        self.preemptions = 0
        self.disruptions = 0
        self.completed = 0
        self.decisions = 0
        self.failures = len(failures)
        self.main_timeline: list[tuple[float, int]] = []
        self.snapshot = Snapshot.build()
        slices = [ev.SliceAdded(s, config.device_type, mix.nodes_of(s, config)) for s in mix.slice_names(config)]
        self.snapshot = decide(self.snapshot, slices, 0.0, scheduler).snapshot
        for time, node in failures:
            self._at(time, _Timer.FAILURE, (node,))
            self._at(time + config.repair_s, _Timer.REPAIR, (node,))
        self._at(0.0, _Timer.ARRIVAL, (None, 0))
        for stream in range(mix.filler_streams(config)):
            self._at(0.0, _Timer.ARRIVAL, (stream, 0))

    # ------------------------------------------------------------------ event loop

    def _at(self, time: float, kind: _Timer, payload: tuple) -> None:
        heapq.heappush(self.heap, (time, next(self._seq), kind, payload))

    def run(self, progress: Callable[[float], None] | None = None) -> PolicyResult:
        end = self.config.duration_s
        report_every = end / 200.0
        next_report = report_every
        while self.heap and self.heap[0][0] <= end:
            time = self.heap[0][0]
            self.now = time
            core_events: list[ev.Event] = []
            # Take every timer due at this instant, then decide once.
            while self.heap and self.heap[0][0] == time:
                _, _, kind, payload = heapq.heappop(self.heap)
                core_events.extend(self._fire(kind, payload))
            if core_events:
                self._decide(core_events)
            if progress is not None and time >= next_report:
                progress(time / end)
                next_report = time + report_every
        self.now = end
        for job in self.jobs.values():
            job.account(self.now, self.config)
        if progress is not None:
            progress(1.0)
        return self._result()

    def _fire(self, kind: _Timer, payload: tuple) -> list[ev.Event]:
        if kind is _Timer.ARRIVAL:
            stream, index = payload
            return [self._arrive(stream, index)]
        if kind is _Timer.FAILURE:
            (node,) = payload
            self._note_disruption(node)
            return [ev.NodeFailed(node)]
        if kind is _Timer.REPAIR:
            return [ev.NodeRepaired(payload[0])]
        if kind is _Timer.STOPPED:
            name, attempt = payload
            return [ev.WorkersStopped(name, attempt)] if name in self.jobs else []
        name, version = payload
        job = self.jobs.get(name)
        if job is not None and kind is _Timer.JOINED:
            if job.join_token == version:
                self._join(job)
            return []
        if job is None or job.version != version:
            return []  # a timer of a mode the job has since left
        if kind is _Timer.READY:
            self._set_mode(job, Mode.RUNNING)
            return []
        if kind is _Timer.RECONFIGURED:
            self._set_mode(job, Mode.RUNNING)
            return []
        if kind is _Timer.FINISHED:
            return self._finish(job)
        raise AssertionError(kind)

    def _decide(self, events: list[ev.Event]) -> None:
        events = self._checkpoints() + self.finished + events
        self.finished = []
        decision = decide(self.snapshot, events, self.now, self.scheduler)
        self.decisions += 1
        self.snapshot = decision.snapshot
        for action in decision.actions:
            self._enact(action)
        # Workers told to stop are gone stop_s later (they save a checkpoint on SIGTERM first).
        for action in decision.actions:
            workload = self.snapshot.workloads.get(action.workload)
            if workload is None:
                continue
            for attempt in workload.stopping:
                if (workload.name, attempt) not in self.stop_timers:
                    self.stop_timers.add((workload.name, attempt))
                    self._at(self.now + self.config.stop_s, _Timer.STOPPED, (workload.name, attempt))

    def _checkpoints(self) -> list[ev.Event]:
        """Periodic checkpoints taken since the last decision, reported with the next one.

        They change no placement, only which victim loses least, so reporting them when the
        core next decides gives the same decisions as reporting each one as it happens.
        """
        reports: list[ev.Event] = []
        for name, job in self.live.items():
            if job.epoch is None or job.mode not in (Mode.RUNNING, Mode.RECONFIGURING):
                continue
            saved_at = job.last_checkpoint_time(self.now, self.config)
            if saved_at <= job.epoch:
                continue
            workload = self.snapshot.workloads.get(name)
            if workload is not None and (workload.last_checkpoint_at or -1.0) < saved_at:
                reports.append(ev.CheckpointRecorded(name, int(saved_at), saved_at))
        return reports

    # ------------------------------------------------------------------ the world

    def _arrive(self, stream: int | None, index: int) -> ev.Event:
        if stream is None:
            spec = mix.main_spec(self.config)
            job = Job(spec, math.inf)
        else:
            filler = mix.filler_job(self.config, stream, index)
            job = Job(filler.spec, filler.work_s, stream, index)
            spec = filler.spec
        job.mode_since = job.last = job.arrived = self.now
        self.jobs[spec.name] = job
        self.live[spec.name] = job
        return ev.WorkloadCreated(spec)

    def _note_disruption(self, node: str) -> None:
        slice_ = self.snapshot.nodes[node].slice
        holder = self.snapshot.holders.get(slice_)
        if holder is None or slice_ in self.snapshot.unhealthy:
            return
        job = self.jobs[holder]
        if job.mode in (Mode.STARTING, Mode.RUNNING, Mode.RECONFIGURING, Mode.WAITING):
            self.disruptions += 1
            if job.disrupted_at is None:
                job.disrupted_at = self.now

    def _set_mode(self, job: Job, mode: Mode) -> None:
        job.account(self.now, self.config)
        previous = job.mode
        job.mode = mode
        job.mode_since = self.now
        job.version += 1
        if mode is Mode.STARTING:
            restore = self.config.restore_s if job.progress > 0 else 0.0
            self._at(self.now + self.config.startup_s + restore, _Timer.READY, (job.spec.name, job.version))
        elif mode is Mode.RECONFIGURING:
            self._at(self.now + self.config.elastic_reconfigure_s, _Timer.RECONFIGURED, (job.spec.name, job.version))
        elif mode is Mode.RUNNING:
            if previous is Mode.STARTING:
                job.epoch = self.now
                job.restored = job.progress
                job.trace = [(self.now, job.progress)]
            if job.disrupted_at is not None:
                self.mttr.append((job.spec.name, self.now - job.disrupted_at))
                job.disrupted_at = None
            self._schedule_finish(job)
        if job.stream is None:
            productive = job.active if mode is Mode.RUNNING else 0
            self.main_timeline.append((self.now, productive))

    def _retire(self, job: Job) -> None:
        if job.mode is Mode.DONE:
            return  # e.g. the Remove that follows a Complete
        job.account(self.now, self.config)
        job.ended = self.now
        job.mode = Mode.DONE
        job.version += 1
        job.join_token += 1
        self.live.pop(job.spec.name, None)

    def _join(self, job: Job) -> None:
        job.account(self.now, self.config)
        job.active += job.joining
        job.joining = 0
        self._set_mode(job, Mode.RECONFIGURING)

    def _schedule_finish(self, job: Job) -> None:
        if math.isinf(job.work_s) or job.active == 0:
            return
        useful = 1.0 - self.config.checkpoint_block_s / self.config.checkpoint_interval_s
        rate = job.active / job.size * useful
        left = max(0.0, job.work_s - job.progress)
        self._at(self.now + left / rate, _Timer.FINISHED, (job.spec.name, job.version))

    def _enact(self, action: act.Action) -> None:
        job = self.jobs.get(action.workload)
        if job is not None:
            act.dispatch(action, _JobResponse(self, job))

    def _finish(self, job: Job) -> list[ev.Event]:
        workload = self.snapshot.workloads[job.spec.name]
        if workload.phase is not WorkloadPhase.RUNNING:
            return []
        job.account(self.now, self.config)
        hosts = self.config.hosts_per_slice
        return [
            ev.WorkerExited(job.spec.name, workload.attempt, s, h, 0) for s in workload.slices for h in range(hosts)
        ]

    def _result(self) -> PolicyResult:
        priorities = {name: job.spec.priority.label for name, job in self.jobs.items()}
        by_priority: dict[str, list[float]] = {}
        for name, value in self.mttr:
            by_priority.setdefault(priorities[name], []).append(value)
        return PolicyResult(
            policy=self.policy,
            ledgers={name: job.ledger for name, job in self.jobs.items()},
            priorities=priorities,
            mttr_s=[value for _, value in self.mttr],
            mttr_by_priority=by_priority,
            preemptions=self.preemptions,
            failures=self.failures,
            disruptions=self.disruptions,
            completed=self.completed,
            decisions=self.decisions,
            main_timeline=self.main_timeline,
            jobs=self.jobs,
        )


class _JobResponse:
    """What the simulated world does when the core acts on one job (an
    :class:`~hotswap.core.actions.ActionHandler`): its workers start, stop, or re-form."""

    def __init__(self, simulation: PolicySimulation, job: Job) -> None:
        self.sim = simulation
        self.job = job

    def _start(self, slices: tuple[str, ...], start: bool) -> None:
        self.job.active = len(slices)
        self.sim._set_mode(self.job, Mode.STARTING if start else Mode.WAITING)

    def _stop(self, hard: bool) -> None:
        self.job.stop(self.sim.now, self.sim.config, hard)

    def _to_queue(self) -> None:
        self.job.active = 0
        self.sim._set_mode(self.job, Mode.QUEUED)

    def on_admit(self, action: act.Admit) -> None:
        self._start(action.slices, action.start)

    def on_start_workers(self, action: act.StartWorkers) -> None:
        self._start(action.slices, start=True)

    def on_restart(self, action: act.Restart) -> None:
        # The simulator injects only node failures, so every restart follows a hard stop.
        self._stop(hard=True)
        self._start(action.slices, action.start)

    def on_preempt(self, action: act.Preempt) -> None:
        self.sim.preemptions += 1
        self._stop(hard=False)
        self._to_queue()

    def on_requeue(self, action: act.Requeue) -> None:
        self._stop(hard=True)
        self._to_queue()

    def on_scale_down(self, action: act.ScaleDown) -> None:
        # Survivors keep their state (elastic): no progress is lost, they re-form the group.
        job = self.job
        job.account(self.sim.now, self.sim.config)
        job.joining = max(0, min(job.joining, len(action.slices) - job.active))
        job.active = min(job.active, len(action.slices) - job.joining)
        if job.mode in (Mode.RUNNING, Mode.RECONFIGURING):
            self.sim._set_mode(job, Mode.RECONFIGURING)

    def on_scale_up(self, action: act.ScaleUp) -> None:
        # New workers start first; they join (and everyone re-forms) once they are up.
        job = self.job
        job.account(self.sim.now, self.sim.config)
        if job.mode in (Mode.STARTING, Mode.WAITING, Mode.QUEUED):
            job.active = len(action.slices)
        else:
            job.joining = len(action.slices) - job.active
            job.join_token += 1
            self.sim._at(self.sim.now + self.sim.config.startup_s, _Timer.JOINED, (job.spec.name, job.join_token))

    def on_complete(self, action: act.Complete) -> None:
        job = self.job
        self.sim._retire(job)
        self.sim.finished.append(ev.WorkloadDeleted(job.spec.name))
        self.sim.completed += 1
        if job.stream is not None:
            think = mix.filler_think_s(self.sim.config, job.stream, job.index)
            self.sim._at(self.sim.now + think, _Timer.ARRIVAL, (job.stream, job.index + 1))

    def on_fail(self, action: act.Fail) -> None:
        self.sim._retire(self.job)

    def on_reject(self, action: act.Reject) -> None:
        self.sim._retire(self.job)

    def on_remove(self, action: act.Remove) -> None:
        self.sim._retire(self.job)
