"""The local backend's tables in a cluster's database: requests (CLI -> controller), worker rows
(the supervisor's), and each workload's launch record and membership.

They share the :class:`~hotswap.store.state.Store`'s connection and its transaction
(:class:`LocalStore`), so a controller round still commits the snapshot, the timeline, the worker
rows and the request's outcome at once. The schema stays whole in :mod:`hotswap.store.db`: one
migration history per database file, which existing databases have already run.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from hotswap.api.launch import HeldStart, Launch
from hotswap.api.phases import WorkloadPhase
from hotswap.core.model import Snapshot
from hotswap.core.placement import recorded_map
from hotswap.core.workload import Workload
from hotswap.store.codec import json_object
from hotswap.store.state import Store

LIVE_WORKER_STATES = ("starting", "running", "stopping")  # a process that is, or may be, alive


@dataclasses.dataclass(frozen=True)
class Request:
    id: int
    t: float
    kind: str
    payload: dict[str, Any] | None  # None: the row's payload is not a JSON object
    status: str
    message: str


@dataclasses.dataclass(frozen=True)
class WorkerIdentity:
    """Which worker a process is: host ``host`` (node ``node``) of replica ``replica`` (on slice
    ``slice``) in attempt ``attempt`` of workload ``workload`` (its creation ``seq``). A worker's
    row and the launch that starts it carry the same identity."""

    workload: str
    seq: int
    attempt: int
    slice: str
    replica: int
    host: int
    node: str

    @property
    def is_spare(self) -> bool:
        return not self.workload


SPARE = WorkerIdentity(workload="", seq=0, attempt=0, slice="", replica=-1, host=-1, node="")  # serves no workload yet
_IDENTITY_COLUMNS = tuple(field.name for field in dataclasses.fields(WorkerIdentity))


@dataclasses.dataclass(frozen=True)
class WorkerRow:
    id: int
    identity: WorkerIdentity
    dir: str
    pid: int | None
    start_ticks: int | None
    state: str
    exit_code: int | None
    started_at: float | None
    stop_requested_at: float | None
    kill_at: float | None
    ended_at: float | None


class LocalStore(Store):
    """A local cluster's database: the cluster's own tables (:class:`Store`) and the local
    backend's, over one connection."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        super().__init__(connection)
        self.requests = Requests(self)
        self.worker_rows = WorkerRows(self)
        self.launches = Launches(self)

    def load_snapshot(self, now: float) -> Snapshot:
        """The core's snapshot. A running elastic workload whose record was written by a release
        without replica maps (no ``replicas``) keeps the indexes its live workers were started
        with: an upgrade in the middle of a shrink never gives a joiner a survivor's index."""
        snapshot = super().load_snapshot(now)
        unmapped = self.connection.execute("SELECT name FROM workloads WHERE json_type(record, '$.replicas') IS NULL")
        started = {name: self._started_map(snapshot.workloads[name]) for (name,) in unmapped if name in snapshot.workloads}
        if not any(replicas is not None for replicas in started.values()):
            return snapshot
        workloads = sorted(snapshot.workloads.values(), key=lambda w: w.seq)
        workloads = [dataclasses.replace(w, replicas=started.get(w.name) or w.replicas) for w in workloads]
        return Snapshot.build(
            now, snapshot.slices.values(), snapshot.nodes.values(), workloads, snapshot.next_seq, snapshot.next_ordinal
        )

    def _started_map(self, workload: Workload) -> tuple[str | None, ...] | None:
        """The replica map of a running elastic workload's live workers of its current attempt
        (None: that of its slices, or no map of them: the record's own then holds)."""
        if workload.phase is not WorkloadPhase.RUNNING or workload.spec.min_slices is None:
            return None
        started: list[str | None] = [None] * workload.spec.num_slices
        for row in self.worker_rows.select(("starting", "running"), workload.name):
            who = row.identity
            if who.seq != workload.seq or who.attempt != workload.attempt:
                continue
            if not 0 <= who.replica < len(started) or started[who.replica] not in (None, who.slice):
                return None
            started[who.replica] = who.slice
        return recorded_map(started, workload.slices, workload.spec.num_slices)


