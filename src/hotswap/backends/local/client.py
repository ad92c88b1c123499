"""The CLI side of a local cluster: queue a request, make sure a controller serves it, wait.

A request is a row in the cluster's database, committed before the controller is asked to
serve it, so nothing a user asked for is lost if the controller dies; the controller answers on
its Unix socket once the request's decision is committed. Reads (list, describe, logs) go to
the database directly and never need the controller.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any

from hotswap.api.errors import HotswapError
from hotswap.backends.local import protocol
from hotswap.backends.local.protocol import RequestKind
from hotswap.store.paths import ClusterPaths
from hotswap.store.state import Request, Store

CONTROLLER_START_TIMEOUT_S = 20.0


class ControllerUnavailable(HotswapError):
    """The cluster's controller could not be started."""


class ClusterBeingDeleted(HotswapError):
    """``cluster delete`` has stopped the cluster's controller for good."""

    exit_code = 4


def ping(paths: ClusterPaths, timeout: float = 2.0) -> int | None:
    """The controller's pid if one answers on the socket, else None."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout)
            connection.connect(str(paths.socket))
            connection.sendall(protocol.ping())
            reply = _read_message(connection)
    except (OSError, ValueError):
        return None
    return int(reply[protocol.PONG]) if reply and protocol.PONG in reply else None


def ensure_controller(paths: ClusterPaths, wait: bool = True) -> int | None:
    """Start the cluster's controller unless one answers already; return its pid.

    With ``wait=False`` (read-only commands) a missing controller is started in the background
    and the caller goes on at once.
    """
    pid = ping(paths)
    if pid is not None:
        return pid
    paths.root.mkdir(parents=True, exist_ok=True)
    with open(paths.controller_log, "ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", "hotswap.runtime.local_controller", str(paths.root)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env=os.environ.copy(),
        )
    if not wait:
        return None
    deadline = time.monotonic() + CONTROLLER_START_TIMEOUT_S
    # Start-up only: a short wait for the new daemon to bind its socket.
    while time.monotonic() < deadline:
        pid = ping(paths, timeout=1.0)
        if pid is not None:
            return pid
        time.sleep(0.02)
    raise ControllerUnavailable(
        f"the controller of cluster {paths.name} did not start; see {paths.controller_log}"
    )


def request(paths: ClusterPaths, kind: RequestKind, payload: dict[str, Any]) -> Request:
    """Queue a request and wait until the controller has committed its outcome."""
    kind = RequestKind(kind)  # an unknown kind fails here, before anything is queued
    store = Store.open(paths.database)
    try:
        if store.deleted():
            raise ClusterBeingDeleted(f"cluster {paths.name} is being deleted")
        request_id = store.submit(kind, payload, time.time())
        while True:
            found = store.request(request_id)
            assert found is not None
            if found.status != "pending":
                return found
            try:
                ensure_controller(paths)
            except ControllerUnavailable:
                # It may have served the request and exited (a shutdown) before answering.
                found = store.request(request_id)
                if found is not None and found.status != "pending":
                    return found
                raise
            # No answer means the controller went away first; the request is still queued in
            # the database, so the loop looks again and a new controller serves it.
            _wait(paths, request_id)
    finally:
        store.close()


def _wait(paths: ClusterPaths, request_id: int) -> dict[str, Any] | None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(paths.socket))
            connection.sendall(protocol.wait(request_id))
            return _read_message(connection)
    except OSError:
        return None


def _read_message(connection: socket.socket) -> dict[str, Any] | None:
    """The first message on the connection, None if it closes first."""
    reader = protocol.LineReader()
    while True:
        chunk = connection.recv(4096)
        if not chunk:
            return None
        for message in reader.feed(chunk):
            return message

