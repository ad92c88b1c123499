"""Rendering: a workload spec and a cluster's settings in, Kubernetes objects (plain dicts) out.

Pure functions, no I/O and no ``kubernetes`` import, so ``workload create --dry-run`` needs no API
server and tests validate every object against the real schemas. What they render:

- :func:`render_jobset`: one ``jobset.x-k8s.io/v1alpha2`` JobSet per workload (seed 000's shape:
  one replicated job ``slice`` of ``num_slices`` Indexed Jobs, one pod per host, exclusive
  placement per slice, the priority's PriorityClass), plus hotswap's failure policy, worker
  environment, SIGTERM wiring and checkpoint volume;
- :func:`render_priority_classes`: xpk's five PriorityClasses;
- :func:`render_kueue`: a ResourceFlavor per device type, a ClusterQueue and a LocalQueue;
- :func:`render_controller_manifests`: what runs ``hotswap controller run`` inside the cluster.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
from typing import Any

from hotswap.api import worker as contract
from hotswap.api.catalog import AcceleratorKind, DeviceType, get_device_type
from hotswap.api.errors import InvalidInputError
from hotswap.api.priority import Priority
from hotswap.api.spec import ExitCodes, WorkloadSpec
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.settings import KubeSettings

Manifest = dict[str, Any]

# Characters that need a shell; a command without them runs exec'd, as the local backend does.
_SHELL_SYNTAX = set("|&;<>()$`*?[]#~{}\n")
_CLAIM = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_BUCKET = re.compile(r"^[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]$")

# Run by /bin/sh before the user's command: the contract's RANK and HOTSWAP_ATTEMPT cannot come
# from the downward API (they are sums), so the shell computes them from the indices it does give.
_PRELUDE = (
    'export RANK="$((JOB_INDEX * HOTSWAP_HOSTS_PER_SLICE + JOB_COMPLETION_INDEX))"'
    ' HOTSWAP_ATTEMPT="$((${HOTSWAP_RESTART_COUNT:-0} + 1))"\n'
)
# preStop for commands that need a shell: the shell is PID 1 and, as PID 1, never receives
# SIGTERM's default action, so it cannot pass the signal on. The hook signals every other
# process in the container (kill -1 spares PID 1 and the hook itself); the program checkpoints,
# exits, and the shell exits with its code.
_FORWARD_SIGTERM = ["/bin/sh", "-c", "kill -TERM -1 2>/dev/null; exit 0"]

# The Job failure message of a podFailurePolicy FailJob rule on a pod condition reads
# "Pod <ns>/<name> has condition DisruptionTarget matching FailJob rule at index 0"
# (kubernetes pkg/controller/job/pod_failure_policy.go); JobSet matches it with RE2.
_DISRUPTION_MESSAGE = "has condition DisruptionTarget"


@dataclasses.dataclass(frozen=True)
class CheckpointVolume:
    """Where checkpoints persist across pods: a PersistentVolumeClaim or a GCS bucket (gcsfuse)."""

    kind: str  # "pvc" or "gcsfuse"
    source: str  # claim name or bucket name

    VOLUME_NAME = "hotswap-checkpoints"


def parse_checkpoint_volume(text: str) -> CheckpointVolume:
    kind, sep, source = text.partition(":")
    kind = kind.strip().lower()
    source = source.strip()
    if not sep or kind not in ("pvc", "gcsfuse") or not source:
        raise InvalidInputError(
            f"--checkpoint-volume {text!r}: use pvc:<claim-name> or gcsfuse:<bucket-name>"
        )
    pattern = _CLAIM if kind == "pvc" else _BUCKET
    if not pattern.fullmatch(source):
        what = "PersistentVolumeClaim name" if kind == "pvc" else "GCS bucket name"
        raise InvalidInputError(f"--checkpoint-volume {text!r}: {source!r} is not a valid {what}")
    return CheckpointVolume(kind, source)


def exclusive_topology_key(device: DeviceType, settings: KubeSettings) -> str:
    """The node label one replica owns whole: the node pool of a multi-host TPU slice; the node
    itself for single-host shapes (single-host TPU pools and GPU pools hold many slices)."""
    return settings.node_pool_label if device.multi_host else labels.HOSTNAME_LABEL


def node_selector(device: DeviceType, settings: KubeSettings) -> dict[str, str]:
    if device.kind is AcceleratorKind.TPU:
        return {settings.accelerator_label: device.gke_accelerator, settings.topology_label: device.topology}
    return {settings.gpu_accelerator_label: device.gke_accelerator}


def checkpoint_dir(spec: WorkloadSpec, cluster: str, volume: CheckpointVolume | None) -> str | None:
    """``--checkpoint-dir`` as given, else a directory keyed by cluster and workload on the
    checkpoint volume (so re-creating a workload of the same name resumes it), else none."""
    if spec.checkpoint_dir:
        return spec.checkpoint_dir
    if volume is not None:
        return f"{labels.CHECKPOINT_MOUNT}/{cluster}/{spec.name}"
    return None


def spec_annotation(spec: WorkloadSpec) -> str:
    return json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def render_jobset(
    spec: WorkloadSpec,
    cluster: str,
    settings: KubeSettings,
    volume: CheckpointVolume | None = None,
) -> Manifest:
    """The JobSet of a workload: the exact object ``workload create`` applies."""
    device = get_device_type(spec.device_type)
    if spec.script_dir:
        raise InvalidInputError(
            "--script-dir: the kubernetes backend does not build images; put your code in the image"
            " and pass --docker-image"
        )
    hosts = device.hosts_per_slice
    topology_key = exclusive_topology_key(device, settings)
    job_labels = {
        labels.MANAGED_BY_LABEL: labels.MANAGED_BY,
        labels.WORKLOAD_LABEL: spec.name,
        labels.CLUSTER_LABEL: cluster,
        labels.PRIORITY_NAME_LABEL: spec.priority.label,
    }
    if settings.kueue:
        job_labels[labels.QUEUE_NAME_LABEL] = settings.local_queue
    pod_labels = {labels.WORKLOAD_LABEL: spec.name, labels.CLUSTER_LABEL: cluster}
    pod_annotations: dict[str, str] = {}
    if volume is not None and volume.kind == "gcsfuse":
        pod_annotations["gke-gcsfuse/volumes"] = "true"  # GKE injects the gcsfuse sidecar
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # podFailurePolicy requires it; JobSet restarts whole Jobs
        "priorityClassName": spec.priority.label,
        "terminationGracePeriodSeconds": math.ceil(spec.termination_grace_period_s),
        "nodeSelector": node_selector(device, settings),
    }
    if not settings.kueue:
        # Kueue admits and places Kueue workloads itself; otherwise the hotswap controller does.
        pod_spec["schedulingGates"] = [{"name": labels.PLACEMENT_GATE}]
    if device.kind is AcceleratorKind.TPU:
        # Multislice TPU traffic (DCN) goes through the host network, as in xpk and GKE's docs.
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    else:
        pod_spec["tolerations"] = [{"key": device.resource_name, "operator": "Exists", "effect": "NoSchedule"}]
    pod_spec["containers"] = [_container(spec, cluster, device, volume)]
    volumes = _volumes(spec, volume)
    if volumes:
        pod_spec["volumes"] = volumes
    pod_template: dict[str, Any] = {"metadata": {"labels": pod_labels}, "spec": pod_spec}
    if pod_annotations:
        pod_template["metadata"]["annotations"] = pod_annotations
    jobset: Manifest = {
        "apiVersion": labels.JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": {
            "name": spec.name,
            "namespace": settings.namespace,
            "labels": job_labels,
            "annotations": {
                labels.EXCLUSIVE_TOPOLOGY_ANNOTATION: topology_key,
                labels.SPEC_ANNOTATION: spec_annotation(spec),
            },
        },
        "spec": {
            # Created suspended: it waits in hotswap's queue (or Kueue's) until admitted.
            "suspend": True,
            "failurePolicy": _failure_policy(spec),
            "replicatedJobs": [
                {
                    "name": contract.REPLICATED_JOB,
                    "replicas": spec.num_slices,
                    "template": {
                        "spec": {
                            "parallelism": hosts,
                            "completions": hosts,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "podFailurePolicy": _pod_failure_policy(spec),
                            "template": pod_template,
                        }
                    },
                }
            ],
        },
    }
    return jobset


def _failure_policy(spec: WorkloadSpec) -> dict[str, Any]:
    """JobSet's failure policy: infrastructure restarts free, user errors fail, the rest counts.

    A Job fails in one of three ways (see :func:`_pod_failure_policy`): a pod was disrupted
    (preempted, evicted, drained: FailJob on DisruptionTarget), a worker exited with a code that
    is not a restart code (FailJob on exit code), or a worker exited with a restart code
    (backoffLimit 0 exceeded). The first restarts the whole JobSet without counting against
    maxRestarts, the second fails the JobSet, the third matches no rule and gets JobSet's
    default, a restart counted against maxRestarts: the core's failure policy.
    """
    return {
        "maxRestarts": spec.max_restarts,
        "restartStrategy": spec.restart_strategy.value,
        "rules": [
            {
                "name": "disruptionRestartsFree",
                "action": "RestartJobSetAndIgnoreMaxRestarts",
                "onJobFailureReasons": ["PodFailurePolicy"],
                "onJobFailureMessagePatterns": [_DISRUPTION_MESSAGE],
            },
            {
                "name": "userErrorFails",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
            },
        ],
    }


def restartable_codes(codes: ExitCodes) -> list[int]:
    """Exit codes that restart: the user's, plus the SDK's checkpointed exit (a worker that
    saved its state on SIGTERM is never a user error)."""
    values = {code for low, high in codes.ranges for code in range(low, high + 1)}
    values.add(contract.CHECKPOINTED_EXIT_CODE)
    return sorted(values)


def _pod_failure_policy(spec: WorkloadSpec) -> dict[str, Any]:
    return {
        "rules": [
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": labels.CONTAINER_NAME,
                    "operator": "NotIn",
                    "values": restartable_codes(spec.restart_on_exit_codes),
                },
            },
        ]
    }


def _field(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def worker_env(spec: WorkloadSpec, cluster: str, device: DeviceType, volume: CheckpointVolume | None) -> list[dict[str, Any]]:
    """The worker environment of :mod:`hotswap.api.worker`: JobSet's indices from the pod's labels
    through the downward API, the rest as values. The user's variables come first so that the
    contract's win, as on the local backend."""
    hosts = device.hosts_per_slice
    env: list[dict[str, Any]] = [{"name": key, "value": value} for key, value in spec.env.items()]
    contract_env: list[tuple[str, Any]] = [
        (contract.JOBSET_NAME, _field(f"metadata.labels['{labels.JOBSET_NAME_LABEL}']")),
        (contract.REPLICATED_JOB_NAME, _field(f"metadata.labels['{labels.REPLICATED_JOB_NAME_LABEL}']")),
        (contract.JOB_INDEX, _field(f"metadata.labels['{labels.JOB_INDEX_LABEL}']")),
        (contract.JOB_COMPLETION_INDEX, _field(f"metadata.annotations['{labels.JOB_COMPLETION_INDEX_ANNOTATION}']")),
        (contract.MEGASCALE_SLICE_ID, _field(f"metadata.labels['{labels.JOB_INDEX_LABEL}']")),
        (contract.MEGASCALE_NUM_SLICES, str(spec.num_slices)),
        # Replica 0, host 0 through JobSet's headless service (its name is the JobSet's).
        (contract.MASTER_ADDR, f"{spec.name}-{contract.REPLICATED_JOB}-0-0.{spec.name}"),
        (contract.MASTER_PORT, str(labels.MASTER_PORT)),
        (contract.WORLD_SIZE, str(spec.num_slices * hosts)),
        (contract.LOCAL_RANK, "0"),
        (contract.HOTSWAP_CLUSTER, cluster),
        (contract.HOTSWAP_WORKLOAD, spec.name),
        (contract.HOTSWAP_HOSTS_PER_SLICE, str(hosts)),
        (contract.HOTSWAP_TERMINATION_GRACE_S, f"{spec.termination_grace_period_s:g}"),
        (contract.HOTSWAP_RESTART_COUNT, _field(f"metadata.labels['{labels.RESTART_ATTEMPT_LABEL}']")),
        (contract.HOTSWAP_SLICE, _field(f"metadata.annotations['{labels.SLICE_ANNOTATION}']")),
    ]
    directory = checkpoint_dir(spec, cluster, volume)
    if directory is not None:
        contract_env.append((contract.HOTSWAP_CHECKPOINT_DIR, directory))
    if spec.elastic:
        contract_env.append((contract.HOTSWAP_MEMBERSHIP_FILE, f"{labels.MEMBERSHIP_DIR}/{labels.MEMBERSHIP_FILE}"))
    for name, value in contract_env:
        env.append({"name": name, **(value if isinstance(value, dict) else {"value": value})})
    return env


