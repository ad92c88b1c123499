"""Saving and restoring state trees through a :class:`CheckpointStore`, without pickle.

A tree becomes plain data (:mod:`hotswap.train.torch.codec`) and raw array bytes
(:mod:`hotswap.train.torch.tensorfiles`), so restoring a checkpoint cannot run code, whoever wrote it.

A synchronous save (the SIGTERM path) writes the live tensors directly, on several threads. An
asynchronous save blocks the training loop only while
:class:`~hotswap.train.torch.snapshot.HostStaging` copies the state to host memory (tensors it may
defer are copied by the background thread first, and :meth:`wait_for_copy` holds back the next
optimizer step until they are); the background thread then writes. At most one write is in
flight: the run does not start a periodic save while the previous one is still writing (it
saves at a later step boundary).

Checkpoints of the previous release (format 1: one ``state.pt`` written by ``torch.save``) are
still restored, through ``torch.load(weights_only=True)``: PyTorch's restricted unpickler, which
builds tensors and containers only, here also numpy arrays and scalars (the RNG states).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy
import torch

from hotswap.api.worker_output import EVENT_CHECKPOINT_SAVE
from hotswap.train.torch.codec import CheckpointFormatError, encode
from hotswap.train.events import EventLog
from hotswap.train.torch.snapshot import HostSnapshot, HostStaging
from hotswap.train.torch.state import tree_format_problem
from hotswap.train.files import CheckpointDamaged, FreshStartRefused, fresh_start_refusal, set_aside
from hotswap.train.torch.store import LEGACY_DATA_FILE, LEGACY_FORMAT, CheckpointInfo, CheckpointStore
from hotswap.train.torch.tensorfiles import TensorFiles

log = logging.getLogger("hotswap.train")

# What numpy arrays, scalars and their dtypes reduce to when pickled (the RNG states hold them);
# taken from numpy itself because its module paths differ between versions.
_LEGACY_NUMPY_GLOBALS = [
    numpy.ndarray,
    numpy.dtype,
    numpy.ndarray((0,)).__reduce__()[0],
    numpy.float64(0).__reduce__()[0],
    *{type(numpy.dtype(code)) for code in "?bBhHiIlLqQefdgFDG"},
]


def read_legacy(store: CheckpointStore, info: CheckpointInfo) -> Any:
    """A format-1 checkpoint's tree, read without running code."""
    problem = store.verify(info)
    if problem:
        raise CheckpointDamaged(problem)
    with torch.serialization.safe_globals(_LEGACY_NUMPY_GLOBALS):
        try:
            return torch.load(info.path / LEGACY_DATA_FILE, map_location="cpu", weights_only=True)
        except Exception as error:  # the restricted unpickler refused something, or a torn file
            raise CheckpointFormatError(
                f"it is a checkpoint of an earlier release holding values that cannot be read safely "
                f"({_unpickler_complaint(error)})"
            ) from None


def _unpickler_complaint(error: Exception) -> str:
    """The one line of torch.load's long message that says what it refused."""
    text = str(error)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation", 1)[0]
    text = " ".join(text.split()) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


