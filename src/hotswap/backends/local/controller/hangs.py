"""Hang detection on the local backend: follow the running workloads' SDK events and ask the
pure :mod:`hotswap.core.hang` whether one has stopped making progress.

Every worker process appends its SDK events (``step``, ``checkpoint_begin``,
``checkpoint_save``, ``elastic``, ``stop``) to its own file; every :data:`CHECK_INTERVAL_S` the watcher
reads what each running worker of the current attempt appended since its last look, keeps each
rank's :class:`~hotswap.core.hang.RankProgress`, and turns a hang into a
:class:`~hotswap.core.events.WorkloadHung` event, once per attempt.

History starts with each attempt; after an elastic scale change a surviving rank's history
starts again once it has joined the new generation (its ``elastic`` event), since re-forming
the group and sending state to a joiner may take long. Staleness is only counted while this
controller watches. Workers that write no step events (plain scripts) are never judged, nor
is a rank once it recorded its stop or began its last save (until it steps again).
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from hotswap.api.worker_output import (
    EVENT_CHECKPOINT_BEGIN,
    EVENT_CHECKPOINT_SAVE,
    EVENT_ELASTIC,
    EVENT_STEP,
    EVENT_STOP,
    LEAVING_SAVE_REASONS,
)
from hotswap.api.phases import WorkloadPhase
from hotswap.backends.local import workload_files
from hotswap.core import events as ev
from hotswap.core.hang import WINDOW_STEPS, HangLimits, RankProgress, judge
from hotswap.core.model import Snapshot
from hotswap.core.workload import Workload
from hotswap.store.paths import ClusterPaths
from hotswap.backends.local.tables import WorkerRow

CHECK_INTERVAL_S = 0.5  # how often running workloads' events are read (a hang is found this late at most)


@dataclasses.dataclass
class _Tail:
    """One worker process's events file, read incrementally, and the progress it shows."""

    path: Path
    label: str
    since: float  # records before this are not this rank's history
    rejoin_after: float | None = None  # an elastic change: history starts at its elastic event
    offset: int = 0
    partial: bytes = b""
    steps: int = 0
    last_step: int | None = None
    last_step_at: float | None = None
    intervals: collections.deque[float] = dataclasses.field(default_factory=lambda: collections.deque(maxlen=WINDOW_STEPS))
    saving_since: float | None = None
    longest_save_s: float | None = None
    save_ended_at: float | None = None
    leaving: bool = False

    def read(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return
        self.offset += len(chunk)
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        for line in lines:
            try:
                record = json.loads(line)
                t = float(record["t"])
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a kill
            if t >= self.since:
                self._apply(record.get("kind"), t, record)

    def rejoin(self, after: float) -> None:
        """The elastic generation changed: wait for this rank to join the new one."""
        self.rejoin_after = after
        self.steps, self.last_step, self.last_step_at, self.saving_since, self.save_ended_at = 0, None, None, None, None
        self.leaving = False
        self.intervals.clear()

    def _apply(self, kind: object, t: float, record: dict) -> None:
        if self.rejoin_after is not None:
            if kind == EVENT_ELASTIC and t >= self.rejoin_after:
                self.rejoin_after = None
            return
        if kind == EVENT_STEP:
            interval = t - self.last_step_at if self.last_step_at is not None else float(record.get("duration_s", 0.0))
            self.intervals.append(max(0.0, interval))
            self.steps += 1
            self.last_step, self.last_step_at = int(record.get("step", 0)), t
            self.saving_since = None  # stepping again: the save does not hold the loop (async)
            self.leaving = False
        elif kind == EVENT_CHECKPOINT_BEGIN:
            self.saving_since = t
            self.leaving = self.leaving or record.get("reason") in LEAVING_SAVE_REASONS
        elif kind == EVENT_STOP:
            self.leaving = True
        elif kind == EVENT_CHECKPOINT_SAVE:
            held = float(record.get("blocking_s", record.get("total_s", 0.0)))
            self.longest_save_s = max(self.longest_save_s or 0.0, held)
            self.saving_since, self.save_ended_at = None, t

    def progress(self) -> RankProgress:
        return RankProgress(
            self.label, self.steps, self.last_step, self.last_step_at, max(self.intervals, default=0.0),
            self.saving_since, self.longest_save_s, self.save_ended_at, self.leaving,
        )


@dataclasses.dataclass
class _Watch:
    """One running workload: its attempt and elastic generation, and its ranks' workload_files."""

    attempt: int
    membership: int
    since: float  # the attempt's start: earlier records are not its history
    watched_since: float
    tails: dict[Path, _Tail] = dataclasses.field(default_factory=dict)
    reported: bool = False


class HangWatch:
    """The controller's hang detector for a local cluster (see the module)."""

    def __init__(self, paths: ClusterPaths, live: Callable[[Workload], list[WorkerRow]], per_host: Callable[[], int]) -> None:
        """``live``: a workload's workers that may be alive; ``per_host``: processes per host."""
        self.paths = paths
        self.live = live
        self.per_host = per_host
        self.watches: dict[str, _Watch] = {}
        self.checked_at = 0.0

    @staticmethod
    def watched(snapshot: Snapshot) -> bool:
        return any(
            w.phase is WorkloadPhase.RUNNING and HangLimits(w.spec.hang_timeout_s).enabled
            for w in snapshot.workloads.values()
        )

    def next_deadline(self, snapshot: Snapshot, now: float) -> float | None:
        """Seconds until the next look (None: no running workload to watch)."""
        if not self.watched(snapshot):
            self.watches.clear()
            return None
        return max(0.0, self.checked_at + CHECK_INTERVAL_S - now)

    def check(self, snapshot: Snapshot, now: float) -> list[ev.Event]:
        """Read what the running workloads wrote since the last look (when a look is due); a
        :class:`~hotswap.core.events.WorkloadHung` for each hang found."""
        if now < self.checked_at + CHECK_INTERVAL_S:
            return []
        self.checked_at = now
        running = {
            w.name: w
            for w in snapshot.workloads.values()
            if w.phase is WorkloadPhase.RUNNING and HangLimits(w.spec.hang_timeout_s).enabled
        }
        for name in list(self.watches):
            if name not in running:
                del self.watches[name]
        hangs: list[ev.Event] = []
        for workload in running.values():
            watch = self._watch(workload, now)
            self._follow(workload, watch)
            if watch.reported:
                continue
            limits = HangLimits(limit_s=workload.spec.hang_timeout_s)
            hang = judge((t.progress() for t in watch.tails.values()), watch.watched_since, now, limits)
            if hang is not None:
                watch.reported = True
                hangs.append(ev.WorkloadHung(workload.name, workload.attempt, hang.reason))
        return hangs

    def _watch(self, workload: Workload, now: float) -> _Watch:
        watch = self.watches.get(workload.name)
        if watch is not None and watch.attempt == workload.attempt:
            if watch.membership != workload.membership:  # an elastic scale change
                watch.membership, watch.watched_since = workload.membership, now
                for tail in watch.tails.values():
                    tail.rejoin(now - CHECK_INTERVAL_S)
            return watch
        # A new attempt (or a controller that starts watching one: staleness counts from now).
        watch = _Watch(workload.attempt, workload.membership, workload.running_since or now, now)
        self.watches[workload.name] = watch
        return watch

    def _follow(self, workload: Workload, watch: _Watch) -> None:
        """Keep one tail per running process of the attempt, and read them."""
        directory = self.paths.workload_dir(workload.name, workload.seq)
        per_host = self.per_host()
        current: set[Path] = set()
        for row in self.live(workload):
            who = row.identity
            if row.state != "running" or who.attempt != workload.attempt:
                continue  # starting (no history yet), or told to stop
            events = workload_files.events_path(directory, who.attempt, who.replica, who.host, row.id)
            for local_rank in range(per_host):
                path = workload_files.local_events_path(events, local_rank)
                current.add(path)
                if path not in watch.tails:
                    label = f"{who.slice}/{who.host}" + (f".{local_rank}" if per_host > 1 else "")
                    watch.tails[path] = _Tail(path, label, watch.since)
        for path in list(watch.tails):
            if path not in current:
                del watch.tails[path]  # the worker left (scaled away, stopping, ended)
        for tail in watch.tails.values():
            tail.read()
