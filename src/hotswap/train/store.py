"""The checkpoint directory: atomic commits, retention, and detection of partial checkpoints.

Layout under ``HOTSWAP_CHECKPOINT_DIR``::

    step-0000000120/            a committed checkpoint (120 steps done)
        state.pt                the data (written by the caller)
        COMMIT                  JSON marker, written last: step, reason, size, CRC-32 of state.pt
    step-0000000140.partial-<host>-<pid>-<nonce>/    a write in progress, or one that was killed

A checkpoint is written under a ``.partial`` name, its data and marker are fsynced, the
directory is renamed to its final name (atomic, never over an existing one) and the parent is
fsynced. So after a crash at any instant the directory holds whole checkpoints plus leftovers
that are recognisable by name. On storage where a directory rename is not atomic (some object
store mounts) the marker and checksum still tell a whole checkpoint from a torn one.

This module knows files, not tensors: the caller passes a function that writes the data.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import json
import logging
import os
import re
import shutil
import socket
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger("hotswap.train")

DATA_FILE = "state.pt"
MARKER_FILE = "COMMIT"
FORMAT_VERSION = 1
REASONS = ("periodic", "termination", "final", "recovery")
_COMMITTED = re.compile(r"^step-(\d+)$")
_PARTIAL = re.compile(r"^step-(\d+)\.partial-")
_DELETING = re.compile(r"^step-(\d+)\.deleting-")
_READ_CHUNK = 16 << 20
# Leftovers of killed writers are deleted once older than this: a live writer (a worker of an
# attempt that is still shutting down) is never that slow to touch its directory.
STALE_PARTIAL_S = 600.0


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint, as its marker describes it."""

    step: int
    path: Path
    reason: str
    size: int
    crc32: int
    created: float

    @property
    def data_path(self) -> Path:
        return self.path / DATA_FILE


