"""The job's state on the move, with PyTorch: from disk or from the most advanced rank into
every rank when a group (re)forms, and from the ranks to disk, with every rank's RNG states.

Which rank's state the others take is decided by :func:`~hotswap.train.progress.plan_peer_copy`
(framework-neutral); moving it, the state tree, the RNG states and the checkpointer are
torch-specific and live here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from hotswap.api.worker_output import EVENT_CHECKPOINT_BEGIN, restore_source
from hotswap.train import runs
from hotswap.train.torch.checkpointer import Checkpointer
from hotswap.train.torch.distributed import ProcessGroup
from hotswap.train.events import EventLog, announce_restore
from hotswap.train.files import FinalSaveFailed, FreshStartRefused
from hotswap.train.progress import Progress, plan_peer_copy
from hotswap.train.save_leases import SaveLeases
from hotswap.train.torch.state import StateRegistry, build_tree, derived_rng_state, rng_state, set_rng_state

log = logging.getLogger("hotswap.train")

# Where an abandoned step starts again: the data positions and this rank's RNG states.
Savepoint = tuple[dict[str, Any], dict[str, Any]]


class StateSync:
    """Moves the job's state into every rank and onto disk (see the module)."""

    def __init__(
        self,
        registry: StateRegistry,
        checkpointer: Checkpointer | None,
        group: ProcessGroup,
        progress: Progress,
        events: EventLog,
        *,
        async_checkpoints: bool,
        cause: str | None = None,
        allow_fresh_start: bool = False,
        sync_initial_state: bool = True,
        leases: SaveLeases | None = None,
        grace_period_s: float = 30.0,
    ) -> None:
        self.cause = cause  # why this worker generation started (HOTSWAP_START_CAUSE)
        self.allow_fresh_start = allow_fresh_start  # HOTSWAP_ALLOW_FRESH_START
        self.sync_initial_state = sync_initial_state
        self.leases = leases  # this process's save lease; the earlier attempts' are waited for
        self.grace_period_s = grace_period_s
        self._rank = group.rank
        self.registry = registry
        self.checkpointer = checkpointer
        self.group = group
        self.progress = progress
        self.events = events
        self.async_checkpoints = async_checkpoints
        if checkpointer is not None:
            # An async checkpoint copies parameters and optimizer state while the next step
            # computes; that step's optimizer update waits until the copy is done.
            register_optimizer_step_pre_hook(self._before_optimizer_step)

    # Into the ranks ------------------------------------------------------------------------

    def synchronise(self, interrupted: Callable[[], bool]) -> None:
        """Make every rank hold the same state: from the most advanced survivor if any rank has
        live state, else from the newest complete checkpoint (read by rank 0). ``interrupted``
        ends the waits for slow ranks (SIGTERM, a newer generation)."""
        started = time.monotonic()
        self._rank = self.group.rank  # kept for a save after the group is gone
        if self.group.world_size == 1:
            if not self.progress.has_state:
                self._restore_from_disk(started, interrupted)
            return
        self.group.store_barrier("synchronise", interrupted)
        copy = plan_peer_copy(self.group.all_gather_object((self.progress.has_state, self.progress.step)))
        if copy is None:
            self._restore_from_disk(started, interrupted)
            return
        if not copy.receivers:
            return  # every replica already holds the same step
        own = self._tree([rng_state()]) if self.group.rank == copy.source else None
        tree = self.group.broadcast_tree(own, copy.source)
        if self.group.rank in copy.receivers:  # survivors at that step keep their own
            # The source's random streams are its own: a survivor that lagged keeps its, a
            # joiner starts one of its own (never the source's: both would draw the same).
            self._load(tree, "own" if self.progress.has_state else "new")
            self._announce_restore("peer", started)

    def _restore_from_disk(self, started: float, interrupted: Callable[[], bool]) -> None:
        """FreshStartRefused (on every rank) when nothing is restorable but damaged checkpoints
        were set aside and the user did not allow starting from step 0."""
        tree, reason, resumed, refused, waited_s = None, None, False, None, 0.0
        if self.group.rank == 0 and self.checkpointer is not None:
            if self.leases is not None:  # the survivors of the attempt before may still be saving
                waited_s = self.leases.wait_for_earlier(self.grace_period_s)
            found = self.checkpointer.restore_latest()
            if found is not None:
                tree, reason = found[0], found[1].reason
                resumed = self.checkpointer.from_fallback(found[1])
            else:
                refusal = self.checkpointer.fresh_start_refusal(self.allow_fresh_start)
                refused = str(refusal) if refusal is not None else None
            if refused is None:
                runs.mark_running(self.checkpointer.store.root)  # no earlier run's migration is pending now
        if self.group.world_size > 1:
            self.group.store_barrier("restored", interrupted)
            reason, resumed, refused = self.group.broadcast_object((reason, resumed, refused), 0)
            if reason is not None:
                tree = self.group.broadcast_tree(tree, 0)
        if refused is not None:
            raise FreshStartRefused(refused)
        self.progress.has_state = True
        if tree is None:
            self._agree_on_initial_state()
            return
        self._load(tree)
        if resumed and self.cause in (None, "start"):  # another run's state: this run resumes it
            self.cause = "resume"
        self._announce_restore(restore_source(reason, self.cause), started, waited_s)

    def _agree_on_initial_state(self) -> None:
        """A fresh start: every rank takes rank 0's registered state, as DDP does with the
        parameters at its construction (each rank may have initialised its model from a seed of
        its own). The random streams stay each rank's own."""
        if self.group.world_size == 1 or not self.sync_initial_state:
            return
        own = self._tree([]) if self.group.rank == 0 else None
        tree = self.group.broadcast_tree(own, 0)
        if self.group.rank != 0:
            self.registry.load(tree["objects"])

    def _load(self, tree: dict[str, Any], streams: Literal["saved", "own", "new"] = "saved") -> None:
        """Take the tree's state. The random streams: this rank's ``saved`` one (one derived from
        the rank where the tree has none: it was written by fewer ranks), this rank's ``own``, or
        a ``new`` one derived from the rank."""
        if self.checkpointer is not None:
            self.checkpointer.wait_for_copy()
        self.registry.load(tree["objects"])
        self.progress.load(tree["progress"])
        rngs, rank = tree["rng"], self.group.rank
        if streams == "saved" and rank < len(rngs) and rngs[rank] is not None:
            set_rng_state(rngs[rank])
        elif streams != "own":
            set_rng_state(derived_rng_state(tree, rank))

    def _announce_restore(self, source: str, started: float, waited_s: float = 0.0) -> None:
        announce_restore(self.events, self.progress.step, source, self.cause, started, waited_s)

    def savepoint(self) -> Savepoint:
        """Taken at a step's start: an abandoned step (a peer lost mid-step) is re-run on the
        same batch and draws."""
        return self.registry.positions(), rng_state()

    def rewind(self, savepoint: Savepoint) -> None:
        """Back to the step's start: its data positions and draws, and no gradient (the
        abandoned step's backward passes may have accumulated part of one, which the re-run
        would otherwise add to)."""
        positions, rng = savepoint
        self.registry.restore_positions(positions)
        set_rng_state(rng)
        self.registry.drop_gradients()

    # Onto disk -----------------------------------------------------------------------------

    def can_start_save(self) -> bool:
        """A checkpoint directory is set and no write is in flight (one at a time: a periodic
        save that finds one waits for a later boundary)."""
        return self.checkpointer is not None and not self.checkpointer.busy

    def save_periodic(self) -> None:
        """Every rank's RNG states to rank 0, which writes (in the background if asynchronous)."""
        rngs = self._gather_rng()
        if self.group.rank != 0 or self.checkpointer is None:
            return
        step = self.progress.step
        self._announce_save("periodic")
        if self.async_checkpoints:
            self.checkpointer.save_async(step, self._tree(rngs), "periodic", self.registry.changed_only_by_optimizers())
        else:
            self.checkpointer.save(step, self._tree(rngs), "periodic")

    def save_last(self, reason: str) -> bool:
        """This process's last save (``termination`` or ``final``): every rank's RNG states (only
        its own when a peer is already gone) to rank 0, which writes unless that step is on disk
        already (a termination then relabels it: same state). True on the writing rank."""
        rngs = self._gather_rng_or_own()
        if self.group.rank != 0 or self.checkpointer is None:
            return False
        self.checkpointer.wait()
        if self.checkpointer.store.latest_step() != self.progress.step:
            failure = self._save_now(reason, rngs)
            if failure and reason == "final":
                raise FinalSaveFailed(f"hotswap: the final checkpoint of step {self.progress.step} could not be saved: {failure}")
        elif reason == "termination":
            self.checkpointer.store.set_reason(self.progress.step, reason)  # same state, already on disk
        return True

    def save_own(self, reason: str) -> None:
        """Without a group: save this rank's replica if it holds one. Every survivor holds the
        same replica at the last complete step, and the store keeps the first of identical
        saves, so nothing is lost whichever rank is gone."""
        if self.progress.has_state and self.checkpointer is not None:
            self._save_now(reason, self._own_rng())

    def wait_for_writes(self) -> None:
        """Finish the writes in flight: this process's last (it is ending)."""
        if self.checkpointer is not None:
            self.checkpointer.wait()
        if self.leases is not None:
            self.leases.release()

    def _tree(self, rngs: list[dict[str, Any] | None]) -> dict[str, Any]:
        return build_tree(self.registry, self.progress.counters(), rngs)

    def _gather_rng(self) -> list[dict[str, Any]]:
        """Every rank's RNG states, so a restart at the same size draws what it would have."""
        if self.group.world_size == 1:
            return [rng_state()]
        return self.group.all_gather_object(rng_state())

    def _gather_rng_or_own(self) -> list[dict[str, Any]]:
        """Every rank's RNG states, or only this rank's when a peer is already gone."""
        try:
            return self._gather_rng()
        except Exception as error:
            if not self.group.is_peer_failure(error):
                raise
            return self._own_rng()

    def _own_rng(self) -> list[dict[str, Any] | None]:
        """Only this rank's RNG states, at its rank's place: a restart gives the ranks whose
        streams were lost with their peer streams of their own, not this one's."""
        return [None] * self._rank + [rng_state()]

    def _announce_save(self, reason: str) -> None:
        """A save that holds the loop starts: no step completes until it ends, and the
        controller's hang detection must know (``checkpoint_save`` or a step ends it)."""
        self.events.record(EVENT_CHECKPOINT_BEGIN, step=self.progress.step, reason=reason)

    def _save_now(self, reason: str, rngs: list[dict[str, Any]]) -> str | None:
        """Save now; why it failed (said in a warning), or None."""
        assert self.checkpointer is not None
        self._announce_save(reason)
        try:
            self.checkpointer.save(self.progress.step, self._tree(rngs), reason)
        except (OSError, RuntimeError) as error:  # RuntimeError: its step is taken by a damaged one
            log.warning("hotswap: %s checkpoint of step %d failed: %s", reason, self.progress.step, error)
            return str(error)
        return None

    def _before_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.checkpointer is not None:
            self.checkpointer.wait_for_copy()
