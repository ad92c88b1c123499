"""The times ``hotswap demo`` and ``hotswap simulate`` report run from the command's start (its
process's), not from when a drill's or a simulation's own clock started: a user timing the
command with a stopwatch reads the same. And the live log's times and the plot's share that
origin (tests/test_demo_plots.py checks the plot's side).

The process's start is made to lie far back (1,000 s) so that a time measured from any later
moment is told apart without timing anything."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from hotswap.cli import started
from hotswap.cli.app import run
from hotswap.demo.drills import DemoOptions, Drill

LONG_AGO_S = 1000.0


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOTSWAP_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "state"


@pytest.fixture
def started_long_ago(monkeypatch: pytest.MonkeyPatch) -> float:
    t = time.time() - LONG_AGO_S
    monkeypatch.setattr(started, "started_at", lambda: t)
    return t


class _QuickDrill(Drill):
    """A drill with nothing to run (no cluster): what the CLI makes of any drill's summary."""

    scenario = "hotswap"
    title = "nothing"

    def drill(self) -> dict[str, Any]:
        self.event("the drill's own work")
        self.check("ran", True, "yes")
        return {}


def test_the_process_started_before_the_cli_was_imported() -> None:
    begun = started.started_at()
    assert begun is not None  # Linux: from /proc
    assert begun <= started._IMPORTED_AT <= time.time()
    assert started.command_started_at() == pytest.approx(begun, abs=0.05)  # computed again: the clocks read anew


def test_a_drill_times_its_log_and_its_wall_time_from_the_command_start(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.time() - LONG_AGO_S
    drill = _QuickDrill(DemoOptions(started_at=t0), live=False)
    summary = drill.run()
    assert summary["passed"] and summary["started_t"] == t0
    assert summary["wall_s"] >= LONG_AGO_S
    logged = [line for line in capsys.readouterr().err.splitlines() if "the drill's own work" in line]
    assert len(logged) == 1 and float(logged[0].split("s", 1)[0]) >= LONG_AGO_S, logged


def test_demo_reports_the_wall_time_from_the_process_start(
    home: Path, started_long_ago: float, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("torch")  # the CLI refuses the torch drills without it
    from hotswap.demo import scenarios

    monkeypatch.setitem(scenarios.DRILLS, "hotswap", _QuickDrill)
    assert run(["demo", "hotswap", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["started_t"] == pytest.approx(started_long_ago)
    assert summary["wall_s"] >= LONG_AGO_S


def test_simulate_reports_the_wall_time_from_the_process_start(started_long_ago: float, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["simulate", "--nodes", "64", "--days", "1", "--policy", "hotswap", "--jobs", "1", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["wall_s"] >= LONG_AGO_S
    assert document["policies"]["hotswap"]["wall_s"] < LONG_AGO_S  # a run's own time stays its own


def test_simulate_prints_the_commands_wall_time(started_long_ago: float, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["simulate", "--nodes", "64", "--days", "1", "--policy", "hotswap", "--jobs", "1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("simulated; the command took ") and float(last.split()[-2]) >= LONG_AGO_S, last
