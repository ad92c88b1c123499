"""What every backend shows the same way: the ``workload list`` filters and table, and times.

The rows themselves are the JSON contract of DESIGN.md (``name``, ``priority``, ``status``,
``status_message``, ``status_time``, ``created_time``, ``slices``, ``num_slices``, ``restarts``,
``preemptions``); each backend builds them from its own state, and :func:`hotswap.api.xpk_status.with_xpk_words` adds
xpk's ``xpk_status`` / ``xpk_status_message`` and hotswap's ``hotswap_state`` (the contract only
grows).
"""

from __future__ import annotations

from typing import Any

from hotswap.api import xpk_status as xpk
from hotswap.api.times import iso_utc
from hotswap.api.xpk_status import with_xpk_words

FINISHED = ("SUCCESSFUL", "FAILED")
STATUS_FILTERS = xpk.STATUS_FILTERS
# xpk's columns in xpk's order (its VM counts are slices here), then hotswap's own state.
TABLE_COLUMNS = [
    "Name",
    "Created Time",
    "Priority",
    "Slices Needed",
    "Slices Running/Ran",
    "Slices Done",
    "Status",
    "Status Message",
    "Status Time",
    "Hotswap State",
]
# On a narrow terminal, the columns left out first (Name and Status always stay).
TABLE_HIDE_ORDER = [
    "Created Time", "Slices Done", "Slices Needed", "Status Time", "Priority", "Slices Running/Ran",
    "Hotswap State", "Status Message",
]


def iso(t: float | None) -> str | None:
    """UTC time as ISO 8601, like xpk's table (``2026-11-22T12:00:00Z``)."""
    if not t:
        return None  # never set (a real time is never the epoch)
    return iso_utc(t)


def matches(view: dict[str, Any], status: str, job_filter: str | None) -> bool:
    """xpk's filters, ``--filter-by-status`` and ``--filter-by-job`` (names containing it)."""
    return xpk.matches(view["status"], view["status_message"] or "", len(view["slices"]), view["name"], status, job_filter)


def table_row(view: dict[str, Any]) -> list[str]:
    """One row of the ``workload list`` table: xpk's columns in xpk's order, then hotswap's state."""
    view = with_xpk_words(view)
    held = len(view["slices"])
    done = view["num_slices"] if view["status"] == "SUCCESSFUL" else None
    return [
        view["name"],
        view["created_time"] or "<none>",
        view["priority"],
        str(view["num_slices"]) if view.get("num_slices") is not None else "<none>",
        str(held) if held else "<none>",
        str(done) if done is not None else "<none>",
        view["xpk_status"],
        view["xpk_status_message"] or "<none>",
        view["status_time"] or "<none>",
        view["hotswap_state"],
    ]
