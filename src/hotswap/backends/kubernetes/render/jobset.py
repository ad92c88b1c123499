"""The JobSet of a workload: seed 000's shape (one replicated job ``slice`` of ``num_slices``
Indexed Jobs, one pod per host, the priority's PriorityClass), plus hotswap's failure policy and
placement gate. The worker container inside it is :mod:`.container`'s.

Who decides what, and why it is rendered so:

- **Worker exits are judged by the hotswap controller, not by the Job.** When a node dies, the
  other workers usually exit with ordinary codes (1: a lost peer) some 40-50 s before the node
  is marked NotReady. A ``podFailurePolicy`` that fails the Job on such a code would make JobSet
  fail the whole JobSet (FailJobSet) or restart it counted against ``maxRestarts``: the hotswap
  would have nothing left to move, or pay for the infrastructure's fault. So every exit and
  every disruption is ``Ignore``d by the Job (its index gets a new pod, which waits behind the
  placement gate), and the controller judges it once it knows whether a node under the
  workload failed meanwhile (:mod:`hotswap.backends.kubernetes.pod_signals`): collateral exits
  are never charged, restart codes restart (charged), other codes fail the workload.
- **A pod the kubelet rejects** (Failed without an exit code: a device plugin that cannot
  allocate the node's accelerators, UnexpectedAdmissionError) is a hardware failure, the
  controller's to handle (the workload moves off that node, uncharged). No podFailurePolicy
  rule can match it: the kubelet's ``rejectPod`` sets only the phase, reason and message (no
  container status, no pod condition), and ``matchPodFailurePolicy`` matches exit codes and
  conditions only (kubernetes pkg/kubelet/kubelet.go, pkg/controller/job/pod_failure_policy.go).
  It counts against ``backoffLimit`` instead, which is one per host: the Job survives such a
  rejection of each of its pods (its replacement waits behind the gate), so JobSet neither
  fails nor restarts the workload for it. Nothing else counts: every exit and disruption is
  ignored above.
- **Placement:** every pod waits behind the ``hotswap.dev/placement`` gate until the
  controller releases it, pinned to the whole healthy slice the core chose for its replica
  (node selector entries on a gated pod, KEP-3838), with or without Kueue (Kueue's quota does
  not know a slice with a dead node is unusable; kube-scheduler would put a replica's leader
  there). That pinning is hotswap's exclusive placement, so JobSet's leader/follower exclusive
  placement is not used: its webhook would refuse the followers of a replica parked behind the
  gate, and creates followers only after their leader is scheduled (a round trip per restart).
  JobSet's alternative, its node-selector strategy, needs nodes labelled and tainted per Job
  beforehand; pinning pods needs nothing of the nodes.
- **Success:** JobSet's default ``successPolicy`` (``operator: All`` over every replicated
  job, success_policy.go): the JobSet is Completed once every replica's Job completed, and
  only then does JobSet delete the Jobs still active. Never ``Any``: replicas of a multislice
  job finish one after another (each checkpoints, then exits 0), and under ``Any`` JobSet
  would declare the JobSet Completed when the first one finishes and delete the others mid-
  checkpoint. An elastic workload running on fewer slices has parked replicas whose Jobs
  never run, so JobSet never completes it: the controller does. Every worker exit 0 is
  counted at once (:mod:`hotswap.backends.kubernetes.pod_signals`); once every worker of the
  slices the workload holds exited 0 the core declares it SUCCESSFUL, and the controller ends
  the parked Jobs the way it stops any workload: it suspends the JobSet (its Jobs' gated pods
  are deleted; the completed Jobs stay Complete), or with Kueue deactivates its Workload.
- **Elastic JAX:** an elastic JobSet also has the ``coordinator`` replicated job, the JAX
  coordination service of every generation on no slice's node (:mod:`.coordination`); its
  success policy then targets the ``slice`` replicated job (still ``All``), since the service
  never exits by itself.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hotswap.api import worker as contract
from hotswap.api.catalog import AcceleratorKind, DeviceType, get_device_type
from hotswap.api.launch import Run
from hotswap.api.errors import InvalidInputError
from hotswap.api.spec import WorkloadSpec
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.checkpoint_volume import CheckpointVolume, checkpoint_dir, resumed_from
from hotswap.backends.kubernetes.render import coordination
from hotswap.backends.kubernetes.render.reports import worker_service_account
from hotswap.backends.kubernetes.render.container import container_name, membership_volume, worker_container, worker_volumes
from hotswap.backends.kubernetes.settings import KubeSettings

Manifest = dict[str, Any]

def node_selector(device: DeviceType, settings: KubeSettings) -> dict[str, str]:
    if device.kind is AcceleratorKind.TPU:
        return {settings.accelerator_label: device.gke_accelerator, settings.topology_label: device.topology}
    return {settings.gpu_accelerator_label: device.gke_accelerator}


# Fields added after the annotation's first release: left out while unset, so the annotation of a
# workload that does not use them stays what earlier releases wrote (and read).
_LATER_OPTIONAL_FIELDS = ("docker_name", "debug_dump_gcs")


def spec_annotation(spec: WorkloadSpec) -> str:
    unset = {name for name in _LATER_OPTIONAL_FIELDS if getattr(spec, name) is None}
    return json.dumps(spec.model_dump(mode="json", exclude=unset), sort_keys=True, separators=(",", ":"))


def render_jobset(
    spec: WorkloadSpec,
    cluster: str,
    settings: KubeSettings,
    volume: CheckpointVolume | None = None,
    run: Run | None = None,
    failed_runs: tuple[str, ...] = (),
) -> Manifest:
    """The JobSet of a workload: the exact object ``workload create`` applies. ``run``: the
    run it starts (:class:`~hotswap.api.launch.Run`), None for a render without one;
    ``failed_runs``: the workload's earlier runs that ended FAILED (never resumed)."""
    device = get_device_type(spec.device_type)
    if device.local_only:
        raise InvalidInputError(
            f"--device-type {device.name} is a shape of the local backend only (GPUs of this machine);"
            " on Kubernetes use a cloud shape such as h100-80gb-8"
        )
    if spec.script_dir:
        raise InvalidInputError(
            "--script-dir: the kubernetes backend does not build images; put your code in the image"
            " and pass --docker-image"
        )
    hosts = device.hosts_per_slice
    job_labels = {
        labels.MANAGED_BY_LABEL: labels.MANAGED_BY,
        labels.WORKLOAD_LABEL: spec.name,
        labels.CLUSTER_LABEL: cluster,
        labels.PRIORITY_NAME_LABEL: spec.priority.label,
    }
    if settings.kueue:
        job_labels[labels.QUEUE_NAME_LABEL] = settings.local_queue
    annotations = {labels.SPEC_ANNOTATION: spec_annotation(spec)}
    if run is not None:
        job_labels[labels.RUN_ID_LABEL] = run.id
        annotations[labels.RUN_ANNOTATION] = json.dumps(
            {"id": run.id, "resumed_from": resumed_from(run, checkpoint_dir(spec, cluster, volume))},
            sort_keys=True, separators=(",", ":"),
        )
    pod_labels = {labels.WORKLOAD_LABEL: spec.name, labels.CLUSTER_LABEL: cluster}
    pod_annotations: dict[str, str] = {}
    if spec.docker_name:
        pod_annotations[labels.CONTAINER_ANNOTATION] = spec.docker_name
    if volume is not None and volume.kind == "gcsfuse":
        pod_annotations["gke-gcsfuse/volumes"] = "true"  # GKE injects the gcsfuse sidecar
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # podFailurePolicy requires it; JobSet restarts whole Jobs
        "priorityClassName": spec.priority.label,
        "terminationGracePeriodSeconds": math.ceil(spec.termination_grace_period_s),
        "nodeSelector": node_selector(device, settings),
    }
    pod_spec["schedulingGates"] = [{"name": labels.PLACEMENT_GATE}]
    # It may write its replicas' records and nothing else (render/reports.py).
    pod_spec["serviceAccountName"] = worker_service_account(spec.name)
    if device.kind is AcceleratorKind.TPU:
        # Multislice TPU traffic (DCN) goes through the host network, as in xpk and GKE's docs.
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    # GKE taints TPU and GPU nodes (google.com/tpu, nvidia.com/gpu: NoSchedule). Its
    # ExtendedResourceToleration admission adds the toleration to pods requesting the resource;
    # a cluster without it (any other distribution) would schedule nothing there without this.
    pod_spec["tolerations"] = [{"key": device.resource_name, "operator": "Exists", "effect": "NoSchedule"}]
    pod_spec["containers"] = [worker_container(spec, cluster, device, volume, run, failed_runs)]
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
            "annotations": annotations,
        },
        "spec": {
            # Created suspended: it waits in hotswap's queue (or Kueue's) until admitted.
            "suspend": True,
            "failurePolicy": {"maxRestarts": spec.max_restarts, "restartStrategy": spec.restart_strategy.value},
            "replicatedJobs": [
                {
                    "name": contract.REPLICATED_JOB,
                    "replicas": spec.num_slices,
                    "template": {
                        "spec": {
                            "parallelism": hosts,
                            "completions": hosts,
                            "completionMode": "Indexed",
                            "backoffLimit": hosts,  # kubelet rejections only: see the module's docstring
                            "podFailurePolicy": _pod_failure_policy(spec),
                            "template": pod_template,
                        }
                    },
                }
            ],
        },
    }
    if spec.elastic:  # the JAX coordination service of every generation, on no slice's node
        jobset["spec"]["replicatedJobs"].append(coordination.coordinator_job(spec, cluster, settings, membership_volume()))
        jobset["spec"]["failurePolicy"]["rules"] = [dict(coordination.FAILURE_RULE)]
        jobset["spec"]["successPolicy"] = dict(coordination.SUCCESS_POLICY)
    return jobset


# Every disruption and every exit is the controller's to judge (see the module's docstring): the
# Job ignores them, which keeps JobSet's failure policy out of it. The rule order is the Job
# controller's (pkg/controller/job/pod_failure_policy.go, matchPodFailurePolicy: first match).
POD_FAILURE_POLICY: dict[str, Any] = {
    "rules": [
        {"action": "Ignore", "onPodConditions": [{"type": labels.DISRUPTION_TARGET, "status": "True"}]},
        {"action": "Ignore", "onExitCodes": {"containerName": labels.CONTAINER_NAME, "operator": "NotIn", "values": [0]}},
    ]
}


def _pod_failure_policy(spec: WorkloadSpec) -> dict[str, Any]:
    policy = json.loads(json.dumps(POD_FAILURE_POLICY))
    for rule in policy["rules"]:
        if "onExitCodes" in rule:
            rule["onExitCodes"]["containerName"] = container_name(spec)
    return policy
