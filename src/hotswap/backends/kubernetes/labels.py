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
# JobSet >= v0.7 scopes exclusive placement to pods of the same priority: its pod webhook labels
# every pod with its priority and adds `priority In [own]` to the anti-affinity term
# (kubernetes-sigs/jobset#682, #1057), so a higher-priority job can preempt a lower one's slice.
PRIORITY_LABEL = "jobset.sigs.k8s.io/priority"
EXCLUSIVE_TOPOLOGY_ANNOTATION = "alpha.jobset.sigs.k8s.io/exclusive-topology"

# Indexed Jobs (batch/v1).
JOB_COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"

# Kueue.
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta1"
KUEUE_API_VERSION = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
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
SPEC_ANNOTATION = "hotswap.dev/spec"  # the WorkloadSpec as JSON: the controller rebuilds it from here
STATE_ANNOTATION = "hotswap.dev/state"  # the core's record of the workload, written by the controller
REJECTED_ANNOTATION = "hotswap.dev/rejected"  # why the core refused the workload
SLICE_ANNOTATION = "hotswap.dev/slice"  # on a pod: the slice the controller placed it on
MEMBERSHIP_ANNOTATION = "hotswap.dev/membership"  # on a pod: the elastic membership record (JSON)
# New pods wait behind this gate until the controller pins them to the slice the core chose
# for their replica (Kubernetes >= 1.30 lets a gated pod gain nodeSelector entries).
PLACEMENT_GATE = "hotswap.dev/placement"

CONTAINER_NAME = "worker"
DEFAULT_IMAGE = "python:3.10"  # xpk's default --docker-image
MEMBERSHIP_DIR = "/etc/hotswap"
MEMBERSHIP_FILE = "membership.json"
CHECKPOINT_MOUNT = "/checkpoints"
CONTROLLER_NAME = "hotswap-controller"
DEFAULT_NAMESPACE = "default"
