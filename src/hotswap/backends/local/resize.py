"""Which slices a resize adds or removes: one rule, used by the controller (which enacts it) and
by ``cluster create`` (whose prompt lists the slices and workloads a shrink affects)."""

from __future__ import annotations

from hotswap.api.catalog import get_device_type
from hotswap.api.cluster import node_name, slice_name
from hotswap.core import events as ev
from hotswap.core.model import Snapshot
from hotswap.store.state import ClusterRecord


def resize_events(snapshot: Snapshot, cluster: ClusterRecord, num_slices: int) -> list[ev.Event]:
    """The slices to add (new names, as few as needed) or remove to give the cluster
    ``num_slices`` slices. Free slices go first (highest first), then held ones: their holders
    are moved by the core like after a cordon, never left half-placed."""
    device = get_device_type(cluster.device_type)
    current = sorted(snapshot.slices.values(), key=lambda s: s.ordinal)
    if num_slices >= len(current):
        used = {s.name for s in current}
        events: list[ev.Event] = []
        index = 0
        while len(current) + len(events) < num_slices:
            name = slice_name(cluster.name, index)
            index += 1
            if name in used:
                continue
            nodes = tuple(node_name(name, h) for h in range(device.hosts_per_slice))
            events.append(ev.SliceAdded(name, device.name, nodes))
        return events
    held = snapshot.holders
    order = sorted(current, key=lambda s: (s.name in held, -s.ordinal))
    return [ev.SliceRemoved(s.name) for s in order[: len(current) - num_slices]]
