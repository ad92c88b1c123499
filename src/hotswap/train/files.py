"""Checkpoint files that only this user can have written, and the checksum they carry.

The SDK creates checkpoint directories ``0700`` and files ``0600``, refuses a directory that
another user owns or that others may write (they could plant a checkpoint), and opens a
checkpoint's files only if they are regular files of this user (never through a link).

Two exceptions keep shared storage usable: root may own the directory (a mount point; root can
act as any user anyway), and a directory writable by a group this process belongs to is
accepted (a team's directory, or a Kubernetes volume mounted with ``fsGroup``, whose kubelet
makes it group-writable on every mount). Members of that group could place a checkpoint there;
it would restore as data, never as code (``codec.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import stat
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path

try:  # the same CRC-32 as zlib's, about ten times faster (PCLMUL); optional: pip install isal
    from isal.isal_zlib import crc32 as _fast_crc32
except ImportError:
    _fast_crc32 = None

crc32: Callable[..., int] = _fast_crc32 or zlib.crc32
"""CRC-32 (zlib's polynomial) of a buffer, continuing from a previous value."""

log = logging.getLogger("hotswap.train")

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# Where damaged checkpoints are moved, inside the checkpoint directory: kept for inspection,
# never read again, and out of the way of a later save of the same step.
DAMAGED_DIR = "damaged"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class CheckpointDirectoryRefused(PermissionError):
    """The checkpoint directory could hold files written by someone else (one-line message)."""


class CheckpointDamaged(Exception):
    """A committed checkpoint that cannot be used; the message says why, in one line."""


class FreshStartRefused(Exception):
    """No usable checkpoint is left, but damaged ones were set aside, and the user did not allow
    a fresh start (HOTSWAP_ALLOW_FRESH_START): starting from step 0 would silently lose the
    steps. The message is one line; the worker exits with CHECKPOINTS_UNUSABLE_EXIT_CODE."""


def set_aside(path: Path, why: str) -> Path | None:
    """Move the damaged checkpoint ``path`` into the ``damaged`` directory beside it, with one
    warning naming it and why; where it went (None when it was gone already, or could not be
    moved: then it is only skipped)."""
    aside = path.parent / DAMAGED_DIR
    target = aside / f"{path.name}-{uuid.uuid4().hex[:8]}"
    try:
        aside.mkdir(mode=0o700, exist_ok=True)
        os.rename(path, target)
    except FileNotFoundError:
        return None  # another reader moved it, or a writer's prune removed it
    except OSError as error:
        log.warning("hotswap: skipping damaged checkpoint %s: %s (it cannot be moved aside: %s)", path, why, error.strerror)
        return None
    log.warning("hotswap: damaged checkpoint %s: %s; moved to %s (kept for inspection, never read again)", path, why, target)
    return target


def not_a_directory(path: Path) -> str | None:
    """Why a checkpoint step's name is no directory of its own (a symbolic link: its contents
    would be read from, and saved to, wherever it points), or None (a directory, or nothing)."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(status.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"it is a symbolic link (to {target[:120]}), not a directory of its own"
    return None if stat.S_ISDIR(status.st_mode) else "it is not a directory"


def damaged_checkpoints(root: Path) -> list[Path]:
    """What :func:`set_aside` moved out of the checkpoint directory ``root``, by name."""
    try:
        return sorted(Path(entry.path) for entry in os.scandir(root / DAMAGED_DIR))
    except (FileNotFoundError, NotADirectoryError):
        return []


def fresh_start_refusal(roots: list[Path], allowed: bool) -> FreshStartRefused | None:
    """Why a worker that found no usable checkpoint in ``roots`` must not start from step 0
    (damaged ones were set aside there and the user did not allow it), or None."""
    damaged = [path for root in roots for path in damaged_checkpoints(root)]
    if allowed or not damaged:
        return None
    return FreshStartRefused(
        f"hotswap: no usable checkpoint: {len(damaged)} damaged one(s) were set aside in "
        f"{damaged[-1].parent} (newest: {damaged[-1].name}); refusing to start again from step 0 and lose "
        "their steps: repair or restore a checkpoint, or set HOTSWAP_ALLOW_FRESH_START=1 "
        "(workload create --env HOTSWAP_ALLOW_FRESH_START=1) to start over"
    )


class FinalSaveFailed(Exception):
    """The checkpoint after the last step could not be written: the run's steps would be lost
    while it exited 0. One line; the worker exits with CHECKPOINTS_UNUSABLE_EXIT_CODE."""


@dataclasses.dataclass(frozen=True)
class FileDigest:
    size: int
    crc32: int


def write_file_durably(path: Path, data: bytes) -> FileDigest:
    """A new file (owner-only) holding ``data``, fsynced; its digest."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return FileDigest(len(data), crc32(data, 0))


def open_no_follow(path: Path) -> int:
    """A descriptor for reading ``path``, which must not be a symbolic link (ELOOP if it is)."""
    return os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)


