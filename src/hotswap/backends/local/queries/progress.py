"""A local workload's progress from its records, for ``workload describe`` (``progress``) and the
dashboard: its recoveries and MTTR (:mod:`hotswap.core.recovery`: the controller's failure rows,
the workers' step and elastic events), its restores and its latest steps with the times the
workers recorded them, and the exact time of each timeline row (a row's ``time`` is to the second).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hotswap.api.worker_output import EVENT_CHECKPOINT_RESTORE, EVENT_CHECKPOINT_SAVE
from hotswap.backends.local.worker_events import WorkerEvents
from hotswap.core.recovery import as_view, recoveries

# Timeline rows that are a failure under the workload (``backends/local/timeline.py``).
FAILURE_KINDS = frozenset({"node", "worker-exited", "worker-lost", "hung"})
RECENT_STEPS = 200  # enough for a rate and a chart's newest stretch


def _failures(timeline: Sequence[Any]) -> list[tuple[float, int]]:
    """(time, attempt running then) of each failure row."""
    failures: list[tuple[float, int]] = []
    attempt = 1
    for row in timeline:
        data = json.loads(row["data"]) if row["data"] else {}
        if row["kind"] in ("admit", "restart") and "attempt" in data:
            attempt = int(data["attempt"])
        if row["kind"] in FAILURE_KINDS:
            failures.append((float(row["t"]), int(data.get("attempt", attempt))))
    return failures


def workload_progress(
    timeline: Sequence[Any], directory: Path, size: int, worker_events: WorkerEvents | None = None
) -> dict[str, Any]:
    """``size``: the slices the workload asked for (a save blocks all of them, as goodput counts);
    ``worker_events``: its workers' events files, when the caller has read them already."""
    worker_events = worker_events or WorkerEvents.read(directory)
    steps, reforms = worker_events.steps_and_reforms()
    restores: list[dict[str, Any]] = []
    saves: list[list[float]] = []  # [time, slice-seconds it blocked training]
    for attempt, record in worker_events.host_zero():
        kind, t = record.get("kind"), float(record.get("t", 0.0))
        if kind == EVENT_CHECKPOINT_RESTORE:
            restores.append({"t": round(t, 3), "step": int(record.get("step", 0)),
                             "source": str(record.get("source", "")), "attempt": attempt})
        elif kind == EVENT_CHECKPOINT_SAVE:
            saves.append([round(t, 3), round(size * float(record.get("blocking_s", 0.0)), 3)])
    found = recoveries(_failures(timeline), steps, reforms)
    first_report: dict[tuple[int, int], float] = {}  # each replica reports a step: its first report
    for s in steps:
        key = (s.attempt, s.step)
        first_report[key] = min(s.t, first_report.get(key, s.t))
    newest = sorted((round(t, 3), step) for (_, step), t in first_report.items())[-RECENT_STEPS:]
    return {
        **as_view(found),
        "restores": sorted(restores, key=lambda r: r["t"]),
        "steps": [[t, step] for t, step in newest],
        "saves": sorted(saves)[-RECENT_STEPS:],
        "timeline_t": [round(float(row["t"]), 3) for row in timeline],
    }
