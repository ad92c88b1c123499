"""xpk's vocabulary: the one mapping from hotswap's state to xpk's words, and xpk's filters."""

from __future__ import annotations

import pytest

from hotswap.api import xpk_status as xpk
from hotswap.api.xpk_status import with_xpk_words
from hotswap.backends.views import table_row


@pytest.mark.parametrize(
    ("status", "message", "words"),
    [
        ("RUNNING", "running on 2 slice(s)", ("Admitted", "running on 2 slice(s)")),
        ("RESTARTING", "restarting: node n failed; hotswapped", ("Admitted", "restarting: node n failed; hotswapped")),
        ("QUEUED", "preempted by high (priority high)", ("Evicted", "Preempted to accommodate a higher priority Workload")),
        ("QUEUED", "evicted by Kueue (Preempted): Preempted to accommodate a workload", ("Evicted", xpk.PREEMPTED_MESSAGE)),
        ("QUEUED", "requeued: node n failed; it cannot wait for repair", ("Evicted", "requeued: node n failed; it cannot wait for repair")),
        ("QUEUED", "queued: waiting for 2 slice(s) of v4-8", ("QuotaReserved", "queued: waiting for 2 slice(s) of v4-8")),
        ("SUCCESSFUL", "finished: all 4 workers exited 0", ("Finished", "JobSet finished successfully")),
        ("FAILED", "failed: exit code 1 is not a restart code", ("Finished", "JobSet failed: exit code 1 is not a restart code")),
        ("FAILED", "", ("Finished", "JobSet failed")),
    ],
)
def test_xpk_words(status: str, message: str, words: tuple[str, str]) -> None:
    got = xpk.xpk_status(status, message)
    assert (got.status, got.message) == words


@pytest.mark.parametrize(
    ("status", "message", "held", "wanted", "state"),
    [
        ("RUNNING", "running on 2 slice(s)", 2, 2, "RUNNING"),
        ("RUNNING", "scaled down to 1 slice(s): node failed", 1, 2, "RUNNING 1/2 (elastic)"),
        ("RUNNING", "restarted: node n failed; hotswapped", 1, 1, "HOTSWAPPED"),
        ("RESTARTING", "restarting: node n failed; hotswapped", 1, 1, "RESTARTING (hotswap)"),
        ("QUEUED", "preempted by high (priority high)", 0, 1, "QUEUED (preempted)"),
        ("FAILED", "failed: x", 0, 1, "FAILED"),
    ],
)
def test_hotswap_state_keeps_what_xpk_has_no_word_for(status: str, message: str, held: int, wanted: int, state: str) -> None:
    assert xpk.hotswap_state(status, message, held, wanted) == state


CASES = {
    # name: (status, message, slices held)
    "user-first-job-failed": ("FAILED", "failed: exit code 1", 0),
    "user-second-job-success": ("SUCCESSFUL", "finished: all workers exited 0", 0),
    "user-third-job-running": ("RUNNING", "running on 1 slice(s)", 1),
    "user-third-job-restarting": ("RESTARTING", "restarting: BlockingRecreate", 1),
    "user-forth-job-in-queue": ("QUEUED", "queued: waiting for 1 slice(s) of v4-8", 0),
    "user-fifth-job-preempted": ("QUEUED", "preempted by high (priority high)", 0),
}


@pytest.mark.parametrize(
    ("status_filter", "expected"),
    [
        ("EVERYTHING", set(CASES)),
        ("FINISHED", {"user-first-job-failed", "user-second-job-success"}),
        ("FAILED", {"user-first-job-failed"}),
        ("SUCCESSFUL", {"user-second-job-success"}),
        ("RUNNING", {"user-third-job-running", "user-third-job-restarting"}),
        ("QUEUED", {"user-forth-job-in-queue", "user-fifth-job-preempted"}),
    ],
)
def test_filter_by_status_as_seed_002(status_filter: str, expected: set[str]) -> None:
    """Seed 002's example: which filter-status each of its jobs has."""
    got = {name for name, (s, m, held) in CASES.items() if xpk.matches(s, m, held, name, status_filter, None)}
    assert got == expected


def test_filter_by_job_is_a_substring_as_in_xpk() -> None:
    names = ["alice-train", "train-bob", "bob", "trainer"]
    assert [n for n in names if xpk.matches("RUNNING", "", 1, n, "EVERYTHING", "train")] == ["alice-train", "train-bob", "trainer"]
    assert [n for n in names if xpk.matches("RUNNING", "", 1, n, "EVERYTHING", None)] == names


def test_views_grow_xpk_fields_and_keep_hotswaps_status() -> None:
    view = {
        "name": "low", "priority": "low", "status": "QUEUED", "status_message": "preempted by high (priority high)",
        "status_time": "2026-01-01T00:00:00Z", "created_time": "2026-01-01T00:00:00Z", "slices": [], "num_slices": 1,
        "restarts": 0, "preemptions": 1,
    }
    grown = with_xpk_words(view)
    assert {k: grown[k] for k in view} == view  # nothing renamed or removed
    assert (grown["xpk_status"], grown["xpk_status_message"], grown["hotswap_state"]) == (
        "Evicted", xpk.PREEMPTED_MESSAGE, "QUEUED (preempted)"
    )
    row = table_row(grown)
    assert row[6:8] == ["Evicted", xpk.PREEMPTED_MESSAGE] and row[-1] == "QUEUED (preempted)"
    assert "" not in row  # empty cells read <none>, so awk's fields stay in place


def test_a_row_of_a_jobset_hotswap_cannot_read_has_no_empty_or_none_cells() -> None:
    view = {"name": "x", "priority": "unknown", "status": "FAILED", "status_message": "not a hotswap workload",
            "status_time": None, "created_time": None, "slices": [], "num_slices": None}
    row = table_row(view)
    assert "None" not in row and "" not in row
    assert row[6:8] == ["Finished", "JobSet failed: not a hotswap workload"]