def open_checkpoint_file(path: Path, size: int) -> int:
    """A descriptor of the checkpoint file ``path`` for reading; CheckpointDamaged unless it is
    a regular file of this user (not a link) with ``size`` bytes."""
    try:
        fd = open_no_follow(path)
    except FileNotFoundError:
        raise CheckpointDamaged(f"its file {path.name} is missing") from None
    except OSError as error:
        raise CheckpointDamaged(f"its file {path.name} cannot be opened ({error.strerror})") from None
    problem = file_problem(os.fstat(fd), size)
    if problem:
        os.close(fd)
        raise CheckpointDamaged(f"its file {path.name} {problem}")
    return fd


def file_problem(status: os.stat_result, size: int | None) -> str | None:
    """Why a checkpoint file cannot be trusted or used (not a regular file, another user's,
    not ``size`` bytes), or None."""
    if not stat.S_ISREG(status.st_mode):
        return "is not a regular file"
    if status.st_uid not in (os.geteuid(), 0):
        return f"is owned by uid {status.st_uid}, not by this user (uid {os.geteuid()})"
    if size is not None and status.st_size != size:
        return f"has {status.st_size} bytes, the marker says {size}"
    return None


def prepare_directory(root: Path) -> None:
    """Create ``root`` and its missing parents owner-only, or check that the existing one
    belongs to this user and is writable by nobody else (CheckpointDirectoryRefused)."""
    missing = []
    current = root
    while not os.path.lexists(current) and current != current.parent:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            pass  # another rank made it first
    try:
        status = os.stat(root)
    except OSError as error:
        raise CheckpointDirectoryRefused(f"checkpoint directory {root}: {error.strerror}") from None
    refusal = None
    if not stat.S_ISDIR(status.st_mode):
        refusal = "it is not a directory"
    elif status.st_uid not in (os.geteuid(), 0):
        refusal = (
            f"it is owned by uid {status.st_uid}, not by this user (uid {os.geteuid()}); "
            "use a directory of your own"
        )
    elif _writable_by_strangers(status):
        foreign_group = status.st_mode & stat.S_IWGRP and not _our_group(status.st_gid)
        who = " and ".join(
            w for w, bit in (("group", stat.S_IWGRP if foreign_group else 0), ("others", stat.S_IWOTH)) if status.st_mode & bit
        )
        refusal = (
            f"it is writable by {who} (mode {stat.S_IMODE(status.st_mode):04o}), who could plant a "
            f"checkpoint; make it private (chmod go-w {root}) or use another directory"
        )
    if refusal:
        raise CheckpointDirectoryRefused(f"refusing checkpoint directory {root}: {refusal}")


def _our_group(gid: int) -> bool:
    return gid == os.getegid() or gid in os.getgroups()


def _writable_by_strangers(status: os.stat_result) -> bool:
    """Others may write, or a group this process is not in."""
    if status.st_mode & stat.S_IWOTH:
        return True
    return bool(status.st_mode & stat.S_IWGRP) and not _our_group(status.st_gid)
