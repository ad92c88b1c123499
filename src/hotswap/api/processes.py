"""What Linux's ``/proc`` says of a process, read one way for every room that asks: when it
started (its start in clock ticks after boot, which with the boot tells a reused pid from the
process it was) and which boot of the machine this is. Stdlib only: the worker SDK, the CLI and
the local backend's shims all read it."""

from __future__ import annotations

import os
import time

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def start_ticks(pid: int | str = "self") -> int | None:
    """Field 22 of ``/proc/<pid>/stat``, the start in clock ticks after boot; None when the
    process does not exist, has ended (a zombie only waits to be reaped) or there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
        if fields[0] == b"Z":
            return None
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def started_at(pid: int | str = "self") -> float | None:
    """When the process started, in Unix seconds: its start ticks against the time since boot
    now (``btime`` in /proc/stat is whole seconds: too coarse); None where unknown."""
    ticks = start_ticks(pid)
    if ticks is None:
        return None
    try:
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return None
    return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))


def boot_id() -> str | None:
    """The kernel's id of this boot of the machine (a new one after every restart), if readable."""
    try:
        with open(BOOT_ID) as source:
            return source.read().strip() or None
    except OSError:
        return None
