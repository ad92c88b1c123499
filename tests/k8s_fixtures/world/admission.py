"""Admission in the world: the built-in plugins and the webhooks of JobSet and Kueue that touch
the objects hotswap creates, each as a hook of :class:`~.apiserver.ApiServer`.

Order of a create, as in kube-apiserver: mutating plugins and webhooks, then validation.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from k8s_fixtures.world.store import JOBSETS, NODES, PODS, PRIORITY_CLASSES, ApiError, Obj, Resource, Store

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOB_KEY = "jobset.sigs.k8s.io/job-key"
PRIORITY_KEY = "jobset.sigs.k8s.io/priority"
EXCLUSIVE_KEY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
NODE_SELECTOR_STRATEGY = "alpha.jobset.sigs.k8s.io/node-selector"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
QUEUE_NAME = "kueue.x-k8s.io/queue-name"
GATES_MUTABLE_FROM = "1.30"


class Admission:
    """The admission chain of the world's API server."""

    def __init__(self, store: Store, jobset_priority_label_on_all_pods: bool = True) -> None:
        self.store = store
        # jobset#1077 (v0.11): every JobSet pod gets the priority label, not only those of
        # JobSets using exclusive placement. The world can play an older JobSet.
        self.priority_label_on_all_pods = jobset_priority_label_on_all_pods
        self.kueue = False
        # GKE enables the ExtendedResourceToleration plugin; other distributions (kind, kwok,
        # EKS, a vanilla kube-apiserver) do not, and their TPU/GPU taints then need the pod's own.
        self.extended_resource_toleration = True

    def __call__(self, operation: str, resource: Resource, obj: Obj, old: Obj | None) -> None:
        if resource is PODS and operation == "CREATE":
            _quantities_as_strings(obj)
            self._priority(obj)
            if self.extended_resource_toleration:
                self._extended_resource_tolerations(obj)
            self._default_toleration_seconds(obj)
            self._jobset_pod_default(obj)
            self._jobset_pod_validate(obj)
        elif resource is PODS and operation == "UPDATE":
            _validate_pod_update(obj, old or {})
        elif resource is JOBSETS and operation == "CREATE":
            if self.kueue:
                _kueue_suspend_default(obj)
            _jobset_default(obj)
        elif resource is JOBSETS and operation == "UPDATE":
            _jobset_validate_update(obj, old or {})

    # ------------------------------------------------------------------ built-in plugins

    def _priority(self, pod: Obj) -> None:
        """plugin/pkg/admission/priority/admission.go, ``admitPod``: ``spec.priority`` from the
        PriorityClass named by ``priorityClassName`` (a missing class is refused)."""
        spec = pod["spec"]
        name = spec.get("priorityClassName")
        if not name:
            spec["priority"] = 0
            return
        found = self.store.peek(PRIORITY_CLASSES, "", name)
        if found is None:
            raise ApiError(403, "Forbidden", f"pods is forbidden: no PriorityClass with name {name} was found")
        spec["priority"] = int(found["value"])

    @staticmethod
    def _extended_resource_tolerations(pod: Obj) -> None:
        """plugin/pkg/admission/extendedresourcetoleration/admission.go, ``Admit`` (enabled on
        GKE): a pod requesting an extended resource tolerates the NoSchedule taint of that
        name, which is how TPU pods pass GKE's ``google.com/tpu`` taint."""
        wanted = set()
        for container in pod["spec"].get("containers", []):
            resources = container.get("resources") or {}
            for section in ("requests", "limits"):
                wanted.update(k for k in (resources.get(section) or {}) if "/" in k and not k.startswith("kubernetes.io/"))
        tolerations = pod["spec"].setdefault("tolerations", [])
        for key in sorted(wanted):
            toleration = {"key": key, "operator": "Exists", "effect": "NoSchedule"}
            if toleration not in tolerations:
                tolerations.append(toleration)

    @staticmethod
    def _default_toleration_seconds(pod: Obj) -> None:
        """plugin/pkg/admission/defaulttolerationseconds/admission.go, ``Admit``: tolerate the
        not-ready and unreachable NoExecute taints for 300 s."""
        tolerations = pod["spec"].setdefault("tolerations", [])
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
            if not any(t.get("key") == key and t.get("effect") == "NoExecute" for t in tolerations):
                tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})

    # ------------------------------------------------------------------ JobSet's pod webhook

    def _jobset_pod_default(self, pod: Obj) -> None:
        """jobset pkg/webhooks/pod_webhook.go, ``Default`` / ``patchPod``: the priority label;
        for exclusive placement, the leader's affinity and anti-affinity, a follower's node
        selector for its leader's topology domain."""
        meta = pod["metadata"]
        annotations = meta.get("annotations") or {}
        if JOBSET_NAME not in annotations or NODE_SELECTOR_STRATEGY in annotations:
            return
        exclusive = EXCLUSIVE_KEY in annotations
        if pod["spec"].get("priority") is not None and (exclusive or self.priority_label_on_all_pods):
            meta.setdefault("labels", {})[PRIORITY_KEY] = str(pod["spec"]["priority"])
        if not exclusive:
            return
        topology = annotations[EXCLUSIVE_KEY]
        if annotations.get(COMPLETION_INDEX) == "0":
            _set_exclusive_affinities(pod, topology)
            return
        leader = self._leader_of(pod)
        if leader is None or not leader["spec"].get("nodeName"):
            return  # the validating webhook refuses it
        node = self.store.peek(NODES, "", leader["spec"]["nodeName"])
        value = ((node or {}).get("metadata", {}).get("labels") or {}).get(topology)
        if value is not None:
            pod["spec"].setdefault("nodeSelector", {})[topology] = value

    def _jobset_pod_validate(self, pod: Obj) -> None:
        """jobset pkg/webhooks/pod_webhook.go, ``ValidateCreate``: a follower of an exclusive
        JobSet is admitted only once its leader is scheduled ("an expected, transient error")."""
        annotations = pod["metadata"].get("annotations") or {}
        if JOBSET_NAME not in annotations or NODE_SELECTOR_STRATEGY in annotations or EXCLUSIVE_KEY not in annotations:
            return
        if annotations.get(COMPLETION_INDEX) == "0":
            return
        topology = annotations[EXCLUSIVE_KEY]
        if topology not in (pod["spec"].get("nodeSelector") or {}):
            raise ApiError(403, "Forbidden", "admission webhook \"vpod.kb.io\" denied the request: follower pod node selector for"
                           f" topology domain not found. missing selector: {topology}")
        leader = self._leader_of(pod)
        if leader is None or not leader["spec"].get("nodeName"):
            raise ApiError(403, "Forbidden", "admission webhook \"vpod.kb.io\" denied the request: leader pod not yet scheduled,"
                           " not creating follower pod. this is an expected, transient error")

    def _leader_of(self, pod: Obj) -> Obj | None:
        """pod_webhook.go, ``leaderPodForFollower``: the one live pod of index 0 of the same Job."""
        owner = next((o["uid"] for o in pod["metadata"].get("ownerReferences") or [] if o.get("controller")), None)
        labels = pod["metadata"].get("labels") or {}
        namespace = pod["metadata"].get("namespace")
        same_key = self.store.items(PODS, namespace) if labels.get(JOB_KEY) is None else [
            p for p in self.store.labelled(PODS, JOB_KEY, labels[JOB_KEY]) if p["metadata"].get("namespace") == namespace]
        leaders = [
            p for p in same_key
            if "deletionTimestamp" not in p["metadata"]
            and (p["metadata"].get("annotations") or {}).get(COMPLETION_INDEX) == "0"
            and (p["metadata"].get("labels") or {}).get(JOB_KEY) == labels.get(JOB_KEY)
        ]
        if len(leaders) != 1:
            return None
        leader_owner = next((o["uid"] for o in leaders[0]["metadata"].get("ownerReferences") or [] if o.get("controller")), None)
        return leaders[0] if leader_owner == owner else None


