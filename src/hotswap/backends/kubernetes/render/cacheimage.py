"""``cluster cacheimage``: a DaemonSet that pulls an image onto every node of the cluster's
slices ahead of time, as xpk does, so workloads on that image start without waiting for the pull.

Each pod runs the image itself with ``sleep infinity`` (as xpk's does: the image must have
``sleep``); it asks for almost nothing and tolerates every taint, so it lands on accelerator
nodes (TPU nodes are tainted) without taking their chips. One DaemonSet per cluster: caching
another image replaces the previous one, so a node keeps what the next workload will use.
"""

from __future__ import annotations

from hotswap.api.catalog import DeviceType
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.render.jobset import Manifest, node_selector
from hotswap.backends.kubernetes.settings import KubeSettings

CACHE_CONTAINER = "image-cache"


def cache_daemonset_name(cluster: str) -> str:
    return f"{cluster}-image-cache"


def render_image_cache(cluster: str, image: str, devices: list[DeviceType], settings: KubeSettings) -> Manifest:
    """The DaemonSet that keeps ``image`` pulled on every node of the slices of ``devices``
    (a node matching any one device type's labels)."""
    name = cache_daemonset_name(cluster)
    terms = [
        {"matchExpressions": [{"key": key, "operator": "In", "values": [value]} for key, value in node_selector(device, settings).items()]}
        for device in devices
    ]
    selector = {"app.kubernetes.io/name": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": {**selector, labels.MANAGED_BY_LABEL: labels.MANAGED_BY, labels.CLUSTER_LABEL: cluster},
        },
        "spec": {
            "selector": {"matchLabels": selector},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": selector},
                "spec": {
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}},
                    "tolerations": [{"operator": "Exists"}],
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": CACHE_CONTAINER,
                            "image": image,
                            "command": ["sleep", "infinity"],
                            "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}},
                        }
                    ],
                },
            },
        },
    }
