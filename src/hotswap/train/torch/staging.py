"""Bytes between accelerator memory and a file through two reused pinned host buffers.

While one buffer is written to disk (or filled from it), the device copies into (or out of)
the other on a side stream, so a save or restore of GPU state runs at disk speed and never
holds more than two buffers of it in host memory. A :class:`Staging` belongs to one I/O thread
at a time.

The device is reached through a :class:`CopyQueue` (a CUDA stream, or :class:`HostQueue` for
tests, where copies complete at once): the double buffering is the same code either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import torch

STAGING_BYTES = 8 << 20  # per buffer, two per I/O thread: 128 MB of pinned memory with 8 threads


class Completion(Protocol):
    def synchronize(self) -> None: ...


class CopyQueue(Protocol):
    """Where copies between a device and host buffers are queued, in order."""

    def active(self) -> contextlib.AbstractContextManager[object]: ...

    def record(self) -> Completion: ...

    def synchronize(self) -> None: ...


class CudaQueue:
    """A side stream of one CUDA device. The caller synchronises the device before a save or
    a restore, so the stream needs no ordering against the training stream."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device=device)

    def active(self) -> contextlib.AbstractContextManager[object]:
        return torch.cuda.stream(self.stream)

    def record(self) -> Completion:
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def synchronize(self) -> None:
        self.stream.synchronize()


class HostQueue:
    """Copies between host tensors: done when queued."""

    def active(self) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()

    def record(self) -> Completion:
        return self

    def synchronize(self) -> None:
        pass


class Staging:
    """Two host buffers and a copy queue (see the module)."""

    def __init__(self, queue: CopyQueue, buffers: Sequence[torch.Tensor]) -> None:
        if len(buffers) != 2 or buffers[0].numel() != buffers[1].numel() or buffers[0].numel() == 0:
            raise ValueError("staging needs two host byte buffers of one non-zero size")
        self.queue = queue
        self.buffers = list(buffers)
        self.chunk = buffers[0].numel()

    @classmethod
    def for_cuda(cls, device: torch.device, chunk: int | None = None) -> Staging:
        size = chunk or STAGING_BYTES
        buffers = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        return cls(CudaQueue(device), buffers)

    def write_from(self, pieces: Sequence[torch.Tensor], write: Callable[[memoryview], None]) -> None:
        """Pass the bytes of ``pieces`` (1-D uint8 tensors on the device or the host), in
        order, to ``write``."""
        pending: tuple[int, int, Completion] | None = None  # a buffer copied (or copying), not written
        current, fill = 0, 0
        try:
            with self.queue.active():
                for piece in pieces:
                    done = 0
                    while done < piece.numel():
                        count = min(self.chunk - fill, piece.numel() - done)
                        self.buffers[current][fill : fill + count].copy_(piece[done : done + count], non_blocking=True)
                        fill, done = fill + count, done + count
                        if fill == self.chunk:
                            pending = self._hand_over(pending, current, fill, write)
                            current, fill = 1 - current, 0  # the buffer just written
                if fill:
                    pending = self._hand_over(pending, current, fill, write)
            if pending is not None:
                self._write(pending, write)
        finally:
            self.queue.synchronize()  # no copy into a buffer outlives the call (on an error too)

    def _hand_over(
        self,
        pending: tuple[int, int, Completion] | None,
        current: int,
        fill: int,
        write: Callable[[memoryview], None],
    ) -> tuple[int, int, Completion]:
        copied = self.queue.record()
        if pending is not None:
            self._write(pending, write)  # while the device copies into the current buffer
        return current, fill, copied

    def _write(self, pending: tuple[int, int, Completion], write: Callable[[memoryview], None]) -> None:
        index, count, copied = pending
        copied.synchronize()
        write(memoryview(self.buffers[index][:count].numpy()))

    def read_into(self, pieces: Sequence[torch.Tensor], read: Callable[[memoryview], None]) -> None:
        """Fill ``pieces`` (1-D uint8 tensors on the device or the host), in order, with bytes
        from ``read`` (which fills the whole view it is given)."""
        uploaded: list[Completion | None] = [None, None]  # each buffer's last copy to the device
        targets = _Cursor(pieces)
        current = 0
        try:
            with self.queue.active():
                while targets.left:
                    previous = uploaded[current]
                    if previous is not None:
                        previous.synchronize()  # the device has what this buffer held
                    count = min(self.chunk, targets.left)
                    buffer = self.buffers[current][:count]
                    read(memoryview(buffer.numpy()))
                    offset = 0
                    for target in targets.take(count):
                        target.copy_(buffer[offset : offset + target.numel()], non_blocking=True)
                        offset += target.numel()
                    uploaded[current] = self.queue.record()
                    current = 1 - current
        finally:
            self.queue.synchronize()  # the targets are complete (or abandoned) when this returns


class _Cursor:
    """Consecutive slices of a sequence of 1-D tensors."""

    def __init__(self, pieces: Sequence[torch.Tensor]) -> None:
        self._pieces = [piece for piece in pieces if piece.numel()]
        self._index = 0
        self._offset = 0
        self.left = sum(piece.numel() for piece in self._pieces)

    def take(self, count: int) -> Iterator[torch.Tensor]:
        self.left -= count
        while count:
            piece = self._pieces[self._index]
            size = min(count, piece.numel() - self._offset)
            yield piece[self._offset : self._offset + size]
            count -= size
            self._offset += size
            if self._offset == piece.numel():
                self._index, self._offset = self._index + 1, 0
