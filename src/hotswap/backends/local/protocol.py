"""What the CLI and a local cluster's controller say to each other on its socket, written down
once for both.

A request is a row in the cluster's database (its record is one of ``requests.py``'s),
committed before the controller is asked to serve it. The controller's Unix socket carries only
wake-ups and answers, one JSON object per line of at most :data:`MAX_LINE_BYTES`:

    {"ping": true}          -> {"pong": <controller pid>}
    {"wait": <request id>}  -> {"id": <request id>, "status": "done" | "rejected" | "fault",
                               "message": ...} once the request's outcome is committed;
                               "failed" when the controller could not commit one (the request
                               is still queued)
    anything else           -> {"error": <why>}; the connection goes on
    a longer line           -> {"error": <why>}; the connection is closed

Socket input is not trusted: a malformed line gets an error answer, never an exception.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator
from typing import Any

# The controller's daemon, as the CLI starts it: ``python -m CONTROLLER_MODULE <cluster-dir>``
# (named, not imported: the CLI's side never loads the controller).
CONTROLLER_MODULE = "hotswap.backends.local.controller.entry"

PING = "ping"
PONG = "pong"
WAIT = "wait"
ERROR = "error"
MAX_LINE_BYTES = 4096  # every message is far shorter
MAX_REQUEST_ID = 2**63 - 1  # SQLite's INTEGER
# Bounds of what a request asks (``requests.py`` checks them; the CLI says them first).
MAX_LOCAL_SLICES = 1024
MAX_WARM_WORKERS = 64
MAX_NODES_PER_REQUEST = MAX_LOCAL_SLICES * 64

# Outcomes of a request. The first three are committed; FAILED is an answer only.
DONE = "done"
REJECTED = "rejected"  # refused: what it asked for is not possible
FAULT = "fault"  # refused: the machine failed the controller (a full disk); nothing changed
FAILED = "failed"  # not decided: the controller could not even commit a refusal


class ControllerExit(enum.IntEnum):
    """Exit codes of a controller process (``python -m hotswap.backends.local.controller.entry``),
    which the CLI that started it reads."""

    STOPPED = 0  # stopped by a signal, or finished deleting the cluster
    FAILED = 1  # could not serve the cluster: the last line of its log says why
    HELD = 3  # another controller holds the cluster (it was asked to listen again)
    GONE = 4  # there is no such cluster (any more)


class ProtocolError(ValueError):
    """A line, or a request row (``requests.parse``), that does not follow this protocol."""


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message) + "\n").encode()


def ping() -> bytes:
    return encode({PING: True})


def pong(pid: int) -> bytes:
    return encode({PONG: pid})


def wait(request_id: int) -> bytes:
    return encode({WAIT: request_id})


def outcome(request_id: int, status: str, message: str) -> bytes:
    return encode({"id": request_id, "status": status, "message": message})


def error(reason: str) -> bytes:
    return encode({ERROR: reason})


class LineTooLong(ProtocolError):
    """More than :data:`MAX_LINE_BYTES` without a newline: the stream cannot be trusted further."""


class LineReader:
    """Messages out of a byte stream that arrives in pieces of any size."""

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self.buffer = b""
        self.max_line = max_line

    def feed(self, data: bytes) -> Iterator[dict[str, Any] | ProtocolError]:
        """Each complete line of what has arrived so far, in order: its message, or a
        :class:`ProtocolError` for a line that is not one JSON object. Raises
        :class:`LineTooLong` once a line exceeds the limit (what came before is yielded)."""
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            if len(line) > self.max_line:
                raise LineTooLong(f"a line longer than {self.max_line} bytes")
            yield decode(line)
        if len(self.buffer) > self.max_line:
            raise LineTooLong(f"a line longer than {self.max_line} bytes")


def decode(line: bytes) -> dict[str, Any] | ProtocolError:
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as problem:  # bad JSON, bad UTF-8, absurd nesting or digits
        return ProtocolError(f"not JSON: {str(problem)[:80]}")
    if not isinstance(message, dict):
        return ProtocolError(f"not a JSON object: {line[:40]!r}")
    return message


def request_id_of(message: dict[str, Any]) -> int:
    """The request id of a ``wait`` message (ProtocolError unless a positive 64-bit integer)."""
    value = message.get(WAIT)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REQUEST_ID:
        raise ProtocolError(f"wait needs a request id from 1 to {MAX_REQUEST_ID}")
    return value
