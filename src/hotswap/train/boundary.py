"""Step boundaries: before each step every rank votes, the group agrees on the maximum of each
vote, and every rank then does the same one thing (:func:`decide`): re-form the group for a
new membership, stop (SIGTERM), take a periodic checkpoint, or go on.

Framework-neutral: the votes are agreed through the group passed in.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from typing import TYPE_CHECKING

from hotswap.train.formation import GroupFormation
from hotswap.train.progress import Progress
from hotswap.train.rendezvous import first_line, timed_out
from hotswap.train.termination import Termination

if TYPE_CHECKING:
    from hotswap.train.protocols import Group, ReplicaState

log = logging.getLogger("hotswap.train")


class Action(enum.Enum):
    REFORM = "reform"
    STOP = "stop"
    SAVE = "save"
    CONTINUE = "continue"


@dataclasses.dataclass(frozen=True)
class Vote:
    stop: bool  # this rank saw SIGTERM
    generation: int  # the newest membership generation this rank saw
    save: bool  # a periodic checkpoint is due (only rank 0, the writer, says so)

    def as_ints(self) -> list[int]:
        return [int(self.stop), self.generation, int(self.save)]

    @classmethod
    def from_ints(cls, values: list[int]) -> Vote:
        stop, generation, save = values
        return cls(bool(stop), generation, bool(save))


def decide(agreed: Vote, generation: int, elastic: bool) -> Action:
    """What every rank does at a boundary, from the agreed vote and the generation the group
    was formed for. A new membership comes first (the new group then votes again); a stop
    saves anyway, so it needs no periodic save."""
    if elastic and agreed.generation > generation:
        return Action.REFORM
    if agreed.stop:
        return Action.STOP
    if agreed.save:
        return Action.SAVE
    return Action.CONTINUE


def periodic_checkpoint_due(step: int, total: int, last_checkpoint_step: int, every: int | None) -> bool:
    """On multiples of ``every`` (step 200, 300, ... whatever step a restart resumed at, in
    step with evaluations the script runs on the same multiples), or at the first boundary
    after one that was skipped (a save still in flight). After the last step the final
    checkpoint is written instead."""
    return every is not None and step < total and step // every > last_checkpoint_step // every


class StepBoundary:
    """Votes, agrees and acts at each step boundary (see the module)."""

    def __init__(
        self,
        group: Group,
        formation: GroupFormation,
        termination: Termination,
        state: ReplicaState,
        progress: Progress,
        *,
        checkpoint_every: int | None,
    ) -> None:
        self.group = group
        self.formation = formation
        self.termination = termination
        self.state = state
        self.progress = progress
        self.checkpoint_every = checkpoint_every
        self._began = 0.0  # time.monotonic() when the ranks began agreeing at this boundary

    def cross(self, total: int) -> None:
        """Agree and act before the next of ``total`` steps. A peer lost meanwhile re-forms the
        group (or restarts the workload), and the new group agrees again."""
        while True:
            try:
                self._agree_and_act(total)
                return
            except Exception as error:
                if self.group.world_size == 1 or not self.group.is_peer_failure(error):
                    raise
                log.warning("hotswap: a peer was lost at step %d: %s", self.progress.step, first_line(error))
                lost_at_timeout = timed_out(error)
            # After the handler, not in it (see GroupFormation.recover).
            self.formation.recover(timed_out=lost_at_timeout, since=self._began)

    def _agree_and_act(self, total: int) -> None:
        """Raises when a collective fails."""
        while True:
            self._began = time.monotonic()
            agreed = self._agree(self._vote(total))
            action = decide(agreed, self.formation.generation, self.formation.elastic)
            if action is Action.REFORM:
                self.formation.reconfigure(agreed.generation, since=self._began)
                continue
            if action is Action.STOP:
                self.termination.terminate()
            if action is Action.SAVE:
                self.progress.last_checkpoint_step = self.progress.step
                self.state.save_periodic()
            return

    def _vote(self, total: int) -> Vote:
        # The flag is read before the membership file: a controller that removes a slice
        # publishes the new membership first and then SIGTERMs that slice's workers, so a
        # worker that sees the signal also sees the membership it leaves (it goes alone;
        # the job goes on). A SIGTERM with no new membership stops the whole job.
        stop = self.termination.requested
        generation = self.formation.newest_generation()
        # Rank 0 alone decides on periodic checkpoints: it is the writer, and the others
        # may have joined since its last one.
        progress = self.progress
        due = periodic_checkpoint_due(progress.step, total, progress.last_checkpoint_step, self.checkpoint_every)
        return Vote(stop, generation, self.group.rank == 0 and due and self.state.can_start_save())

    def _agree(self, vote: Vote) -> Vote:
        if self.group.world_size == 1:
            return vote
        return Vote.from_ints(self.group.agree_max(vote.as_ints()))
