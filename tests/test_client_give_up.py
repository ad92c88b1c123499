"""When the CLI gives up on a request (the controller could not commit it: a nearly full
disk), it says exactly one of "nothing was changed" (it withdrew the request) and "stays
queued" (the withdrawal failed too, so a controller carries it out later), never both."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hotswap.api.errors import StateError
from hotswap.backends.local.commands import client
from hotswap.backends.local.tables import LocalStore
from hotswap.store import faults
from hotswap.store.state import ClusterRecord


def full(database: Path) -> StateError:
    """What the controller answers when its round could not be committed: the disk is full."""
    error = sqlite3.OperationalError("database or disk is full")
    setattr(error, faults.DATABASE_ATTRIBUTE, database)
    return faults.explain(error)


@pytest.fixture
def store(tmp_path: Path):
    with LocalStore.open(tmp_path / "c" / "state.db", create=True) as opened:
        opened.init_cluster(ClusterRecord("c", "local", "v6e-4", 0.0))
        yield opened


def test_a_request_that_cannot_be_withdrawn_stays_queued_and_nothing_says_otherwise(store: LocalStore, monkeypatch: pytest.MonkeyPatch) -> None:
    request_id = store.requests.submit("node", {"op": "fail", "nodes": ["c-np-0-0"]}, 1.0)

    def disk_full(*_: object) -> bool:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store.requests, "withdraw", disk_full)
    with pytest.raises(StateError) as said:
        client._give_up(store, request_id, full(Path("state.db")))
    message = str(said.value)
    assert "nothing was changed" not in message and "retry" not in message, message
    assert f"the request (id {request_id})" in message and "stays queued" in message and "do not repeat it" in message
    assert "is full" in message  # what happened is still said
    assert store.requests.get(request_id).status == "pending"  # and it is true: a controller will serve it


def test_a_withdrawn_request_says_nothing_was_changed_once(store: LocalStore) -> None:
    request_id = store.requests.submit("node", {"op": "fail", "nodes": ["c-np-0-0"]}, 1.0)
    with pytest.raises(StateError) as said:
        client._give_up(store, request_id, full(Path("state.db")))
    message = str(said.value)
    assert message.count("nothing was changed") == 1 and "stays queued" not in message, message
    assert message.endswith("nothing was changed: free some space and retry"), message
    assert store.requests.get(request_id).status != "pending"
