"""Goodput of a local workload from its timeline and its workers' events (no processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hotswap.api.worker_output import event_record
from hotswap.backends.local.queries.goodput import workload_goodput


def row(t: float, kind: str, **data: object) -> dict:
    return {"t": t, "kind": kind, "data": json.dumps(data) if data else None}


def record(num_slices: int = 2, attempt: int = 2) -> dict:
    return {"spec": {"num_slices": num_slices}, "created_at": 0.0, "attempt": attempt}


def write_events(directory: Path, attempt: int, lines: list[str]) -> None:
    path = directory / "events" / f"{attempt}-0-0.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def test_a_plain_script_has_no_goodput_and_says_why(tmp_path: Path) -> None:
    """Only steps the workers report are productive (issue 25 item 5): a command that reports
    none is up, not known to train."""
    timeline = [row(10.0, "admit", attempt=1, slices=["a", "b"], start=True)]
    result = workload_goodput(record(attempt=1), timeline, tmp_path, now=110.0)
    assert result["source"] == "controller"
    assert result["slice_seconds"]["queued"] == pytest.approx(2 * 10.0)
    assert result["slice_seconds"]["productive"] == 0.0
    assert result["slice_seconds"]["startup"] == pytest.approx(2 * 100.0)
    assert result["goodput"] == 0.0
    assert "reported no training step" in result["reason"]


def test_a_job_preempted_before_its_first_step_has_goodput_zero(tmp_path: Path) -> None:
    timeline = [
        row(0.0, "admit", attempt=1, slices=["a"], start=True),
        row(2.0, "preempt"),
    ]
    write_events(tmp_path, 1, [event_record("start", 0.5)])  # the SDK started; no step completed
    result = workload_goodput(record(num_slices=1, attempt=1), timeline, tmp_path, now=13.0)
    assert result["goodput"] == 0.0 and result["slice_seconds"]["productive"] == 0.0
    assert result["badput"]["queued"] == pytest.approx(11 / 13, abs=1e-3)
    assert result["reason"].startswith("its workers reported no training step")


def test_restart_wastes_the_steps_redone_and_books_recovery(tmp_path: Path) -> None:
    timeline = [
        row(0.0, "admit", attempt=1, slices=["a", "b"], start=True),
        row(30.0, "restart", attempt=2, slices=["c", "b"], start=True),
    ]
    write_events(tmp_path, 1, [
        event_record("start", 0.5),
        *(event_record("step", 5.0 + i, step=i + 1, duration_s=1.0, slices=2) for i in range(20)),
        event_record("checkpoint_save", 15.5, step=10, blocking_s=0.5),
    ])
    write_events(tmp_path, 2, [
        event_record("start", 30.5),
        event_record("checkpoint_restore", 33.0, step=10, duration_s=1.0, source="checkpoint"),
        *(event_record("step", 35.0 + i, step=11 + i, duration_s=1.0, slices=2) for i in range(10)),
    ])
    result = workload_goodput(record(), timeline, tmp_path, now=45.0)
    seconds = result["slice_seconds"]
    assert result["source"] == "workers"
    assert seconds["wasted_progress"] == pytest.approx(2 * 10.0)  # steps 11-20 of attempt 1 were redone
    assert seconds["productive"] == pytest.approx(2 * (10 + 10))
    assert seconds["checkpoint_restore"] == pytest.approx(2 * 1.0)
    assert seconds["checkpoint_save"] == pytest.approx(2 * 0.5)
    assert sum(seconds.values()) == pytest.approx(2 * 45.0)


def test_preemption_is_queued_time(tmp_path: Path) -> None:
    timeline = [
        row(0.0, "admit", attempt=1, slices=["a"], start=True),
        row(10.0, "preempt"),
        row(40.0, "admit", attempt=2, slices=["b"], start=True),
    ]
    result = workload_goodput(record(num_slices=1), timeline, tmp_path, now=50.0)
    assert result["slice_seconds"]["queued"] == pytest.approx(30.0)
    assert result["slice_seconds"]["startup"] == pytest.approx(20.0)  # up, but no step reported
