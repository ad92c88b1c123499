"""Which backend serves a cluster: the one named in its record (``cluster create --backend``).

The one module of the CLI that imports the backends themselves (import-linter keeps it so): the
rest of the CLI reaches them through :class:`~hotswap.backends.base.Backend`.
"""

from __future__ import annotations

from typing import Any

from hotswap.api.errors import InvalidInputError
from hotswap.backends.base import Backend

BACKENDS = ("local", "kubernetes")


def named(name: str) -> Backend:
    if name == "local":
        from hotswap.backends.local.backend import LocalBackend

        return LocalBackend()
    if name == "kubernetes":
        from hotswap.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend()
    raise InvalidInputError(f"unknown backend {name!r}; use {' or '.join(BACKENDS)}")


def for_cluster(cluster: str) -> Backend:
    """The backend of an existing cluster (a one-line error names the clusters there are)."""
    from hotswap.store import registry

    return named(registry.record_of(cluster).backend)


def for_cluster_or_demo(cluster: str) -> Backend:
    """The backend of a cluster, or, for one not created yet (a demo's), the local one that
    will create it (the dashboard's page says so until it is)."""
    from hotswap.api.errors import HotswapError

    try:
        return for_cluster(cluster)
    except HotswapError:
        return named("local")


def for_controller(cluster: str, in_cluster: bool) -> Backend:
    """The backend whose controller ``controller run`` runs: Kubernetes inside a cluster (where
    there is no local record), else the cluster record's."""
    return named("kubernetes") if in_cluster else for_cluster(cluster)


def run_controller(backend: Backend, cluster: str, settings: dict[str, Any] | None, metrics_address: str | None) -> None:
    """``controller run`` in the foreground (``settings``: a Kubernetes controller's, given in-cluster)."""
    if backend.name == "kubernetes":
        run_kubernetes_controller(cluster, settings, metrics_address)
    else:
        run_local_controller(cluster, metrics_address)


def for_deletion(cluster: str) -> Backend:
    """The backend that deletes a cluster: its record's, or, when the record cannot be read
    (a corrupt database), the local one, which removes whatever is there (for a Kubernetes
    cluster, deletion forgets the local record and nothing else anyway)."""
    from hotswap.store import faults, registry

    try:
        return for_cluster(cluster)
    except Exception as error:
        if not faults.unreadable(error):
            raise
        registry.existing(cluster)
        return named("local")


def kubernetes_controller_manifests(cluster: str, image: str) -> list[dict[str, Any]]:
    """What runs a Kubernetes cluster's controller inside it (``controller manifests``)."""
    from hotswap.backends.kubernetes.backend import settings_of
    from hotswap.backends.kubernetes.render import render_controller_manifests

    return render_controller_manifests(cluster, settings_of(cluster), image)


def run_local_controller(cluster: str, metrics_address: str | None) -> None:
    """``controller run`` for a local cluster, in the foreground."""
    from hotswap.backends.local.controller.entry import run_local_controller as run

    run(cluster, metrics_address)


def run_kubernetes_controller(cluster: str, settings: dict[str, Any] | None, metrics_address: str | None) -> None:
    """``controller run`` for a Kubernetes cluster (``settings``: given in-cluster, else its record's)."""
    from hotswap.backends.kubernetes.controller.entry import run_kubernetes_controller as run

    run(cluster, settings, metrics_address)
