"""Discovery: Kubernetes Node objects in, hotswap's slices and node states out (pure).

A multi-host TPU slice is one GKE node pool (GKE creates and repairs such a pool as a unit), so
its nodes are grouped by the node-pool label. Single-host shapes (``v6e-4``, ``v5litepod-4``,
every GPU type) are one node per slice, even when a pool holds many nodes. The device type comes
from the node's accelerator and topology labels through the catalog (GPUs: the accelerator
label and the node's GPU capacity). Nodes without accelerator labels (system pools, CPU pools)
are not slices and are ignored.

State of a node, from its conditions, ``spec.unschedulable`` and taints:

- ``Failed``: the Ready condition is not True (NotReady, Unknown, missing), or it carries the
  node lifecycle controller's not-ready/unreachable taint: the machine is gone;
- ``Cordoned``: ``spec.unschedulable`` (``kubectl cordon``/``drain``) or a taint that announces
  maintenance or removal (see :data:`hotswap.backends.kubernetes.labels.CORDON_TAINTS`);
- ``Ready`` otherwise.

A multi-host pool with fewer nodes than its shape needs (GKE recreating one) is short of hosts:
the missing hosts appear as Failed placeholder nodes, so the slice is unhealthy until it is
whole again.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from typing import Any

from hotswap.api.catalog import (
    GPU_RESOURCE,
    TPU_FAMILIES,
    AcceleratorKind,
    DeviceType,
    device_types,
    get_device_type,
)
from hotswap.api.cluster import NodeState
from hotswap.api.errors import InvalidInputError
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.settings import KubeSettings

MISSING_HOST = "#missing-"


@dataclasses.dataclass(frozen=True)
class DiscoveredNode:
    name: str
    slice: str
    host: int
    state: NodeState
    placeholder: bool = False  # a host the pool should have and does not


@dataclasses.dataclass(frozen=True)
class DiscoveredSlice:
    name: str
    device_type: str
    nodes: tuple[str, ...]
    node_pool: str | None
    pin_label: str  # the node label a pod is pinned to this slice with
    pin_value: str

    @property
    def pin(self) -> dict[str, str]:
        return {self.pin_label: self.pin_value}


@dataclasses.dataclass(frozen=True)
class Discovery:
    slices: tuple[DiscoveredSlice, ...]  # sorted by name: that order is the slices' ordinals
    nodes: dict[str, DiscoveredNode]
    slice_of_node: dict[str, str]
    ignored: tuple[str, ...]  # nodes that are no accelerator slice

    def slices_by_type(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for item in self.slices:
            counts[item.device_type] = counts.get(item.device_type, 0) + 1
        return counts

    def healthy(self, slice_name: str) -> bool:
        item = next(s for s in self.slices if s.name == slice_name)
        return all(self.nodes[n].state is NodeState.READY for n in item.nodes)


def _labels(node: dict[str, Any]) -> dict[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def node_state(node: dict[str, Any]) -> NodeState:
    status = node.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    taints = {t.get("key") for t in (node.get("spec") or {}).get("taints") or []}
    if ready is None or ready.get("status") != "True" or taints & labels.FAILED_TAINTS:
        return NodeState.FAILED
    if (node.get("spec") or {}).get("unschedulable") or taints & labels.CORDON_TAINTS:
        return NodeState.CORDONED
    return NodeState.READY


@functools.lru_cache(maxsize=None)
def _tpu_family_by_accelerator() -> dict[str, str]:
    return {family.gke_accelerator: family.name for family in TPU_FAMILIES}


@functools.lru_cache(maxsize=None)
def _gpu_by_accelerator() -> dict[tuple[str, int], DeviceType]:
    found: dict[tuple[str, int], DeviceType] = {}
    for device in device_types().values():
        if device.kind is AcceleratorKind.GPU:
            found.setdefault((device.gke_accelerator, device.chips_per_host), device)
    return found


def device_type_of(node: dict[str, Any], settings: KubeSettings) -> DeviceType | None:
    """The catalog entry a node belongs to, or None for nodes that carry no accelerator."""
    node_labels = _labels(node)
    accelerator = node_labels.get(settings.accelerator_label)
    if accelerator is not None:
        family = _tpu_family_by_accelerator().get(accelerator)
        topology = node_labels.get(settings.topology_label)
        if family is None or topology is None:
            return None
        try:
            return get_device_type(f"{family}-{topology}")
        except InvalidInputError:
            return None
    gpu = node_labels.get(settings.gpu_accelerator_label)
    if gpu is not None:
        capacity = (node.get("status") or {}).get("capacity") or {}
        try:
            count = int(capacity.get(GPU_RESOURCE, 0))
        except (TypeError, ValueError):
            return None
        return _gpu_by_accelerator().get((gpu, count))
    return None


def discover(nodes: Iterable[dict[str, Any]], settings: KubeSettings) -> Discovery:
    pools: dict[str, list[tuple[str, NodeState]]] = {}
    pool_type: dict[str, DeviceType] = {}
    single: list[tuple[str, NodeState, DeviceType, str | None, str]] = []
    ignored: list[str] = []
    for node in nodes:
        name = node["metadata"]["name"]
        device = device_type_of(node, settings)
        pool = _labels(node).get(settings.node_pool_label)
        if device is None:
            ignored.append(name)
        elif device.multi_host and pool is not None:
            pools.setdefault(pool, []).append((name, node_state(node)))
            pool_type.setdefault(pool, device)
        elif device.multi_host:
            ignored.append(name)  # a multi-host TPU node outside any node pool cannot form a slice
        else:
            single.append((name, node_state(node), device, pool, _labels(node).get(labels.HOSTNAME_LABEL, name)))
    slices: list[DiscoveredSlice] = []
    found: dict[str, DiscoveredNode] = {}
    for pool, members in pools.items():
        device = pool_type[pool]
        members.sort()
        names = [name for name, _ in members]
        for host, (name, state) in enumerate(members):
            found[name] = DiscoveredNode(name, pool, host, state)
        for host in range(len(members), device.hosts_per_slice):
            placeholder = f"{pool}{MISSING_HOST}{host}"
            names.append(placeholder)
            found[placeholder] = DiscoveredNode(placeholder, pool, host, NodeState.FAILED, placeholder=True)
        slices.append(DiscoveredSlice(pool, device.name, tuple(names), pool, settings.node_pool_label, pool))
    for name, state, device, pool, hostname in single:
        found[name] = DiscoveredNode(name, name, 0, state)
        slices.append(DiscoveredSlice(name, device.name, (name,), pool, labels.HOSTNAME_LABEL, hostname))
    slices.sort(key=lambda s: s.name)
    slice_of_node = {node.name: node.slice for node in found.values()}
    return Discovery(tuple(slices), found, slice_of_node, tuple(sorted(ignored)))
