"""A run's life cycle, whatever the framework: set-up (events, the SIGTERM flag, termination,
formation and step boundary wired to the framework's group and state), the first step's
restore, the step loop, and closing. The PyTorch :class:`hotswap.train.torch.run.Run` and the
JAX :class:`hotswap.train.jax.run.JaxRun` build on it and fill in the hooks where they differ
(a savepoint per step, what crossing a boundary also does, what a finished step must have done).
Framework-neutral."""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NoReturn

from hotswap.api.worker import CHECKPOINTS_UNUSABLE_EXIT_CODE, HOTSWAP_REPORT_LEASES, WorkerEnv
from hotswap.api.worker_output import EVENT_START
from hotswap.train.boundary import StepBoundary
from hotswap.train.events import EventLog, process_started_at
from hotswap.train.files import CheckpointDirectoryRefused, FreshStartRefused
from hotswap.train.rendezvous import timed_out
from hotswap.train.front import RunFront
from hotswap.train.termination import Termination, TerminationRequest

if TYPE_CHECKING:
    from hotswap.train.formation import GroupFormation
    from hotswap.train.protocols import Group, ReplicaState
    from hotswap.train.report_channel import ReportChannel

log = logging.getLogger("hotswap.train")


def half_grace_period(env: WorkerEnv) -> float:
    """Half the termination grace period, 5 to 60 s: long enough to tell a hung peer, short
    enough that a rank stuck on one still has time to act on SIGTERM and save."""
    return max(5.0, min(60.0, env.grace_period_s / 2))


def refuse_checkpoint_directory(refused: CheckpointDirectoryRefused) -> NoReturn:
    """The worker cannot use its checkpoint directory: one line, and the exit code the failure
    policy fails on (restarting would meet the same directory)."""
    print(f"hotswap: {refused}", file=sys.stderr, flush=True)
    raise SystemExit(CHECKPOINTS_UNUSABLE_EXIT_CODE)


def warn_no_checkpoint_directory() -> None:
    log.warning("hotswap: no checkpoint directory (HOTSWAP_CHECKPOINT_DIR is not set): state is not saved")


def _report_channel() -> ReportChannel | None:
    """On Kubernetes, where this process writes its replica's record (imported only there: the
    HTTP client costs a local worker's start nothing)."""
    if not os.environ.get(HOTSWAP_REPORT_LEASES):
        return None
    from hotswap.train.report_channel import ReportChannel

    return ReportChannel.from_environ(os.environ)


