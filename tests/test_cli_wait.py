"""`workload create --wait --until running` succeeds only once every worker has started and none
has failed (issue 25 item 3): a RUNNING seen for a moment is not enough."""

from __future__ import annotations

from pathlib import Path

import pytest
from local_helpers import cleanup, home, hotswap, write_sleeper  # noqa: F401 (home: a fixture)

from hotswap.api.errors import WaitTimeoutError, WorkloadFailedError
from hotswap.cli import waiting
from hotswap.cli.waiting import Until, wait_for_state


def _view(status: str, workers: list[tuple[str, int | None]], *, slices: int = 1, message: str = "") -> dict:
    return {
        "name": "ex", "status": status, "status_message": message or status.lower(), "device_type": "v6e-4",
        "attempt": 1, "slices": [f"c-np-{i}" for i in range(slices)],
        "workers": [
            {"attempt": 1, "slice": f"c-np-{i}", "replica": i, "host": 0, "pid": 100 + i, "state": state, "exit_code": code}
            for i, (state, code) in enumerate(workers)
        ],
    }


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _wait(views: list[dict], until: Until = Until.RUNNING, timeout: float | None = 30) -> dict:
    clock = _Clock()
    feed = iter(views)
    last: list[dict] = []

    def describe() -> dict:
        last[:] = [next(feed, last[0] if last else views[-1])]
        return last[0]

    return wait_for_state(describe, "ex", until, timeout, clock=clock, sleep=clock.sleep)


def test_a_momentary_running_whose_worker_then_fails_exits_125_with_the_reason() -> None:
    views = [_view("RUNNING", [("running", None)])] * 2 + [
        _view("FAILED", [("exited", 1)], message="failed: worker c-np-0/0 exit code 1 is not a restart code (42,127-255): user error")
    ]
    with pytest.raises(WorkloadFailedError) as raised:
        _wait(views)
    assert raised.value.exit_code == 125
    assert str(raised.value) == "workload ex failed: worker c-np-0/0 exit code 1 is not a restart code (42,127-255): user error"


def test_running_is_reached_only_when_every_worker_has_started_and_kept_running() -> None:
    not_all = _view("RUNNING", [("running", None), ("starting", None)], slices=2)
    with pytest.raises(WaitTimeoutError):
        _wait([not_all], timeout=5)
    one_failed = _view("RUNNING", [("running", None), ("exited", 1)], slices=2)
    with pytest.raises(WaitTimeoutError):
        _wait([one_failed], timeout=5)
    steady = _view("RUNNING", [("running", None), ("running", None)], slices=2)
    assert _wait([steady])["status"] == "RUNNING"


def test_a_restart_between_two_looks_starts_the_settling_again(monkeypatch: pytest.MonkeyPatch) -> None:
    first = _view("RUNNING", [("running", None)])
    restarted = _view("RUNNING", [("running", None)])
    restarted["workers"][0]["pid"] = 999
    clock, seen = _Clock(), []
    feed = iter([first] * 3 + [restarted] * 10)

    def describe() -> dict:
        seen.append(clock.now)
        return next(feed)

    wait_for_state(describe, "ex", Until.RUNNING, 30, clock=clock, sleep=clock.sleep)
    assert clock.now >= 3 * waiting.POLL_S + waiting.SETTLE_S  # settled on the new workers, not the old


def test_a_finished_workload_counts_as_running_at_once() -> None:
    assert _wait([_view("SUCCESSFUL", [("exited", 0)])])["status"] == "SUCCESSFUL"


def test_create_wait_of_a_command_that_fails_at_once_exits_125(home: Path) -> None:  # noqa: F811
    try:
        hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "1", check=True)
        failed = hotswap(home, "workload", "create", "--cluster", "c", "--workload", "ex", "--command", "exit 1", "--wait", "--timeout", "60")
        assert failed.returncode == 125, failed.stderr
        last = failed.stderr.strip().splitlines()[-1]
        assert last.startswith("error: workload ex failed: worker c-np-0/0 exit code 1"), failed.stderr
        sleeper = write_sleeper(home.parent)
        ok = hotswap(home, "workload", "create", "--cluster", "c", "--workload", "ok", "--command", sleeper, "--wait", "--timeout", "60")
        assert ok.returncode == 0, ok.stderr
        assert "workload ok is RUNNING" in ok.stderr
    finally:
        cleanup(home)
