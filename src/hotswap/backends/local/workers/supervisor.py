"""Worker processes of the local backend: start, signal, watch and re-adopt them.

Each worker (one host of one slice) runs under ``shim.py`` as the leader of its own process
group, so a signal to the group reaches everything the worker started. The worker table in the
store is the durable record: a controller killed with -9 and restarted finds its workers there,
checks that each pid is still the same process (kernel start time), and watches it again.
Exits are noticed through pidfds (readable when the process ends): no polling.

A host of a GPU-backed slice with several GPUs runs one process per GPU, as torchrun's local
agent does: the shim starts them all (their environments differ in LOCAL_RANK and RANK, each
writes its own log) and is still the one worker the controller supervises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from hotswap.api.processes import start_ticks
from hotswap.store.paths import write_private
from hotswap.backends.local.tables import LocalStore, WorkerIdentity, WorkerRow

SHIM = Path(__file__).with_name("shim.py")
KILLED_EXIT_CODE = 128 + signal.SIGKILL
LAUNCH_FILE = "launch.json"
LOCAL_FILE = "local.json"  # the shim's list of the host's other processes
START_LOCK_FILE = "lock"  # held by the worker's shim from before its birth to its end
STARTED_FILE = "started"  # the shim's mark that the command runs: the start is complete
EXIT_FILE = "exit"


class Ending(enum.Enum):
    """How a worker's process ended, as far as the workload is concerned.

    The shim records every exit of the command; only a shim killed with SIGKILL leaves none. Who
    killed it, and whether the workload's command was running by then, tells a fault of the
    workload from one of hotswap's: a kill aimed at the controller can hit the process it has
    just forked, which carries the controller's command line until it becomes the shim.
    """

    EXITED = "exited"  # the exit code is the command's (recorded, or reaped as our child)
    KILLED = "killed"  # the shim and its command were killed, after the start was complete
    NEVER_RAN = "never ran"  # the shim was killed before the start was complete: start it again
    ORPHANED = "orphaned"  # the shim alone was killed while its command ran (the command is now killed too)


class AlreadyStarted(Exception):
    """A shim of this worker row lives (a controller started it and died before recording it)."""


@dataclasses.dataclass(frozen=True)
class LocalProcess:
    """Another process of the worker's host (local rank 1 and up): what it changes in the
    worker's environment, and its log."""

    env: dict[str, str]
    log: Path

    def to_json(self) -> dict[str, object]:
        return {"env": self.env, "log": str(self.log)}


@dataclasses.dataclass(frozen=True)
class WorkerLaunch:
    """How to start one worker process (``dir`` is its own directory: pid and exit records)."""

    identity: WorkerIdentity
    dir: Path
    log: Path
    command: str
    cwd: str
    env: dict[str, str]
    local: tuple[LocalProcess, ...] = ()  # the host's other processes, started by the shim too

    def save(self) -> None:
        """Keep the launch beside the worker, for a controller that restarts before starting it."""
        record = {
            "command": self.command, "cwd": self.cwd, "env": self.env, "log": str(self.log),
            "local": [p.to_json() for p in self.local],
        }
        write_private(self.dir / LAUNCH_FILE, json.dumps(record))  # the environment may hold secrets

    @classmethod
    def saved(cls, row: WorkerRow) -> WorkerLaunch:
        """The launch :meth:`save` kept for a committed worker row."""
        record = json.loads((Path(row.dir) / LAUNCH_FILE).read_text())
        local = tuple(LocalProcess(p["env"], Path(p["log"])) for p in record.get("local", ()))
        return cls(row.identity, Path(row.dir), Path(record["log"]), record["command"], record["cwd"], record["env"], local)


