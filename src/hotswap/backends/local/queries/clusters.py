"""``cluster describe`` of a local cluster, read from its database."""

from __future__ import annotations

from typing import Any

from hotswap.api.catalog import get_device_type
from hotswap.backends.local.queries.records import holders, open_store
from hotswap.backends.local.queries.views import gpu_health, gpu_views, node_reasons, workload_view
from hotswap.backends.local.settings import LocalSettings
from hotswap.backends.views import ClusterDescription
from hotswap.store.registry import existing


def describe_cluster(name: str) -> ClusterDescription:
    paths = existing(name)
    with open_store(paths) as store:
        record = store.cluster()
        settings = LocalSettings.of(record.settings)
        backing = settings.backing
        held_by = holders(store)
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
                "workload": held_by.get(row["name"]),
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
        "warm_workers": settings.warm_workers,
        "zygote": settings.zygote,
        "hotswap": settings.hotswap,
        "backing": "gpu" if backing is not None else "emulated",
        "gpus_per_host": backing.per_host if backing is not None else 0,
        "gpu_health": health,
        "state_dir": str(paths.root),
        "slices": slices,
        "workloads": [{"name": w["name"], "status": w["status"], "slices": w["slices"]} for w in workloads],
    }

