"""What every backend shows the same way: the ``workload list`` filters and table, and times.

The rows themselves are the JSON contract of DESIGN.md (``name``, ``priority``, ``status``,
``status_message``, ``status_time``, ``created_time``, ``slices``, ``num_slices``, ``restarts``,
``preemptions``); each backend builds them from its own state.
"""

from __future__ import annotations

from typing import Any

from hotswap.api.times import iso_utc

FINISHED = ("SUCCESSFUL", "FAILED")
STATUS_FILTERS = ("EVERYTHING", "FINISHED", "RUNNING", "QUEUED", "FAILED", "SUCCESSFUL")
TABLE_COLUMNS = [
    "Name",
    "Created Time",
    "Priority",
    "Slices Needed",
    "Slices Running",
    "Slices Done",
    "Status",
    "Status Message",
    "Status Time",
]


def iso(t: float | None) -> str | None:
    """UTC time as ISO 8601, like xpk's table (``2026-11-22T12:00:00Z``)."""
    if not t:
        return None  # never set (a real time is never the epoch)
    return iso_utc(t)


def matches(view: dict[str, Any], status: str, job_prefix: str | None) -> bool:
    """xpk's filters: ``--filter-by-status`` and ``--filter-by-job`` (a name prefix)."""
    if job_prefix and not view["name"].startswith(job_prefix):
        return False
    current = view["status"]
    if status == "EVERYTHING":
        return True
    if status == "FINISHED":
        return current in FINISHED
    if status == "RUNNING":
        return current in ("RUNNING", "RESTARTING")
    return current == status


def table_row(view: dict[str, Any]) -> list[str]:
    """One row of the ``workload list`` table, in xpk's column order."""
    held = len(view["slices"])
    done = view["num_slices"] if view["status"] == "SUCCESSFUL" else None
    return [
        view["name"],
        view["created_time"] or "",
        view["priority"],
        str(view["num_slices"]),
        str(held) if held else "<none>",
        str(done) if done is not None else "<none>",
        view["status"],
        view["status_message"],
        view["status_time"] or "",
    ]
