"""A small stand-in for a Kubernetes cluster running JobSet, for the controller's tests.

It holds objects as the API server returns them (dicts) and plays, step by step, the parts of
the cluster the controller relies on: the JobSet controller (child Jobs per replica, suspend,
recreation of deleted Jobs), the Job controller (Indexed pods, deletion of suspended pods), the
JobSet pod webhook (exclusive placement: followers follow their leader's node pool, pods get the
priority label), the garbage collector, and kube-scheduler (gates, node selectors, one pod per
TPU host). It also answers the calls :class:`hotswap.runtime.kube_controller.KubeController`
makes, so tests run the real controller against it. Not a Kubernetes: just enough of one to
check decisions against objects shaped like real ones.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import yaml

from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.settings import KubeSettings

FIXTURES = Path(__file__).resolve().parent
PRIORITY_VALUES = {"very-low": 100, "low": 250, "medium": 500, "high": 750, "very-high": 1000}


def load_nodes(name: str = "gke_v6e16_nodes.yaml") -> list[dict[str, Any]]:
    return yaml.safe_load((FIXTURES / name).read_text())["items"]


def merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def set_ready(node: dict[str, Any], ready: bool) -> None:
    for condition in node["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition["status"] = "True" if ready else "Unknown"
            condition["reason"] = "KubeletReady" if ready else "NodeStatusUnknown"
    taints = [t for t in node["spec"].get("taints", []) if not t["key"].startswith("node.kubernetes.io/unreachable")]
    if not ready:
        taints.append({"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"})
    node["spec"]["taints"] = taints


class World:
    def __init__(self, nodes: list[dict[str, Any]], settings: KubeSettings | None = None) -> None:
        self.settings = settings or KubeSettings()
        self.namespace = self.settings.namespace
        self.nodes = {n["metadata"]["name"]: copy.deepcopy(n) for n in nodes}
        self.jobsets: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[str, str, str]] = []
        self.calls: list[tuple[str, str]] = []
        self._uids = itertools.count(1)
        self._suffixes = itertools.count(1)
        self.clock = 1_767_600_000.0

    # ------------------------------------------------------------------ the client's interface

    host = "https://fake"

    def list_nodes(self) -> list[dict[str, Any]]:
        return copy.deepcopy(list(self.nodes.values()))

    def list_jobsets(self, cluster: str) -> list[dict[str, Any]]:
        return copy.deepcopy([j for j in self.jobsets.values() if j["metadata"]["labels"].get(labels.CLUSTER_LABEL) == cluster])

    def list_jobs(self, jobset: str | None = None) -> list[dict[str, Any]]:
        return copy.deepcopy([j for j in self.jobs.values() if jobset is None or j["metadata"]["labels"][labels.JOBSET_NAME_LABEL] == jobset])

    def list_pods(self, selector: str) -> list[dict[str, Any]]:
        return copy.deepcopy(list(self.pods.values()))

    def patch_jobset(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch_jobset", name))
        return merge_patch(self.jobsets[name], patch)

    def delete_jobs(self, jobset: str, replicas: tuple[int, ...] | None) -> list[str]:
        self.calls.append(("delete_jobs", jobset))
        deleted = []
        for name, job in list(self.jobs.items()):
            job_labels = job["metadata"]["labels"]
            if job_labels[labels.JOBSET_NAME_LABEL] != jobset:
                continue
            if replicas is not None and int(job_labels[labels.JOB_INDEX_LABEL]) not in replicas:
                continue
            del self.jobs[name]  # background propagation: the Job goes now, the GC takes its pods
            for pod in self.pods.values():
                if pod["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]:
                    pod["metadata"].setdefault("deletionTimestamp", "2026-01-06T10:00:00Z")
            deleted.append(name)
        return deleted

    def force_delete_pod(self, name: str) -> None:
        self.calls.append(("force_delete_pod", name))
        self.pods.pop(name, None)

    def patch_pod(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch_pod", name))
        pod = self.pods[name]
        spec_patch = patch.get("spec", {})
        if "nodeSelector" in spec_patch:
            # A gated pod may only gain node selector entries (KEP-3838).
            assert pod["spec"].get("schedulingGates"), "nodeSelector changed on an ungated pod"
            for key in spec_patch["nodeSelector"]:
                assert key not in pod["spec"].get("nodeSelector", {}), f"nodeSelector {key} overwritten"
        if "schedulingGates" in spec_patch and spec_patch["schedulingGates"]:
            before = {g["name"] for g in pod["spec"].get("schedulingGates", [])}
            assert {g["name"] for g in spec_patch["schedulingGates"]} <= before, "a gate was added"
        return merge_patch(pod, patch)

    def record_event(self, jobset: Any, name: str, reason: str, message: str, warning: bool, now: float) -> None:
        self.events.append((name, reason, message))

    lease: dict[str, Any] | None = None

    def get_lease(self, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.lease)

    def create_lease(self, body: dict[str, Any]) -> dict[str, Any]:
        self.lease = copy.deepcopy(body)
        return body

    def replace_lease(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.lease = copy.deepcopy(body)
        return body

    def watch(self, kind: str, cluster: str, changed: Any, stop: Any, timeout_s: int = 300) -> None:
        stop.wait()  # changes are announced by the test through `changed`

    # ------------------------------------------------------------------ what users and nodes do

    def apply(self, manifest: dict[str, Any]) -> None:
        obj = copy.deepcopy(manifest)
        obj["metadata"]["uid"] = f"js-{next(self._uids)}"
        obj["metadata"]["creationTimestamp"] = f"2026-01-06T09:{len(self.jobsets):02d}:00Z"
        obj["status"] = {"restarts": 0, "restartsCountTowardsMax": 0}
        self.jobsets[obj["metadata"]["name"]] = obj

    def node_of_pool(self, pool: str, index: int = 0) -> str:
        return sorted(n for n, o in self.nodes.items() if o["metadata"]["labels"].get(self.settings.node_pool_label) == pool)[index]

    def pools_of(self, jobset: str) -> list[str | None]:
        """The node pool each replica's pods run on (None: not placed), by job index."""
        placed: dict[int, set[str]] = {}
        for pod in self.live_pods(jobset):
            index = int(pod["metadata"]["labels"][labels.JOB_INDEX_LABEL])
            node = pod["spec"].get("nodeName")
            if node:
                placed.setdefault(index, set()).add(self.nodes[node]["metadata"]["labels"][self.settings.node_pool_label])
        replicas = self.jobsets[jobset]["spec"]["replicatedJobs"][0]["replicas"]
        result: list[str | None] = []
        for index in range(replicas):
            pools = placed.get(index, set())
            assert len(pools) <= 1, f"replica {index} of {jobset} spans pools {pools}"
            result.append(next(iter(pools)) if pools else None)
        return result

    def live_pods(self, jobset: str) -> list[dict[str, Any]]:
        return [
            p for p in self.pods.values()
            if p["metadata"]["labels"][labels.JOBSET_NAME_LABEL] == jobset and "deletionTimestamp" not in p["metadata"]
        ]

    def state(self, jobset: str) -> dict[str, Any]:
        import json

        return json.loads(self.jobsets[jobset]["metadata"]["annotations"][labels.STATE_ANNOTATION])

    # ------------------------------------------------------------------ the cluster's controllers

    def step(self, finish_terminations: bool = True) -> None:
        """One pass of JobSet, Job, pod webhook, GC and scheduler."""
        for name, pod in list(self.pods.items()):
            if pod["spec"].get("nodeName") and pod["spec"]["nodeName"] not in self.nodes:
                del self.pods[name]  # PodGC: the pod's Node object is gone
        for jobset in self.jobsets.values():
            self._jobset_controller(jobset)
        if finish_terminations:
            self.finish_terminations()
        self._schedule()

    def settle(self, rounds: int = 6, finish_terminations: bool = True) -> None:
        for _ in range(rounds):
            self.step(finish_terminations)

    def finish_terminations(self) -> None:
        """Terminating pods on live machines exit (their grace period is over); pods on a machine
        that is gone stay Terminating until someone force-deletes them."""
        for name, pod in list(self.pods.items()):
            if "deletionTimestamp" not in pod["metadata"]:
                continue
            node = pod["spec"].get("nodeName")
            if node is None or node not in self.nodes or self._ready(self.nodes[node]):
                del self.pods[name]

    def _jobset_controller(self, jobset: dict[str, Any]) -> None:
        name = jobset["metadata"]["name"]
        rjob = jobset["spec"]["replicatedJobs"][0]
        suspended = bool(jobset["spec"].get("suspend"))
        for index in range(rjob["replicas"]):
            job_name = f"{name}-{rjob['name']}-{index}"
            job = self.jobs.get(job_name)
            if job is None:
                job = {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        "name": job_name,
                        "namespace": self.namespace,
                        "uid": f"job-{next(self._uids)}",
                        "labels": {
                            labels.JOBSET_NAME_LABEL: name,
                            labels.REPLICATED_JOB_NAME_LABEL: rjob["name"],
                            labels.JOB_INDEX_LABEL: str(index),
                            labels.RESTART_ATTEMPT_LABEL: str(jobset["status"]["restarts"]),
                        },
                    },
                    "spec": copy.deepcopy(rjob["template"]["spec"]),
                }
                self.jobs[job_name] = job
            job["spec"]["suspend"] = suspended
            if suspended:
                for pod in self.pods.values():
                    if pod["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]:
                        pod["metadata"].setdefault("deletionTimestamp", "2026-01-06T10:00:00Z")
                continue
            self._job_controller(jobset, job, index)

    def _job_controller(self, jobset: dict[str, Any], job: dict[str, Any], index: int) -> None:
        uid = job["metadata"]["uid"]
        mine = [p for p in self.pods.values() if p["metadata"]["ownerReferences"][0]["uid"] == uid]
        # podReplacementPolicy Failed (implied by podFailurePolicy): no replacement while one terminates.
        if any("deletionTimestamp" in p["metadata"] for p in mine):
            return
        have = {int(p["metadata"]["annotations"][labels.JOB_COMPLETION_INDEX_ANNOTATION]) for p in mine}
        template = job["spec"]["template"]
        topology_key = jobset["metadata"]["annotations"][labels.EXCLUSIVE_TOPOLOGY_ANNOTATION]
        leader = next((p for p in mine if p["metadata"]["annotations"][labels.JOB_COMPLETION_INDEX_ANNOTATION] == "0"), None)
        for host in range(job["spec"]["completions"]):
            if host in have:
                continue
            node_selector = dict(template["spec"].get("nodeSelector", {}))
            if host > 0:
                # JobSet's pod webhook admits followers only once the leader is scheduled, and
                # pins them to the leader's topology domain.
                if leader is None or not leader["spec"].get("nodeName"):
                    continue
                leader_node = self.nodes[leader["spec"]["nodeName"]]
                node_selector[topology_key] = leader_node["metadata"]["labels"][topology_key]
            pod_name = f"{job['metadata']['name']}-{host}-{next(self._suffixes):05d}"
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod_name,
                    "namespace": self.namespace,
                    "uid": f"pod-{next(self._uids)}",
                    "labels": {
                        **template["metadata"].get("labels", {}),
                        **job["metadata"]["labels"],
                        labels.JOB_NAME_LABEL: job["metadata"]["name"],
                        labels.PRIORITY_LABEL: str(PRIORITY_VALUES[template["spec"]["priorityClassName"]]),
                    },
                    "annotations": {
                        **template["metadata"].get("annotations", {}),
                        labels.JOB_COMPLETION_INDEX_ANNOTATION: str(host),
                        labels.EXCLUSIVE_TOPOLOGY_ANNOTATION: topology_key,
                        labels.JOBSET_NAME_LABEL: jobset["metadata"]["name"],
                    },
                    "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"], "uid": uid, "controller": True}],
                },
                "spec": {**copy.deepcopy(template["spec"]), "nodeSelector": node_selector},
                "status": {"phase": "Pending"},
            }
            self.pods[pod_name] = pod
            if host == 0:
                leader = pod

    @staticmethod
    def _ready(node: dict[str, Any]) -> bool:
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        return ready["status"] == "True"

    def _schedulable(self, node: dict[str, Any]) -> bool:
        taints = {t["key"] for t in node["spec"].get("taints", [])}
        return self._ready(node) and not node["spec"].get("unschedulable") and not taints & labels.FAILED_TAINTS

    def _schedule(self) -> None:
        occupied = {p["spec"].get("nodeName") for p in self.pods.values() if p["spec"].get("nodeName")}
        for pod in sorted(self.pods.values(), key=lambda p: p["metadata"]["name"]):
            spec = pod["spec"]
            if spec.get("nodeName") or spec.get("schedulingGates") or "deletionTimestamp" in pod["metadata"]:
                continue
            for name in sorted(self.nodes):
                node = self.nodes[name]
                node_labels = node["metadata"]["labels"]
                if name in occupied or not self._schedulable(node):
                    continue
                if any(node_labels.get(k) != v for k, v in spec.get("nodeSelector", {}).items()):
                    continue
                if not self._exclusive_ok(pod, node):
                    continue
                spec["nodeName"] = name
                pod["status"]["phase"] = "Running"
                occupied.add(name)
                break

    def _exclusive_ok(self, pod: dict[str, Any], node: dict[str, Any]) -> bool:
        """JobSet's anti-affinity: no pod of another Job of the same priority in the domain."""
        key = pod["metadata"]["annotations"][labels.EXCLUSIVE_TOPOLOGY_ANNOTATION]
        domain = node["metadata"]["labels"].get(key)
        for other in self.pods.values():
            other_node = other["spec"].get("nodeName")
            if not other_node or self.nodes[other_node]["metadata"]["labels"].get(key) != domain:
                continue
            same_job = other["metadata"]["labels"][labels.JOB_NAME_LABEL] == pod["metadata"]["labels"][labels.JOB_NAME_LABEL]
            same_priority = other["metadata"]["labels"][labels.PRIORITY_LABEL] == pod["metadata"]["labels"][labels.PRIORITY_LABEL]
            if not same_job and same_priority:
                return False
        return True
