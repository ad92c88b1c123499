"""What runs ``hotswap controller run`` inside the cluster: a ServiceAccount, least-privilege
RBAC and a one-replica Deployment."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.render.jobset import Manifest
from hotswap.backends.kubernetes.settings import KubeSettings

SETTINGS_VARIABLE = "HOTSWAP_KUBERNETES_SETTINGS"
METRICS_PORT = 8080  # Prometheus metrics (hotswap.backends.kit.metrics), scraped in the cluster


def controller_rules(cluster: str, settings: KubeSettings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Least-privilege RBAC of the controller: (cluster-wide rules, rules in its namespace)."""
    cluster_rules = [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        # Read-only, cluster-wide: pods of other owners (other namespaces, xpk jobs) occupy slices.
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    ]
    namespaced = [
        {"apiGroups": [labels.JOBSET_GROUP], "resources": [labels.JOBSET_PLURAL], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "patch", "delete"]},  # patch: touch a Job that creates no pods
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch", "delete"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        # list: the replicas' records (their Leases, written by the workloads' own pods); patch:
        # their heartbeat interval annotation, which follows the cluster's size (controller/report_intervals.py)
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "list", "patch"]},
        # get: before a replica's silent record is called a hang, its workers may still write it
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": ["get"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [labels.CONTROLLER_NAME],
            "verbs": ["get", "update"],
        },
        # The cluster's record of failed runs (failed_runs.py): create names no object, so
        # create is granted alone; reading and adding to it are granted on that one name.
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [labels.FAILED_RUNS_RECORD_PREFIX + cluster], "verbs": ["get", "patch"]},
    ]
    if settings.kueue:
        # patch: a workload hotswap fails is deactivated (spec.active), Kueue's way to stop it.
        namespaced.append({"apiGroups": [labels.KUEUE_GROUP], "resources": [labels.KUEUE_WORKLOADS], "verbs": ["get", "list", "watch", "patch"]})
    return cluster_rules, namespaced


def render_controller_manifests(cluster: str, settings: KubeSettings, image: str) -> list[Manifest]:
    """ServiceAccount, RBAC and a one-replica Deployment running ``hotswap controller run``.

    One replica is the normal state; the Lease the controller takes makes a second one (during a
    rollout, or scaled by mistake) wait instead of acting.
    """
    name = labels.CONTROLLER_NAME
    namespace = settings.namespace
    meta_labels = {labels.MANAGED_BY_LABEL: labels.MANAGED_BY, "app.kubernetes.io/name": name, labels.CLUSTER_LABEL: cluster}
    cluster_rules, namespaced_rules = controller_rules(cluster, settings)
    binding_name = f"{name}-{namespace}"  # cluster-scoped: one per namespace it serves
    in_cluster = dataclasses.replace(settings, context=None)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace, "labels": meta_labels}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": binding_name, "labels": meta_labels},
            "rules": cluster_rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": binding_name, "labels": meta_labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": binding_name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace, "labels": meta_labels},
            "rules": namespaced_rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace, "labels": meta_labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": meta_labels},
            "spec": {
                "replicas": 1,
                # Recreate: the old controller lets go of the Lease before the new one starts.
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                "template": {
                    "metadata": {
                        "labels": meta_labels,
                        # The scrape convention of Prometheus' kubernetes_sd examples.
                        "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT)},
                    },
                    "spec": {
                        "serviceAccountName": name,
                        "terminationGracePeriodSeconds": 30,
                        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532},
                        # The root filesystem is read-only; Python and hotswap get a scratch /tmp.
                        "volumes": [{"name": "tmp", "emptyDir": {}}],
                        "containers": [
                            {
                                "name": "controller",
                                "image": image,
                                "command": ["hotswap", "controller", "run", "--cluster", cluster, "--metrics-address", f"0.0.0.0:{METRICS_PORT}", "--expose-metrics"],
                                "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
                                "env": [
                                    {"name": SETTINGS_VARIABLE, "value": json.dumps(in_cluster.to_dict(), sort_keys=True)},
                                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                    {"name": "HOTSWAP_HOME", "value": "/tmp/hotswap"},
                                ],
                                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                                "resources": {
                                    "requests": {"cpu": "100m", "memory": "256Mi"},
                                    "limits": {"memory": "1Gi"},
                                },
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                            }
                        ],
                    },
                },
            },
        },
    ]
