"""The controller's end of the socket :mod:`hotswap.backends.local.client` talks to.

It answers a ping at once, and a wait once the request's outcome is committed (at once when it
already is). Requests themselves arrive through the database, so nothing here decides anything:
the controller calls :meth:`RequestServer.answer` after each commit. Everything runs on the
controller's selector; each registration's data is the callback for its descriptor.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import traceback
from typing import Any

from hotswap.backends.local import protocol
from hotswap.store.paths import ClusterPaths
from hotswap.store.state import Store


class RequestServer:
    def __init__(self, paths: ClusterPaths, selector: selectors.BaseSelector, store: Store) -> None:
        self.paths = paths
        self.selector = selector
        self.store = store
        self.readers: dict[socket.socket, protocol.LineReader] = {}
        self.waiters: dict[int, list[socket.socket]] = {}  # request id -> connections

    def open(self) -> None:
        """Listen (the caller holds the cluster's lock, so a socket file left there is stale)."""
        with contextlib.suppress(FileNotFoundError):
            self.paths.socket.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.paths.socket))
        os.chmod(self.paths.socket, 0o600)
        listener.listen(128)
        listener.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ, self._accept)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.paths.socket.unlink()

    def answer(self, request_id: int) -> None:
        """Tell whoever waits for the request its committed outcome."""
        request = self.store.request(request_id)
        if request is None:
            return
        for connection in self.waiters.pop(request_id, []):
            self._send(connection, protocol.outcome(request.id, request.status, request.message))

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except BlockingIOError:
                return
            except OSError:  # out of descriptors: the client retries, we keep serving
                traceback.print_exc()
                return
            connection.setblocking(False)
            self.readers[connection] = protocol.LineReader()
            self.selector.register(connection, selectors.EVENT_READ, self._read)
            self._read(connection)  # its first line has often arrived with it

    def _read(self, connection: socket.socket) -> None:
        try:
            data = connection.recv(65536)
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
                self._serve(connection, message)
                if connection not in self.readers:
                    return  # dropped while answering
        except protocol.ProtocolError:
            self._drop(connection)

    def _serve(self, connection: socket.socket, message: dict[str, Any]) -> None:
        if protocol.PING in message:
            self._send(connection, protocol.pong(os.getpid()))
        elif protocol.WAIT in message:
            request_id = int(message[protocol.WAIT])
            request = self.store.request(request_id)
            if request is not None and request.status != "pending":
                self._send(connection, protocol.outcome(request.id, request.status, request.message))
            else:
                self.waiters.setdefault(request_id, []).append(connection)

    def _send(self, connection: socket.socket, data: bytes) -> None:
        try:
            connection.setblocking(True)
            connection.sendall(data)
            connection.setblocking(False)
        except OSError:
            self._drop(connection)

    def _drop(self, connection: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(connection)
        self.readers.pop(connection, None)
        for waiting in self.waiters.values():
            if connection in waiting:
                waiting.remove(connection)
        connection.close()
