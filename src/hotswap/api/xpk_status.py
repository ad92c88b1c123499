"""xpk's words for a workload's state, from hotswap's own (one pure mapping for every view).

xpk's ``workload list`` shows the type and message of the last condition of Kueue's Workload:
``Admitted``, ``Evicted``, ``QuotaReserved`` (pending) or ``Finished``, with messages such as
"Preempted to accommodate a higher priority Workload" and "JobSet finished successfully"; its
``--filter-by-status`` and ``--filter-by-job`` read those columns. hotswap's phases
(``QUEUED``, ``RUNNING``, ``RESTARTING``, ``SUCCESSFUL``, ``FAILED``) stay the JSON ``status``
for scripts; these words are extra fields and columns beside them, never a replacement.
"""

from __future__ import annotations

import dataclasses
from typing import Any

ADMITTED = "Admitted"
EVICTED = "Evicted"
PENDING = "QuotaReserved"  # Kueue's last condition while it cannot reserve quota (reason Pending)
FINISHED = "Finished"

PREEMPTED_MESSAGE = "Preempted to accommodate a higher priority Workload"
SUCCEEDED_MESSAGE = "JobSet finished successfully"
FAILED_MESSAGE = "JobSet failed"

# xpk's --filter-by-status values, in xpk's order.
STATUS_FILTERS = ("EVERYTHING", "FINISHED", "RUNNING", "QUEUED", "FAILED", "SUCCESSFUL")

_HOLDING = ("RUNNING", "RESTARTING")
_LEFT_QUEUE_PREFIXES = ("preempted", "evicted", "requeued")


@dataclasses.dataclass(frozen=True)
class XpkStatus:
    status: str  # Admitted, Evicted, QuotaReserved or Finished
    message: str


def xpk_status(status: str, message: str) -> XpkStatus:
    """xpk's status and message for hotswap's ``status`` and ``status_message``."""
    lowered = message.lower()
    if status == "SUCCESSFUL":
        return XpkStatus(FINISHED, SUCCEEDED_MESSAGE)
    if status == "FAILED":
        reason = message.split(":", 1)[1].strip() if lowered.startswith("failed:") else message
        return XpkStatus(FINISHED, f"{FAILED_MESSAGE}: {reason}" if reason else FAILED_MESSAGE)
    if status in _HOLDING:
        return XpkStatus(ADMITTED, message)
    if "preempted" in lowered:
        return XpkStatus(EVICTED, PREEMPTED_MESSAGE)
    if lowered.startswith(_LEFT_QUEUE_PREFIXES):
        return XpkStatus(EVICTED, message)
    return XpkStatus(PENDING, message)


def hotswap_state(status: str, message: str, held: int, wanted: int | None) -> str:
    """hotswap's richer state for the extra column: the phase, and what xpk has no word for
    (a hotswapped restart, an elastic workload running on fewer slices than it asked for)."""
    if status == "RUNNING" and wanted and 0 < held < wanted:
        return f"RUNNING {held}/{wanted} (elastic)"
    if status in _HOLDING and "hotswapped" in message:
        return "HOTSWAPPED" if status == "RUNNING" else "RESTARTING (hotswap)"
    if status == "QUEUED" and "preempted" in message.lower():
        return "QUEUED (preempted)"
    return status


def with_xpk_words(view: dict[str, Any]) -> dict[str, Any]:
    """A workload view (DESIGN.md's JSON row) with xpk's ``xpk_status`` / ``xpk_status_message``
    and hotswap's ``hotswap_state`` added, unless it has them already."""
    if "xpk_status" in view:
        return view
    message = view["status_message"] or ""
    words = xpk_status(view["status"], message)
    state = hotswap_state(view["status"], message, len(view["slices"]), view.get("num_slices"))
    return {**view, "xpk_status": words.status, "xpk_status_message": words.message, "hotswap_state": state}


def matches(status: str, message: str, held: int, name: str, status_filter: str, job_filter: str | None) -> bool:
    """xpk's filters on one workload: ``--filter-by-job`` keeps names that contain the text
    (xpk's test is a substring, not a prefix); ``--filter-by-status`` reads xpk's status, its
    message and whether slices are held (RUNNING: admitted with slices; QUEUED: without)."""
    if job_filter and job_filter not in name:
        return False
    words = xpk_status(status, message)
    if status_filter == "EVERYTHING":
        return True
    if status_filter == "RUNNING":
        return words.status in (ADMITTED, EVICTED) and held > 0
    if status_filter == "QUEUED":
        return words.status in (ADMITTED, EVICTED, PENDING) and held == 0
    if status_filter == "FINISHED":
        return words.status == FINISHED
    if status_filter in ("FAILED", "SUCCESSFUL"):
        # xpk looks for "failed" / "finished" in the message; hotswap knows which it was.
        return words.status == FINISHED and status == status_filter
    raise ValueError(f"unknown status filter {status_filter!r}")  # the CLI checks the value first
