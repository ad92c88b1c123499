"""A training run: the in-job half of hotswap.

The run joins the process group described by the worker environment (or, in an elastic
workload, by the membership file), restores state on the first step, and at every step
boundary decides, together with the other ranks, whether to stop (SIGTERM), re-form the group
(a new membership), or checkpoint. See :func:`hotswap.train.init` for the user's view.

Step numbers count from 1: ``step=N`` is the N-th step, a checkpoint of step N holds the state
after N steps, and ``restored step=N`` is followed by step N+1.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from hotswap.api.worker import (
    CHECKPOINTED_EXIT_CODE,
    RESTART_EXIT_CODE,
    EVENT_CHECKPOINT_RESTORE,
    EVENT_ELASTIC,
    EVENT_START,
    EVENT_STEP,
    EVENT_STOP,
    LOCAL_RANK,
    Membership,
    WorkerEnv,
    restored_line,
    step_line,
)
from hotswap.train.checkpointer import Checkpointer
from hotswap.train.distributed import GroupSpec, ProcessGroup, RendezvousFailed, default_backend, is_peer_failure
from hotswap.train.events import EventLog
from hotswap.train.membership import MembershipWatcher
from hotswap.train.state import StateRegistry, build_tree, rng_state, set_rng_state
from hotswap.train.store import CheckpointStore
from hotswap.train.termination import TerminationRequest

log = logging.getLogger("hotswap.train")



def _say(line: str) -> None:
    print(line, flush=True)


def _leave_now(code: int) -> None:
    """The last exit handler to be registered runs first: flush and end the process."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


