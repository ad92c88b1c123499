"""When this command started: the wall time ``demo`` and ``simulate`` report runs from here.

The process's own start as the kernel recorded it (Linux ``/proc``), so the interpreter's
start and the imports count, as they do for the person waiting; elsewhere, when this module
was first imported (the CLI imports it as it starts).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_IMPORTED_AT = time.time()


def command_started_at() -> float:
    """The epoch time this process started (at the latest, when the CLI was imported)."""
    return min(_process_start() or _IMPORTED_AT, _IMPORTED_AT)


def seconds_since_start() -> float:
    """Wall time of this command so far, from its process's start."""
    return time.time() - command_started_at()


def _process_start() -> float | None:
    """The process's start from ``/proc``: its start in clock ticks after boot, against the
    time since boot now (``btime`` would round the boot to a whole second)."""
    try:
        # Field 22 of /proc/self/stat, counted after the command name (which may hold spaces).
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):  # no /proc, no CLOCK_BOOTTIME
        return None
