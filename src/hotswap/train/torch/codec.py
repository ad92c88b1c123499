"""State trees as plain data: a JSON document plus the arrays (tensors, numpy arrays) it refers to.

A checkpoint is read by a process that must not trust it (whoever could write the directory
could otherwise run code as the training user), so nothing here constructs an object that a
checkpoint names: decoding builds only the types of the table below, and each array is
allocated from a dtype and shape checked against fixed tables, then filled with raw bytes.

What a tree may hold, and its JSON form (a JSON object always has a ``"t"`` tag, so user data
can never be mistaken for one)::

    None, bool, int, str        themselves
    float                       itself; {"t": "float", "v": "nan" | "inf" | "-inf"} if not finite
    list                        a JSON array
    tuple, set, frozenset       {"t": "tuple" | "set" | "frozenset", "v": [...]}
    dict, OrderedDict           {"t": "dict", "v": [[key, value], ...]}, plus "ordered": true and
                                the "meta" of a module state_dict (its ``_metadata``) if any
    bytes, complex              {"t": "bytes", "v": base64} / {"t": "complex", "v": [re, im]}
    torch.Tensor / Parameter    {"t": "tensor", "i": n}: the n-th array (shared tensors once)
    numpy.ndarray / scalar      {"t": "ndarray" | "npscalar", "i": n} (numeric dtypes only)
    torch.dtype, torch.device, torch.Size    {"t": "dtype" | "device" | "size", "v": ...}

Anything else (a function, a custom class, an object-dtype array) is refused when the state is
saved, with the path of the value in the tree: it would not come back as plain data.
"""

from __future__ import annotations

import base64
import dataclasses
import math
import re
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy
import torch

MAX_DIMENSIONS = 64
MAX_DIMENSION_SIZE = 1 << 48  # no real array comes close; keeps products far from overflow
_NUMPY_DTYPE = re.compile(r"^[<>|=][biufc][0-9]{1,2}$")
_DEVICE = re.compile(r"^[a-z]{1,16}(:[0-9]{1,4})?$")
_CONTAINER_TAGS = {"tuple": tuple, "set": set, "frozenset": frozenset}


class CheckpointFormatError(ValueError):
    """A checkpoint's document is not one this module wrote."""


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """What an array is, without its bytes: enough to allocate it before reading them."""

    kind: str  # "tensor" or "ndarray"
    dtype: str  # torch dtype name ("float32") or numpy dtype string ("<f8")
    shape: tuple[int, ...]
    device: str  # "cpu" or "cuda": where it lived when saved

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def itemsize(self) -> int:
        if self.kind == "tensor":
            return torch_dtypes()[self.dtype].itemsize
        return numpy.dtype(self.dtype).itemsize

    def document(self) -> dict[str, Any]:
        return {"kind": self.kind, "dtype": self.dtype, "shape": list(self.shape), "device": self.device}

    @classmethod
    def from_document(cls, document: Any) -> ArraySpec:
        if not isinstance(document, dict) or set(document) != {"kind", "dtype", "shape", "device"}:
            raise CheckpointFormatError(f"malformed array entry {_brief(document)}")
        kind, dtype, shape, device = (document[k] for k in ("kind", "dtype", "shape", "device"))
        if kind == "tensor":
            if dtype not in torch_dtypes():
                raise CheckpointFormatError(f"unknown tensor dtype {_brief(dtype)}")
        elif kind == "ndarray":
            if not (isinstance(dtype, str) and _NUMPY_DTYPE.match(dtype) and _plain_numpy_dtype(dtype)):
                raise CheckpointFormatError(f"unsupported numpy dtype {_brief(dtype)}")
        else:
            raise CheckpointFormatError(f"unknown array kind {_brief(kind)}")
        if device not in ("cpu", "cuda"):
            raise CheckpointFormatError(f"unknown array device {_brief(device)}")
        if not (
            isinstance(shape, list)
            and len(shape) <= MAX_DIMENSIONS
            and all(type(n) is int and 0 <= n < MAX_DIMENSION_SIZE for n in shape)
        ):
            raise CheckpointFormatError(f"malformed array shape {_brief(shape)}")
        return cls(kind, dtype, tuple(shape), device)


