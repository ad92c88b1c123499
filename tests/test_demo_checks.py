"""A drill fails on any restart or failure it did not inject, as the controller recorded them
(the failure policy's charged restarts and hangs have checks of their own: drills.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hotswap.demo.drills import DemoOptions, Drill

CHECK = "nothing restarted or failed but what the drill injected"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOTSWAP_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "state"


def _row(kind: str, workload: str | None, message: str = "") -> dict[str, Any]:
    return {"t": 1.0, "kind": kind, "workload": workload, "message": message, "data": None}


class _RecordedDrill(Drill):
    """A drill (no cluster) whose controller recorded ``rows``, having injected ``faults``."""

    scenario = "hotswap"
    title = "recorded"

    def __init__(self, rows: list[dict[str, Any]], faults: list[str]) -> None:
        super().__init__(DemoOptions(), live=False)
        self.rows, self.faults = rows, faults

    def drill(self) -> dict[str, Any]:
        self.marks += [{"t": 1.0, "what": what, "node": "n-0"} for what in self.faults]
        return {}

    def timeline(self) -> list[dict[str, Any]]:
        return self.rows


def verdict(rows: list[dict[str, Any]], faults: list[str]) -> dict[str, Any]:
    summary = _RecordedDrill(rows, faults).run()
    return next(c for c in summary["checks"] if c["name"] == CHECK) | {"drill_passed": summary["passed"]}


def test_a_restart_the_drill_did_not_inject_fails_it() -> None:
    check = verdict([_row("admit", "mnist"), _row("restart", "mnist", "restarting: a worker exited 143")], [])
    assert not check["passed"] and not check["drill_passed"]
    assert check["detail"] == "mnist: restarted 1 time(s), 0 fault(s) injected"


def test_restarts_beyond_the_injected_faults_fail_it_and_a_requeue_counts() -> None:
    rows = [_row("restart", "high"), _row("requeue", "high"), _row("restart", "high")]
    assert not verdict(rows, ["fail", "fail"])["passed"]
    assert verdict(rows[:2], ["fail", "fail"])["passed"]


def test_a_workload_that_failed_fails_it() -> None:
    check = verdict([_row("fail", "low", "failed: exit code 1")], ["fail"])
    assert not check["passed"] and check["detail"] == "low: failed: exit code 1"


def test_preemptions_deletions_and_elastic_changes_are_no_restart() -> None:
    rows = [_row("preempt", "low"), _row("admit", "low"), _row("scaledown", "elastic"), _row("scaleup", "elastic"),
            _row("remove", "mnist"), _row("created", "mnist")]
    check = verdict(rows, [])
    assert check["passed"] and check["detail"] == "0 restart(s) for 0 injected fault(s), no failure"


def test_a_drills_mttr_is_the_recovery_its_records_hold_not_timed_from_its_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """The drill asked for the failure at 100.0; the controller recorded it at 100.004 and the
    first step after it came at 100.254. An earlier recovery and one still open are not it."""
    from hotswap.demo import drills

    recoveries = [
        {"failed_at": 50.0, "recovered_at": 50.3, "seconds": 0.3},
        {"failed_at": 100.004, "recovered_at": None, "seconds": None},
    ]
    monkeypatch.setattr(drills.LOCAL, "describe_workload", lambda cluster, name: {"progress": {"recoveries": recoveries}})
    drill = _RecordedDrill([], [])
    drill.options.timeout_s = 1.0
    monkeypatch.setattr(drill, "_fail_fast", lambda: None)  # no cluster behind this drill
    monkeypatch.setattr(drill, "_follow_controller", lambda: None)
    with pytest.raises(drills.DrillFailed, match="high's recovery in its records"):
        drills.recorded_recovery(drill, "high", 100.0)  # still open: the drill waits, then fails
    recoveries[1] = {"failed_at": 100.004, "recovered_at": 100.254, "seconds": 0.25}
    assert drills.recorded_recovery(drill, "high", 100.0) == (100.004, 100.254)
