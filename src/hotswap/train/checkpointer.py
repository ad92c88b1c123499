"""Saving and restoring state trees with ``torch.save`` through a :class:`CheckpointStore`.

A synchronous save writes the live tensors directly. An asynchronous save blocks the training
loop only while :class:`~hotswap.train.snapshot.HostStaging` copies the state to host memory
(tensors it may defer are copied by the background thread first, and :meth:`wait_for_copy`
holds back the next optimizer step until they are); the background thread then writes. At
most one write is in flight: the run does not start a periodic save while the previous one is
still writing (it saves at a later step boundary).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import torch

from hotswap.api.worker import EVENT_CHECKPOINT_SAVE
from hotswap.train.events import EventLog
from hotswap.train.snapshot import HostSnapshot, HostStaging
from hotswap.train.state import tree_format_problem
from hotswap.train.store import CheckpointInfo, CheckpointStore

log = logging.getLogger("hotswap.train")


@contextlib.contextmanager
def _without_zip_crc() -> Iterator[None]:
    """torch.save sums every record into its zip headers and torch.load never checks them; the
    store keeps its own CRC-32 (computed while the disk flushes), so skip torch's serial pass."""
    config = getattr(getattr(torch.utils, "serialization", None), "config", None)
    if config is None or not hasattr(config, "patch"):
        yield
        return
    with config.patch({"save.compute_crc32": False}):
        yield


def write_tree(tree: Any, handle: BinaryIO) -> None:
    with _without_zip_crc():
        torch.save(tree, handle)


def read_tree(info: CheckpointInfo) -> Any:
    # weights_only=False: registered dicts may hold any picklable value (numpy scalars, ...),
    # and the directory belongs to this workload, written by its own workers.
    return torch.load(info.data_path, map_location="cpu", weights_only=False)


class Checkpointer:
    def __init__(self, store: CheckpointStore, events: EventLog) -> None:
        self.store = store
        self.events = events
        self._staging = HostStaging()
        self._writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hotswap-checkpoint")
        self._in_flight: concurrent.futures.Future[CheckpointInfo] | None = None
        self._in_flight_step: int | None = None
        self._copied = threading.Event()
        self._copied.set()
        self._copy_wait_s = 0.0  # time the loop waited in wait_for_copy() for the save in flight

    @property
    def busy(self) -> bool:
        return self._in_flight is not None and not self._in_flight.done()

    def save(self, step: int, tree: Any, reason: str) -> CheckpointInfo:
        """Write ``tree`` now (after any write in flight); the caller's tensors must not change
        until it returns."""
        self.wait()
        started = time.monotonic()
        info = self.store.write(step, reason, lambda handle: write_tree(tree, handle))
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
        info = self.store.write(step, reason, lambda handle: write_tree(snapshot.tree(), handle))
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
        """The newest complete checkpoint's tree, skipping (and reporting) damaged ones."""
        self.wait()
        for info in self.store.complete():
            try:
                tree = read_tree(info)
            except Exception as error:  # passed its checksum but does not unpickle: written by something else
                log.warning("hotswap: skipping checkpoint %s: it cannot be loaded (%s)", info.path, error)
                continue
            problem = tree_format_problem(tree)
            if problem:
                log.warning("hotswap: skipping checkpoint %s: %s", info.path, problem)
                continue
            return tree, info
        return None
