"""The events files a local workload's workers wrote (``HOTSWAP_EVENTS_FILE``: one per worker
process, ``events/<attempt>-<replica>-<host>[...].jsonl``), read once per look: goodput and
progress both read them, and the dashboard looks every second.

Only host 0 of each replica is read: every host of a replica reports the same steps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class WorkerEvents:
    """Each replica's host-0 records: (attempt, replica, record), file by file, line by line."""

    def __init__(self, records: list[tuple[int, int, dict[str, Any]]]) -> None:
        self.records = records

    @classmethod
    def read(cls, directory: Path) -> WorkerEvents:
        records: list[tuple[int, int, dict[str, Any]]] = []
        for path in sorted((directory / "events").glob("*.jsonl")):
            try:
                attempt, replica, host = (int(part) for part in path.stem.split("-")[:3])
            except ValueError:
                continue
            if host != 0:
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
