"""`cluster delete --force` always finishes after any sequence of crashes (issue 36, item 3),
leaving no process of the cluster (zygote and spares included) and no claim: the controller is
killed (with its zygote and a spare) and the next one, started by the delete, is killed again at
each moment of a spare's start, a zygote's start and of the deletion itself
(``HOTSWAP_TEST_CRASH_AT``, ``backends/local/crash_points.py``). What is left is read from /proc,
never from the cluster's own records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from local_helpers import cleanup, hotswap, processes_of, query, wait_until, write_sleeper

from hotswap.backends.local.crash_points import CRASH_AT, DELETION_POINTS
from hotswap.backends.local.tables import SPARE, WorkerRow
from hotswap.backends.local.workers.supervisor import Supervisor
from hotswap.backends.local.workers.zygotes import Zygote


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    state = tmp_path / "state"
    monkeypatch.setenv("HOTSWAP_HOME", str(state))
    monkeypatch.delenv(CRASH_AT, raising=False)
    yield state
    cleanup(state)


def _spares(home: Path) -> list:
    return query(home, "c", "SELECT * FROM workers WHERE state = 'warm' AND pid IS NOT NULL")


@pytest.mark.parametrize("point", ["none", *DELETION_POINTS])
def test_delete_finishes_after_a_controller_killed_at_each_moment(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    from hotswap.backends.local.commands import clusters as cluster_commands

    cluster_commands.create_cluster("c", "v4-8", 2, True, lambda _: True, warm_workers=2, warm_preload=["json"], zygote=True)
    hotswap(home, "workload", "create", "--workload", "w", "--cluster", "c", "--command", write_sleeper(tmp_path), check=True)
    root = home / "clusters" / "c"
    wait_until(lambda: len(_spares(home)) == 2 and (root / "zygote" / "ready").exists(), timeout=120, what="two spares and the zygote")
    # A sequence of crashes: the controller dies with a spare (and the zygote), so the controller
    # that the delete starts first refills the spare by fork (or starts a zygote), and is killed again.
    os.kill(int((root / "controller.lock").read_text()), signal.SIGKILL)
    os.killpg(_spares(home)[0]["pid"], signal.SIGKILL)
    if point != "spare-spawned":  # (a new zygote imports: the refill would wait for it)
        os.kill(json.loads((root / "zygote" / "ready").read_text())["pid"], signal.SIGKILL)
    if point != "none":
        monkeypatch.setenv(CRASH_AT, f"{point}@{tmp_path / 'crashed'}")
    result = hotswap(home, "cluster", "delete", "--cluster", "c", "--force", timeout=300)
    assert result.returncode == 0, result.stderr
    assert point == "none" or (tmp_path / "crashed").exists()  # a controller was killed there
    assert not root.exists()  # removed: the claim is gone with it
    assert processes_of(home) == []


def test_a_worker_not_yet_leading_its_group_is_still_signalled(tmp_path: Path) -> None:
    """A shim the zygote forked an instant ago may not have called setsid() yet: a signal to its
    group (which does not exist yet) must reach the process itself."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # in our group
    try:
        row = WorkerRow(1, SPARE, str(tmp_path), child.pid, None, "warm", None, None, None, None, None)
        supervisor = Supervisor(None)  # type: ignore[arg-type]
        supervisor.signal(row, signal.SIGTERM)
        assert child.wait(timeout=60) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


def test_a_zygote_left_importing_by_a_killed_controller_is_ended_by_the_next(tmp_path: Path) -> None:
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(600)\n")
    environment = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    first = Zygote(tmp_path, ["slow_import"], environment)
    first.start()
    orphan = first.process
    assert orphan is not None
    try:
        first.process = None  # its controller is killed: nobody waits for it
        second = Zygote(tmp_path, ["json"], environment)  # the next controller's, still importing
        second.start()
        assert orphan.wait(timeout=60) == -signal.SIGKILL
        second.stop()
    finally:
        orphan.kill()
        orphan.wait()


def test_processes_no_record_names_are_ended_before_cluster_deleted(home: Path, tmp_path: Path) -> None:
    """What no row names: a controller that has let go of the cluster but not yet exited (it
    outlived "cluster deleted" by seconds), a spare or zygote whose pid was never written, a
    worker's command: each is found by its marks in /proc and gone when the delete returns."""
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v4-8", "--num-slices", "1", check=True)
    root = home / "clusters" / "c"
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    lingering = [
        subprocess.Popen([*sleep, str(root)], start_new_session=True),  # as a controller's command line
        subprocess.Popen([*sleep, str(root / "zygote")], start_new_session=True),  # a zygote's (and its forks')
        subprocess.Popen(sleep, env={**os.environ, "HOTSWAP_EVENTS_FILE": str(root / "workloads" / "w" / "e")}),  # a worker's
    ]
    unrelated = subprocess.Popen([*sleep, f"{root}-other"])  # another cluster's name that starts alike
    try:
        result = hotswap(home, "cluster", "delete", "--cluster", "c", "--force")
        assert result.returncode == 0, result.stderr
        assert [p.poll() for p in lingering] == [-signal.SIGKILL] * 3
        assert unrelated.poll() is None
    finally:
        for process in (*lingering, unrelated):
            process.kill()
            process.wait()
