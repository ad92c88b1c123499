"""The only module that talks to a Kubernetes API server, through the official ``kubernetes``
client (imported here and in :mod:`.connection` and :mod:`.watch`, only where a Kubernetes
cluster is used).

Objects travel as plain dicts (responses are read raw and decoded as JSON), so the rest of the
backend never sees the client's models. Writes are server-side apply (field manager
``hotswap``) for whole objects, JSON merge patches for the few fields the controller changes.
Every API error becomes one line that says what to do (:func:`.connection.api_error`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

from hotswap.api.errors import HotswapError, NotFoundError
from hotswap.api.times import iso_utc
from hotswap.backends.kubernetes import labels, versions
from hotswap.backends.kubernetes.connection import (
    ForbiddenError,
    KubernetesError,
    UnreachableError,
    api_error,
    install_hint,
    load_api_client,
)
from hotswap.backends.kubernetes.settings import KubeSettings

# The errors of the API are part of this module's interface.
__all__ = ["ForbiddenError", "KubeClient", "KubernetesError", "UnreachableError", "api_error", "load_api_client"]

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


class KubeClient:
    """hotswap's calls on one cluster, in one namespace.

    Longer than our other classes on purpose: one thin method per API call hotswap makes, all
    through one error translation (:meth:`_call`), so that this class is the whole surface that
    touches an API server. The tests run it against an HTTP-level world (``tests/k8s_fixtures/
    world``). :attr:`writes` counts the write calls of reconciles (Lease renewals not included).
    """

    def __init__(self, api_client: Any, settings: KubeSettings) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.settings = settings
        self.namespace = settings.namespace
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.writes = 0

    @classmethod
    def connect(cls, settings: KubeSettings) -> KubeClient:
        return cls(load_api_client(settings), settings)

    @property
    def host(self) -> str:
        return str(self.api_client.configuration.host)

    # ------------------------------------------------------------------ plumbing

    def _call(
        self, doing: str, function: Callable[..., Any], *args: Any, missing_api: str | None = None, write: bool = False, **kwargs: Any
    ) -> Any:
        """Call the API and decode its JSON answer into plain data; errors become one line."""
        from kubernetes.client.exceptions import ApiException

        if write:
            self.writes += 1
        try:
            response = function(*args, _preload_content=False, **kwargs)
        except ApiException as error:
            raise api_error(error, doing, missing_api) from None
        except OSError as error:
            raise api_error(error, doing) from None
        except Exception as error:  # urllib3's MaxRetryError and friends: no route to the server
            if type(error).__module__.startswith("urllib3"):
                raise api_error(error, doing) from None
            raise
        data = response.data
        return json.loads(data) if data else {}

    def served_apis(self) -> set[str]:
        """Every ``group/version`` the server serves (API discovery, allowed to every user)."""
        from kubernetes import client

        answer = self._call("discover the cluster's APIs", client.ApisApi(self.api_client).get_api_versions)
        return {v["groupVersion"] for g in answer.get("groups", []) for v in g.get("versions", [])}

    def require_apis(self, *apis: str) -> None:
        """A one-line error naming what to install when one of ``apis`` is not served."""
        served = self.served_apis()
        for api in apis:
            if api not in served:
                raise NotFoundError(f"the API {api} is not installed on this cluster; {install_hint(api)}")

    def installed(self, component: versions.Component) -> versions.Installed:
        """What the API tells about an installed component: served, its controller's image tag,
        its CRD's schema (each read only where the caller may)."""
        served = f"{component.group}/{component.api_version}" in self.served_apis()
        if not served:
            return versions.Installed(component, served=False)
        unreadable: list[str] = []
        image_version = schema_version = None
        schema_read = False
        try:
            namespace, name = component.deployment
            deployment = self._call(f"read Deployment {namespace}/{name}", client_module().AppsV1Api(self.api_client).read_namespaced_deployment, name, namespace)
            images = [c.get("image", "") for c in ((deployment.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []]
            image_version = next((v for v in map(versions.from_image, images) if v is not None), None)
        except HotswapError as error:
            unreadable.append(f"its controller's Deployment: {error.message}")
        if component is versions.JOBSET:
            try:
                crd = self._call(f"read CRD {component.crd}", client_module().ApiextensionsV1Api(self.api_client).read_custom_resource_definition, component.crd)
                schema_version, schema_read = versions.from_jobset_crd(crd), True
            except HotswapError as error:
                unreadable.append(f"its CRD: {error.message}")
        return versions.Installed(component, True, image_version, schema_version, schema_read, tuple(unreadable))

    def check_versions(self, kueue: bool) -> list[versions.Installed]:
        """The installed JobSet (and Kueue): a one-line error naming the exact upgrade when one
        is missing or too old."""
        found = [self.installed(versions.JOBSET)] + ([self.installed(versions.KUEUE)] if kueue else [])
        for installed in found:
            problem = installed.problem()
            if problem is not None:
                raise NotFoundError(problem)
        return found

    # ------------------------------------------------------------------ reads

    def list_nodes(self) -> list[dict[str, Any]]:
        return self._call("list nodes", self.core.list_node).get("items", [])

    def _jobset_selector(self, cluster: str) -> str:
        return f"{labels.MANAGED_BY_LABEL}={labels.MANAGED_BY},{labels.CLUSTER_LABEL}={cluster}"

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

    def deactivate_kueue_workload(self, name: str) -> None:
        self._call(
            f"deactivate Kueue Workload {name}",
            self.custom.patch_namespaced_custom_object,
            labels.KUEUE_GROUP,
            labels.KUEUE_VERSION,
            self.namespace,
            labels.KUEUE_WORKLOADS,
            name,
            {"spec": {"active": False}},
            _content_type=MERGE,
            missing_api=labels.KUEUE_API_VERSION,
            write=True,
        )

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

    # ------------------------------------------------------------------ writes

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of one object (field manager ``hotswap``, taking over conflicts)."""
        kind = manifest["kind"]
        name = manifest["metadata"]["name"]
        group, _, version = manifest["apiVersion"].rpartition("/")
        body = manifest  # sent as JSON, which is YAML: a valid apply-patch+yaml document
        common = {"field_manager": labels.FIELD_MANAGER, "force": True, "_content_type": APPLY}
        doing = f"apply {kind} {name}"
        if kind == "PriorityClass":
            return self._call(doing, self.scheduling.patch_priority_class, name, body, **common)
        if kind == "DaemonSet":
            apps = client_module().AppsV1Api(self.api_client)
            return self._call(doing, apps.patch_namespaced_daemon_set, name, manifest["metadata"]["namespace"], body, **common)
        plural = {"JobSet": labels.JOBSET_PLURAL, "LocalQueue": "localqueues", "ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues"}.get(kind)
        if plural is None:
            raise ValueError(f"hotswap does not apply {kind} objects")
        api = f"{group}/{version}"
        if "namespace" in manifest["metadata"]:
            return self._call(doing, self.custom.patch_namespaced_custom_object, group, version, manifest["metadata"]["namespace"], plural, name, body, missing_api=api, **common)
        return self._call(doing, self.custom.patch_cluster_custom_object, group, version, plural, name, body, missing_api=api, **common)

    def patch_jobset(self, name: str, patch: dict[str, Any], resource_version: str | None = None) -> dict[str, Any]:
        """A merge patch; with ``resource_version``, refused (ConflictError) if the JobSet
        changed since it was read."""
        if resource_version is not None:
            patch = {**patch, "metadata": {**(patch.get("metadata") or {}), "resourceVersion": resource_version}}
        return self._call(
            f"update JobSet {name}",
            self.custom.patch_namespaced_custom_object,
            labels.JOBSET_GROUP,
            labels.JOBSET_VERSION,
            self.namespace,
            labels.JOBSET_PLURAL,
            name,
            patch,
            _content_type=MERGE,
            missing_api=labels.JOBSET_API_VERSION,
            write=True,
        )

    def delete_jobset(self, name: str) -> None:
        self._call(
            f"delete JobSet {name}",
            self.custom.delete_namespaced_custom_object,
            labels.JOBSET_GROUP,
            labels.JOBSET_VERSION,
            self.namespace,
            labels.JOBSET_PLURAL,
            name,
            propagation_policy="Foreground",
            missing_api=labels.JOBSET_API_VERSION,
        )

    def delete_jobs(self, jobset: str, replicas: tuple[int, ...] | None) -> list[str]:
        """Delete a JobSet's child Jobs (in the background: JobSet recreates them at once)."""
        deleted = []
        for job in self.list_jobs(jobset):
            meta = job["metadata"]
            index = (meta.get("labels") or {}).get(labels.JOB_INDEX_LABEL)
            if replicas is not None and (index is None or int(index) not in replicas):
                continue
            try:
                self._call(f"delete Job {meta['name']}", self.batch.delete_namespaced_job, meta["name"], self.namespace,
                           propagation_policy="Background", write=True)
            except NotFoundError:
                continue  # already gone: that is what we wanted
            deleted.append(meta["name"])
        return deleted

    def force_delete_pod(self, name: str) -> None:
        try:
            self._call(f"delete pod {name}", self.core.delete_namespaced_pod, name, self.namespace, grace_period_seconds=0, write=True)
        except NotFoundError:
            pass

    def patch_pod(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._call(f"update pod {name}", self.core.patch_namespaced_pod, name, self.namespace, patch, _content_type=MERGE, write=True)

    def set_unschedulable(self, node: str, unschedulable: bool) -> None:
        self._call(
            f"{'cordon' if unschedulable else 'uncordon'} node {node}",
            self.core.patch_node,
            node,
            {"spec": {"unschedulable": unschedulable or None}},
            _content_type=MERGE,
        )

    def evict(self, pod: str) -> None:
        """Evict through the Eviction API, as ``kubectl drain`` does (honours PodDisruptionBudgets)."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": self.namespace}}
        try:
            self._call(f"evict pod {pod}", self.core.create_namespaced_pod_eviction, pod, self.namespace, body)
        except NotFoundError:
            pass

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        answer = self._call(f"list pods on node {node}", self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")
        return answer.get("items", [])

    def record_event(self, jobset: dict[str, Any] | None, name: str, reason: str, message: str, warning: bool, now: float) -> None:
        uid = ((jobset or {}).get("metadata") or {}).get("uid")
        stamp = iso_utc(now, 6)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": self.namespace},
            "involvedObject": {
                "apiVersion": labels.JOBSET_API_VERSION,
                "kind": "JobSet",
                "name": name,
                "namespace": self.namespace,
                **({"uid": uid} if uid else {}),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": labels.CONTROLLER_NAME},
            "reportingComponent": labels.CONTROLLER_NAME,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self._call(f"record an event on JobSet {name}", self.core.create_namespaced_event, self.namespace, body, write=True)

    # ------------------------------------------------------------------ leases

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

    # ------------------------------------------------------------------ watches

    def watch_call(self, kind: str, cluster: str) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        """The list call a watch of ``kind`` (nodes, jobsets, pods) streams."""
        calls: dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = {
            "nodes": (self.core.list_node, (), {}),
            "pods": (self.core.list_namespaced_pod, (self.namespace,), {"label_selector": labels.WORKLOAD_LABEL}),
            "jobsets": (
                self.custom.list_namespaced_custom_object,
                (labels.JOBSET_GROUP, labels.JOBSET_VERSION, self.namespace, labels.JOBSET_PLURAL),
                {"label_selector": self._jobset_selector(cluster)},
            ),
        }
        return calls[kind]

    def watch(
        self, kind: str, cluster: str, changed: threading.Event, stop: threading.Event, timeout_s: int = 300,
        log: Callable[[str], None] | None = None,
    ) -> None:
        """Set ``changed`` whenever an object of ``kind`` changes, until ``stop`` (see
        :mod:`.watch`: it never dies of an error)."""
        from hotswap.backends.kubernetes.watch import Watcher

        function, args, kwargs = self.watch_call(kind, cluster)
        Watcher(kind, function, args, kwargs, changed, stop, timeout_s, log).run()


def client_module() -> Any:
    from kubernetes import client

    return client
