"""The controller's end of the socket :mod:`hotswap.backends.local.commands.client` talks to.

It answers a ping at once, and a wait once the request's outcome is committed (at once when it
already is). Requests themselves arrive through the database, so nothing here decides anything:
the controller calls :meth:`RequestServer.answer` after each commit. Everything runs on the
controller's selector; each registration's data is the callback for its descriptor.

Input is untrusted and bounded: lines of at most ``protocol.MAX_LINE_BYTES``, a malformed one
gets an error answer (the connection goes on), an over-long one closes the connection, a
client that does not read its answers is dropped rather than waited for, and there are at
most :data:`MAX_CONNECTIONS` connections and :data:`MAX_WAITS` waits on each.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import stat
from typing import Any

from hotswap.backends.local import protocol
from hotswap.store import faults
from hotswap.store.paths import ClusterPaths
from hotswap.backends.local.tables import LocalStore

MAX_CONNECTIONS = 512
MAX_WAITS = 64  # per connection
RECEIVE_BYTES = 65536


class RequestServer:
    def __init__(self, paths: ClusterPaths, selector: selectors.BaseSelector, store: LocalStore) -> None:
        self.paths = paths
        self.selector = selector
        self.store = store
        self.listener: socket.socket | None = None
        self.inode: tuple[int, int] | None = None  # of the socket file we bound
        self.readers: dict[socket.socket, protocol.LineReader] = {}
        self.waiters: dict[int, list[socket.socket]] = {}  # request id -> connections

    def open(self) -> None:
        """Listen (the caller holds the cluster's lock, so a socket file left there is stale)."""
        self._stop_listening()
        with contextlib.suppress(FileNotFoundError):
            self.paths.socket.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self.paths.socket_address() as address:
                listener.bind(address)
            os.chmod(self.paths.socket, 0o600)
            listener.listen(128)
        except OSError:
            listener.close()
            raise
        listener.setblocking(False)
        status = os.stat(self.paths.socket)
        self.listener, self.inode = listener, (status.st_dev, status.st_ino)
        self.selector.register(listener, selectors.EVENT_READ, self._accept)

    def ensure_listening(self) -> None:
        """Bind again if our socket file was removed or replaced (the CLI could not reach us)."""
        try:
            status = os.stat(self.paths.socket)
            if stat.S_ISSOCK(status.st_mode) and (status.st_dev, status.st_ino) == self.inode:
                return
        except FileNotFoundError:
            pass
        faults.log("hotswap: the controller's socket was removed; listening again")
        self.open()

    def close(self) -> None:
        for connection in list(self.readers):
            self._drop(connection)
        self._stop_listening()

    def _stop_listening(self) -> None:
        if self.listener is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.listener)
        self.listener.close()
        self.listener = None
        with contextlib.suppress(OSError):  # never remove a socket that is not ours
            status = os.stat(self.paths.socket)
            if (status.st_dev, status.st_ino) == self.inode:
                self.paths.socket.unlink()
        self.inode = None

    def answer(self, request_id: int) -> None:
        """Tell whoever waits for the request its committed outcome."""
        request = self.store.requests.get(request_id)
        if request is None:
            return
        for connection in self.waiters.pop(request_id, []):
            self._send(connection, protocol.outcome(request.id, request.status, request.message))

    def fail(self, request_id: int, message: str) -> None:
        """Tell whoever waits that the request's outcome could not be committed (it stays queued)."""
        for connection in self.waiters.pop(request_id, []):
            self._send(connection, protocol.outcome(request_id, protocol.FAILED, message))

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except BlockingIOError:
                return
            except OSError as error:  # out of descriptors: the client retries, we keep serving
                faults.log(f"hotswap: cannot accept a connection: {error}")
                return
            if len(self.readers) >= MAX_CONNECTIONS:
                connection.close()  # the client's ping fails and it retries
                continue
            connection.setblocking(False)
            self.readers[connection] = protocol.LineReader()
            self.selector.register(connection, selectors.EVENT_READ, self._read)
            self._read(connection)  # its first line has often arrived with it

    def _read(self, connection: socket.socket) -> None:
        try:
            data = connection.recv(RECEIVE_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        reader = self.readers.get(connection)
        if not data or reader is None:
            self._drop(connection)
            return
        try:
            for message in reader.feed(data):
                if isinstance(message, protocol.ProtocolError):
                    self._send(connection, protocol.error(str(message)))
                else:
                    self._serve(connection, message)
                if connection not in self.readers:
                    return  # dropped while answering
        except protocol.LineTooLong as problem:
            self._send(connection, protocol.error(str(problem)))
            self._drop(connection)
        except Exception:  # a bug: this client gets nothing more, the controller serves on
            faults.log()
            self._drop(connection)

    def _serve(self, connection: socket.socket, message: dict[str, Any]) -> None:
        if protocol.PING in message:
            self._send(connection, protocol.pong(os.getpid()))
        elif protocol.WAIT in message:
            try:
                self._wait(connection, protocol.request_id_of(message))
            except protocol.ProtocolError as problem:
                self._send(connection, protocol.error(str(problem)))
        else:
            self._send(connection, protocol.error("unknown message: send ping or wait"))

    def _wait(self, connection: socket.socket, request_id: int) -> None:
        try:
            request = self.store.requests.get(request_id)
        except Exception as problem:  # the database failed us: say so, keep serving
            if not faults.is_fault(problem):
                raise
            self._send(connection, protocol.outcome(request_id, protocol.FAILED, str(faults.explain(problem))))
            return
        if request is None:
            raise protocol.ProtocolError(f"no request {request_id}")
        if request.status != "pending":
            self._send(connection, protocol.outcome(request.id, request.status, request.message))
            return
        waiting = sum(connection in queue for queue in self.waiters.values())
        if waiting >= MAX_WAITS:
            raise protocol.ProtocolError(f"more than {MAX_WAITS} waits on one connection")
        self.waiters.setdefault(request_id, []).append(connection)

    def _send(self, connection: socket.socket, data: bytes) -> None:
        """Send without blocking the controller: answers are small, so a client whose buffer is
        full is not reading them and is dropped."""
        try:
            sent = connection.send(data)
        except OSError:
            sent = -1
        if sent != len(data):
            self._drop(connection)

    def _drop(self, connection: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(connection)
        self.readers.pop(connection, None)
        for waiting in self.waiters.values():
            while connection in waiting:
                waiting.remove(connection)
        connection.close()
