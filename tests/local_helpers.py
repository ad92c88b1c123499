"""Helpers for tests of the local backend: a private state directory, the CLI as a user runs
it, tiny worker scripts, and a clean-up that leaves no process behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

PYTHON = sys.executable

# A worker that records its start (and whether it got SIGTERM) and then waits.
SLEEPER = textwrap.dedent(
    """
    import os, signal, sys, time
    marks = os.environ.get("MARKS")
    name = f"{os.environ['HOTSWAP_WORKLOAD']}-{os.environ['HOTSWAP_ATTEMPT']}-{os.environ['JOB_INDEX']}-{os.environ['JOB_COMPLETION_INDEX']}"
    def mark(what):  # written aside and renamed: a reader never sees it half-written
        if marks:
            path = os.path.join(marks, name + "." + what)
            with open(path + ".partial", "w") as f:
                f.write(repr(time.time()))
            os.rename(path + ".partial", path)
    mark("start")
    print("started", os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["HOTSWAP_SLICE"], flush=True)
    linger = float(os.environ.get("LINGER", "0"))
    def on_term(*_):
        mark("term")
        time.sleep(linger)
        mark("stop")
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    code = int(os.environ.get("EXIT_CODE", "-1"))
    run_for = float(os.environ.get("RUN_FOR", "600"))
    time.sleep(run_for)
    mark("stop")
    sys.exit(code if code >= 0 else 0)
    """
)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A private state directory (HOTSWAP_HOME) whose clusters are removed after the test."""
    state = tmp_path / "state"
    yield state
    cleanup(state)


@pytest.fixture
def home_in_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``home``, also set as this process's HOTSWAP_HOME: for tests whose own process starts a
    cluster or reads its state (import it as ``home``)."""
    state = tmp_path / "state"
    monkeypatch.setenv("HOTSWAP_HOME", str(state))
    yield state
    cleanup(state)


def write_sleeper(directory: Path) -> str:
    script = directory / "sleeper.py"
    script.write_text(SLEEPER)
    return f"{PYTHON} {script}"


def hotswap(home: Path, *args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOTSWAP_HOME=str(home))
    result = subprocess.run(
        [PYTHON, "-m", "hotswap", *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(f"hotswap {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def database(home: Path, cluster: str) -> Path:
    return home / "clusters" / cluster / "state.db"


def query(home: Path, cluster: str, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
    connection = sqlite3.connect(database(home, cluster), timeout=30)
    connection.row_factory = sqlite3.Row
    try:
        return connection.execute(sql, args).fetchall()
    finally:
        connection.close()


def workloads(home: Path, cluster: str) -> dict[str, dict[str, Any]]:
    """name -> the core's record of every workload (from the database)."""
    return {json.loads(r["record"])["spec"]["name"]: json.loads(r["record"]) for r in query(home, cluster, "SELECT record FROM workloads")}


def live_workers(home: Path, cluster: str, workload: str | None = None) -> list[sqlite3.Row]:
    rows = query(home, cluster, "SELECT * FROM workers WHERE state IN ('starting', 'running', 'stopping') ORDER BY id")
    return [r for r in rows if workload is None or r["workload"] == workload]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def cleanup(home: Path) -> None:
    """Delete every cluster under ``home``; then kill whatever survived (never leave processes)."""
    root = home / "clusters"
    if not root.exists():
        return
    for cluster_dir in root.iterdir():
        pids: list[int] = []
        with contextlib.suppress(Exception):
            pids = [r["pid"] for r in query(home, cluster_dir.name, "SELECT pid FROM workers WHERE pid IS NOT NULL")]
        with contextlib.suppress(Exception):
            pids.append(int((cluster_dir / "controller.lock").read_text().strip()))
        with contextlib.suppress(Exception):
            hotswap(home, "cluster", "delete", "--cluster", cluster_dir.name, "--force", timeout=60)
        for pid in pids:
            if not _ours(pid, home):
                continue  # ended, and the pid may belong to someone else by now
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def _ours(pid: int, home: Path) -> bool:
    """A process of this test's cluster: a worker shim or a controller under ``home``."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return str(home) in command  # shims and controllers carry paths under home


def processes_of(home: Path) -> list[str]:
    """Every live process (zombies aside) started for ``home``'s clusters: its command line names
    a path under it, or its environment does (a spare and the zygote start with the controller's,
    which names HOTSWAP_HOME)."""
    mark = os.fsencode(str(home))
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            if mark not in command and mark not in (entry / "environ").read_bytes():
                continue
        except OSError:
            continue
        if alive(int(entry.name)):
            found.append(f"{entry.name}: {os.fsdecode(command.replace(bytes(1), b' '))[:160]}")
    return found
