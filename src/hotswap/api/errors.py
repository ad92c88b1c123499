"""Errors a user can cause. Each carries one line that says what is wrong and what to do.

The CLI prints ``str(error)`` on stderr and exits with ``error.exit_code``; no layer below the
CLI ever exits the process.
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
