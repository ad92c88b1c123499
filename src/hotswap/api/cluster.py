"""Node states of the cluster model: cluster -> slices -> nodes (hosts)."""

from __future__ import annotations

import enum


class NodeState(str, enum.Enum):
    """A node (one host of a slice). Only Ready nodes are schedulable.

    Cordoned: taken out of service on purpose (``node cordon`` / ``node drain``); its workers
    are stopped gracefully. Failed: broken hardware; its workers are gone. Both come back to
    Ready by ``node uncordon`` (repair).
    """

    READY = "Ready"
    CORDONED = "Cordoned"
    FAILED = "Failed"

    def __str__(self) -> str:
        return self.value


def slice_name(cluster: str, index: int) -> str:
    """Slice ``index`` of a cluster, named as xpk names node pools: ``<cluster>-np-<index>``."""
    return f"{cluster}-np-{index}"


def node_name(slice_: str, host: int) -> str:
    """Host ``host`` of a slice: ``<slice>-<host>``."""
    return f"{slice_}-{host}"
