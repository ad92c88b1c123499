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


def test_a_plain_script_has_unknown_goodput_and_says_why_never_startup(tmp_path: Path) -> None:
    """Only steps the workers report are productive (issue 25 item 5), and a command that reports
    none (``echo hello``, ``sleep 5``, ``exit 1``) did not spend its time starting up: its goodput
    is unknown, with the reason, and no badput it did not spend (issue 34 item 4)."""
    timeline = [row(10.0, "admit", attempt=1, slices=["a", "b"], start=True)]
    result = workload_goodput(record(attempt=1), timeline, tmp_path, now=110.0)
    assert result["source"] == "controller"
    assert result["goodput"] is None
    assert result["reason"] == "no step was reported: the command does not use hotswap.train (or none completed)"
    assert result["slice_seconds"]["queued"] == pytest.approx(2 * 10.0)
    assert result["badput"]["queued"] == pytest.approx(10 / 110, abs=1e-4)
    assert result["running_share"] == pytest.approx(100 / 110, abs=1e-4)
    assert {k for k, v in result["slice_seconds"].items() if v} == {"queued"}  # no startup, recovery...


def test_a_plain_script_that_exited_at_once_books_no_startup(tmp_path: Path) -> None:
    """``exit 1`` with no restarts: admitted, failed a moment later; nothing but its queue time
    is a badput."""
    timeline = [row(1.0, "admit", attempt=1, slices=["a"], start=True), row(1.5, "fail", reason="exit code 1")]
    result = workload_goodput(record(num_slices=1, attempt=1), timeline, tmp_path, now=99.0)
    assert result["goodput"] is None and result["wall_s"] == pytest.approx(1.5)
    assert result["badput"]["startup"] == 0.0 and result["badput"]["recovery"] == 0.0
    assert result["running_share"] == pytest.approx(0.5 / 1.5, abs=1e-4)


def test_a_job_preempted_before_its_first_step_has_unknown_goodput(tmp_path: Path) -> None:
    timeline = [
        row(0.0, "admit", attempt=1, slices=["a"], start=True),
        row(2.0, "preempt"),
    ]
    write_events(tmp_path, 1, [event_record("start", 0.5)])  # the SDK started; no step completed
    result = workload_goodput(record(num_slices=1, attempt=1), timeline, tmp_path, now=13.0)
    assert result["goodput"] is None and result["slice_seconds"]["productive"] == 0.0
    assert result["badput"]["queued"] == pytest.approx(11 / 13, abs=1e-3)
    assert result["reason"] == "no step was reported: its workers started hotswap.train and stopped before their first step"


def test_a_workload_that_never_ran_says_so(tmp_path: Path) -> None:
    result = workload_goodput(record(num_slices=1, attempt=1), [], tmp_path, now=5.0)
    assert result["goodput"] is None and result["badput"]["queued"] == 1.0
    assert result["reason"] == "no step was reported: its workers never ran"


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
    assert result["running_share"] == pytest.approx(20 / 50)  # up, but no step reported: unknown, not startup


def elastic_steps(first: int, t0: float, count: int, slices: int) -> list[str]:
    return [event_record("step", t0 + i, step=first + i, duration_s=1.0, slices=slices) for i in range(count)]


