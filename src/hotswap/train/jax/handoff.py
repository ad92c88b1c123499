"""A survivor's state across the restart of its own process.

Multi-controller JAX cannot change its process count in place, so a worker that moves to a new
membership generation replaces itself: it writes a :class:`Handoff` (its shards of the state,
the data positions and the counters, on the host) into an anonymous in-memory file, and
``exec``s its own command line. The process keeps its pid, its log and its place with the
supervisor (no restart is counted anywhere); the new program finds the handoff through
:data:`HANDOFF_FD`, joins the new generation and continues from the state it held. Nothing
touches the disk.

SIGTERM is blocked across the ``exec`` (the signal mask survives it, handlers do not): one that
arrives meanwhile stays pending until the new program has installed its handler.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from typing import Any, BinaryIO, NoReturn, Protocol

HANDOFF_FD = "HOTSWAP_JAX_HANDOFF_FD"  # between a process and its own next program only

# The directory the program started in: a script given by a relative path is found again even
# if the program changed directory since.
START_DIR = os.getcwd()


@dataclasses.dataclass(frozen=True)
class MembershipChange:
    """A move to a new generation, begun in the previous program, finished in the next."""

    after_generation: int  # the new program joins a generation newer than this one
    previous_slices: int | None  # None: the process had not joined any generation yet
    started: float  # time.monotonic() when the change began (system-wide on Linux)
    failed: bool  # caused by a lost peer, not by a published membership
    timed_out: bool | None = None  # the lost peer was noticed only at a collective's timeout (None: not known)


@dataclasses.dataclass(frozen=True)
class Handoff:
    change: MembershipChange
    counters: dict[str, int] | None  # the progress counters, None when no state is held
    shards: list[dict[tuple[tuple[int, int], ...], Any]] | None  # per leaf: index -> host array
    leaves: list[str] | None  # the state's leaf paths, to check the next program's tree against
    objects: dict[str, Any] | None  # registered objects' state_dict()s
    attempts: int = 0  # elastic retries so far (pathwaysutils' retry policy counts them)
    service: tuple[int, int] | None = None  # (port, pid): a coordination service started ahead


def restart(handoff: Handoff) -> NoReturn:
    """Replace this process's program by a fresh run of its own command line, handing it
    ``handoff``."""
    blocked = {signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    fd = write(handoff)
    os.set_inheritable(fd, True)
    env = dict(os.environ)
    env[HANDOFF_FD] = str(fd)
    flush_streams()
    try:
        os.chdir(START_DIR)
        os.execve(sys.executable, command_line(), env)
    except OSError:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
        raise


_written: list[BinaryIO] = []  # the handoff files written, open until the program is replaced


def write(handoff: Handoff) -> int:
    """The handoff in an anonymous in-memory file: its descriptor, at offset 0."""
    handle = _anonymous_file()
    pickle.dump(handoff, handle, protocol=pickle.HIGHEST_PROTOCOL)
    handle.flush()
    handle.seek(0)
    _written.append(handle)
    return handle.fileno()


def flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def command_line() -> list[str]:
    """This program's command line, rebuilt from what runs as ``__main__`` (not from the
    interpreter's own argv: a warm spare worker runs the script inside another program)."""
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:  # python -m package.module
        program = ["-m", spec.name.removesuffix(".__main__")]
    else:
        program = [os.path.join(START_DIR, sys.argv[0])]
    return [sys.executable, *subprocess._args_from_interpreter_flags(), *program, *sys.argv[1:]]


class Pending(Protocol):
    """A handoff still to come (a successor run ahead: :mod:`.successor`)."""

    preview: Handoff  # what is known before: the move, the retries, the service started ahead

    def wait(self) -> Handoff: ...


_held: list[Handoff | Pending] = []  # what a successor received, or will, before its script runs


def hold(handoff: Handoff | Pending) -> None:
    """Keep ``handoff`` for :func:`take` (a successor receives it, or learns it will, before
    it runs the script)."""
    _held.append(handoff)


def take() -> Handoff | Pending | None:
    """The handoff left by this process's previous program (once), or None in a fresh process."""
    if _held:
        return _held.pop()
    value = os.environ.pop(HANDOFF_FD, None)
    return read(int(value)) if value else None


def read(fd: int) -> Handoff:
    """The handoff in the file open at ``fd`` (closed after)."""
    with os.fdopen(fd, "rb") as handle:
        handoff = pickle.load(handle)
    if not isinstance(handoff, Handoff):
        raise TypeError("the handoff's file holds no hotswap handoff")
    return handoff


def _anonymous_file() -> BinaryIO:
    """A file in memory that disappears with the last process holding it."""
    if hasattr(os, "memfd_create"):
        return os.fdopen(os.memfd_create("hotswap-handoff"), "w+b")
    return tempfile.TemporaryFile()  # unlinked already (macOS: no memfd)
