"""Kueue v0.19 in the world (kubernetes-sigs/kueue), for JobSets: a Workload per JobSet, quota
admission by priority then age, preemption within the ClusterQueue, and the suspension and
resumption of the JobSet that follow. No cohorts, admission checks, TAS or fair sharing.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from k8s_fixtures.world.admission import QUEUE_NAME
from k8s_fixtures.world.jobset_controller import _set_condition, condition
from k8s_fixtures.world.scheduler import requests
from k8s_fixtures.world.store import (
    CLUSTER_QUEUES,
    JOBSETS,
    KUEUE_WORKLOADS,
    LOCAL_QUEUES,
    PRIORITY_CLASSES,
    RESOURCE_FLAVORS,
    Clock,
    Obj,
    Store,
)


def workload_name(jobset: Obj) -> str:
    """jobframework ``GetWorkloadNameForOwnerWithGVK``: ``jobset-<name>-<hash>``."""
    digest = hashlib.sha1(f"{jobset['metadata']['name']}/{jobset['metadata']['uid']}".encode()).hexdigest()[:5]
    return f"jobset-{jobset['metadata']['name']}-{digest}"


def _true(obj: Obj, type_: str) -> bool:
    return condition(obj, type_) is not None


class Kueue:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def step(self) -> None:
        for jobset in list(self.store.items(JOBSETS)):
            if QUEUE_NAME in (jobset["metadata"].get("labels") or {}) and "deletionTimestamp" not in jobset["metadata"]:
                self._reconcile_job(jobset)
        for workload in list(self.store.items(KUEUE_WORKLOADS)):
            self._workload_controller(workload)
        self._schedule()

    # ------------------------------------------------------------------ jobframework/reconciler.go

    def _reconcile_job(self, js: Obj) -> None:
        """``ReconcileGenericJob``: ensure the Workload; finished -> Finished; evicted -> stop
        the job, then release its quota once the job is no longer active; an admitted
        suspended job starts; an unsuspended job that is not admitted is stopped."""
        workload = self._ensure_workload(js)
        if _true(js, "Completed") or _true(js, "Failed"):
            if not _true(workload, "Finished"):
                message = (condition(js, "Completed") or condition(js, "Failed") or {}).get("message", "")
                _set_condition(workload, "Finished", "True", "Succeeded" if _true(js, "Completed") else "Failed", message, self.clock)
                self.store.write(KUEUE_WORKLOADS, workload)
            return
        if _true(workload, "Evicted"):
            self._stop(js, workload)
            if _true(workload, "QuotaReserved") and not _active(js):
                evicted = condition(workload, "Evicted") or {}
                requeue = evicted.get("reason") == "Preempted"
                _set_condition(workload, "Requeued", "True" if requeue else "False", evicted.get("reason", ""), evicted.get("message", ""), self.clock)
                _set_condition(workload, "QuotaReserved", "False", "Pending", evicted.get("message", ""), self.clock)
                _set_condition(workload, "Admitted", "False", "NoReservation", "The workload has no reservation", self.clock)
                workload["status"].pop("admission", None)
                self.store.write(KUEUE_WORKLOADS, workload)
            return
        suspended = bool(js["spec"].get("suspend"))
        if suspended and _true(workload, "Admitted"):
            self._start(js, workload)
        elif not suspended and not _true(workload, "Admitted"):
            self._stop(js, workload)

    def _ensure_workload(self, js: Obj) -> Obj:
        """``ensureOneWorkload`` / ``ConstructWorkload``: one pod set per replicated job, counted
        replicas x parallelism (jobset_controller.go ``PodSets``), priority from the pod
        template's PriorityClass (``ExtractPriority``)."""
        namespace = js["metadata"]["namespace"]
        name = workload_name(js)
        found = self.store.peek(KUEUE_WORKLOADS, namespace, name)
        if found is not None:
            return found
        template = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
        class_name = template["spec"].get("priorityClassName")
        pclass = self.store.peek(PRIORITY_CLASSES, "", class_name) if class_name else None
        workload = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": js["metadata"]["name"],
                                     "uid": js["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": {
                "active": True,
                "queueName": js["metadata"]["labels"][QUEUE_NAME],
                "priority": int(pclass["value"]) if pclass else 0,
                **({"priorityClassRef": {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": class_name}} if pclass else {}),
                "podSets": [
                    {"name": r["name"], "count": r["replicas"] * min(r["template"]["spec"].get("parallelism", 1), r["template"]["spec"].get("completions", 1)),
                     "template": copy.deepcopy(r["template"]["spec"]["template"])}
                    for r in js["spec"]["replicatedJobs"]
                ],
            },
            "status": {"conditions": []},
        }
        return self.store.peek(KUEUE_WORKLOADS, namespace, self.store.create(KUEUE_WORKLOADS, workload)["metadata"]["name"])  # type: ignore[return-value]

    def _start(self, js: Obj, workload: Obj) -> None:
        """``startJob`` -> JobSet ``RunWithPodSetsInfo``: the flavor's node labels join each pod
        template's node selector, and the JobSet is unsuspended."""
        flavors = {a["name"]: a["flavors"] for a in workload["status"]["admission"]["podSetAssignments"]}
        for rjob in js["spec"]["replicatedJobs"]:
            spec = rjob["template"]["spec"]["template"]["spec"]
            for flavor_name in sorted(set(flavors.get(rjob["name"], {}).values())):
                flavor = self.store.peek(RESOURCE_FLAVORS, "", flavor_name) or {}
                spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **((flavor.get("spec") or {}).get("nodeLabels") or {})}
        js["spec"]["suspend"] = False
        self.store.write(JOBSETS, js)

    def _stop(self, js: Obj, workload: Obj) -> None:
        """``stopJob``: suspend the JobSet and restore its pod templates as the Workload has them
        (``RestorePodSetsInfo``)."""
        if js["spec"].get("suspend"):
            return
        originals = {p["name"]: p["template"] for p in workload["spec"]["podSets"]}
        for rjob in js["spec"]["replicatedJobs"]:
            original = originals.get(rjob["name"])
            if original is not None:
                rjob["template"]["spec"]["template"]["spec"]["nodeSelector"] = copy.deepcopy(original["spec"].get("nodeSelector") or {})
        js["spec"]["suspend"] = True
        self.store.write(JOBSETS, js)

    # ------------------------------------------------------------------ core/workload_controller.go

    def _workload_controller(self, workload: Obj) -> None:
        """An inactive workload is evicted with reason Deactivated and not requeued."""
        if workload["spec"].get("active", True) is False and not _true(workload, "Evicted"):
            _set_condition(workload, "Evicted", "True", "Deactivated", "The workload is deactivated", self.clock)
            self.store.write(KUEUE_WORKLOADS, workload)

    # ------------------------------------------------------------------ scheduler

    def _schedule(self) -> None:
        """scheduler.go ``schedule`` per ClusterQueue: pending workloads by priority then
        creation (cluster_queue.go ``queueOrderingFunc``, BestEffortFIFO), each admitted on the
        first flavor with quota (flavorassigner.go), else preempting lower priority within the
        ClusterQueue (preemption.go ``GetTargets``)."""
        for cq in self.store.items(CLUSTER_QUEUES):
            queues = {(lq["metadata"]["namespace"], lq["metadata"]["name"]) for lq in self.store.items(LOCAL_QUEUES) if lq["spec"].get("clusterQueue") == cq["metadata"]["name"]}
            mine = [w for w in self.store.items(KUEUE_WORKLOADS) if (w["metadata"]["namespace"], w["spec"].get("queueName")) in queues]
            pending = [w for w in mine if w["spec"].get("active", True) and not _true(w, "QuotaReserved") and not _true(w, "Finished")]
            pending.sort(key=lambda w: (-w["spec"].get("priority", 0), w["metadata"]["creationTimestamp"], w["metadata"]["name"]))
            for workload in pending:
                admitted = [w for w in mine if _true(w, "QuotaReserved") and not _true(w, "Finished")]
                assignment = self._assign(cq, workload, _usage(admitted))
                if assignment is not None:
                    self._admit(cq, workload, assignment)
                elif (cq["spec"].get("preemption") or {}).get("withinClusterQueue") == "LowerPriority":
                    self._preempt(cq, workload, admitted)

    def _assign(self, cq: Obj, workload: Obj, usage: dict[tuple[str, str], float]) -> list[dict[str, Any]] | None:
        assignments = []
        for pod_set in workload["spec"]["podSets"]:
            per_pod = {k: v for k, v in requests({"spec": pod_set["template"]["spec"]}).items() if k != "pods"}
            selector = pod_set["template"]["spec"].get("nodeSelector") or {}
            covered = {r for group in cq["spec"].get("resourceGroups") or [] for r in group["coveredResources"]}
            if any(k not in covered for k in per_pod):
                return None  # flavorassigner.go ``findFlavorForPodSetResource``: "resource X unavailable in ClusterQueue"
            chosen: dict[str, str] = {}
            for group in cq["spec"].get("resourceGroups") or []:
                wanted = {k: v * pod_set["count"] for k, v in per_pod.items() if k in group["coveredResources"]}
                if not wanted:
                    continue
                for flavor in group["flavors"]:
                    labels = ((self.store.peek(RESOURCE_FLAVORS, "", flavor["name"]) or {}).get("spec") or {}).get("nodeLabels") or {}
                    if any(selector.get(k, v) != v for k, v in labels.items()):
                        continue  # the pods' node selector rules this flavor out
                    quota = {r["name"]: float(r["nominalQuota"]) for r in flavor["resources"]}
                    if all(usage.get((flavor["name"], k), 0.0) + v <= quota.get(k, 0.0) for k, v in wanted.items()):
                        chosen.update({k: flavor["name"] for k in wanted})
                        break
                else:
                    return None
            # A pod set requesting nothing fits with no flavor: flavors are found per requested
            # resource (flavorassigner.go, ``assignFlavors``), and it requests none.
            assignments.append({"name": pod_set["name"], "flavors": chosen, "count": pod_set["count"],
                                "resourceUsage": {k: str(int(v * pod_set["count"])) for k, v in per_pod.items()}})
        return assignments

    def _admit(self, cq: Obj, workload: Obj, assignment: list[dict[str, Any]]) -> None:
        workload["status"]["admission"] = {"clusterQueue": cq["metadata"]["name"], "podSetAssignments": assignment}
        message = f"Quota reserved in ClusterQueue {cq['metadata']['name']}"
        _set_condition(workload, "QuotaReserved", "True", "QuotaReserved", message, self.clock)
        _set_condition(workload, "Admitted", "True", "Admitted", "The workload is admitted", self.clock)
        if _true(workload, "Evicted"):
            _set_condition(workload, "Evicted", "False", "QuotaReserved", "Previously: evicted", self.clock)
            _set_condition(workload, "Preempted", "False", "QuotaReserved", "Previously: preempted", self.clock)
        self.store.write(KUEUE_WORKLOADS, workload)

    def _preempt(self, cq: Obj, preemptor: Obj, admitted: list[Obj]) -> None:
        """preemption.go ``GetTargets`` -> ``minimalPreemptions``: candidates of lower priority
        ordered by common/ordering.go ``CandidatesOrdering`` (already evicted first, then lower
        priority, then most recently admitted); take them until the preemptor fits, then
        ``fillBackWorkloads`` puts back those it does not need."""
        mine = preemptor["spec"].get("priority", 0)
        candidates = [w for w in admitted if w["spec"].get("priority", 0) < mine]
        candidates.sort(key=lambda w: (not _true(w, "Evicted"), w["spec"].get("priority", 0),
                                       -_time((condition(w, "QuotaReserved") or {}).get("lastTransitionTime"))))
        removed: list[Obj] = []
        for candidate in candidates:
            removed.append(candidate)
            rest = [w for w in admitted if w not in removed]
            if self._assign(cq, preemptor, _usage(rest)) is not None:
                break
        else:
            return
        for candidate in list(reversed(removed[:-1])):
            trial = [w for w in removed if w is not candidate]
            if self._assign(cq, preemptor, _usage([w for w in admitted if w not in trial])) is not None:
                removed = trial
        for victim in removed:
            if _true(victim, "Evicted"):
                continue
            message = (f"Preempted to accommodate a workload (UID: {preemptor['metadata']['uid']}) due to prioritization"
                       " in the ClusterQueue")
            _set_condition(victim, "Evicted", "True", "Preempted", message, self.clock)
            _set_condition(victim, "Preempted", "True", "InClusterQueue", message, self.clock)
            self.store.write(KUEUE_WORKLOADS, victim)


def _active(js: Obj) -> bool:
    """JobSet ``IsActive``: a replicated job has an active Job."""
    return any(s.get("active", 0) > 0 for s in (js.get("status") or {}).get("replicatedJobsStatus") or [])


def _usage(admitted: list[Obj]) -> dict[tuple[str, str], float]:
    usage: dict[tuple[str, str], float] = {}
    for workload in admitted:
        for assignment in workload["status"]["admission"]["podSetAssignments"]:
            for resource, amount in assignment["resourceUsage"].items():
                flavor = assignment["flavors"].get(resource)
                if flavor is not None:
                    usage[(flavor, resource)] = usage.get((flavor, resource), 0.0) + float(amount)
    return usage


def _time(text: str | None) -> float:
    from k8s_fixtures.world.store import parse_time

    return parse_time(text) or 0.0
