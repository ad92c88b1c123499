"""Everything hotswap creates is owner-only (directories 0700, files 0600), as the README's
Security section says: a worker's goodput events and readiness marks, and the demo's archive of a
run (`demo-runs/`), whatever the worker's umask (issue 25 item 6)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
from local_helpers import cleanup, home, hotswap, wait_until, workloads  # noqa: F401 (home: a fixture)

from hotswap.api.membership import Membership
from hotswap.train.events import EventLog
from hotswap.train.formation import _mark_joined


def _open_to_others(root: Path) -> list[str]:
    """Every path under ``root`` (itself included) that others may read, write or enter."""
    found = []
    for directory, _, names in os.walk(root):
        for path in [directory, *(os.path.join(directory, n) for n in names)]:
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            wanted = 0o700 if os.path.isdir(path) else 0o600
            if mode != wanted:
                found.append(f"{path} {mode:o}")
    return found


@pytest.fixture
def open_umask():
    old = os.umask(0o022)  # what a user's shell usually has
    yield
    os.umask(old)


def test_a_workers_event_log_is_owner_only(tmp_path: Path, open_umask: None) -> None:
    log = EventLog(str(tmp_path / "1-0-0-1.jsonl"))
    log.record("start")
    assert stat.S_IMODE((tmp_path / "1-0-0-1.jsonl").stat().st_mode) == 0o600


def test_a_joiners_readiness_mark_is_owner_only(tmp_path: Path, open_umask: None) -> None:
    joined = tmp_path / "joined"
    joined.mkdir(mode=0o700)
    membership = Membership(2, ("c-np-0", "c-np-1"), 1, "127.0.0.1", 1234, 1, str(joined))
    _mark_joined(membership, "c-np-1", 0, 0)
    (mark,) = joined.iterdir()
    assert stat.S_IMODE(mark.stat().st_mode) == 0o600


def test_a_demo_runs_archive_is_owner_only(home: Path, monkeypatch: pytest.MonkeyPatch, open_umask: None) -> None:  # noqa: F811
    """A run like the demo's: a worker (umask 022) records goodput events; the drill's archive
    of the run's directory, and everything in it, is closed to others."""
    from hotswap.demo.drills import DemoOptions
    from hotswap.demo.scenarios import HotswapDrill

    monkeypatch.setenv("HOTSWAP_HOME", str(home))
    worker = (
        f"umask 022; {sys.executable} -c \"import os; from hotswap.train.events import EventLog;"
        " EventLog(os.environ['HOTSWAP_EVENTS_FILE']).record('start'); print('step=1')\""
    )
    try:
        hotswap(home, "cluster", "create", "--cluster", "d", "--device-type", "v6e-4", "--num-slices", "1", check=True)
        hotswap(home, "workload", "create", "--cluster", "d", "--workload", "w", "--command", worker, check=True)
        wait_until(lambda: workloads(home, "d")["w"]["phase"] in ("SUCCESSFUL", "FAILED"), timeout=60, what="the worker to finish")
        assert workloads(home, "d")["w"]["phase"] == "SUCCESSFUL", workloads(home, "d")["w"]
        drill = HotswapDrill(DemoOptions(), live=False)
        drill.cluster = "d"
        summary: dict = {}
        drill._archive(summary)
        archive = home / "demo-runs" / "d"
        assert summary["archive"] == str(archive)
        assert list(archive.glob("*/events/*.jsonl")), "the archive holds the worker's events"
        assert _open_to_others(home / "demo-runs") == []
        assert _open_to_others(home / "clusters" / "d" / "workloads") == []
    finally:
        cleanup(home)
