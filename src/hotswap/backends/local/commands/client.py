"""The CLI side of a local cluster: queue a request, make sure a controller serves it, wait.

A request is a row in the cluster's database, committed before the controller is asked to
serve it, so nothing a user asked for is lost if the controller dies; the controller answers on
its Unix socket once the request's decision is committed. Reads (list, describe, logs) go to
the database directly and never need the controller.

What the CLI says always matches what happened: it reports a request's committed outcome, and
when it gives up on one (no controller could be started, Ctrl-C, the controller could not
commit) it first withdraws the request (a conditional update, serialized with the controller's
own commits), so "nothing was changed" is true when it says so, and a request served meanwhile
is reported as served.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from hotswap.api.errors import EXIT_INTERRUPTED, ConflictError, HotswapError, NotFoundError, StateError
from hotswap.backends.local import protocol
from hotswap.backends.local.claim import AlreadyClaimed, Claim
from hotswap.store import faults
from hotswap.store.paths import ClusterPaths, new_dirs_private, open_private
from hotswap.backends.local.tables import LocalStore, Request

if TYPE_CHECKING:  # the records load only where a request is made (see requests.py)
    from hotswap.backends.local.requests import LocalRequest

CONTROLLER_START_TIMEOUT_S = 20.0  # for a controller to answer once nothing stops it any more
CONTROLLER_BUSY_TIMEOUT_S = 300.0  # for a controller process that lives but does not answer yet
MAX_STARTS = 5  # controllers started for one request (each may be killed before it answers)


class ControllerUnavailable(HotswapError):
    """The cluster's controller could not be started."""


class ClusterBeingDeleted(HotswapError):
    """``cluster delete`` has begun on the cluster."""

    exit_code = ConflictError.exit_code


class Interrupted(HotswapError):
    """The user interrupted a command that was waiting for the controller."""

    exit_code = EXIT_INTERRUPTED


def being_deleted(paths: ClusterPaths) -> ClusterBeingDeleted:
    return ClusterBeingDeleted(
        f"cluster {paths.name} is being deleted; run `hotswap cluster delete --cluster {paths.name}` to finish"
    )


def ping(paths: ClusterPaths, timeout: float = 2.0) -> int | None:
    """The controller's pid if one answers on the socket, else None."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection, paths.socket_address() as address:
            connection.settimeout(timeout)
            connection.connect(address)
            connection.sendall(protocol.ping())
            reply = _read_message(connection)
    except (OSError, ValueError):
        return None
    pid = reply.get(protocol.PONG) if reply else None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else None


def wake_controller(paths: ClusterPaths) -> None:
    """Start the cluster's controller in the background unless one answers, and go on at once
    (quietly when it cannot be started: a read-only state directory)."""
    if ping(paths) is None:
        with contextlib.suppress(OSError):
            _start(paths)


def ensure_controller(paths: ClusterPaths) -> int:
    """Start the cluster's controller unless one answers already; return its pid."""
    pid = ping(paths)
    if pid is not None:
        return pid
    for _ in range(MAX_STARTS):
        pid = _start_and_wait(paths)
        if pid is not None:
            return pid
    raise ControllerUnavailable(
        f"the controller of cluster {paths.name} was started {MAX_STARTS} times and stopped each time"
        f" before it answered; see {paths.controller_log}"
    )


def _start(paths: ClusterPaths) -> subprocess.Popen[bytes]:
    new_dirs_private(paths.root)
    log = open_private(paths.controller_log)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", protocol.CONTROLLER_MODULE, str(paths.root)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env=os.environ.copy(),
        )
    finally:
        os.close(log)


def _start_and_wait(paths: ClusterPaths) -> int | None:
    """Start a controller and wait for the cluster's controller to answer: the new one, or the
    one already holding the cluster (which the new one wakes). None if the new one was killed
    before anyone answered (the caller starts another)."""
    process = _start(paths)
    started = time.monotonic()
    ended_at: float | None = None
    while True:
        pid = ping(paths, timeout=1.0)
        if pid is not None:
            return pid
        code = process.poll()
        now = time.monotonic()
        if code is None:
            if now - started > CONTROLLER_BUSY_TIMEOUT_S:
                raise ControllerUnavailable(
                    f"the controller of cluster {paths.name} (pid {process.pid}) has not answered for"
                    f" {CONTROLLER_BUSY_TIMEOUT_S:.0f}s; see {paths.controller_log}"
                )
        elif code == protocol.ControllerExit.HELD and paths.database.exists():
            # Another controller holds the cluster and was asked to listen again; give it time,
            # unless it has gone meanwhile (then nobody will ever answer: start another) or the
            # cluster is being deleted (then it only stops workers and exits, serving nothing).
            if _deleted(paths):
                raise _gone(paths)
            if not _held(paths):
                return None
            ended_at = ended_at or now
            if now - ended_at > CONTROLLER_START_TIMEOUT_S:
                raise ControllerUnavailable(
                    f"the controller of cluster {paths.name} (pid {paths.controller_pid()}) holds the cluster"
                    f" but does not answer; see {paths.controller_log}"
                )
        elif code in (protocol.ControllerExit.HELD, protocol.ControllerExit.GONE, protocol.ControllerExit.STOPPED) and _deleted(paths):
            raise _gone(paths)
        elif code < 0:
            return None  # killed by a signal before it answered
        else:
            raise ControllerUnavailable(f"the controller of cluster {paths.name} stopped: {_last_line(paths)}")
        time.sleep(0.02)  # start-up only: a short wait for the new daemon to bind its socket


