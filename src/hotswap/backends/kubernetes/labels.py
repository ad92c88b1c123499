"""Every label, annotation, gate and name the Kubernetes backend reads or writes, in one place."""

from __future__ import annotations

# JobSet (kubernetes-sigs/jobset, api/jobset/v1alpha2 and pkg/constants).
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_API_VERSION = f"{JOBSET_GROUP}/{JOBSET_VERSION}"
JOBSET_PLURAL = "jobsets"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_NAME_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"

# Indexed Jobs (batch/v1) and pods.
JOB_COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
# The pod condition of a disruption (preemption, eviction, drain, taint manager, PodGC).
DISRUPTION_TARGET = "DisruptionTarget"

# Kueue.
KUEUE_GROUP = "kueue.x-k8s.io"
# v1beta2: served since Kueue v0.15, its storage version since v0.16, the only one v0.20 serves.
KUEUE_VERSION = "v1beta2"
KUEUE_API_VERSION = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
KUEUE_WORKLOADS = "workloads"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
# xpk's names, so a cluster set up by xpk and one set up by hotswap look the same.
DEFAULT_CLUSTER_QUEUE = "cluster-queue"
DEFAULT_LOCAL_QUEUE = "multislice-queue"

# GKE node labels (defaults of `cluster create --backend kubernetes`; each is configurable).
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
GPU_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
HOSTNAME_LABEL = "kubernetes.io/hostname"

# Node taints that take a node out of service. NotReady/unreachable mean the machine is gone
# (Failed); the others mean it is being drained or maintained (Cordoned). Other NoSchedule taints,
# such as GKE's `google.com/tpu=present`, only restrict who may run there and are ignored.
FAILED_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
CORDON_TAINTS = frozenset(
    {
        "node.kubernetes.io/unschedulable",
        "cloud.google.com/impending-node-termination",
        "ToBeDeletedByClusterAutoscaler",
    }
)

# hotswap's own keys.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "hotswap"
FIELD_MANAGER = "hotswap"
WORKLOAD_LABEL = "hotswap.dev/workload"
CLUSTER_LABEL = "hotswap.dev/cluster"
PRIORITY_NAME_LABEL = "hotswap.dev/priority"
RUN_ID_LABEL = "hotswap.dev/run-id"  # the run (one `workload create`); also in the checkpoint path
RUN_ANNOTATION = "hotswap.dev/run"  # the run as JSON: id and what it resumes from
SPEC_ANNOTATION = "hotswap.dev/spec"  # the WorkloadSpec as JSON: the controller rebuilds it from here
STATE_ANNOTATION = "hotswap.dev/state"  # the core's record of the workload, written by the controller
REJECTED_ANNOTATION = "hotswap.dev/rejected"  # why the core refused the workload
SLICE_ANNOTATION = "hotswap.dev/slice"  # on a pod: the slice the controller placed it on
MEMBERSHIP_ANNOTATION = "hotswap.dev/membership"  # on a pod: the elastic membership record (JSON)
# On a JobSet: when its JAX coordination service's pod was last lost (ISO 8601 UTC), kept after
# that pod is gone so that the workers' exits it caused are still told from theirs.
SERVICE_LOST_ANNOTATION = "hotswap.dev/service-lost-at"
# On a JobSet: how many losses of that service in a row the one at service-lost-at ends (the
# controller keeps no state of its own: a restarted one counts on from here; pod_signals.py).
SERVICE_LOSSES_IN_A_ROW_ANNOTATION = "hotswap.dev/service-losses-in-a-row"
ATTEMPT_ANNOTATION = "hotswap.dev/attempt"  # on a pod: the worker generation it belongs to
RESTART_COUNT_ANNOTATION = "hotswap.dev/restart-count"  # on a pod: HOTSWAP_RESTART_COUNT of its worker
TOUCHED_ANNOTATION = "hotswap.dev/touched"  # on a Job (no pods) or a JobSet (a replica without a Job): when the controller touched it
START_CAUSE_ANNOTATION = "hotswap.dev/start-cause"  # on a pod: HOTSWAP_START_CAUSE of its worker
# On a pod: when the controller removed its gate (ISO 8601 UTC). "Not scheduled for N s" counts
# from here: the API server sets PodScheduled=False (SchedulingGated) when a gated pod is created
# and keeps that lastTransitionTime when the scheduler only changes the reason to Unschedulable.
RELEASED_AT_ANNOTATION = "hotswap.dev/released-at"
# Every pod waits behind this gate until the controller releases it: pinned to the slice the
# core chose for its replica (a gated pod may gain nodeSelector entries: KEP-3838, Kubernetes
# >= 1.30), with the annotations its worker's environment reads (set before it can start).
PLACEMENT_GATE = "hotswap.dev/placement"

CONTAINER_NAME = "worker"  # the workers' container, unless --docker-name names it
CONTAINER_ANNOTATION = "hotswap.dev/container"  # on a pod: its worker container's name
DEFAULT_IMAGE = "python:3.10"  # xpk's default --docker-image
MEMBERSHIP_DIR = "/etc/hotswap"
MEMBERSHIP_FILE = "membership.json"
CHECKPOINT_MOUNT = "/checkpoints"
CONTROLLER_NAME = "hotswap-controller"
FAILED_RUNS_RECORD_PREFIX = "hotswap-failed-runs-"  # + the cluster: its ConfigMap of failed runs (failed_runs.py)
DEFAULT_NAMESPACE = "default"
