"""Errors a user can cause. Each carries one line that says what is wrong and what to do.

The CLI prints ``str(error)`` on stderr and exits with ``error.exit_code``; no layer below the
CLI ever exits the process. :data:`EXIT_CODES` is the whole set of exit codes of ``hotswap``.
"""

from __future__ import annotations


class HotswapError(Exception):
    """Base class of every error hotswap reports to a user."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidInputError(HotswapError):
    """A name, flag value or file the user gave is malformed."""

    exit_code = 2


class NotFoundError(HotswapError):
    """The named cluster, workload, node or slice does not exist."""

    exit_code = 3


class ConflictError(HotswapError):
    """The request clashes with existing state (a duplicate name, an illegal transition)."""

    exit_code = 4


class CapacityError(HotswapError):
    """The request can never be satisfied by the cluster (more slices than it has)."""

    exit_code = 5


def never_fits(num_slices: int, device_type: str, have: int) -> str | None:
    """Why a workload of ``num_slices`` slices can never run on a cluster with ``have`` slices of
    its ``device_type`` (None: it can). The one wording of a capacity refusal, for the core and
    both backends' checks, which raise it as a :class:`CapacityError` (exit 5)."""
    if have >= num_slices:
        return None
    where = f"only {have}" if have else "none"
    return f"it needs {num_slices} slice(s) of {device_type} and the cluster has {where}; it could never run"


class StateError(HotswapError):
    """The machine refused: hotswap's state cannot be read or written (a full disk, a read-only
    or foreign state directory, a corrupt or locked database). Nothing was changed."""

    exit_code = 6


class Declined(HotswapError):
    """The user answered no to a prompt: nothing was changed, and that is not a failure (exit 0;
    the message is printed as it is, without ``error:``)."""

    exit_code = 0


class UsageError(HotswapError):
    """The command line itself is wrong: an unknown command or flag, a missing or malformed value."""

    exit_code = 2


class UnreachableError(HotswapError):
    """The Kubernetes API server could not be reached (the local backend's controller that
    cannot be started is exit 1)."""

    exit_code = 7


EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT


class WaitTimeoutError(HotswapError):
    """``--wait`` gave up: the awaited state did not come within ``--timeout`` (xpk's and
    timeout(1)'s code). The command itself was done; only the waiting stopped."""

    exit_code = 124


class WorkloadFailedError(HotswapError):
    """``--wait`` saw the workload fail instead of reaching the awaited state (xpk's code for a
    workload that did not complete successfully)."""

    exit_code = 125


# Every exit code of the ``hotswap`` command (scripts may rely on them).
EXIT_CODES = {
    0: "success",
    1: "failed: the controller could not be reached, or a drill's check failed",
    InvalidInputError.exit_code: "invalid input: a malformed name, flag, value or file (usage errors too)",
    NotFoundError.exit_code: "not found: no such cluster, workload, node or slice",
    ConflictError.exit_code: "conflict: a duplicate name, a cluster being deleted, a refused request",
    CapacityError.exit_code: "capacity: more slices than the cluster has (a workload that could never run)",
    StateError.exit_code: "state: hotswap's state directory or database cannot be used (disk, permissions), or the Kubernetes API server refused hotswap's credentials",
    UnreachableError.exit_code: "unreachable: the Kubernetes API server could not be reached",
    WaitTimeoutError.exit_code: "timed out: --wait did not see the awaited state within --timeout",
    WorkloadFailedError.exit_code: "the awaited workload failed (--wait), or a worker failed before all had started",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