def _held(paths: ClusterPaths) -> bool:
    """Whether a controller still holds the cluster's lock (a probe: taken and let go at once)."""
    try:
        Claim.take(paths).release()
    except AlreadyClaimed:
        return True
    except FileNotFoundError:
        return False
    return False


def _deleted(paths: ClusterPaths) -> bool:
    """Whether the cluster is gone or being deleted (a controller then exits at once)."""
    try:
        with LocalStore.open(paths.database) as store:
            return store.deleted()
    except FileNotFoundError:
        return True


def _gone(paths: ClusterPaths) -> HotswapError:
    if paths.database.exists():
        return being_deleted(paths)
    return NotFoundError(f"cluster {paths.name} no longer exists")


def run_controller(paths: ClusterPaths, timeout: float) -> None:
    """Start the cluster's controller and wait (up to ``timeout``) for it to exit: on a cluster
    being deleted it stops every worker, then exits."""
    process = _start(paths)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        pass  # still stopping workers; the caller's wait for the cluster's lock says when done


def _last_line(paths: ClusterPaths) -> str:
    try:
        with open(paths.controller_log, "rb") as log:
            log.seek(max(0, os.fstat(log.fileno()).st_size - 4096))
            lines = [line for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    last = lines[-1] if lines else "no reason given"
    return f"{last.removeprefix('hotswap: ')} (log: {paths.controller_log})"


def request(paths: ClusterPaths, asked: LocalRequest) -> Request:
    """Queue a request (a record checked its values when it was made, so a request no
    controller would serve fails before anything is queued) and wait until the controller has
    committed its outcome."""
    store = LocalStore.open(paths.database)
    try:
        store.check_writable()
        if store.deleted():
            raise being_deleted(paths)
        request_id = store.requests.submit(asked.kind, asked.to_payload(), time.time())
        try:
            return _served(paths, store, request_id)
        except KeyboardInterrupt:
            served = _give_up(store, request_id, Interrupted("interrupted"))
            raise Interrupted(f"interrupted; the request had been carried out: {served.message or served.status}") from None
    finally:
        store.close()


def _served(paths: ClusterPaths, store: LocalStore, request_id: int) -> Request:
    while True:
        found = store.requests.get(request_id)
        assert found is not None
        if found.status != "pending":
            return _outcome(found)
        try:
            ensure_controller(paths)
        except HotswapError as problem:
            return _give_up(store, request_id, problem)
        # No answer means the controller went away first; the request is still queued in
        # the database, so the loop looks again and a new controller serves it.
        answer = _wait(paths, request_id)
        if answer is not None and answer.get("status") == protocol.FAILED:
            return _give_up(store, request_id, StateError(str(answer.get("message"))))


def _give_up(store: LocalStore, request_id: int, problem: HotswapError) -> Request:
    """Withdraw the request, then report ``problem``; or, if the controller served it first,
    return how it was served. The report says exactly one of "nothing was changed" (withdrawn)
    and "stays queued" (the withdrawal itself failed: a nearly full disk)."""
    what, _, advice = str(problem).partition("; nothing was changed")  # a fault's line says it already
    advice = advice.removeprefix(":").strip()
    try:
        withdrawn = store.requests.withdraw(request_id, f"withdrawn: {what}")
    except Exception as error:
        if not faults.is_fault(error):
            raise
        raise type(problem)(
            f"{what}; the request (id {request_id}) could not be withdrawn either, so it stays queued and is"
            " carried out once a controller can serve it: do not repeat it"
        ) from None
    if not withdrawn:
        found = store.requests.get(request_id)
        if found is not None and found.status != "pending":
            return _outcome(found)
    raise type(problem)(f"{what}; nothing was changed" + (f": {advice}" if advice else ""))


def _outcome(request: Request) -> Request:
    """A committed outcome; a refusal for a fault of the machine is raised as such (exit 6)."""
    if request.status == protocol.FAULT:
        raise StateError(request.message)
    return request


def _wait(paths: ClusterPaths, request_id: int) -> dict[str, Any] | None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection, paths.socket_address() as address:
            connection.connect(address)
            connection.sendall(protocol.wait(request_id))
            return _read_message(connection)
    except OSError:
        return None


def _read_message(connection: socket.socket) -> dict[str, Any] | None:
    """The first message on the connection, None if it closes first or is not one."""
    reader = protocol.LineReader()
    while True:
        chunk = connection.recv(4096)
        if not chunk:
            return None
        for message in reader.feed(chunk):
            return None if isinstance(message, protocol.ProtocolError) else message
