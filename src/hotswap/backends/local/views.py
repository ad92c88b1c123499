"""What the CLI shows about a local cluster, as plain data (the JSON contract of DESIGN.md).

Built from the database rows without constructing pydantic models, so ``workload list``
stays fast.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from hotswap.api.priority import Priority

FINISHED = ("SUCCESSFUL", "FAILED")
STATUS_FILTERS = ("EVERYTHING", "FINISHED", "RUNNING", "QUEUED", "FAILED", "SUCCESSFUL")


def iso(t: float | None) -> str | None:
    """UTC time as ISO 8601, like xpk's table (``2026-11-22T12:00:00Z``)."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def workload_view(record: dict[str, Any]) -> dict[str, Any]:
    spec = record["spec"]
    return {
        "name": spec["name"],
        "priority": Priority.parse(spec["priority"]).label,
        "status": record["phase"],
        "status_message": record["status_message"],
        "status_time": iso(record["status_time"]),
        "created_time": iso(record["created_at"]),
        "slices": list(record["slices"]),
        "num_slices": spec["num_slices"],
        "min_slices": spec["min_slices"],
        "device_type": spec["device_type"],
        "restarts": record["restarts"],
        "preemptions": record["preemptions"],
        "disruptions": record["disruptions"],
        "attempt": record["attempt"],
        "command": spec["command"],
    }


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
