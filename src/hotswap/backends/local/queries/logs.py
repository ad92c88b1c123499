"""Which log file ``workload logs`` reads, and why there is none when there is none.

A workload's logs live in its directory (``workloads/<name>-<seq>/logs``), which stays after
``workload delete`` until the cluster is deleted: the log of a deleted workload (its latest
incarnation of that name) is still readable. When no worker ever wrote one, the reason is said
(still queued, never started, deleted before it started) with a non-zero exit instead of an
empty answer.
"""

from __future__ import annotations

import re
from pathlib import Path

from hotswap.api.catalog import get_device_type
from hotswap.api.errors import NotFoundError
from hotswap.api.limits import check_text
from hotswap.api.names import validate_workload_name
from hotswap.backends.local import workload_files
from hotswap.backends.local.queries.records import open_store, workload_record
from hotswap.backends.local.queries.views import workload_view
from hotswap.backends.views import FINISHED
from hotswap.store.paths import ClusterPaths
from hotswap.store.registry import existing


def log_file(cluster: str, name: str, slice_: str | None, host: int, follow: bool = False) -> Path:
    """The log of one host of one replica (``--slice``: a replica index or a slice name); a
    deleted workload's when no workload of that name exists now. NotFoundError saying why
    when there is no log at all, unless ``follow`` waits for a live workload's to appear."""
    paths = existing(cluster)
    try:
        record, _ = workload_record(paths, name)
    except NotFoundError:
        return _deleted_log(paths, name, slice_, host)
    spec = record["spec"]
    replica = _replica(slice_, list(record["slices"]), spec["num_slices"], name, _indexes(paths, name, record["seq"]))
    hosts = get_device_type(spec["device_type"]).hosts_per_slice
    if not 0 <= host < hosts:
        raise NotFoundError(f"{spec['device_type']} has hosts 0-{hosts - 1}, not {host}")
    path = workload_files.log_path(paths.workload_dir(name, record["seq"]), replica, host)
    view = workload_view(record)
    if not path.exists() and not (follow and view["status"] not in FINISHED):
        raise NotFoundError(_why_no_log(view, replica, host))
    return path


def _indexes(paths: ClusterPaths, name: str, seq: int) -> dict[str, int]:
    """The replica index of each slice's newest worker: an elastic joiner runs under the
    parked index of the replica it replaced, not at its slice's position in the list."""
    with open_store(paths) as store:
        rows = [w.identity for w in store.worker_rows.select(workload=name) if w.identity.seq == seq]
    return {identity.slice: identity.replica for identity in rows}  # oldest first: the newest wins


def _replica(slice_: str | None, slices: list[str], num_slices: int, name: str, indexes: dict[str, int]) -> int:
    replica = 0
    if slice_ is not None:
        check_text("--slice", slice_)
        if slice_.isascii() and slice_.isdigit() and len(slice_) < 10:
            replica = int(slice_)
        elif slice_ in slices:
            replica = indexes.get(slice_, slices.index(slice_))
        else:
            raise NotFoundError(
                f"workload {name} does not run on slice {slice_}; give a replica index"
                f" (0-{num_slices - 1}) or one of: {', '.join(slices) or 'none'}"
            )
    if replica >= num_slices:
        raise NotFoundError(f"workload {name} has replicas 0-{num_slices - 1}, not {replica}")
    return replica


def _why_no_log(view: dict, replica: int, host: int) -> str:
    name, status = view["name"], view["status"]
    if status == "QUEUED" and not view["attempt"]:
        return f"workload {name} has no logs: it is QUEUED and has not started yet ({view['status_message']})"
    if status == "QUEUED":
        return f"workload {name} has no log of replica {replica} host {host}: it is QUEUED again ({view['status_message']})"
    if status in ("RUNNING", "RESTARTING"):
        return f"workload {name} has no log of replica {replica} host {host} yet: its workers are starting ({status})"
    return f"workload {name} has no logs: it never started ({status}: {view['status_message']})"


def _deleted_log(paths: ClusterPaths, name: str, slice_: str | None, host: int) -> Path:
    """The log of the latest deleted workload of this name, if one ever ran."""
    validate_workload_name(name)
    pattern = re.compile(rf"^{re.escape(name)}-(\d+)$")
    seqs = [int(m.group(1)) for entry in (paths.root / "workloads").glob(f"{name}-*") if (m := pattern.match(entry.name))]
    if not seqs:
        raise NotFoundError(f"no workload named {name} in cluster {paths.name}")
    if slice_ is not None and not (slice_.isascii() and slice_.isdigit() and len(slice_) < 10):
        raise NotFoundError(f"workload {name} was deleted: give --slice as a replica index")
    replica = int(slice_) if slice_ is not None else 0
    path = workload_files.log_path(paths.workload_dir(name, max(seqs)), replica, host)
    if not path.exists():
        raise NotFoundError(f"workload {name} was deleted and left no log of replica {replica} host {host}")
    return path