class Supervisor:
    def __init__(self, store: LocalStore) -> None:
        self.store = store
        self.children: dict[int, subprocess.Popen[bytes]] = {}  # worker id -> our child

    def spawn(
        self, row: WorkerRow, launch: WorkerLaunch, fork: Callable[[int], tuple[int, int | None] | None] | None = None
    ) -> tuple[int, int | None]:
        """Start the process of a worker row that a committed decision created: by ``fork(lock)``
        (the zygote: see zygotes.py) where it gives a pid and start ticks, else a new shim.

        Returns its pid and kernel start time; the caller records them (in one transaction for
        all the workers of a round: starting workers fast is what failover time is made of).
        """
        # The start lock is taken here, before the fork, and the shim inherits it: there is no
        # moment at which the worker lives but its lock is free (see :meth:`started_unrecorded`).
        # Taken first: the records of a live shim are never removed.
        lock = _try_lock(launch.dir)
        if lock is None:
            raise AlreadyStarted(str(launch.dir))
        try:
            for stale in ("pid", EXIT_FILE, STARTED_FILE, LOCAL_FILE):
                (launch.dir / stale).unlink(missing_ok=True)
            if launch.local:
                (launch.dir / LOCAL_FILE).write_text(json.dumps([p.to_json() for p in launch.local]))
            forked = fork(lock) if fork is not None else None
            if forked is not None:
                return forked  # not our child: watched as a re-adopted worker is (pidfd, records)
            cwd = launch.cwd if os.path.isdir(launch.cwd) else str(launch.dir)
            child = subprocess.Popen(
                [sys.executable, "-S", str(SHIM), str(launch.dir), str(launch.log), str(lock), "--", launch.command],
                cwd=cwd,
                env=launch.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(lock,),
            )
        finally:
            os.close(lock)
        self.children[row.id] = child
        return child.pid, start_ticks(child.pid)

    def started_unrecorded(self, row: WorkerRow) -> bool:
        """Whether a shim of this row lives although no pid was recorded: a controller killed
        between starting it and committing its pid (the shim may not have written its pid file
        yet either). Starting the row again would run the worker twice."""
        try:
            lock = _try_lock(Path(row.dir))
        except FileNotFoundError:  # its directory is gone: nothing of it can run
            return False
        if lock is None:
            return True
        os.close(lock)
        return False

    @staticmethod
    def recorded_start(row: WorkerRow) -> tuple[int, int] | None:
        """The pid and kernel start time the row's shim wrote in its pid file, if it has."""
        try:
            pid_text, ticks_text = (Path(row.dir) / "pid").read_text().split()
            return int(pid_text), int(ticks_text)
        except (FileNotFoundError, ValueError):
            return None

    def alive(self, row: WorkerRow) -> bool:
        if row.pid is None:
            return False
        child = self.children.get(row.id)
        if child is not None:
            return child.poll() is None
        ticks = start_ticks(row.pid)
        return ticks is not None and (row.start_ticks is None or ticks == row.start_ticks)

    def signal(self, row: WorkerRow, number: int) -> None:
        """Signal the worker's whole process group, if it is still the same process (or the
        process alone, if it leads no group yet: a shim forked an instant ago)."""
        if row.pid is None or not self.alive(row):
            return
        try:
            os.killpg(row.pid, number)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(row.pid, number)

    def pidfd(self, row: WorkerRow) -> int | None:
        """A descriptor that becomes readable when the worker ends (None if it already has)."""
        if row.pid is None or not self.alive(row):
            return None
        try:
            return os.pidfd_open(row.pid)
        except ProcessLookupError:
            return None

    def exit_code(self, row: WorkerRow) -> int:
        """How an ended worker ended: reaped status, else the shim's record, else killed."""
        return self.ending(row)[0]

    def ending(self, row: WorkerRow) -> tuple[int, Ending]:
        """The exit code of an ended worker and how it ended (:class:`Ending`). A shim killed
        before its start was complete or while its command ran on has what it left of the
        command killed here (SIGKILL, not waited for: see :meth:`group_gone`)."""
        child = self.children.pop(row.id, None)
        if child is not None:
            code = child.wait()
            if code >= 0:
                return code, Ending.EXITED  # the shim exited by itself: with the command's code
        try:
            return int((Path(row.dir) / EXIT_FILE).read_text().strip()), Ending.EXITED
        except (FileNotFoundError, ValueError):
            pass  # the shim itself was killed (SIGKILL leaves no record)
        if row.identity.is_spare or row.pid is None:
            return KILLED_EXIT_CODE, Ending.KILLED
        left = _kill_orphans(row.pid)
        if not (Path(row.dir) / STARTED_FILE).exists():
            return KILLED_EXIT_CODE, Ending.NEVER_RAN
        return KILLED_EXIT_CODE, Ending.ORPHANED if left else Ending.KILLED

    def group_gone(self, row: WorkerRow) -> bool:
        """Whether nothing of the ended worker's process group lives any more (what its shim
        left is killed by :meth:`ending`; on a busy host it may take a while to die)."""
        return row.pid is None or start_ticks(row.pid) is not None or not _group_members(row.pid)

    def adopt(self, old_id: int, new_id: int) -> None:
        """A spare's process now serves another worker row (see spares.py)."""
        child = self.children.pop(old_id, None)
        if child is not None:
            self.children[new_id] = child

    def forget(self, row: WorkerRow) -> None:
        self.children.pop(row.id, None)


def _kill_orphans(group: int) -> bool:
    """SIGKILL what is left of the process group of a dead shim (its leader); whether anything
    was left. A group whose leader's pid lives again is someone else's."""
    if start_ticks(group) is not None:
        return False
    members = _group_members(group)
    if not members:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
    return True


def _group_members(group: int) -> list[int]:
    """The live processes (not zombies) of process group ``group``, from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == group:
            members.append(int(entry.name))
    return members


def _try_lock(directory: Path) -> int | None:
    """The worker's start lock, taken (a descriptor), or None if a live shim holds it."""
    lock = os.open(directory / START_LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        return None
    return lock
