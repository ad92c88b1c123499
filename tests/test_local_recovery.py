"""A controller killed at the worst moment of a worker's start (found by the chaos drill, seed
2353128851): after it forked the shim but before the pid was committed, and before the shim
wrote its own pid file. The next controller must adopt that worker, not start it a second time
(a second copy would keep running, unsupervised, on a slice later given to another workload)."""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import signal
import sys
import time
from pathlib import Path

from hotswap.backends.local.controller.host_loss import HostLoss, Predecessor
from hotswap.backends.local.controller.recovery import POLL_S, recover
from hotswap.backends.local.workers.supervisor import WorkerLaunch
from hotswap.backends.local.workers.lifecycle import Workers
from hotswap.store.paths import ClusterPaths
from hotswap.backends.local.tables import LocalStore, WorkerIdentity, WorkerRow

IDENTITY = WorkerIdentity(workload="w", seq=1, attempt=0, slice="c-np-0", replica=0, host=0, node="c-np-0-0")


def shims_of(directory: Path) -> list[int]:
    """Live shim processes started for ``directory`` (read from /proc, as the chaos drill does)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if b"shim.py" in command and os.fsencode(str(directory)) in command.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def resume(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def no_host_loss() -> HostLoss:
    return HostLoss(Predecessor(None, None))


def controller(paths: ClusterPaths) -> Workers:
    store = LocalStore.open(paths.database, create=not paths.database.exists())
    return Workers(store, paths, selectors.DefaultSelector(), (0, ()), lambda _: 3.0, lambda row, code, lost, attempt_over: None)


def started_but_unrecorded(tmp_path: Path) -> tuple[ClusterPaths, Workers, WorkerRow, int]:
    """A controller that committed a worker and started its shim, then died before recording it."""
    paths = ClusterPaths.of("c", tmp_path)
    paths.root.mkdir(parents=True)
    first = controller(paths)
    with first.store.transaction():
        command = shlex.join([sys.executable, "-c", "import time; time.sleep(60)"])
        launch = WorkerLaunch(IDENTITY, tmp_path, tmp_path / "w.log", command, str(tmp_path), dict(os.environ))
        row, launch = first.add(launch, time.time())
    pid, _ = first.supervisor.spawn(row, launch)
    return paths, first, row, pid


def test_a_worker_started_but_never_recorded_is_adopted_not_started_again(tmp_path: Path) -> None:
    """...and recovery does not wait for its pid file (it held the cluster unanswered for as long
    as the shim took, up to 60 s): the loop looks again until the shim has written it."""
    paths, _, row, pid = started_but_unrecorded(tmp_path)
    os.kill(pid, signal.SIGSTOP)  # the shim has not written its pid file yet (it is slow to start)
    try:
        assert not (Path(row.dir) / "pid").exists()
        second = controller(paths)
        unrecorded = recover(second, no_host_loss())  # returns with the shim still stopped
        assert second.store.worker_rows.get(row.id).pid is None
        assert unrecorded.next_deadline() == POLL_S  # the loop wakes to look again
        unrecorded.check()
        assert second.store.worker_rows.get(row.id).pid is None  # still not there: not started twice
        resume(pid)
        deadline = time.monotonic() + 60  # a hang guard, not a measurement
        while unrecorded.next_deadline() is not None:
            assert time.monotonic() < deadline, "the shim's pid file was never adopted"
            time.sleep(POLL_S)
            unrecorded.check()
        assert shims_of(Path(row.dir)) == [pid]
        assert second.store.worker_rows.get(row.id).pid == pid
        assert second.store.worker_rows.get(row.id).state == "running"
    finally:
        for shim in shims_of(Path(row.dir)):
            os.killpg(shim, signal.SIGKILL)
        resume(pid)


def test_a_worker_whose_shim_died_before_writing_its_pid_is_started_again(tmp_path: Path) -> None:
    paths, first, row, pid = started_but_unrecorded(tmp_path)
    os.kill(pid, signal.SIGKILL)
    first.supervisor.exit_code(row)  # reaped: its start lock is free again
    second = controller(paths)
    try:
        recover(second, no_host_loss())
        started = second.store.worker_rows.get(row.id).pid
        assert started is not None and started != pid
        assert shims_of(Path(row.dir)) == [started]
    finally:
        for shim in shims_of(Path(row.dir)):
            os.killpg(shim, signal.SIGKILL)


def test_a_start_whose_shim_already_lives_adopts_it_and_does_not_crash(tmp_path: Path) -> None:
    """Issue 36, item 3: a controller asked to start a row whose shim already holds the start
    lock (a killed controller started it) died with ``AlreadyStarted`` in the middle of a
    `cluster delete`. It adopts the live shim from its pid file instead."""
    paths, _, row, pid = started_but_unrecorded(tmp_path)
    try:
        wait = time.monotonic() + 60
        while not (Path(row.dir) / "pid").exists() and time.monotonic() < wait:
            time.sleep(0.01)
        second = controller(paths)
        second.spawn([(row, None)])
        assert second.store.worker_rows.get(row.id).pid == pid
        assert shims_of(Path(row.dir)) == [pid]  # not started twice
    finally:
        for shim in shims_of(Path(row.dir)):
            os.killpg(shim, signal.SIGKILL)


def test_what_a_killed_shim_left_is_not_waited_for_in_place(tmp_path: Path) -> None:
    """A shim killed alone under its running command: the command is killed, and the controller
    waited in place (up to 5 s) for it to die before deciding on the worker's end. Now the end is
    held, the loop wakes to look again, and it is decided (lost, not the workload's fault) once
    nothing of the worker lives."""
    from hotswap.backends.local.workers.stops import LOST_REASON, REAP_POLL_S

    paths, _, row, pid = started_but_unrecorded(tmp_path)
    exits: list[tuple[int, str | None]] = []
    second = Workers(
        LocalStore.open(paths.database), paths, selectors.DefaultSelector(), (0, ()), lambda _: 3.0,
        lambda row, code, lost, attempt_over: exits.append((code, lost)),
    )
    try:
        deadline = time.monotonic() + 60  # a hang guard, not a measurement
        while not (Path(row.dir) / "started").exists():
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.01)
        command = int((Path(row.dir) / "started").read_text().split()[0])
        recover(second, no_host_loss())  # watches the shim
        row = second.store.worker_rows.get(row.id)
        os.kill(pid, signal.SIGKILL)  # the shim alone: its command runs on
        while alive_process(pid):
            assert time.monotonic() < deadline, "the shim did not die"
            time.sleep(0.01)
        os.kill(command, signal.SIGSTOP)  # still there when its end is first looked at
        dying = second.supervisor.group_gone
        second.supervisor.group_gone = lambda _: False  # type: ignore[method-assign]  # (as on a busy host)
        second.ended(row)
        assert exits == [] and second.next_deadline(time.time()) <= REAP_POLL_S
        second.supervisor.group_gone = dying  # type: ignore[method-assign]
        while second.stops.dying:
            assert time.monotonic() < deadline, "the killed command never died"
            time.sleep(REAP_POLL_S)
            second.finish_dying()
        assert exits == [(137, LOST_REASON)] and not alive_process(command)
    finally:
        for shim in shims_of(Path(row.dir)):
            os.killpg(shim, signal.SIGKILL)


def alive_process(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
