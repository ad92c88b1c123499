"""Flax NNX objects (a model, its ``nnx.Optimizer``, metrics) registered as a run's state.

NNX objects are mutable and hold their arrays in ``nnx.Variable``s, while the run keeps a pytree
of ``jax.Array`` (what orbax saves, a survivor hands over and a peer sends). So the run keeps
the objects themselves and does the round trip a Flax user would write around orbax: at each
step boundary it reads ``nnx.to_pure_dict(nnx.state(nodes))`` (the arrays after the step: metrics
reset included) and after a restore it writes the restored arrays back with ``nnx.update``. The
loop only calls its ``nnx.jit`` step on the objects; it assigns nothing to ``run.state``.

At registration every array is placed on the run's mesh as the registered layout says
(replicated, unless the script placed it across the mesh itself), from process 0's values: NNX
creates its arrays committed to this process's default device, where ``jax.device_put`` onto
a sharding spanning other processes' devices raises ``ValueError ... addressable devices``;
and every process then starts from one model, as DDP makes it. Steps and ``metrics.reset()``
keep the placement (Flax writes into the arrays); a value the script assigns anew
(``variable.value = jnp.zeros(...)``) lands on the local device: the boundary places it again,
from this process's value, and writes it back, so the next step gets it placed.

Flax is not imported here: a state holds NNX objects only if the script imported ``flax.nnx``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from hotswap.train.jax.trees import is_key, plain


def holds_nnx(state: Any) -> bool:
    """Whether ``state`` is an NNX object, or a dict, list or tuple of NNX objects (TypeError for
    a mix of NNX objects and other values: half of it would not be restored in place)."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is None:
        return False
    kinds = tuple(getattr(nnx, name) for name in ("Pytree", "Object") if isinstance(getattr(nnx, name, None), type))
    values = list(state.values()) if isinstance(state, Mapping) else list(state) if isinstance(state, (list, tuple)) else [state]
    nodes = [isinstance(value, kinds) for value in values]
    if any(nodes) and not all(nodes):
        raise TypeError(
            "register NNX objects alone (one, or a dict, list or tuple of them): keep other arrays "
            "in an nnx.Variable of one of them (or register them as plain arrays, without NNX objects)"
        )
    return bool(values) and all(nodes)


class LiveNnx:
    """The registered NNX objects and the layout (``template``) their arrays are kept in."""

    def __init__(self, nodes: Any, layout: jax.sharding.Sharding) -> None:
        from flax import nnx

        self._nnx = nnx
        self.nodes = nodes
        self.template = _placed(self._pure(), layout, from_process_0=True)
        self._structure = jax.tree_util.tree_structure(self.template)
        # Where each of the state's arrays is among the objects' pytree leaves, per pytree
        # structure seen: flattening the objects costs a fraction of NNX's graph traversal
        # (nnx.state), which runs again only when the structure changes.
        self._positions: list[tuple[Any, list[int]]] = []
        self.write(self.template)

    def read(self) -> Any:
        """The objects' arrays now, each on the registered layout."""
        leaves = self._leaves()
        expected = jax.tree_util.tree_leaves(self.template)
        moved = [i for i, (leaf, like) in enumerate(zip(leaves, expected)) if not _placed_like(leaf, like)]
        for i in moved:
            leaves[i] = _place(leaves[i], expected[i].sharding, _host(leaves[i]))
        state = jax.tree_util.tree_unflatten(self._structure, leaves)
        if moved:
            self.write(state)
        return state

    def _leaves(self) -> list[Any]:
        """The state's arrays, in the registered state's order."""
        flat, structure = jax.tree_util.tree_flatten(self.nodes)
        for seen, positions in self._positions:
            if seen == structure:
                return [flat[i] for i in positions]
        leaves, found = jax.tree_util.tree_flatten(self._pure())
        if found != self._structure:
            raise ValueError(
                f"the registered NNX objects now hold {found.num_leaves} arrays in another tree than the "
                f"{self._structure.num_leaves} they were registered with: register them once they hold all their state"
            )
        positions = _positions(leaves, flat)
        if positions is not None and len(self._positions) < 4:
            self._positions.append((structure, positions))
        return leaves

    def write(self, tree: Any) -> None:
        """Put ``tree``'s arrays into the objects, in place (``nnx.update``)."""
        state = self._nnx.state(self.nodes)
        self._nnx.replace_by_pure_dict(state, tree)
        self._nnx.update(self.nodes, state)

    def _pure(self) -> Any:
        return self._nnx.to_pure_dict(self._nnx.state(self.nodes))


def _positions(leaves: list[Any], flat: list[Any]) -> list[int] | None:
    """Where each of ``leaves`` is in ``flat`` (the same objects), if each is there once."""
    where = {id(leaf): i for i, leaf in enumerate(flat)}
    positions = [where.get(id(leaf), -1) for leaf in leaves]
    return positions if -1 not in positions and len(set(positions)) == len(positions) else None


def _placed(tree: Any, layout: jax.sharding.Sharding, from_process_0: bool) -> Any:
    """``tree`` with every array on ``layout`` (one the script already placed across all of
    ``layout``'s devices kept as it is), the values of those moved being process 0's."""
    leaves, structure = jax.tree_util.tree_flatten(tree)
    moving = [i for i, leaf in enumerate(leaves) if _is_array(leaf) and not _spans(leaf, layout)]
    hosts = [_host(leaves[i]) for i in moving]
    if from_process_0 and hosts and jax.process_count() > 1:
        hosts = [np.asarray(h) for h in multihost_utils.broadcast_one_to_all(hosts)]
    for i, host in zip(moving, hosts):
        leaves[i] = _place(leaves[i], layout, host)
    return jax.tree_util.tree_unflatten(structure, leaves)


def _is_array(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray))


def _spans(leaf: Any, layout: jax.sharding.Sharding) -> bool:
    return isinstance(leaf, jax.Array) and leaf.sharding.device_set == layout.device_set


def _placed_like(leaf: Any, like: Any) -> bool:
    if not isinstance(like, jax.Array):
        return True
    return isinstance(leaf, jax.Array) and (
        leaf.sharding == like.sharding or leaf.sharding.is_equivalent_to(like.sharding, leaf.ndim)
    )


def _host(leaf: Any) -> np.ndarray:
    """A whole array on the host (a typed key as its key data: NumPy has no key dtype)."""
    return np.asarray(plain(leaf) if isinstance(leaf, jax.Array) else leaf)


def _place(like: Any, sharding: jax.sharding.Sharding, host: np.ndarray) -> jax.Array:
    """``host`` (the whole array) as a global array on ``sharding``: each process places the
    shards of its own devices (no ``device_put`` across processes), a typed key wrapped again."""
    key = isinstance(like, jax.Array) and is_key(like)
    shape = like.shape
    if key:
        data = jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(like))
    return jax.make_array_from_callback(shape, sharding, lambda index: host[index])
