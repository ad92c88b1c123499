"""The job's state as a pytree of ``jax.Array``: its leaves by path, the shards each process
holds on its host, rebuilding arrays from them on a new mesh, checking a saved tree against
the registered one, and sending one slice's shards to the others.

Only the shards a process can address are ever touched: in a multi-host slice every host holds
its part of the replica, and a host of a joining slice receives the same part from the host at
the same position of a surviving slice.

A typed PRNG key (``jax.random.key``, dtype ``key<fry>``) travels as its key data (the uint32
words of each key, ``jax.random.key_data``): its shards are indexed like any array's (over the
key array's own shape, the words being a last dimension every shard holds whole) and wrapped
again with the registered key's implementation on arrival, so a state's random stream goes on
bit for bit. :func:`leaf_names` records the implementation with the leaf's path: a handoff is
taken only into a state with the same kind of key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

Index = tuple[tuple[int, int], ...]  # a shard's position: (start, stop) per dimension


class StateMismatchError(ValueError):
    """A saved state does not fit the registered one (tree structure, shape or dtype)."""


def leaf_path(path: Sequence[Any]) -> str:
    """A leaf's path as ``params/dense/kernel``, the same for a dict, a list or a dataclass
    field (orbax keeps tuples as lists and dataclasses as dicts)."""
    parts = []
    for key in path:
        for attribute in ("key", "idx", "name"):
            if hasattr(key, attribute):
                parts.append(str(getattr(key, attribute)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def leaves_with_paths(tree: Any) -> list[tuple[str, Any]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(leaf_path(path), leaf) for path, leaf in flat]


def leaf_names(tree: Any) -> list[str]:
    """The leaves' paths, a typed key's with its dtype (``rng:key<fry>``): what a handoff's
    tree is checked against."""
    return [f"{path}:{leaf.dtype}" if is_key(leaf) else path for path, leaf in leaves_with_paths(tree)]


def is_key(leaf: Any) -> bool:
    """Whether ``leaf`` is an array of typed PRNG keys."""
    return isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _host_layout(leaf: jax.Array) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """The NumPy dtype a leaf's shards have on the host and the dimensions each shard's host
    copy has past the leaf's own (a typed key's words; none for a plain array)."""
    if is_key(leaf):
        data = jax.eval_shape(jax.random.key_data, leaf)
        return np.dtype(data.dtype), tuple(data.shape[leaf.ndim:])
    return np.dtype(leaf.dtype), ()


def plain(leaf: jax.Array) -> jax.Array:
    """An array leaf as a plain array: a typed key's key data (its buffers: no computation),
    which has what a key array lacks (``is_ready``, a NumPy dtype)."""
    return jax.random.key_data(leaf) if is_key(leaf) else leaf


def _on_device(leaf: jax.Array, data: Any, device: Any) -> jax.Array:
    """A shard of ``leaf`` on ``device`` from its host data (a typed key wrapped again with
    ``leaf``'s implementation)."""
    placed = jax.device_put(data, device)
    return jax.random.wrap_key_data(placed, impl=jax.random.key_impl(leaf)) if is_key(leaf) else placed


def describe(leaf: Any) -> str:
    dtype, shape = getattr(leaf, "dtype", None), getattr(leaf, "shape", None)
    if dtype is None or shape is None:
        return type(leaf).__name__
    return f"{_dtype_name(dtype)}[{','.join(str(n) for n in shape)}]"


def _dtype_name(dtype: Any) -> str:
    """``float32``, ``bfloat16``; a JAX extended dtype (a typed PRNG key) as JAX names it."""
    try:
        return np.dtype(dtype).name
    except TypeError:  # key<fry>: not a NumPy dtype
        return str(dtype)


def _same_dtype(a: Any, b: Any) -> bool:
    try:
        return bool(np.dtype(a) == np.dtype(b))
    except TypeError:
        return str(a) == str(b)


def first_mismatch(expected: Sequence[tuple[str, Any]], found: Mapping[str, Any], where: str) -> str | None:
    """The first leaf (in the registered tree's order) whose structure, shape or dtype differs
    from what ``where`` holds, in one sentence; None when they fit."""
    for path, leaf in expected:
        if path not in found:
            return f"{where} has no leaf {path!r} (the registered state has {describe(leaf)} there)"
        other = found[path]
        array = hasattr(leaf, "dtype") and hasattr(leaf, "shape")
        if array and hasattr(other, "dtype") and hasattr(other, "shape"):
            if not _same_dtype(other.dtype, leaf.dtype) or tuple(other.shape) != tuple(leaf.shape):
                return f"leaf {path!r} is {describe(other)} in {where} but {describe(leaf)} in the registered state"
    extra = [path for path in found if path not in dict(expected)]
    if extra:
        return f"{where} has leaf {extra[0]!r}, which the registered state lacks"
    return None


def index_of(index: tuple[slice, ...], shape: Sequence[int]) -> Index:
    return tuple((s.start or 0, shape[d] if s.stop is None else s.stop) for d, s in enumerate(index))


# On the host ---------------------------------------------------------------------------------


def local_shards(tree: Any) -> list[dict[Index, Any]]:
    """Per leaf, a host copy of every shard this process addresses (other leaves as they are)."""
    shards: list[dict[Index, Any]] = []
    for _, leaf in leaves_with_paths(tree):
        if isinstance(leaf, jax.Array):
            indices = leaf.sharding.addressable_devices_indices_map(leaf.shape)
            shards.append({
                index_of(indices[s.device], leaf.shape): np.array(plain(s.data), copy=True)
                for s in leaf.addressable_shards
            })
        else:
            shards.append({(): leaf})
    return shards


def any_deleted(tree: Any) -> bool:
    """Whether a leaf's buffers are gone (donated to a step that then failed)."""
    return any(isinstance(leaf, jax.Array) and leaf.is_deleted() for _, leaf in leaves_with_paths(tree))


def rebuild(template: Any, shards: Sequence[Mapping[Index, Any]]) -> Any | None:
    """The template's tree with its arrays' values taken from ``shards`` (placed with the
    template's shardings; a shard this process needs is put together from the pieces that
    overlap it when they were cut otherwise); None when part of a shard this process needs is
    not among them (the state was sharded across slices, so part of it was lost with a slice)."""
    paths = leaves_with_paths(template)
    if len(paths) != len(shards):
        return None
    values = []
    for (_, leaf), held in zip(paths, shards):
        if not isinstance(leaf, jax.Array):
            values.append(held.get((), leaf))
            continue
        pieces, (dtype, words) = [], _host_layout(leaf)
        for device, index in leaf.sharding.addressable_devices_indices_map(leaf.shape).items():
            bounds = index_of(index, leaf.shape)
            shape = tuple(stop - start for start, stop in bounds) + words
            data = held.get(bounds)
            if data is None:
                data = _assemble(held, bounds, shape, dtype)
            if data is None or np.dtype(data.dtype) != dtype or tuple(data.shape) != shape:
                return None
            pieces.append(_on_device(leaf, data, device))
        values.append(jax.make_array_from_single_device_arrays(leaf.shape, leaf.sharding, pieces))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), values)


