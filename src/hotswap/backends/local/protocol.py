"""What the CLI and a local cluster's controller say to each other, written down once for both.

A request is a row in the cluster's database (its kind is a :class:`RequestKind`, its payload
checked by :func:`check_payload` before the controller acts on it), committed before the
controller is asked to serve it. The controller's Unix socket carries only wake-ups and
answers, one JSON object per line of at most :data:`MAX_LINE_BYTES`:

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

from hotswap.api.errors import HotswapError
from hotswap.api.launch import Launch
from hotswap.api.limits import MAX_ARGUMENT_LENGTH, check_text
from hotswap.api.names import validate_workload_name
from hotswap.api.runs import is_run_id

# The controller's daemon, as the CLI starts it: ``python -m CONTROLLER_MODULE <cluster-dir>``
# (named, not imported: the CLI's side never loads the controller).
CONTROLLER_MODULE = "hotswap.backends.local.controller.entry"

PING = "ping"
PONG = "pong"
WAIT = "wait"
ERROR = "error"
MAX_LINE_BYTES = 4096  # every message is far shorter
MAX_REQUEST_ID = 2**63 - 1  # SQLite's INTEGER
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


class RequestKind(enum.StrEnum):
    """The kinds of requests; the comment shows each one's payload."""

    CREATE = "create"  # {"spec": the WorkloadSpec as JSON, "launch": the launch record}
    DELETE = "delete"  # {"workload": name}
    NODE = "node"  # {"op": a NodeOperation, "nodes": [node names]}
    RESIZE = "resize"  # {"num_slices": N, and optionally "warm_workers", "warm_preload", "hotswap", "zygote"}
    SHUTDOWN = "shutdown"  # {}: stop every worker, then the controller (``cluster delete``)


class NodeOperation(enum.StrEnum):
    """A fault or a repair of a node (``hotswap node fail|drain|cordon|uncordon``)."""

    FAIL = "fail"
    DRAIN = "drain"
    CORDON = "cordon"
    UNCORDON = "uncordon"


class ProtocolError(ValueError):
    """A line, or a request row, that does not follow this protocol."""


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


# ---------------------------------------------------------------------- request payloads


def check_payload(kind: str, payload: dict[str, Any] | None) -> RequestKind:
    """The kind of a request row whose payload has the shape its kind needs; ProtocolError,
    with the reason, for anything else (a row written by something other than this CLI)."""
    try:
        request_kind = RequestKind(kind)
    except ValueError:
        raise ProtocolError(f"unknown request kind {str(kind)[:40]!r}") from None
    if payload is None:
        raise ProtocolError("its payload is not a JSON object")
    try:
        _CHECKS[request_kind](payload)
    except (KeyError, TypeError, ValueError, HotswapError) as problem:
        reason = f"no {problem} field" if isinstance(problem, KeyError) else str(problem)
        raise ProtocolError(f"malformed {request_kind.value} request: {str(reason)[:200]}") from None
    return request_kind


def _strings(value: Any, what: str) -> None:
    """A JSON object of strings with no NUL (which no process environment can hold)."""
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not an object")
    for key, item in value.items():
        if not isinstance(item, str) or "\0" in key or "\0" in item or "=" in key or not key:
            raise ValueError(f"{what} holds a variable that no environment can hold: {key[:40]!r}")


def _check_create(payload: dict[str, Any]) -> None:
    if not isinstance(payload["spec"], dict):
        raise ValueError("spec is not an object")
    launch = payload["launch"]
    if not isinstance(launch, dict):
        raise ValueError("launch is not an object")
    _strings(launch["environ"], "the environment")
    _strings(launch.get("user_env", {}), "the user's environment")  # an earlier release's record
    for key in ("cwd", "checkpoint_dir"):
        if not isinstance(launch[key], str) or "\0" in launch[key]:
            raise ValueError(f"{key} is not a path")
    run = launch.get("run")
    if run is not None:
        if not isinstance(run, dict) or not isinstance(run.get("id"), str) or not is_run_id(run["id"]):
            raise ValueError("run is not a run")
        resume_from = run.get("resume_from", "")
        if not isinstance(resume_from, str) or "\0" in resume_from:
            raise ValueError("the run's resume_from is not a path")
    Launch.from_dict(launch)  # what the controller reads it as


def _check_delete(payload: dict[str, Any]) -> None:
    validate_workload_name(payload["workload"])


def _check_node(payload: dict[str, Any]) -> None:
    NodeOperation(payload["op"])
    nodes = payload["nodes"]
    if not isinstance(nodes, list) or not 1 <= len(nodes) <= MAX_NODES_PER_REQUEST:
        raise ValueError("nodes is not a list of node names")
    for node in nodes:
        if not isinstance(node, str):
            raise ValueError("nodes is not a list of node names")
        check_text("a node name", node, MAX_ARGUMENT_LENGTH)


def _check_resize(payload: dict[str, Any]) -> None:
    _integer(payload["num_slices"], "num_slices", 1, MAX_LOCAL_SLICES)
    if "warm_workers" in payload:
        _integer(payload["warm_workers"], "warm_workers", 0, MAX_WARM_WORKERS)
    preload = payload.get("warm_preload")
    if preload is not None and not (isinstance(preload, list) and all(isinstance(m, str) for m in preload)):
        raise ValueError("warm_preload is not a list of module names")
    if "hotswap" in payload and not isinstance(payload["hotswap"], bool):
        raise ValueError("hotswap is not true or false")
    if "zygote" in payload and not isinstance(payload["zygote"], bool):
        raise ValueError("zygote is not true or false")
    gpus = payload.get("gpus")
    if gpus is not None:
        fields = {"index": int, "uuid": str}
        if not isinstance(gpus, list) or not all(
            isinstance(g, dict) and all(isinstance(g.get(k), t) and not isinstance(g.get(k), bool) for k, t in fields.items())
            for g in gpus
        ):
            raise ValueError("gpus is not a list of GPUs (index, uuid)")


def _integer(value: Any, what: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} must be an integer from {low} to {high}")


_CHECKS = {
    RequestKind.CREATE: _check_create,
    RequestKind.DELETE: _check_delete,
    RequestKind.NODE: _check_node,
    RequestKind.RESIZE: _check_resize,
    RequestKind.SHUTDOWN: lambda payload: None,
}
