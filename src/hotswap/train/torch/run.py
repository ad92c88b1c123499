"""A training run: the in-job half of hotswap, as the user's loop sees it.

The run joins the process group described by the worker environment (or, in an elastic
workload, by the membership file), restores state on the first step, and at every step
boundary decides, together with the other ranks, whether to stop (SIGTERM), re-form the group
(a new membership), or checkpoint. See :func:`hotswap.train.init` for the user's view.

:class:`Run` is the front; the work is done by
:class:`~hotswap.train.formation.GroupFormation` (the group and its generations),
:class:`~hotswap.train.boundary.StepBoundary` (what the ranks agree to do between steps),
:class:`~hotswap.train.termination.Termination` (how the run ends) and
:class:`~hotswap.train.torch.sync.StateSync` (the state between ranks and disk). This module wires
them to PyTorch.

The first three are framework-neutral: they drive the group and the state through the
protocols of :mod:`hotswap.train.protocols` (here :class:`~hotswap.train.torch.distributed.ProcessGroup`
and :class:`~hotswap.train.torch.sync.StateSync`; JAX's are in :mod:`hotswap.train.jax`), and what
the loop sees of any run is :class:`~hotswap.train.front.RunFront`; the life cycle both
frameworks' runs share (set-up, first restore, step loop, close) is
:class:`~hotswap.train.lifecycle.RunLifecycle`.

Step numbers count from 1: ``step=N`` is the N-th step, a checkpoint of step N holds the state
after N steps, and ``restored step=N`` is followed by step N+1.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from hotswap.api.worker import WorkerEnv
from hotswap.train import runs
from hotswap.train.files import CheckpointDirectoryRefused
from hotswap.train.formation import GroupFormation
from hotswap.train.lifecycle import (
    RunLifecycle,
    half_grace_period,
    refuse_checkpoint_directory,
    warn_no_checkpoint_directory,
)
from hotswap.train.progress import Progress
from hotswap.train.save_leases import SaveLeases
from hotswap.train.termination import Termination
from hotswap.train.torch.checkpointer import Checkpointer
from hotswap.train.torch.data_parallel import DataParallel
from hotswap.train.torch.distributed import ProcessGroup
from hotswap.train.torch.state import StateRegistry
from hotswap.train.torch.store import CheckpointStore
from hotswap.train.torch.sync import StateSync

log = logging.getLogger("hotswap.train")


class Run(RunLifecycle):
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
        sync_initial_state: bool = True,
    ) -> None:
        started_at = time.time()
        if checkpoint_every is not None and checkpoint_every < 1:
            raise ValueError(
                f"checkpoint_every must be at least 1 (or None for no periodic checkpoints), not {checkpoint_every}"
            )
        request = self._open(env)
        self.registry = StateRegistry()
        directory = checkpoint_dir or env.checkpoint_dir
        self.checkpointer = (
            Checkpointer(CheckpointStore(directory, keep), self.events, fallback=_resume_store(env, keep)) if directory else None
        )
        if directory is None:
            warn_no_checkpoint_directory()
        leases = SaveLeases(directory, env.attempt) if directory else None
        if leases is not None:
            leases.hold()
        self.group = ProcessGroup(backend, collective_timeout_s, rendezvous_timeout_s, env)
        self.progress = Progress()
        self.state = StateSync(
            self.registry,
            self.checkpointer,
            self.group,
            self.progress,
            self.events,
            async_checkpoints=async_checkpoints,
            cause=env.start_cause,
            allow_fresh_start=env.allow_fresh_start,
            sync_initial_state=sync_initial_state,
            leases=leases,
            grace_period_s=env.grace_period_s,
        )

        def formation(termination: Termination) -> GroupFormation:
            return GroupFormation(
                env, self.group, termination, self.state, self.progress, self.events, membership_timeout_s=membership_timeout_s
            )

        self._assemble(request, self.state, formation, checkpoint_every)
        self.formation.join_first(defer=True)
        self._started(started_at)

    # Where this worker stands (the rest is in RunFront) -------------------------------------

    @property
    def device(self) -> Any:
        """Where this rank computes (a ``torch.device``): its own GPU on a GPU-backed slice,
        the CPU on an emulated one. Put the model and its batches there."""
        return self.group.device

    # The user's API ------------------------------------------------------------------------

    def register(self, **objects: Any) -> None:
        """Objects whose state is checkpointed and sent to joining replicas: anything with
        ``state_dict()``/``load_state_dict()`` (model, optimizer, LR scheduler,
        :class:`~hotswap.train.ResumableBatches`), a dict or list updated in place, or a number
        or string (``best_val_loss=float("inf")``), read and set as ``run.scalars[name]``.
        A ``torch.compile``d or DDP-wrapped model registers as the model it wraps, so its
        checkpoints restore with the wrapper or without."""
        if self._began:
            raise RuntimeError("register() objects before the first step: the state is restored then")
        for name, obj in objects.items():
            self.registry.register(name, obj)

    def data_parallel(self, module: Any, **ddp_options: Any) -> Any:
        """``module`` as ``DistributedDataParallel`` (same options) that follows the run's group:
        use it where a script would construct DDP. It is built at the first training forward
        (in an elastic job the group forms at the first step) and again on each group that
        replaces a lost one; evaluation forwards run the module alone. Its ``state_dict`` is the
        module's: register either."""
        return DataParallel(module, self.group, **ddp_options)

    @property
    def scalars(self) -> dict[str, Any]:
        """The registered numbers and strings, by name: read and set them here (restored at the
        first step, saved with every checkpoint)."""
        return self.registry.scalars

    def steps(self, total: int) -> Iterator[int]:
        """Yield step numbers up to ``total``, from the one after the restored state.

        Before each step the ranks agree on what to do: stop and checkpoint (SIGTERM; the
        process then exits with ``CHECKPOINTED_EXIT_CODE``), re-form the group (a new elastic
        membership), or take a periodic checkpoint. After the last step a final checkpoint is
        written.
        """
        return self._steps(total)

    def step_done(self) -> None:
        """For loops that do not use :meth:`steps`: count a step done, then act at this
        boundary as :meth:`steps` does (stop on SIGTERM, re-form, checkpoint). Call
        :meth:`restore` before the first step to resume; without it the script's current state
        is the job's state."""
        self._step_done()

    def restore(self) -> None:
        """Restore the job's state now (from a surviving replica, else the newest complete
        checkpoint) instead of at the first step. Call it after :meth:`register`."""
        self._begin()

    # Hooks of the life cycle -----------------------------------------------------------------

    def _step_starts(self) -> object:
        return self.state.savepoint() if self.world_size > 1 else None

    def _rewind(self, savepoint: object) -> bool:
        if savepoint is None:
            return False
        self.state.rewind(savepoint)  # type: ignore[arg-type]
        return True


