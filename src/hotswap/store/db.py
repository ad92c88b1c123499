"""The SQLite database of one cluster: connection settings and schema migrations.

WAL mode lets CLI readers run while the controller writes; ``busy_timeout`` makes concurrent
writers (many ``workload create`` calls queueing requests) wait instead of failing. The schema
version lives in ``PRAGMA user_version``; each migration runs once, in a transaction.
"""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

from hotswap.store.faults import DATABASE_ATTRIBUTE, CorruptState, kind_of
from hotswap.store.paths import private_dir, write_private

BUSY_TIMEOUT_MS = 30_000

# The whole schema, the local backend's tables (requests, workers, workloads' launch columns) too:
# one migration history per database file. Existing databases have run these scripts under
# ``user_version``; split by owner, they would need a second version counter and a migration of
# their own (hotswap.backends.local.tables reads and writes those tables).
MIGRATIONS: list[str] = [
    # 1: the first schema.
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE slices (
        name TEXT PRIMARY KEY, device_type TEXT NOT NULL, ordinal INTEGER NOT NULL
    );
    CREATE TABLE nodes (
        name TEXT PRIMARY KEY, slice TEXT NOT NULL, host INTEGER NOT NULL, state TEXT NOT NULL
    );
    CREATE TABLE workloads (
        name TEXT PRIMARY KEY,
        record TEXT NOT NULL,      -- the core's Workload as JSON (spec included)
        launch TEXT NOT NULL,      -- how to run it: environment, working dir, checkpoint dir
        generation INTEGER NOT NULL DEFAULT 0,  -- membership generation published to workers
        master_port INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        t REAL NOT NULL,
        workload TEXT,
        seq INTEGER,               -- the workload's creation sequence (names can be reused)
        kind TEXT NOT NULL,
        message TEXT NOT NULL,
        data TEXT
    );
    CREATE INDEX events_by_workload ON events (workload, seq, id);
    CREATE TABLE requests (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        t REAL NOT NULL,
        kind TEXT NOT NULL,
        payload TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending',   -- pending | done | rejected | fault
        message TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX pending_requests ON requests (status, id);
    CREATE TABLE workers (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        workload TEXT NOT NULL,
        seq INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        slice TEXT NOT NULL,
        replica INTEGER NOT NULL,
        host INTEGER NOT NULL,
        node TEXT NOT NULL,
        dir TEXT NOT NULL,
        pid INTEGER,
        start_ticks INTEGER,
        state TEXT NOT NULL,       -- starting | running | stopping | exited
        exit_code INTEGER,
        started_at REAL,
        stop_requested_at REAL,
        kill_at REAL,
        ended_at REAL
    );
    CREATE INDEX live_workers ON workers (state);
    """,
]


class _Connection(sqlite3.Connection):
    """A connection that names its database on the errors it raises (see ``faults.explain``)."""

    database: Path
    read_only = False  # opened read-only because its directory cannot be written

    def execute(self, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        try:
            return super().execute(*args)
        except sqlite3.Error as error:
            setattr(error, DATABASE_ATTRIBUTE, self.database)
            raise


def connect(path: Path, create: bool = False) -> sqlite3.Connection:
    """Open a cluster database; with ``create``, make it (owner-only) and migrate it.

    A database in a directory that cannot be written (a read-only mount, a copied backup) is
    opened read-only, so reads still work and a write fails with SQLite's read-only error."""
    if create:
        private_dir(path.parent)
        if not path.exists():
            os.close(os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600))
    elif not path.exists():
        raise FileNotFoundError(path)
    elif path.stat().st_size == 0:  # checked before SQLite opens it: opening writes a header
        raise _no_cluster(path, "is empty")
    try:
        connection = _open(str(path), path, uri=False)
        connection.execute("PRAGMA journal_mode = WAL")
    except sqlite3.OperationalError as error:
        if create or kind_of(error) not in ("read-only", "cannot-open"):
            raise
        connection = _open_read_only(path)
    connection.execute("PRAGMA synchronous = NORMAL")
    connection.execute("PRAGMA foreign_keys = ON")
    if create:
        migrate(connection)
    else:
        _check_schema(connection, path)
        _check_identity(connection, path)
    return connection


IDENTITY_FILE = "identity"  # beside the database: the cluster's identity, which its database records too
IDENTITY_KEY = "identity"  # the database's record of it (meta table)


def new_identity(path: Path) -> str:
    """A new cluster's identity, written beside its database ``path``; the caller records it in
    the database (file first: a crash in between leaves a cluster being created, refused)."""
    identity = uuid.uuid4().hex
    write_private(path.parent / IDENTITY_FILE, f"{identity}\n")
    return identity


def _check_identity(connection: sqlite3.Connection, path: Path) -> None:
    """A database is its directory's cluster only if both record the same identity: another
    cluster's ``state.db`` copied in would otherwise be served as this one (its workloads, its
    workers' pids). Clusters created before identities had neither, and still pass."""
    try:
        row = connection.execute("SELECT value FROM meta WHERE key = ?", (IDENTITY_KEY,)).fetchone()
        cluster = connection.execute("SELECT value FROM meta WHERE key = 'cluster'").fetchone()
    except sqlite3.DatabaseError:
        connection.close()
        raise _no_cluster(path, "holds no hotswap tables") from None
    try:
        beside = (path.parent / IDENTITY_FILE).read_text().strip()
    except FileNotFoundError:
        beside = None
    if (row[0] if row else None) == beside:
        return
    connection.close()
    try:
        named = f" (cluster {json.loads(cluster[0])['name']})" if cluster else ""
    except (ValueError, TypeError, KeyError):
        named = ""
    raise _no_cluster(path, f"is another cluster's{named}, not this directory's")


def _check_schema(connection: sqlite3.Connection, path: Path) -> None:
    """A database that no migration ever ran on holds no cluster: unreadable, like a corrupt
    one (one line; ``cluster list`` marks it; ``cluster delete`` removes it)."""
    if connection.execute("PRAGMA user_version").fetchone()[0] == 0:
        connection.close()
        raise _no_cluster(path, "holds no hotswap tables")


def _no_cluster(path: Path, what: str) -> CorruptState:
    error = CorruptState(
        f"the database {path} {what} (a crash while the cluster was created, or a file copied in);"
        f" nothing was changed: restore it from a backup, or remove the cluster with"
        f" `hotswap cluster delete --cluster {path.parent.name}`"
    )
    setattr(error, DATABASE_ATTRIBUTE, path)
    return error


def _open(address: str, path: Path, uri: bool) -> _Connection:
    connection = sqlite3.connect(
        address, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, uri=uri, factory=_Connection
    )
    connection.database = path
    connection.row_factory = sqlite3.Row
    connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return connection


def _open_read_only(path: Path) -> _Connection:
    """Read-only: through the write-ahead log if its files exist, else the main file alone
    (``immutable``: without a log, the main file holds every committed transaction)."""
    address = f"file:{quote(str(path))}?mode=ro"
    connection = _open(address, path, uri=True)
    try:
        connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as error:
        connection.close()
        if kind_of(error) not in ("read-only", "cannot-open"):
            raise
        connection = _open(address + "&immutable=1", path, uri=True)
    connection.read_only = True
    return connection


def migrate(connection: sqlite3.Connection) -> None:
    connection.execute("BEGIN IMMEDIATE")
    try:
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        for index in range(version, len(MIGRATIONS)):
            for statement in _statements(MIGRATIONS[index]):
                connection.execute(statement)
        connection.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise


def _statements(script: str) -> list[str]:
    """Split a migration into statements (executescript would commit the transaction)."""
    statements, current = [], []
    for line in script.splitlines():
        code = line.split("--", 1)[0]
        current.append(code)
        if code.rstrip().endswith(";"):
            statement = "\n".join(current).strip()
            if statement.strip(";").strip():
                statements.append(statement)
            current = []
    return statements
