"""What the CLI and a local controller say to each other (``backends/local/protocol.py``): the
request kinds, the line framing, and the socket server answering the real client. The request
records themselves: ``test_local_requests.py``."""

from __future__ import annotations

import os
import selectors
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hotswap.backends.local import protocol

from hotswap.backends.local.commands import client
from hotswap.backends.local.protocol import LineReader, ProtocolError
from hotswap.backends.local.requests import ChangeNodes, DeleteWorkload, NodeOperation, RequestKind
from hotswap.backends.local.controller.server import RequestServer
from hotswap.store.paths import ClusterPaths
from hotswap.backends.local.tables import LocalStore
from hotswap.store.state import ClusterRecord


def test_request_kinds_are_the_strings_in_the_database() -> None:
    assert [k.value for k in RequestKind] == ["create", "delete", "node", "resize", "shutdown"]
    assert [o.value for o in NodeOperation] == ["fail", "drain", "cordon", "uncordon"]
    assert RequestKind("node") is RequestKind.NODE  # a row's kind reads back as the same member


def test_messages_are_one_json_object_per_line() -> None:
    reader = LineReader()
    assert list(reader.feed(protocol.ping() + protocol.wait(7))) == [{"ping": True}, {"wait": 7}]
    assert list(reader.feed(protocol.pong(42))) == [{"pong": 42}]
    assert list(reader.feed(protocol.outcome(7, "rejected", "no"))) == [{"id": 7, "status": "rejected", "message": "no"}]


@given(st.lists(st.integers(1, 10**9), min_size=1, max_size=5), st.integers(1, 7))
def test_messages_survive_any_split_of_the_stream(ids: list[int], piece: int) -> None:
    stream = b"".join(protocol.wait(i) for i in ids)
    reader = LineReader()
    received = [m for start in range(0, len(stream), piece) for m in reader.feed(stream[start : start + piece])]
    assert received == [{"wait": i} for i in ids]
    assert reader.buffer == b""


@pytest.mark.parametrize("line", [b"not json\n", b"[1, 2]\n", b"5\n", b"\xff\xfe\n", b"[" * 4000 + b"\n", b"1" * 4090 + b"\n"])
def test_a_line_that_is_not_a_json_object_is_a_protocol_error_and_the_stream_goes_on(line: bytes) -> None:
    reader = LineReader()
    messages = list(reader.feed(protocol.ping() + line + protocol.wait(3)))
    assert messages[0] == {"ping": True}  # what came before it is still served
    assert isinstance(messages[1], ProtocolError)
    assert messages[2] == {"wait": 3}  # and what comes after it


def test_a_line_past_the_limit_ends_the_stream_even_without_a_newline() -> None:
    reader = LineReader()
    with pytest.raises(protocol.LineTooLong):
        list(reader.feed(b"x" * (protocol.MAX_LINE_BYTES + 1)))
    with pytest.raises(protocol.LineTooLong):
        list(LineReader().feed(protocol.ping() + b"y" * (protocol.MAX_LINE_BYTES + 1) + b"\n"))


@pytest.fixture
def cluster(tmp_path: Path) -> ClusterPaths:
    paths = ClusterPaths("c", tmp_path / "c")
    with LocalStore.open(paths.database, create=True) as store:
        store.init_cluster(ClusterRecord("c", "local", "v6e-4", 0.0))
    return paths


@pytest.fixture
def served(cluster: ClusterPaths) -> Iterator[ClusterPaths]:
    """A stand-in controller on a thread: the real server, which finishes every request "done"
    (a request of kind ``delete`` "rejected") right after it is queued."""
    ready, stop = threading.Event(), threading.Event()

    def serve() -> None:
        selector = selectors.DefaultSelector()
        with LocalStore.open(cluster.database) as store:
            server = RequestServer(cluster, selector, store)
            server.open()
            ready.set()
            while not stop.is_set():
                for key, _ in selector.select(0.02):
                    key.data(key.fileobj)
                for request in store.requests.pending():
                    status = "rejected" if request.kind == RequestKind.DELETE else "done"
                    with store.transaction():
                        store.requests.finish(request.id, status, f"served {request.kind}")
                    server.answer(request.id)
            server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    yield cluster
    stop.set()
    thread.join(10)


def test_the_client_pings_queues_and_waits_through_the_server(served: ClusterPaths) -> None:
    assert client.ping(served) == os.getpid()
    done = client.request(served, ChangeNodes(NodeOperation.FAIL, ("n",)))
    assert (done.kind, done.status, done.message) == ("node", "done", "served node")
    assert done.payload == {"op": "fail", "nodes": ["n"], "version": 1}
    rejected = client.request(served, DeleteWorkload("w"))
    assert (rejected.status, rejected.message) == ("rejected", "served delete")


def test_a_request_no_controller_would_serve_is_refused_before_anything_is_queued(cluster: ClusterPaths) -> None:
    with pytest.raises(ValueError):
        client.request(cluster, ChangeNodes("reboot", ("n",)))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        client.request(cluster, ChangeNodes(NodeOperation.FAIL, ()))
    with LocalStore.open(cluster.database) as store:
        assert store.requests.pending() == []