def _resume_store(env: WorkerEnv, keep: int) -> CheckpointStore | None:
    """The run's resume source (see :mod:`hotswap.train.runs`; read by the rank that restores)."""
    source = runs.resume_source(env)
    if source is None:
        return None
    if not source.is_dir():
        log.warning("hotswap: the checkpoint to resume from, %s, does not exist: starting fresh", source)
        return None
    return CheckpointStore(source, keep)


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
    sync_initial_state: bool = True,
) -> Run:
    """Start this process's part of the job (see :mod:`hotswap.train`).

    ``collective_timeout_s`` defaults to half the termination grace period (at most 60 s, at
    least 5 s): a rank stuck on a hung peer then still has time to act on SIGTERM and save.
    ``sync_initial_state``: at a fresh start (nothing restored), every rank takes rank 0's
    registered state, as DDP does with the parameters; False keeps each rank's own.
    """
    global _current
    if _current is not None:
        raise RuntimeError("hotswap.train.init() was already called in this process")
    env = WorkerEnv.from_environ(os.environ)
    if collective_timeout_s is None:
        collective_timeout_s = half_grace_period(env)
    try:
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
            sync_initial_state=sync_initial_state,
        )
    except CheckpointDirectoryRefused as refused:
        refuse_checkpoint_directory(refused)
    return _current

