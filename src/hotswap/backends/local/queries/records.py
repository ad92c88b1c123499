"""The reads every query (and a command's checks) starts from: the cluster's database, opened
for one read, and the records in it. Nothing here writes, and nothing starts a controller."""

from __future__ import annotations

import sqlite3
from typing import Any

from hotswap.api.errors import NotFoundError
from hotswap.api.launch import Launch
from hotswap.backends.local.tables import LocalStore
from hotswap.store.paths import ClusterPaths


def open_store(paths: ClusterPaths) -> LocalStore:
    return LocalStore.open(paths.database)


def workload_record(paths: ClusterPaths, name: str) -> tuple[dict[str, Any], Launch]:
    with open_store(paths) as store:
        for record, launch in store.launches.with_records():
            if record["spec"]["name"] == name:
                return record, launch
    raise NotFoundError(f"no workload named {name} in cluster {paths.name}")


def holders(store: LocalStore) -> dict[str, str]:
    """slice -> the workload holding it."""
    return {s: record["spec"]["name"] for record in store.workload_records() for s in record["slices"]}


def cluster_state(paths: ClusterPaths) -> str:
    """``missing`` (no usable record yet), ``deleted`` (being removed) or ``live``."""
    if not paths.database.exists():
        return "missing"
    with open_store(paths) as store:
        try:
            if store.deleted():
                return "deleted"
            store.cluster()
            return "live"
        except (LookupError, sqlite3.OperationalError):
            return "missing"  # created, but its record was never written (a crash at creation)


def slice_count(paths: ClusterPaths) -> int:
    with open_store(paths) as store:
        return len(store.slice_rows())

