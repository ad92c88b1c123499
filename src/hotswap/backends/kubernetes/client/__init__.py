"""The only code that talks to a Kubernetes API server: this package, through the official
``kubernetes`` client (imported nowhere else, and only where a Kubernetes cluster is used).

Objects travel as plain dicts (responses are read raw and decoded as JSON), so the rest of the
backend never sees the client's models. Writes are server-side apply (field manager
``hotswap``) for whole objects, JSON merge patches for the few fields the controller changes.
Every API error becomes one line that says what to do (:func:`.connection.api_error`).

- :mod:`.connection`: the kubeconfig, and what the API's errors mean;
- :mod:`.calls`: one connection in one namespace, and the single call path every part uses;
- :mod:`.cluster_apis`: the APIs served, and the installed JobSet and Kueue versions;
- :mod:`.reads`, :mod:`.writes`, :mod:`.leases`, :mod:`.watch`: the calls, by what they do;
- :mod:`.kube_client`: :class:`KubeClient`, all of them on one connection (what callers hold).

The client and the API's errors are this package's interface, imported from here.
"""

from hotswap.backends.kubernetes.client.connection import (
    ForbiddenError,
    KubernetesError,
    UnreachableError,
    api_error,
    load_api_client,
)
from hotswap.backends.kubernetes.client.kube_client import KubeClient

__all__ = ["ForbiddenError", "KubeClient", "KubernetesError", "UnreachableError", "api_error", "load_api_client"]