def _quantities_as_strings(pod: Obj) -> None:
    """A pod's resource quantities come back as strings (``resource.Quantity`` serializes so)."""
    for container in pod["spec"].get("containers", []):
        for section in ("limits", "requests"):
            values = (container.get("resources") or {}).get(section)
            if values:
                container["resources"][section] = {k: str(v) for k, v in values.items()}


def _set_exclusive_affinities(pod: Obj, topology: str) -> None:
    labels = pod["metadata"].get("labels") or {}
    affinity = pod["spec"].setdefault("affinity", {})
    affinity.setdefault("podAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
        {"labelSelector": {"matchExpressions": [{"key": JOB_KEY, "operator": "In", "values": [labels.get(JOB_KEY)]}]},
         "topologyKey": topology, "namespaceSelector": {}}
    )
    affinity.setdefault("podAntiAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
        {"labelSelector": {"matchExpressions": [
            {"key": JOB_KEY, "operator": "Exists"},
            {"key": JOB_KEY, "operator": "NotIn", "values": [labels.get(JOB_KEY)]},
            {"key": PRIORITY_KEY, "operator": "In", "values": [labels.get(PRIORITY_KEY)]},
        ]}, "topologyKey": topology, "namespaceSelector": {}}
    )


def _validate_pod_update(new: Obj, old: Obj) -> None:
    """pkg/apis/core/validation/validation.go, ``ValidatePodUpdate``: a pod's spec is immutable
    except that scheduling gates may be removed, and while the pod is still gated its node
    selector may gain entries (KEP-3838, Kubernetes >= 1.30). Labels and annotations are free."""
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    old_gates = [g["name"] for g in old_spec.get("schedulingGates") or []]
    new_gates = [g["name"] for g in new_spec.get("schedulingGates") or []]
    if not set(new_gates) <= set(old_gates):
        raise ApiError(422, "Invalid", f'Pod "{new["metadata"]["name"]}" is invalid: spec.schedulingGates: Forbidden: only deletion is allowed')
    old_selector, new_selector = old_spec.get("nodeSelector") or {}, new_spec.get("nodeSelector") or {}
    if new_selector != old_selector:
        if not old_gates:
            raise ApiError(422, "Invalid", f'Pod "{new["metadata"]["name"]}" is invalid: spec.nodeSelector: Invalid value: only'
                           " additions to spec.nodeSelector are allowed, and only while the pod has scheduling gates")
        if any(old_selector.get(k, v) != v for k, v in new_selector.items()) or not set(old_selector) <= set(new_selector):
            raise ApiError(422, "Invalid", f'Pod "{new["metadata"]["name"]}" is invalid: spec.nodeSelector: Invalid value: only additions are allowed')
    ignored = ("schedulingGates", "nodeSelector", "nodeName")
    if {k: v for k, v in new_spec.items() if k not in ignored} != {k: v for k, v in old_spec.items() if k not in ignored}:
        raise ApiError(422, "Invalid", f'Pod "{new["metadata"]["name"]}" is invalid: spec: Forbidden: pod updates may not change fields other than'
                       " schedulingGates, and nodeSelector additions of gated pods")


