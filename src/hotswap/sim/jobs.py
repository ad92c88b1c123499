"""A simulated training job: its mode, its progress, and where its slice-seconds went.

Progress is piecewise linear: it changes rate only when the job's mode or size changes, which
is when :meth:`Job.account` is called. The job also remembers the progress its last durable
checkpoint and its last in-memory snapshot hold; both are taken periodically from the moment
its current workers started making progress (``epoch``), and one that falls between two calls
is found from the constant rate in between, so no history is kept.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from hotswap.api.spec import WorkloadSpec
from hotswap.core.goodput import Category, Ledger
from hotswap.sim.config import SimConfig


class Mode(enum.Enum):
    QUEUED = "queued"  # waiting in the queue, holds nothing
    WAITING = "waiting"  # holds slices, workers not started (old ones stopping, or repair)
    STARTING = "starting"  # workers started: runtime start-up, then checkpoint restore
    RUNNING = "running"  # making progress
    RECONFIGURING = "reconfiguring"  # elastic: re-forming the process group
    DONE = "done"


@dataclasses.dataclass(slots=True)
class Saved:
    """A copy of the job's state: when it was taken and how much progress it holds."""

    at: float
    progress: float


# Modes and categories as module constants: enum member reads are slow on Python 3.11 (see
# hotswap.core.admission), and a simulated month reads them millions of times.
QUEUED, WAITING, STARTING = Mode.QUEUED, Mode.WAITING, Mode.STARTING
RUNNING, RECONFIGURING, DONE = Mode.RUNNING, Mode.RECONFIGURING, Mode.DONE
_PRODUCTIVE, _SAVE, _RESTORE = Category.PRODUCTIVE, Category.CHECKPOINT_SAVE, Category.CHECKPOINT_RESTORE
_STARTUP, _QUEUED_TIME, _RECOVERY, _ELASTIC, _DEGRADED = (
    Category.STARTUP, Category.QUEUED, Category.RECOVERY, Category.ELASTIC, Category.DEGRADED
)