def _assemble(held: Mapping[Index, Any], bounds: Index, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any | None:
    """The region ``bounds`` copied out of the pieces that overlap it; None unless they cover it
    (the pieces are one sharding's shards, which never overlap one another)."""
    region, covered = np.empty(shape, dtype), 0
    for piece_bounds, piece in held.items():
        if len(piece_bounds) != len(bounds) or np.dtype(piece.dtype) != dtype:
            continue
        overlap = [(max(a, c), min(b, d)) for (a, b), (c, d) in zip(bounds, piece_bounds)]
        if any(start >= stop for start, stop in overlap):
            continue
        region[tuple(slice(start - a, stop - a) for (start, stop), (a, _) in zip(overlap, bounds))] = piece[
            tuple(slice(start - c, stop - c) for (start, stop), (c, _) in zip(overlap, piece_bounds))
        ]
        covered += int(np.prod([stop - start for start, stop in overlap]))
    return region if covered == int(np.prod([stop - start for start, stop in bounds])) else None


# Between processes ---------------------------------------------------------------------------


def broadcast_shards(
    template: Any, tree: Any | None, is_source: bool, attachment: bytes = b"", attachment_size: int = 0
) -> tuple[list[Any], bytes]:
    """The source's local shards of ``tree``, sent to every process as host arrays in the
    order of :func:`ordered_local_indices` (receivers pass ``tree=None``), and the source's
    ``attachment`` of ``attachment_size`` bytes (a size every process knows) with them, in the
    same collective. Bytes travel as unsigned integers so that every value, -0.0 and NaN
    payloads included, arrives exactly."""
    layout = _local_layout(template)
    if is_source:
        assert tree is not None and len(attachment) == attachment_size
        payload = [_as_bytes(np.asarray(s)) for s in ordered_local_data(tree)]
    else:
        payload = [np.zeros(int(np.prod(shape)) * dtype.itemsize, np.uint8) for dtype, shape in layout]
    if attachment_size:
        payload.append(np.frombuffer(attachment, np.uint8) if is_source else np.zeros(attachment_size, np.uint8))
    received = multihost_utils.broadcast_one_to_all(payload, is_source=is_source)
    shards = [np.asarray(raw).view(dtype).reshape(shape) for raw, (dtype, shape) in zip(received, layout)]
    return shards, np.asarray(received[-1], np.uint8).tobytes() if attachment_size else b""


def agree_with_first_holders(tree: Any) -> Any:
    """``tree`` with every shard's value taken from the first process that holds that shard
    (by process index): what makes a replicated state identical on every process when each
    initialised it on its own (its own seed), as DDP makes every rank take rank 0's parameters.
    One broadcast per process that holds a shard another process needs (process 0 alone when
    the state is replicated across single-host slices; none when nothing is replicated)."""
    me = jax.process_index()
    leaves = leaves_with_paths(tree)
    plan: dict[int, list[tuple[int, Index, np.dtype[Any], tuple[int, ...]]]] = {}  # owner -> what it sends
    owners: list[dict[Index, int]] = []
    for position, (_, leaf) in enumerate(leaves):
        owner_of: dict[Index, int] = {}
        holders: dict[Index, set[int]] = {}
        if isinstance(leaf, jax.Array):
            dtype, words = _host_layout(leaf)
            for device, index in sorted(leaf.sharding.devices_indices_map(leaf.shape).items(), key=lambda item: (item[0].process_index, item[0].id)):
                bounds = index_of(index, leaf.shape)
                owner_of.setdefault(bounds, device.process_index)
                holders.setdefault(bounds, set()).add(device.process_index)
            for bounds, owner in sorted(owner_of.items()):
                if holders[bounds] - {owner}:
                    shape = tuple(stop - start for start, stop in bounds) + words
                    plan.setdefault(owner, []).append((position, bounds, dtype, shape))
        owners.append(owner_of)
    received: dict[tuple[int, Index], Any] = {}
    for owner, items in sorted(plan.items()):
        if me == owner:
            payload = [_as_bytes(np.asarray(_local_shard(leaves[p][1], b))) for p, b, _, _ in items]
        else:
            payload = [np.zeros(int(np.prod(shape)) * dtype.itemsize, np.uint8) for _, _, dtype, shape in items]
        for (position, bounds, dtype, shape), raw in zip(items, multihost_utils.broadcast_one_to_all(payload, is_source=me == owner)):
            received[(position, bounds)] = np.asarray(raw).view(dtype).reshape(shape)
    if not received:
        return tree
    values, changed = [], {position for position, _ in received}
    for position, (_, leaf) in enumerate(leaves):
        if not isinstance(leaf, jax.Array) or position not in changed:
            values.append(leaf)
            continue
        indices = leaf.sharding.addressable_devices_indices_map(leaf.shape)
        pieces = []
        for shard in leaf.addressable_shards:
            bounds = index_of(indices[shard.device], leaf.shape)
            mine = owners[position][bounds] == me
            pieces.append(shard.data if mine else _on_device(leaf, received[(position, bounds)], shard.device))
        values.append(jax.make_array_from_single_device_arrays(leaf.shape, leaf.sharding, pieces))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(tree), values)


