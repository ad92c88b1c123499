"""``node fail|drain|cordon|uncordon`` on a local cluster: a request the controller serves."""

from __future__ import annotations

from hotswap.api.errors import InvalidInputError, NotFoundError
from hotswap.api.limits import check_text
from hotswap.backends.local.commands import client
from hotswap.backends.local.queries.nodes import list_nodes
from hotswap.store.registry import existing


def node_operation(cluster: str, operation: str, node: str | None, slice_: str | None) -> list[str]:
    """Apply a fault or a repair to one node or to every node of a slice; returns the nodes."""
    from hotswap.backends.local.requests import ChangeNodes, NodeOperation  # loaded for requests only (see requests.py)

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
    outcome = client.request(paths, ChangeNodes(NodeOperation(operation), tuple(targets)))
    if outcome.status != "done":
        raise NotFoundError(outcome.message)
    return targets

