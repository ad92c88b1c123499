"""``node list`` of a local cluster, read from its database."""

from __future__ import annotations

from hotswap.backends.local.queries.records import holders, open_store
from hotswap.backends.local.queries.views import gpu_views, node_reasons
from hotswap.backends.local.settings import LocalSettings
from hotswap.backends.views import NodeRow
from hotswap.store.registry import existing


def list_nodes(cluster: str) -> list[NodeRow]:
    paths = existing(cluster)
    with open_store(paths) as store:
        held_by = holders(store)
        backing = LocalSettings.of(store.cluster().settings).backing
        reasons = node_reasons(store)
        return [
            {
                "name": row["name"],
                "slice": row["slice"],
                "host": row["host"],
                "state": row["state"],
                "workload": held_by.get(row["slice"]),
                "reason": reasons.get(row["name"]) or None if row["state"] != "Ready" else None,
                "gpus": gpu_views(backing, row["slice"], row["host"]),
            }
            for row in store.node_rows()
        ]

