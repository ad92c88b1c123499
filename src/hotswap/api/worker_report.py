"""A replica's report: the workers' own records (:mod:`hotswap.api.worker_output`'s goodput
events: start, step, save, restore, elastic, stop) folded into one small record that the
replica's first process (host 0, local rank 0) keeps and publishes, on Kubernetes as one Lease
per replica (:mod:`hotswap.train.report_channel`), for the controller to account goodput, MTTR
and hangs from what the workers recorded, as the local backend does from their events files.

The record is bounded whatever the run's length: per attempt (the last :data:`MAX_ATTEMPTS`),
the time its process began and recorded its start, its segments (one per number of slices it
ran on: seconds booked per goodput category, first and last record), its first step and the
first step after each re-formation (MTTR's "first productive step"), its last saves (step and
productive seconds so far: what a later restore of that step throws away), the step it restored,
its stop; and the rank's progress as hang detection reads it (:class:`hotswap.core.hang.RankProgress`'s
fields). Every time in it is the worker's clock at the record. Pure: :meth:`WorkerReport.fold`
takes one event record (the dict :func:`~hotswap.api.worker_output.event_record` writes).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from hotswap.api.worker_output import (
    EVENT_CHECKPOINT_BEGIN,
    EVENT_CHECKPOINT_RESTORE,
    EVENT_CHECKPOINT_SAVE,
    EVENT_ELASTIC,
    EVENT_START,
    EVENT_STEP,
    EVENT_STOP,
    LEAVING_SAVE_REASONS,
)

REPORT_ANNOTATION = "hotswap.dev/report"  # the record's JSON, on its Lease
IN_CLUSTER = "in-cluster"  # HOTSWAP_REPORT_LEASES in a pod: the Leases of its own namespace, on the API server it reaches
REPORT_VERSION = 1
# How often a replica's record is written at most while nothing but steps happens (a heartbeat):
# every PUBLISH_INTERVAL_S (kubelet's node Lease renews every 10 s too) in a cluster of up to
# HEARTBEATS_PER_S * PUBLISH_INTERVAL_S slices, longer in a larger one, so that all heartbeats
# together stay within HEARTBEATS_PER_S writes a second (heartbeat_interval). A restore, a first
# step, a save, a re-formation or a stop is written at once (at most once a second) whatever the
# interval.
PUBLISH_INTERVAL_S = 10.0
MAX_PUBLISH_INTERVAL_S = 600.0  # beyond 60,000 slices the rate grows rather than a frozen worker going unseen longer
HEARTBEATS_PER_S = 100.0
MIN_PUBLISH_GAP_S = 1.0
INTERVAL_ANNOTATION = "hotswap.dev/report-interval-s"  # on the Lease: the heartbeat interval its writer keeps
MAX_ATTEMPTS = 16
MAX_SAVES = 8
MAX_REFORMS = 8
WINDOW = 100  # step intervals the longest one is taken over (hang detection's window)
CATEGORIES = ("productive", "startup", "checkpoint_save", "checkpoint_restore", "elastic")


def heartbeat_interval(slices: int) -> float:
    """The heartbeat interval of the replicas of a cluster of ``slices`` slices: each running
    replica holds a whole slice, so at most ``slices`` replicas write, together at most
    :data:`HEARTBEATS_PER_S` heartbeats a second (10 s up to 1,000 slices; 100 s at 10,000)."""
    return _bounded(float(math.ceil(max(0, slices) / HEARTBEATS_PER_S)))


def interval_of(annotations: dict[str, Any] | None) -> float:
    """The heartbeat interval a Lease asks its writer for (within the bounds)."""
    try:
        return _bounded(float((annotations or {}).get(INTERVAL_ANNOTATION) or PUBLISH_INTERVAL_S))
    except (TypeError, ValueError):
        return PUBLISH_INTERVAL_S


def _bounded(interval: float) -> float:
    """An interval between the default and the longest (anything else, as garbage: the default)."""
    return min(MAX_PUBLISH_INTERVAL_S, max(PUBLISH_INTERVAL_S, interval)) if math.isfinite(interval) else PUBLISH_INTERVAL_S


def report_name(workload: str, replica: int) -> str:
    """The Lease holding replica ``replica``'s record (the workload's name is at most 40
    characters: a valid object name)."""
    return f"{workload}-report-{replica}"


@dataclasses.dataclass
class Segment:
    """A stretch of one attempt on ``slices`` slices: from its first record to its last, and the
    seconds the workers' records put in each category."""

    slices: int
    start: float
    end: float
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)

    def add(self, category: str, amount: float) -> None:
        self.seconds[category] = round(self.seconds.get(category, 0.0) + max(0.0, amount), 6)