class RunLifecycle(RunFront):
    """What a run does between its creation and its end; the subclass sets ``group`` and
    ``progress`` and calls :meth:`_open`, :meth:`_assemble` and :meth:`_started` in turn."""

    termination: Termination
    boundary: StepBoundary
    _replica: ReplicaState  # the framework's state, as the neutral pieces drive it
    _began = False  # the state was restored (or the loop counts steps itself)
    _boundary_at: float | None = None  # when the last step boundary was crossed

    # Set-up --------------------------------------------------------------------------------

    def _open(self, env: WorkerEnv) -> TerminationRequest:
        """The first thing a run does: its event log, and the SIGTERM flag set at once."""
        self.env = env
        self.events = EventLog(env.events_file, _report_channel())
        request = TerminationRequest(env.grace_period_s)
        request.install()
        return request

    def _assemble(
        self,
        request: TerminationRequest,
        replica: ReplicaState,
        formation: Callable[[Termination], GroupFormation],
        checkpoint_every: int | None,
    ) -> None:
        """Wire the neutral pieces to the framework's group and state (``replica``);
        ``formation`` makes the group formation that ends through the given termination."""
        group: Group = self.group
        self._replica = replica
        self.termination = Termination(request, group, replica, self.progress, self.events)
        self.formation = formation(self.termination)
        self.boundary = StepBoundary(
            group, self.formation, self.termination, replica, self.progress, checkpoint_every=checkpoint_every
        )

    def _started(self, started_at: float, announce: bool = True) -> None:
        """The group is (being) joined: record the start (unless ``announce`` is False: this
        process continues one that recorded it) and close the run at exit."""
        if announce:
            self.events.record(
                EVENT_START, t=started_at, attempt=self.env.attempt, rank=self.rank, world_size=self.world_size,
                process_t=process_started_at(),
            )
        atexit.register(self._close_at_exit)

    # The loop ------------------------------------------------------------------------------

    def _steps(self, total: int) -> Iterator[int]:
        if total < 0:
            raise ValueError(f"total steps must not be negative, not {total}")
        self._begin()
        while True:
            self._cross(total)
            if self.step >= total:
                break
            self._announce_world_size()
            savepoint = self._step_starts()
            self._in_step, self._step_failed = True, False
            started = time.monotonic()
            yield self.step + 1
            self._in_step = False
            if self._step_failed and self._rewind(savepoint):
                self.formation.recover(timed_out=self._step_timed_out, since=started)
                continue
            self._step_ends()
            self._complete_step(time.monotonic() - started)
        self.termination.finish()

    def _step_done(self) -> None:
        """A step the loop ran itself is done: count it and act at this boundary."""
        if not self._began:
            self._began = self.progress.has_state = True
            self.formation.complete_join()
        now = time.monotonic()
        self._complete_step(now - (self._boundary_at or now))
        self._cross(sys.maxsize)
        self._announce_world_size()
        self._boundary_at = time.monotonic()

    def close(self) -> None:
        """Finish the checkpoint in flight and leave the group (also done at exit)."""
        self.termination.close()

    def _close_at_exit(self) -> None:
        """The interpreter is exiting (the script returned, raised or called ``sys.exit``):
        close, then spare its teardown the full garbage collections that walk every object
        PyTorch or JAX made (0.6 s on an idle 2-core host, seconds under load). What is garbage
        now is collected first; later exit handlers, ``finally`` blocks and reference-counted
        frees all still run, and the exit code stays the script's."""
        self.close()
        gc.collect()
        gc.freeze()

    def _begin(self) -> None:
        """Before the first step: complete the group and give every rank the job's state."""
        if self._began:
            return
        self._began = True
        self.formation.complete_join()
        formed_at, synchronising = time.time(), time.monotonic()
        lost: bool | None = None  # a peer was lost: noticed at a collective timeout?
        try:
            self._replica.synchronise(self.formation.interrupted)
        except FreshStartRefused as refusal:  # one line and a code the failure policy fails on
            self.termination.exit(CHECKPOINTS_UNUSABLE_EXIT_CODE, "checkpoints_unusable", str(refusal))
        except Exception as error:
            if not self.group.is_peer_failure(error):
                raise
            lost = timed_out(error)
        if lost is not None:  # after the handler (see GroupFormation.recover)
            self.formation.recover(timed_out=lost, since=synchronising)
        self._synchronised()
        self._boundary_at = time.monotonic()
        # Recorded with this process's first step (the phases of a restart, from the worker's side).
        self._start_phases = {"formed_t": round(formed_at, 6), "restored_t": round(time.time(), 6)}

    # Hooks (the defaults do nothing more) --------------------------------------------------

    def _synchronised(self) -> None:
        """The state is synchronised for the first time."""

    def _cross(self, total: int) -> None:
        """The boundary before a step (or after the last)."""
        self.boundary.cross(total)

    def _step_starts(self) -> object:
        """A step starts; returns what :meth:`_rewind` takes back to if it is abandoned."""
        return None

    def _rewind(self, savepoint: object) -> bool:
        """The step was abandoned (a peer was lost): undo it to ``savepoint``; False when
        the step stands (nothing to undo to)."""
        return True

    def _step_ends(self) -> None:
        """A step finished (not abandoned), before it is counted."""
