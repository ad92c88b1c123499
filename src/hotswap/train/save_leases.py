"""Saves in flight, seen through the checkpoint directory: a restart restores the survivors'
last save, not the checkpoint before it.

When a slice is lost under ``Recreate``, the new attempt starts while the old attempt's
survivors are still being terminated: they save the step they hold (``termination`` or
``recovery``) and exit. Restoring at once would take the periodic checkpoint before it and
lose the steps since. A survivor may not even have seen its SIGTERM yet: held in a collective
with the lost peer (DDP's all-reduce), it runs no Python signal handler until that returns.

So every worker that may write a last save holds a *lease* in the checkpoint directory,
``leases/<attempt>-<host>-<pid>``, whose modification time a background thread renews every
:data:`RENEW_S` (it runs while the main thread waits in C++), and which it removes once it will
write no more. The rank that restores a later attempt first waits, at most the termination
grace period, while a lease of an earlier attempt is live: renewed within :data:`STALE_S` by
the filesystem's own clock (its renewal compared with this process's own lease, so hosts'
clocks never meet), or, on this host, held by a process that is still running (so a killed
worker here is seen gone at once). Without such a lease nothing waits.

"This host" is the host name and, written in the lease, the kernel's boot and PID namespace
with the holder's start time: a JobSet's pods keep their host names across a restart, and a
new pod's process may have the lost one's pid (even its own), so a name and a pid alone would
make a restart wait the whole grace period for a process long gone. A lease of another
namespace is judged by its renewal; a pid now held by a process that started later is gone.

Framework-neutral; both SDKs use it through their checkpointers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hotswap.api.processes import boot_id, start_ticks
from hotswap.train.events import say

log = logging.getLogger("hotswap.train")

LEASES_DIR = "leases"
RENEW_S = 0.5  # how often a holder renews its lease
STALE_S = 3.0  # a lease not renewed for this long is a process gone (another host's)
_POLL_S = 0.05


def _alive_here(pid: int) -> bool:
    """Whether a process of this host still runs (a zombie has ended: it only waits to be reaped)."""
    if os.path.isdir("/proc/self"):
        return start_ticks(pid) is not None
    try:  # no /proc: ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SaveLeases:
    """This process's lease in a checkpoint directory, and the wait for earlier attempts'."""

    def __init__(self, directory: Path | str, attempt: int, host: str | None = None, pid: int | None = None) -> None:
        self.directory = Path(directory) / LEASES_DIR
        self.attempt = attempt
        self.host = host or socket.gethostname()
        self.pid = pid or os.getpid()
        self.path = self.directory / f"{attempt}-{self.host}-{self.pid}"
        self.namespace = _namespace()
        self._released = threading.Event()
        self._renewer: threading.Thread | None = None

    # Holding ---------------------------------------------------------------------------------

    def hold(self) -> None:
        """Take the lease and renew it in the background until :meth:`release`."""
        try:
            self.directory.mkdir(mode=0o700, exist_ok=True)
            descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "w") as lease:
                lease.write(f"{self.namespace} {_start_ticks(self.pid)}")
        except OSError as error:  # the save itself will say what is wrong with the directory
            log.debug("hotswap: cannot write the lease %s: %s", self.path, error)
            return
        self._renewer = threading.Thread(target=self._renew, name="hotswap-save-lease", daemon=True)
        self._renewer.start()

    def release(self) -> None:
        """This process writes no more checkpoints."""
        self._released.set()
        with contextlib.suppress(OSError):
            self.path.unlink()

    def _renew(self) -> None:
        while not self._released.wait(RENEW_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    # Waiting ---------------------------------------------------------------------------------

    def wait_for_earlier(
        self, limit_s: float, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
    ) -> float:
        """Wait while an earlier attempt's lease is live, at most ``limit_s``; the seconds waited."""
        started = clock()
        announced = False
        while True:
            live = self.live_earlier()
            waited = clock() - started
            if not live:
                if announced:
                    log.info("hotswap: the previous attempt's last save is done (waited %.2fs)", waited)
                return waited
            if waited >= limit_s:
                log.warning(
                    "hotswap: the previous attempt still holds %s after %.1fs (the grace period): restoring without it",
                    ", ".join(sorted(live)), waited,
                )
                return waited
            if not announced:  # in the worker's log: it explains a restart that pauses here
                say(f"hotswap: waiting for the previous attempt's last save ({', '.join(sorted(live))})")
                announced = True
            sleep(_POLL_S)

    def live_earlier(self) -> list[str]:
        """The names of the live leases of earlier attempts (see the module)."""
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return []
        now = self._filesystem_now()
        live = []
        for entry in entries:
            attempt, host, pid = _parse(entry.name)
            if attempt is None or attempt >= self.attempt:
                continue
            namespace, started = _recorded(entry.path)
            if host == self.host and namespace in ("", self.namespace):  # "": written without /proc
                if _alive_here(pid) and started in ("", _start_ticks(pid)):
                    live.append(entry.name)
                else:  # ended without releasing it (killed), its pid perhaps reused: nobody renews it
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
                continue
            try:
                renewed = entry.stat().st_mtime
            except OSError:
                continue
            if now is None or now - renewed < STALE_S:
                live.append(entry.name)
        return live

    def _filesystem_now(self) -> float | None:
        """The filesystem's clock, read from this process's own lease touched now (None when it
        cannot be: a stale-looking lease is then taken as live, and the wait is bounded)."""
        try:
            os.utime(self.path)
            return self.path.stat().st_mtime
        except OSError:
            return None


def saver_may_be_live(directory: Path | str, host: str, pid: int) -> bool:
    """Whether process ``pid`` of ``host`` may still be writing in the checkpoint directory
    ``directory``: false only for one of this host that no longer runs here and holds no lease
    written from another PID namespace of this host name (a pod's). Another host's processes
    cannot be seen from here: they may be. A killed save's leftovers are removed only when this
    is false (:meth:`CheckpointStore.prune`)."""
    if host != socket.gethostname() or _alive_here(pid):
        return True
    try:
        entries = list(os.scandir(Path(directory) / LEASES_DIR))
    except OSError:
        return False
    here = _namespace()
    return any(_parse(entry.name)[1:] == (host, pid) and _recorded(entry.path)[0] not in ("", here) for entry in entries)


def _namespace() -> str:
    """This kernel's boot and this process's PID namespace ("" without /proc): where a pid
    names the same process."""
    boot = boot_id()
    try:
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}" if boot else ""
    except OSError:
        return ""


def _start_ticks(pid: int) -> str:
    """When process ``pid`` started, in clock ticks after boot ("" where unknown)."""
    ticks = start_ticks(pid)
    return "" if ticks is None else str(ticks)


def _recorded(path: str) -> tuple[str, str]:
    """The namespace and start time a lease's holder wrote in it ("" for what it did not)."""
    try:
        with open(path) as lease:
            namespace, _, started = lease.read(512).partition(" ")
    except (OSError, UnicodeDecodeError):
        return "", ""
    return namespace.strip(), started.strip()


def _parse(name: str) -> tuple[int | None, str, int]:
    attempt, _, rest = name.partition("-")
    host, _, pid = rest.rpartition("-")
    try:
        return int(attempt), host, int(pid)
    except ValueError:
        return None, "", 0
