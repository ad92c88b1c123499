"""The writes hotswap makes: server-side apply of whole objects (field manager ``hotswap``),
JSON merge patches of the few fields the controller changes, deletions, cordons, evictions,
Events on JobSets, and keys added to a ConfigMap (the failed runs' record)."""

from __future__ import annotations

from typing import Any

from hotswap.api.errors import ConflictError, NotFoundError
from hotswap.api.times import iso_utc
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.client.calls import APPLY, MERGE, client_module
from hotswap.backends.kubernetes.client.reads import Reads


_CORE_KINDS = {
    "ServiceAccount": ("CoreV1Api", "patch_namespaced_service_account"),
    "Role": ("RbacAuthorizationV1Api", "patch_namespaced_role"),
    "RoleBinding": ("RbacAuthorizationV1Api", "patch_namespaced_role_binding"),
    "Lease": ("CoordinationV1Api", "patch_namespaced_lease"),
}


class Writes(Reads):
    """Built on :class:`Reads`."""

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
        if kind in _CORE_KINDS:  # a workload's workers' access and records (render/reports.py)
            api_name, method = _CORE_KINDS[kind]
            api = getattr(client_module(), api_name)(self.api_client)
            return self._call(doing, getattr(api, method), name, manifest["metadata"]["namespace"], body, **common)
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

    def delete_job(self, name: str, uid: str) -> bool:
        """Delete one Job, only if it still is the one of ``uid`` (a precondition: JobSet may have
        recreated it under the same name). False: it was gone, or it is another Job now.

        In the foreground, as JobSet's own restarts do (jobset_controller.go ``deleteJobs``): the
        Job stays, with a deletionTimestamp, until its pods are gone, so JobSet recreates it
        (same name, same pod hostnames) only then. The headless Service publishes not-ready
        addresses: in the background, a new pod would share its DNS name with the old one still
        checkpointing after its SIGTERM, and the new attempt's MASTER_ADDR could reach the old
        coordinator."""
        options = client_module().V1DeleteOptions(preconditions=client_module().V1Preconditions(uid=uid), propagation_policy="Foreground")
        try:
            self._call(f"delete Job {name}", self.batch.delete_namespaced_job, name, self.namespace, body=options, write=True)
        except (NotFoundError, ConflictError):
            return False  # already gone, or recreated: that Job is not ours to delete
        return True

    def patch_job(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._call(f"update Job {name}", self.batch.patch_namespaced_job, name, self.namespace, patch, _content_type=MERGE, write=True)

    def delete_pod(self, name: str, uid: str | None = None, force: bool = False) -> bool:
        """Delete one pod: with its own grace period, or (``force``) at once, grace 0; with
        ``uid``, only if it still is that pod (a precondition). False: it was gone, or it is
        another pod now."""
        client = client_module()
        options = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid) if uid else None, grace_period_seconds=0 if force else None,
        )
        try:
            self._call(f"{'force-delete' if force else 'delete'} pod {name}", self.core.delete_namespaced_pod, name, self.namespace, body=options, write=True)
        except (NotFoundError, ConflictError):
            return False
        return True

    def patch_lease(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A merge patch of a replica's record Lease (its heartbeat interval: controller/report_intervals.py)."""
        return self._call(f"update Lease {name}", self.coordination.patch_namespaced_lease, name, self.namespace, patch, _content_type=MERGE, write=True)

    def patch_pod(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._call(f"update pod {name}", self.core.patch_namespaced_pod, name, self.namespace, patch, _content_type=MERGE, write=True)

    def add_to_config_map(self, name: str, data: dict[str, str], meta_labels: dict[str, str]) -> dict[str, Any]:
        """Add keys to a ConfigMap by a merge patch (others' keys stay), creating it if missing."""
        patch = {"data": data}

        def merge() -> dict[str, Any]:
            return self._call(f"update ConfigMap {name}", self.core.patch_namespaced_config_map, name, self.namespace, patch,
                              _content_type=MERGE, write=True)

        try:
            return merge()
        except NotFoundError:
            pass
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": self.namespace, "labels": meta_labels}, "data": data}
        try:
            return self._call(f"create ConfigMap {name}", self.core.create_namespaced_config_map, self.namespace, body, write=True)
        except ConflictError:
            return merge()  # another writer created it meanwhile

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
