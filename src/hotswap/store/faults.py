"""Faults of the machine under hotswap's state, as one line that says what happened and what
to do: a full disk, a read-only or foreign state directory, a corrupt or locked database.

SQLite and the operating system report these as exceptions deep in a call; :func:`explain`
turns one into a :class:`~hotswap.api.errors.StateError` (the CLI prints it; the controller
answers a request with it and logs it). Everything hotswap writes is written in transactions,
so a fault leaves the state as it was: the line says so.
"""

from __future__ import annotations

import errno
import sqlite3
import sys
import traceback
from pathlib import Path

from hotswap.api.errors import StateError

# Kinds of fault, from SQLite's extended result code names (Python >= 3.11) or, failing that,
# from the words of its message.
_SQLITE_KINDS = (
    ("full", ("SQLITE_FULL",), ("disk is full",)),
    ("read-only", ("SQLITE_READONLY",), ("readonly database",)),
    ("corrupt", ("SQLITE_CORRUPT", "SQLITE_NOTADB"), ("malformed", "not a database")),
    ("locked", ("SQLITE_BUSY", "SQLITE_LOCKED"), ("database is locked", "database table is locked")),
    ("cannot-open", ("SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH"), ("unable to open",)),
)
_ERRNO_KINDS = {
    errno.ENOSPC: "full",
    errno.EDQUOT: "full",
    errno.EROFS: "read-only",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
}

DATABASE_ATTRIBUTE = "hotswap_database"  # set on an sqlite3.Error by the store's connection


class CorruptState(StateError):
    """A row of the database that hotswap cannot read back (SQLite itself found no fault)."""


def is_fault(error: BaseException) -> bool:
    """Whether ``error`` is a fault of the machine (storage or permissions), not a bug."""
    return isinstance(error, (sqlite3.Error, OSError)) and kind_of(error) != "bug"


def unreadable(error: BaseException) -> bool:
    """Whether ``error`` says a cluster's database cannot be read back (corrupt, or without
    the cluster's record): nothing in it can be trusted, the cluster can only be removed."""
    return isinstance(error, LookupError) or kind_of(error) == "corrupt"


def kind_of(error: BaseException) -> str:
    if isinstance(error, CorruptState):
        return "corrupt"
    if isinstance(error, sqlite3.Error):
        name = getattr(error, "sqlite_errorname", "") or ""
        text = str(error).lower()
        for kind, names, words in _SQLITE_KINDS:
            if any(name.startswith(n) for n in names) or any(w in text for w in words):
                return kind
        return "io" if name.startswith("SQLITE_IOERR") or "disk i/o" in text else "bug"
    if isinstance(error, OSError):
        return _ERRNO_KINDS.get(error.errno or 0, "io")
    return "bug"


def explain(error: BaseException, state_dir: Path | None = None) -> StateError:
    """One line for a fault: what happened (and where), then what to do."""
    kind = kind_of(error)
    where = _where(error, state_dir)
    detail = _detail(error)
    if isinstance(error, OSError) and error.filename is not None and not _inside(where, state_dir):
        return StateError(f"cannot use {where} ({detail})")  # a file of the user's, not our state
    if kind == "full":
        return StateError(f"the disk holding {where} is full ({detail}); nothing was changed: free some space and retry")
    if kind == "read-only":
        return StateError(
            f"{where} is read-only ({detail}); nothing was changed: reads (list, describe, logs) still"
            " work; make it writable to change anything"
        )
    if kind == "corrupt":
        return StateError(
            f"the database {where} is corrupt ({detail}); nothing was changed: restore it from a"
            " backup, or remove the cluster with `hotswap cluster delete`"
        )
    if kind == "locked":
        return StateError(
            f"the database {where} is locked by another process ({detail}); nothing was changed:"
            " close whatever holds it open (a sqlite3 shell?) and retry"
        )
    if kind in ("permission", "cannot-open"):
        return StateError(
            f"cannot open {where} ({detail}); nothing was changed: hotswap's state must belong to"
            " you and be writable by you (set $HOTSWAP_HOME to a directory of yours)"
        )
    return StateError(f"cannot use {where} ({detail}); nothing was changed: check the disk and retry")


def _where(error: BaseException, state_dir: Path | None) -> str:
    database = getattr(error, DATABASE_ATTRIBUTE, None)
    if database is not None:
        return str(database)
    if isinstance(error, OSError) and error.filename is not None:
        return str(error.filename)
    return f"the state directory {state_dir}" if state_dir is not None else "hotswap's state directory"


def log(message: str | None = None) -> None:
    """A line (without one: the exception being handled) on stderr, a daemon's log. A log
    that cannot be written (the disk is full) is skipped: it must never stop the daemon too."""
    try:
        if message is None:
            traceback.print_exc()
        else:
            print(message, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _inside(path: str, state_dir: Path | None) -> bool:
    return state_dir is not None and Path(path).is_relative_to(state_dir)


def _detail(error: BaseException) -> str:
    if isinstance(error, OSError):
        return error.strerror or error.__class__.__name__
    text = str(error).splitlines()[0] if str(error) else error.__class__.__name__
    return text[:200]
