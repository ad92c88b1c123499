"""What a workload's workers need to write their replicas' records (:mod:`hotswap.api.worker_report`)
and nothing else: a ServiceAccount of the workload (its pods run as it), a Role allowing ``get``
and ``update`` on exactly its replicas' Leases (``resourceNames``), the RoleBinding between them,
and the Leases themselves, made beforehand because a rule with ``resourceNames`` cannot allow
``create``. A pod can so write its own workload's records, and no other object: not another
workload's record, not a JobSet, not a pod.

The ServiceAccount keeps what the namespace's ``default`` one gives the pods that ran as it until
now: its image pull secrets and its GKE Workload Identity annotation (the Google service account
its pods' checkpoint writes to a bucket act as). Everything but the ServiceAccount, Role and
RoleBinding made before the JobSet (its pods are created, and admitted against the
ServiceAccount, as soon as it exists) is owned by the JobSet, so the garbage collector deletes
them with it; those three are given the JobSet as owner once it exists.
"""

from __future__ import annotations

from typing import Any

from hotswap.api.spec import WorkloadSpec
from hotswap.api.worker_report import INTERVAL_ANNOTATION, PUBLISH_INTERVAL_S, REPORT_ANNOTATION, report_name
from hotswap.backends.kubernetes import labels

Manifest = dict[str, Any]
WORKLOAD_IDENTITY = "iam.gke.io/gcp-service-account"  # GKE Workload Identity's binding of a ServiceAccount


def worker_service_account(workload: str) -> str:
    """The workload's ServiceAccount (a workload name is at most 40 characters)."""
    return f"hotswap-worker-{workload}"


def _meta(name: str, spec: WorkloadSpec, namespace: str, owner: Manifest | None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name, "namespace": namespace,
        "labels": {labels.WORKLOAD_LABEL: spec.name, labels.MANAGED_BY_LABEL: labels.MANAGED_BY},
    }
    if owner is not None:
        meta["ownerReferences"] = [{
            "apiVersion": labels.JOBSET_API_VERSION, "kind": "JobSet",
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
        }]
    return meta


def report_access(spec: WorkloadSpec, namespace: str, default_account: Manifest | None = None, owner: Manifest | None = None) -> list[Manifest]:
    """The ServiceAccount, Role and RoleBinding of the workload's workers (``owner``: the JobSet,
    once it exists; ``default_account``: the namespace's ``default`` ServiceAccount, if readable)."""
    account_name = worker_service_account(spec.name)
    account: Manifest = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(account_name, spec, namespace, owner)}
    default = default_account or {}
    identity = ((default.get("metadata") or {}).get("annotations") or {}).get(WORKLOAD_IDENTITY)
    if identity:
        account["metadata"]["annotations"] = {WORKLOAD_IDENTITY: identity}
    if default.get("imagePullSecrets"):
        account["imagePullSecrets"] = list(default["imagePullSecrets"])
    role: Manifest = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": _meta(account_name, spec, namespace, owner),
        "rules": [{
            "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "resourceNames": [report_name(spec.name, replica) for replica in range(spec.num_slices)],
            "verbs": ["get", "update"],
        }],
    }
    binding: Manifest = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": _meta(account_name, spec, namespace, owner),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account_name},
        "subjects": [{"kind": "ServiceAccount", "name": account_name, "namespace": namespace}],
    }
    return [account, role, binding]


def report_leases(spec: WorkloadSpec, namespace: str, owner: Manifest, interval_s: float = PUBLISH_INTERVAL_S) -> list[Manifest]:
    """One Lease per replica, empty (a record left by a run of the same name is cleared), asking
    its writer for a heartbeat every ``interval_s`` (:func:`hotswap.api.worker_report.heartbeat_interval`
    of the cluster's size)."""
    annotations = {REPORT_ANNOTATION: "", INTERVAL_ANNOTATION: f"{interval_s:g}"}
    return [
        {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {**_meta(report_name(spec.name, replica), spec, namespace, owner), "annotations": dict(annotations)},
            "spec": {"holderIdentity": f"{spec.name}/replica-{replica}"},
        }
        for replica in range(spec.num_slices)
    ]


def grants_report_update(role: Manifest | None, binding: Manifest | None, workload: str, namespace: str, lease: str) -> bool:
    """Whether the workload's workers may still write ``lease`` as :func:`report_access` made
    them able to: its Role allows ``update`` on that Lease and its RoleBinding binds the Role to
    their ServiceAccount (someone who edited or deleted either has the workers' writes refused)."""
    account = worker_service_account(workload)
    if role is None or binding is None or (binding.get("roleRef") or {}).get("name") != account:
        return False
    bound = any(s.get("kind") == "ServiceAccount" and s.get("name") == account and s.get("namespace", namespace) == namespace
                for s in binding.get("subjects") or [])
    allowed = any(
        "coordination.k8s.io" in (rule.get("apiGroups") or []) and "leases" in (rule.get("resources") or [])
        and "update" in (rule.get("verbs") or []) and lease in (rule.get("resourceNames") or [lease])
        for rule in role.get("rules") or []
    )
    return bound and allowed