@dataclasses.dataclass
class AttemptReport:
    attempt: int
    started: float  # the start record (or the first record seen)
    process_t: float | None = None  # when the process began being this worker
    segments: list[Segment] = dataclasses.field(default_factory=list)
    first_step: tuple[float, float] | None = None  # (finished, began)
    reforms: list[tuple[float, float | None, float | None]] = dataclasses.field(default_factory=list)  # (re-formed, first step after: finished, began)
    steps: int = 0
    last_step: int | None = None
    productive_s: float = 0.0  # slice-seconds of steps so far
    saves: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # (step, productive_s then)
    restored: int | None = None
    restored_at: float | None = None
    restored_from: str | None = None  # RESTORE_SOURCES
    restore_s: float = 0.0
    stop: str | None = None  # the stop record's reason
    stopped_at: float | None = None

    def wasted_after(self, step: int) -> float:
        """Productive slice-seconds of this attempt that a later restore of ``step`` re-does."""
        if self.last_step is None or step >= self.last_step:
            return 0.0
        kept = max((p for s, p in self.saves if s <= step), default=0.0)
        return max(0.0, self.productive_s - kept)


@dataclasses.dataclass
class Progress:
    """The rank's progress since its attempt (or its last re-formation) began, as
    :mod:`hotswap.core.hang` judges it."""

    steps: int = 0
    last_step: int | None = None
    last_step_at: float | None = None
    intervals: list[float] = dataclasses.field(default_factory=list)
    saving_since: float | None = None
    longest_save_s: float | None = None
    save_ended_at: float | None = None
    leaving: bool = False


