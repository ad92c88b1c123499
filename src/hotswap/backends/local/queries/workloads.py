"""``workload list``, ``workload describe`` and whether a workload is gone, read from the
cluster's database (``workload list`` loads no pydantic model: it is what people and scripts
run most)."""

from __future__ import annotations

import time

from hotswap.backends.local import workload_files
from hotswap.backends.local.queries.records import open_store, workload_record
from hotswap.backends.local.queries.views import run_view, workload_view
from hotswap.backends.local.tables import LIVE_WORKER_STATES
from hotswap.backends.views import WorkloadDescription, WorkloadRow, iso, matches
from hotswap.store.registry import existing


def workload_gone(cluster: str, name: str) -> bool:
    paths = existing(cluster)
    with open_store(paths) as store:
        recorded = any(record["spec"]["name"] == name for record in store.workload_records())
        return not recorded and not store.worker_rows.select(states=LIVE_WORKER_STATES, workload=name)


def list_workloads(cluster: str, status: str = "EVERYTHING", job_filter: str | None = None) -> list[WorkloadRow]:
    paths = existing(cluster)
    with open_store(paths) as store:
        views = [{**workload_view(r), **run_view(launch)} for r, launch in store.launches.with_records()]
    return [v for v in views if matches(v, status, job_filter)]


def describe_workload(cluster: str, name: str, timeline: bool = True) -> WorkloadDescription:
    from hotswap.backends.local.queries.goodput import workload_goodput
    from hotswap.backends.local.queries.progress import workload_progress
    from hotswap.backends.local.worker_events import WorkerEvents

    paths = existing(cluster)
    record, launch = workload_record(paths, name)
    with open_store(paths) as store:
        events = store.timeline(name, record["seq"]) if timeline else []
        workers = [w for w in store.worker_rows.select(workload=name) if w.identity.seq == record["seq"]]
        nodes = {row["name"]: row["state"] for row in store.node_rows()}
        slice_nodes: dict[str, list[str]] = {}
        for row in store.node_rows():
            slice_nodes.setdefault(row["slice"], []).append(row["name"])
    view: WorkloadDescription = workload_view(record)  # its row, described below
    directory = paths.workload_dir(name, record["seq"])
    spec = record["spec"]
    view["spec"] = spec
    view["checkpoint_dir"] = launch.checkpoint_dir
    view.update(run_view(launch))
    view["workdir"] = launch.cwd
    replicas = {w.identity.slice: w.identity.replica for w in workers}  # oldest first: the newest wins
    view["placement"] = [
        {
            "replica": replicas.get(slice_name, index),  # an elastic joiner's: the parked index it took
            "slice": slice_name,
            "nodes": [{"name": n, "state": nodes.get(n)} for n in slice_nodes.get(slice_name, [])],
        }
        for index, slice_name in enumerate(record["slices"])
    ]
    view["workers"] = [
        {
            "attempt": w.identity.attempt,
            "slice": w.identity.slice,
            "replica": w.identity.replica,
            "host": w.identity.host,
            "pid": w.pid,
            "state": w.state,
            "exit_code": w.exit_code,
        }
        for w in workers
        if w.identity.attempt == record["attempt"] or w.state != "exited"
    ]
    view["logs"] = str(directory / "logs")
    view["main_log"] = str(workload_files.log_path(directory, 0, 0))
    if timeline:
        view["timeline"] = [{"time": iso(e["t"]), "event": e["kind"], "message": e["message"]} for e in events]
        worker_events = WorkerEvents.read(directory)  # once: goodput and progress both read them
        view["goodput"] = workload_goodput(record, events, directory, time.time(), worker_events)
        view["progress"] = workload_progress(events, directory, int(spec["num_slices"]), worker_events)
    return view

