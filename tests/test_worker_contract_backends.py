"""The local and the Kubernetes workers of one spec get the same contract values.

Local: the environment the local supervisor starts worker (replica r, host h) with. Kubernetes:
the rendered JobSet's container environment, its downward-API fields resolved from the labels
and annotations JobSet and the Job controller put on pod (r, h), then the container's own
``/bin/sh`` command run with it (the contract's prelude computes RANK and HOTSWAP_ATTEMPT);
the values it exports are read back.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

import pytest

from hotswap.api import worker as contract
from hotswap.api.catalog import get_device_type
from hotswap.api.spec import workload_spec
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.render import render_jobset
from hotswap.backends.kubernetes.settings import KubeSettings
from hotswap.backends.local.workers.environment import worker_environment

CLUSTER = "c"
RESTARTS = 2  # restarts so far: both backends' workers are attempt 3
SLICES = ("c-slice-0", "c-slice-1")  # the slices the replicas run on, in replica order
# The variables both backends set to the same value (MASTER_ADDR legitimately differs:
# 127.0.0.1 locally, the coordinator pod's DNS name on Kubernetes; MASTER_PORT too: locally a
# free port per attempt).
SAME = (
    contract.RANK,
    contract.WORLD_SIZE,
    contract.LOCAL_RANK,
    contract.LOCAL_WORLD_SIZE,
    contract.JOB_INDEX,
    contract.JOB_COMPLETION_INDEX,
    contract.MEGASCALE_SLICE_ID,
    contract.MEGASCALE_NUM_SLICES,
    contract.HOTSWAP_ATTEMPT,
    contract.HOTSWAP_RESTART_COUNT,
    contract.JOBSET_NAME,
    contract.REPLICATED_JOB_NAME,
    contract.HOTSWAP_CLUSTER,
    contract.HOTSWAP_WORKLOAD,
    contract.HOTSWAP_HOSTS_PER_SLICE,
    contract.TPU_WORKER_ID,
)
_FIELD = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")
_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def pod_metadata(jobset: dict[str, Any], replica: int, host: int, slice_name: str) -> dict[str, dict[str, str]]:
    """Pod (replica, host)'s labels and annotations: the template's, JobSet's (jobset
    pkg/controllers/jobset_controller.go, labelAndAnnotateObject: name, replicated job, job index,
    restart attempt), the Indexed Job's completion index, and what the controller writes when
    it releases the pod: the slice it placed it on and the restart count (every restart, the
    controller's and JobSet's)."""
    replicated = jobset["spec"]["replicatedJobs"][0]
    template = replicated["template"]["spec"]["template"]["metadata"]
    pod_labels = {
        **template.get("labels", {}),
        labels.JOBSET_NAME_LABEL: jobset["metadata"]["name"],
        labels.REPLICATED_JOB_NAME_LABEL: replicated["name"],
        labels.JOB_INDEX_LABEL: str(replica),
        labels.RESTART_ATTEMPT_LABEL: str(RESTARTS),
    }
    annotations = {
        **template.get("annotations", {}),
        labels.JOB_COMPLETION_INDEX_ANNOTATION: str(host),
        labels.SLICE_ANNOTATION: slice_name,
        labels.RESTART_COUNT_ANNOTATION: str(RESTARTS),
    }
    return {"labels": pod_labels, "annotations": annotations}


def downward_environment(container: dict[str, Any], metadata: dict[str, dict[str, str]]) -> dict[str, str]:
    """The container's environment as the kubelet resolves it (a missing label reads as "")."""
    env = {}
    for item in container["env"]:
        if "value" in item:  # $(NAME) of a variable defined before it is expanded by the kubelet
            env[item["name"]] = _REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), item["value"])
            continue
        match = _FIELD.fullmatch(item["valueFrom"]["fieldRef"]["fieldPath"])
        assert match is not None, item
        kind, key = match.groups()
        env[item["name"]] = metadata[kind].get(key, "")
    return env


def kubernetes_worker(jobset: dict[str, Any], replica: int, host: int) -> dict[str, str]:
    """What the worker process of pod (replica, host) sees: the container's command (the
    probe spec's command prints its environment) run with the pod's environment."""
    container = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    env = downward_environment(container, pod_metadata(jobset, replica, host, SLICES[replica]))
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")  # the image's
    printed = subprocess.run(container["command"], env=env, capture_output=True, text=True, check=True).stdout
    return dict(line.partition("=")[::2] for line in printed.splitlines())


def local_worker(spec_name: str, num_slices: int, hosts: int, replica: int, host: int, tpu: bool = True) -> dict[str, str]:
    return worker_environment(
        base={},
        user={},
        cluster=CLUSTER,
        workload=spec_name,
        slices=SLICES,
        num_slices=num_slices,
        replica=replica,
        host=host,
        hosts_per_slice=hosts,
        attempt=RESTARTS + 1,
        master_port=contract.DEFAULT_MASTER_PORT,
        checkpoint_dir="/checkpoints",
        events_file=None,
        grace_s=contract.DEFAULT_GRACE_PERIOD_S,
        membership_file=None,
        tpu=tpu,
    )


@pytest.mark.parametrize("command", ["env", "cd / && env"], ids=["exec", "shell"])
def test_local_and_kubernetes_workers_get_the_same_contract_values(command: str) -> None:
    spec = workload_spec(name="train", command=command, device_type="v5litepod-16", num_slices=len(SLICES))
    hosts = get_device_type(spec.device_type).hosts_per_slice
    assert hosts > 1
    jobset = render_jobset(spec, CLUSTER, KubeSettings())
    ranks = []
    for replica in range(spec.num_slices):
        for host in range(hosts):
            local = local_worker(spec.name, spec.num_slices, hosts, replica, host)
            kube = kubernetes_worker(jobset, replica, host)
            assert {k: kube.get(k) for k in SAME} == {k: local.get(k) for k in SAME}, (replica, host)
            assert kube[contract.MASTER_ADDR] == contract.coordinator_host(spec.name)
            # GKE's TPU worker variables: the host's index, and the slice's hosts (their pods'
            # DNS names on Kubernetes, this machine locally).
            assert kube[contract.TPU_WORKER_ID] == str(host)
            assert kube[contract.TPU_WORKER_HOSTNAMES].split(",") == [
                f"train-slice-{replica}-{h}.train" for h in range(hosts)
            ]
            assert local[contract.TPU_WORKER_HOSTNAMES].split(",") == ["127.0.0.1"] * hosts
            ranks.append(int(kube[contract.RANK]))
    assert ranks == list(range(contract.world_size(spec.num_slices, hosts)))


def test_gpu_workers_get_no_tpu_variables() -> None:
    spec = workload_spec(name="train", command="env", device_type="h100-80gb-8", num_slices=len(SLICES))
    jobset = render_jobset(spec, CLUSTER, KubeSettings())
    kube = kubernetes_worker(jobset, 1, 0)
    local = local_worker(spec.name, spec.num_slices, 1, 1, 0, tpu=False)
    for env in (kube, local):
        assert contract.TPU_WORKER_ID not in env and contract.TPU_WORKER_HOSTNAMES not in env
        assert env[contract.LOCAL_WORLD_SIZE] == "1" and env[contract.LOCAL_RANK] == "0"
