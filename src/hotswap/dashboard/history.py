"""What the dashboard remembers between looks at a cluster: each workload's step over time (from
the contract's log lines), the timeline entries already seen, failures and recoveries (for MTTR)
and the cluster's goodput over time. No I/O and no clock: the caller passes what it read and when.

Times of things first seen while watching are the times they were seen (the backends' timeline
times have one-second resolution); entries that predate the dashboard keep their own times.
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
    failed_at: float | None = None  # an open failure, waiting for training to resume
    restarted_at: float | None = None  # when a restart followed the open failure
    recoveries: list[float] = dataclasses.field(default_factory=list)
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

    @property
    def mttr_s(self) -> float | None:
        return sum(self.recoveries) / len(self.recoveries) if self.recoveries else None


class History:
    def __init__(self) -> None:
        self.workloads: dict[str, WorkloadHistory] = {}
        self.events: list[dict[str, Any]] = []
        self.goodput: list[tuple[float, float]] = []

    def of(self, name: str) -> WorkloadHistory:
        return self.workloads.setdefault(name, WorkloadHistory())

    def take_timeline(self, name: str, entries: list[dict[str, Any]], now: float, live: bool) -> None:
        """New timeline entries of a workload (``workload describe``'s, oldest first). ``live``:
        the dashboard was already watching, so an entry's time is when it was seen."""
        history = self.of(name)
        for entry in entries[history.events_seen:]:
            t = now if live else _epoch(entry.get("time"), now)
            kind = str(entry.get("event", ""))
            self._event(name, t, kind, str(entry.get("message", "")))
            if kind in FAILURE_KINDS and history.failed_at is None:
                history.failed_at, history.restarted_at = t, None
                history.marks.append({"t": t, "kind": "failure"})
            elif kind in ("restart", "scaledown") and history.failed_at is not None:
                history.restarted_at = now
            elif kind in ("fail", "complete", "remove"):
                history.failed_at = None
        history.events_seen = max(history.events_seen, len(entries))

    def take_log(self, name: str, content: bytes, now: float) -> None:
        """The workload's main log as it is now; parses only what is new. A shorter log than
        before is a new run's: it is read from its start."""
        history = self.of(name)
        if len(content) < history.log_bytes:
            history.log_bytes, history.partial = 0, ""
        text = history.partial + content[history.log_bytes:].decode("utf-8", errors="replace")
        history.log_bytes = len(content)
        lines = text.split("\n")
        history.partial = lines.pop()
        latest: int | None = None  # one sample per look: the lines' own times are unknown
        for line in lines:
            fields = parse_fields(line)
            if "step" not in fields or not fields["step"].isdigit():
                continue
            step = int(fields["step"])
            if line.startswith("restored "):
                self._event(name, now, "restored", f"restored step {step} from {fields.get('source', '?')}")
                continue
            latest = step
        progressed = latest is not None
        if latest is not None:
            history.steps.append((now, latest))
            del history.steps[:-MAX_SAMPLES]
        # Lines read in the look that saw the restart may be the old workers' last ones.
        if progressed and history.failed_at is not None and history.restarted_at is not None and now > history.restarted_at:
            history.recoveries.append(now - history.failed_at)
            history.marks.append({"t": now, "kind": "recovery"})
            history.failed_at = None

    def take_saves(self, name: str, goodput: dict[str, Any], now: float) -> None:
        """Checkpoint saves, seen as the goodput ledger's save time growing (the backends'
        only record of saves: the workers' events, which no log line repeats)."""
        history = self.of(name)
        saving = float((goodput.get("slice_seconds") or {}).get("checkpoint_save") or 0.0)
        if history.saving_s is not None and saving > history.saving_s:
            self._event(name, now, "checkpoint", "checkpoint saved", saving_s=saving - history.saving_s)
        history.saving_s = saving

    def take_goodput(self, now: float, figures: list[dict[str, Any]]) -> None:
        """The cluster's goodput now: workloads' productive time over their wall time."""
        walls = [(g["goodput"], g["wall_s"]) for g in figures if g.get("wall_s")]
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


def _epoch(iso: Any, default: float) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(iso).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default
