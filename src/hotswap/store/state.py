"""Reading and writing a cluster's state: its record, the core's snapshot, the timeline.

Every backend keeps these. The local backend's own tables (requests, worker rows, launch
records) are read and written by :mod:`hotswap.backends.local.tables`, over the same connection.
Only the cluster's controller writes the snapshot and the timeline; CLI processes read them (and
write the cluster record when they create a cluster).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Self

from hotswap.api.cluster import NodeState
from hotswap.core.model import Node, Slice, Snapshot
from hotswap.core.workload import Workload
from hotswap.store import db
from hotswap.store.codec import json_object, workload_from_json, workload_to_json
from hotswap.api.errors import StateError
from hotswap.store.faults import CorruptState


@dataclasses.dataclass(frozen=True)
class ClusterRecord:
    name: str
    backend: str
    device_type: str
    created_at: float
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)


class Store:
    """A cluster's database: its record, the core's snapshot and the timeline; each section below
    is one table's reads and writes. A backend's own tables share its connection and transaction
    (:class:`~hotswap.backends.local.tables.LocalStore`)."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection

    @classmethod
    def open(cls, path: Path, create: bool = False) -> Self:
        return cls(db.connect(path, create=create))

    def close(self) -> None:
        self.connection.close()

    @property
    def read_only(self) -> bool:
        """Nothing can be written: the database or its directory is read-only (reads still work)."""
        database = getattr(self.connection, "database", None)
        if getattr(self.connection, "read_only", False):
            return True
        return database is not None and not (os.access(database, os.W_OK) and os.access(database.parent, os.W_OK))

    def check_writable(self) -> None:
        """A one-line error, before anything is attempted, when nothing can be written."""
        if self.read_only:
            database = getattr(self.connection, "database", "the database")
            raise StateError(
                f"{database} is read-only (its directory cannot be written); nothing was changed: reads"
                " (list, describe, logs) still work; make it writable to change anything"
            )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction (taken at once, so concurrent writers queue, never deadlock)."""
        if self.connection.in_transaction:
            yield
            return
        self.connection.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.connection.execute("ROLLBACK")
            raise
        self.connection.execute("COMMIT")

    # ------------------------------------------------------------------ cluster record

    def init_cluster(self, record: ClusterRecord) -> None:
        """A new cluster's record, and its identity (which the file beside the database holds too)."""
        identity = db.new_identity(Path(self.connection.database))
        with self.transaction():
            self._set_meta(db.IDENTITY_KEY, identity)
            self._set_meta("cluster", json.dumps(dataclasses.asdict(record), sort_keys=True))
            self._set_meta("next_seq", "0")
            self._set_meta("next_ordinal", "0")

    def cluster(self) -> ClusterRecord:
        value = self._meta("cluster")
        if value is None:
            raise LookupError("cluster record missing")
        try:
            return ClusterRecord(**json_object(value))
        except (TypeError, ValueError) as error:
            raise self.corrupt("the cluster record", error) from None

    def corrupt(self, what: str, error: Exception) -> CorruptState:
        database = getattr(self.connection, "database", "the database")
        return CorruptState(
            f"the database {database} is corrupt ({what} is unreadable: {str(error)[:120]}); restore it"
            " from a backup, or remove the cluster with `hotswap cluster delete`"
        )

    def update_cluster(self, record: ClusterRecord) -> None:
        with self.transaction():
            self._set_meta("cluster", json.dumps(dataclasses.asdict(record), sort_keys=True))

    def mark_deleted(self) -> None:
        """The cluster is being removed: a controller starting now must not serve it."""
        self._set_meta("deleted", "1")

    def deleted(self) -> bool:
        return self._meta("deleted") == "1"

    def set_controller(self, pid: int, start_ticks: int | None, boot_id: str | None = None) -> None:
        """Record the controller that holds the cluster now (the database cannot be deleted
        from under it, unlike a pid file; the CLI wakes it through this record), and the boot
        of the machine it runs in (its successor tells a restarted machine by it)."""
        with self.transaction():
            self._set_meta("controller", json.dumps({"pid": pid, "start_ticks": start_ticks, "boot_id": boot_id}))

    def controller_boot_id(self) -> str | None:
        """The boot id recorded with the last controller (None: unknown, an older record)."""
        value = self._meta("controller")
        try:
            boot_id = (json_object(value) or {}).get("boot_id") if value is not None else None
        except (TypeError, ValueError):
            return None
        return boot_id if isinstance(boot_id, str) else None

    def controller(self) -> tuple[int, int | None] | None:
        """(pid, kernel start time) of the last controller that held the cluster."""
        value = self._meta("controller")
        try:
            record = json_object(value) if value is not None else None
            return (int(record["pid"]), record.get("start_ticks")) if record else None
        except (KeyError, TypeError, ValueError):
            return None

    def _meta(self, key: str) -> str | None:
        row = self.connection.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def _set_meta(self, key: str, value: str) -> None:
        self.connection.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    # ------------------------------------------------------------------ the core's snapshot

    def load_snapshot(self, now: float) -> Snapshot:
        slices = [
            Slice(r["name"], r["device_type"], (), r["ordinal"])
            for r in self.connection.execute("SELECT * FROM slices ORDER BY ordinal")
        ]
        nodes = [
            Node(r["name"], r["slice"], r["host"], NodeState(r["state"]))
            for r in self.connection.execute("SELECT * FROM nodes ORDER BY slice, host")
        ]
        members: dict[str, list[str]] = {}
        for node in nodes:
            members.setdefault(node.slice, []).append(node.name)
        slices = [dataclasses.replace(s, nodes=tuple(members.get(s.name, ()))) for s in slices]
        workloads = [self._workload(r["name"], r["record"]) for r in self.connection.execute("SELECT name, record FROM workloads")]
        workloads.sort(key=lambda w: w.seq)
        return Snapshot.build(
            now,
            slices,
            nodes,
            workloads,
            next_seq=int(self._meta("next_seq") or 0),
            next_ordinal=int(self._meta("next_ordinal") or 0),
        )

    def save_snapshot(self, old: Snapshot, new: Snapshot) -> None:
        """Write what changed between two snapshots (records are shared when unchanged)."""
        with self.transaction():
            if new.slices is not old.slices:
                for name, item in new.slices.items():
                    if old.slices.get(name) is not item:
                        self.connection.execute(
                            "INSERT OR REPLACE INTO slices (name, device_type, ordinal) VALUES (?, ?, ?)",
                            (name, item.device_type, item.ordinal),
                        )
                for name in old.slices.keys() - new.slices.keys():
                    self.connection.execute("DELETE FROM slices WHERE name = ?", (name,))
            if new.nodes is not old.nodes:
                for name, node in new.nodes.items():
                    if old.nodes.get(name) is not node:
                        self.connection.execute(
                            "INSERT OR REPLACE INTO nodes (name, slice, host, state) VALUES (?, ?, ?, ?)",
                            (name, node.slice, node.host, node.state.value),
                        )
                for name in old.nodes.keys() - new.nodes.keys():
                    self.connection.execute("DELETE FROM nodes WHERE name = ?", (name,))
            for name, workload in new.workloads.items():
                if old.workloads.get(name) is not workload:
                    updated = self.connection.execute(
                        "UPDATE workloads SET record = ? WHERE name = ?", (workload_to_json(workload), name)
                    ).rowcount
                    if not updated:
                        raise LookupError(f"workload {name} has no launch record")
            for name in old.workloads.keys() - new.workloads.keys():
                self.connection.execute("DELETE FROM workloads WHERE name = ?", (name,))
            self._set_meta("next_seq", str(new.next_seq))
            self._set_meta("next_ordinal", str(new.next_ordinal))

    def _workload(self, name: str, record: str) -> Workload:
        try:
            return workload_from_json(record)
        except (KeyError, TypeError, ValueError) as error:  # pydantic's ValidationError is a ValueError
            raise self.corrupt(f"the record of workload {name}", error) from None

    # ------------------------------------------------------------------ read-only views for the CLI

    def workload_records(self) -> list[dict[str, Any]]:
        """The record of every workload as a plain dict, without building pydantic models."""
        rows = self.connection.execute("SELECT record FROM workloads").fetchall()
        try:
            records = [json_object(r[0]) for r in rows]
            records.sort(key=lambda record: record["seq"])
        except (KeyError, TypeError, ValueError) as error:
            raise self.corrupt("a workload record", error) from None
        return records

    def node_rows(self) -> list[sqlite3.Row]:
        return self.connection.execute(
            "SELECT n.name, n.slice, n.host, n.state, s.device_type, s.ordinal FROM nodes n"
            " JOIN slices s ON s.name = n.slice ORDER BY s.ordinal, n.host"
        ).fetchall()

    def slice_rows(self) -> list[sqlite3.Row]:
        return self.connection.execute("SELECT * FROM slices ORDER BY ordinal").fetchall()

    # ------------------------------------------------------------------ timeline

    def record_event(
        self,
        t: float,
        kind: str,
        message: str,
        workload: str | None = None,
        seq: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        self.connection.execute(
            "INSERT INTO events (t, workload, seq, kind, message, data) VALUES (?, ?, ?, ?, ?, ?)",
            (t, workload, seq, kind, message, json.dumps(data, sort_keys=True) if data else None),
        )

    def events_after(self, event_id: int) -> list[sqlite3.Row]:
        """Timeline rows newer than ``event_id`` (to follow the timeline as it grows)."""
        return self.connection.execute("SELECT * FROM events WHERE id > ? ORDER BY id", (event_id,)).fetchall()

    def cluster_entries(self, kinds: Sequence[str]) -> list[sqlite3.Row]:
        """The cluster's own timeline entries (no workload's) of these kinds, oldest first."""
        marks = ", ".join("?" for _ in kinds)
        return self.connection.execute(
            f"SELECT * FROM events WHERE workload IS NULL AND kind IN ({marks}) ORDER BY id", tuple(kinds)
        ).fetchall()

    def timeline(self, workload: str | None = None, seq: int | None = None) -> list[sqlite3.Row]:
        if workload is None:
            return self.connection.execute("SELECT * FROM events ORDER BY id").fetchall()
        return self.connection.execute(
            "SELECT * FROM events WHERE workload = ? AND seq = ? ORDER BY id", (workload, seq)
        ).fetchall()