def test_time_on_fewer_slices_is_degraded_not_recovery(tmp_path: Path) -> None:
    """Issue 34 item 1: an elastic job of 3 slices loses one at t=20 (the scale-down row) and gets
    it back at t=40 (the scale-up row). The survivors stall 1 s re-forming (their elastic event),
    step on 2 slices, re-form again 1 s for the joiner, step on 3. The missing slice's 20 s are
    degraded, the re-formations elastic, the steps on 2 slices goodput; nothing is recovery."""
    timeline = [
        row(0.0, "admit", attempt=1, slices=["a", "b", "c"], start=True),
        row(20.0, "scaledown", removed=["c"], slices=["a", "b"]),
        row(40.0, "scaleup", added=["c"], slices=["a", "b", "c"]),
        row(60.0, "complete"),
    ]
    write_events(tmp_path, 1, [
        event_record("start", 0.0),
        *elastic_steps(1, 1.0, 20, slices=3),  # steps 1-20 end at 1..20 (each 1 s long)
        event_record("elastic", 21.0, generation=2, slices=2, duration_s=1.0, cause="peer_failure"),
        *elastic_steps(21, 22.0, 19, slices=2),  # end at 22..40
        event_record("elastic", 41.0, generation=3, slices=3, duration_s=1.0, cause="membership"),
        *elastic_steps(40, 42.0, 19, slices=3),  # end at 42..60
    ])
    result = workload_goodput(record(num_slices=3, attempt=1), timeline, tmp_path, now=99.0)
    seconds = result["slice_seconds"]
    assert result["source"] == "workers"
    assert seconds["degraded"] == pytest.approx(1 * 20.0)  # one of 3 slices missing for 20 s (not recovery)
    assert seconds["elastic"] == pytest.approx(2 * 1.0 + 3 * 1.0)  # survivors re-forming; then all three
    assert seconds["productive"] == pytest.approx(3 * 20 + 2 * 19 + 3 * 19)  # steps on 2 slices count
    assert seconds["recovery"] == pytest.approx(0.0, abs=1e-9)
    assert sum(seconds.values()) == pytest.approx(3 * 60.0)


def test_a_re_formation_that_began_before_the_scale_down_row_is_elastic(tmp_path: Path) -> None:
    """The survivors' collective fails at t=10 (their elastic event starts there); the controller's
    scale-down row comes at t=10.5 and they train again at t=11. The half second at full size
    before the row is elastic for all slices, never recovery."""
    timeline = [
        row(0.0, "admit", attempt=1, slices=["a", "b"], start=True),
        row(10.5, "scaledown", removed=["b"], slices=["a"]),
        row(20.0, "complete"),
    ]
    write_events(tmp_path, 1, [
        *elastic_steps(1, 1.0, 10, slices=2),  # end at 1..10
        event_record("elastic", 11.0, generation=2, slices=1, duration_s=1.0, cause="peer_failure"),
        *elastic_steps(11, 12.0, 9, slices=1),  # end at 12..20
    ])
    seconds = workload_goodput(record(num_slices=2, attempt=1), timeline, tmp_path, now=30.0)["slice_seconds"]
    assert seconds["elastic"] == pytest.approx(2 * 0.5 + 1 * 0.5)
    assert seconds["degraded"] == pytest.approx(1 * 9.5)
    assert seconds["recovery"] == pytest.approx(0.0, abs=1e-9)
    assert seconds["productive"] == pytest.approx(2 * 10 + 1 * 9)


def test_a_job_shrunk_for_higher_priority_work_books_no_recovery(tmp_path: Path) -> None:
    """``demo shrink``'s low job: never disrupted, it gives a slice to a high job (a graceful
    scale-down) and grows back. Its time on fewer slices is degraded (issue 34 measured 11.9 %
    recovery)."""
    timeline = [
        row(0.0, "admit", attempt=1, slices=["a", "b"], start=True),
        row(10.0, "scaledown", removed=["b"], slices=["a"], preemptor="high"),
        row(30.0, "scaleup", added=["b"], slices=["a", "b"]),
    ]
    write_events(tmp_path, 1, [
        *elastic_steps(1, 1.0, 10, slices=2),
        event_record("elastic", 10.2, generation=2, slices=1, duration_s=0.2, cause="membership"),
        *elastic_steps(11, 12.0, 19, slices=1),  # end at 12..30
        event_record("elastic", 30.3, generation=3, slices=2, duration_s=0.3, cause="membership"),
        *elastic_steps(30, 31.3, 9, slices=2),  # end at 31.3..39.3
    ])
    result = workload_goodput(record(num_slices=2, attempt=1), timeline, tmp_path, now=40.0)
    seconds = result["slice_seconds"]
    assert seconds["degraded"] == pytest.approx(1 * 20.0 + 1 * 0.8)  # the missing slice; the gap before step 11
    assert seconds["recovery"] == pytest.approx(2 * 0.7)  # the tail after the last step, at full size
    assert result["badput"]["degraded"] > result["badput"]["recovery"]
