"""What a run shows its training loop, whatever the framework: where this worker stands, the
step line of the contract, and abandoning a step whose peer was lost. The PyTorch
:class:`hotswap.train.torch.run.Run` and the JAX :class:`hotswap.train.jax.run.JaxRun` build on it.
Framework-neutral."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from hotswap.api.worker import WorkerEnv
from hotswap.api.worker_output import EVENT_STEP, step_line
from hotswap.train.events import EventLog, say
from hotswap.train.progress import Progress
from hotswap.train.rendezvous import first_line, timed_out

if TYPE_CHECKING:
    from hotswap.train.formation import GroupFormation
    from hotswap.train.protocols import Group

log = logging.getLogger("hotswap.train")


@dataclasses.dataclass
class WorldSizeWatcher:
    """A callback of :meth:`RunFront.on_world_size_change` and the size it last learnt."""

    callback: Callable[[int], object]
    known: int


class RunFront:
    """The part of a run that needs only the neutral pieces (set by the subclass)."""

    env: WorkerEnv
    group: Group
    formation: GroupFormation
    progress: Progress
    events: EventLog
    _in_step = False  # inside the body of a step
    _step_failed = False  # the step was abandoned: a peer was lost
    _step_timed_out = False  # ... and noticed only when a collective timed out
    _start_phases: dict[str, float] | None = None  # set once the state is synchronised; goes with the first step
    _world_size_watchers: list[WorldSizeWatcher] | None = None  # see on_world_size_change

    # Where this worker stands --------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def world_size(self) -> int:
        return self.group.world_size

    @property
    def local_rank(self) -> int:
        """This process's index among its host's processes (one per GPU on a backed slice)."""
        return self.env.local_rank

    @property
    def step(self) -> int:
        """Steps done."""
        return self.progress.step

    @property
    def elastic(self) -> bool:
        return self.formation.elastic

    @property
    def slices(self) -> int:
        """Active slices: the current membership's, or the workload's when it is not elastic."""
        return self.formation.slices

    @property
    def total_slices(self) -> int:
        """The workload's full size (``MEGASCALE_NUM_SLICES``)."""
        return max(self.env.num_slices, self.slices)

    @property
    def generation(self) -> int:
        return self.formation.generation

    def on_world_size_change(self, callback: Callable[[int], object]) -> None:
        """Call ``callback(world_size)`` before a step whenever the group's size differs from
        the one the script last learnt (at this call, or at the callback's last call): values
        derived from the world size at start-up (gradient accumulation steps, a per-rank batch
        size, a learning rate scaled by it) are derived again there, before the step that
        needs them. In an elastic job the size changes when the group re-forms; otherwise never."""
        if self._world_size_watchers is None:
            self._world_size_watchers = []
        self._world_size_watchers.append(WorldSizeWatcher(callback, self.world_size))

    def _announce_world_size(self) -> None:
        """Before a step: tell the callbacks whose size is out of date."""
        size = self.world_size
        for watcher in self._world_size_watchers or ():
            if watcher.known != size:
                watcher.known = size
                watcher.callback(size)

    # In a step -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def elastic_step(self) -> Iterator[None]:
        """Wrap the body of a step: a collective that fails because a peer was lost abandons
        the step instead of raising; the run then moves to the next membership and re-runs it.
        Other errors pass through. Put collectives before the state update (as
        :func:`~hotswap.train.average_gradients` is), so an abandoned step changed nothing."""
        try:
            yield
        except Exception as error:
            if self.world_size > 1 and self.group.is_peer_failure(error):
                log.warning("hotswap: step %d abandoned, a peer was lost: %s", self.step + 1, first_line(error))
                self._step_failed, self._step_timed_out = True, timed_out(error)
                return
            raise

    def report(self, **metrics: object) -> None:
        """Print the step line of the contract (seed 001's awk reads it), with ``metrics``."""
        step = self.step + 1 if self._in_step else self.step
        say(step_line(step, self.slices, self.progress.elastic_down_events, **metrics))

    def _complete_step(self, duration_s: float) -> None:
        self.progress.step += 1
        phases, self._start_phases = self._start_phases, None  # the first step of this process says when it was ready
        self.events.record(EVENT_STEP, step=self.step, duration_s=round(duration_s, 6), slices=self.slices, **(phases or {}))