def needs_shell(command: str) -> bool:
    if _SHELL_SYNTAX.intersection(command):
        return True
    try:
        words = shlex.split(command)
    except ValueError:
        return True
    return not words or "=" in words[0]


def container_command(command: str) -> list[str]:
    """``/bin/sh`` computes RANK, then a simple command is exec'd (it is PID 1 and gets SIGTERM
    itself); a command that needs a shell runs in that shell."""
    if needs_shell(command):
        return ["/bin/sh", "-c", _PRELUDE + command]
    return ["/bin/sh", "-c", _PRELUDE + 'exec "$@"', "hotswap-worker", *shlex.split(command)]


def _container(spec: WorkloadSpec, cluster: str, device: DeviceType, volume: CheckpointVolume | None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": labels.CONTAINER_NAME,
        "image": spec.docker_image or spec.base_docker_image or labels.DEFAULT_IMAGE,
        "command": container_command(spec.command),
        "env": worker_env(spec, cluster, device, volume),
        "resources": {"limits": {device.resource_name: device.chips_per_host}},
    }
    if needs_shell(spec.command):
        container["lifecycle"] = {"preStop": {"exec": {"command": list(_FORWARD_SIGTERM)}}}
    mounts = []
    if volume is not None:
        mounts.append({"name": CheckpointVolume.VOLUME_NAME, "mountPath": labels.CHECKPOINT_MOUNT})
    if spec.elastic:
        mounts.append({"name": "hotswap-membership", "mountPath": labels.MEMBERSHIP_DIR, "readOnly": True})
    if mounts:
        container["volumeMounts"] = mounts
    return container


