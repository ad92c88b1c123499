"""What the CLI and a local cluster's controller say to each other, written down once for both.

A request is a row in the cluster's database (its kind is a :class:`RequestKind`), committed
before the controller is asked to serve it. The controller's Unix socket carries only wake-ups
and answers, one JSON object per line:

    {"ping": true}          -> {"pong": <controller pid>}
    {"wait": <request id>}  -> {"id": <request id>, "status": "done" | "rejected", "message": ...}
                               once the request's outcome is committed
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator
from typing import Any

PING = "ping"
PONG = "pong"
WAIT = "wait"


class RequestKind(enum.StrEnum):
    """The kinds of requests; the comment shows each one's payload."""

    CREATE = "create"  # {"spec": the WorkloadSpec as JSON, "launch": the launch record}
    DELETE = "delete"  # {"workload": name}
    NODE = "node"  # {"op": a NodeOperation, "nodes": [node names]}
    RESIZE = "resize"  # {"num_slices": N, and optionally "warm_workers", "warm_preload", "hotswap"}
    SHUTDOWN = "shutdown"  # {}: stop every worker, then the controller (``cluster delete``)


class NodeOperation(enum.StrEnum):
    """A fault or a repair of a node (``hotswap node fail|drain|cordon|uncordon``)."""

    FAIL = "fail"
    DRAIN = "drain"
    CORDON = "cordon"
    UNCORDON = "uncordon"


class ProtocolError(ValueError):
    """A line that is not one JSON object: the other side does not speak this protocol."""


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


class LineReader:
    """Messages out of a byte stream that arrives in pieces of any size."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        """Each complete message in what has arrived so far, in order; :class:`ProtocolError`
        at the first line that is not a JSON object."""
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            try:
                message = json.loads(line)
            except json.JSONDecodeError as error:
                raise ProtocolError(str(error)) from None
            if not isinstance(message, dict):
                raise ProtocolError(f"not a JSON object: {line[:80]!r}")
            yield message
