"""Discovery: Kubernetes Node objects in, hotswap's slices and node states out (pure).

A multi-host TPU slice is one GKE node pool (GKE creates and repairs such a pool as a unit), so
its nodes are grouped by the node-pool label. Single-host shapes (``v6e-4``, ``v5litepod-4``,
every GPU type) are one node per slice, even when a pool holds many nodes. The device type comes
from the node's accelerator and topology labels through the catalog (GPUs: the accelerator
label and the node's GPU capacity). Nodes without accelerator labels (system pools, CPU pools)
are not slices and are ignored.

State of a node, from its conditions, ``spec.unschedulable``, taints and accelerators, with
the reason (it reaches the workload's events):

- ``Failed``: the Ready condition is not True (NotReady, Unknown, missing), or it carries the
  node lifecycle controller's not-ready/unreachable taint: the machine is gone; or its
  allocatable accelerators are fewer than its capacity (the device plugin, NVIDIA's or GKE's
  TPU one, withdraws a chip it finds unhealthy); or a condition of the cluster's
  ``failure_conditions`` is True (a GPU health checker's, for instance);
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

from hotswap.api.catalog import GPU_RESOURCE, TPU_RESOURCE, AcceleratorKind, DeviceType, device_types, get_device_type
from hotswap.api.cluster import NodeState
from hotswap.api.device_tables import TPU_FAMILIES
from hotswap.api.errors import InvalidInputError
from hotswap.api.times import parse_iso_utc
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
    reason: str = ""  # why it is not Ready
    since: float | None = None  # when it stopped being Ready (its Ready condition's transition)


@dataclasses.dataclass(frozen=True)
class Health:
    state: NodeState
    reason: str = ""
    since: float | None = None


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
    _by_name: dict[str, DiscoveredSlice] | None = dataclasses.field(default=None, repr=False, compare=False)

    def slices_by_type(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for item in self.slices:
            counts[item.device_type] = counts.get(item.device_type, 0) + 1
        return counts

    def slice(self, name: str) -> DiscoveredSlice | None:
        if self._by_name is None:
            object.__setattr__(self, "_by_name", {s.name: s for s in self.slices})
        assert self._by_name is not None
        return self._by_name.get(name)

    def healthy(self, slice_name: str) -> bool:
        found = self.slice(slice_name)
        return found is not None and all(self.nodes[n].state is NodeState.READY for n in found.nodes)


def _labels(node: dict[str, Any]) -> dict[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def node_state(node: dict[str, Any], settings: KubeSettings | None = None) -> NodeState:
    return node_health(node, settings or KubeSettings()).state


def _quantity(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def node_health(node: dict[str, Any], settings: KubeSettings) -> Health:
    status = node.get("status") or {}
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    taints = {t.get("key") for t in (node.get("spec") or {}).get("taints") or []}
    if ready is None or ready.get("status") != "True":
        why = f"Ready={ready.get('status')} ({ready.get('reason') or 'no reason'})" if ready else "no Ready condition"
        since = parse_iso_utc(ready["lastTransitionTime"]) if ready and ready.get("lastTransitionTime") else None
        return Health(NodeState.FAILED, f"not ready: {why}", since)
    if taints & labels.FAILED_TAINTS:
        return Health(NodeState.FAILED, f"tainted {', '.join(sorted(taints & labels.FAILED_TAINTS))}")
    for condition in conditions:
        if condition.get("type") in settings.failure_conditions and condition.get("status") == "True":
            message = condition.get("message") or condition.get("reason") or ""
            since = parse_iso_utc(condition["lastTransitionTime"]) if condition.get("lastTransitionTime") else None
            return Health(NodeState.FAILED, f"condition {condition['type']}: {message}".rstrip(": "), since)
    capacity, allocatable = status.get("capacity") or {}, status.get("allocatable") or {}
    for resource in (TPU_RESOURCE, GPU_RESOURCE):
        have, usable = _quantity(capacity.get(resource)), _quantity(allocatable.get(resource))
        if have and usable is not None and usable < have:
            return Health(NodeState.FAILED, f"{usable} of {have} {resource} allocatable: the device plugin withdrew unhealthy devices")
    if (node.get("spec") or {}).get("unschedulable"):
        return Health(NodeState.CORDONED, "cordoned")
    if taints & labels.CORDON_TAINTS:
        return Health(NodeState.CORDONED, f"tainted {', '.join(sorted(taints & labels.CORDON_TAINTS))}")
    return Health(NodeState.READY)


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
        count = _quantity(((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE, 0))
        return None if count is None else _gpu_by_accelerator().get((gpu, count))
    return None


def discover(nodes: Iterable[dict[str, Any]], settings: KubeSettings) -> Discovery:
    pools: dict[str, list[tuple[str, Health]]] = {}
    pool_type: dict[str, DeviceType] = {}
    single: list[tuple[str, Health, DeviceType, str | None, str]] = []
    ignored: list[str] = []
    for node in nodes:
        name = node["metadata"]["name"]
        device = device_type_of(node, settings)
        pool = _labels(node).get(settings.node_pool_label)
        if device is None:
            ignored.append(name)
        elif device.multi_host and pool is not None:
            pools.setdefault(pool, []).append((name, node_health(node, settings)))
            pool_type.setdefault(pool, device)
        elif device.multi_host:
            ignored.append(name)  # a multi-host TPU node outside any node pool cannot form a slice
        else:
            single.append((name, node_health(node, settings), device, pool, _labels(node).get(labels.HOSTNAME_LABEL, name)))
    slices: list[DiscoveredSlice] = []
    found: dict[str, DiscoveredNode] = {}
    for pool, members in pools.items():
        device = pool_type[pool]
        members.sort(key=lambda member: member[0])
        names = [name for name, _ in members]
        for host, (name, health) in enumerate(members):
            found[name] = DiscoveredNode(name, pool, host, health.state, reason=health.reason, since=health.since)
        for host in range(len(members), device.hosts_per_slice):
            placeholder = f"{pool}{MISSING_HOST}{host}"
            names.append(placeholder)
            found[placeholder] = DiscoveredNode(placeholder, pool, host, NodeState.FAILED, placeholder=True, reason="missing from its node pool")
        slices.append(DiscoveredSlice(pool, device.name, tuple(names), pool, settings.node_pool_label, pool))
    for name, health, device, pool, hostname in single:
        found[name] = DiscoveredNode(name, name, 0, health.state, reason=health.reason, since=health.since)
        slices.append(DiscoveredSlice(name, device.name, (name,), pool, labels.HOSTNAME_LABEL, hostname))
    slices.sort(key=lambda s: s.name)
    slice_of_node = {node.name: node.slice for node in found.values()}
    return Discovery(tuple(slices), found, slice_of_node, tuple(sorted(ignored)))
