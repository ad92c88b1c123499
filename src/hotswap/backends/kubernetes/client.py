"""The only module that talks to a Kubernetes API server, through the official ``kubernetes``
client (imported here, and this module only where a kubernetes cluster is used).

Objects travel as plain dicts (responses are read raw and decoded as JSON), so the rest of the
backend never sees the client's models. Writes are server-side apply (field manager
``hotswap``) for whole objects, JSON merge patches for the few fields the controller changes.
Every API error becomes one line that says what to do (:func:`api_error`).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from hotswap.api.errors import ConflictError, HotswapError, InvalidInputError, NotFoundError
from hotswap.api.times import iso_utc
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.settings import KubeSettings

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
JOBSET_INSTALL = (
    "install JobSet: kubectl apply --server-side -f"
    " https://github.com/kubernetes-sigs/jobset/releases/download/v0.8.1/manifests.yaml"
)
KUEUE_INSTALL = (
    "install Kueue: kubectl apply --server-side -f"
    " https://github.com/kubernetes-sigs/kueue/releases/download/v0.13.4/manifests.yaml"
)


class KubernetesError(HotswapError):
    """The API server refused or could not be reached; the message says what to do."""


class ForbiddenError(KubernetesError):
    exit_code = 6


class UnreachableError(KubernetesError):
    exit_code = 7


def _status_message(body: Any) -> tuple[str, dict[str, Any]]:
    """The message and details of a Kubernetes Status body, or the body's first line."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            status = json.loads(body)
        except ValueError:
            return (body.strip().splitlines() or [""])[0], {}
        if isinstance(status, dict):
            return str(status.get("message") or status.get("reason") or ""), status.get("details") or {}
    return "", {}


def api_error(error: Exception, doing: str, missing_api: str | None = None) -> HotswapError:
    """One line for an API error: what failed, the server's reason, and what to do about it."""
    from kubernetes.client.exceptions import ApiException

    if not isinstance(error, ApiException):
        return UnreachableError(
            f"cannot reach the Kubernetes API server while trying to {doing}: {_first_line(error)};"
            " check the context (--context, KUBECONFIG) and that the cluster is reachable"
        )
    message, details = _status_message(error.body)
    status = error.status
    if status == 0:
        return UnreachableError(f"cannot {doing}: {message or error.reason}")
    if status == 401:
        return ForbiddenError(
            f"cannot {doing}: the API server rejected your credentials ({message or 'Unauthorized'});"
            " refresh them (e.g. `gcloud container clusters get-credentials CLUSTER`)"
        )
    if status == 403:
        return ForbiddenError(
            f"cannot {doing}: forbidden: {message or 'permission denied'}; ask a cluster admin for"
            " that permission (the controller's own RBAC: `hotswap controller manifests`)"
        )
    if status == 404:
        if not details and missing_api is not None:
            # An unknown resource type answers a bare 404 page, not a Status about an object.
            return NotFoundError(f"cannot {doing}: the API {missing_api} is not installed on this cluster; {_install_hint(missing_api)}")
        return NotFoundError(f"cannot {doing}: {message or 'not found'}")
    if status == 409:
        return ConflictError(
            f"cannot {doing}: conflict: {message or 'the object changed meanwhile'}; another writer"
            " changed it, run the command again"
        )
    if status == 422:
        return InvalidInputError(f"cannot {doing}: the API server rejected it: {message}")
    return KubernetesError(f"cannot {doing}: HTTP {status} {error.reason or ''}: {message}".rstrip(": "))


def _install_hint(api: str) -> str:
    if api.startswith(labels.JOBSET_GROUP):
        return JOBSET_INSTALL
    if api.startswith(labels.KUEUE_GROUP):
        return KUEUE_INSTALL
    return "install the component that serves it"


