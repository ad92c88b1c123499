"""hotswap.train: the in-job half of hotswap, for PyTorch and JAX training loops.

The package itself is framework-neutral: its modules (a run's life cycle, group formation and
elasticity, step-boundary agreement, SIGTERM to save to exit, checkpoint files, progress, events,
the data position) import only the standard library and :mod:`hotswap.api`, and both SDKs build
on them: PyTorch's in :mod:`hotswap.train.torch`, JAX's in :mod:`hotswap.train.jax` (a JAX loop
imports ``hotswap.train.jax as hj``; its docstring shows one).

This namespace is the PyTorch SDK's front door: a few lines make a PyTorch loop survive
preemption, migration (delete and re-create) and slice loss::

    import hotswap.train as ht

    run = ht.init()                                    # worker env, process group, SIGTERM flag
    batches = ht.ResumableBatches(len(dataset), batch_size=32, seed=0)
    run.register(model=model, optimizer=optimizer, batches=batches)
    for step in run.steps(10_000):                     # restores first; checkpoints; stops on SIGTERM
        with run.elastic_step():                       # a lost peer re-forms the group, not a crash
            x, y = dataset[batches.take(run.rank, run.world_size)]
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            ht.average_gradients(model)
            optimizer.step()
            run.report(loss=loss.item())               # step=... elastic_manager.good_slice_count=...

On SIGTERM the loop finishes the step, saves, and the process exits with
:data:`hotswap.api.worker.CHECKPOINTED_EXIT_CODE`. Users of seed 004's migrator keep their
code with ``from hotswap.train import migrator``.

Importing ``hotswap.train`` (which importing :mod:`hotswap.train.jax` does first) loads only
the worker contract (:mod:`hotswap.api.worker`) and the neutral :mod:`~hotswap.train.data` and
:mod:`~hotswap.train.scaling`: ``ResumableBatches``, ``scale_by_slices`` and the exit codes,
which :mod:`hotswap.train.jax` serves too. PyTorch is imported when ``init``, ``Run``,
``average_gradients`` or ``migrator`` is first used (``pip install 'hotswap[torch]'``); JAX only
when a name of :mod:`hotswap.train.jax` is (``pip install 'hotswap[jax]'``).
"""

from __future__ import annotations

import importlib
from typing import Any

from hotswap.api.worker import CHECKPOINTED_EXIT_CODE, RESTART_EXIT_CODE
from hotswap.train.data import ResumableBatches
from hotswap.train.scaling import scale_by_slices

# Names served from modules that import torch, loaded on first use.
_TORCH_EXPORTS = {
    "init": "hotswap.train.torch.run",
    "Run": "hotswap.train.torch.run",
    "average_gradients": "hotswap.train.torch.distributed",
    "migrator": "hotswap.train.torch.migration",
}

__all__ = ["CHECKPOINTED_EXIT_CODE", "RESTART_EXIT_CODE", "ResumableBatches", "scale_by_slices", *_TORCH_EXPORTS]


def __getattr__(name: str) -> Any:
    module_name = _TORCH_EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'hotswap.train' has no attribute {name!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        if (error.name or "").split(".")[0] in ("torch", "numpy"):
            raise ImportError(
                f"hotswap.train.{name} needs PyTorch: pip install 'hotswap[torch]' "
                "(where the CPU build is on disk, pip install torch==2.13.0 first)"
            ) from None
        raise
    return getattr(module, name)
