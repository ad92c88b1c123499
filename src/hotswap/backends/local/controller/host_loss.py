"""Whether the workers a restarted controller finds dead were lost with the machine.

A worker whose shim was killed leaves no exit record. While the controller lives it sees such an
end (the worker's pidfd) and judges it as the command's exit 137, charged: the machine was up,
something killed that one worker. A controller that starts finds the workers that ended while no
controller watched, and a power loss, a reboot, or the OOM killer or an operator killing every
process of the cluster is no workload's fault. The records prove such a loss in two ways:

- the machine restarted: the boot id recorded with the predecessor controller is not this boot's;
- the controller died with its workers: nothing the predecessor recorded lives (no worker, no
  warm spare, no shim whose start was unrecorded), and a dead worker gave no sign of life (its
  records, log, events: each write moves a file's mtime) later than its controller's last
  (``Liveness``: the controller touches a file every second) plus :data:`TOGETHER_S`. A worker that
  wrote on after its controller had gone did not end with it.

Such a worker is reported lost (``Workers.ended``): the workload restarts uncharged from its
newest committed checkpoint, with the cause in its status and timeline. Anything else (one
worker killed while others live on, a worker that outlived its controller) is judged as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

from hotswap.api.worker import HOTSWAP_EVENTS_FILE
from hotswap.api.processes import boot_id
from hotswap.backends.local.tables import LIVE_WORKER_STATES, LocalStore, WorkerRow
from hotswap.backends.local.workers.supervisor import Supervisor, WorkerLaunch

LIVENESS_FILE = "controller.alive"  # in the cluster's directory; its mtime is the controller's last beat
HEARTBEAT_S = 1.0
# How much later than its controller's last beat a worker's last write may be and still count as
# ended with it: a frozen machine stops all at once, but a starved controller beats late.
TOGETHER_S = 30.0
REBOOTED = "was lost with the host: the machine restarted (a new boot id)"
KILLED_TOGETHER = "was lost with the host: its controller and all its workers were killed at once"
NOT_CHARGED = " (not the workload's fault)"


class Liveness:
    """The controller's liveness record: a file it touches every :data:`HEARTBEAT_S`."""

    def __init__(self, root: Path) -> None:
        self.path = root / LIVENESS_FILE
        self.beaten_at: float | None = None

    def due_in(self, now: float) -> float:
        """Seconds until the next beat is due."""
        return 0.0 if self.beaten_at is None else max(0.0, self.beaten_at + HEARTBEAT_S - now)

    def beat(self, now: float) -> None:
        if self.beaten_at is not None and now < self.beaten_at + HEARTBEAT_S:
            return
        with contextlib.suppress(OSError):  # a full or read-only disk: the beat is a hint, never a fault
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
            os.utime(self.path)
        self.beaten_at = now


@dataclasses.dataclass(frozen=True)
class Predecessor:
    """What the controller before this one left: the boot it ran in, and its last beat."""

    boot_id: str | None
    last_beat: float | None

    @classmethod
    def read(cls, store: LocalStore, root: Path) -> Predecessor:
        """Read before this controller records itself (its record replaces the predecessor's)."""
        try:
            last_beat: float | None = (root / LIVENESS_FILE).stat().st_mtime
        except OSError:
            last_beat = None
        return cls(store.controller_boot_id(), last_beat)


class HostLoss:
    """Recovery's finding (see the module): why a dead worker was lost with the host, or None."""

    def __init__(self, predecessor: Predecessor, this_boot: str | None = None) -> None:
        self.predecessor = predecessor
        self.this_boot = this_boot if this_boot is not None else boot_id()
        self.everything_died = False

    def look(self, store: LocalStore, supervisor: Supervisor) -> None:
        """Whether nothing the predecessor recorded lives: before anything new is started."""
        rows = store.worker_rows.select((*LIVE_WORKER_STATES, "warm"))
        self.everything_died = bool(rows) and not any(
            supervisor.alive(row) if row.pid is not None else supervisor.started_unrecorded(row) for row in rows
        )

    def rebooted(self) -> bool:
        before, now = self.predecessor.boot_id, self.this_boot
        return before is not None and now is not None and before != now

    def reason(self, row: WorkerRow) -> str | None:
        """Why the dead worker ``row`` was lost with the host, or None: judge its end as before."""
        if self.rebooted():
            return REBOOTED + NOT_CHARGED
        beat = self.predecessor.last_beat
        if not self.everything_died or beat is None:
            return None
        written = last_written(row)
        if written is not None and written > beat + TOGETHER_S:
            return None  # it ran on after its controller had gone
        return KILLED_TOGETHER + NOT_CHARGED


def last_written(row: WorkerRow) -> float | None:
    """When the worker last wrote a file we know of (its records, its logs, its events file)."""
    directory = Path(row.dir)
    paths = [directory]
    with contextlib.suppress(OSError):
        paths += list(directory.iterdir())
    with contextlib.suppress(OSError, ValueError, KeyError):
        launch = WorkerLaunch.saved(row)
        paths += [launch.log, *(p.log for p in launch.local)]
        if HOTSWAP_EVENTS_FILE in launch.env:
            paths.append(Path(launch.env[HOTSWAP_EVENTS_FILE]))
    times = []
    for path in paths:
        with contextlib.suppress(OSError):
            times.append(path.stat().st_mtime)
    return max(times, default=None)