def _volumes(spec: WorkloadSpec, volume: CheckpointVolume | None) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = []
    if volume is not None and volume.kind == "pvc":
        volumes.append({"name": CheckpointVolume.VOLUME_NAME, "persistentVolumeClaim": {"claimName": volume.source}})
    elif volume is not None:
        volumes.append(
            {
                "name": CheckpointVolume.VOLUME_NAME,
                "csi": {
                    "driver": "gcsfuse.csi.storage.gke.io",
                    "volumeAttributes": {"bucketName": volume.source, "mountOptions": "implicit-dirs"},
                },
            }
        )
    if spec.elastic:
        # The controller writes the membership record into a pod annotation; the kubelet keeps
        # this file in step with it (eventually: it refreshes projected files periodically).
        volumes.append(
            {
                "name": "hotswap-membership",
                "downwardAPI": {
                    "items": [
                        {
                            "path": labels.MEMBERSHIP_FILE,
                            "fieldRef": {"fieldPath": f"metadata.annotations['{labels.MEMBERSHIP_ANNOTATION}']"},
                        }
                    ]
                },
            }
        )
    return volumes


# ---------------------------------------------------------------------- cluster setup


def render_priority_classes() -> list[Manifest]:
    """xpk's five PriorityClasses (names, values and descriptions as xpk creates them)."""
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": level.label, "labels": {labels.MANAGED_BY_LABEL: labels.MANAGED_BY}},
            "value": int(level),
            "globalDefault": False,
            "description": level.label.replace("-", " ").title(),
        }
        for level in Priority
    ]


