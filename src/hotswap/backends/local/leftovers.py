"""Every process of a local cluster, found by its marks in /proc: what ``cluster delete`` ends
once no controller holds the cluster, whatever the records say. A controller killed an instant
after starting a spare or a zygote has written its pid nowhere; an earlier controller's zygote,
still importing when that controller died, is named by no record at all.

A process is the cluster's when an argument of its command line is the cluster's directory or
a path inside it (the controller, the shims, the spares and the zygote are started with their
directories as arguments, and what the zygote forks keeps its command line), or when its
environment's ``HOTSWAP_EVENTS_FILE`` lies inside it (a worker's command, and what it starts).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from hotswap.api.worker import HOTSWAP_EVENTS_FILE
from hotswap.api.processes import start_ticks

GONE_WAIT_S = 10.0


def cluster_processes(root: Path) -> list[int]:
    """The live processes (zombies left out) of the cluster at ``root``, this one and its
    ancestors excepted."""
    inside = os.fsencode(f"{root}/")
    exact = os.fsencode(str(root))
    events = os.fsencode(f"{HOTSWAP_EVENTS_FILE}={root}/")
    spared = _ancestors()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            arguments = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            ours = any(a == exact or a.startswith(inside) for a in arguments)
            if not ours:
                ours = any(v.startswith(events) for v in Path(entry.path, "environ").read_bytes().split(b"\0"))
            if ours and start_ticks(int(entry.name)) is not None:  # (None: a zombie, or gone)
                found.append(int(entry.name))
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return found


def end_cluster_processes(root: Path) -> list[int]:
    """SIGKILL every process of the cluster at ``root`` and wait (up to :data:`GONE_WAIT_S`)
    until they are gone; returns the pids ended."""
    ended = []
    deadline = time.monotonic() + GONE_WAIT_S
    while time.monotonic() < deadline:
        found = cluster_processes(root)  # again: a spare's shim may have forked meanwhile
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        ended.extend(p for p in found if p not in ended)
        time.sleep(0.02)
    return ended


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids
