"""What the dashboard remembers between looks at a cluster: each workload's step over time, the
timeline entries already seen, failures and recoveries and the cluster's goodput over time. No
I/O and no clock: the caller passes what it read and when.

Every time shown is a record's: a timeline entry's own time (exact where the backend's
``progress`` gives it, else to the second), a restore's and a step's as the workers recorded them,
and MTTR is the backend's (``progress``, :mod:`hotswap.core.recovery`), never timed from when the
dashboard happened to look. A backend without those records (Kubernetes) gives steps from the log
as seen (the chart's only approximation) and no MTTR: unknown, not made up.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hotswap.api.worker_output import parse_fields

# Timeline entry kinds (the local backend's, ``backends/local/timeline.py``; Kubernetes uses
# the same action names) by what the page marks them as.
FAILURE_KINDS = frozenset({"node", "worker-exited", "hung"})
CATEGORIES = {
    "node": "failure", "worker-exited": "failure", "hung": "failure", "fail": "failure",
    "restart": "hotswap", "preempt": "preemption", "requeue": "preemption",
    "scaledown": "elastic", "scaleup": "elastic", "restored": "checkpoint", "checkpoint": "checkpoint",
    "admit": "admission", "complete": "complete", "created": "created",
}
MAX_SAMPLES = 2000  # per series: a day at one sample a minute, or a drill at many per second
MAX_EVENTS = 2000
RATE_WINDOW_S = 10.0
# Periodic entries: a run of them (no other entry of the workload in between) is one line.
PERIODIC_KINDS = frozenset({"checkpoint"})
# What went wrong and what was done about it: never merged into a run, and dropped for room
# only by newer ones of their own kind, never by routine entries.
KEPT_CATEGORIES = frozenset({"failure", "hotswap", "preemption", "elastic"})


def category(kind: str) -> str:
    return CATEGORIES.get(kind, "other")


@dataclasses.dataclass
class WorkloadHistory:
    steps: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    log_bytes: int = 0  # how much of the main log was already parsed
    partial: str = ""  # an unfinished last line, kept for the next look
    events_seen: int = 0  # timeline entries already taken
    restores_seen: int = 0  # restores (``progress``) already taken
    saved_until: float = float("-inf")  # saves (``progress``) already taken: those up to this time
    recorded: bool = False  # the backend gives the workers' records (``progress``)
    mttr_s: float | None = None  # the backend's, from the records
    marks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    saving_s: float | None = None  # slice-seconds of checkpoint saves accounted so far
    last_event: dict[str, Any] | None = None  # the workload's newest timeline entry

    @property
    def step(self) -> int | None:
        return self.steps[-1][1] if self.steps else None

    def steps_per_s(self) -> float | None:
        """Steps per second over the last few seconds of uninterrupted progress."""
        if len(self.steps) < 2:
            return None
        t_end, s_end = self.steps[-1]
        first = len(self.steps) - 1
        while first > 0 and self.steps[first - 1][1] <= self.steps[first][1] and t_end - self.steps[first - 1][0] <= RATE_WINDOW_S:
            first -= 1
        t_start, s_start = self.steps[first]
        return (s_end - s_start) / (t_end - t_start) if t_end > t_start else None


class History:
    def __init__(self) -> None:
        self.workloads: dict[str, WorkloadHistory] = {}
        self.events: list[dict[str, Any]] = []
        self.goodput: list[tuple[float, float]] = []

    def of(self, name: str) -> WorkloadHistory:
        return self.workloads.setdefault(name, WorkloadHistory())

    def take_timeline(self, name: str, entries: list[dict[str, Any]], times: list[float] | None = None) -> None:
        """New timeline entries of a workload (``workload describe``'s, oldest first), each at its
        own time: ``times`` (the backend's exact ones, ``progress.timeline_t``) or its ``time``."""
        history = self.of(name)
        for index in range(history.events_seen, len(entries)):
            entry = entries[index]
            t = times[index] if times is not None and index < len(times) else _epoch(entry.get("time"))
            if t is None:
                continue  # a time that cannot be read: no row at a made-up time
            kind = str(entry.get("event", ""))
            self._event(name, t, kind, str(entry.get("message", "")))
            if kind in FAILURE_KINDS:
                history.marks.append({"t": t, "kind": "failure"})
        history.events_seen = max(history.events_seen, len(entries))

    def take_progress(self, name: str, progress: dict[str, Any]) -> None:
        """The backend's records of a workload's progress (``workload describe``'s ``progress``):
        MTTR and recoveries, restores and the newest steps, each at the time recorded."""
        history = self.of(name)
        history.recorded = history.recorded or bool(progress.get("steps"))  # else: the log's steps, as seen
        history.mttr_s = progress.get("mttr_s")
        recovered = sorted({float(r["recovered_at"]) for r in progress.get("recoveries") or [] if r.get("recovered_at")})
        history.marks = [m for m in history.marks if m["kind"] != "recovery"] + [{"t": t, "kind": "recovery"} for t in recovered]
        restores = progress.get("restores") or []
        for restore in restores[history.restores_seen:]:
            self._event(name, float(restore["t"]), "restored", f"restored step {restore['step']} from {restore.get('source') or '?'}")
        history.restores_seen = max(history.restores_seen, len(restores))
        for t, slice_seconds in progress.get("saves") or []:
            if float(t) > history.saved_until:
                self._event(name, float(t), "checkpoint", "checkpoint saved", saving_s=float(slice_seconds))
                history.saved_until = float(t)
        last_t = history.steps[-1][0] if history.steps else float("-inf")
        history.steps.extend((float(t), int(step)) for t, step in progress.get("steps") or [] if float(t) > last_t)
        del history.steps[:-MAX_SAMPLES]

    def take_log(self, name: str, content: bytes, now: float) -> None:
        """The workload's main log as it is now, for a workload without recorded progress (its
        steps as seen, one sample a look); parses only what is new. A shorter log than before is
        a new run's: it is read from its start."""
        history = self.of(name)
        if history.recorded:
            return
        if len(content) < history.log_bytes:
            history.log_bytes, history.partial = 0, ""
        text = history.partial + content[history.log_bytes:].decode("utf-8", errors="replace")
        history.log_bytes = len(content)
        lines = text.split("\n")
        history.partial = lines.pop()
        latest: int | None = None  # one sample per look: the lines' own times are unknown
        for line in lines:
            fields = parse_fields(line)
            # A restore's line has no time of its own: no timeline row at the time it was seen.
            if "step" in fields and fields["step"].isdigit() and not line.startswith("restored "):
                latest = int(fields["step"])
        if latest is not None:
            history.steps.append((now, latest))
            del history.steps[:-MAX_SAMPLES]

    def take_saves(self, name: str, goodput: dict[str, Any], now: float) -> None:
        """Checkpoint saves, seen as the goodput ledger's save time growing (the backends'
        only record of saves: the workers' events, which no log line repeats) for a workload
        without recorded progress; such a row's time is when the growth was seen."""
        history = self.of(name)
        if history.recorded:
            return
        saving = float((goodput.get("slice_seconds") or {}).get("checkpoint_save") or 0.0)
        if history.saving_s is not None and saving > history.saving_s:
            self._event(name, now, "checkpoint", "checkpoint saved", saving_s=saving - history.saving_s)
        history.saving_s = saving

    def take_goodput(self, now: float, figures: list[dict[str, Any]]) -> None:
        """The cluster's goodput now: workloads' productive time over their wall time (of the
        workloads whose goodput is known: ``known``)."""
        walls = [(g["goodput"], g["wall_s"]) for g in figures if g.get("wall_s") and g.get("goodput") is not None]
        total = sum(w for _, w in walls)
        if total > 0:
            self.goodput.append((now, sum(g * w for g, w in walls) / total))
            del self.goodput[:-MAX_SAMPLES]

    def _event(self, workload: str, t: float, kind: str, message: str, saving_s: float | None = None) -> None:
        history = self.of(workload)
        last = history.last_event
        if kind in PERIODIC_KINDS and last is not None and last["kind"] == kind and any(e is last for e in self.events):
            last.update(t=t, count=last["count"] + 1, saving_s=last["saving_s"] + (saving_s or 0.0))
            last["message"] = _run_message(last)
            return
        entry = {"t": t, "workload": workload, "kind": kind, "category": category(kind), "message": message}
        if kind in PERIODIC_KINDS:
            entry.update(first_t=t, count=1, saving_s=saving_s or 0.0, base=message)
            entry["message"] = _run_message(entry)
        self.events.append(entry)
        history.last_event = entry
        self._trim()

    def _trim(self) -> None:
        """At most MAX_EVENTS entries: routine ones go first, oldest first."""
        excess = len(self.events) - MAX_EVENTS
        if excess <= 0:
            return
        routine = [i for i, e in enumerate(self.events) if e["category"] not in KEPT_CATEGORIES][:excess]
        dropped = set(routine)
        if len(dropped) < excess:  # only kept entries are left to drop: the oldest of them
            kept = [i for i, e in enumerate(self.events) if i not in dropped]
            dropped.update(kept[: excess - len(dropped)])
        self.events = [e for i, e in enumerate(self.events) if i not in dropped]


def _run_message(entry: dict[str, Any]) -> str:
    """``checkpoint saved ×12 from 10:01:02 to 10:01:35 (0.40 slice-s of saving)``."""
    saving = f"{entry['saving_s']:.2f} slice-s of saving"
    if entry["count"] == 1:
        return f"{entry['base']} ({saving})"
    return f"{entry['base']} ×{entry['count']} from {_clock(entry['first_t'])} to {_clock(entry['t'])} ({saving})"


def _clock(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S")


def _epoch(iso: Any) -> float | None:
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(iso).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
