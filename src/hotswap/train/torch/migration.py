"""Seed 004's migrator API (pytorchjob-migration), on hotswap's machinery.

Scripts written for it keep working with one changed import::

    from hotswap.train import migrator
    migrator.register('model', model)
    migrator.register('optimizer', optimizer)
    migrator.register('metrics', metrics)          # a dict, updated in place on load
    migrator.listening()
    if migrator.resume:
        migrator.load_ckpt()                       # every rank gets the same state

Unlike the original, nothing is written from the signal handler: SIGTERM is noted, and the
state is saved at the end of the optimizer step that follows (a step boundary, where model and
optimizer agree), then the process exits with ``CHECKPOINTED_EXIT_CODE``. ``migrator.step``
counts optimizer steps across restarts, so a script can skip the batches already done.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from hotswap.train.torch.run import Run, init
from hotswap.train.torch.state import registrable_kind

log = logging.getLogger("hotswap.train")


class Migrator:
    """Seed 004's singleton: register objects, listen for SIGTERM, resume from a checkpoint."""

    def __init__(self) -> None:
        self._pending: dict[str, Any] = {}  # registrations made before listening()
        self._run: Run | None = None
        self._boundary_optimizer: torch.optim.Optimizer | None = None

    def register(self, name: str, obj: Any) -> None:
        """Save and restore ``obj`` (a model, optimizer, scheduler, dict or list) as ``name``."""
        if registrable_kind(obj) == "scalar":  # seed 004's API hands nothing back: it must update in place
            raise TypeError(
                f"cannot register a {type(obj).__name__} with the migrator: it restores objects in place "
                "(put numbers in a registered dict)"
            )
        if self._run is not None:
            self._run.register(**{name: obj})
            return
        registrable_kind(obj)
        self._pending[name] = obj

    def listening(self, checkpoint_every: int | None = None, **init_options: Any) -> None:
        """Start handling SIGTERM (and, with ``checkpoint_every``, save every N optimizer steps).

        Uses the process group the script initialised, if any; otherwise forms one from the
        worker environment (``init_options`` go to :func:`hotswap.train.init`).
        """
        if self._run is not None:
            return
        self._run = init(checkpoint_every=checkpoint_every, **init_options)
        self._run.register(**self._pending)
        optimizers = self._run.registry.optimizers()
        if optimizers:
            self._boundary_optimizer = optimizers[0]
            optimizers[0].register_step_post_hook(self._after_optimizer_step)
        else:
            register_optimizer_step_post_hook(self._after_optimizer_step)

    @property
    def resume(self) -> bool:
        """Whether a checkpoint exists to resume from (the same answer on every rank)."""
        run = self._listening_run()
        latest = None
        if run.rank == 0 and run.checkpointer is not None:
            latest = run.checkpointer.store.latest_step()
        if run.world_size > 1:
            latest = run.group.broadcast_object(latest, 0)
        return latest is not None

    def load_ckpt(self) -> None:
        """Load the newest complete checkpoint into the registered objects, on every rank."""
        run = self._listening_run()
        run.restore()
        if run.step == 0:
            log.warning("hotswap: migrator.load_ckpt() found no complete checkpoint; starting fresh")

    @property
    def step(self) -> int:
        """Optimizer steps done, counting those before the last restart."""
        return self._listening_run().step

    def report(self, **metrics: object) -> None:
        """Print the contract's step line (see :meth:`hotswap.train.Run.report`)."""
        self._listening_run().report(**metrics)

    def _listening_run(self) -> Run:
        if self._run is None:
            raise RuntimeError("call migrator.listening() first")
        return self._run

    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._boundary_optimizer is not None and optimizer is not self._boundary_optimizer:
            return
        self._listening_run().step_done()


migrator = Migrator()