@dataclasses.dataclass
class Encoded:
    """A tree as plain data: ``document`` (JSON-ready) and the arrays it refers to by index."""

    document: Any
    arrays: list[torch.Tensor | numpy.ndarray]
    # Where each array lived when the tree was taken, when the arrays are copies elsewhere (an
    # asynchronous save's host buffers of GPU tensors); None: where the arrays are.
    devices: list[str] | None = None

    def specs(self) -> list[ArraySpec]:
        specs = [spec_of(array) for array in self.arrays]
        if self.devices is None:
            return specs
        return [dataclasses.replace(spec, device=device) for spec, device in zip(specs, self.devices, strict=True)]


_torch_dtypes: dict[str, torch.dtype] | None = None


def torch_dtypes() -> dict[str, torch.dtype]:
    """Every tensor dtype whose values are plain bytes, by name (``"float32"``)."""
    global _torch_dtypes
    if _torch_dtypes is None:
        found = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # probing experimental dtypes warns
            for value in vars(torch).values():
                if not isinstance(value, torch.dtype):
                    continue
                try:
                    probe = torch.empty(1, dtype=value)
                    probe.view(torch.uint8)
                except (RuntimeError, TypeError):
                    continue  # no plain byte view
                if not probe.is_quantized:
                    found[str(value).removeprefix("torch.")] = value
        _torch_dtypes = found
    return _torch_dtypes


def spec_of(array: torch.Tensor | numpy.ndarray) -> ArraySpec:
    if isinstance(array, numpy.ndarray):
        return ArraySpec("ndarray", array.dtype.str, tuple(array.shape), "cpu")
    return ArraySpec("tensor", str(array.dtype).removeprefix("torch."), tuple(array.shape), device_kind(array))


def device_kind(array: torch.Tensor | numpy.ndarray) -> str:
    """Where an array lives, as a checkpoint records it: "cuda" or "cpu"."""
    return "cuda" if isinstance(array, torch.Tensor) and array.is_cuda else "cpu"


# Encoding ----------------------------------------------------------------------------------


def encode(tree: Any, root: str = "the state") -> Encoded:
    """``tree`` as plain data; TypeError naming the path (from ``root``) of the first value
    that is not."""
    arrays: list[torch.Tensor | numpy.ndarray] = []
    index_of: dict[int, int] = {}
    on_path: set[int] = set()

    def array_ref(tag: str, array: torch.Tensor | numpy.ndarray) -> dict[str, Any]:
        key = id(array)
        if key not in index_of:
            index_of[key] = len(arrays)
            arrays.append(array)
        return {"t": tag, "i": index_of[key]}

    def node(value: Any, path: str) -> Any:
        kind = type(value)
        if value is None or kind in (bool, int, str):
            return value
        if kind is float:
            return value if math.isfinite(value) else {"t": "float", "v": repr(value)}
        if kind in (torch.Tensor, torch.nn.Parameter):
            _check_tensor(value, path)
            return array_ref("tensor", value)
        if kind is numpy.ndarray:
            _check_ndarray(value, path)
            return array_ref("ndarray", value)
        if isinstance(value, numpy.generic):
            array = numpy.asarray(value)
            _check_ndarray(array, path)
            return array_ref("npscalar", array)
        if kind is bytes:
            return {"t": "bytes", "v": base64.b64encode(value).decode("ascii")}
        if kind is complex:
            return {"t": "complex", "v": [node(value.real, path), node(value.imag, path)]}
        if kind is torch.dtype:
            return {"t": "dtype", "v": str(value).removeprefix("torch.")}
        if kind is torch.device:
            return {"t": "device", "v": str(value)}
        if kind is torch.Size:
            return {"t": "size", "v": list(value)}
        if kind in (list, tuple, set, frozenset, dict, OrderedDict):
            if id(value) in on_path:
                raise TypeError(f"cannot checkpoint {path}: it contains itself")
            on_path.add(id(value))
            try:
                return container(value, path)
            finally:
                on_path.discard(id(value))
        raise TypeError(
            f"cannot checkpoint {path}: a {kind.__module__}.{kind.__qualname__} is not plain data "
            "(a checkpoint holds numbers, strings, bytes, lists, tuples, sets, dicts, tensors and numpy arrays)"
        )

    def container(value: Any, path: str) -> Any:
        if isinstance(value, list):
            return [node(item, f"{path}[{i}]") for i, item in enumerate(value)]
        if isinstance(value, dict):
            encoded: dict[str, Any] = {
                "t": "dict",
                "v": [[node(k, f"{path} (a key)"), node(v, f"{path}[{k!r}]")] for k, v in value.items()],
            }
            if type(value) is OrderedDict:
                encoded["ordered"] = True
                metadata = getattr(value, "_metadata", None)  # module state_dict versions
                if metadata is not None:
                    encoded["meta"] = node(metadata, f"{path}._metadata")
            return encoded
        tag = next(name for name, cls in _CONTAINER_TAGS.items() if type(value) is cls)
        items = sorted(value, key=repr) if tag != "tuple" else value  # sets: a stable document
        return {"t": tag, "v": [node(item, f"{path}[{i}]") for i, item in enumerate(items)]}

    try:
        return Encoded(node(tree, root), arrays)
    except RecursionError:
        raise TypeError(f"cannot checkpoint {root}: it is nested too deeply") from None


