"""Logs of deleted workloads: ``workload delete`` keeps the tail of each worker's log, because
the pods (and with them the kubelet's logs) go with the JobSet.

The archive lives in the cluster's record directory, which ``cluster delete`` removes, keyed by
workload and run id: a workload created again under its name (a new run) shows its own live
logs, never an earlier run's archive. Each worker keeps its last :data:`TAIL_BYTES` (the API
can only cut a log's head, so the log is read through and its tail kept); a pod
that cannot be read (gone already, its container never started) is listed as such and never
fails the delete.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from hotswap.api.errors import HotswapError
from hotswap.api.times import iso_utc
from hotswap.backends.kubernetes.live_objects import LivePod, container_of
from hotswap.store.paths import ClusterPaths, new_dirs_private, open_private, write_private

TAIL_BYTES = 4 * 1024 * 1024  # per worker: what the kubelet keeps by default is 10 MiB
_READERS = 8  # pods read at once (a delete of a 64-host job stays quick)
_INDEX = "index.json"


@dataclasses.dataclass(frozen=True)
class Archived:
    """One run's archive: where it is and what it holds."""

    directory: Path
    index: dict[str, Any]

    def log_of(self, replica: int, host: int) -> Path | None:
        for worker in self.index["workers"]:
            if worker["replica"] == replica and worker["host"] == host and worker.get("file"):
                return self.directory / worker["file"]
        return None

    def unreadable(self, replica: int, host: int) -> str | None:
        for worker in self.index["workers"]:
            if worker["replica"] == replica and worker["host"] == host and not worker.get("file"):
                return worker.get("error") or "it could not be read"
        return None


def _root(cluster: str, workload: str) -> Path:
    return ClusterPaths.of(cluster).root / "logs" / workload


def current_pods(pods: list[LivePod]) -> list[LivePod]:
    """One pod per worker (replica, host): the newest attempt's, a running one first."""
    best: dict[tuple[int, int], LivePod] = {}
    for pod in pods:
        if pod.replica is None or pod.host is None:
            continue
        key = (pod.replica, pod.host)
        rank = (pod.attempt or 0, not pod.terminating)
        held = best.get(key)
        if held is None or rank > ((held.attempt or 0), not held.terminating):
            best[key] = pod
    return [best[key] for key in sorted(best)]


def archive(client: Any, cluster: str, workload: str, run_id: str, pods: list[LivePod], status: str | None = None) -> Archived:
    """Keep the log tails of ``pods`` (one per worker, see :func:`current_pods`) of a run, and
    the workload's ``status`` when it was deleted (a FAILED run is never resumed: :func:`failed_runs`)."""
    directory = _root(cluster, workload) / run_id
    new_dirs_private(directory)

    def keep(pod: LivePod) -> dict[str, Any]:
        entry: dict[str, Any] = {"replica": pod.replica, "host": pod.host, "pod": pod.name}
        tail = bytearray()
        seen = 0
        try:
            for chunk in client.pod_log(pod.name, False, container_of(pod.annotations)):
                seen += len(chunk)
                tail += chunk
                if len(tail) > 2 * TAIL_BYTES:  # trim now and then, not at every chunk
                    del tail[: len(tail) - TAIL_BYTES]
        except HotswapError as error:
            return {**entry, "error": str(error)}
        data = bytes(tail[-TAIL_BYTES:])
        name = f"replica-{pod.replica}-host-{pod.host}.log"
        with os.fdopen(open_private(directory / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as handle:
            handle.write(data)
        return {**entry, "file": name, "bytes": len(data), "truncated": seen > len(data)}

    with concurrent.futures.ThreadPoolExecutor(max_workers=_READERS) as readers:
        workers = list(readers.map(keep, pods))
    index = {"workload": workload, "run_id": run_id, "archived_at": iso_utc(time.time()), "status": status, "workers": workers}
    write_private(directory / _INDEX, json.dumps(index, indent=1))  # last: marks the archive whole
    return Archived(directory, index)


def newest(cluster: str, workload: str) -> Archived | None:
    """The archive of the workload's latest deleted run (run ids sort by their start time)."""
    root = _root(cluster, workload)
    if not root.is_dir():
        return None
    for directory in sorted((d for d in root.iterdir() if (d / _INDEX).is_file()), reverse=True):
        try:
            return Archived(directory, json.loads((directory / _INDEX).read_text()))
        except (OSError, ValueError):
            continue  # a half-written archive (the delete was interrupted): try an older one
    return None


def failed_runs(cluster: str, workload: str) -> tuple[str, ...]:
    """The workload's deleted runs that had ended FAILED (the pods' HOTSWAP_FAILED_RUNS: their
    workers' save on SIGTERM must not make a later run resume them)."""
    root = _root(cluster, workload)
    if not root.is_dir():
        return ()
    found = []
    for directory in sorted(d for d in root.iterdir() if (d / _INDEX).is_file()):
        try:
            index = json.loads((directory / _INDEX).read_text())
        except (OSError, ValueError):
            continue
        if index.get("status") == "FAILED" and isinstance(index.get("run_id"), str):
            found.append(index["run_id"])
    return tuple(found)
