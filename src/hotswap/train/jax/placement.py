"""Placing a job's initial state on the run's mesh, as one value in every process.

A script builds its state in each process (an ``nnx.Module`` from a seed, ``optimizer.init``):
arrays committed to one local device each, possibly different per process (a seed per
process). ``jax.device_put(tree, NamedSharding(mesh, P()))`` cannot place those across
processes (``ValueError ... addressable devices``); :func:`replicate` takes process 0's values,
as DDP does with its parameters, and builds each global array from them, typed PRNG keys
included (moved as their raw key data and wrapped again).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def _is_key(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def replicate(tree: Any, mesh: Mesh) -> Any:
    """``tree`` with every array replicated over ``mesh``, holding process 0's values (see the
    module). Leaves that are not arrays are kept as they are."""
    leaves, structure = jax.tree_util.tree_flatten(tree)
    arrays = [i for i, leaf in enumerate(leaves) if isinstance(leaf, (jax.Array, np.ndarray))]
    keys = {i: jax.random.key_impl(leaves[i]) for i in arrays if _is_key(leaves[i])}
    local = [np.asarray(jax.random.key_data(leaves[i]) if i in keys else leaves[i]) for i in arrays]
    if jax.process_count() > 1:
        local = multihost_utils.broadcast_one_to_all(local)  # process 0's values, everywhere
    replicated = NamedSharding(mesh, P())
    placed = list(leaves)
    for i, value in zip(arrays, local, strict=True):
        array = jax.make_array_from_process_local_data(replicated, np.asarray(value))
        placed[i] = jax.random.wrap_key_data(array, impl=keys[i]) if i in keys else array
    return jax.tree_util.tree_unflatten(structure, placed)