class Checkpointer:
    """Saves (synchronously or in the background) and restores through one store. ``threads``:
    how many files a checkpoint is split into and written or read at once (default: one per
    CPU, at most 8)."""

    def __init__(
        self, store: CheckpointStore, events: EventLog, threads: int | None = None, fallback: CheckpointStore | None = None
    ) -> None:
        self.store = store
        self.fallback = fallback  # read while ``store`` holds no usable checkpoint (the run's resume source)
        self.events = events
        self._files = TensorFiles(threads)
        self._staging = HostStaging()
        self._writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hotswap-checkpoint")
        self._in_flight: concurrent.futures.Future[CheckpointInfo] | None = None
        self._in_flight_step: int | None = None
        self._copied = threading.Event()
        self._copied.set()
        self._copy_wait_s = 0.0  # time the loop waited in wait_for_copy() for the save in flight

    @property
    def threads(self) -> int:
        return self._files.threads

    @property
    def busy(self) -> bool:
        return self._in_flight is not None and not self._in_flight.done()

    def save(self, step: int, tree: Any, reason: str) -> CheckpointInfo:
        """Write ``tree`` now (after any write in flight); the caller's tensors must not change
        until it returns. TypeError if the tree holds something that is not plain data."""
        self.wait()
        started = time.monotonic()
        encoded = encode(tree)
        info = self.store.write(step, reason, lambda directory: self._files.write(directory, encoded))
        elapsed = time.monotonic() - started
        self._record(info, reason, blocking_s=elapsed, total_s=elapsed)
        return info

    def save_async(
        self, step: int, tree: Any, reason: str, defer: Callable[[torch.Tensor], bool] | None = None
    ) -> float:
        """Copy ``tree`` to host memory and write it in the background; return the seconds the
        caller was blocked (waiting for a previous write, and copying). Tensors for which
        ``defer`` is true are copied in the background: the caller must not change them before
        :meth:`wait_for_copy` returns."""
        started = time.monotonic()
        self.wait()
        snapshot = self._staging.capture(tree, defer)
        blocking = time.monotonic() - started
        self._in_flight_step = step
        self._copy_wait_s = 0.0
        if snapshot.pending:
            self._copied.clear()
        self._in_flight = self._writer.submit(self._write_snapshot, step, snapshot, reason, started, blocking)
        return blocking

    def wait_for_copy(self) -> None:
        """Return once the save in flight no longer reads live tensors."""
        if self._copied.is_set():
            return
        started = time.monotonic()
        self._copied.wait()
        self._copy_wait_s += time.monotonic() - started

    def _write_snapshot(
        self, step: int, snapshot: HostSnapshot, reason: str, started: float, blocking: float
    ) -> CheckpointInfo:
        try:
            snapshot.finish_copy()
        finally:
            self._copied.set()
        info = self.store.write(step, reason, lambda directory: self._files.write(directory, snapshot.encoded()))
        self._record(info, reason, blocking_s=blocking + self._copy_wait_s, total_s=time.monotonic() - started)
        return info

    def _record(self, info: CheckpointInfo, reason: str, *, blocking_s: float, total_s: float) -> None:
        self.events.record(
            EVENT_CHECKPOINT_SAVE,
            step=info.step,
            blocking_s=round(blocking_s, 6),
            total_s=round(total_s, 6),
            bytes=info.size,
            reason=reason,
        )

    def wait(self) -> CheckpointInfo | None:
        """Let the write in flight finish. A failed write is reported, not raised: training
        goes on and the next save tries again."""
        future, self._in_flight = self._in_flight, None
        if future is None:
            return None
        try:
            return future.result()
        except Exception as error:  # disk full, storage gone: keep training, say so
            log.warning("hotswap: checkpoint of step %s failed: %s", self._in_flight_step, error)
            return None

    def restore_latest(self) -> tuple[Any, CheckpointInfo] | None:
        """The newest usable checkpoint's tree, setting damaged ones aside (one warning each):
        this run's own, else its resume source's."""
        self.wait()
        for store in (self.store, self.fallback):
            found = self._newest_usable(store) if store is not None else None
            if found is not None:
                return found
        return None

    def fresh_start_refusal(self, allowed: bool) -> FreshStartRefused | None:
        """Once :meth:`restore_latest` found nothing: why starting from step 0 is refused
        (damaged checkpoints were set aside and ``allowed`` is false), or None."""
        roots = [store.root for store in (self.store, self.fallback) if store is not None]
        return fresh_start_refusal(roots, allowed)

    def from_fallback(self, info: CheckpointInfo) -> bool:
        """Whether ``info`` is one of the resume source's checkpoints (another run's)."""
        return self.fallback is not None and info.path.parent == self.fallback.root

    def _newest_usable(self, store: CheckpointStore) -> tuple[Any, CheckpointInfo] | None:
        for info in store.candidates():
            try:
                if info.format == LEGACY_FORMAT:
                    tree = read_legacy(store, info)
                else:
                    tree = self._files.read(info.path, info.files)
            except CheckpointDamaged as damage:  # torn or changed since it was committed
                set_aside(info.path, str(damage))
                continue
            except CheckpointFormatError as error:  # whole, but not a state this release wrote
                set_aside(info.path, f"it cannot be loaded ({error})")
                continue
            except OSError as error:  # the storage, not the checkpoint: left where it is
                log.warning("hotswap: skipping checkpoint %s: it cannot be read (%s)", info.path, error)
                continue
            problem = tree_format_problem(tree)
            if problem:
                set_aside(info.path, problem)
                continue
            return tree, info
        return None
