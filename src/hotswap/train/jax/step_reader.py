"""Reading the arrays of one orbax step straight onto the registered state's shardings.

orbax's restore of a pytree is, per shard: a zero-filled host buffer (``np.zeros``), a
TensorStore read into it, a ``device_put``; all of it driven by a new asyncio event loop per
call, after reading the step's tree metadata. This reader keeps orbax's step format, its
TensorStore specs (:func:`orbax.checkpoint.type_handlers.get_json_tspec_read`) and its naming
of leaves, and drops what a restore of a known tree does not need: the buffers are not zeroed
(every byte is read), they are aligned so that on CPU devices ``device_put`` adopts them instead
of copying, and the reads are TensorStore futures issued together (no event loop, no thread
pool to start), each shard placed on its devices as soon as it has arrived. Host memory held
by reads not yet placed is bounded (:data:`IN_FLIGHT_BYTES`).

The step's stores are opened first (their zarr metadata: shape and dtype as saved), so the
caller's tree check runs before any array is read, on what the step really holds. A tree the
reader does not handle (a leaf that is neither a ``jax.Array`` nor a NumPy array, a typed PRNG
key, a value type orbax saved some other way, tree metadata it cannot parse) is left to orbax's
own restore: :func:`open_step` returns None.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from hotswap.train.jax.trees import leaves_with_paths

IN_FLIGHT_BYTES = 2 << 30  # read into host buffers and not yet placed on their devices
_ALIGN = 64  # PJRT's CPU client adopts a host buffer aligned to this instead of copying it
_ARRAY_TYPES = ("jax.Array", "np.ndarray")  # what orbax saved as a zarr array of the leaf's shape
_METADATA = "_METADATA"  # orbax's tree metadata of a pytree item (format_utils.PYTREE_METADATA_FILE)


@dataclasses.dataclass(frozen=True)
class OpenStep:
    """A step's arrays opened for reading: what each leaf is as saved, and how to read them."""

    found: dict[str, Any]  # leaf path -> ShapeDtypeStruct as saved; None: a leaf the template lacks
    template: Any
    stores: list[Any]  # per template leaf, its opened TensorStore

    def read(self) -> Any:
        """The template's tree with every array read as saved, placed like the template's."""
        leaves = [leaf for _, leaf in leaves_with_paths(self.template)]
        pieces: list[list[Any]] = [[] for _ in leaves]  # per leaf: its arrays on single devices, or its host array
        pending: collections.deque[tuple[int, Any, np.ndarray, list[Any]]] = collections.deque()
        held = 0

        def place() -> int:
            position, future, buffer, devices = pending.popleft()
            future.result()
            for device in devices:
                one = jax.sharding.SingleDeviceSharding(device, memory_kind=leaves[position].sharding.memory_kind)
                pieces[position].append(jax.device_put(buffer, one))
            if not devices:  # a NumPy leaf: stays on the host
                pieces[position].append(buffer)
            return buffer.nbytes

        for position, (leaf, store) in enumerate(zip(leaves, self.stores)):
            for index, devices in _shards(leaf):
                source = store[index].translate_to[(0,) * store.rank] if store.rank else store
                buffer = _aligned_empty(source.shape, np.dtype(store.dtype.numpy_dtype))
                while pending and held + buffer.nbytes > IN_FLIGHT_BYTES:
                    held -= place()
                held += buffer.nbytes
                pending.append((position, ts.array(buffer).write(source), buffer, devices))
        while pending:
            place()
        values = [
            pieces[position][0] if isinstance(leaf, np.ndarray)
            else jax.make_array_from_single_device_arrays(leaf.shape, leaf.sharding, pieces[position])
            for position, leaf in enumerate(leaves)
        ]
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(self.template), values)


def open_step(directory: Path, template: Any) -> OpenStep | None:
    """The arrays of the pytree item in ``directory`` opened for reading into ``template``
    (``jax.Array`` leaves: onto their shardings; NumPy leaves: on the host), or None when the
    tree is one for orbax's own restore. Raises when the step cannot be opened (damaged, or
    missing an array its metadata names)."""
    saved = _saved_leaves(directory)
    if saved is None:
        return None
    expected = leaves_with_paths(template)
    if not all(_readable(leaf) for _, leaf in expected):
        return None
    metadata, leaves = saved
    use_ocdbt, use_zarr3 = bool(metadata.get("use_ocdbt", True)), bool(metadata.get("use_zarr3", False))
    missing_data_fails = bool(metadata.get("store_array_data_equal_to_fill_value", True))  # as orbax reads it
    context = ocp.type_handlers.get_ts_context(use_ocdbt=use_ocdbt)  # one per restore: nothing kept between
    opening = {}
    for path, _ in expected:
        if path in leaves:  # opened together, in one context: one OCDBT driver and node cache for all
            info = ocp.type_handlers.ParamInfo(name=leaves[path], parent_dir=directory, use_zarr3=use_zarr3, ts_context=context)
            spec = ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=use_ocdbt, raise_array_data_missing_error=missing_data_fails)
            opening[path] = ts.open(spec, open=True, read=True, context=context)
    stores = {path: future.result() for path, future in opening.items()}
    found: dict[str, Any] = {path: None for path in leaves}
    for path, store in stores.items():
        found[path] = jax.ShapeDtypeStruct(tuple(store.shape), np.dtype(store.dtype.numpy_dtype))
    return OpenStep(found, template, [stores.get(path) for path, _ in expected])


def _saved_leaves(directory: Path) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The step's tree metadata and its array leaves (path -> orbax's name of the leaf), or
    None when the tree holds a value this reader leaves to orbax (or the metadata is not in
    the format it knows: orbax's own restore then reads it, or says why it cannot)."""
    try:
        metadata = json.loads((directory / _METADATA).read_text())
        leaves = {}
        for entry in metadata["tree_metadata"].values():
            keys = [str(key["key"]) for key in entry["key_metadata"]]
            value = entry["value_metadata"]
            if value.get("skip_deserialize") and value["value_type"] not in _ARRAY_TYPES:
                continue  # an empty node (an empty dict, None): no leaf
            if value["value_type"] not in _ARRAY_TYPES:
                return None
            leaves["/".join(keys)] = ".".join(keys)  # orbax's param name (tree_utils.param_name_from_keypath)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return metadata, leaves


def _readable(leaf: Any) -> bool:
    if isinstance(leaf, np.ndarray):
        return True
    return isinstance(leaf, jax.Array) and not jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _shards(leaf: Any) -> list[tuple[tuple[slice, ...], list[Any]]]:
    """Each distinct index of the leaf this process holds, with the devices that hold it (read
    once, placed on each); a NumPy leaf is read whole, onto no device."""
    if isinstance(leaf, np.ndarray):
        return [(tuple(slice(None) for _ in leaf.shape), [])]
    by_index: dict[Any, tuple[tuple[slice, ...], list[Any]]] = {}
    for device, index in leaf.sharding.addressable_devices_indices_map(leaf.shape).items():
        key = tuple((s.start, s.stop) for s in index)
        by_index.setdefault(key, (index, []))[1].append(device)
    return list(by_index.values())


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised host buffer (every byte of it is read) starting on a ``_ALIGN`` boundary."""
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(size + _ALIGN, np.uint8)
    start = (-raw.ctypes.data) % _ALIGN
    return raw[start:start + size].view(dtype).reshape(shape)