def _check_tensor(tensor: torch.Tensor, path: str) -> None:
    if tensor.layout != torch.strided:
        raise TypeError(f"cannot checkpoint {path}: a {tensor.layout} tensor (convert it with .to_dense())")
    if tensor.is_quantized or str(tensor.dtype).removeprefix("torch.") not in torch_dtypes():
        raise TypeError(f"cannot checkpoint {path}: tensors of dtype {tensor.dtype} have no plain byte form")
    if tensor.is_meta:
        raise TypeError(f"cannot checkpoint {path}: a meta tensor has no values")


def _check_ndarray(array: numpy.ndarray, path: str) -> None:
    if not _NUMPY_DTYPE.match(array.dtype.str) or len(array.shape) > MAX_DIMENSIONS:
        raise TypeError(f"cannot checkpoint {path}: numpy values of dtype {array.dtype} are not plain numbers")


def _plain_numpy_dtype(text: str) -> bool:
    try:
        dtype = numpy.dtype(text)
    except TypeError:
        return False
    return dtype.kind in "biufc" and not dtype.hasobject and dtype.itemsize > 0


# Decoding ----------------------------------------------------------------------------------


def decode(document: Any, arrays: list[torch.Tensor | numpy.ndarray]) -> Any:
    """The tree that :func:`encode` gave ``document`` for, with ``arrays`` in place of its
    arrays; CheckpointFormatError for anything :func:`encode` does not write."""
    depth_limit = 100  # state trees are shallow; far below Python's recursion limit

    def node(value: Any, depth: int) -> Any:
        if value is None or type(value) in (bool, int, str, float):
            return value
        if depth > depth_limit:
            raise CheckpointFormatError("the document is nested too deeply")
        if type(value) is list:
            return [node(item, depth + 1) for item in value]
        if type(value) is not dict or not isinstance(value.get("t"), str):
            raise CheckpointFormatError(f"unexpected value {_brief(value)}")
        decoder = _DECODERS.get(value["t"])
        if decoder is None:
            raise CheckpointFormatError(f"unknown tag {_brief(value['t'])}")
        try:
            return decoder(value, lambda inner: node(inner, depth + 1), arrays)
        except (KeyError, TypeError, ValueError, IndexError) as error:
            if isinstance(error, CheckpointFormatError):
                raise
            raise CheckpointFormatError(f"malformed {value['t']} entry {_brief(value)}") from None

    return node(document, 0)