# ---------------------------------------------------------------------- JobSet and Kueue webhooks on JobSets


def _jobset_default(jobset: Obj) -> None:
    """jobset pkg/webhooks/jobset_webhook.go, ``Default``: success policy All, Indexed
    completion, DNS hostnames, rule names."""
    spec = jobset["spec"]
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    for rjob in spec.get("replicatedJobs", []):
        job_spec = rjob["template"]["spec"]
        job_spec.setdefault("completionMode", "Indexed")
        job_spec["template"]["spec"].setdefault("restartPolicy", "OnFailure")
    for index, rule in enumerate((spec.get("failurePolicy") or {}).get("rules") or []):
        rule.setdefault("name", f"failurePolicyRule{index}")


def _jobset_validate_update(new: Obj, old: Obj) -> None:
    """jobset_webhook.go, ``ValidateUpdate``: replicated jobs are immutable, except the pod
    template's labels, annotations, node selector, tolerations and scheduling gates while the
    JobSet is (or is being) suspended (what Kueue changes when it admits)."""
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    munged = copy.deepcopy(new_spec.get("replicatedJobs"))
    if old_spec.get("suspend") or new_spec.get("suspend"):
        previous = {r["name"]: r for r in old_spec.get("replicatedJobs") or []}
        for rjob in munged or []:
            before = previous.get(rjob["name"])
            if before is None:
                continue
            template, old_template = rjob["template"]["spec"]["template"], before["template"]["spec"]["template"]
            for key in ("labels", "annotations"):
                template.setdefault("metadata", {})[key] = (old_template.get("metadata") or {}).get(key)
            for key in ("nodeSelector", "tolerations", "schedulingGates"):
                template["spec"][key] = old_template["spec"].get(key)
            _drop_none(template)
    if _canonical(munged) != _canonical(old_spec.get("replicatedJobs")):
        raise ApiError(422, "Invalid", f'JobSet.jobset.x-k8s.io "{new["metadata"]["name"]}" is invalid: spec.replicatedJobs: Invalid value: field is immutable')


def _drop_none(node: Any) -> None:
    if isinstance(node, dict):
        for key in [k for k, v in node.items() if v is None]:
            del node[key]
        for value in node.values():
            _drop_none(value)


def _canonical(value: Any) -> Any:
    value = copy.deepcopy(value)
    _drop_none(value)
    return value


def _kueue_suspend_default(jobset: Obj) -> None:
    """kueue pkg/controller/jobs/jobset/jobset_webhook.go, ``Default`` ->
    jobframework ``ApplyDefaultForSuspend``: a JobSet with a queue name starts suspended."""
    labels = jobset["metadata"].get("labels") or {}
    if QUEUE_NAME in labels:
        jobset["spec"]["suspend"] = True


def job_key(namespace: str, job: str) -> str:
    """jobset_controller.go, ``jobHashKey``: SHA1 of ``<namespace>/<job>``."""
    return hashlib.sha1(f"{namespace}/{job}".encode()).hexdigest()