def _step_dir_name(step: int) -> str:
    return f"step-{step:010d}"


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as error:
        # Some network and FUSE file systems cannot fsync a directory; the marker and checksum
        # still protect the checkpoint there.
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def file_crc32(path: Path) -> int:
    """CRC-32 of a file, read in large chunks (zlib releases the GIL while it sums)."""
    crc = 0
    buffer = bytearray(_READ_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            count = handle.readinto(buffer)
            if not count:
                return crc
            crc = zlib.crc32(view[:count], crc)


def _write_json_durably(path: Path, document: dict[str, Any]) -> None:
    with open(path, "w") as handle:
        json.dump(document, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())


class CheckpointStore:
    """Committed checkpoints in one directory, newest kept, partial ones recognised."""

    def __init__(self, root: str | os.PathLike[str], keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        self.root = Path(root)
        self.keep = keep
        self._reported: set[Path] = set()
        # One helper thread sums the data file while the writer waits for its fsync; another
        # deletes old checkpoints after a commit, off the saver's path.
        self._checksummer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hotswap-crc")
        self._pruner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hotswap-prune")

    # Writing -------------------------------------------------------------------------------

    def write(
        self,
        step: int,
        reason: str,
        write_data: Callable[[BinaryIO], None],
    ) -> CheckpointInfo:
        """Write a checkpoint of ``step`` atomically and prune old ones; return what was committed.

        If a checkpoint of the same step is already committed (another writer got there
        first), that one is kept and returned.
        """
        if reason not in REASONS:
            raise ValueError(f"checkpoint reason must be one of {REASONS}, not {reason!r}")
        self.root.mkdir(parents=True, exist_ok=True)
        nonce = uuid.uuid4().hex[:8]
        partial = self.root / f"{_step_dir_name(step)}.partial-{socket.gethostname()}-{os.getpid()}-{nonce}"
        partial.mkdir()
        data_path = partial / DATA_FILE
        with open(data_path, "wb") as handle:
            write_data(handle)
            handle.flush()
            size = handle.tell()
            # Sum the bytes (now in the page cache) while the disk flushes them.
            crc_future = self._checksummer.submit(file_crc32, data_path)
            os.fsync(handle.fileno())
            crc = crc_future.result()
        marker = {
            "format": FORMAT_VERSION,
            "step": step,
            "reason": reason,
            "size": size,
            "crc32": crc,
            "created": time.time(),
        }
        _write_json_durably(partial / MARKER_FILE, marker)
        _fsync_directory(partial)
        final = self.root / _step_dir_name(step)
        try:
            os.rename(partial, final)
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            shutil.rmtree(partial, ignore_errors=True)
            existing = self._read_marker(final)
            if existing is None:
                raise RuntimeError(f"checkpoint {final} exists but has no readable commit marker") from error
            return existing
        _fsync_directory(self.root)
        self._pruner.submit(self.prune)
        return self._info(final, marker)

    def settle(self) -> None:
        """Wait until old checkpoints that a commit made obsolete are deleted."""
        self._pruner.submit(lambda: None).result()

    def set_reason(self, step: int, reason: str) -> CheckpointInfo:
        """Change the recorded reason of a committed checkpoint (atomically replace its marker).

        Used when a termination finds its step already saved by a periodic checkpoint: the data
        is the same, and a restart should report it as a migration.
        """
        if reason not in REASONS:
            raise ValueError(f"checkpoint reason must be one of {REASONS}, not {reason!r}")
        path = self.root / _step_dir_name(step)
        info = self._read_marker(path)
        if info is None:
            raise FileNotFoundError(f"no committed checkpoint of step {step} in {self.root}")
        marker = self._marker_document(info)
        marker["reason"] = reason
        temporary = path / f"{MARKER_FILE}.{uuid.uuid4().hex[:8]}"
        _write_json_durably(temporary, marker)
        os.replace(temporary, path / MARKER_FILE)
        _fsync_directory(path)
        return self._info(path, marker)

    def prune(self) -> None:
        """Keep the newest ``keep`` committed checkpoints; delete stale partial ones.

        A checkpoint is renamed out of the committed namespace before its files go, so a
        deletion cut short by a kill leaves nothing that looks like a damaged checkpoint.
        """
        for _, path in self._committed_dirs()[self.keep :]:
            doomed = path.with_name(f"{path.name}.deleting-{uuid.uuid4().hex[:8]}")
            try:
                os.rename(path, doomed)
            except FileNotFoundError:
                continue  # another writer's prune got there first
            shutil.rmtree(doomed, ignore_errors=True)
        for _, path in self._scan(_DELETING):
            shutil.rmtree(path, ignore_errors=True)
        now = time.time()
        for _, path in self._partial_dirs():
            try:
                age = now - path.stat().st_mtime
            except FileNotFoundError:
                continue
            if age > STALE_PARTIAL_S:
                shutil.rmtree(path, ignore_errors=True)

    # Reading -------------------------------------------------------------------------------

    def committed(self) -> list[CheckpointInfo]:
        """Checkpoints with a readable marker, newest first (data not verified)."""
        infos = []
        for _, path in self._committed_dirs():
            info = self._read_marker(path)
            if info is not None:
                infos.append(info)
        return infos

    def latest_step(self) -> int | None:
        """The newest step with a commit marker, without reading its data."""
        infos = self.committed()
        return infos[0].step if infos else None

    def complete(self) -> Iterator[CheckpointInfo]:
        """Checkpoints whose data matches their marker (size and CRC-32), newest first.

        Anything newer than a yielded checkpoint that is not complete (a killed write, a torn
        copy) is skipped with a warning naming it.
        """
        partial = self._partial_dirs()
        for step, path in self._committed_dirs():
            self._report_partial_newer_than(step, partial)
            info = self._read_marker(path)
            if info is None:
                self._report(path, "it has no commit marker")
                continue
            problem = self.verify(info)
            if problem:
                self._report(path, problem)
                continue
            yield info
        self._report_partial_newer_than(-1, partial)

    def latest_complete(self) -> CheckpointInfo | None:
        """The newest complete checkpoint (see :meth:`complete`), or None."""
        return next(self.complete(), None)

    def verify(self, info: CheckpointInfo) -> str | None:
        """Why the checkpoint's data does not match its marker, or None when it does."""
        try:
            size = info.data_path.stat().st_size
        except FileNotFoundError:
            return f"its data file {DATA_FILE} is missing"
        if size != info.size:
            return f"its data file has {size} bytes, the marker says {info.size}"
        if file_crc32(info.data_path) != info.crc32:
            return "its data does not match the checksum in its marker"
        return None

    def partial(self) -> list[Path]:
        """Directories of writes that never committed, newest step first."""
        return [path for _, path in self._partial_dirs()]

    # Internals -----------------------------------------------------------------------------

    def _report_partial_newer_than(self, step: int, partial: list[tuple[int, Path]]) -> None:
        for partial_step, path in partial:
            if partial_step > step:
                self._report(path, "it was never committed (its writer stopped mid-write)")

    def _report(self, path: Path, why: str) -> None:
        if path not in self._reported:
            self._reported.add(path)
            log.warning("hotswap: skipping partial checkpoint %s: %s", path, why)

    def _scan(self, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            match = pattern.match(entry.name)
            if match and entry.is_dir():
                found.append((int(match.group(1)), Path(entry.path)))
        return sorted(found, reverse=True)

    def _committed_dirs(self) -> list[tuple[int, Path]]:
        return self._scan(_COMMITTED)

    def _partial_dirs(self) -> list[tuple[int, Path]]:
        return self._scan(_PARTIAL)

    def _read_marker(self, path: Path) -> CheckpointInfo | None:
        try:
            document = json.loads((path / MARKER_FILE).read_text())
            return self._info(path, document)
        except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    @staticmethod
    def _info(path: Path, marker: dict[str, Any]) -> CheckpointInfo:
        return CheckpointInfo(
            step=int(marker["step"]),
            path=path,
            reason=str(marker["reason"]),
            size=int(marker["size"]),
            crc32=int(marker["crc32"]),
            created=float(marker["created"]),
        )

    @staticmethod
    def _marker_document(info: CheckpointInfo) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "step": info.step,
            "reason": info.reason,
            "size": info.size,
            "crc32": info.crc32,
            "created": info.created,
        }
