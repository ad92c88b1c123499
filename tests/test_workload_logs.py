"""`workload logs` (issue 16): says why there is nothing (still queued, never started) with a
non-zero exit, and reads a deleted workload's log until its cluster is deleted."""

from __future__ import annotations

from pathlib import Path

from local_helpers import home, hotswap, live_workers, wait_until, workloads, write_sleeper  # noqa: F401 (home: a fixture)


def _logs(home: Path, name: str, *flags: str):
    return hotswap(home, "workload", "logs", "--cluster", "c", "--workload", name, *flags)


def test_no_logs_says_why_and_fails(home: Path, tmp_path: Path) -> None:
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v4-8", "--num-slices", "1", check=True)
    sleeper = write_sleeper(tmp_path)
    hotswap(home, "workload", "create", "--cluster", "c", "--workload", "first", "--command", sleeper, check=True)
    hotswap(home, "workload", "create", "--cluster", "c", "--workload", "waits", "--command", sleeper, check=True)
    queued = _logs(home, "waits")
    assert queued.returncode == 3 and queued.stdout == "", queued
    assert queued.stderr.strip().splitlines() == [queued.stderr.strip()]
    assert "waits has no logs: it is QUEUED and has not started yet" in queued.stderr
    wait_until(lambda: "started" in _logs(home, "first").stdout, what="the running workload's log")


def test_a_deleted_workload_keeps_its_log_until_the_cluster_goes(home: Path, tmp_path: Path) -> None:
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v4-8", "--num-slices", "1", check=True)
    hotswap(home, "workload", "create", "--cluster", "c", "--workload", "job", "--command", write_sleeper(tmp_path), check=True)
    wait_until(lambda: "started" in _logs(home, "job").stdout, what="the worker's first line")
    hotswap(home, "workload", "delete", "--cluster", "c", "--workload", "job", check=True)
    wait_until(lambda: not live_workers(home, "c", "job"), what="the worker to exit")
    after = _logs(home, "job")
    assert after.returncode == 0 and "started" in after.stdout, after
    assert _logs(home, "job", "--follow").returncode == 0  # a deleted workload's log ends at once
    assert _logs(home, "other").returncode == 3
    hotswap(home, "cluster", "delete", "--cluster", "c", check=True)
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v4-8", "--num-slices", "1", check=True)
    gone = _logs(home, "job")
    assert gone.returncode == 3 and "no workload named job" in gone.stderr
