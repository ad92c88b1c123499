"""Which backend serves a cluster: the one named in its record (``cluster create --backend``)."""

from __future__ import annotations

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