def _first_line(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def load_api_client(settings: KubeSettings) -> Any:
    """An ApiClient configured as kubectl would be: ``--context`` (else the current context) of
    ``$KUBECONFIG`` (colon-separated files, merged) or ``~/.kube/config``; inside a pod with no
    kubeconfig, the pod's service account."""
    from kubernetes import client, config

    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    have_file = any(os.path.exists(p) for p in path.split(os.pathsep) if p)
    if not have_file and settings.context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as error:
            raise UnreachableError(f"in-cluster configuration failed: {_first_line(error)}") from None
        return client.ApiClient(configuration)
    if not have_file:
        raise NotFoundError(
            f"no kubeconfig at {path}: set KUBECONFIG or fetch credentials"
            " (e.g. `gcloud container clusters get-credentials CLUSTER`)"
        )
    try:
        return config.new_client_from_config(config_file=path, context=settings.context, persist_config=False)
    except config.ConfigException as error:
        if settings.context is not None:
            try:
                contexts, _ = config.list_kube_config_contexts(config_file=path)
                names = ", ".join(c["name"] for c in contexts) or "none"
            except config.ConfigException:
                names = "none"
            raise NotFoundError(f"no usable kubeconfig context {settings.context!r} in {path} (contexts: {names})") from None
        raise InvalidInputError(f"kubeconfig {path} is not usable: {_first_line(error)}") from None


class KubeClient:
    """hotswap's calls on one cluster, in one namespace.

    Longer than our other classes on purpose: one thin method per API call hotswap makes, all
    through one error translation (:meth:`_call`), so that this class is the whole surface that
    touches an API server (and the one that test doubles such as ``k8s_fixtures/world.py``
    stand in for).
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

    @classmethod
    def connect(cls, settings: KubeSettings) -> KubeClient:
        return cls(load_api_client(settings), settings)

    @property
    def host(self) -> str:
        return str(self.api_client.configuration.host)

    # ------------------------------------------------------------------ plumbing

    def _call(self, doing: str, function: Callable[..., Any], *args: Any, missing_api: str | None = None, **kwargs: Any) -> Any:
        """Call the API and decode its JSON answer into plain data; errors become one line."""
        from kubernetes.client.exceptions import ApiException

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
                raise NotFoundError(f"the API {api} is not installed on this cluster; {_install_hint(api)}")

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

    def list_kueue_workloads(self) -> list[dict[str, Any]]:
        answer = self._call(
            "list Kueue Workloads",
            self.custom.list_namespaced_custom_object,
            labels.KUEUE_GROUP,
            labels.KUEUE_VERSION,
            self.namespace,
            "workloads",
            missing_api=labels.KUEUE_API_VERSION,
        )
        return answer.get("items", [])

    def pod_log(self, name: str, follow: bool) -> Iterator[bytes]:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.core.read_namespaced_pod_log(
                name, self.namespace, container=labels.CONTAINER_NAME, follow=follow, _preload_content=False
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
        plural = {"JobSet": labels.JOBSET_PLURAL, "LocalQueue": "localqueues", "ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues"}.get(kind)
        if plural is None:
            raise ValueError(f"hotswap does not apply {kind} objects")
        api = f"{group}/{version}"
        if "namespace" in manifest["metadata"]:
            return self._call(doing, self.custom.patch_namespaced_custom_object, group, version, manifest["metadata"]["namespace"], plural, name, body, missing_api=api, **common)
        return self._call(doing, self.custom.patch_cluster_custom_object, group, version, plural, name, body, missing_api=api, **common)

    def patch_jobset(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
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
                self._call(f"delete Job {meta['name']}", self.batch.delete_namespaced_job, meta["name"], self.namespace, propagation_policy="Background")
            except NotFoundError:
                continue  # already gone: that is what we wanted
            deleted.append(meta["name"])
        return deleted

    def force_delete_pod(self, name: str) -> None:
        try:
            self._call(f"delete pod {name}", self.core.delete_namespaced_pod, name, self.namespace, grace_period_seconds=0)
        except NotFoundError:
            pass

    def patch_pod(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._call(f"update pod {name}", self.core.patch_namespaced_pod, name, self.namespace, patch, _content_type=MERGE)

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
        self._call(f"record an event on JobSet {name}", self.core.create_namespaced_event, self.namespace, body)

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

    def watch(self, kind: str, cluster: str, changed: threading.Event, stop: threading.Event, timeout_s: int = 300) -> None:
        """Set ``changed`` whenever an object of ``kind`` (nodes, jobsets, pods) changes, until
        ``stop``. The objects themselves are re-listed by the reconcile that follows."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        functions: dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = {
            "nodes": (self.core.list_node, (), {}),
            "pods": (self.core.list_namespaced_pod, (self.namespace,), {"label_selector": labels.WORKLOAD_LABEL}),
            "jobsets": (
                self.custom.list_namespaced_custom_object,
                (labels.JOBSET_GROUP, labels.JOBSET_VERSION, self.namespace, labels.JOBSET_PLURAL),
                {"label_selector": self._jobset_selector(cluster)},
            ),
        }
        function, args, kwargs = functions[kind]
        while not stop.is_set():
            watcher = watch.Watch()
            try:
                for _ in watcher.stream(function, *args, timeout_seconds=timeout_s, deserialize=False, **kwargs):
                    changed.set()
                    if stop.is_set():
                        watcher.stop()
                        break
            except ApiException as error:
                if error.status != 410:  # 410 Gone: the watch expired; start a fresh one
                    stop.wait(1.0)
            except Exception as error:
                if not (isinstance(error, OSError) or type(error).__module__.startswith("urllib3")):
                    raise
                stop.wait(1.0)  # the connection dropped: back off, then watch again
            changed.set()  # whatever was missed meanwhile is picked up by a full reconcile
