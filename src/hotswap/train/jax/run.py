"""A JAX training run: the in-job half of hotswap for multi-controller JAX.

The same contract as the PyTorch :class:`hotswap.train.torch.run.Run`, on the same framework-neutral
pieces (:class:`~hotswap.train.boundary.StepBoundary`,
:class:`~hotswap.train.termination.Termination`, and group formation), with JAX's group
(:class:`~hotswap.train.jax.runtime.JaxGroup`), JAX's state
(:class:`~hotswap.train.jax.sync.JaxStateSync`, orbax checkpoints) and one difference:
a new membership generation restarts the process (:mod:`hotswap.train.jax.formation`).

JAX state is immutable, so the loop hands the run each step's new state (``run.state = ...``);
that is what a SIGTERM saves, a periodic checkpoint writes and a survivor hands over.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, NoReturn

import jax
import numpy as np

from hotswap.api.membership import Membership
from hotswap.api.runs import CAUSE_ELASTIC
from hotswap.api.worker import CHECKPOINTED_EXIT_CODE, RESTART_EXIT_CODE, WorkerEnv
from hotswap.api.worker_output import EVENT_STOP
from hotswap.train import runs
from hotswap.train.formation import GroupFormation
from hotswap.train.jax import handoff as handoffs
from hotswap.train.jax.flax_nnx import LiveNnx, holds_nnx
from hotswap.train.jax.formation import RestartingFormation
from hotswap.train.jax.runtime import JaxGroup, configure_runtime, cpu_only, default_compilation_cache
from hotswap.train.jax.sync import JaxStateSync
from hotswap.train.jax.watchdog import Watchdog
from hotswap.train.files import CheckpointDirectoryRefused
from hotswap.train.lifecycle import (
    RunLifecycle,
    half_grace_period,
    refuse_checkpoint_directory,
    warn_no_checkpoint_directory,
)
from hotswap.train.progress import Progress
from hotswap.train.rendezvous import first_line, timed_out
from hotswap.train.termination import Termination

log = logging.getLogger("hotswap.train")


class JaxRun(RunLifecycle):
    """One process's part of a JAX training job. Create it with :func:`hotswap.train.jax.init`."""

    def __init__(
        self,
        env: WorkerEnv,
        *,
        checkpoint_dir: str | None,
        checkpoint_every: int | None,
        keep: int,
        async_checkpoints: bool,
        snapshot_every: int | None,
        stall_timeout_s: float,
        rendezvous_timeout_s: float,
        membership_timeout_s: float,
        compilation_cache: str | None,
        sync_initial_state: bool = True,
    ) -> None:
        started_at = time.time()
        for name, value in (("checkpoint_every", checkpoint_every), ("snapshot_every", snapshot_every)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (or None for never), not {value}")
        taken = handoffs.take()
        # A successor run ahead (see successor): its survivor's state comes at its first step.
        self._pending = None if taken is None or isinstance(taken, handoffs.Handoff) else taken
        handoff = taken.preview if self._pending is not None else taken
        request = self._open(env)
        if self._pending is None:  # a successor's SIGTERM waits until it is the worker
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked across a restart
        configure_runtime(compilation_cache, no_gpu=env.emulated)
        self.group = JaxGroup(rendezvous_timeout_s)
        self.group.adopt_service(handoff.service if handoff else None)
        self.progress = Progress()
        self.sync = JaxStateSync(
            self.group, self.progress, self.events, hosts_per_slice=env.hosts_per_slice,
            async_checkpoints=async_checkpoints, snapshot_every=snapshot_every, handoff=handoff,
            cause=env.start_cause, allow_fresh_start=env.allow_fresh_start, attempt=env.attempt,
            grace_period_s=env.grace_period_s, sync_initial_state=sync_initial_state,
        )

        def formation(termination: Termination) -> GroupFormation:
            return RestartingFormation(
                env,
                self.group,
                termination,
                self.sync,
                self.progress,
                self.events,
                membership_timeout_s=membership_timeout_s,
                handoff=handoff,
                restart=self._restart,
            )

        self._assemble(request, self.sync, formation, checkpoint_every)
        self.watchdog = self._watchdog(stall_timeout_s) if env.membership_file else None
        self._updated = False  # the step assigned its new state
        self._nnx: LiveNnx | None = None  # registered Flax NNX objects, read at each boundary
        # orbax takes a while to import: let it load while the group forms (a restarted
        # process waits there for the others anyway).
        loading = threading.Thread(target=importlib.import_module, args=("hotswap.train.jax.checkpoints",), daemon=True)
        loading.start()
        self.formation.join_first()
        if self._pending is not None and not cpu_only():
            self._take_over()  # no accelerator backend while the survivor holds the memory
        loading.join()
        from hotswap.train.jax.checkpoints import OrbaxCheckpoints

        directory = checkpoint_dir or env.checkpoint_dir
        if directory:
            source = runs.resume_source(env)
            self.sync.attach(OrbaxCheckpoints(
                directory, keep, self.events, record_events=self.rank == 0, fallback=str(source) if source else None,
                clean_leftovers=not joins_live_job(env, handoff),
            ))
        else:
            warn_no_checkpoint_directory()
        self._started(started_at, announce=handoff is None)

    # Where this process stands -------------------------------------------------------------

    def mesh(self, axis_names: tuple[str, str] = ("slice", "device")) -> jax.sharding.Mesh:
        """Every device of the active slices as a (slices, devices per slice) mesh: shard over
        the second axis within a slice and replicate over the first (data parallelism across
        slices), so that a survivor slice holds a whole replica."""
        devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
        return jax.sharding.Mesh(np.array(devices).reshape(self.slices, -1), axis_names)

    # The user's API ------------------------------------------------------------------------

    def register(self, state: Any, **objects: object) -> None:
        """The job's state: a pytree of ``jax.Array`` placed on :meth:`mesh` as it should be
        (its initial value, and the shapes, dtypes and shardings a checkpoint or a peer's copy
        is restored into), and objects with ``state_dict()``/``load_state_dict()`` (such as
        :class:`~hotswap.train.ResumableBatches`) or dicts, saved as JSON with it.

        ``state`` may instead be Flax NNX objects (a model, an ``nnx.Optimizer``, metrics: one,
        or a dict, list or tuple of them): the run then places their arrays on the mesh
        (replicated, process 0's values, unless already placed across it), restores into them
        in place and reads them at each step boundary; the loop assigns nothing to
        :attr:`state` (see :mod:`hotswap.train.jax.flax_nnx`)."""
        if self._began:
            raise RuntimeError("register() the state before the first step: it is restored then")
        if holds_nnx(state):
            self._nnx = LiveNnx(state, jax.sharding.NamedSharding(self.mesh(), jax.sharding.PartitionSpec()))
            state = self._nnx.template
        self.sync.register(state, objects)

    @property
    def state(self) -> Any:
        """The job's state: restored at the first step; assign each step's new state to it."""
        if self.sync.current is None:
            raise RuntimeError("register the state first: run.register(state, ...)")
        return self.sync.current

    @state.setter
    def state(self, value: Any) -> None:
        if self._nnx is not None:
            self._nnx.write(value)
        self.sync.current = value
        self._updated = True

    def steps(self, total: int) -> Iterator[int]:
        """Yield step numbers up to ``total``, from the one after the restored state.

        Before each step the ranks agree on what to do: stop and checkpoint (SIGTERM; the
        process then exits with ``CHECKPOINTED_EXIT_CODE``), move to a new membership (the
        process restarts into it), or take a periodic checkpoint. After the last step a final
        checkpoint is written. Each step assigns its new state to :attr:`state`.
        """
        return self._steps(total)

    def step_done(self, state: Any = None) -> None:
        """For loops that do not use :meth:`steps`: ``state`` is the state after a step (none
        for registered NNX objects: they are read); act at this boundary as :meth:`steps` does.
        Call :meth:`restore` before the first step to resume; without it ``state`` is the job's
        state."""
        if self._nnx is None:
            if state is None:
                raise TypeError("step_done(state): the state after the step")
            self.state = state
        self._step_done()

    def restore(self) -> Any:
        """Restore the job's state now (from this process's own handoff, a peer, or the newest
        checkpoint) instead of at the first step, and return it."""
        self._begin()
        return self.state

    def report(self, **metrics: object) -> None:
        """Print the step line of the contract (seed 001's awk reads it), with ``metrics``
        (JAX and NumPy scalars are printed as numbers)."""
        super().report(**{key: _plain(value) for key, value in metrics.items()})

    def close(self) -> None:
        """Finish the checkpoint in flight and leave the group (also done at exit)."""
        if self.watchdog is not None:
            self.watchdog.stop()
        super().close()

    # A successor run ahead ----------------------------------------------------------------

    def _begin(self) -> None:
        if self._pending is not None:
            self._take_over()
        super()._begin()

    def _step_done(self) -> None:
        if self._pending is not None:
            self._take_over()
        super()._step_done()

    def _take_over(self) -> None:
        """Wait for the survivor's state, and become the worker (see successor)."""
        pending = self._pending
        assert pending is not None
        handoff = pending.wait()
        self._pending = None  # only now: a restart asked for while it waits (the watchdog) ends it instead
        self.sync.receive(handoff)
        self.formation.receive(handoff)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    def _restart(self, handoff: handoffs.Handoff) -> NoReturn:
        if self._pending is not None:  # a successor that will not take over: its survivor restarts plainly
            handoffs.flush_streams()
            os._exit(RESTART_EXIT_CODE)
        handoffs.restart(handoff)

    # Between steps -------------------------------------------------------------------------

    def _synchronised(self) -> None:
        if self._nnx is not None:  # the restored (or peer's) arrays into the user's objects
            self._nnx.write(self.sync.current)
        self.formation.finish_change()

    def _step_starts(self) -> object:
        self._updated = False
        return None

    def _step_ends(self) -> None:
        if not self._updated and self._nnx is None:
            raise RuntimeError("assign each step's new state to run.state (JAX arrays are immutable)")

    def _cross(self, total: int) -> None:
        began = time.monotonic()
        if self._nnx is not None:
            self.sync.current = self._nnx.read()
        try:
            self.sync.at_boundary()
        except Exception as error:  # the step's result, computed asynchronously, failed
            if self.world_size == 1 or not self.group.is_peer_failure(error):
                raise
            log.warning("hotswap: a peer was lost in step %d: %s", self.step, first_line(error))
            self.formation.recover(timed_out=timed_out(error), since=began)
        if self.watchdog is not None:
            self.watchdog.beat()
        self.boundary.cross(total)
        self.sync.commit()

    def _watchdog(self, stall_s: float) -> Watchdog:
        assert self.env.membership_file
        watchdog = Watchdog(
            self.env.membership_file,
            stall_s=stall_s,
            generation=lambda: self.formation.generation,
            forming=lambda: self.group.forming.generation if self.group.forming else None,
            is_rank_zero=lambda: self.group.planned_rank == 0,
            others_leaving=self.group.others_leaving,
            terminated=lambda: self.termination.requested,
            on_stall=self._abandon,
            on_terminated=self._end_without_group,
        )
        watchdog.start()
        return watchdog

    def _abandon(self, newest: Membership, forming: bool, since: float) -> None:
        forming_generation = self.group.forming.generation if forming and self.group.forming else None
        self.formation.abandon(newest, forming_generation, since)

    def _end_without_group(self) -> NoReturn:
        """SIGTERM while the group was still forming: nothing to save with; leave now."""
        self.sync.save_own("termination")
        if self.sync.leases is not None:
            self.sync.leases.release()
        self.events.record(EVENT_STOP, step=self.step, reason="terminated", exit_code=CHECKPOINTED_EXIT_CODE)
        self.events.close()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(CHECKPOINTED_EXIT_CODE)


def joins_live_job(env: WorkerEnv, handoff: handoffs.Handoff | None) -> bool:
    """Whether this process joins an elastic job whose other processes may be saving now: a
    survivor's next program (run ahead, its survivors still train and save) or a joiner of a
    grow-back (it forms the group with those programs, ahead of the survivors' switch)."""
    return handoff is not None or env.start_cause == CAUSE_ELASTIC


def _plain(value: object) -> object:
    """A JAX or NumPy scalar as a Python number (``loss=0.25``, not ``loss=Array(0.25, ...)``)."""
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        return value.item()  # type: ignore[attr-defined]
    return value


_current: JaxRun | None = None


def init(
    *,
    checkpoint_dir: str | None = None,
    checkpoint_every: int | None = 100,
    keep: int = 3,
    async_checkpoints: bool = True,
    snapshot_every: int | None = 10,
    stall_timeout_s: float | None = None,
    rendezvous_timeout_s: float = 300.0,
    membership_timeout_s: float = 300.0,
    compilation_cache: str | bool = True,
    sync_initial_state: bool = True,
) -> JaxRun:
    """Start this process's part of a JAX job (see :mod:`hotswap.train.jax`). Call it before
    any other JAX call: it initialises ``jax.distributed`` for the process's group.

    ``snapshot_every``: steps between host copies of the state, what a survivor hands over
    when its live arrays are gone (a step that donated them failed, or the watchdog had to
    break a hung collective). ``stall_timeout_s``: how long a step may outlast the publication
    of a new membership before the watchdog moves the process on (default: half the
    termination grace period, 5 to 60 s). ``compilation_cache``: JAX's persistent compilation
    cache, so that a restarted process loads its compiled step (True: a per-user directory in
    the temporary space; a path; False: off; a cache the script configured itself is kept).
    ``sync_initial_state``: at a fresh start (nothing restored), every process takes process
    0's registered state, as DDP does (False: each keeps the state it registered).
    """
    global _current
    if _current is not None:
        raise RuntimeError("hotswap.train.jax.init() was already called in this process")
    env = WorkerEnv.from_environ(os.environ)
    if stall_timeout_s is None:
        stall_timeout_s = half_grace_period(env)
    try:
        _current = JaxRun(
            env,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            keep=keep,
            async_checkpoints=async_checkpoints,
            snapshot_every=snapshot_every,
            stall_timeout_s=stall_timeout_s,
            rendezvous_timeout_s=rendezvous_timeout_s,
            membership_timeout_s=membership_timeout_s,
            compilation_cache=default_compilation_cache() if compilation_cache is True else (compilation_cache or None),
            sync_initial_state=sync_initial_state,
        )
    except CheckpointDirectoryRefused as refused:
        refuse_checkpoint_directory(refused)
    return _current


def current() -> JaxRun | None:
    """The run of this process, once :func:`init` was called."""
    return _current
