"""The clusters of this user, of every backend: each is a directory under ``<home>/clusters``
whose database holds the cluster's record (which backend serves it, and its settings).

The CLI finds a cluster here and hands it to the backend its record names; no backend looks
another's clusters up.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hotswap.api.errors import NotFoundError
from hotswap.api.names import validate_cluster_name
from hotswap.api.phases import WorkloadPhase
from hotswap.store import faults
from hotswap.store.paths import ClusterPaths, clusters_root
from hotswap.store.state import ClusterRecord, Store


def cluster_names() -> list[str]:
    """Every cluster with a database, sorted by name."""
    root = clusters_root()
    if not root.is_dir():
        return []
    # Names starting with "." are not clusters (tombstones of deleted ones, creation locks).
    return sorted(p.name for p in root.iterdir() if not p.name.startswith(".") and _has_database(p))


def _has_database(directory: Path) -> bool:
    try:
        return (directory / "state.db").exists()
    except OSError:
        return True  # there, but it cannot be read: listed, and its summary says why


def find(cluster: str) -> ClusterRecord | None:
    """The record of ``cluster``, or None when there is no such cluster."""
    validate_cluster_name(cluster)
    paths = ClusterPaths.of(cluster)
    if not paths.database.exists():
        return None
    with Store.open(paths.database) as store:
        return store.cluster()


def existing(cluster: str) -> ClusterPaths:
    """The paths of a cluster that exists, or a one-line error that says which ones do."""
    validate_cluster_name(cluster)
    paths = ClusterPaths.of(cluster)
    if not paths.database.exists():
        known = cluster_names()
        hint = f"; clusters: {', '.join(known)}" if known else ""
        raise NotFoundError(
            f"no cluster named {cluster}: create it with `hotswap cluster create --cluster {cluster}"
            f" --device-type T --num-slices N`{hint}"
        )
    return paths


def record_of(cluster: str) -> ClusterRecord:
    """The record of a cluster that exists (see :func:`existing` for the error)."""
    paths = existing(cluster)
    with Store.open(paths.database) as store:
        return store.cluster()


@dataclasses.dataclass(frozen=True)
class ClusterSummary:
    """A row of ``cluster list``, the same for every backend: the record, and what the cluster's
    database holds (a Kubernetes cluster's holds the slices ``cluster create`` found)."""

    name: str
    backend: str
    device_type: str
    num_slices: int
    workloads: int
    running: int
    queued: int
    controller_pid: int | None  # of a local cluster's controller, while it runs


def summaries() -> list[ClusterSummary]:
    """Every cluster, sorted by name."""
    rows = []
    for name in cluster_names():
        paths = ClusterPaths.of(name)
        try:
            with Store.open(paths.database) as store:
                record = store.cluster()
                phases = [WorkloadPhase(r["phase"]) for r in store.workload_records()]
                slices = len(store.slice_rows())
        except Exception as error:  # one unreadable cluster must not hide the others
            if not (faults.is_fault(error) or faults.unreadable(error)):
                raise
            rows.append(ClusterSummary(name, "?", f"unreadable ({faults.kind_of(error)})", 0, 0, 0, 0, None))
            continue
        rows.append(
            ClusterSummary(
                name=name,
                backend=record.backend,
                device_type=record.device_type,
                num_slices=slices,
                workloads=len(phases),
                running=sum(1 for phase in phases if phase.holds_slices),
                queued=phases.count(WorkloadPhase.QUEUED),
                controller_pid=paths.controller_pid(),
            )
        )
    return rows