class Requests:
    """The requests table: CLI processes submit, the controller serves."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._connection = store.connection

    def submit(self, kind: str, payload: dict[str, Any], t: float) -> int:
        with self._store.transaction():
            cursor = self._connection.execute(
                "INSERT INTO requests (t, kind, payload) VALUES (?, ?, ?)", (t, kind, json.dumps(payload, sort_keys=True))
            )
        return int(cursor.lastrowid)

    def pending(self) -> list[Request]:
        rows = self._connection.execute("SELECT * FROM requests WHERE status = 'pending' ORDER BY id").fetchall()
        return [_request(r) for r in rows]

    def get(self, request_id: int) -> Request | None:
        row = self._connection.execute("SELECT * FROM requests WHERE id = ?", (request_id,)).fetchone()
        return None if row is None else _request(row)

    def finish(self, request_id: int, status: str, message: str = "") -> None:
        self._connection.execute(
            "UPDATE requests SET status = ?, message = ? WHERE id = ?", (status, message, request_id)
        )

    def is_pending(self, request_id: int) -> bool:
        row = self._connection.execute("SELECT status FROM requests WHERE id = ?", (request_id,)).fetchone()
        return row is not None and row[0] == "pending"

    def withdraw(self, request_id: int, message: str) -> bool:
        """Refuse a request nobody has served yet (its submitter gave up on it); False when it
        was served first."""
        with self._store.transaction():
            changed = self._connection.execute(
                "UPDATE requests SET status = 'rejected', message = ? WHERE id = ? AND status = 'pending'",
                (message, request_id),
            ).rowcount
        return bool(changed)


def _request(row: sqlite3.Row) -> Request:
    try:
        payload: dict[str, Any] | None = json_object(row["payload"])
    except ValueError:
        payload = None
    return Request(row["id"], row["t"], str(row["kind"]), payload, row["status"], str(row["message"]))


class WorkerRows:
    """The workers table: the supervisor's record of each worker process (and warm spare)."""

    def __init__(self, store: Store) -> None:
        self._connection = store.connection

    def add(self, identity: WorkerIdentity, **fields: Any) -> int:
        fields = {**dataclasses.asdict(identity), **fields}
        columns = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        cursor = self._connection.execute(f"INSERT INTO workers ({columns}) VALUES ({marks})", tuple(fields.values()))
        return int(cursor.lastrowid)

    def update(self, worker_id: int, **fields: Any) -> None:
        assignments = ", ".join(f"{key} = ?" for key in fields)
        self._connection.execute(f"UPDATE workers SET {assignments} WHERE id = ?", (*fields.values(), worker_id))

    def select(self, states: Sequence[str] | None = None, workload: str | None = None) -> list[WorkerRow]:
        """The rows in these states (all: None) of this workload (any: None), oldest first."""
        query = "SELECT * FROM workers"
        clauses, args = [], []
        if states is not None:
            clauses.append(f"state IN ({', '.join('?' for _ in states)})")
            args.extend(states)
        if workload is not None:
            clauses.append("workload = ?")
            args.append(workload)
        if clauses:
            query += " WHERE " + " AND ".join(clauses)
        rows = self._connection.execute(query + " ORDER BY id", args).fetchall()
        return [_worker_row(r) for r in rows]

    def get(self, worker_id: int) -> WorkerRow:
        return _worker_row(self._connection.execute("SELECT * FROM workers WHERE id = ?", (worker_id,)).fetchone())


def _worker_row(row: sqlite3.Row) -> WorkerRow:
    columns = dict(row)
    identity = WorkerIdentity(**{name: columns.pop(name) for name in _IDENTITY_COLUMNS})
    return WorkerRow(identity=identity, **columns)


class Launches:
    """Each workload's launch record and membership generation (the workloads table's columns
    besides the core's record, which the :class:`Store` keeps)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._connection = store.connection

    def add(self, name: str, record_json: str, launch: Launch) -> None:
        """Register a workload's launch before the core's record of it is saved."""
        self._connection.execute(
            "INSERT OR REPLACE INTO workloads (name, record, launch) VALUES (?, ?, ?)", (name, record_json, launch.to_json())
        )

    def get(self, name: str) -> Launch:
        row = self._connection.execute("SELECT launch FROM workloads WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise LookupError(name)
        return self._launch(name, row[0])

    def set_held_start(self, name: str, held: HeldStart | None) -> None:
        """Record (or, with ``None``, forget) why a workload's held-back workers will start."""
        launch = dataclasses.replace(self.get(name), held_start=held)
        self._connection.execute("UPDATE workloads SET launch = ? WHERE name = ?", (launch.to_json(), name))

    def with_records(self) -> list[tuple[dict[str, Any], Launch]]:
        """(record, launch) of every workload, the record as a plain dict (no pydantic model)."""
        rows = self._connection.execute("SELECT name, record, launch FROM workloads").fetchall()
        try:
            pairs = [(json_object(r[1]), Launch.from_dict(json_object(r[2]))) for r in rows]
            pairs.sort(key=lambda pair: pair[0]["seq"])
        except (KeyError, TypeError, ValueError) as error:
            raise self._store.corrupt("a workload record", error) from None
        return pairs

    def _launch(self, name: str, text: str) -> Launch:
        try:
            return Launch.from_dict(json_object(text))
        except (KeyError, TypeError, ValueError) as error:
            raise self._store.corrupt(f"the launch record of workload {name}", error) from None

    def membership(self, name: str) -> tuple[int, int]:
        row = self._connection.execute(
            "SELECT generation, master_port FROM workloads WHERE name = ?", (name,)
        ).fetchone()
        return (row[0], row[1]) if row else (0, 0)

    def set_membership(self, name: str, generation: int, master_port: int) -> None:
        self._connection.execute(
            "UPDATE workloads SET generation = ?, master_port = ? WHERE name = ?", (generation, master_port, name)
        )
