"""The reads hotswap makes: nodes, JobSets, Jobs, pods (hotswap's and every namespace's
unfinished ones), Kueue Workloads, ConfigMaps, and pod logs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hotswap.api.errors import NotFoundError
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.client.calls import ApiCalls
from hotswap.backends.kubernetes.client.connection import api_error


class Reads(ApiCalls):
    def list_nodes(self) -> list[dict[str, Any]]:
        return self._call("list nodes", self.core.list_node).get("items", [])

    def list_jobsets(self, cluster: str) -> list[dict[str, Any]]:
        answer = self._call(
            "list JobSets",
            self.custom.list_namespaced_custom_object,
            labels.JOBSET_GROUP,
            labels.JOBSET_VERSION,
            self.namespace,
            labels.JOBSET_PLURAL,
            label_selector=self._jobset_selector(cluster),
            missing_api=labels.JOBSET_API_VERSION,
        )
        return answer.get("items", [])

    def get_jobset(self, name: str) -> dict[str, Any] | None:
        try:
            return self._call(
                f"read JobSet {name}",
                self.custom.get_namespaced_custom_object,
                labels.JOBSET_GROUP,
                labels.JOBSET_VERSION,
                self.namespace,
                labels.JOBSET_PLURAL,
                name,
                missing_api=labels.JOBSET_API_VERSION,
            )
        except NotFoundError as error:
            if "not installed" in error.message:
                raise
            return None

    def list_jobs(self, jobset: str | None = None) -> list[dict[str, Any]]:
        selector = f"{labels.JOBSET_NAME_LABEL}={jobset}" if jobset else labels.JOBSET_NAME_LABEL
        return self._call("list Jobs", self.batch.list_namespaced_job, self.namespace, label_selector=selector).get("items", [])

    def list_events(self, kind: str, name: str) -> list[dict[str, Any]]:
        """The Events recorded on one object of this namespace (by hotswap, JobSet, Kueue)."""
        selector = f"involvedObject.kind={kind},involvedObject.name={name}"
        return self._call("list events", self.core.list_namespaced_event, self.namespace, field_selector=selector).get("items", [])

    def get_config_map(self, name: str) -> dict[str, Any] | None:
        try:
            return self._call(f"read ConfigMap {name}", self.core.read_namespaced_config_map, name, self.namespace)
        except NotFoundError:
            return None

    def list_pods(self, selector: str) -> list[dict[str, Any]]:
        return self._call("list pods", self.core.list_namespaced_pod, self.namespace, label_selector=selector).get("items", [])

    def list_unfinished_pods(self) -> list[dict[str, Any]]:
        """Every namespace's pods that have not finished: some occupy slices hotswap must not
        offer (other teams' jobs, xpk's)."""
        answer = self._call(
            "list pods in all namespaces",
            self.core.list_pod_for_all_namespaces,
            field_selector="status.phase!=Succeeded,status.phase!=Failed",
        )
        return answer.get("items", [])

    def list_kueue_workloads(self) -> list[dict[str, Any]]:
        answer = self._call(
            "list Kueue Workloads",
            self.custom.list_namespaced_custom_object,
            labels.KUEUE_GROUP,
            labels.KUEUE_VERSION,
            self.namespace,
            labels.KUEUE_WORKLOADS,
            missing_api=labels.KUEUE_API_VERSION,
        )
        return answer.get("items", [])

    def pod_log(self, name: str, follow: bool, container: str = labels.CONTAINER_NAME) -> Iterator[bytes]:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.core.read_namespaced_pod_log(
                name, self.namespace, container=container, follow=follow, _preload_content=False
            )
        except ApiException as error:
            raise api_error(error, f"read the log of pod {name}") from None
        try:
            yield from response.stream(64 * 1024)
        finally:
            response.release_conn()

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        answer = self._call(f"list pods on node {node}", self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")
        return answer.get("items", [])

    def list_report_leases(self, workload: str | None = None) -> list[dict[str, Any]]:
        """The replicas' records (:mod:`hotswap.api.worker_report`): the Leases of hotswap's
        workloads (of one, when named)."""
        selector = f"{labels.WORKLOAD_LABEL}={workload}" if workload else labels.WORKLOAD_LABEL
        answer = self._call("list Leases", self.coordination.list_namespaced_lease, self.namespace, label_selector=selector)
        return answer.get("items", [])

    def get_worker_access(self, name: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """A workload's workers' Role and RoleBinding (render/reports.py), None where gone."""
        from kubernetes import client

        rbac = client.RbacAuthorizationV1Api(self.api_client)
        found: list[dict[str, Any] | None] = []
        for kind, read in (("Role", rbac.read_namespaced_role), ("RoleBinding", rbac.read_namespaced_role_binding)):
            try:
                found.append(self._call(f"read {kind} {name}", read, name, self.namespace))
            except NotFoundError:
                found.append(None)
        return found[0], found[1]

    def get_service_account(self, name: str) -> dict[str, Any] | None:
        try:
            return self._call(f"read ServiceAccount {name}", self.core.read_namespaced_service_account, name, self.namespace)
        except NotFoundError:
            return None
