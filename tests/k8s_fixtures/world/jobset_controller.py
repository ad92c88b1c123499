"""The JobSet controller of JobSet v0.12.0 (kubernetes-sigs/jobset ``pkg/controllers``), as far
as hotswap's JobSets reach it: child Jobs, restarts, the failure and success policies, suspend
and resume. Feature gates at their v0.12 defaults (RestartJob, ElasticJobSet, InPlaceRestart
off).

Its work queue is controller-runtime's: a reconcile that fails (a Job creation refused, as by
an admission webhook that times out) is retried after the per-item exponential backoff of
client-go's ``DefaultTypedControllerRateLimiter`` (5 ms doubling up to 1000 s), and any event
on the JobSet (``For(&JobSet{})`` with no predicate, jobset_controller.go ``SetupWithManager``)
puts it back at once (workqueue ``Add``), backoff or not.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

from k8s_fixtures.world.admission import EXCLUSIVE_KEY, JOB_INDEX, JOB_KEY, JOBSET_NAME, NODE_SELECTOR_STRATEGY, REPLICATED_JOB, job_key
from k8s_fixtures.world.store import JOBS, JOBSETS, Clock, Obj, Store

RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
REPLICAS_KEY = "jobset.sigs.k8s.io/replicatedjob-replicas"
GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"
ACTIONS = ("FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts")
BASE_BACKOFF_S, MAX_BACKOFF_S = 0.005, 1000.0  # workqueue.DefaultTypedItemBasedRateLimiter


@dataclasses.dataclass
class _Backoff:
    """A JobSet whose last reconcile failed: retried at ``retry_at`` or on its next event."""

    failures: int
    retry_at: float
    seen: tuple[Any, ...]  # the JobSet's and its Jobs' resourceVersions then: a change is an event


def condition(obj: Obj, type_: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == type_ and c.get("status") == "True"), None)


def job_finished(job: Obj) -> str | None:
    """jobset_controller.go, ``JobFinished``: "Complete", "Failed" or None."""
    for type_ in ("Complete", "Failed"):
        if condition(job, type_) is not None:
            return type_
    return None


class JobSetController:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.events: list[tuple[str, str, str]] = []  # (jobset, reason, message) it recorded
        self.refused_creates: set[str] = set()  # JobSets whose Job creations are refused (a webhook down)
        self.backoff: dict[str, _Backoff] = {}  # JobSet name -> its failed reconcile's backoff

    def reconcile_all(self) -> None:
        for jobset in list(self.store.items(JOBSETS)):
            if "deletionTimestamp" not in jobset["metadata"] and self._queued(jobset):
                self.reconcile(jobset)

    def _queued(self, js: Obj) -> bool:
        """Whether the work queue hands this JobSet out now: no failure to back off from, the
        backoff over, or an event on the JobSet or one of its Jobs since (``Owns(&Job{})``)."""
        backoff = self.backoff.get(js["metadata"]["name"])
        return backoff is None or self.clock.now >= backoff.retry_at or self._versions(js) != backoff.seen

    def _versions(self, js: Obj) -> tuple[Any, ...]:
        uid = js["metadata"]["uid"]
        jobs = sorted(
            (job["metadata"]["uid"], job["metadata"].get("resourceVersion")) for job in self.store.owned_by(JOBS, uid)
            if job["metadata"].get("namespace") == js["metadata"]["namespace"] and any(o.get("uid") == uid for o in job["metadata"].get("ownerReferences") or [])
        )
        return (js["metadata"].get("resourceVersion"), *jobs)

    # ------------------------------------------------------------------ Reconcile

    def reconcile(self, js: Obj) -> None:
        """jobset_controller.go, ``reconcile``, step by step."""
        before = copy.deepcopy(js.get("status"))
        status = js.setdefault("status", {})
        status.setdefault("restarts", 0)
        owned = self._child_jobs(js)
        failed = False
        status["replicatedJobsStatus"] = self._replicated_job_statuses(js, owned)
        if _finished(js):
            self._delete(owned["active"])
        else:
            self._delete(owned["previous"])
            if owned["failed"]:
                self._execute_failure_policy(js, owned)
            elif owned["successful"] and self._execute_success_policy(js, owned):
                pass
            elif not self._create_missing(js, owned):
                failed = True  # the error ends the reconcile (``createJobs``): retried with backoff
            elif js["spec"].get("suspend"):
                self._suspend_jobs(js, owned["active"])
            else:
                self._resume_jobs(js, owned["active"])
        if js.get("status") != before:
            self.store.write(JOBSETS, js)
        self._requeue(js, failed)

    def _requeue(self, js: Obj, failed: bool) -> None:
        """controller-runtime after a reconcile: an error is retried with the item's backoff
        (``AddRateLimited``); success forgets it (``Forget``)."""
        name = js["metadata"]["name"]
        if not failed:
            self.backoff.pop(name, None)
            return
        failures = self.backoff[name].failures + 1 if name in self.backoff else 1
        delay = min(BASE_BACKOFF_S * 2 ** (failures - 1), MAX_BACKOFF_S)
        self.backoff[name] = _Backoff(failures, self.clock.now + delay, self._versions(js))

    def _child_jobs(self, js: Obj) -> dict[str, list[Obj]]:
        """``getChildJobs``: Jobs of an earlier restart attempt are "previous" (to delete); the
        others are active, successful or failed by their conditions."""
        uid = js["metadata"]["uid"]
        restarts = js["status"].get("restarts", 0)
        owned: dict[str, list[Obj]] = {"active": [], "successful": [], "failed": [], "previous": []}
        for job in self.store.owned_by(JOBS, uid):
            if job["metadata"].get("namespace") != js["metadata"]["namespace"] or not any(o.get("uid") == uid and o.get("controller") for o in job["metadata"].get("ownerReferences") or []):
                continue
            if int(job["metadata"]["labels"].get(RESTART_ATTEMPT, "0")) < restarts:
                owned["previous"].append(job)
                continue
            finished = job_finished(job)
            owned[{"Complete": "successful", "Failed": "failed", None: "active"}[finished]].append(job)
        return owned

    def _replicated_job_statuses(self, js: Obj, owned: dict[str, list[Obj]]) -> list[dict[str, Any]]:
        """``calculateReplicatedJobStatuses``."""
        statuses = []
        for rjob in js["spec"]["replicatedJobs"]:
            mine = lambda kind: [j for j in owned[kind] if j["metadata"]["labels"].get(REPLICATED_JOB) == rjob["name"]]  # noqa: E731
            active = mine("active")
            ready = [j for j in active if (j.get("status") or {}).get("ready", 0) + (j.get("status") or {}).get("succeeded", 0) >= j["spec"].get("parallelism", 1)]
            statuses.append({
                "name": rjob["name"],
                "ready": len(ready),
                "succeeded": len(mine("successful")),
                "failed": len(mine("failed")),
                "active": len([j for j in active if (j.get("status") or {}).get("active", 0) > 0]),
                "suspended": len([j for j in active if j["spec"].get("suspend")]),
            })
        return statuses

    def _delete(self, jobs: list[Obj]) -> None:
        """``deleteJobs``: foreground deletion, skipping Jobs already being deleted."""
        for job in jobs:
            if "deletionTimestamp" not in job["metadata"]:
                self.store.delete(JOBS, job["metadata"]["namespace"], job["metadata"]["name"], "Foreground")

    # ------------------------------------------------------------------ failure policy

    def _execute_failure_policy(self, js: Obj, owned: dict[str, list[Obj]]) -> None:
        """failure_policy.go, ``executeFailurePolicy``: without a policy the JobSet fails; else
        the first rule (in order) that some failed Job matches applies to the earliest such Job,
        and no match means the default action, RestartJobSet."""
        policy = js["spec"].get("failurePolicy")
        failed = owned["failed"]
        if policy is None:
            first = _first_failed(failed)
            self._fail(js, "FailedJobs", f"jobset failed due to one or more job failures (first failed job: {first['metadata']['name']})")
            return
        for rule in policy.get("rules") or []:
            matching = [job for job in failed if _rule_applies(rule, job)]
            if matching:
                self._apply(js, rule["action"], _first_failed(matching), rule)
                return
        self._apply(js, "RestartJobSet", _first_failed(failed), None)

    def _apply(self, js: Obj, action: str, job: Obj, rule: dict[str, Any] | None) -> None:
        """The action appliers of failure_policy.go (``failJobSetActionApplier``,
        ``restartJobSetActionApplier``, ``restartJobSetAndIgnoreMaxRestartsActionApplier``)."""
        name = job["metadata"]["name"]
        status = js["status"]
        if action == "FailJobSet":
            self._fail(js, "FailJobSetFailurePolicyAction", f"applying FailJobSet failure policy action (first failed job: {name})")
            return
        if action == "RestartJobSet" and status.get("restartsCountTowardsMax", 0) >= js["spec"]["failurePolicy"].get("maxRestarts", 0):
            self._fail(js, "ReachedMaxRestarts", f"jobset failed due to reaching max number of restarts (first failed job: {name})")
            return
        if action not in ACTIONS:
            raise AssertionError(f"{action} needs the RestartJob feature gate, off in JobSet v0.12 by default")
        # failurePolicyRecreateAll: a new restart attempt; Jobs of older attempts get deleted.
        status["restarts"] = status.get("restarts", 0) + 1
        if action == "RestartJobSet":
            status["restartsCountTowardsMax"] = status.get("restartsCountTowardsMax", 0) + 1
        reason = f"FailurePolicy_{rule['name']}" if rule else "DefaultFailurePolicy"
        message = f"applying {action} failure policy action (first failed job: {name})"
        _set_condition(js, "Restarting", "True", reason, message, self.clock)
        self.events.append((js["metadata"]["name"], f"{action}FailurePolicyAction", message))

    def _fail(self, js: Obj, reason: str, message: str) -> None:
        """``setJobSetFailedCondition``."""
        _set_condition(js, "Failed", "True", reason, message, self.clock)
        js["status"]["terminalState"] = "Failed"
        self.events.append((js["metadata"]["name"], reason, message))

    # ------------------------------------------------------------------ success policy

    def _execute_success_policy(self, js: Obj, owned: dict[str, list[Obj]]) -> bool:
        """jobset_controller.go ``executeSuccessPolicy`` with success_policy.go: Operator All
        needs every Job of the targeted replicated jobs to succeed, Any needs one."""
        policy = js["spec"].get("successPolicy") or {"operator": "All"}
        targets = policy.get("targetReplicatedJobs") or []
        matching = [j for j in owned["successful"] if not targets or j["metadata"]["labels"].get(REPLICATED_JOB) in targets]
        if policy.get("operator") == "Any":
            needed = 1
        else:
            needed = sum(r["replicas"] for r in js["spec"]["replicatedJobs"] if not targets or r["name"] in targets)
        if len(matching) < needed:
            return False
        _set_condition(js, "Completed", "True", "AllJobsCompleted", "jobset completed successfully", self.clock)
        js["status"]["terminalState"] = "Completed"
        return True

    # ------------------------------------------------------------------ child Jobs

    def _create_missing(self, js: Obj, owned: dict[str, list[Obj]]) -> bool:
        """``reconcileReplicatedJobs`` / ``constructJobsFromTemplate``: every missing Job of
        every replicated job, except that BlockingRecreate creates none while Jobs of an
        earlier attempt still exist. False: a creation was refused."""
        blocking = (js["spec"].get("failurePolicy") or {}).get("restartStrategy") == "BlockingRecreate"
        if owned["previous"] and blocking:
            return True
        missing = self._missing(js, owned)
        if missing and js["metadata"]["name"] in self.refused_creates:
            return False
        for rjob, index, name in missing:
            self.store.create(JOBS, self._construct_job(js, rjob, index, name))
        return True

    @staticmethod
    def _missing(js: Obj, owned: dict[str, list[Obj]]) -> list[tuple[dict[str, Any], int, str]]:
        """The Jobs of the JobSet whose name no Job holds (one being deleted holds it too)."""
        existing = {j["metadata"]["name"] for kind in owned.values() for j in kind}
        return [
            (rjob, index, name)
            for rjob in js["spec"]["replicatedJobs"] for index in range(rjob["replicas"])
            if (name := f"{js['metadata']['name']}-{rjob['name']}-{index}") not in existing
        ]

    def _construct_job(self, js: Obj, rjob: dict[str, Any], index: int, name: str) -> Obj:
        """``constructJob`` and ``labelAndAnnotateObject``: the Job and its pod template carry
        the JobSet's labels and annotations (also as annotations), the restart attempt, and
        the exclusive-topology annotation when the JobSet has one."""
        namespace = js["metadata"]["namespace"]
        spec = copy.deepcopy(rjob["template"]["spec"])
        stamp = {
            JOBSET_NAME: js["metadata"]["name"],
            JOBSET_UID: js["metadata"]["uid"],
            REPLICATED_JOB: rjob["name"],
            RESTART_ATTEMPT: str(js["status"].get("restarts", 0)),
            REPLICAS_KEY: str(rjob["replicas"]),
            GLOBAL_REPLICAS: str(sum(r["replicas"] for r in js["spec"]["replicatedJobs"])),
            JOB_INDEX: str(index),
            JOB_KEY: job_key(namespace, name),
        }
        annotations = dict(stamp)
        js_annotations = js["metadata"].get("annotations") or {}
        if EXCLUSIVE_KEY in js_annotations:
            annotations[EXCLUSIVE_KEY] = js_annotations[EXCLUSIVE_KEY]
            if NODE_SELECTOR_STRATEGY in js_annotations:
                annotations[NODE_SELECTOR_STRATEGY] = js_annotations[NODE_SELECTOR_STRATEGY]
        template_meta = spec["template"].setdefault("metadata", {})
        template_meta["labels"] = {**(template_meta.get("labels") or {}), **stamp}
        template_meta["annotations"] = {**(template_meta.get("annotations") or {}), **annotations}
        if (js["spec"].get("network") or {}).get("enableDNSHostnames"):
            spec["template"]["spec"]["subdomain"] = (js["spec"].get("network") or {}).get("subdomain") or js["metadata"]["name"]
        spec["suspend"] = bool(js["spec"].get("suspend"))
        template_labels = (rjob["template"].get("metadata") or {}).get("labels") or {}
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {**template_labels, **stamp},
                "annotations": {**((rjob["template"].get("metadata") or {}).get("annotations") or {}), **annotations},
                "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": js["metadata"]["name"],
                                     "uid": js["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": spec,
            "status": {},
        }

    def _suspend_jobs(self, js: Obj, active: list[Obj]) -> None:
        """``suspendJobs``."""
        for job in active:
            if not job["spec"].get("suspend"):
                job["spec"]["suspend"] = True
                self.store.write(JOBS, job)
        _set_condition(js, "Suspended", "True", "SuspendedJobs", "jobset is suspended", self.clock)

    def _resume_jobs(self, js: Obj, active: list[Obj]) -> None:
        """``resumeJobsIfNecessary`` / ``resumeJob``: the pod template fields that may change
        while suspended (labels, annotations, node selector, tolerations, scheduling gates) are
        merged into the Job before it is unsuspended."""
        templates = {r["name"]: r["template"]["spec"]["template"] for r in js["spec"]["replicatedJobs"]}
        for job in active:
            if not job["spec"].get("suspend"):
                continue
            source = templates.get(job["metadata"]["labels"].get(REPLICATED_JOB), {})
            target = job["spec"]["template"]
            for key in ("labels", "annotations"):
                target.setdefault("metadata", {})[key] = {**(target["metadata"].get(key) or {}), **((source.get("metadata") or {}).get(key) or {})}
            target["spec"]["nodeSelector"] = {**(target["spec"].get("nodeSelector") or {}), **(source["spec"].get("nodeSelector") or {})}
            for key in ("tolerations", "schedulingGates"):
                merged = list(target["spec"].get(key) or [])
                merged += [item for item in source["spec"].get(key) or [] if item not in merged]
                target["spec"][key] = merged
            job["spec"]["suspend"] = False
            self.store.write(JOBS, job)
        if condition(js, "Suspended") is not None:
            _set_condition(js, "Suspended", "False", "ResumeJobs", "jobset is resumed", self.clock)


def _finished(js: Obj) -> bool:
    """``jobSetFinished``."""
    return condition(js, "Completed") is not None or condition(js, "Failed") is not None


def _rule_applies(rule: dict[str, Any], job: Obj) -> bool:
    """failure_policy.go, ``ruleIsApplicable``: the Job's failure reason is one of the rule's
    reasons, its message matches one of the patterns (Go ``regexp.MatchString``: a search, not a
    full match), and its replicated job is targeted; an empty list matches anything."""
    failed = condition(job, "Failed")
    if failed is None:
        return False
    reasons = rule.get("onJobFailureReasons") or []
    if reasons and failed.get("reason") not in reasons:
        return False
    patterns = rule.get("onJobFailureMessagePatterns") or []
    if patterns and not any(re.search(p, failed.get("message") or "") for p in patterns):
        return False
    targets = rule.get("targetReplicatedJobs") or []
    parent = job["metadata"]["labels"].get(REPLICATED_JOB)
    return bool(parent) and (not targets or parent in targets)


def _first_failed(jobs: list[Obj]) -> Obj:
    """``findFirstFailedJob``: the Job whose Failed condition is the oldest."""
    return min(jobs, key=lambda j: ((condition(j, "Failed") or {}).get("lastTransitionTime") or "", j["metadata"]["name"]))


def _set_condition(obj: Obj, type_: str, status: str, reason: str, message: str, clock: Clock) -> None:
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    found = next((c for c in conditions if c["type"] == type_), None)
    if found is None:
        conditions.append({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": clock.iso()})
    elif (found["status"], found.get("reason"), found.get("message")) != (status, reason, message):
        if found["status"] != status:
            found["lastTransitionTime"] = clock.iso()
        found.update(status=status, reason=reason, message=message)
