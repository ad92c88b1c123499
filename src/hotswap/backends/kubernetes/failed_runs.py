"""The cluster's record of the runs that ended FAILED, so that no machine's ``workload create``
resumes one (its pods' ``auto`` rule is told them in HOTSWAP_FAILED_RUNS).

One ConfigMap per cluster, :func:`record_name`, in its namespace; one key per run
(``<workload>.<run id>``) whose value says which workload, which run, why and when. Written by
the controller when it sees a JobSet end FAILED (a hang kill, restarts exhausted, JobSet's own
failure) and by ``workload delete`` of a FAILED workload, whichever comes first: a JSON merge
patch that adds keys, so a second write changes nothing and two writers never conflict. No
JobSet owns it: it outlives the runs it names (the CLI's own archive, :func:`.log_archive.
failed_runs`, lives on one machine only). ``workload create`` reads it.

Nothing removes it, not even ``cluster delete`` (which forgets the cluster on this machine
only): a run id is never reused, so an entry never stops a new run; it only keeps ``auto`` from
choosing that run. ``--fresh`` starts over; ``--resume-from RUN`` resumes a failed run on
purpose. At most about 350 bytes an entry, the ConfigMap's 1 MiB holds some 3,000 failed runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from hotswap.api.times import iso_utc
from hotswap.backends.kubernetes import labels, log_archive
from hotswap.backends.kubernetes.live_objects import LiveJobSet
from hotswap.backends.kubernetes.views import failed_run

Entries = dict[str, str]  # ConfigMap data: key -> JSON of one failed run
WHY_CHARS = 200  # of the status message kept: entries stay small (the ConfigMap holds at most 1 MiB)


def record_name(cluster: str) -> str:
    return labels.FAILED_RUNS_RECORD_PREFIX + cluster


def entry(workload: str, run_id: str, why: str, now: float) -> Entries:
    value = {"workload": workload, "run_id": run_id, "why": why[:WHY_CHARS], "recorded_at": iso_utc(now)}
    return {f"{workload}.{run_id}": json.dumps(value, sort_keys=True)}


def entries_of(jobsets: Iterable[LiveJobSet], now: float) -> Entries:
    """The entries of the JobSets whose run ended FAILED."""
    found: Entries = {}
    for job in jobsets:
        failed = failed_run(job)
        if failed is not None:
            found.update(entry(job.name, failed[0], failed[1], now))
    return found


def read(client: Any, cluster: str) -> Entries:
    config_map = client.get_config_map(record_name(cluster))
    data = (config_map or {}).get("data")
    return dict(data) if isinstance(data, dict) else {}


def runs_of(entries: Entries, workload: str) -> tuple[str, ...]:
    """The workload's failed runs among ``entries``, oldest first (run ids sort by start time)."""
    runs = set()
    for text in entries.values():
        try:
            value = json.loads(text)
        except ValueError:
            continue  # edited by hand: not ours to read
        if isinstance(value, dict) and value.get("workload") == workload and isinstance(value.get("run_id"), str):
            runs.add(value["run_id"])
    return tuple(sorted(runs))


def known(client: Any, cluster: str, workload: str) -> tuple[str, ...]:
    """The workload's failed runs as the cluster's record and this machine's log archive know
    them (a run failed, or deleted, from another machine is only in the former)."""
    return tuple(sorted({*runs_of(read(client, cluster), workload), *log_archive.failed_runs(cluster, workload)}))


def write(client: Any, cluster: str, entries: Entries) -> None:
    """Add ``entries`` to the cluster's record (creating it if it is not there)."""
    meta_labels = {labels.MANAGED_BY_LABEL: labels.MANAGED_BY, labels.CLUSTER_LABEL: cluster}
    client.add_to_config_map(record_name(cluster), entries, meta_labels)


class FailedRunRecorder:
    """The controller's writer. Each round it is given the live JobSets; it reads the record
    only when a FAILED run is new to it, and writes only what the record lacks, so a round with
    nothing new reads and writes nothing. What it knows is what the cluster held when it last
    read (a restarted controller reads it again)."""

    def __init__(self, client: Any, cluster: str) -> None:
        self.client = client
        self.cluster = cluster
        self.name = record_name(cluster)
        self.known: set[str] | None = None
        self.refused = False  # said once: the controller's Role cannot read or write the record

    def record(self, jobsets: Iterable[LiveJobSet], now: float) -> list[str]:
        """Record the FAILED runs the cluster's record lacks; returns their keys."""
        wanted = entries_of(jobsets, now)
        if all(self.known is not None and key in self.known for key in wanted):
            return []
        self.known = set(read(self.client, self.cluster))
        missing = {key: value for key, value in wanted.items() if key not in self.known}
        if missing:
            write(self.client, self.cluster, missing)
            self.known |= set(missing)
        return sorted(missing)
