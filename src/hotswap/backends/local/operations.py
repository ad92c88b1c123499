"""The operations of the local backend, as the CLI calls them.

Every operation validates what a user gave before anything is written, so a rejected command
changes no state; requests that change the cluster go through the controller (see
:mod:`hotswap.backends.local.client`), reads go to the database.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hotswap.api.catalog import DeviceType, get_device_type
from hotswap.api.launch import Launch
from hotswap.api.errors import CapacityError, ConflictError, Declined, InvalidInputError, NotFoundError, never_fits
from hotswap.api.limits import check_text
from hotswap.api.names import validate_cluster_name
from hotswap.backends.local import client, removal, runs
from hotswap.backends.local import launch as files
from hotswap.backends.local.gpus import Backing, GpuSelection, claim, claims_lock, gpus_per_host
from hotswap.backends.local.nvml import GpuInfo
from hotswap.backends.local.protocol import MAX_LOCAL_SLICES, NodeOperation, RequestKind
from hotswap.backends.local.resize import resize_events
from hotswap.backends.local.spares import (
    NewClusterDefaults, parse_warm_workers,
)
from hotswap.backends.local.runs import run_view
from hotswap.backends.local.views import gpu_health, gpu_views, node_reasons, workload_view
from hotswap.backends.views import (
    FINISHED, ClusterCreated, ClusterDescription, NodeRow, WorkloadCreated, WorkloadDescription, WorkloadRow, iso, matches,
)
from hotswap.store.paths import ClusterPaths, file_lock, private_dir
from hotswap.store.registry import existing, record_of
from hotswap.backends.local.tables import LIVE_WORKER_STATES, LocalStore
from hotswap.store.state import ClusterRecord

if TYPE_CHECKING:  # pydantic loads only where specs are built or validated: reads stay fast
    from hotswap.api.spec import WorkloadSpec

BACKEND = "local"


def open_store(paths: ClusterPaths) -> LocalStore:
    return LocalStore.open(paths.database)


# ---------------------------------------------------------------------- clusters


def create_cluster(
    name: str,
    device_type: str,
    num_slices: int | None,
    force: bool,
    confirm: Callable[[str], bool],
    warm_workers: int | str | None = None,
    warm_preload: list[str] | None = None,
    hotswap: bool | None = None,
    gpus: str | None = None,
    zygote: bool | None = None,
) -> ClusterCreated:
    """Create a local cluster, or resize it when it exists (``cluster create`` re-run).

    ``warm_workers``: spare worker processes kept with PyTorch already imported, handed to
    workers that must start (a restart then skips the import); ``"auto"`` (what a new cluster
    gets when None: see :func:`hotswap.core.warm_policy.auto_warm_workers`, or
    ``$HOTSWAP_WARM_WORKERS``) sizes them by the slices and the free memory. ``hotswap=False``: workloads
    that lose a slice wait for its repair instead (the baseline hotswap is measured against).
    None keeps the current setting. ``zygote``: keep a pre-imported process that forks workers
    and spares (a new cluster's default: ``$HOTSWAP_ZYGOTE``, else where memory allows). ``gpus`` (``--gpus``): back the slices by this machine's
    GPUs (see :mod:`hotswap.backends.local.gpus`); ``num_slices`` may then be left to them.
    """
    validate_cluster_name(name)
    warm_workers = parse_warm_workers(warm_workers)
    defaults = NewClusterDefaults.read()  # $HOTSWAP_WARM_WORKERS, $HOTSWAP_ZYGOTE: refused before any state exists
    device = get_device_type(device_type)
    selection = GpuSelection.parse(gpus) if gpus is not None else None
    if selection is not None:
        gpus_per_host(device)  # a TPU type: one line, before anything else
    if num_slices is not None and not 1 <= num_slices <= MAX_LOCAL_SLICES:
        raise InvalidInputError(f"--num-slices must be between 1 and {MAX_LOCAL_SLICES}")
    paths = ClusterPaths.of(name)
    private_dir(paths.root.parent)
    removal.remove_tombstones(paths.root.parent)
    with _creation_lock(paths):
        backing = _backing_of(paths, selection)
        if backing is None:
            if num_slices is None:
                raise InvalidInputError("--num-slices is needed (or --gpus, to take the count from the GPUs)")
            return _create_or_resize(paths, device, num_slices, force, confirm, warm_workers, warm_preload, hotswap, defaults, zygote=zygote)
        # Claims are made under the machine's one lock, held until the controller has recorded
        # them: two concurrent creates never take the same GPU.
        with claims_lock():
            pool, num_slices = claim(paths.name, device, selection, num_slices, backing)
            if not 1 <= num_slices <= MAX_LOCAL_SLICES:
                raise InvalidInputError(f"--num-slices must be between 1 and {MAX_LOCAL_SLICES}")
            return _create_or_resize(
                paths, device, num_slices, force, confirm, warm_workers, warm_preload, hotswap, defaults, pool, zygote=zygote
            )


def _backing_of(paths: ClusterPaths, selection: GpuSelection | None) -> Backing | None:
    """The backing the cluster has (an existing one's) or asks for (a new one's, empty); None
    for an emulated cluster. Backing is set when a cluster is created and never changes."""
    existing = record_of(paths.name) if _state_of(paths) == "live" else None
    if existing is None:
        return Backing(0) if selection is not None else None
    backing = Backing.of(existing.settings)
    if backing is None and selection is not None:
        raise ConflictError(
            f"cluster {paths.name} is emulated: its slices cannot take GPUs (delete it, then create it with --gpus)"
        )
    return backing


def _creation_lock(paths: ClusterPaths) -> contextlib.AbstractContextManager[None]:
    """One `cluster create` of a name at a time: concurrent ones wait, then see the cluster."""
    return file_lock(paths.root.parent / f".{paths.name}.create.lock")


def _create_or_resize(
    paths: ClusterPaths,
    device: DeviceType,
    num_slices: int,
    force: bool,
    confirm: Callable[[str], bool],
    warm_workers: int | str | None,
    warm_preload: list[str] | None,
    hotswap: bool | None,
    defaults: NewClusterDefaults,
    gpu_pool: list[GpuInfo] | None = None,
    zygote: bool | None = None,
) -> ClusterDescription:
    name = paths.name
    state = _state_of(paths)
    if state == "deleted":  # a `cluster delete` that was cut short: finish it first
        removal.delete_cluster(paths)
    fresh, current_zygote = state != "live", None
    if fresh:
        private_dir(paths.root)
        settings = {} if gpu_pool is None else {"gpus": Backing(gpus_per_host(device)).to_settings()}
        with LocalStore.open(paths.database, create=True) as store:
            store.init_cluster(ClusterRecord(name, BACKEND, device.name, time.time(), settings))
    else:
        record = record_of(name)
        if record.backend != BACKEND:
            raise ConflictError(f"cluster {name} exists on the {record.backend} backend")
        if record.device_type != device.name:
            raise ConflictError(
                f"cluster {name} exists with device type {record.device_type}; its device type cannot"
                f" change (delete it first, or use --device-type {record.device_type})"
            )
        current, current_zygote = _slice_count(paths), bool(record.settings.get("zygote", False))
        if num_slices < current and not force and not confirm(_shrink_question(paths, num_slices)):
            raise Declined(f"cluster {name} left at {current} slices; nothing changed")
    payload: dict[str, Any] = {
        "num_slices": num_slices, **defaults.settings(warm_workers, zygote, num_slices, device.hosts_per_slice, current_zygote)
    }
    if "warm_workers" in payload and warm_preload is not None:
        payload["warm_preload"] = warm_preload
    if hotswap is not None:
        payload["hotswap"] = hotswap
    if gpu_pool is not None:
        payload["gpus"] = [g.to_json() for g in gpu_pool]
    outcome = client.request(paths, RequestKind.RESIZE, payload)
    if outcome.status != "done":
        raise ConflictError(outcome.message)
    return describe_cluster(name)


def _holders(store: LocalStore) -> dict[str, str]:
    """slice -> the workload holding it."""
    return {s: record["spec"]["name"] for record in store.workload_records() for s in record["slices"]}


def _state_of(paths: ClusterPaths) -> str:
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


def _slice_count(paths: ClusterPaths) -> int:
    with open_store(paths) as store:
        return len(store.slice_rows())


def _shrink_question(paths: ClusterPaths, num_slices: int) -> str:
    """The question before a shrink: which slices go (the controller's rule) and what runs there."""
    with open_store(paths) as store:
        snapshot, record = store.load_snapshot(time.time()), store.cluster()
    removed = [event.name for event in resize_events(snapshot, record, num_slices)]
    lines = [f"shrink cluster {paths.name} from {len(snapshot.slices)} to {num_slices} slices?"]
    for slice_name in removed:
        holder = snapshot.holders.get(slice_name)
        lines.append(f"  remove slice {slice_name}" + (f": workload {holder} runs there and is moved or requeued" if holder else " (free)"))
    return "\n".join(lines)


def delete_cluster(name: str, confirm: Callable[[str], bool] = lambda _: True) -> None:
    """Stop every worker gracefully, then the controller, then remove the cluster's state
    (see ``removal.py``: an interrupted deletion is finished by running it again). ``confirm``
    is asked first when workloads have not finished (the question lists them).

    Checkpoints are kept (they live outside the cluster directory)."""
    paths = existing(name)
    unfinished: list[dict[str, Any]] = []
    with contextlib.suppress(Exception):  # an unreadable or half-deleted cluster: nothing to list, remove it
        with open_store(paths) as store:
            if not store.deleted():
                unfinished = [v for v in (workload_view(r) for r in store.workload_records()) if v["status"] not in FINISHED]
    question = [f"delete cluster {name}? {len(unfinished)} workload(s) have not finished and are stopped:"]
    question += [f"  {v['name']} {v['status']}" + (f" on {', '.join(v['slices'])}" if v["slices"] else "") for v in unfinished]
    if unfinished and not confirm("\n".join(question)):
        raise Declined(f"cluster {name} kept; nothing changed")
    removal.delete_cluster(paths)


def describe_cluster(name: str) -> ClusterDescription:
    paths = existing(name)
    client.ensure_controller(paths, wait=False)
    with open_store(paths) as store:
        record = store.cluster()
        backing = Backing.of(record.settings)
        holders = _holders(store)
        reasons = node_reasons(store)
        nodes_by_slice: dict[str, list[dict[str, Any]]] = {}
        for row in store.node_rows():
            nodes_by_slice.setdefault(row["slice"], []).append(
                {"name": row["name"], "state": row["state"], "reason": reasons.get(row["name"]) or None}
            )
        slices = [
            {
                "name": row["name"],
                "device_type": row["device_type"],
                "workload": holders.get(row["name"]),
                "healthy": all(n["state"] == "Ready" for n in nodes_by_slice.get(row["name"], [])),
                "nodes": nodes_by_slice.get(row["name"], []),
                "gpus": gpu_views(backing, row["name"]),
            }
            for row in store.slice_rows()
        ]
        workloads = [workload_view(r) for r in store.workload_records()]
        health = gpu_health(store) if backing is not None else None
    device = get_device_type(record.device_type)
    return {
        "name": record.name,
        "backend": record.backend,
        "device_type": record.device_type,
        "hosts_per_slice": device.hosts_per_slice,
        "chips_per_host": device.chips_per_host,
        "num_slices": len(slices),
        "created_time": record.created_at,
        "controller_pid": paths.controller_pid(),
        "warm_workers": int(record.settings.get("warm_workers", 0)),
        "zygote": bool(record.settings.get("zygote", False)),
        "hotswap": bool(record.settings.get("hotswap", True)),
        "backing": "gpu" if backing is not None else "emulated",
        "gpus_per_host": backing.per_host if backing is not None else 0,
        "gpu_health": health,
        "state_dir": str(paths.root),
        "slices": slices,
        "workloads": [{"name": w["name"], "status": w["status"], "slices": w["slices"]} for w in workloads],
    }


# ---------------------------------------------------------------------- workloads


def create_workload(cluster: str, spec: WorkloadSpec, launch: Launch) -> WorkloadCreated:
    paths = existing(cluster)
    record = record_of(cluster)
    if spec.device_type != record.device_type:
        raise InvalidInputError(
            f"cluster {cluster} has {record.device_type} slices; the workload asks for {spec.device_type}"
        )
    with open_store(paths) as store:
        store.check_writable()  # said first: the checkpoint directory is often inside the state
    # The root the user named (or the default) is checked: the run's directory inside it is ours.
    root = str(Path(launch.checkpoint_dir).parent) if launch.run is not None else launch.checkpoint_dir
    files.check_checkpoint_dir(root, "--checkpoint-dir" if spec.checkpoint_dir else "the checkpoint directory")
    if launch.run is not None:
        with contextlib.suppress(NotFoundError):  # said at once, not after waiting on its workers
            _record(paths, spec.name)
            raise ConflictError(f"a workload named {spec.name} already exists")  # the core's words
        launch = dataclasses.replace(launch, run=runs.resolve_new(paths, spec, launch))
    _check_fits(paths, spec)  # said at once, in the core's words (exit 5, as on Kubernetes)
    outcome = client.request(paths, RequestKind.CREATE, {"spec": spec.model_dump(mode="json"), "launch": launch.to_dict()})
    if outcome.status != "done":
        _check_fits(paths, spec)  # the cluster shrank meanwhile: still a capacity refusal
        raise ConflictError(outcome.message)
    try:
        return describe_workload(cluster, spec.name, timeline=False)
    except NotFoundError:  # created, then deleted by another command before we looked
        return {"name": spec.name, "status": "DELETED", "status_message": "created, then deleted by another command"}


def _check_fits(paths: ClusterPaths, spec: WorkloadSpec) -> None:
    never = never_fits(spec.num_slices, spec.device_type, _slice_count(paths))  # a local cluster has one device type
    if never is not None:
        raise CapacityError(f"workload {spec.name} rejected: {never}")


def delete_workload(cluster: str, name: str) -> None:
    paths = existing(cluster)
    _record(paths, name)  # a clear error before anything is queued
    outcome = client.request(paths, RequestKind.DELETE, {"workload": name})
    if outcome.status != "done":
        raise NotFoundError(outcome.message)


def workload_gone(cluster: str, name: str) -> bool:
    paths = existing(cluster)
    with open_store(paths) as store:
        recorded = any(record["spec"]["name"] == name for record in store.workload_records())
        return not recorded and not store.worker_rows.select(states=LIVE_WORKER_STATES, workload=name)


def list_workloads(cluster: str, status: str = "EVERYTHING", job_filter: str | None = None) -> list[WorkloadRow]:
    paths = existing(cluster)
    with contextlib.suppress(client.ControllerUnavailable):
        client.ensure_controller(paths, wait=False)
    with open_store(paths) as store:
        views = [{**workload_view(r), **run_view(launch)} for r, launch in store.launches.with_records()]
    return [v for v in views if matches(v, status, job_filter)]


def _record(paths: ClusterPaths, name: str) -> tuple[dict[str, Any], Launch]:
    with open_store(paths) as store:
        for record, launch in store.launches.with_records():
            if record["spec"]["name"] == name:
                return record, launch
    raise NotFoundError(f"no workload named {name} in cluster {paths.name}")


def describe_workload(cluster: str, name: str, timeline: bool = True) -> WorkloadDescription:
    from hotswap.backends.local.goodput import workload_goodput

    paths = existing(cluster)
    record, launch = _record(paths, name)
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
    view["main_log"] = str(files.log_path(directory, 0, 0))
    if timeline:
        view["timeline"] = [{"time": iso(e["t"]), "event": e["kind"], "message": e["message"]} for e in events]
        view["goodput"] = workload_goodput(record, events, directory, time.time())
    return view


# ---------------------------------------------------------------------- nodes


def list_nodes(cluster: str) -> list[NodeRow]:
    paths = existing(cluster)
    with contextlib.suppress(client.ControllerUnavailable):
        client.ensure_controller(paths, wait=False)
    with open_store(paths) as store:
        holders = _holders(store)
        backing = Backing.of(store.cluster().settings)
        reasons = node_reasons(store)
        return [
            {
                "name": row["name"],
                "slice": row["slice"],
                "host": row["host"],
                "state": row["state"],
                "workload": holders.get(row["slice"]),
                "reason": reasons.get(row["name"]) or None if row["state"] != "Ready" else None,
                "gpus": gpu_views(backing, row["slice"], row["host"]),
            }
            for row in store.node_rows()
        ]


def node_operation(cluster: str, operation: str, node: str | None, slice_: str | None) -> list[str]:
    """Apply a fault or a repair to one node or to every node of a slice; returns the nodes."""
    if operation not in tuple(NodeOperation):
        raise InvalidInputError(f"unknown node operation {operation!r}")
    if (node is None) == (slice_ is None):
        raise InvalidInputError("give exactly one of --node or --slice")
    check_text("--node" if node is not None else "--slice", node if node is not None else slice_ or "")
    paths = existing(cluster)
    rows = list_nodes(cluster)
    if node is not None:
        targets = [r["name"] for r in rows if r["name"] == node]
        if not targets:
            raise NotFoundError(f"no node named {node} in cluster {cluster} (see `hotswap node list --cluster {cluster}`)")
    else:
        targets = [r["name"] for r in rows if r["slice"] == slice_]
        if not targets:
            raise NotFoundError(f"no slice named {slice_} in cluster {cluster} (see `hotswap cluster describe --cluster {cluster}`)")
    outcome = client.request(paths, RequestKind.NODE, {"op": operation, "nodes": targets})
    if outcome.status != "done":
        raise NotFoundError(outcome.message)
    return targets