def flavor_name(device: DeviceType) -> str:
    return device.name


def render_kueue(settings: KubeSettings, slices_by_type: dict[str, int]) -> list[Manifest]:
    """A ResourceFlavor per device type found, one ClusterQueue whose quota is every chip the
    cluster has, preempting lower priority within it (as xpk sets it up), and a LocalQueue."""
    flavors: list[Manifest] = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for name in sorted(slices_by_type):
        device = get_device_type(name)
        flavors.append(
            {
                "apiVersion": labels.KUEUE_API_VERSION,
                "kind": "ResourceFlavor",
                "metadata": {"name": flavor_name(device), "labels": {labels.MANAGED_BY_LABEL: labels.MANAGED_BY}},
                "spec": {"nodeLabels": node_selector(device, settings)},
            }
        )
        chips = slices_by_type[name] * device.chips_per_slice
        groups.setdefault(device.resource_name, []).append(
            {"name": flavor_name(device), "resources": [{"name": device.resource_name, "nominalQuota": chips}]}
        )
    cluster_queue: Manifest = {
        "apiVersion": labels.KUEUE_API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": settings.cluster_queue, "labels": {labels.MANAGED_BY_LABEL: labels.MANAGED_BY}},
        "spec": {
            "namespaceSelector": {},
            "preemption": {"reclaimWithinCohort": "Never", "withinClusterQueue": "LowerPriority"},
            "resourceGroups": [
                {"coveredResources": [resource], "flavors": flavor_list} for resource, flavor_list in sorted(groups.items())
            ],
        },
    }
    local_queue: Manifest = {
        "apiVersion": labels.KUEUE_API_VERSION,
        "kind": "LocalQueue",
        "metadata": {
            "name": settings.local_queue,
            "namespace": settings.namespace,
            "labels": {labels.MANAGED_BY_LABEL: labels.MANAGED_BY},
        },
        "spec": {"clusterQueue": settings.cluster_queue},
    }
    return [*flavors, cluster_queue, local_queue]


