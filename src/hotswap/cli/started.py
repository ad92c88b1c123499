"""When this command started: the wall time ``demo`` and ``simulate`` report runs from here.

The process's own start as the kernel recorded it (Linux ``/proc``), so the interpreter's
start and the imports count, as they do for the person waiting; elsewhere, when this module
was first imported (the CLI imports it as it starts).
"""

from __future__ import annotations

import time

from hotswap.api.processes import started_at

_IMPORTED_AT = time.time()


def command_started_at() -> float:
    """The epoch time this process started (at the latest, when the CLI was imported)."""
    return min(started_at() or _IMPORTED_AT, _IMPORTED_AT)


def seconds_since_start() -> float:
    """Wall time of this command so far, from its process's start."""
    return time.time() - command_started_at()