@dataclasses.dataclass
class WorkerReport:
    """One replica's record (see the module)."""

    replica: int = 0
    attempts: list[AttemptReport] = dataclasses.field(default_factory=list)
    progress: Progress = dataclasses.field(default_factory=Progress)
    published_at: float = 0.0  # the worker's clock when this text was written (its heartbeat)
    interval_s: float = PUBLISH_INTERVAL_S  # the heartbeat interval its writer keeps (the next write is due by then)

    @property
    def current(self) -> AttemptReport | None:
        return self.attempts[-1] if self.attempts else None

    def fold(self, record: dict[str, Any], attempt: int) -> bool:
        """Take one event record of attempt ``attempt``; True when it should be written soon
        (anything but a step after the first)."""
        kind, t = record.get("kind"), float(record.get("t", 0.0))
        run = self._attempt(attempt, t)
        urgent = kind != EVENT_STEP
        if kind == EVENT_START:
            run.started = min(run.started, t)
            process_t = record.get("process_t")
            run.process_t = float(process_t) if isinstance(process_t, (int, float)) else None
        elif kind == EVENT_STEP:
            urgent = self._step(run, record, t)
        elif kind == EVENT_CHECKPOINT_BEGIN:
            self.progress.saving_since = t
            self.progress.leaving = self.progress.leaving or record.get("reason") in LEAVING_SAVE_REASONS
        elif kind == EVENT_CHECKPOINT_SAVE:
            blocking = float(record.get("blocking_s", 0.0))
            self._segment(run, t).add("checkpoint_save", blocking)
            if run.last_step is not None:
                run.saves = (run.saves + [(int(record.get("step", run.last_step)), run.productive_s)])[-MAX_SAVES:]
            held = float(record.get("blocking_s", record.get("total_s", 0.0)))
            self.progress.longest_save_s = max(self.progress.longest_save_s or 0.0, held)
            self.progress.saving_since, self.progress.save_ended_at = None, t
        elif kind == EVENT_CHECKPOINT_RESTORE:
            run.restored, run.restored_at = int(record.get("step", 0)), t
            run.restored_from = str(record.get("source") or "") or None
            run.restore_s += float(record.get("duration_s", 0.0))
        elif kind == EVENT_ELASTIC:
            slices = record.get("slices")
            count = slices if isinstance(slices, int) and slices > 0 else self._segment(run, t).slices
            segment = Segment(count, t - float(record.get("duration_s", 0.0)), t)
            segment.add("elastic", t - segment.start)
            run.segments.append(segment)
            run.reforms = (run.reforms + [(t, None, None)])[-MAX_REFORMS:]
            self.progress = Progress(longest_save_s=self.progress.longest_save_s)  # history restarts once re-formed
        elif kind == EVENT_STOP:
            run.stop, run.stopped_at = str(record.get("reason", "")), t
            self.progress.leaving = True
        self._segment(run, t).end = max(self._segment(run, t).end, t)
        return urgent

    def _attempt(self, attempt: int, t: float) -> AttemptReport:
        current = self.current
        if current is None or current.attempt != attempt:
            current = AttemptReport(attempt, t)
            self.attempts = (self.attempts + [current])[-MAX_ATTEMPTS:]
            self.progress = Progress()
        return current

    def _segment(self, run: AttemptReport, t: float, slices: int | None = None) -> Segment:
        if run.segments and run.segments[-1].slices == 0 and slices:
            run.segments[-1].slices = slices  # the first step says what the start did not
        if not run.segments or (slices is not None and run.segments[-1].slices != slices):
            start = run.segments[-1].end if run.segments else (run.process_t or run.started)
            run.segments.append(Segment(slices if slices is not None else 0, min(start, t), t))
        return run.segments[-1]

    def _step(self, run: AttemptReport, record: dict[str, Any], t: float) -> bool:
        duration = float(record.get("duration_s", 0.0))
        began = t - duration
        slices = int(record.get("slices", 0) or 0) or None
        segment = self._segment(run, t, slices)
        first = run.first_step is None
        if first:
            run.first_step = (t, began)
            ready = max(segment.start, began - run.restore_s)
            segment.add("startup", ready - segment.start)
            segment.add("checkpoint_restore", began - ready)
        if run.reforms and run.reforms[-1][1] is None and began >= run.reforms[-1][0]:
            run.reforms[-1] = (run.reforms[-1][0], t, began)
            first = True
        segment.add("productive", duration)
        run.steps += 1
        run.last_step = int(record.get("step", run.steps))
        run.productive_s = round(run.productive_s + duration * (segment.slices or 1), 6)
        progress = self.progress
        interval = t - progress.last_step_at if progress.last_step_at is not None else duration
        progress.intervals = (progress.intervals + [round(max(0.0, interval), 6)])[-WINDOW:]
        progress.steps += 1
        progress.last_step, progress.last_step_at = run.last_step, t
        progress.saving_since, progress.leaving = None, False
        return first

    # The record's text -------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        data = {"v": REPORT_VERSION, **dataclasses.asdict(self)}
        intervals = data["progress"]["intervals"]
        data["progress"]["intervals"] = [max(intervals)] if intervals else []  # only the longest is judged: a small record
        return data

    def encode(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


def decode_report(text: str | None) -> WorkerReport | None:
    """The record in a Lease's annotation, or None when the text is not one (anyone who can
    write the Lease can write anything: it never stops the controller)."""
    try:
        data = json.loads(text or "")
        if not isinstance(data, dict) or data.get("v") != REPORT_VERSION:
            return None
        attempts = [
            AttemptReport(
                attempt=int(a["attempt"]), started=float(a["started"]), process_t=_num(a.get("process_t")),
                segments=[Segment(int(s["slices"]), float(s["start"]), float(s["end"]),
                                  {k: float(v) for k, v in dict(s["seconds"]).items() if k in CATEGORIES}) for s in a["segments"]],
                first_step=_pair(a.get("first_step")),
                reforms=[(float(r[0]), _num(r[1]), _num(r[2])) for r in a.get("reforms", [])][-MAX_REFORMS:],
                steps=int(a.get("steps", 0)), last_step=_int(a.get("last_step")),
                productive_s=float(a.get("productive_s", 0.0)),
                saves=[(int(s[0]), float(s[1])) for s in a.get("saves", [])][-MAX_SAVES:],
                restored=_int(a.get("restored")), restored_at=_num(a.get("restored_at")),
                restored_from=a.get("restored_from") if isinstance(a.get("restored_from"), str) else None,
                restore_s=float(a.get("restore_s", 0.0)),
                stop=a.get("stop") if isinstance(a.get("stop"), str) else None, stopped_at=_num(a.get("stopped_at")),
            )
            for a in data["attempts"][-MAX_ATTEMPTS:]
        ]
        p = data["progress"]
        progress = Progress(
            int(p.get("steps", 0)), _int(p.get("last_step")), _num(p.get("last_step_at")),
            [float(i) for i in p.get("intervals", [])][-WINDOW:], _num(p.get("saving_since")),
            _num(p.get("longest_save_s")), _num(p.get("save_ended_at")), bool(p.get("leaving", False)),
        )
        interval = _bounded(_num(data.get("interval_s")) or PUBLISH_INTERVAL_S)
        return WorkerReport(int(data.get("replica", 0)), attempts, progress, float(data.get("published_at", 0.0)), interval)
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        return None


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _pair(value: object) -> tuple[float, float] | None:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return float(value[0]), float(value[1])
    return None
