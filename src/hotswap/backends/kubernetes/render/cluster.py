"""What a cluster needs once, before any workload: xpk's PriorityClasses and, with ``--kueue``,
a ResourceFlavor per device type, a ClusterQueue and a LocalQueue."""

from __future__ import annotations

from typing import Any

from hotswap.api.catalog import DeviceType, get_device_type
from hotswap.api.priority import Priority
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.render.jobset import Manifest, node_selector
from hotswap.backends.kubernetes.settings import KubeSettings


def render_priority_classes() -> list[Manifest]:
    """xpk's five PriorityClasses (names, values and descriptions as xpk creates them)."""
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": level.label, "labels": {labels.MANAGED_BY_LABEL: labels.MANAGED_BY}},
            "value": int(level),
            "globalDefault": False,
            "description": level.label.replace("-", " ").title(),
        }
        for level in Priority
    ]


def flavor_name(device: DeviceType) -> str:
    return device.name


def render_kueue(settings: KubeSettings, slices_by_type: dict[str, int]) -> list[Manifest]:
    """A ResourceFlavor per device type found, one ClusterQueue whose quota is every chip the
    cluster has, preempting lower priority within it (as xpk sets it up), and a LocalQueue."""
    flavors: list[Manifest] = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for name in sorted(slices_by_type):
        device = get_device_type(name)
        flavors.append(
            {
                "apiVersion": labels.KUEUE_API_VERSION,
                "kind": "ResourceFlavor",
                "metadata": {"name": flavor_name(device), "labels": {labels.MANAGED_BY_LABEL: labels.MANAGED_BY}},
                "spec": {"nodeLabels": node_selector(device, settings)},
            }
        )
        chips = slices_by_type[name] * device.chips_per_slice
        groups.setdefault(device.resource_name, []).append(
            {"name": flavor_name(device), "resources": [{"name": device.resource_name, "nominalQuota": chips}]}
        )
    cluster_queue: Manifest = {
        "apiVersion": labels.KUEUE_API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": settings.cluster_queue, "labels": {labels.MANAGED_BY_LABEL: labels.MANAGED_BY}},
        "spec": {
            "namespaceSelector": {},
            "preemption": {"reclaimWithinCohort": "Never", "withinClusterQueue": "LowerPriority"},
            "resourceGroups": [
                {"coveredResources": [resource], "flavors": flavor_list} for resource, flavor_list in sorted(groups.items())
            ],
        },
    }
    local_queue: Manifest = {
        "apiVersion": labels.KUEUE_API_VERSION,
        "kind": "LocalQueue",
        "metadata": {
            "name": settings.local_queue,
            "namespace": settings.namespace,
            "labels": {labels.MANAGED_BY_LABEL: labels.MANAGED_BY},
        },
        "spec": {"clusterQueue": settings.cluster_queue},
    }
    return [*flavors, cluster_queue, local_queue]
