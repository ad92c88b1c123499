"""hotswap.train.jax: the in-job half of hotswap for JAX (multi-controller, ``jax.distributed``).

The PyTorch SDK's contract for JAX loops: checkpoint on SIGTERM, resume, elastic slices,
goodput events and seed 001's log lines. Checkpoints are orbax's (asynchronous
``CheckpointManager``), restored onto whatever mesh the job now has::

    import hotswap.train.jax as hj

    run = hj.init(checkpoint_every=50)            # jax.distributed for this generation, SIGTERM flag
    mesh = run.mesh()                             # (slices, devices per slice)
    run.register(make_state(mesh), batches=batches)   # pytree of jax.Array + data position
    for step in run.steps(10_000):                # restores first; checkpoints; stops on SIGTERM
        with run.elastic_step():                  # a lost peer moves the job on, not a crash
            run.state, loss = train_step(run.state, next_batch(batches, run))
            run.report(loss=loss)                 # step=... elastic_manager.good_slice_count=...

Flax NNX: register the objects themselves (``run.register({"model": model, "optimizer":
optimizer, "metrics": metrics}, batches=batches)``); the run places, restores and reads them
(:mod:`hotswap.train.jax.flax_nnx`) and the loop assigns nothing to ``run.state``. A
pathwaysutils user finds its ``Manager`` in :mod:`hotswap.train.jax.elastic`.

JAX, orbax and NumPy are imported when a name of this package is first used
(``pip install 'hotswap[jax]'``).
"""

from __future__ import annotations

import importlib
from typing import Any

from hotswap.api.worker import CHECKPOINTED_EXIT_CODE, RESTART_EXIT_CODE
from hotswap.train.data import ResumableBatches
from hotswap.train.scaling import scale_by_slices

INSTALL_HINT = "hotswap.train.jax needs JAX and orbax: pip install 'hotswap[jax]'"

# Names served from modules that import JAX, loaded on first use.
_JAX_EXPORTS = {
    "init": "hotswap.train.jax.run",
    "current": "hotswap.train.jax.run",
    "JaxRun": "hotswap.train.jax.run",
    "StateMismatchError": "hotswap.train.jax.trees",
    "elastic": "hotswap.train.jax.elastic",
}

__all__ = ["CHECKPOINTED_EXIT_CODE", "RESTART_EXIT_CODE", "ResumableBatches", "scale_by_slices", *_JAX_EXPORTS]


def __getattr__(name: str) -> Any:
    module_name = _JAX_EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'hotswap.train.jax' has no attribute {name!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        if (error.name or "").split(".")[0] in ("jax", "jaxlib", "orbax", "numpy"):
            raise ImportError(INSTALL_HINT) from None
        raise
    return module if module_name.endswith(f".{name}") else getattr(module, name)