def broadcast_bytes(data: bytes, size: int, is_source: bool) -> bytes:
    """The source's ``data`` of ``size`` bytes (a size every process knows) on every process."""
    if not size:
        return b""
    payload = np.frombuffer(data, np.uint8) if is_source else np.zeros(size, np.uint8)
    return np.asarray(multihost_utils.broadcast_one_to_all(payload, is_source=is_source), np.uint8).tobytes()


def _local_shard(leaf: jax.Array, bounds: Index) -> Any:
    """This process's shard of ``leaf`` at ``bounds`` (its host data)."""
    indices = leaf.sharding.addressable_devices_indices_map(leaf.shape)
    for shard in leaf.addressable_shards:
        if index_of(indices[shard.device], leaf.shape) == bounds:
            return plain(shard.data)
    raise ValueError(f"no shard at {bounds} on this process")


def ordered_local_data(tree: Any) -> list[Any]:
    """This process's shards of every array leaf, leaf by leaf, in device order."""
    data = []
    for _, leaf in leaves_with_paths(tree):
        if isinstance(leaf, jax.Array):
            by_device = {s.device: plain(s.data) for s in leaf.addressable_shards}
            data += [by_device[device] for device in _ordered_devices(leaf)]
    return data


def place_local_data(template: Any, data: Sequence[Any]) -> Any:
    """The template's tree with its arrays made of ``data`` (as from :func:`broadcast_shards`)."""
    values, position = [], 0
    for _, leaf in leaves_with_paths(template):
        if not isinstance(leaf, jax.Array):
            values.append(leaf)
            continue
        devices = _ordered_devices(leaf)
        pieces = [_on_device(leaf, data[position + i], device) for i, device in enumerate(devices)]
        position += len(devices)
        values.append(jax.make_array_from_single_device_arrays(leaf.shape, leaf.sharding, pieces))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), values)


def _ordered_devices(leaf: jax.Array) -> list[Any]:
    return sorted(leaf.sharding.addressable_devices, key=lambda d: d.id)


def _local_layout(template: Any) -> list[tuple[np.dtype[Any], tuple[int, ...]]]:
    """The host dtype and shape of each shard :func:`ordered_local_data` gives."""
    layout = []
    for _, leaf in leaves_with_paths(template):
        if isinstance(leaf, jax.Array):
            indices = leaf.sharding.addressable_devices_indices_map(leaf.shape)
            dtype, words = _host_layout(leaf)
            for device in _ordered_devices(leaf):
                shape = tuple(stop - start for start, stop in index_of(indices[device], leaf.shape))
                layout.append((dtype, shape + words))
    return layout


def _as_bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


@dataclasses.dataclass(frozen=True)
class HostSnapshot:
    """The state at one step, on the host (pathwaysutils' snapshot): what a survivor hands to
    its next program when the live arrays are gone."""

    counters: dict[str, int]
    shards: list[dict[Index, Any]]
    leaves: list[str]
    objects: dict[str, Any]
