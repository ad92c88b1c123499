"""The JobSet of a workload: seed 000's shape (one replicated job ``slice`` of ``num_slices``
Indexed Jobs, one pod per host, exclusive placement per slice, the priority's PriorityClass),
plus hotswap's failure policy. The worker container inside it is :mod:`.container`'s.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hotswap.api import worker as contract
from hotswap.api.catalog import AcceleratorKind, DeviceType, get_device_type
from hotswap.api.errors import InvalidInputError
from hotswap.api.spec import ExitCodes, WorkloadSpec
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.checkpoint_volume import CheckpointVolume
from hotswap.backends.kubernetes.render.container import worker_container, worker_volumes
from hotswap.backends.kubernetes.settings import KubeSettings

Manifest = dict[str, Any]

# The Job failure message of a podFailurePolicy FailJob rule on a pod condition reads
# "Pod <ns>/<name> has condition DisruptionTarget matching FailJob rule at index 0"
# (kubernetes pkg/controller/job/pod_failure_policy.go); JobSet matches it with RE2.
_DISRUPTION_MESSAGE = "has condition DisruptionTarget"


def exclusive_topology_key(device: DeviceType, settings: KubeSettings) -> str:
    """The node label one replica owns whole: the node pool of a multi-host TPU slice; the node
    itself for single-host shapes (single-host TPU pools and GPU pools hold many slices)."""
    return settings.node_pool_label if device.multi_host else labels.HOSTNAME_LABEL


def node_selector(device: DeviceType, settings: KubeSettings) -> dict[str, str]:
    if device.kind is AcceleratorKind.TPU:
        return {settings.accelerator_label: device.gke_accelerator, settings.topology_label: device.topology}
    return {settings.gpu_accelerator_label: device.gke_accelerator}


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
    pod_spec["containers"] = [worker_container(spec, cluster, device, volume)]
    volumes = worker_volumes(spec, volume)
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
