"""kube-scheduler in the world (kubernetes/kubernetes ``pkg/scheduler``): the filter plugins a
hotswap pod meets, binding, the PodScheduled condition, and priority preemption.

Filters (``framework/plugins``): SchedulingGates (a gated pod is never queued), NodeUnschedulable
and TaintToleration (cordoned, NotReady and unreachable nodes carry NoSchedule taints),
NodeAffinity (``nodeSelector`` and required node affinity), NodeResourcesFit (requests against
allocatable minus what bound pods use, terminating ones included), InterPodAffinity (required
affinity, anti-affinity, and the anti-affinity of pods already there). Among feasible nodes the
world takes the first by name instead of scoring, so runs are deterministic.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from k8s_fixtures.world.apiserver import add_condition
from k8s_fixtures.world.store import NODES, PODS, Clock, Obj, Store

_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(text: Any) -> float:
    match = _QUANTITY.match(str(text))
    if match is None:
        return 0.0
    return float(match.group(1)) * _SUFFIX.get(match.group(2), 1)


def requests(pod: Obj) -> dict[str, float]:
    """A pod's requests (a container's limits stand for missing requests: the API server's
    defaulting, pkg/apis/core/v1/defaults.go ``SetDefaults_ResourceList`` for extended resources),
    plus one ``pods`` slot."""
    total: dict[str, float] = {"pods": 1.0}
    for container in pod["spec"].get("containers", []):
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in merged.items():
            total[name] = total.get(name, 0.0) + quantity(value)
    return total


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    """``v1helper.TolerationsTolerateTaint``."""
    for toleration in tolerations:
        if toleration.get("effect") not in (None, "", taint.get("effect")):
            continue
        if toleration.get("operator") == "Exists":
            if toleration.get("key") in (None, "", taint["key"]):
                return True
        elif toleration.get("key") == taint["key"] and toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def _matches_expression(labels: dict[str, str], expression: dict[str, Any]) -> bool:
    key, op, values = expression["key"], expression["operator"], expression.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {op} is not modelled")


def selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(_matches_expression(labels, e) for e in selector.get("matchExpressions") or [])


def is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def priority(pod: Obj) -> int:
    return int(pod["spec"].get("priority") or 0)


class Scheduler:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def schedule_all(self) -> None:
        """One scheduling cycle per pending pod, highest priority first, then oldest
        (``internal/queue``: the active queue sorts by priority, then timestamp)."""
        pending = [
            p for p in self.store.items(PODS)
            if not p["spec"].get("nodeName") and not p["spec"].get("schedulingGates")
            and "deletionTimestamp" not in p["metadata"] and not is_terminal(p)
        ]
        pending.sort(key=lambda p: (-priority(p), p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
        for pod in pending:
            self._schedule(pod)

    def _schedule(self, pod: Obj) -> None:
        nodes = self.store.items(NODES)
        bound = [p for p in self.store.items(PODS) if p["spec"].get("nodeName") and not is_terminal(p)]
        reasons: dict[str, int] = {}
        for node in nodes:
            why = self.filter(pod, node, bound)
            if why is None:
                pod["spec"]["nodeName"] = node["metadata"]["name"]
                pod["status"].pop("nominatedNodeName", None)
                add_condition(pod, "PodScheduled", "True", "", "", self.clock)
                self.store.write(PODS, pod)
                return
            reasons[why] = reasons.get(why, 0) + 1
        detail = ", ".join(f"{count} {why}" for why, count in sorted(reasons.items()))
        message = f"0/{len(nodes)} nodes are available: {detail}."
        before = copy.deepcopy(pod["status"])
        add_condition(pod, "PodScheduled", "False", "Unschedulable", message, self.clock)
        for found in pod["status"]["conditions"]:
            if found["type"] == "PodScheduled":
                found["message"] = message  # the message follows the cluster; the transition time does not
        nominated = self._preempt(pod, nodes, bound)
        if nominated is not None:
            pod["status"]["nominatedNodeName"] = nominated
        if pod["status"] != before:
            self.store.write(PODS, pod)

    # ------------------------------------------------------------------ filters

    def filter(self, pod: Obj, node: Obj, bound: list[Obj], without: set[str] = frozenset()) -> str | None:  # type: ignore[assignment]
        """Why ``pod`` cannot go on ``node`` (None: it can), with the pods named in ``without``
        taken away (preemption's dry run)."""
        spec = pod["spec"]
        labels = node["metadata"].get("labels") or {}
        tolerations = spec.get("tolerations") or []
        if node["spec"].get("unschedulable") and not tolerates(tolerations, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
            return "node(s) were unschedulable"
        for taint in node["spec"].get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
                return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return "node(s) didn't match Pod's node affinity/selector"
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        if required and not any(all(_matches_expression(labels, e) for e in term.get("matchExpressions") or []) for term in required["nodeSelectorTerms"]):
            return "node(s) didn't match Pod's node affinity/selector"
        others = [p for p in bound if p["metadata"]["uid"] not in without]
        here = [p for p in others if p["spec"]["nodeName"] == node["metadata"]["name"]]
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        used: dict[str, float] = {}
        for other in here:
            for name, value in requests(other).items():
                used[name] = used.get(name, 0.0) + value
        for name, value in requests(pod).items():
            if value and used.get(name, 0.0) + value > quantity(allocatable.get(name, 0)):
                return f"Insufficient {name}"
        return self._inter_pod_affinity(pod, node, others)

    def _inter_pod_affinity(self, pod: Obj, node: Obj, others: list[Obj]) -> str | None:
        """interpodaffinity/filtering.go, ``Filter``: ``satisfyPodAffinity`` (a pod matching its
        own term may start a group no pod matches yet), ``satisfyPodAntiAffinity`` and
        ``satisfyExistingPodsAntiAffinity``."""
        nodes = {n["metadata"]["name"]: n for n in self.store.items(NODES)}

        def domain(node_name: str, key: str) -> str | None:
            found = nodes.get(node_name)
            return ((found or {}).get("metadata", {}).get("labels") or {}).get(key)

        node_labels = node["metadata"].get("labels") or {}
        pod_labels = pod["metadata"].get("labels") or {}
        affinity = pod["spec"].get("affinity") or {}
        for term in (affinity.get("podAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []:
            key = term["topologyKey"]
            matching = [p for p in others if self._in_scope(term, pod, p) and selector_matches(term.get("labelSelector"), p["metadata"].get("labels") or {})]
            if any(domain(p["spec"]["nodeName"], key) == node_labels.get(key) for p in matching):
                continue
            if not matching and selector_matches(term.get("labelSelector"), pod_labels):
                continue
            return "node(s) didn't match pod affinity rules"
        for term in (affinity.get("podAntiAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []:
            key = term["topologyKey"]
            for other in others:
                if (self._in_scope(term, pod, other) and selector_matches(term.get("labelSelector"), other["metadata"].get("labels") or {})
                        and node_labels.get(key) is not None and domain(other["spec"]["nodeName"], key) == node_labels.get(key)):
                    return "node(s) didn't match pod anti-affinity rules"
        for other in others:
            terms = ((other["spec"].get("affinity") or {}).get("podAntiAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []
            for term in terms:
                key = term["topologyKey"]
                if (self._in_scope(term, other, pod) and selector_matches(term.get("labelSelector"), pod_labels)
                        and node_labels.get(key) is not None and domain(other["spec"]["nodeName"], key) == node_labels.get(key)):
                    return "node(s) didn't satisfy existing pods anti-affinity rules"
        return None

    @staticmethod
    def _in_scope(term: dict[str, Any], owner: Obj, other: Obj) -> bool:
        """A term looks at the namespaces it names, all of them with ``namespaceSelector: {}``,
        else only its pod's own."""
        if term.get("namespaceSelector") == {}:
            return True
        namespaces = term.get("namespaces") or [owner["metadata"].get("namespace")]
        return other["metadata"].get("namespace") in namespaces

    # ------------------------------------------------------------------ preemption

    def _preempt(self, pod: Obj, nodes: list[Obj], bound: list[Obj]) -> str | None:
        """defaultpreemption/default_preemption.go, ``SelectVictimsOnNode``, and
        ``preemption.go`` ``pickOneNodeForPreemption``: on a node where evicting lower-priority
        pods lets the pod fit, the fewest and least important victims (all lower-priority pods
        removed, then the most important ones put back while it still fits). The victims get
        the DisruptionTarget condition (PreemptionByScheduler) and are deleted gracefully; the
        pod is nominated and binds once they are gone."""
        nominated = pod["status"].get("nominatedNodeName")
        if nominated and any(p["spec"]["nodeName"] == nominated and "deletionTimestamp" in p["metadata"] for p in bound):
            return nominated  # its victims are still terminating
        mine = priority(pod)
        best: tuple[tuple[int, int, str], str, list[Obj]] | None = None
        for node in nodes:
            name = node["metadata"]["name"]
            lower = [p for p in bound if p["spec"]["nodeName"] == name and priority(p) < mine]
            if not lower:
                continue
            removed = {p["metadata"]["uid"] for p in lower}
            if self.filter(pod, node, bound, removed) is not None:
                continue
            for candidate in sorted(lower, key=lambda p: -priority(p)):
                trial = removed - {candidate["metadata"]["uid"]}
                if self.filter(pod, node, bound, trial) is None:
                    removed = trial
            victims = [p for p in lower if p["metadata"]["uid"] in removed]
            key = (max(priority(v) for v in victims), len(victims), name)
            if best is None or key < best[0]:
                best = (key, name, victims)
        if best is None:
            return None
        for victim in best[2]:
            if "deletionTimestamp" in victim["metadata"]:
                continue
            add_condition(victim, "DisruptionTarget", "True", "PreemptionByScheduler",
                          "default-scheduler: preempting to accommodate a higher priority pod", self.clock)
            self.store.write(PODS, victim)
            self.store.delete(PODS, victim["metadata"]["namespace"], victim["metadata"]["name"])
        return best[1]
