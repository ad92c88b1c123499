"""SIGTERM as a request: the handler only notes the time; the training loop acts on it at the
next step boundary (no I/O in a signal handler, never mid-step)."""

from __future__ import annotations

import signal
import threading
import time


class TerminationRequest:
    """Set by SIGTERM (pod deletion, drain, preemption, preStop); read at step boundaries."""

    def __init__(self, grace_period_s: float) -> None:
        self.grace_period_s = grace_period_s
        self.requested_at: float | None = None  # time.monotonic() of the first SIGTERM

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("hotswap.train must be initialised from the main thread (it handles SIGTERM)")
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.requested_at is None:
            self.requested_at = time.monotonic()

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def seconds_left(self) -> float:
        """Of the grace period, measured from the first SIGTERM."""
        if self.requested_at is None:
            return self.grace_period_s
        return self.grace_period_s - (time.monotonic() - self.requested_at)
