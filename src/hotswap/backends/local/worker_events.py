"""The events files a local workload's workers wrote (``HOTSWAP_EVENTS_FILE``: one per worker
process, ``events/<attempt>-<replica>-<host>[...].jsonl``), read once per look: goodput and
progress both read them (the dashboard looks every second), and the controller reads a
recovering workload's newest ones for the end of its recovery (the metrics' MTTR).

Only host 0 of each replica is read: every host of a replica reports the same steps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hotswap.api.worker_output import EVENT_ELASTIC, EVENT_STEP
from hotswap.core.recovery import StepDone, recoveries


class WorkerEvents:
    """Each replica's host-0 records: (attempt, replica, record), file by file, line by line."""

    def __init__(self, records: list[tuple[int, int, dict[str, Any]]]) -> None:
        self.records = records

    @classmethod
    def read(cls, directory: Path, from_attempt: int = 0) -> WorkerEvents:
        """``from_attempt``: leave out the files of earlier attempts."""
        records: list[tuple[int, int, dict[str, Any]]] = []
        for path in sorted((directory / "events").glob("*.jsonl")):
            try:
                attempt, replica, host = (int(part) for part in path.stem.split("-")[:3])
            except ValueError:
                continue
            if host != 0 or attempt < from_attempt:
                continue
            try:
                text = path.read_text()
            except OSError:
                continue  # removed with its workload while we looked
            for line in text.splitlines():
                try:
                    records.append((attempt, replica, json.loads(line)))
                except json.JSONDecodeError:
                    continue  # a line cut short by a kill
        return cls(records)

    def host_zero(self) -> list[tuple[int, dict[str, Any]]]:
        """(attempt, record) of every replica's host 0."""
        return [(attempt, record) for attempt, _, record in self.records]

    def rank_zero(self, attempt: int) -> list[dict[str, Any]]:
        """Rank 0's records of one attempt (replica 0 host 0, every process that held that
        place), in time order."""
        found = [record for a, replica, record in self.records if a == attempt and replica == 0]
        found.sort(key=lambda r: r.get("t", 0.0))
        return found

    def steps_and_reforms(self) -> tuple[list[StepDone], list[tuple[float, int]]]:
        """Every step reported and every elastic re-formation, as :mod:`hotswap.core.recovery` reads them."""
        steps: list[StepDone] = []
        reforms: list[tuple[float, int]] = []
        for attempt, record in self.host_zero():
            kind, t = record.get("kind"), float(record.get("t", 0.0))
            if kind == EVENT_STEP:
                steps.append(StepDone(t, attempt, t - float(record.get("duration_s", 0.0)), int(record.get("step", 0))))
            elif kind == EVENT_ELASTIC:
                reforms.append((t, attempt))
        return steps, reforms


def first_step_after(directory: Path, attempt: int, failed_at: float) -> float | None:
    """When the first productive step after a failure at ``failed_at`` under ``attempt - 1``
    (restarted into ``attempt``) was made, from the workers' records; None while none was
    (the end of the recovery :mod:`hotswap.core.recovery` defines, as ``describe`` shows it)."""
    steps, reforms = WorkerEvents.read(directory, from_attempt=attempt - 1).steps_and_reforms()
    found = recoveries([(failed_at, attempt - 1)], steps, reforms)
    return found[0].recovered_at if found else None
