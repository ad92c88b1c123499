"""Rendering: a workload spec and a cluster's settings in, Kubernetes objects (plain dicts) out.

Pure functions, no I/O and no ``kubernetes`` import, so ``workload create --dry-run`` needs no API
server and tests validate every object against the real schemas. One module per kind of object:

- :mod:`.jobset`: :func:`render_jobset`, one ``jobset.x-k8s.io/v1alpha2`` JobSet per workload,
  with hotswap's failure policy and placement gate;
- :mod:`.container`: the worker container inside it (the contract's environment and shell
  prelude, SIGTERM wiring, checkpoint and membership volumes);
- :mod:`.cluster`: :func:`render_priority_classes` (xpk's five) and :func:`render_kueue`
  (a ResourceFlavor per device type, a ClusterQueue and a LocalQueue);
- :mod:`.cacheimage`: :func:`render_image_cache`, the DaemonSet of ``cluster cacheimage``;
- :mod:`.controller`: :func:`render_controller_manifests`, what runs ``hotswap controller run``
  inside the cluster.
"""

from hotswap.backends.kubernetes.render.cacheimage import render_image_cache
from hotswap.backends.kubernetes.render.cluster import render_kueue, render_priority_classes
from hotswap.backends.kubernetes.render.controller import render_controller_manifests
from hotswap.backends.kubernetes.render.jobset import render_jobset

__all__ = ["render_controller_manifests", "render_image_cache", "render_jobset", "render_kueue", "render_priority_classes"]