def _array(value: dict[str, Any], arrays: list[Any], kind: type) -> Any:
    index = value["i"]
    if type(index) is not int or not 0 <= index < len(arrays) or not isinstance(arrays[index], kind):
        raise CheckpointFormatError(f"bad array reference {_brief(value)}")
    return arrays[index]


def _decode_dict(value: dict[str, Any], inner: Callable[[Any], Any], arrays: list[Any]) -> Any:
    pairs = value["v"]
    if type(pairs) is not list or any(type(pair) is not list or len(pair) != 2 for pair in pairs):
        raise CheckpointFormatError(f"malformed dict entry {_brief(value)}")
    result: dict[Any, Any] = OrderedDict() if value.get("ordered") is True else {}
    for key, item in pairs:
        result[inner(key)] = inner(item)  # TypeError for an unhashable key: malformed
    if "meta" in value:
        if not isinstance(result, OrderedDict):
            raise CheckpointFormatError(f"metadata on an unordered dict {_brief(value)}")
        result._metadata = inner(value["meta"])  # type: ignore[attr-defined]
    return result


def _decode_float(value: dict[str, Any], inner: Callable[[Any], Any], arrays: list[Any]) -> float:
    if value["v"] not in ("nan", "inf", "-inf"):
        raise CheckpointFormatError(f"malformed float {_brief(value)}")
    return float(value["v"])


def _decode_container(value: dict[str, Any], inner: Callable[[Any], Any], arrays: list[Any]) -> Any:
    items = value["v"]
    if type(items) is not list:
        raise CheckpointFormatError(f"malformed {value['t']} entry {_brief(value)}")
    return _CONTAINER_TAGS[value["t"]](inner(item) for item in items)


def _decode_dtype(value: dict[str, Any], inner: Callable[[Any], Any], arrays: list[Any]) -> torch.dtype:
    dtype = torch_dtypes().get(value["v"])
    if dtype is None:
        raise CheckpointFormatError(f"unknown dtype {_brief(value)}")
    return dtype


def _decode_device(value: dict[str, Any], inner: Callable[[Any], Any], arrays: list[Any]) -> torch.device:
    if type(value["v"]) is not str or not _DEVICE.match(value["v"]):
        raise CheckpointFormatError(f"malformed device {_brief(value)}")
    return torch.device(value["v"])


def _decode_size(value: dict[str, Any], inner: Callable[[Any], Any], arrays: list[Any]) -> torch.Size:
    if type(value["v"]) is not list or not all(type(n) is int for n in value["v"]):
        raise CheckpointFormatError(f"malformed size {_brief(value)}")
    return torch.Size(value["v"])


def _decode_complex(value: dict[str, Any], inner: Callable[[Any], Any], arrays: list[Any]) -> complex:
    real, imag = (inner(part) for part in value["v"])
    if type(real) is not float or type(imag) is not float:
        raise CheckpointFormatError(f"malformed complex {_brief(value)}")
    return complex(real, imag)


def _decode_npscalar(value: dict[str, Any], inner: Callable[[Any], Any], arrays: list[Any]) -> Any:
    array = _array(value, arrays, numpy.ndarray)
    if array.shape != ():
        raise CheckpointFormatError(f"a numpy scalar refers to an array of shape {array.shape}")
    return array[()]


_DECODERS: dict[str, Callable[[dict[str, Any], Callable[[Any], Any], list[Any]], Any]] = {
    "dict": _decode_dict,
    "float": _decode_float,
    "tuple": _decode_container,
    "set": _decode_container,
    "frozenset": _decode_container,
    "bytes": lambda value, inner, arrays: base64.b64decode(value["v"], validate=True),
    "complex": _decode_complex,
    "tensor": lambda value, inner, arrays: _array(value, arrays, torch.Tensor),
    "ndarray": lambda value, inner, arrays: _array(value, arrays, numpy.ndarray),
    "npscalar": _decode_npscalar,
    "dtype": _decode_dtype,
    "device": _decode_device,
    "size": _decode_size,
}


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