@dataclasses.dataclass(slots=True)
class Job:
    """A job's world-side state. Its spec lives in the core's snapshot while the job does; a
    finished job keeps only what the results read (a month at 262,144 nodes makes ~300,000)."""

    name: str
    size: int  # slices it asks for (read at every accounting)
    level: str  # its priority's label
    work_s: float
    stream: int | None = None  # filler stream, None for the main job
    index: int = 0
    arrived: float = 0.0
    ended: float | None = None
    mode: Mode = QUEUED
    mode_since: float = 0.0
    last: float = 0.0  # accounted up to here
    active: int = 0  # slices it runs on
    joining: int = 0  # slices added by a scale-up whose workers are still starting
    progress: float = 0.0  # seconds of full-size training done (not yet lost)
    epoch: float | None = None  # start of the current attempt's productive period
    checkpoint: Saved | None = None  # last durable checkpoint of this attempt (epoch: restored state)
    snapshot: Saved | None = None  # last in-memory snapshot (elastic jobs restore survivors from it)
    version: int = 0  # invalidates timers of an earlier mode
    join_token: int = 0  # invalidates the timer of an earlier scale-up
    finish_at: float = math.inf  # when it finishes if nothing changes (set when it starts running)
    finish_timer: float | None = None  # when its pending finish timer comes (one at a time)
    disrupted_at: float | None = None
    held_s: float = 0.0  # slice-seconds it held (its slices were not available to others)
    ledger: Ledger = dataclasses.field(default_factory=Ledger)

    @classmethod
    def of(cls, spec: WorkloadSpec, work_s: float, stream: int | None = None, index: int = 0) -> Job:
        return cls(spec.name, spec.num_slices, spec.priority.label, work_s, stream, index)

    def start_progress(self, now: float) -> None:
        """Its workers start making progress: the restored state counts as saved."""
        self.epoch = now
        self.checkpoint = Saved(now, self.progress)
        self.snapshot = Saved(now, self.progress)

    def account(self, now: float, config: SimConfig) -> None:
        """Book the time since ``last`` to the categories of the current mode.

        (It runs several times per simulated decision: the ledger's dict is written directly.)"""
        mode = self.mode
        dt = now - self.last
        if dt <= 0 or mode is DONE:
            self.last = max(self.last, now)
            return
        seconds, size, active, joining = self.ledger.seconds, self.size, self.active, self.joining
        missing = size - active - joining
        if missing < 0:
            missing = 0
        if joining:
            seconds[_STARTUP] += joining * dt
        rate = 0.0
        if mode is RUNNING:
            useful = 1.0 - config.checkpoint_block_s / config.checkpoint_interval_s
            seconds[_PRODUCTIVE] += active * dt * useful
            seconds[_SAVE] += active * dt * (1.0 - useful)
            seconds[_DEGRADED] += missing * dt
            rate = active / size * useful
        elif mode is QUEUED:
            seconds[_QUEUED_TIME] += size * dt
        elif mode is WAITING:
            seconds[_RECOVERY] += size * dt
        elif mode is STARTING:
            startup_end = self.mode_since + config.startup_s
            in_startup = max(0.0, min(now, startup_end) - self.last)
            seconds[_STARTUP] += active * in_startup
            seconds[_RESTORE] += active * (dt - in_startup)
            seconds[_DEGRADED] += missing * dt
        elif mode is RECONFIGURING:
            seconds[_ELASTIC] += active * dt
            seconds[_DEGRADED] += missing * dt
        if mode is not QUEUED:
            self.held_s += (active + joining) * dt
        epoch = self.epoch
        if epoch is not None:
            # The last checkpoint and snapshot taken in (last, now], progressing at ``rate``.
            assert self.checkpoint is not None and self.snapshot is not None
            start = self.last
            saved, interval = self.checkpoint, config.checkpoint_interval_s  # (> 0: SimConfig checks)
            at = epoch + math.floor((now - epoch) / interval) * interval
            if at > start and at > saved.at:
                saved.at, saved.progress = at, self.progress + rate * (at - start)
            saved, interval = self.snapshot, config.elastic_snapshot_s
            if interval > 0:
                at = epoch + math.floor((now - epoch) / interval) * interval
                if at > start and at > saved.at:
                    saved.at, saved.progress = at, self.progress + rate * (at - start)
        self.progress += rate * dt
        self.last = now

    def stop(self, now: float, config: SimConfig, hard: bool) -> None:
        """Stop the workers: a hard stop loses the progress since the last checkpoint; a
        graceful one (SIGTERM) saves a checkpoint first and loses nothing."""
        self.account(now, config)
        if hard and self.mode in (RUNNING, RECONFIGURING) and self.checkpoint is not None:
            self._roll_back(self.checkpoint.progress)
        self.epoch = self.checkpoint = self.snapshot = None
        self.joining = 0
        self.join_token += 1

    def lose_slices(self, now: float, config: SimConfig) -> None:
        """Survivors of a failed slice go back to their last in-memory snapshot (or to the last
        checkpoint, if that is newer): the steps since are lost, as in Pathways elastic training."""
        self.account(now, config)
        if config.elastic_snapshot_s <= 0:  # a snapshot at every step: nothing is lost
            return
        if self.mode not in (RUNNING, RECONFIGURING) or self.snapshot is None or self.checkpoint is None:
            return
        restored = max((self.snapshot, self.checkpoint), key=lambda saved: saved.at)
        self._roll_back(restored.progress)
        self.snapshot = Saved(now, self.progress)

    def _roll_back(self, progress: float) -> None:
        self.ledger.waste((self.progress - progress) * self.size)
        self.progress = progress

    def retire(self, now: float, config: SimConfig) -> None:
        """The job is finished, failed or deleted: nothing more is booked to it."""
        self.account(now, config)
        self.ended = now
        self.mode = DONE
        self.joining = 0
        self.epoch = self.checkpoint = self.snapshot = None  # (a long run keeps every finished job)
        self.version += 1
        self.join_token += 1
