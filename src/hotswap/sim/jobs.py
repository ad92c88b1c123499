"""A simulated training job: its mode, its progress, and where its slice-seconds went."""

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


@dataclasses.dataclass
class Job:
    spec: WorkloadSpec
    work_s: float
    stream: int | None = None  # filler stream, None for the main job
    index: int = 0
    arrived: float = 0.0
    ended: float | None = None
    mode: Mode = Mode.QUEUED
    mode_since: float = 0.0
    last: float = 0.0  # accounted up to here
    active: int = 0  # slices it runs on
    joining: int = 0  # slices added by a scale-up whose workers are still starting
    progress: float = 0.0  # seconds of full-size training done (not yet lost)
    epoch: float | None = None  # start of the current attempt's productive period
    trace: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (time, progress)
    restored: float = 0.0  # progress at the start of the attempt
    version: int = 0  # invalidates timers of an earlier mode
    join_token: int = 0  # invalidates the timer of an earlier scale-up
    disrupted_at: float | None = None
    ledger: Ledger = dataclasses.field(default_factory=Ledger)

    @property
    def size(self) -> int:
        return self.spec.num_slices

    def last_checkpoint_time(self, now: float, config: SimConfig) -> float:
        """When the current attempt (productive since ``epoch``) last saved a periodic checkpoint;
        ``epoch`` itself when it has not saved one yet."""
        assert self.epoch is not None
        interval = config.checkpoint_interval_s
        return self.epoch + math.floor((now - self.epoch) / interval) * interval

    def account(self, now: float, config: SimConfig) -> None:
        """Book the time since ``last`` to the categories of the current mode."""
        dt = now - self.last
        if dt <= 0:
            return
        ledger, size, active = self.ledger, self.size, self.active
        missing = max(0, size - active - self.joining)
        if self.joining:
            ledger.add(Category.STARTUP, self.joining * dt)
        if self.mode is Mode.QUEUED:
            ledger.add(Category.QUEUED, size * dt)
        elif self.mode is Mode.WAITING:
            ledger.add(Category.RECOVERY, size * dt)
        elif self.mode is Mode.STARTING:
            startup_end = self.mode_since + config.startup_s
            in_startup = max(0.0, min(now, startup_end) - self.last)
            ledger.add(Category.STARTUP, active * in_startup)
            ledger.add(Category.CHECKPOINT_RESTORE, active * (dt - in_startup))
            ledger.add(Category.DEGRADED, missing * dt)
        elif self.mode is Mode.RUNNING:
            useful = 1.0 - config.checkpoint_block_s / config.checkpoint_interval_s
            ledger.add(Category.PRODUCTIVE, active * dt * useful)
            ledger.add(Category.CHECKPOINT_SAVE, active * dt * (1.0 - useful))
            ledger.add(Category.DEGRADED, missing * dt)
            self.progress += active / size * dt * useful
            self.trace.append((now, self.progress))
        elif self.mode is Mode.RECONFIGURING:
            ledger.add(Category.ELASTIC, active * dt)
            ledger.add(Category.DEGRADED, missing * dt)
        self.last = now

    def stop(self, now: float, config: SimConfig, hard: bool) -> None:
        """Stop the workers: a hard stop loses the progress since the last checkpoint; a
        graceful one (SIGTERM) saves a checkpoint first and loses nothing."""
        self.account(now, config)
        if hard and self.mode in (Mode.RUNNING, Mode.RECONFIGURING):
            saved = self._checkpointed_progress(now, config)
            self.ledger.waste((self.progress - saved) * self.size)
            self.progress = saved
        self.epoch = None
        self.trace = []
        self.joining = 0
        self.join_token += 1

    def _checkpointed_progress(self, now: float, config: SimConfig) -> float:
        """Progress saved by the last periodic checkpoint of the current attempt."""
        if self.epoch is None or not self.trace:
            return self.progress
        saved_at = self.last_checkpoint_time(now, config)
        if saved_at <= self.epoch:
            return self.restored
        previous_time, previous_progress = self.trace[0]
        for time, value in self.trace:
            if time >= saved_at:
                span = time - previous_time
                share = (saved_at - previous_time) / span if span > 0 else 1.0
                return previous_progress + (value - previous_progress) * share
            previous_time, previous_progress = time, value
        return self.progress