class Run:
    """One process's part of a training job. Create it with :func:`hotswap.train.init`."""

    def __init__(
        self,
        env: WorkerEnv,
        *,
        checkpoint_dir: str | None,
        checkpoint_every: int | None,
        keep: int,
        async_checkpoints: bool,
        collective_timeout_s: float,
        rendezvous_timeout_s: float,
        membership_timeout_s: float,
        backend: str | None,
    ) -> None:
        started_at = time.time()
        if checkpoint_every is not None and checkpoint_every < 1:
            raise ValueError(
                f"checkpoint_every must be at least 1 (or None for no periodic checkpoints), not {checkpoint_every}"
            )
        self.env = env
        self.events = EventLog(env.events_file)
        self.termination = TerminationRequest(env.grace_period_s)
        self.termination.install()
        self.registry = StateRegistry()
        directory = checkpoint_dir or env.checkpoint_dir
        self.checkpointer = Checkpointer(CheckpointStore(directory, keep), self.events) if directory else None
        if directory is None:
            log.warning("hotswap: no checkpoint directory (HOTSWAP_CHECKPOINT_DIR is not set): state is not saved")
        else:
            # An async checkpoint copies parameters and optimizer state while the next step
            # computes; that step's optimizer update waits until the copy is done.
            register_optimizer_step_pre_hook(self._before_optimizer_step)
        self.checkpoint_every = checkpoint_every
        self.async_checkpoints = async_checkpoints
        self.membership_timeout_s = membership_timeout_s
        self.step = 0  # steps done
        self.elastic_down_events = 0
        self._last_checkpoint_step = 0
        self._has_state = False  # holds the job's training state (restored, received, or started fresh)
        self._began = False
        self._in_step = False
        self._step_failed = False
        self._last_rank = 0
        self._boundary_at: float | None = None  # when step_done() last returned
        self.membership: Membership | None = None
        self._watcher = MembershipWatcher(env.membership_file) if env.membership_file else None
        if self._watcher is not None and not env.slice_name:
            raise ValueError(
                "HOTSWAP_MEMBERSHIP_FILE is set but HOTSWAP_SLICE is not: an elastic worker must know its slice"
            )
        backend = backend or default_backend()
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get(LOCAL_RANK, "0")))
        self.group = ProcessGroup(backend, collective_timeout_s, rendezvous_timeout_s)
        self._join_first_group()
        self.events.record(EVENT_START, t=started_at, attempt=env.attempt, rank=self.rank, world_size=self.world_size)
        atexit.register(self.close)

    # Where this worker stands --------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def world_size(self) -> int:
        return self.group.world_size

    @property
    def elastic(self) -> bool:
        return self._watcher is not None

    @property
    def slices(self) -> int:
        """Active slices: the current membership's, or the workload's when it is not elastic."""
        return len(self.membership.slices) if self.membership else self.env.num_slices

    @property
    def total_slices(self) -> int:
        """The workload's full size (``MEGASCALE_NUM_SLICES``)."""
        return max(self.env.num_slices, self.slices)

    @property
    def generation(self) -> int:
        return self.membership.generation if self.membership else 0

    # The user's API ------------------------------------------------------------------------

    def register(self, **objects: Any) -> None:
        """Objects whose state is checkpointed and sent to joining replicas: anything with
        ``state_dict()``/``load_state_dict()`` (model, optimizer, LR scheduler,
        :class:`~hotswap.train.ResumableBatches`), or a dict or list updated in place."""
        if self._began:
            raise RuntimeError("register() objects before the first step: the state is restored then")
        for name, obj in objects.items():
            self.registry.register(name, obj)

    def steps(self, total: int) -> Iterator[int]:
        """Yield step numbers up to ``total``, from the one after the restored state.

        Before each step the ranks agree on what to do: stop and checkpoint (SIGTERM; the
        process then exits with ``CHECKPOINTED_EXIT_CODE``), re-form the group (a new elastic
        membership), or take a periodic checkpoint. After the last step a final checkpoint is
        written.
        """
        if total < 0:
            raise ValueError(f"total steps must not be negative, not {total}")
        self._begin()
        while True:
            self._step_boundary(total)
            if self.step >= total:
                break
            # An abandoned step (a peer lost mid-step) is re-run on the same batch and draws.
            rollback = (self.registry.positions(), rng_state()) if self.world_size > 1 else None
            self._in_step, self._step_failed = True, False
            started = time.monotonic()
            yield self.step + 1
            self._in_step = False
            if self._step_failed and rollback is not None:
                self.registry.restore_positions(rollback[0])
                set_rng_state(rollback[1])
                self._recover()
                continue
            self._complete_step(time.monotonic() - started)
        self._finish()

    def step_done(self) -> None:
        """For loops that do not use :meth:`steps`: count a step done, then act at this
        boundary as :meth:`steps` does (stop on SIGTERM, re-form, checkpoint). Call
        :meth:`restore` before the first step to resume; without it the script's current state
        is the job's state."""
        if not self._began:
            self._began = self._has_state = True
        now = time.monotonic()
        self._complete_step(now - (self._boundary_at or now))
        self._step_boundary(sys.maxsize)
        self._boundary_at = time.monotonic()

    def restore(self) -> None:
        """Restore the job's state now (from a surviving replica, else the newest complete
        checkpoint) instead of at the first step. Call it after :meth:`register`."""
        self._begin()

    @contextlib.contextmanager
    def elastic_step(self) -> Iterator[None]:
        """Wrap the body of a step: a collective that fails because a peer was lost abandons
        the step instead of raising; the loop then re-forms the group and re-runs it. Other
        errors pass through. Put collectives before the optimizer update (as
        :func:`~hotswap.train.average_gradients` is), so an abandoned step changed nothing."""
        try:
            yield
        except Exception as error:
            if self.world_size > 1 and is_peer_failure(error):
                log.warning(
                    "hotswap: step %d abandoned, a peer was lost: %s", self.step + 1, str(error).splitlines()[0]
                )
                self._step_failed = True
                return
            raise

    def report(self, **metrics: object) -> None:
        """Print the step line of the contract (seed 001's awk reads it), with ``metrics``."""
        step = self.step + 1 if self._in_step else self.step
        _say(step_line(step, self.slices, self.elastic_down_events, **metrics))

    def close(self) -> None:
        """Finish the checkpoint in flight and leave the process group (also done at exit)."""
        if self.checkpointer is not None:
            self.checkpointer.wait()
        self.group.destroy()
        self.events.close()

    # Group membership ----------------------------------------------------------------------

    def _join_first_group(self) -> None:
        if self._watcher is not None:
            self._form_elastic_group(after_generation=-1, fresh=True)
        elif torch.distributed.is_available() and torch.distributed.is_initialized():
            self.group.adopt()
        elif self.env.world_size > 1:
            spec = GroupSpec(0, self.env.rank, self.env.world_size, self.env.master_addr, self.env.master_port)
            try:
                self.group.form(spec, interrupted=lambda: self.termination.requested)
            except RendezvousFailed as error:
                if self.termination.requested:
                    self._exit(CHECKPOINTED_EXIT_CODE, "terminated")
                self._exit(RESTART_EXIT_CODE, "rendezvous_failed", f"hotswap: cannot form the process group: {error}")
        self._last_rank = self.rank

    def _form_elastic_group(self, after_generation: int, fresh: bool) -> None:
        """Join the first generation newer than ``after_generation`` that forms. A fresh process
        waits for one that includes its slice; a survivor leaves if the newest one does not."""
        while True:
            membership = self._await_membership(after_generation, fresh)
            rank = membership.rank_of(self.env.slice_name, self.env.host_index)
            if rank is None:
                _say(f"leaving: slice {self.env.slice_name} is not in membership generation {membership.generation}")
                self._exit(CHECKPOINTED_EXIT_CODE, "removed")
            if self._form(membership, rank):
                return
            after_generation = membership.generation

    def _await_membership(self, after_generation: int, fresh: bool) -> Membership:
        assert self._watcher is not None
        slice_name, host = self.env.slice_name, self.env.host_index

        def acceptable(membership: Membership) -> bool:
            newer = membership.generation > after_generation
            return newer and (not fresh or membership.rank_of(slice_name, host) is not None)

        membership = self._watcher.wait_for(acceptable, self.membership_timeout_s, lambda: self.termination.requested)
        if membership is None:
            if self.termination.requested:
                self._stop_without_group()
            self._exit(
                RESTART_EXIT_CODE,
                "no_membership",
                f"hotswap: no membership generation after {after_generation} with slice "
                f"{slice_name!r} within {self.membership_timeout_s:g}s",
            )
        return membership

    def _form(self, membership: Membership, rank: int) -> bool:
        """Form the group of ``membership``; False when it did not form (a member missing, or a
        newer generation published meanwhile)."""
        spec = GroupSpec(
            membership.generation, rank, membership.world_size, membership.master_addr, membership.master_port
        )
        try:
            self.group.form(
                spec,
                interrupted=lambda: self.termination.requested or self._newer_generation(membership.generation),
            )
        except RendezvousFailed as error:
            if self.termination.requested:
                self._stop_without_group()
            log.warning("hotswap: generation %d did not form: %s", membership.generation, error)
            return False
        self.membership = membership
        self._last_rank = rank
        return True

    def _interrupted(self) -> bool:
        return self.termination.requested or self._newer_generation(self.generation)

    def _newer_generation(self, generation: int) -> bool:
        latest = self._watcher.poll() if self._watcher else None
        return latest is not None and latest.generation > generation

    def _change_membership(self, failed: bool) -> None:
        """Move to the next generation: after a failed collective, or because the controller
        published one. Survivors keep their state; joiners receive it from a survivor."""
        started = time.monotonic()
        previous = self.membership
        assert previous is not None
        after = previous.generation
        while True:
            self.group.destroy()
            self._form_elastic_group(after_generation=after, fresh=False)
            try:
                self._synchronise_state()
                break
            except Exception as error:
                if not is_peer_failure(error):
                    raise
                log.warning(
                    "hotswap: generation %d lost a member while forming: %s",
                    self.generation,
                    str(error).splitlines()[0],
                )
                after = self.generation
        if len(self.membership.slices) < len(previous.slices):
            self.elastic_down_events += 1
        elapsed = time.monotonic() - started
        self.events.record(EVENT_ELASTIC, generation=self.generation, slices=self.slices, duration_s=round(elapsed, 6))
        _say(
            f"elastic generation={self.generation} slices={self.slices} world_size={self.world_size} "
            f"rank={self.rank} cause={'peer_failure' if failed else 'membership'} seconds={elapsed:.3f}"
        )

    def _recover(self) -> None:
        """A collective failed: a peer is gone."""
        if self.elastic:
            self._change_membership(failed=True)
            return
        # Not elastic: the group cannot be re-formed in place. Every survivor holds the same
        # replica at the last complete step and saves it (the store keeps the first of
        # identical saves), so the restart the controller makes loses nothing even when the
        # lost peer was rank 0.
        self.group.destroy()
        if self.termination.requested:
            self._stop_without_group()
        if self._has_state and self.checkpointer is not None:
            self._save_now("recovery", [rng_state()])
        self._exit(RESTART_EXIT_CODE, "peer_lost", "hotswap: a peer was lost and the workload is not elastic")

    # Step boundaries -----------------------------------------------------------------------

    def _complete_step(self, duration_s: float) -> None:
        self.step += 1
        self.events.record(EVENT_STEP, step=self.step, duration_s=round(duration_s, 6), slices=self.slices)

    def _begin(self) -> None:
        if self._began:
            return
        self._began = True
        try:
            self._synchronise_state()
        except Exception as error:
            if not is_peer_failure(error):
                raise
            self._recover()
        self._boundary_at = time.monotonic()

    def _step_boundary(self, total: int) -> None:
        while True:
            try:
                self._decide(total)
                return
            except Exception as error:
                if self.world_size == 1 or not is_peer_failure(error):
                    raise
                log.warning("hotswap: a peer was lost at step %d: %s", self.step, str(error).splitlines()[0])
                self._recover()

    def _decide(self, total: int) -> None:
        """One boundary: agree with the other ranks, then act (at most one of re-form, stop,
        checkpoint); raises when a collective fails."""
        while True:
            # The flag is read before the membership file: a controller that removes a slice
            # publishes the new membership first and then SIGTERMs that slice's workers, so a
            # worker that sees the signal also sees the membership it leaves (it goes alone;
            # the job goes on). A SIGTERM with no new membership stops the whole job.
            stop = int(self.termination.requested)
            latest = self._watcher.poll() if self._watcher else None
            generation = latest.generation if latest else self.generation
            # Rank 0 alone decides on periodic checkpoints: it is the writer, and the others
            # may have joined since its last one.
            save = int(self.rank == 0 and self._periodic_checkpoint_due(total))
            if self.world_size > 1:
                stop, generation, save = self.group.agree_max([stop, generation, save])
            if self.elastic and generation > self.generation:
                self._reconfigure(generation)
                continue
            if stop:
                self._terminate()
            if save:
                self._last_checkpoint_step = self.step
                rngs = self._gather_rng()
                if self.rank == 0 and self.checkpointer is not None:
                    if self.async_checkpoints:
                        tree = self._tree(rngs)
                        self.checkpointer.save_async(
                            self.step, tree, "periodic", self.registry.changed_only_by_optimizers()
                        )
                    else:
                        self.checkpointer.save(self.step, self._tree(rngs), "periodic")
            return

    def _periodic_checkpoint_due(self, total: int) -> bool:
        return (
            self.checkpointer is not None
            and self.checkpoint_every is not None
            and self.step < total
            and self.step - self._last_checkpoint_step >= self.checkpoint_every
            and not self.checkpointer.busy  # one write in flight: this save waits for a later boundary
        )

    def _reconfigure(self, generation: int) -> None:
        assert self._watcher is not None
        # Another rank may have seen the new file first: read until this rank sees it too.
        self._watcher.wait_for(lambda m: m.generation >= generation, self.membership_timeout_s, lambda: False)
        self._change_membership(failed=False)

    def _terminate(self) -> None:
        """SIGTERM, agreed by every rank at this boundary: save and exit."""
        started = time.monotonic()
        rngs = self._gather_rng_or_own()
        if self.rank == 0 and self.checkpointer is not None:
            self.checkpointer.wait()
            if self.checkpointer.store.latest_step() == self.step:
                self.checkpointer.store.set_reason(self.step, "termination")  # same state, already on disk
            else:
                self._save_now("termination", rngs)
            _say(
                f"checkpoint saved step={self.step} reason=termination seconds={time.monotonic() - started:.3f} "
                f"grace_left_s={self.termination.seconds_left():.1f}"
            )
            if self.termination.seconds_left() < 0:
                log.warning(
                    "hotswap: the step and the save outlasted the %gs grace period: raise the workload's "
                    "--termination-grace-period, or a kill may cut the next save short",
                    self.termination.grace_period_s,
                )
        self._exit(CHECKPOINTED_EXIT_CODE, "terminated")

    def _stop_without_group(self) -> None:
        """SIGTERM with no group to agree in: every rank holding the replica saves it (the first
        identical save wins in the store)."""
        if self._has_state and self.checkpointer is not None:
            self._save_now("termination", [rng_state()])
        self._exit(CHECKPOINTED_EXIT_CODE, "terminated")

    def _finish(self) -> None:
        rngs = self._gather_rng_or_own()
        if self.rank == 0 and self.checkpointer is not None:
            self.checkpointer.wait()
            if self.checkpointer.store.latest_step() != self.step:
                self._save_now("final", rngs)
        self.events.record(EVENT_STOP, step=self.step, reason="complete", exit_code=0)

    def _exit(self, code: int, reason: str, message: str | None = None) -> None:
        if message:
            print(message, file=sys.stderr, flush=True)
        if self.checkpointer is not None:
            self.checkpointer.wait()
        self.events.record(EVENT_STOP, step=self.step, reason=reason, exit_code=code)
        self.group.destroy()
        self.events.close()
        # The user's finally blocks still run (SystemExit), but the interpreter's teardown of
        # PyTorch (about half a second) is skipped: a restart waits for this process to be gone.
        atexit.register(_leave_now, code)
        raise SystemExit(code)

    # State ---------------------------------------------------------------------------------

    def _progress(self) -> dict[str, int]:
        return {"step": self.step, "elastic_down_events": self.elastic_down_events}

    def _tree(self, rngs: list[dict[str, Any]]) -> dict[str, Any]:
        return build_tree(self.registry, self._progress(), rngs)

    def _gather_rng(self) -> list[dict[str, Any]]:
        """Every rank's RNG states, so a restart at the same size draws what it would have."""
        if self.world_size == 1:
            return [rng_state()]
        return self.group.all_gather_object(rng_state())

    def _gather_rng_or_own(self) -> list[dict[str, Any]]:
        """Every rank's RNG states, or only this rank's when a peer is already gone."""
        try:
            return self._gather_rng()
        except Exception as error:
            if not is_peer_failure(error):
                raise
            return [rng_state()]

    def _save_now(self, reason: str, rngs: list[dict[str, Any]]) -> None:
        assert self.checkpointer is not None
        try:
            self.checkpointer.save(self.step, self._tree(rngs), reason)
        except OSError as error:
            log.warning("hotswap: %s checkpoint of step %d failed: %s", reason, self.step, error)

    def _before_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.checkpointer is not None:
            self.checkpointer.wait_for_copy()

    def _load(self, tree: dict[str, Any]) -> None:
        if self.checkpointer is not None:
            self.checkpointer.wait_for_copy()
        self.registry.load(tree["objects"])
        self.step = int(tree["progress"]["step"])
        self.elastic_down_events = int(tree["progress"]["elastic_down_events"])
        self._last_checkpoint_step = self.step
        rngs = tree["rng"]
        set_rng_state(rngs[self.rank] if self.rank < len(rngs) else rngs[0])
        self._has_state = True

    def _announce_restore(self, source: str, started: float) -> None:
        elapsed = time.monotonic() - started
        self.events.record(EVENT_CHECKPOINT_RESTORE, step=self.step, duration_s=round(elapsed, 6), source=source)
        _say(restored_line(self.step, source))

    def _synchronise_state(self) -> None:
        """Make every rank hold the same state: from the most advanced survivor if any rank has
        live state, else from the newest complete checkpoint (read by rank 0)."""
        started = time.monotonic()
        if self.world_size == 1:
            if not self._has_state:
                self._restore_from_disk(started)
            return
        self.group.store_barrier("synchronise", self._interrupted)
        offers = self.group.all_gather_object((self._has_state, self.step))
        holders = [rank for rank, (has_state, _) in enumerate(offers) if has_state]
        if not holders:
            self._restore_from_disk(started)
            return
        best = max(offers[rank][1] for rank in holders)
        if len(holders) == self.world_size and all(step == best for _, step in offers):
            return  # every replica already holds the same step
        source = min(rank for rank in holders if offers[rank][1] == best)
        tree = self.group.broadcast_tree(self._tree([rng_state()]) if self.rank == source else None, source)
        if not (self._has_state and self.step == best):  # survivors at that step keep their own
            self._load(tree)
            self._announce_restore("peer", started)

    def _restore_from_disk(self, started: float) -> None:
        tree, reason = None, None
        if self.rank == 0 and self.checkpointer is not None:
            found = self.checkpointer.restore_latest()
            if found is not None:
                tree, reason = found[0], found[1].reason
        if self.world_size > 1:
            self.group.store_barrier("restored", self._interrupted)
            reason = self.group.broadcast_object(reason, 0)
            if reason is not None:
                tree = self.group.broadcast_tree(tree, 0)
        self._has_state = True
        if tree is None:
            return
        self._load(tree)
        self._announce_restore("migration" if reason == "termination" else "checkpoint", started)


_current: Run | None = None


def init(
    *,
    checkpoint_dir: str | None = None,
    checkpoint_every: int | None = 100,
    keep: int = 3,
    async_checkpoints: bool = True,
    collective_timeout_s: float | None = None,
    rendezvous_timeout_s: float = 300.0,
    membership_timeout_s: float = 300.0,
    backend: str | None = None,
) -> Run:
    """Start this process's part of the job (see :mod:`hotswap.train`).

    ``collective_timeout_s`` defaults to half the termination grace period (at most 60 s, at
    least 5 s): a rank stuck on a hung peer then still has time to act on SIGTERM and save.
    """
    global _current
    if _current is not None:
        raise RuntimeError("hotswap.train.init() was already called in this process")
    env = WorkerEnv.from_environ(os.environ)
    if collective_timeout_s is None:
        collective_timeout_s = max(5.0, min(60.0, env.grace_period_s / 2))
    _current = Run(
        env,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        keep=keep,
        async_checkpoints=async_checkpoints,
        collective_timeout_s=collective_timeout_s,
        rendezvous_timeout_s=rendezvous_timeout_s,
        membership_timeout_s=membership_timeout_s,
        backend=backend,
    )
    return _current
