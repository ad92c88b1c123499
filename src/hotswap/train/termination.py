"""How a worker's run ends: SIGTERM noted as a request (no I/O in a signal handler, never
mid-step) and acted on at a step boundary by saving inside the grace period and exiting with
the contract's code; the last save after the last step; and an exit the controller restarts.

Framework-neutral: the group and the state it saves are passed in.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, NoReturn

from hotswap.api.worker import CHECKPOINTED_EXIT_CODE, CHECKPOINTS_UNUSABLE_EXIT_CODE
from hotswap.api.worker_output import EVENT_STOP
from hotswap.train.events import EventLog, say
from hotswap.train.files import FinalSaveFailed
from hotswap.train.progress import Progress

if TYPE_CHECKING:
    from hotswap.train.protocols import Group, ReplicaState

log = logging.getLogger("hotswap.train")


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


class Termination:
    """Ends this worker's run; every way out but an uncaught error goes through here."""

    def __init__(
        self,
        request: TerminationRequest,
        group: Group,
        state: ReplicaState,
        progress: Progress,
        events: EventLog,
    ) -> None:
        self.request = request
        self.group = group
        self.state = state
        self.progress = progress
        self.events = events

    @property
    def requested(self) -> bool:
        return self.request.requested

    def terminate(self) -> NoReturn:
        """SIGTERM, agreed by every rank at this boundary: save and exit."""
        started = time.monotonic()
        if self.state.save_last("termination"):
            say(
                f"checkpoint saved step={self.progress.step} reason=termination "
                f"seconds={time.monotonic() - started:.3f} grace_left_s={self.request.seconds_left():.1f}"
            )
            if self.request.seconds_left() < 0:
                log.warning(
                    "hotswap: the step and the save outlasted the %gs grace period: raise the workload's "
                    "--termination-grace-period, or a kill may cut the next save short",
                    self.request.grace_period_s,
                )
        self.exit(CHECKPOINTED_EXIT_CODE, "terminated")

    def stop_without_group(self) -> NoReturn:
        """SIGTERM with no group to agree in: every rank holding the replica saves it (the first
        identical save wins in the store)."""
        self.state.save_own("termination")
        self.exit(CHECKPOINTED_EXIT_CODE, "terminated")

    def finish(self) -> None:
        """After the last step: the final checkpoint, unless that step is on disk already; if it
        cannot be written, a non-zero exit (a run that exits 0 has its last step saved)."""
        try:
            self.state.save_last("final")
        except FinalSaveFailed as failure:
            self.exit(CHECKPOINTS_UNUSABLE_EXIT_CODE, "final_save_failed", str(failure))
        self.events.record(EVENT_STOP, step=self.progress.step, reason="complete", exit_code=0)

    def exit(self, code: int, reason: str, message: str | None = None) -> NoReturn:
        if message:
            print(message, file=sys.stderr, flush=True)
        self.state.wait_for_writes()
        self.events.record(EVENT_STOP, step=self.progress.step, reason=reason, exit_code=code)
        self.close(teardown=False)
        # The user's finally blocks still run (SystemExit), but the interpreter's teardown of
        # PyTorch (about half a second) is skipped: a restart waits for this process to be gone.
        atexit.register(_leave_now, code)
        raise SystemExit(code)

    def close(self, teardown: bool = True) -> None:
        """Finish the checkpoint in flight, leave the process group, close the events file.
        ``teardown``: the interpreter will be torn down next (not skipped as :meth:`exit` does)."""
        self.state.wait_for_writes()
        self.group.destroy(before_teardown=teardown)
        self.events.close()


def _leave_now(code: int) -> None:
    """The last exit handler to be registered runs first: flush and end the process."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
