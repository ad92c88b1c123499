"""Goodput of a local workload, from its timeline and the events its workers wrote.

The controller's timeline says when the workload waited in the queue, when workers were
started and when they were stopped; the training SDK's events file (``HOTSWAP_EVENTS_FILE``,
one per worker; rank 0's is read) says when steps ran, what checkpoint saves blocked, what a
restore took and which steps were lost. The categories are those of
:mod:`hotswap.core.goodput`; amounts are slice-seconds (a workload of N slices owns N per
second of its life).

A run's size is the controller's: the slices of the row that started its workers, changed by
each scale-down and scale-up row; the slices missing meanwhile are ``degraded`` time (steps on
the others still count as goodput), a re-formation is ``elastic`` (the workers' elastic events).

Only steps the workers reported are productive. A workload whose workers never reported a step
(a plain script without the SDK, ``sleep 5``, a job stopped before its first step) has goodput
``None`` (unknown) with the reason (``"source": "controller"``, ``"reason"``) and the share of
its time its workers were up (``running_share``), never a badput it did not spend.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hotswap.api.worker_output import (
    EVENT_CHECKPOINT_RESTORE,
    EVENT_CHECKPOINT_SAVE,
    EVENT_ELASTIC,
    EVENT_START,
    EVENT_STEP,
)
from hotswap.backends.local.worker_events import WorkerEvents
from hotswap.core.goodput import Category, Ledger, Spent, Stretch, account_run

_STARTS = {"admit", "restart", "startworkers"}
_STOPS = {"preempt", "requeue", "fail", "remove", "complete", "restart"}
_RESIZES = {"scaledown", "scaleup"}  # the workers on the slices left (in the row's data) run on


def workload_goodput(
    record: dict[str, Any], timeline: Sequence[Any], directory: Path, now: float, worker_events: WorkerEvents | None = None
) -> dict[str, Any]:
    """Goodput and badput of one workload over its life so far (``worker_events``: its workers'
    events files, when the caller has read them already)."""
    worker_events = worker_events or WorkerEvents.read(directory)
    size = int(record["spec"]["num_slices"])
    created = float(record["created_at"])
    runs, ledger, end = _runs(record, timeline, size, created, now)
    per_attempt = {attempt: worker_events.rank_zero(attempt) for attempt, _ in runs}
    steps_of = {
        attempt: [e for e in per_attempt[attempt] if e.get("kind") == EVENT_STEP and stretches[0].start <= e["t"] <= stretches[-1].stop + 1.0]
        for attempt, stretches in runs
    }
    stepped = any(steps_of.values())
    restored_by_attempt = {
        attempt: int(e.get("step", 0)) for attempt, events in per_attempt.items() for e in events if e.get("kind") == EVENT_CHECKPOINT_RESTORE
    }
    unreported = 0.0
    for index, (attempt, stretches) in enumerate(runs):
        # Steps re-done later (the next attempt restored an earlier step) were wasted.
        redone_after = next((restored_by_attempt[a] for a, _ in runs[index + 1 :] if a in restored_by_attempt), None)
        spent = _spent(per_attempt[attempt], steps_of[attempt], stretches, redone_after) if stepped else []
        unreported += account_run(ledger, size, stretches, spent, stepped=stepped)
    total = ledger.total + unreported
    view: dict[str, Any] = {
        "source": "workers" if stepped else "controller",
        "wall_s": round(max(0.0, end - created), 3),
        "goodput": round(ledger.seconds[Category.PRODUCTIVE] / total, 4) if stepped and total else (0.0 if stepped else None),
        "badput": {c.value: round(v / total, 4) if total else 0.0 for c, v in ledger.seconds.items() if c is not Category.PRODUCTIVE},
        "slice_seconds": {c.value: round(v, 3) for c, v in ledger.seconds.items()},
    }
    if not stepped:
        view["running_share"] = round(unreported / total, 4) if total else 0.0
        view["reason"] = _why_unknown(runs, per_attempt)
    return view


def _runs(
    record: dict[str, Any], timeline: Sequence[Any], size: int, created: float, now: float
) -> tuple[list[tuple[int, list[Stretch]]], Ledger, float]:
    """Each attempt whose workers ran, with the stretches of its life at each size; a ledger
    holding the time no worker ran (queued, or waiting for a restart); and the workload's end."""
    runs: list[tuple[int, list[Stretch]]] = []
    ledger = Ledger()
    end = now
    waiting_from: float | None = created
    waiting_kind = Category.QUEUED
    current: tuple[float, int, int] | None = None  # since, attempt, slices
    stretches: list[Stretch] = []
    for row in timeline:
        kind, t = row["kind"], float(row["t"])
        data = json.loads(row["data"]) if row["data"] else {}
        if kind in _RESIZES and current is not None:
            stretches.append(Stretch(current[0], t, current[2]))
            current = (t, current[1], len(data.get("slices", ())) or current[2])
        if kind in _STOPS and current is not None:
            stretches.append(Stretch(current[0], t, current[2]))
            runs.append((current[1], stretches))
            current, stretches = None, []
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
        stretches.append(Stretch(current[0], end, current[2]))
        runs.append((current[1], stretches))
    if waiting_from is not None:
        ledger.add(waiting_kind, size * max(0.0, end - waiting_from))
    return runs, ledger, end


def _spent(
    events: list[dict[str, Any]], steps: list[dict[str, Any]], stretches: list[Stretch], redone_after: int | None
) -> list[Spent]:
    """What one attempt's workers' records say they spent its time on."""
    start, stop = stretches[0].start, stretches[-1].stop
    if not steps:  # workers up, no step reported in this attempt: starting (the workload's others stepped)
        return [Spent(Category.STARTUP, start, stop)]
    first_step_start = steps[0]["t"] - float(steps[0].get("duration_s", 0.0))
    restore = sum(float(e.get("duration_s", 0.0)) for e in events if e.get("kind") == EVENT_CHECKPOINT_RESTORE)
    ready = max(start, first_step_start - restore)
    spent = [Spent(Category.STARTUP, start, ready), Spent(Category.CHECKPOINT_RESTORE, ready, first_step_start)]
    for e in steps:
        wasted = redone_after is not None and int(e.get("step", 0)) > redone_after
        t = float(e["t"])
        category = Category.WASTED_PROGRESS if wasted else Category.PRODUCTIVE
        spent.append(Spent(category, t - float(e.get("duration_s", 0.0)), t, int(e.get("slices", 0)) or None))
    for e in events:
        if e.get("kind") == EVENT_CHECKPOINT_SAVE:
            spent.append(Spent(Category.CHECKPOINT_SAVE, e["t"] - float(e.get("blocking_s", 0.0)), e["t"]))
        elif e.get("kind") == EVENT_ELASTIC:
            spent.append(Spent(Category.ELASTIC, e["t"] - float(e.get("duration_s", 0.0)), e["t"]))
    return spent


def _why_unknown(runs: list[tuple[int, list[Stretch]]], per_attempt: dict[int, list[dict[str, Any]]]) -> str:
    """Why a workload's goodput is unknown: what its records hold instead of a step."""
    if not runs:
        return "no step was reported: its workers never ran"
    if any(e.get("kind") == EVENT_START for events in per_attempt.values() for e in events):
        return "no step was reported: its workers started hotswap.train and stopped before their first step"
    return NO_STEPS_REASON


NO_STEPS_REASON = "no step was reported: the command does not use hotswap.train (or none completed)"
