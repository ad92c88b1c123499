"""The ``coordinator`` replicated job of an elastic JobSet: the JAX coordination service of every
generation, in a small pod of its own, so that the loss of any slice (the first's included)
leaves it running.

Why a pod of its own: ``jax.distributed`` runs the service in rank 0's process, and every other
process of the generation aborts when it goes away. Locally rank 0 starts it in a process of
its own (:mod:`hotswap.train.jax.coordinator`), but on Kubernetes that process would live in
rank 0's pod, on rank 0's node: a node failure under slice 0 would take it along and abort
every survivor. Here it runs ``python3 -m hotswap.train.jax.coordinator --every-generation``,
which reads the same membership file as the workers (the controller annotates this pod with
each generation, as it does the workers) and serves each generation on its ``master_port``.
Workers are told so (:data:`~hotswap.api.worker.HOTSWAP_JAX_COORDINATOR`, this pod's DNS name
through the JobSet's headless service) and start no service themselves. PyTorch workers ignore
it (their TCPStore lives in the generation's rank 0, which a re-formation moves anyway).

- **Placement:** on no slice's node. It requests no accelerator and tolerates no accelerator
  taint (GKE taints TPU and GPU nodes NoSchedule), and its required node affinity excludes
  nodes carrying the accelerator labels for clusters whose accelerator nodes are not tainted.
  No placement gate: kube-scheduler places it once the JobSet runs. It requests no CPU or
  memory: hotswap's Kueue ClusterQueue covers the accelerators only, and Kueue cannot admit
  a pod set requesting a resource its ClusterQueue does not cover; its pod set (count 1) is
  still part of the workload's admission, admitted and suspended with the slices.
- **Its failure:** every exit and disruption of its pod is ``Ignore``d by its Job (the Job
  creates a new pod, same index, same DNS name), so it never fails the Job, and it is not a
  worker: the controller judges no exit of it. The generation running when it dies loses its
  service: JAX ends its processes (the client's error callback); their exits around its loss
  are the backend's loss (:mod:`hotswap.backends.kubernetes.pod_signals`): the workload
  restarts in place, uncharged, and the next attempt meets at the new pod. On a node that
  stops answering it is evicted after :data:`EVICT_AFTER_S` and force-deleted once its grace
  period is over (planning.py), so that its Job can replace it. Should its Job fail even so (kubelet
  rejections beyond ``backoffLimit``), a failure-policy rule restarts the JobSet without
  counting against ``maxRestarts`` (``RestartJobSetAndIgnoreMaxRestarts``): the workload's fault
  budget is for its workers.
- **Success:** the JobSet's success policy targets the ``slice`` replicated job only: the
  service never exits by itself, and JobSet deletes its Job once the slices completed.
"""

from __future__ import annotations

from typing import Any

from hotswap.api import worker as contract
from hotswap.api.spec import WorkloadSpec
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.settings import KubeSettings

CONTAINER = contract.COORDINATOR_JOB  # its container, named as its replicated job
# The service's heartbeat timeout, seconds: the workers' (JaxGroup's default).
HEARTBEAT_S = 100
# Exits and disruptions of the service's pod: the Job makes a new one (see the module).
_BACKOFF_LIMIT = 6  # kubelet rejections only, as the Job's default
EVICT_AFTER_S = 30  # on a node that stopped answering (tolerationSeconds)

FAILURE_RULE = {
    "name": "coordinator",
    "action": "RestartJobSetAndIgnoreMaxRestarts",
    "targetReplicatedJobs": [contract.COORDINATOR_JOB],
}
SUCCESS_POLICY = {"operator": "All", "targetReplicatedJobs": [contract.REPLICATED_JOB]}


def coordinator_job(spec: WorkloadSpec, cluster: str, settings: KubeSettings, membership_volume: dict[str, Any]) -> dict[str, Any]:
    """The replicated job (one replica, one pod) running the service for every generation."""
    not_on_accelerators = [
        {"key": label, "operator": "DoesNotExist"}
        for label in sorted({settings.accelerator_label, settings.gpu_accelerator_label})
    ]
    container = {
        "name": CONTAINER,
        "image": spec.docker_image or spec.base_docker_image or labels.DEFAULT_IMAGE,
        "command": [
            "python3", "-m", "hotswap.train.jax.coordinator", "--every-generation",
            f"{labels.MEMBERSHIP_DIR}/{labels.MEMBERSHIP_FILE}", str(HEARTBEAT_S),
        ],
        "volumeMounts": [{"name": membership_volume["name"], "mountPath": labels.MEMBERSHIP_DIR, "readOnly": True}],
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # podFailurePolicy requires it
        "priorityClassName": spec.priority.label,
        "terminationGracePeriodSeconds": 5,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": not_on_accelerators}]}
            }
        },
        # Evicted from an unreachable or NotReady node after 30 s, not the default 300 s: the
        # controller then force-deletes it once its grace period is over, and its Job makes a
        # new pod on a node that answers (planning.py, ``_stuck_pods``).
        "tolerations": [
            {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": EVICT_AFTER_S}
            for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
        ],
        "containers": [container],
        "volumes": [membership_volume],
    }
    return {
        "name": contract.COORDINATOR_JOB,
        "replicas": 1,
        "template": {
            "spec": {
                "parallelism": 1,
                "completions": 1,
                "completionMode": "Indexed",  # the pod's DNS name: <jobset>-coordinator-0-0.<jobset>
                "backoffLimit": _BACKOFF_LIMIT,
                "podFailurePolicy": {
                    "rules": [
                        {"action": "Ignore", "onPodConditions": [{"type": labels.DISRUPTION_TARGET, "status": "True"}]},
                        {"action": "Ignore", "onExitCodes": {"containerName": CONTAINER, "operator": "NotIn", "values": [0]}},
                    ]
                },
                "template": {
                    "metadata": {"labels": {labels.WORKLOAD_LABEL: spec.name, labels.CLUSTER_LABEL: cluster}},
                    "spec": pod_spec,
                },
            }
        },
    }
