"""The client callers hold: every part of this package on one connection."""

from __future__ import annotations

from hotswap.backends.kubernetes.client.cluster_apis import ClusterApis
from hotswap.backends.kubernetes.client.connection import load_api_client
from hotswap.backends.kubernetes.client.leases import Leases
from hotswap.backends.kubernetes.client.reads import Reads
from hotswap.backends.kubernetes.client.watch import Watches
from hotswap.backends.kubernetes.client.writes import Writes
from hotswap.backends.kubernetes.settings import KubeSettings


class KubeClient(ClusterApis, Writes, Reads, Leases, Watches):
    """hotswap's calls on one cluster, in one namespace: one thin method per API call, all
    through one error translation (:meth:`ApiCalls._call`), split by what they do (discovery,
    reads, writes, the Lease, watches). The tests run it against an HTTP-level world
    (``tests/k8s_fixtures/world``). :attr:`writes` counts the write calls of reconciles (Lease
    renewals not included)."""

    @classmethod
    def connect(cls, settings: KubeSettings) -> KubeClient:
        return cls(load_api_client(settings), settings)
