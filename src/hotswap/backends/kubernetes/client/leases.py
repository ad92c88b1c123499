"""The controller's Lease (leader election): read, create, and replace with the
resourceVersion read."""

from __future__ import annotations

from typing import Any

from hotswap.api.errors import NotFoundError
from hotswap.backends.kubernetes.client.calls import ApiCalls


class Leases(ApiCalls):
    def get_lease(self, name: str) -> dict[str, Any] | None:
        try:
            return self._call(f"read Lease {name}", self.coordination.read_namespaced_lease, name, self.namespace)
        except NotFoundError:
            return None

    def create_lease(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("create the controller's Lease", self.coordination.create_namespaced_lease, self.namespace, body)

    def replace_lease(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Replace with the resourceVersion read: a concurrent writer makes this a ConflictError."""
        return self._call("renew the controller's Lease", self.coordination.replace_namespaced_lease, name, self.namespace, body)
