"""``cluster create`` (a new cluster, or a resize of one) and ``cluster delete`` on the local
backend, in the CLI's process: every check before anything is written, GPU claims under the
machine's lock, then a request the controller serves (see ``client.py``); the deletion itself is
``removal.py``'s."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from hotswap.api.catalog import DeviceType, get_device_type
from hotswap.api.errors import ConflictError, Declined, InvalidInputError
from hotswap.api.names import validate_cluster_name
from hotswap.backends.local.commands import client, removal
from hotswap.backends.local.commands.new_cluster import NewClusterDefaults, parse_warm_workers
from hotswap.backends.local.gpu.backing import Backing, gpus_per_host
from hotswap.backends.local.gpu.claims import GpuSelection, claim, claims_lock
from hotswap.backends.local.gpu.nvml import GpuInfo
from hotswap.backends.local.protocol import MAX_LOCAL_SLICES
from hotswap.backends.local.queries.records import cluster_state, open_store, slice_count
from hotswap.backends.local.queries.views import workload_view
from hotswap.backends.local.resize import resize_events
from hotswap.backends.local.settings import LocalSettings
from hotswap.backends.local.tables import LocalStore
from hotswap.backends.views import FINISHED
from hotswap.store.paths import ClusterPaths, file_lock, private_dir
from hotswap.store.registry import existing, record_of
from hotswap.store.state import ClusterRecord

BACKEND = "local"


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
) -> None:
    """Create a local cluster, or resize it when it exists (``cluster create`` re-run).

    ``warm_workers``: spare worker processes kept with PyTorch already imported, handed to
    workers that must start (a restart then skips the import); ``"auto"`` (what a new cluster
    gets when None: see :func:`hotswap.core.warm_policy.auto_warm_workers`, or
    ``$HOTSWAP_WARM_WORKERS``) sizes them by the slices and the free memory. ``hotswap=False``: workloads
    that lose a slice wait for its repair instead (the baseline hotswap is measured against).
    None keeps the current setting. ``zygote``: keep a pre-imported process that forks workers
    and spares (a new cluster's default: ``$HOTSWAP_ZYGOTE``, else where memory allows). ``gpus`` (``--gpus``): back the slices by this machine's
    GPUs (see :mod:`hotswap.backends.local.gpu.backing`); ``num_slices`` may then be left to them.
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
            _create_or_resize(paths, device, num_slices, force, confirm, warm_workers, warm_preload, hotswap, defaults, zygote=zygote)
            return
        # Claims are made under the machine's one lock, held until the controller has recorded
        # them: two concurrent creates never take the same GPU.
        with claims_lock():
            pool, num_slices = claim(paths.name, device, selection, num_slices, backing)
            if not 1 <= num_slices <= MAX_LOCAL_SLICES:
                raise InvalidInputError(f"--num-slices must be between 1 and {MAX_LOCAL_SLICES}")
            _create_or_resize(
                paths, device, num_slices, force, confirm, warm_workers, warm_preload, hotswap, defaults, pool, zygote=zygote
            )


def _backing_of(paths: ClusterPaths, selection: GpuSelection | None) -> Backing | None:
    """The backing the cluster has (an existing one's) or asks for (a new one's, empty); None
    for an emulated cluster. Backing is set when a cluster is created and never changes."""
    existing = record_of(paths.name) if cluster_state(paths) == "live" else None
    if existing is None:
        return Backing(0) if selection is not None else None
    backing = LocalSettings.of(existing.settings).backing
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
) -> None:
    from hotswap.backends.local.requests import ResizeCluster  # loaded for requests only (see requests.py)

    name = paths.name
    state = cluster_state(paths)
    if state == "deleted":  # a `cluster delete` that was cut short: finish it first
        removal.delete_cluster(paths)
    fresh, current_zygote = state != "live", None
    if fresh:
        private_dir(paths.root)
        settings = LocalSettings(backing=None if gpu_pool is None else Backing(gpus_per_host(device)))
        with LocalStore.open(paths.database, create=True) as store:
            store.init_cluster(ClusterRecord(name, BACKEND, device.name, time.time(), settings.to_settings()))
    else:
        record = record_of(name)
        if record.backend != BACKEND:
            raise ConflictError(f"cluster {name} exists on the {record.backend} backend")
        if record.device_type != device.name:
            raise ConflictError(
                f"cluster {name} exists with device type {record.device_type}; its device type cannot"
                f" change (delete it first, or use --device-type {record.device_type})"
            )
        current, current_zygote = slice_count(paths), LocalSettings.of(record.settings).zygote
        if num_slices < current and not force and not confirm(_shrink_question(paths, num_slices)):
            raise Declined(f"cluster {name} left at {current} slices; nothing changed")
    spares = defaults.settings(warm_workers, zygote, num_slices, device.hosts_per_slice, current_zygote)
    resize = ResizeCluster(
        num_slices,
        warm_workers=spares.get("warm_workers"),
        warm_preload=tuple(warm_preload) if "warm_workers" in spares and warm_preload is not None else None,
        hotswap=hotswap,
        zygote=spares.get("zygote"),
        gpus=None if gpu_pool is None else tuple(gpu_pool),
    )
    outcome = client.request(paths, resize)
    if outcome.status != "done":
        raise ConflictError(outcome.message)


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

