"""A consistent copy of a state tree in host memory, taken at a step boundary; and the
in-memory split of a tree into structure and tensors that peers send each other.

The snapshot is the tree as plain data (:func:`hotswap.train.torch.codec.encode`: a deep copy of
everything but the arrays) and each tensor copied into a host buffer kept from the previous
snapshot when shape and dtype still match, so a steady-state snapshot costs one memory copy, not
an allocation (first-touch page faults of a fresh buffer cost far more than the copy). GPU
tensors go to pinned buffers.

Tensors that only ``optimizer.step()`` changes (parameters, optimizer state) may be copied
later, in the background, as long as the next optimizer step waits for that copy: the
training loop then blocks only for the rest (buffers, RNG states, small values).
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from collections.abc import Callable
from typing import Any

import numpy
import torch

from hotswap.train.torch.codec import Encoded, decode, device_kind, encode


def split_tensors(tree: Any) -> tuple[bytes, list[torch.Tensor]]:
    """The tree pickled without its tensors, and the tensors (each shared one once): how a
    rank sends its state to the other ranks of the same job (never used for files)."""
    tensors: list[torch.Tensor] = []
    index_of: dict[int, int] = {}

    class _Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> int | None:
            if isinstance(obj, torch.Tensor):
                key = id(obj)
                if key not in index_of:
                    index_of[key] = len(tensors)
                    tensors.append(obj)
                return index_of[key]
            return None

    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(tree)
    return buffer.getvalue(), tensors


def join_tensors(structure: bytes, tensors: list[torch.Tensor]) -> Any:
    """Inverse of :func:`split_tensors`."""

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> torch.Tensor:
            return tensors[pid]

    return _Unpickler(io.BytesIO(structure)).load()


@dataclasses.dataclass
class HostSnapshot:
    """A state tree frozen in host memory: valid until the next :meth:`HostStaging.capture`.

    Copies that :meth:`HostStaging.capture` deferred are made by :meth:`finish_copy`.
    """

    document: Any
    arrays: list[torch.Tensor | numpy.ndarray]
    pending: list[tuple[torch.Tensor, torch.Tensor]]  # (host buffer, live tensor) still to copy
    # Where each array lived (codec.device_kind), recorded in the checkpoint so that GPU state is
    # restored to the GPU: the arrays here are host copies.
    devices: list[str] = dataclasses.field(default_factory=list)

    def finish_copy(self) -> None:
        devices = set()
        for buffer, tensor in self.pending:
            on_gpu = tensor.device.type == "cuda"
            buffer.copy_(tensor, non_blocking=on_gpu)
            if on_gpu:
                devices.add(tensor.device)
        # This runs on the writer thread, whose current device is not the tensors': wait for
        # each device the copies came from before the bytes are written and summed.
        for device in devices:
            torch.cuda.synchronize(device)
        self.pending = []

    def encoded(self) -> Encoded:
        return Encoded(self.document, self.arrays, self.devices or None)

    def tree(self) -> Any:
        return decode(self.document, self.arrays)


class HostStaging:
    """Host buffers reused from one snapshot to the next."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor | numpy.ndarray] = []

    def capture(self, tree: Any, defer: Callable[[torch.Tensor], bool] | None = None) -> HostSnapshot:
        """Freeze ``tree``: everything is copied now, except tensors for which ``defer`` says
        the copy may wait for :meth:`HostSnapshot.finish_copy` (the caller guarantees they do
        not change before then). TypeError if the tree holds something that is not plain data."""
        encoded = encode(tree)
        host: list[torch.Tensor | numpy.ndarray] = []
        pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        devices = [device_kind(array) for array in encoded.arrays]  # the live arrays', not the copies'
        now = HostSnapshot(encoded.document, host, [])
        for index, array in enumerate(encoded.arrays):
            if isinstance(array, numpy.ndarray):
                host.append(array.copy())  # small (RNG states, user values)
                continue
            tensor = array.detach()
            buffer = self._buffers[index] if index < len(self._buffers) else None
            if not (isinstance(buffer, torch.Tensor) and buffer.shape == tensor.shape and buffer.dtype == tensor.dtype):
                pinned = tensor.device.type == "cuda"
                buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pinned)
            host.append(buffer)
            (pending if defer is not None and defer(tensor) else now.pending).append((buffer, tensor))
        now.finish_copy()
        self._buffers = host
        return HostSnapshot(encoded.document, host, pending, devices)
