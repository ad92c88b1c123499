"""What a worker tells the outside: goodput events, JSON lines appended to
``HOTSWAP_EVENTS_FILE`` for the controller to read, and log lines on stdout. Framework-neutral."""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, TextIO

from hotswap.api.processes import started_at
from hotswap.api.worker import HOTSWAP_HANDED_OVER_AT
from hotswap.api.worker_output import EVENT_CHECKPOINT_RESTORE, event_record, restored_line

if TYPE_CHECKING:
    from hotswap.train.report_channel import ReportChannel


def announce_restore(
    events: EventLog, step: int, source: str, cause: str | None, started: float, waited_s: float = 0.0
) -> None:
    """A restore is done (both SDKs): its goodput event, timed from ``started``
    (``time.monotonic()``), of which ``waited_s`` went waiting for the attempt before to finish
    saving; and the contract's ``restored`` line."""
    extra = {"save_wait_s": round(waited_s, 6)} if waited_s >= 0.001 else {}
    duration = round(time.monotonic() - started, 6)
    events.record(EVENT_CHECKPOINT_RESTORE, step=step, duration_s=duration, source=source, **extra)
    say(restored_line(step, source, cause))


def process_started_at() -> float | None:
    """When this worker's process began to be this worker, in Unix seconds: the moment a warm
    spare was handed the worker's assignment, else the process's own start (Linux: from
    ``/proc``). None where neither can be read. A restart's "spawn" phase ends here; the time
    from here to the start event is Python, imports and the script's set-up."""
    handed = os.environ.get(HOTSWAP_HANDED_OVER_AT)
    if handed:
        try:
            return float(handed)
        except ValueError:
            pass
    return started_at()


def say(line: str) -> None:
    """Print a log line at once: the controller and the user's scripts read them as they come."""
    print(line, flush=True)


def _open_private(path: str) -> TextIO:
    """``path`` opened for appending, created readable by its owner only (0600): everything
    hotswap creates is owner-only, whatever the worker's umask."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600), "a", buffering=1)


class EventLog:
    """Appends one :func:`~hotswap.api.worker_output.event_record` line per event and flushes it, so a
    worker killed at any moment leaves every event before that moment on disk. Without a file
    (a run outside hotswap) recording does nothing."""

    def __init__(self, path: str | None, channel: ReportChannel | None = None) -> None:
        """``channel``: where the replica's record goes too (Kubernetes: its Lease)."""
        self.path = path
        self._handle: TextIO | None = _open_private(path) if path else None
        self._channel = channel
        self._lock = threading.Lock()  # the checkpoint writer thread records too

    def record(self, kind: str, t: float | None = None, **fields: object) -> None:
        if self._handle is None and self._channel is None:
            return
        at = time.time() if t is None else t
        line = event_record(kind, at, **fields)
        if self._channel is not None:
            self._channel.record({"t": at, "kind": kind, **fields})
        with self._lock:
            if self._handle is not None:
                self._handle.write(line + "\n")
                self._handle.flush()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        with self._lock:
            if self._handle is not None:
                self._handle.close()
                self._handle = None
