"""The checkpoint directory: atomic commits, retention, detection of partial checkpoints.

Layout under ``HOTSWAP_CHECKPOINT_DIR``::

    step-0000000120/            a committed checkpoint (120 steps done)
        index.json, tensors-*.bin    the data (written by the caller; see tensorfiles.py)
        COMMIT                  JSON marker, written last: step, reason, each file's size and CRC-32
    step-0000000140.partial-<host>-<pid>-<nonce>/    a write in progress, or one that was killed
                                (removed after the next commit once its writer is gone)
    signal                      seed 004's: resume (last saved on SIGTERM), running, done (see runs.py)
    damaged/step-0000000100-<nonce>/    a committed checkpoint found damaged (a malformed or
                                linked marker, a missing, changed or foreign file), moved out
                                of the way: kept for inspection, never read again

A checkpoint is written under a ``.partial`` name, its files and marker are fsynced, the
directory is renamed to its final name (atomic, never over an existing one) and the parent is
fsynced. So after a crash at any instant the directory holds whole checkpoints plus leftovers
that are recognisable by name. On storage where a directory rename is not atomic (some object
store mounts) the marker and checksums still tell a whole checkpoint from a torn one.

The directory must belong to the user running the job and be writable by nobody else: its
contents decide the state a job resumes with (:mod:`hotswap.train.files` creates it private
and refuses one that is not; a file that is a link or another user's makes its checkpoint
skipped). Markers of format 1 (the previous release: one ``state.pt``) are still listed.

This module knows files, not tensors: the caller passes a function that writes the data files.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hotswap.train import runs
from hotswap.train.files import (
    FileDigest,
    crc32,
    file_problem,
    not_a_directory,
    open_no_follow,
    prepare_directory,
    set_aside,
    write_file_durably,
)
from hotswap.train.save_leases import saver_may_be_live

log = logging.getLogger("hotswap.train")

MARKER_FILE = "COMMIT"
FORMAT_VERSION = 2
LEGACY_FORMAT = 1  # one state.pt, written by torch.save
LEGACY_DATA_FILE = "state.pt"
REASONS = ("periodic", "termination", "final", "recovery")
_COMMITTED = re.compile(r"^step-(\d+)$")
_PARTIAL = re.compile(r"^step-(\d+)\.partial-")
_DELETING = re.compile(r"^step-(\d+)\.deleting-")
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_READ_CHUNK = 16 << 20
_MAX_MARKER_BYTES = 1 << 20
# Leftovers of killed writers are deleted once older than this: a live writer (a worker of an
# attempt that is still shutting down) is never that slow to touch its directory.
STALE_PARTIAL_S = 600.0


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint, as its marker describes it."""

    step: int
    path: Path
    reason: str
    files: dict[str, FileDigest]
    created: float
    format: int = FORMAT_VERSION

    @property
    def size(self) -> int:
        return sum(digest.size for digest in self.files.values())


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
    """CRC-32 of a file, read in large chunks."""
    crc = 0
    buffer = bytearray(_READ_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            count = handle.readinto(buffer)
            if not count:
                return crc
            crc = crc32(view[:count], crc)


class CheckpointStore:
    """Committed checkpoints in one directory, newest kept, partial ones recognised."""

    def __init__(self, root: str | os.PathLike[str], keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        self.root = Path(root)
        self.keep = keep
        prepare_directory(self.root)
        self._reported: set[Path] = set()
        # Deleting old checkpoints after a commit happens off the saver's path.
        self._pruner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hotswap-prune")

    # Writing -------------------------------------------------------------------------------

    def write(
        self,
        step: int,
        reason: str,
        write_files: Callable[[Path], dict[str, FileDigest]],
    ) -> CheckpointInfo:
        """Write a checkpoint of ``step`` atomically and prune old ones; return what was committed.

        ``write_files`` writes the data files into the directory it is given, fsyncs them and
        returns their digests. If a checkpoint of the same step is already committed (another
        writer got there first), that one is kept and returned.
        """
        if reason not in REASONS:
            raise ValueError(f"checkpoint reason must be one of {REASONS}, not {reason!r}")
        nonce = uuid.uuid4().hex[:8]
        partial = self.root / f"{_step_dir_name(step)}.partial-{socket.gethostname()}-{os.getpid()}-{nonce}"
        partial.mkdir(mode=0o700)
        try:
            files = write_files(partial)
        except Exception:
            shutil.rmtree(partial, ignore_errors=True)  # a full disk gets its space back now
            raise
        final = self.root / _step_dir_name(step)
        info = CheckpointInfo(step, final, reason, files, time.time())
        write_file_durably(partial / MARKER_FILE, json.dumps(_marker_document(info), sort_keys=True).encode())
        _fsync_directory(partial)
        for attempt in range(2):
            try:
                os.rename(partial, final)
                break
            except OSError as error:
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                    shutil.rmtree(partial, ignore_errors=True)
                    raise
                existing = not_a_directory(final) or self._read_marker(final)  # a link: planted in the way
                problem = existing if isinstance(existing, str) else self._files_problem(existing)
                if problem is None or attempt:
                    shutil.rmtree(partial, ignore_errors=True)
                    if problem is not None:  # damaged, and it could not be moved aside
                        raise RuntimeError(f"checkpoint {final} exists but {problem}") from error
                    return existing  # another writer committed this step first: the same state
                set_aside(final, problem)  # damaged: out of the way of this save
        _fsync_directory(self.root)
        runs.mark_saved(self.root, reason)
        self._pruner.submit(self.prune)
        return info

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
        if isinstance(info, str):
            raise FileNotFoundError(f"no committed checkpoint of step {step} in {self.root}: {info}")
        info = dataclasses.replace(info, reason=reason)
        temporary = path / f"{MARKER_FILE}.{uuid.uuid4().hex[:8]}"
        write_file_durably(temporary, json.dumps(_marker_document(info), sort_keys=True).encode())
        os.replace(temporary, path / MARKER_FILE)
        _fsync_directory(path)
        runs.mark_saved(self.root, reason)
        return info

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
            if age > STALE_PARTIAL_S or _writer_gone(self.root, path.name):
                shutil.rmtree(path, ignore_errors=True)

    # Reading -------------------------------------------------------------------------------

    def committed(self) -> list[CheckpointInfo]:
        """Checkpoints with a readable marker, newest first (data not verified)."""
        infos = []
        for _, path in self._committed_dirs():
            info = self._read_marker(path)
            if not isinstance(info, str):
                infos.append(info)
        return infos

    def latest_step(self) -> int | None:
        """The newest step with a commit marker, without reading its data."""
        infos = self.committed()
        return infos[0].step if infos else None

    def candidates(self) -> Iterator[CheckpointInfo]:
        """Committed checkpoints whose files are all there, with the sizes and owner their
        marker and this directory require, newest first; their checksums are for the reader
        to check (:meth:`report` what it finds). Anything newer than a yielded checkpoint that
        is not whole (a killed write, a torn copy) is skipped with a warning naming it; a step's
        name that is not a directory of its own (a symbolic link) is damaged."""
        for _, path in self._scan(_COMMITTED, directories=False):
            problem = not_a_directory(path)
            if problem:
                set_aside(path, problem)
        partial = self._partial_dirs()
        for step, path in self._committed_dirs():
            self._report_partial_newer_than(step, partial)
            info = self._read_marker(path)
            if isinstance(info, str):
                set_aside(path, info)
                continue
            problem = self._files_problem(info)
            if problem:
                set_aside(path, problem)
                continue
            yield info
        self._report_partial_newer_than(-1, partial)

    def complete(self) -> Iterator[CheckpointInfo]:
        """:meth:`candidates` whose files also match their checksums (each file is read); the
        others are set aside."""
        for info in self.candidates():
            problem = self.verify(info)
            if problem:
                set_aside(info.path, problem)
                continue
            yield info

    def latest_complete(self) -> CheckpointInfo | None:
        """The newest complete checkpoint (see :meth:`complete`), or None."""
        return next(self.complete(), None)

    def verify(self, info: CheckpointInfo) -> str | None:
        """Why the checkpoint's files do not match its marker, or None when they do."""
        problem = self._files_problem(info)
        if problem:
            return problem
        for name, digest in info.files.items():
            if file_crc32(info.path / name) != digest.crc32:
                return f"its file {name} does not match the checksum in its marker"
        return None

    def partial(self) -> list[Path]:
        """Directories of writes that never committed, newest step first."""
        return [path for _, path in self._partial_dirs()]

    def report(self, path: Path, why: str) -> None:
        """Warn, once per path, that a partial checkpoint (never committed) is skipped and why."""
        if path not in self._reported:
            self._reported.add(path)
            log.warning("hotswap: skipping partial checkpoint %s: %s", path, why)

    # Internals -----------------------------------------------------------------------------

    def _files_problem(self, info: CheckpointInfo) -> str | None:
        for name, digest in info.files.items():
            try:
                status = os.lstat(info.path / name)
            except FileNotFoundError:
                return f"its file {name} is missing"
            problem = file_problem(status, digest.size)
            if problem:
                return f"its file {name} {problem}"
        return None

    def _report_partial_newer_than(self, step: int, partial: list[tuple[int, Path]]) -> None:
        for partial_step, path in partial:
            if partial_step > step:
                self.report(path, "it was never committed (its writer stopped mid-write)")

    def _scan(self, pattern: re.Pattern[str], directories: bool = True) -> list[tuple[int, Path]]:
        """Entries named by ``pattern``, newest step first: only real directories, or (not
        ``directories``) only what is anything else under such a name."""
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            match = pattern.match(entry.name)
            if match and entry.is_dir(follow_symlinks=False) == directories:
                found.append((int(match.group(1)), Path(entry.path)))
        return sorted(found, reverse=True)

    def _committed_dirs(self) -> list[tuple[int, Path]]:
        return self._scan(_COMMITTED)

    def _partial_dirs(self) -> list[tuple[int, Path]]:
        return self._scan(_PARTIAL)

    def _read_marker(self, path: Path) -> CheckpointInfo | str:
        """The checkpoint its marker describes, or why there is none."""
        try:
            fd = open_no_follow(path / MARKER_FILE)
        except (FileNotFoundError, NotADirectoryError):
            return f"it has no commit marker ({MARKER_FILE})"
        except OSError as error:
            if error.errno == errno.ELOOP:
                return f"its commit marker {MARKER_FILE} is a symbolic link"
            return f"its commit marker {MARKER_FILE} cannot be opened ({error.strerror})"
        try:
            problem = file_problem(os.fstat(fd), None)
            if problem:
                return f"its commit marker {MARKER_FILE} {problem}"
            data = os.read(fd, _MAX_MARKER_BYTES)
        finally:
            os.close(fd)
        try:
            return _info(path, json.loads(data))
        except KeyError as error:
            return f"its commit marker {MARKER_FILE} is malformed (it lacks {error})"
        except ValueError as error:  # json's errors included
            return f"its commit marker {MARKER_FILE} is malformed ({error})"
        except (TypeError, AttributeError, RecursionError):
            return f"its commit marker {MARKER_FILE} is malformed (not a marker document)"


def _info(path: Path, marker: dict[str, Any]) -> CheckpointInfo:
    """A marker document, checked (it comes from disk): ValueError, KeyError or TypeError."""
    version = marker["format"]
    if version == LEGACY_FORMAT:
        files = {LEGACY_DATA_FILE: {"size": marker["size"], "crc32": marker["crc32"]}}
    elif version == FORMAT_VERSION:
        files = marker["files"]
    else:
        raise ValueError(f"unknown marker format {version!r}")
    digests = {}
    for name, digest in files.items():
        size, crc = digest["size"], digest["crc32"]
        if not (isinstance(name, str) and _FILE_NAME.match(name)):
            raise ValueError(f"it names a file that is not a plain name in its directory: {_brief(name)}")
        if type(size) is not int or size < 0 or type(crc) is not int:
            raise ValueError(f"the size or checksum of {name} is not a non-negative integer: {_brief(size)}, {_brief(crc)}")
        digests[name] = FileDigest(size, crc)
    step, reason = marker["step"], marker["reason"]
    if type(step) is not int or step < 0:
        raise ValueError(f"its step is not a non-negative integer: {_brief(step)}")
    if reason not in REASONS:
        raise ValueError(f"its reason is not one of {', '.join(REASONS)}: {_brief(reason)}")
    if path.name != _step_dir_name(step):
        raise ValueError(f"it is of step {step}, but its directory is {path.name}")
    return CheckpointInfo(step, path, reason, digests, float(marker["created"]), version)


def _writer_gone(root: Path, partial: str) -> bool:
    """Whether the writer of the partial checkpoint ``step-N.partial-<host>-<pid>-<nonce>`` is
    gone (a killed save's leftover), never this process (its next save may be under way)."""
    host, _, pid = partial.partition(".partial-")[2].rpartition("-")[0].rpartition("-")
    if not (host and pid.isdigit()) or (host, int(pid)) == (socket.gethostname(), os.getpid()):
        return False
    return not saver_may_be_live(root, host, int(pid))


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _marker_document(info: CheckpointInfo) -> dict[str, Any]:
    document: dict[str, Any] = {
        "format": info.format,
        "step": info.step,
        "reason": info.reason,
        "created": info.created,
    }
    if info.format == LEGACY_FORMAT:
        [digest] = info.files.values()
        document.update(size=digest.size, crc32=digest.crc32)
    else:
        document["files"] = {name: dataclasses.asdict(digest) for name, digest in sorted(info.files.items())}
    return document
