"""The job's state as a pytree of ``jax.Array``: its leaves by path, the shards each process
holds on its host, rebuilding arrays from them on a new mesh, checking a saved tree against
the registered one, and sending one slice's shards to the others.

Only the shards a process can address are ever touched: in a multi-host slice every host holds
its part of the replica, and a host of a joining slice receives the same part from the host at
the same position of a surviving slice.
"""

from __future__ import annotations

import dataclasses
import pickle
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
            shards.append({index_of(s.index, leaf.shape): np.array(s.data, copy=True) for s in leaf.addressable_shards})
        else:
            shards.append({(): leaf})
    return shards


def any_deleted(tree: Any) -> bool:
    """Whether a leaf's buffers are gone (donated to a step that then failed)."""
    return any(isinstance(leaf, jax.Array) and leaf.is_deleted() for _, leaf in leaves_with_paths(tree))


def rebuild(template: Any, shards: Sequence[Mapping[Index, Any]]) -> Any | None:
    """The template's tree with its arrays' values taken from ``shards`` (placed with the
    template's shardings); None when a shard this process needs is not among them (the state
    was sharded across slices, so part of it was lost with a slice)."""
    paths = leaves_with_paths(template)
    if len(paths) != len(shards):
        return None
    values = []
    for (_, leaf), held in zip(paths, shards):
        if not isinstance(leaf, jax.Array):
            values.append(held.get((), leaf))
            continue
        pieces = []
        for device, index in leaf.sharding.addressable_devices_indices_map(leaf.shape).items():
            data = held.get(index_of(index, leaf.shape))
            if data is None or np.dtype(data.dtype) != np.dtype(leaf.dtype):
                return None
            pieces.append(jax.device_put(data, device))
        values.append(jax.make_array_from_single_device_arrays(leaf.shape, leaf.sharding, pieces))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), values)


# Between processes ---------------------------------------------------------------------------


def broadcast_shards(template: Any, tree: Any | None, is_source: bool) -> list[Any]:
    """The source's local shards of ``tree``, sent to every process as host arrays in the
    order of :func:`ordered_local_indices` (receivers pass ``tree=None``). Bytes travel as
    unsigned integers so that every value, -0.0 and NaN payloads included, arrives exactly."""
    layout = [(np.dtype(shape_dtype.dtype), shape) for shape_dtype, shape in _local_layout(template)]
    if is_source:
        assert tree is not None
        payload = [_as_bytes(np.asarray(s)) for s in ordered_local_data(tree)]
    else:
        payload = [np.zeros(int(np.prod(shape)) * dtype.itemsize, np.uint8) for dtype, shape in layout]
    received = multihost_utils.broadcast_one_to_all(payload, is_source=is_source)
    return [np.asarray(raw).view(dtype).reshape(shape) for raw, (dtype, shape) in zip(received, layout)]


def ordered_local_data(tree: Any) -> list[Any]:
    """This process's shards of every array leaf, leaf by leaf, in device order."""
    data = []
    for _, leaf in leaves_with_paths(tree):
        if isinstance(leaf, jax.Array):
            by_device = {s.device: s.data for s in leaf.addressable_shards}
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
        pieces = [jax.device_put(data[position + i], device) for i, device in enumerate(devices)]
        position += len(devices)
        values.append(jax.make_array_from_single_device_arrays(leaf.shape, leaf.sharding, pieces))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), values)


def _ordered_devices(leaf: jax.Array) -> list[Any]:
    return sorted(leaf.sharding.addressable_devices, key=lambda d: d.id)


def _local_layout(template: Any) -> list[tuple[Any, tuple[int, ...]]]:
    layout = []
    for _, leaf in leaves_with_paths(template):
        if isinstance(leaf, jax.Array):
            indices = leaf.sharding.addressable_devices_indices_map(leaf.shape)
            for device in _ordered_devices(leaf):
                shape = tuple(stop - start for start, stop in index_of(indices[device], leaf.shape))
                layout.append((leaf, shape))
    return layout


def _as_bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def broadcast_object(obj: Any, is_source: bool) -> Any:
    """A small picklable object from the source process to every process."""
    data = np.frombuffer(pickle.dumps(obj), np.uint8) if is_source else np.zeros(0, np.uint8)
    size = multihost_utils.broadcast_one_to_all(np.asarray([data.size], np.int32), is_source=is_source)
    buffer = data if is_source else np.zeros(int(size[0]), np.uint8)
    received = multihost_utils.broadcast_one_to_all(buffer, is_source=is_source)
    return pickle.loads(np.asarray(received, np.uint8).tobytes())


@dataclasses.dataclass(frozen=True)
class HostSnapshot:
    """The state at one step, on the host (pathwaysutils' snapshot): what a survivor hands to
    its next program when the live arrays are gone."""

    counters: dict[str, int]
    shards: list[dict[Index, Any]]
    leaves: list[str]
    objects: dict[str, Any]
