"""Recording a Kubernetes cluster (``cluster create``): check what is installed, find its slices,
create the PriorityClasses (and Kueue's queues), and keep how to reach it in the local record;
and the summary ``cluster create|describe`` print."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hotswap.api.catalog import get_device_type
from hotswap.api.errors import CapacityError, ConflictError, InvalidInputError, NotFoundError
from hotswap.api.names import validate_cluster_name
from hotswap.backends.kubernetes.discovery import Discovery, discover
from hotswap.backends.kubernetes.render import render_kueue, render_priority_classes
from hotswap.backends.kubernetes.settings import KubeSettings
from hotswap.backends.views import ClusterCreated, ClusterSummary
from hotswap.core.model import Node, Slice, Snapshot
from hotswap.store import registry
from hotswap.store.paths import ClusterPaths, private_dir
from hotswap.store.state import ClusterRecord, Store

BACKEND = "kubernetes"


def create_cluster(
    client_for: Callable[[KubeSettings], Any],
    cluster: str,
    device_type: str | None,
    num_slices: int | None,
    options: dict[str, Any],
) -> ClusterCreated:
    """Record a Kubernetes cluster: check that JobSet (and Kueue) are installed at versions
    hotswap supports (:mod:`.versions`), find its slices, create xpk's PriorityClasses (and
    the Kueue queues). Re-run to refresh."""
    validate_cluster_name(cluster)
    settings = KubeSettings.from_options(options)
    wanted = get_device_type(device_type).name if device_type else None
    if num_slices is not None and num_slices < 1:
        raise InvalidInputError("--num-slices must be at least 1")
    existing = registry.find(cluster)
    if existing is not None and existing.backend != BACKEND:
        raise ConflictError(f"cluster {cluster} exists on the {existing.backend} backend")
    client = client_for(settings)
    installed = client.check_versions(settings.kueue)
    nodes = client.list_nodes()
    discovery = discover(nodes, settings)
    counts = discovery.slices_by_type()
    if not counts:
        raise NotFoundError(
            f"no TPU or GPU slices among the cluster's {len(nodes)} node(s): hotswap looks for the labels"
            f" {settings.accelerator_label} + {settings.topology_label} (TPU) or {settings.gpu_accelerator_label}"
            " (GPU); give --accelerator-label/--topology-label/--node-pool-label if yours differ"
        )
    found = ", ".join(f"{name} x{count}" for name, count in sorted(counts.items()))
    if wanted is None:
        if len(counts) > 1:
            raise InvalidInputError(f"the cluster has slices of several types ({found}); give --device-type for the default")
        wanted = next(iter(counts))
    if wanted not in counts:
        raise CapacityError(f"the cluster has no {wanted} slices (it has {found})")
    if num_slices is not None and counts[wanted] < num_slices:
        raise CapacityError(f"--num-slices {num_slices}: the cluster has only {counts[wanted]} slice(s) of {wanted}")
    for manifest in render_priority_classes():
        client.apply(manifest)
    if settings.kueue:
        for manifest in render_kueue(settings, counts):
            client.apply(manifest)
    write_record(cluster, wanted, settings, discovery, existing)
    summary = cluster_summary(cluster, wanted, settings, discovery)
    return ClusterCreated(**summary, installed=[found.summary() for found in installed])


def write_record(cluster: str, device: str, settings: KubeSettings, discovery: Discovery, existing: ClusterRecord | None) -> None:
    """The local record: how to reach the cluster, and the slices ``cluster create`` found."""
    paths = ClusterPaths.of(cluster)
    private_dir(paths.root)
    store = Store.open(paths.database, create=True)
    try:
        new = ClusterRecord(cluster, BACKEND, device, existing.created_at if existing else time.time(), settings.to_dict())
        if existing is None:
            store.init_cluster(new)
        else:
            store.update_cluster(new)
        # What cluster create found, for `cluster list`; the controller reads the live nodes.
        now = time.time()
        slices = [Slice(s.name, s.device_type, s.nodes, i) for i, s in enumerate(discovery.slices)]
        nodes = [Node(n.name, n.slice, n.host, n.state) for n in discovery.nodes.values()]
        store.save_snapshot(store.load_snapshot(now), Snapshot.build(now, slices, nodes, (), next_seq=0, next_ordinal=len(slices)))
    finally:
        store.close()


def cluster_summary(cluster: str, device_type: str, settings: KubeSettings, discovery: Discovery) -> ClusterSummary:
    """What ``cluster create`` and ``cluster describe`` print about a cluster."""
    device = get_device_type(device_type)
    return ClusterSummary(
        name=cluster,
        backend=BACKEND,
        device_type=device.name,
        hosts_per_slice=device.hosts_per_slice,
        chips_per_host=device.chips_per_host,
        num_slices=discovery.slices_by_type().get(device.name, 0),
        slices_by_type=discovery.slices_by_type(),
        context=settings.context,
        namespace=settings.namespace,
        kueue=settings.kueue,
        controller_pid=None,
    )
