"""The Job controller of Kubernetes (kubernetes/kubernetes ``pkg/controller/job``), for Indexed
Jobs as JobSet creates them: one pod per completion index, suspension, ``podFailurePolicy``,
``backoffLimit``, pod replacement and its backoff, and the terminal conditions.

Kubernetes >= 1.31 defaults: the JobPodReplacementPolicy and JobManagedBy features are on, so
a Job's terminal condition comes in two steps (FailureTarget / SuccessCriteriaMet first, Failed
/ Complete once no pod of it is left running or terminating: ``delayTerminalCondition``).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

from k8s_fixtures.world.admission import COMPLETION_INDEX
from k8s_fixtures.world.apiserver import gate_condition
from k8s_fixtures.world.jobset_controller import _set_condition, condition
from k8s_fixtures.world.store import EVENTS, JOBS, PODS, ApiError, Clock, Obj, Store, parse_time

BACKOFF_BASE_S = 10.0  # job_controller.go, DefaultJobPodFailureBackOff
BACKOFF_MAX_S = 600.0  # MaxJobPodFailureBackOff
API_BACKOFF_S = 1.0  # DefaultJobApiBackOff
API_BACKOFF_MAX_S = 60.0  # MaxJobApiBackOff
EXPECTATIONS_TIMEOUT_S = 300.0  # controller_utils.go, ExpectationsTimeout


@dataclasses.dataclass
class _Expectations:
    """controller_utils.go ``ControlleeExpectations`` of one Job key (namespace/name, not UID:
    ``controller.KeyFunc``): the pod creations ``manageJob`` raised, lowered as the pod informer
    sees each pod (``addPod`` -> ``CreationObserved``). ``addPod`` first resolves the pod's
    controller reference by name and drops a pod whose owner UID is not the UID of the Job now
    cached under that name (``resolveControllerRef``), so the creations of a Job deleted and
    recreated under the same name while they were in flight are never observed, and
    ``syncJob`` skips ``manageJob`` for the new Job (``SatisfiedExpectations`` false) until
    they expire (``ExpectationsTimeout``, 5 min: the 5.5 minutes of issue 23 C). Nothing else
    lowers them: ``updateJob`` only enqueues a sync (an update, such as a touch, helps only once
    they have expired, for a Job no other event wakes), and ``syncJob`` drops them
    (``DeleteExpectations``) only when it finds no Job under the name, which happens when a
    Job's deletion reaches the Job controller's queue (``deleteJob`` ->
    ``enqueueSyncJobImmediately``) before JobSet's recreation reaches its informer
    (kubernetes/kubernetes pkg/controller/job/job_controller.go). The world syncs every Job on
    every pass, so expired expectations let pods be created without an event."""

    uid: str  # the Job they were raised for
    pending: dict[str, int]  # pod name -> the pass of the controller that created it
    raised_at: float


@dataclasses.dataclass
class _Ledger:
    """What the real controller keeps in ``status.uncountedTerminatedPods``, tracking
    finalizers and its ``backoffStore``: which finished pods it has counted, and the failures
    since the last success (for the replacement backoff)."""

    seen: set[str] = dataclasses.field(default_factory=set)
    uncounted: set[str] = dataclasses.field(default_factory=set)  # pods it deleted itself (suspension)
    failures_after_success: int = 0
    last_failure: float | None = None
    retry_at: float = 0.0  # the sync queue's rate limiter after an API error
    api_backoff_s: float = 0.0


def is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def controller_uid(obj: Obj) -> str | None:
    return next((o["uid"] for o in obj["metadata"].get("ownerReferences") or [] if o.get("controller")), None)


class JobController:
    def __init__(self, store: Store, clock: Clock, admit: Callable[[Obj], None]) -> None:
        self.store = store
        self.clock = clock
        self.admit = admit  # the API server's admission of a pod create
        self.ledgers: dict[str, _Ledger] = {}
        self._suffixes = itertools.count(1)
        self.expectations: dict[tuple[str, str], _Expectations] = {}
        self._pass = 0

    def reconcile_all(self) -> None:
        self._pass += 1
        self._observe_creations()
        for job in list(self.store.items(JOBS)):
            self.sync(job)

    def _observe_creations(self) -> None:
        """The pod informer delivers the pods created in an earlier pass (``addPod``)."""
        for key, expected in list(self.expectations.items()):
            current = self.store.peek(JOBS, *key)
            if current is None:
                del self.expectations[key]  # syncJob of a Job that is gone: DeleteExpectations
                continue
            if current["metadata"]["uid"] != expected.uid:
                continue  # resolveControllerRef: the pods' owner is not the Job cached under this name
            for name, created in list(expected.pending.items()):
                if created < self._pass:
                    del expected.pending[name]
            if not expected.pending:
                del self.expectations[key]

    def observe_deletions(self) -> None:
        """``deleteJob`` -> ``syncJob`` of a key with no Job: ``DeleteExpectations``. Called when
        a Job object is gone (the last finalizer removed), before JobSet can react: its
        recreation is an API round trip, the Job controller's sync of the key is immediate;
        unless that key's sync is still creating pods (creations raised in this pass): the
        workqueue holds a key being processed until it is done, and JobSet's new Job is in the
        cache by then (issue 23 C)."""
        for key, expected in list(self.expectations.items()):
            if self.store.peek(JOBS, *key) is None and all(created < self._pass for created in expected.pending.values()):
                del self.expectations[key]

    def _satisfied(self, job: Obj) -> bool:
        """``SatisfiedExpectations`` of the Job's key: met, or expired (see :class:`_Expectations`)."""
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        expected = self.expectations.get(key)
        if expected is None:
            return True
        if self.clock.now - expected.raised_at >= EXPECTATIONS_TIMEOUT_S:
            del self.expectations[key]
            return True
        return False

    # ------------------------------------------------------------------ syncJob

    def sync(self, job: Obj) -> None:
        """job_controller.go, ``syncJob``."""
        if job_done(job) or "deletionTimestamp" in job["metadata"]:
            return
        ledger = self.ledgers.setdefault(job["metadata"]["uid"], _Ledger())
        pods = [p for p in self.store.owned_by(PODS, job["metadata"]["uid"])
                if p["metadata"].get("namespace") == job["metadata"]["namespace"] and controller_uid(p) == job["metadata"]["uid"]]
        before = copy.deepcopy(job.get("status") or {})
        status = job.setdefault("status", {})
        if job["spec"].get("suspend"):
            self._suspend(job, pods, ledger)
        else:
            if condition(job, "Suspended") is not None:
                _set_condition(job, "Suspended", "False", "JobResumed", "Job resumed", self.clock)
                status["startTime"] = self.clock.iso()
            status.setdefault("startTime", self.clock.iso())
            self._track_finished(job, pods, ledger)
            self._advance(job, pods, ledger)
        active = [p for p in pods if not is_terminal(p) and "deletionTimestamp" not in p["metadata"]]
        status["active"] = len(active)
        status["ready"] = sum(1 for p in active if _ready(p))
        status["terminating"] = sum(1 for p in pods if not is_terminal(p) and "deletionTimestamp" in p["metadata"])
        if status != before:
            self.store.write(JOBS, job)

    def _suspend(self, job: Obj, pods: list[Obj], ledger: _Ledger) -> None:
        """A suspended Job's running pods are deleted and not counted as failures (``manageJob``
        -> ``deleteJobPods`` removes the tracking finalizer before deleting)."""
        for pod in pods:
            if not is_terminal(pod) and "deletionTimestamp" not in pod["metadata"]:
                ledger.uncounted.add(pod["metadata"]["uid"])
                self.store.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
        _set_condition(job, "Suspended", "True", "JobSuspended", "Job suspended", self.clock)

    def _track_finished(self, job: Obj, pods: list[Obj], ledger: _Ledger) -> None:
        """``trackJobStatusAndRemoveFinalizers`` with pod_failure_policy.go's
        ``matchPodFailurePolicy``: each finished pod is counted once; a failed one is matched
        against the rules in order (FailJob: the Job fails with reason PodFailurePolicy;
        Ignore: not counted; Count or no rule: counted against backoffLimit)."""
        status = job["status"]
        policy = job["spec"].get("podFailurePolicy")
        succeeded = set(_indexes(status.get("completedIndexes", "")))
        for pod in sorted(pods, key=lambda p: (_finished_at(p) or 0.0, p["metadata"]["name"])):
            uid = pod["metadata"]["uid"]
            if uid in ledger.seen or not is_terminal(pod):
                continue
            ledger.seen.add(uid)
            if pod["status"]["phase"] == "Succeeded":
                succeeded.add(int(pod["metadata"]["annotations"][COMPLETION_INDEX]))
                ledger.failures_after_success, ledger.last_failure = 0, None
                continue
            if uid in ledger.uncounted:
                continue  # it lost its tracking finalizer when the controller deleted it
            ledger.failures_after_success += 1  # backoff_utils.go newBackoffRecord: every failed pod
            ledger.last_failure = _finished_at(pod) or self.clock.now
            message, counted, action = match_pod_failure_policy(policy, pod)
            if action == "FailJob" and condition(job, "FailureTarget") is None:
                _set_condition(job, "FailureTarget", "True", "PodFailurePolicy", message, self.clock)
            if counted:
                status["failed"] = status.get("failed", 0) + 1
        status["succeeded"] = len(succeeded)
        status["completedIndexes"] = _format_indexes(sorted(succeeded))
        if condition(job, "FailureTarget") is None and status.get("failed", 0) > job["spec"].get("backoffLimit", 6):
            _set_condition(job, "FailureTarget", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit", self.clock)

    def _advance(self, job: Obj, pods: list[Obj], ledger: _Ledger) -> None:
        """The rest of ``syncJob``: a failing Job deletes its active pods and is Failed once none
        is left; a Job whose every index succeeded is Complete; otherwise ``manageJob`` creates
        the missing pods."""
        status = job["status"]
        active = [p for p in pods if not is_terminal(p) and "deletionTimestamp" not in p["metadata"]]
        terminating = [p for p in pods if not is_terminal(p) and "deletionTimestamp" in p["metadata"]]
        target = condition(job, "FailureTarget")
        if target is not None:
            for pod in active:
                self.store.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
            if not active and not terminating:
                _set_condition(job, "Failed", "True", target["reason"], target["message"], self.clock)
            return
        completions = job["spec"].get("completions", 1)
        if status["succeeded"] >= completions and not active:
            _set_condition(job, "SuccessCriteriaMet", "True", "CompletionsReached", "Reached expected number of succeeded pods", self.clock)
            if not terminating:
                _set_condition(job, "Complete", "True", "CompletionsReached", "Reached expected number of succeeded pods", self.clock)
            return
        self._manage(job, pods, ledger)

    def _manage(self, job: Obj, pods: list[Obj], ledger: _Ledger) -> None:
        """``manageJob`` for Indexed Jobs: a pod for every index that has none, not succeeded.
        podReplacementPolicy Failed (the default with a podFailurePolicy) waits for a
        terminating pod to finish before replacing it. After failures, new pods wait the
        backoff of backoff_utils.go (``getRemainingTime``: 10 s doubling, at most 10 min)."""
        succeeded = set(_indexes(job["status"].get("completedIndexes", "")))
        replace_failed_only = (job["spec"].get("podReplacementPolicy") or ("Failed" if job["spec"].get("podFailurePolicy") else "TerminatingOrFailed")) == "Failed"
        busy = {
            int(p["metadata"]["annotations"][COMPLETION_INDEX])
            for p in pods
            if not is_terminal(p) and ("deletionTimestamp" not in p["metadata"] or replace_failed_only)
        }
        if self.clock.now < ledger.retry_at or not self._satisfied(job):
            return
        if ledger.last_failure is not None and ledger.failures_after_success:
            delay = min(BACKOFF_BASE_S * 2 ** (ledger.failures_after_success - 1), BACKOFF_MAX_S)
            if self.clock.now < ledger.last_failure + delay:
                return
        for index in range(job["spec"].get("completions", 1)):
            if index in busy or index in succeeded:
                continue
            try:
                self._create_pod(job, index)
                ledger.api_backoff_s = 0.0
            except ApiError as error:
                # The create is refused (a webhook): the controller records it and the sync is
                # requeued rate-limited (DefaultJobApiBackOff 1 s doubling to MaxJobApiBackOff 1 min).
                ledger.api_backoff_s = min(max(2 * ledger.api_backoff_s, API_BACKOFF_S), API_BACKOFF_MAX_S)
                ledger.retry_at = self.clock.now + ledger.api_backoff_s
                self.store.create(EVENTS, {"metadata": {"generateName": f"{job['metadata']['name']}.", "namespace": job["metadata"]["namespace"]},
                                           "involvedObject": {"kind": "Job", "name": job["metadata"]["name"]},
                                           "reason": "FailedCreate", "message": error.message, "type": "Warning"})
                return

    def _create_pod(self, job: Obj, index: int) -> None:
        """A pod of an Indexed Job (``getPodsForIndex``/``addCompletionIndexEnvVariables``): the
        index as annotation and label, hostname ``<job>-<index>``, the Job as controller owner."""
        template = job["spec"]["template"]
        meta = template.get("metadata") or {}
        name = job["metadata"]["name"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{index}-{next(self._suffixes):05d}",
                "namespace": job["metadata"]["namespace"],
                "labels": {**(meta.get("labels") or {}), "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
                           "batch.kubernetes.io/job-name": name, "job-name": name, "controller-uid": job["metadata"]["uid"],
                           COMPLETION_INDEX: str(index)},
                "annotations": {**(meta.get("annotations") or {}), COMPLETION_INDEX: str(index)},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job["metadata"]["uid"],
                                     "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": {**_copy(template["spec"]), "hostname": f"{name}-{index}"},
            "status": {"phase": "Pending"},
        }
        self.admit(pod)
        gate_condition(pod, self.clock)
        key = (job["metadata"]["namespace"], name)
        expected = self.expectations.get(key)
        if expected is None or expected.uid != job["metadata"]["uid"]:
            expected = self.expectations[key] = _Expectations(job["metadata"]["uid"], {}, self.clock.now)  # ExpectCreations
        expected.pending[pod["metadata"]["name"]] = self._pass
        self.store.create(PODS, pod)


def match_pod_failure_policy(policy: dict[str, Any] | None, pod: Obj) -> tuple[str, bool, str | None]:
    """pod_failure_policy.go, ``matchPodFailurePolicy``: the first rule matching the failed
    pod decides: (FailJob message, counted, action)."""
    if not policy:
        return "", True, None
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    for index, rule in enumerate(policy.get("rules") or []):
        action = rule["action"]
        if rule.get("onExitCodes") is not None:
            matched = _match_exit_codes(pod, rule["onExitCodes"])
            if matched is not None:
                container, code = matched
                return (f"Container {container} for pod {namespace}/{name} failed with exit code {code} matching {action} rule at index {index}",
                        action != "Ignore", action)
        elif rule.get("onPodConditions") is not None:
            for pod_condition in (pod.get("status") or {}).get("conditions") or []:
                if any(pod_condition["type"] == p["type"] and pod_condition["status"] == p.get("status", "True") for p in rule["onPodConditions"]):
                    return (f"Pod {namespace}/{name} has condition {pod_condition['type']} matching {action} rule at index {index}",
                            action != "Ignore", action)
    return "", True, None


def _match_exit_codes(pod: Obj, requirement: dict[str, Any]) -> tuple[str, int] | None:
    """``matchOnExitCodes``: a terminated container (of the named one, if named) with a
    non-zero code for which the In / NotIn operator holds."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if terminated is None or terminated.get("exitCode", 0) == 0:
            continue
        if requirement.get("containerName") not in (None, status["name"]):
            continue
        code = terminated["exitCode"]
        inside = code in requirement.get("values", [])
        if (requirement["operator"] == "In") == inside:
            return status["name"], code
    return None


def job_done(job: Obj) -> bool:
    return condition(job, "Complete") is not None or condition(job, "Failed") is not None


def _ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def _finished_at(pod: Obj) -> float | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if terminated and terminated.get("finishedAt"):
            return parse_time(terminated["finishedAt"])
    return None


def _indexes(text: str) -> list[int]:
    found: list[int] = []
    for part in filter(None, (text or "").split(",")):
        low, _, high = part.partition("-")
        found.extend(range(int(low), int(high or low) + 1))
    return found


def _format_indexes(indexes: list[int]) -> str:
    """``status.completedIndexes``: ranges, e.g. ``0-2,5``."""
    parts: list[str] = []
    for index in indexes:
        if parts and parts[-1].split("-")[-1] == str(index - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{index}"
        else:
            parts.append(str(index))
    return ",".join(parts)


def _copy(value: Any) -> Any:
    return copy.deepcopy(value)