# ---------------------------------------------------------------------- the in-cluster controller

SETTINGS_VARIABLE = "HOTSWAP_KUBERNETES_SETTINGS"


def controller_rules(settings: KubeSettings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Least-privilege RBAC of the controller: (cluster-wide rules, rules in its namespace)."""
    cluster_rules = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    namespaced = [
        {"apiGroups": [labels.JOBSET_GROUP], "resources": [labels.JOBSET_PLURAL], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [labels.CONTROLLER_NAME],
            "verbs": ["get", "update"],
        },
    ]
    if settings.kueue:
        namespaced.append({"apiGroups": [labels.KUEUE_GROUP], "resources": ["workloads"], "verbs": ["get", "list", "watch"]})
    return cluster_rules, namespaced


def render_controller_manifests(cluster: str, settings: KubeSettings, image: str) -> list[Manifest]:
    """ServiceAccount, RBAC and a one-replica Deployment running ``hotswap controller run``.

    One replica is the normal state; the Lease the controller takes makes a second one (during a
    rollout, or scaled by mistake) wait instead of acting.
    """
    name = labels.CONTROLLER_NAME
    namespace = settings.namespace
    meta_labels = {labels.MANAGED_BY_LABEL: labels.MANAGED_BY, "app.kubernetes.io/name": name, labels.CLUSTER_LABEL: cluster}
    cluster_rules, namespaced_rules = controller_rules(settings)
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
                    "metadata": {"labels": meta_labels},
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
                                "command": ["hotswap", "controller", "run", "--cluster", cluster],
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
