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


def _anti_terms(pod: Obj) -> list[dict[str, Any]]:
    return ((pod["spec"].get("affinity") or {}).get("podAntiAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []


class Scheduler:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        # Per scheduling cycle (nodes do not change within one): nodes by name, each topology
        # key's nodes by domain, the topology keys of the bound pods' anti-affinity terms.
        self._nodes: dict[str, Obj] = {}
        self._domains: dict[str, dict[str | None, list[str]]] = {}
        self._anti_keys: set[str] = set()

    def schedule_all(self) -> None:
        """One scheduling cycle per pending pod, highest priority first, then oldest
        (``internal/queue``: the active queue sorts by priority, then timestamp)."""
        pending = [
            p for p in self.store.items(PODS)
            if not p["spec"].get("nodeName") and not p["spec"].get("schedulingGates")
            and "deletionTimestamp" not in p["metadata"] and not is_terminal(p)
        ]
        if not pending:
            return
        pending.sort(key=lambda p: (-priority(p), p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
        nodes = self.store.items(NODES)
        self._nodes = {n["metadata"]["name"]: n for n in nodes}
        self._domains = {}
        self._anti_keys = {term["topologyKey"] for p in self._bound() for term in _anti_terms(p)}
        for pod in pending:
            self._schedule(pod, nodes)

    def _bound_on(self, node_name: str, without: set[str]) -> list[Obj]:
        return [p for p in self.store.pods_on(node_name) if not is_terminal(p) and p["metadata"]["uid"] not in without]

    def _bound(self) -> list[Obj]:
        return [p for p in self.store.items(PODS) if p["spec"].get("nodeName") and not is_terminal(p)]

    def _schedule(self, pod: Obj, nodes: list[Obj]) -> None:
        reasons: dict[str, int] = {}
        for node in nodes:
            why = self.filter(pod, node)
            if why is None:
                pod["spec"]["nodeName"] = node["metadata"]["name"]
                pod["status"].pop("nominatedNodeName", None)
                add_condition(pod, "PodScheduled", "True", "", "", self.clock)
                self.store.write(PODS, pod)
                self._anti_keys |= {term["topologyKey"] for term in _anti_terms(pod)}
                return
            reasons[why] = reasons.get(why, 0) + 1
        detail = ", ".join(f"{count} {why}" for why, count in sorted(reasons.items()))
        message = f"0/{len(nodes)} nodes are available: {detail}."
        before = copy.deepcopy(pod["status"])
        add_condition(pod, "PodScheduled", "False", "Unschedulable", message, self.clock)
        for found in pod["status"]["conditions"]:
            if found["type"] == "PodScheduled":
                found["message"] = message  # the message follows the cluster; the transition time does not
        nominated = self._preempt(pod, nodes)
        if nominated is not None:
            pod["status"]["nominatedNodeName"] = nominated
        if pod["status"] != before:
            self.store.write(PODS, pod)

    # ------------------------------------------------------------------ filters

    def filter(self, pod: Obj, node: Obj, without: set[str] = frozenset()) -> str | None:  # type: ignore[assignment]
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
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        used: dict[str, float] = {}
        for other in self._bound_on(node["metadata"]["name"], without):
            for name, value in requests(other).items():
                used[name] = used.get(name, 0.0) + value
        for name, value in requests(pod).items():
            if value and used.get(name, 0.0) + value > quantity(allocatable.get(name, 0)):
                return f"Insufficient {name}"
        return self._inter_pod_affinity(pod, node, without)

    def _in_domain(self, node: Obj, key: str, without: set[str]) -> list[Obj]:
        """The bound pods on the nodes of ``node``'s topology domain for ``key`` (none when the
        node has no such label: a term never matches there)."""
        value = (node["metadata"].get("labels") or {}).get(key)
        if value is None:
            return []
        if key not in self._domains:
            index: dict[str | None, list[str]] = {}
            for name, other in self._nodes.items():
                index.setdefault((other["metadata"].get("labels") or {}).get(key), []).append(name)
            self._domains[key] = index
        return [p for name in self._domains[key].get(value, []) for p in self._bound_on(name, without)]

    def _matching_anywhere(self, term: dict[str, Any], pod: Obj, without: set[str]) -> bool:
        """Whether any bound pod in the term's scope matches its selector (candidates by the
        selector's first ``In`` expression when it has one, all bound pods otherwise)."""
        selector = term.get("labelSelector") or {}
        first = next((e for e in selector.get("matchExpressions") or [] if e.get("operator") == "In"), None)
        if first is not None:
            candidates = [p for value in first.get("values") or [] for p in self.store.labelled(PODS, first["key"], value)
                          if p["spec"].get("nodeName") and not is_terminal(p)]
        else:
            candidates = self._bound()
        return any(p["metadata"]["uid"] not in without and self._in_scope(term, pod, p)
                   and selector_matches(selector, p["metadata"].get("labels") or {}) for p in candidates)

    def _inter_pod_affinity(self, pod: Obj, node: Obj, without: set[str]) -> str | None:
        """interpodaffinity/filtering.go, ``Filter``: ``satisfyPodAffinity`` (a pod matching its
        own term may start a group no pod matches yet), ``satisfyPodAntiAffinity`` and
        ``satisfyExistingPodsAntiAffinity``. A term's topology domain is the node's value of its
        key; only the pods bound in that domain can match there (the plugin's PreFilter counts
        pods per domain for the same reason)."""
        pod_labels = pod["metadata"].get("labels") or {}
        affinity = pod["spec"].get("affinity") or {}
        for term in (affinity.get("podAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []:
            if any(self._in_scope(term, pod, p) and selector_matches(term.get("labelSelector"), p["metadata"].get("labels") or {})
                   for p in self._in_domain(node, term["topologyKey"], without)):
                continue
            if selector_matches(term.get("labelSelector"), pod_labels) and not self._matching_anywhere(term, pod, without):
                continue
            return "node(s) didn't match pod affinity rules"
        for term in (affinity.get("podAntiAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []:
            for other in self._in_domain(node, term["topologyKey"], without):
                if self._in_scope(term, pod, other) and selector_matches(term.get("labelSelector"), other["metadata"].get("labels") or {}):
                    return "node(s) didn't match pod anti-affinity rules"
        for key in sorted(self._anti_keys):
            for other in self._in_domain(node, key, without):
                for term in _anti_terms(other):
                    if (term["topologyKey"] == key and self._in_scope(term, other, pod)
                            and selector_matches(term.get("labelSelector"), pod_labels)):
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

    def _preempt(self, pod: Obj, nodes: list[Obj]) -> str | None:
        """defaultpreemption/default_preemption.go, ``SelectVictimsOnNode``, and
        ``preemption.go`` ``pickOneNodeForPreemption``: on a node where evicting lower-priority
        pods lets the pod fit, the fewest and least important victims (all lower-priority pods
        removed, then the most important ones put back while it still fits). The victims get
        the DisruptionTarget condition (PreemptionByScheduler) and are deleted gracefully; the
        pod is nominated and binds once they are gone."""
        nominated = pod["status"].get("nominatedNodeName")
        if nominated and any("deletionTimestamp" in p["metadata"] for p in self._bound_on(nominated, set())):
            return nominated  # its victims are still terminating
        mine = priority(pod)
        best: tuple[tuple[int, int, str], str, list[Obj]] | None = None
        for node in nodes:
            name = node["metadata"]["name"]
            lower = [p for p in self._bound_on(name, set()) if priority(p) < mine]
            if not lower:
                continue
            removed = {p["metadata"]["uid"] for p in lower}
            if self.filter(pod, node, removed) is not None:
                continue
            for candidate in sorted(lower, key=lambda p: -priority(p)):
                trial = removed - {candidate["metadata"]["uid"]}
                if self.filter(pod, node, trial) is None:
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
