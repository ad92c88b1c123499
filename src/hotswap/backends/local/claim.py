"""Exactly one controller per local cluster: an OS lock that no file operation can take away.

The controller holds an exclusive ``flock`` on an open descriptor of the cluster's *directory*
for its whole life. Deleting the socket or the pid file removes nothing that the lock depends
on, and the directory cannot be removed without removing the database with it, so a second
controller can never claim a cluster whose controller still runs. Before it acts (commits a
round, signals or starts a worker) the controller checks that the directory and the database
are still the very ones it locked and opened (:meth:`Claim.verify`): a cluster removed or
replaced behind its back is left alone.

``cluster delete`` takes the same lock to remove the directory, so no controller can start on
a half-removed cluster.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time

from hotswap.api.processes import boot_id, start_ticks
from hotswap.store.paths import ClusterPaths, write_private
from hotswap.store.state import Store


class AlreadyClaimed(Exception):
    """Another process (a controller, or a ``cluster delete``) holds the cluster."""


class LostClaim(Exception):
    """The cluster's directory or database is no longer the one this controller locked."""


def _identity(path: os.PathLike[str] | str | int) -> tuple[int, int]:
    status = os.fstat(path) if isinstance(path, int) else os.stat(path)
    return status.st_dev, status.st_ino


class Claim:
    """The cluster's lock, held on ``descriptor`` until :meth:`release`."""

    def __init__(self, paths: ClusterPaths, descriptor: int) -> None:
        self.paths = paths
        self.descriptor = descriptor
        self.directory = _identity(descriptor)
        self.database = _identity(paths.database)

    @classmethod
    def take(cls, paths: ClusterPaths, wait_s: float = 0.0) -> Claim:
        """Lock the cluster, waiting up to ``wait_s`` for its holder to let go.

        FileNotFoundError when the cluster (its directory or database) does not exist;
        :class:`AlreadyClaimed` when it stays held."""
        descriptor = os.open(paths.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        deadline = time.monotonic() + wait_s
        try:
            while True:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise AlreadyClaimed(paths.name) from None
                    time.sleep(0.02)  # the holder is finishing (a controller writing its last answer)
            return cls(paths, descriptor)
        except BaseException:
            os.close(descriptor)
            raise

    def verify(self) -> None:
        """Raise :class:`LostClaim` unless the cluster's directory and database are the ones
        this claim locked (deleted, moved or replaced means: someone else's now)."""
        try:
            same = _identity(self.paths.root) == self.directory and _identity(self.paths.database) == self.database
        except FileNotFoundError:
            same = False
        if not same:
            raise LostClaim(f"the directory or database of cluster {self.paths.name} was removed or replaced")

    def announce(self, store: Store) -> None:
        """Record this process as the cluster's controller: in the database (which the CLI
        reads to wake it) and in the pid file (which people and scripts read)."""
        pid = os.getpid()
        store.set_controller(pid, start_ticks(pid), boot_id())
        write_private(self.paths.pid_file, f"{pid}\n")

    def keep_pid_file(self) -> None:
        """Write the pid file again if someone removed it."""
        if not self.paths.pid_file.exists():
            write_private(self.paths.pid_file, f"{os.getpid()}\n")

    def release(self) -> None:
        if self.descriptor >= 0:
            os.close(self.descriptor)  # closing the descriptor drops the lock
            self.descriptor = -1


def holder_pid(store: Store) -> int | None:
    """The pid of the controller the database records, if that very process still runs (its
    kernel start time matches): a pid file can be deleted, the database record cannot."""
    holder = store.controller()
    if holder is None or holder[0] <= 0:
        return None
    pid, ticks = holder
    now = start_ticks(pid)
    return pid if now is not None and (ticks is None or now == ticks) else None


def wake_holder(store: Store) -> bool:
    """Ask the recorded controller, if it is alive, to listen on its socket again (SIGUSR1):
    the CLI found no socket to talk to although a controller holds the cluster."""
    holder = store.controller()
    if holder is None:
        return False
    pid, ticks = holder
    if pid == os.getpid() or pid <= 0:
        return False
    try:
        descriptor = os.pidfd_open(pid)  # signals through it cannot reach a later owner of the pid
    except OSError:
        return False
    try:
        if start_ticks(pid) is None or (ticks is not None and start_ticks(pid) != ticks):
            return False  # ended, or the pid belongs to another process by now
        signal.pidfd_send_signal(descriptor, signal.SIGUSR1)
        return True
    except OSError:
        return False
    finally:
        os.close(descriptor)
