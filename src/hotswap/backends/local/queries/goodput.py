"""Goodput of a local workload, from its timeline and the events its workers wrote.

The controller's timeline says when the workload waited in the queue, when workers were
started and when they were stopped; the training SDK's events file (``HOTSWAP_EVENTS_FILE``,
one per worker; rank 0's is read) says when steps ran, what checkpoint saves blocked, what a
restore took and which steps were lost. The categories are those of
:mod:`hotswap.core.goodput`; amounts are slice-seconds (a workload of N slices owns N per
second of its life).

Only steps the workers reported are productive: time with workers up but no step reported
(a plain script without the SDK, or a job stopped before its first step) counts as startup, and a
workload whose workers never reported a step has goodput 0 with the reason
(``"source": "controller"``, ``"reason"``), never a positive figure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hotswap.api.worker_output import EVENT_CHECKPOINT_RESTORE, EVENT_CHECKPOINT_SAVE, EVENT_ELASTIC, EVENT_STEP
from hotswap.core.goodput import Category, Ledger

_STARTS = {"admit", "restart", "startworkers"}
_STOPS = {"preempt", "requeue", "fail", "remove", "complete", "restart"}


def _events_of_attempt(directory: Path, attempt: int) -> list[dict[str, Any]]:
    """Rank 0's goodput events for one attempt (replica 0 host 0, every process that held
    that place), in time order."""
    records: list[dict[str, Any]] = []
    for path in sorted((directory / "events").glob(f"{attempt}-0-0*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
    records.sort(key=lambda r: r.get("t", 0.0))
    return records


def workload_goodput(record: dict[str, Any], timeline: Sequence[Any], directory: Path, now: float) -> dict[str, Any]:
    """Goodput and badput of one workload over its life so far."""
    size = int(record["spec"]["num_slices"])
    created = float(record["created_at"])
    end = now
    # Intervals from the controller's timeline: (start, end, attempt) while workers ran.
    runs: list[tuple[float, float, int, int]] = []  # start, end, attempt, slices
    waiting_from: float | None = created
    waiting_kind = Category.QUEUED
    ledger = Ledger()
    current: tuple[float, int, int] | None = None  # start, attempt, slices
    for row in timeline:
        kind, t = row["kind"], float(row["t"])
        data = json.loads(row["data"]) if row["data"] else {}
        if kind in _STOPS and current is not None:
            runs.append((current[0], t, current[1], current[2]))
            current = None
            waiting_from, waiting_kind = t, (Category.QUEUED if kind in ("preempt", "requeue") else Category.RECOVERY)
        if kind in _STARTS and data.get("start", True):
            if waiting_from is not None:
                ledger.add(waiting_kind, size * max(0.0, t - waiting_from))
                waiting_from = None
            current = (t, int(data.get("attempt", record["attempt"])), len(data.get("slices", ())) or size)
        elif kind == "restart" and not data.get("start", True):
            waiting_from, waiting_kind = t, Category.RECOVERY
        if kind in ("complete", "fail", "remove"):
            end = t
            waiting_from = None
    if current is not None:
        runs.append((current[0], end, current[1], current[2]))
    if waiting_from is not None:
        ledger.add(waiting_kind, size * max(0.0, end - waiting_from))

    source = "controller"
    restored_by_attempt: dict[int, int] = {}
    per_attempt = {}
    for start, stop, attempt, slices in runs:
        events = _events_of_attempt(directory, attempt)
        per_attempt[attempt] = events
        for event in events:
            if event.get("kind") == EVENT_CHECKPOINT_RESTORE:
                restored_by_attempt[attempt] = int(event.get("step", 0))
    for index, (start, stop, attempt, slices) in enumerate(runs):
        events = per_attempt.get(attempt, [])
        steps = [e for e in events if e.get("kind") == EVENT_STEP and start <= e["t"] <= stop + 1.0]
        if not steps:  # workers up, no step reported: not productive (the controller cannot tell)
            ledger.add(Category.STARTUP, slices * max(0.0, stop - start))
            ledger.add(Category.DEGRADED, (size - slices) * max(0.0, stop - start))
            continue
        source = "workers"
        first_step_start = steps[0]["t"] - float(steps[0].get("duration_s", 0.0))
        restore = sum(float(e.get("duration_s", 0.0)) for e in events if e.get("kind") == EVENT_CHECKPOINT_RESTORE)
        startup = max(0.0, first_step_start - start - restore)
        ledger.add(Category.STARTUP, size * startup)
        ledger.add(Category.CHECKPOINT_RESTORE, size * min(restore, max(0.0, first_step_start - start)))
        # Steps re-done later (the next attempt restored an earlier step) were wasted.
        next_restore = next(
            (restored_by_attempt[a] for _, _, a, _ in runs[index + 1 :] if a in restored_by_attempt), None
        )
        productive = wasted = 0.0
        for e in steps:
            weight = int(e.get("slices", slices))
            amount = float(e.get("duration_s", 0.0)) * weight
            if next_restore is not None and int(e.get("step", 0)) > next_restore:
                wasted += amount
            else:
                productive += amount
        save = sum(float(e.get("blocking_s", 0.0)) for e in events if e.get("kind") == EVENT_CHECKPOINT_SAVE)
        elastic = sum(float(e.get("duration_s", 0.0)) for e in events if e.get("kind") == EVENT_ELASTIC)
        ledger.add(Category.PRODUCTIVE, productive)
        ledger.add(Category.WASTED_PROGRESS, wasted)
        ledger.add(Category.CHECKPOINT_SAVE, size * save)
        ledger.add(Category.ELASTIC, size * elastic)
        accounted = size * (startup + restore + save + elastic) + productive + wasted
        remainder = size * max(0.0, stop - start) - accounted
        # Time with workers up but neither stepping nor saving: below full size, or stopping.
        ledger.add(Category.DEGRADED if slices < size else Category.RECOVERY, max(0.0, remainder))
    total = ledger.total
    view = {
        "source": source,
        "wall_s": round(max(0.0, end - created), 3),
        "goodput": round(ledger.goodput, 4),
        "badput": {c.value: round(v / total, 4) if total else 0.0 for c, v in ledger.seconds.items() if c is not Category.PRODUCTIVE},
        "slice_seconds": {c.value: round(v, 3) for c, v in ledger.seconds.items()},
    }
    if source == "controller":
        view["reason"] = NO_STEPS_REASON if runs else "its workers never ran"
    return view


NO_STEPS_REASON = "its workers reported no training step (none completed, or the command does not use hotswap.train)"
