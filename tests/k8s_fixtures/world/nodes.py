"""Nodes in the world: the kubelets (which run the workers), the node lifecycle controller, taint
eviction and pod garbage collection, plus the faults a test injects.

A worker's life is scripted: it runs once bound to a live node, exits with the code a test
gives (:meth:`Nodes.exit`), and on SIGTERM (graceful deletion) saves and exits 143 after
``stop_after_s`` (never later than its grace period; :attr:`Nodes.sigterm` lists them). A force
deletion (grace 0) removes the pod at once: its worker gets no SIGTERM (on a node whose kubelet
is unreachable the container may even go on running). A node that fails stops its kubelet: its
pods look unchanged in the API, as on a real cluster, until the node lifecycle controller marks
it NotReady after ``node-monitor-grace-period``.
"""

from __future__ import annotations

import dataclasses

from k8s_fixtures.world.apiserver import add_condition
from k8s_fixtures.world.store import NODES, PODS, Clock, Obj, Store, parse_time

CHECKPOINTED = 143
UNREACHABLE = "node.kubernetes.io/unreachable"
NOT_READY = "node.kubernetes.io/not-ready"
UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
CONTAINER = "worker"


@dataclasses.dataclass
class _Exit:
    at: float
    code: int


class Nodes:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        # node-monitor-grace-period: 40 s up to Kubernetes 1.31, 50 s from 1.32 (the kubelet's
        # lease renewal misses before the node is marked NotReady).
        self.grace_s = 40.0
        self.stop_after_s = 3.0  # SIGTERM -> checkpoint saved -> exit
        self.dead: dict[str, float] = {}  # node -> when its kubelet stopped
        self.exits: dict[str, _Exit] = {}  # pod uid -> scripted exit
        self.sigterm: list[str] = []  # pods whose worker got SIGTERM and saved before it exited
        self.missing: dict[str, float] = {}  # node -> when PodGC first found its Node object gone
        self.pod_gc_quarantine_s = 40.0
        self.rejecting: dict[str, tuple[str, str]] = {}  # node -> (reason, message) its kubelet rejects pods with

    # ------------------------------------------------------------------ faults and repairs

    def fail(self, name: str) -> None:
        """The machine dies: its kubelet stops reporting; nothing changes in the API yet."""
        self.dead.setdefault(name, self.clock.now)

    def repair(self, name: str) -> None:
        """The machine is back (rebooted): its kubelet reports again; containers that were
        running there are gone, so their pods fail (``ContainerStatusUnknown``, 137)."""
        self.dead.pop(name, None)
        for pod in self._pods_on(name):
            if not _terminal(pod) and "deletionTimestamp" not in pod["metadata"] and pod["status"].get("phase") == "Running":
                self._finish(pod, 137, "ContainerStatusUnknown")

    def reject_pods(self, name: str, reason: str = "UnexpectedAdmissionError",
                    message: str = "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices google.com/tpu, which is unexpected") -> None:
        """The kubelet of ``name`` rejects the pods bound to it from now on, at admission: its
        device plugin cannot allocate the accelerators (failing hardware) while the node stays Ready."""
        self.rejecting[name] = (reason, message)

    def exit(self, pod: Obj, code: int, after_s: float = 0.0) -> None:
        self.exits[pod["metadata"]["uid"]] = _Exit(self.clock.now + after_s, code)

    # ------------------------------------------------------------------ a step

    def step(self) -> None:
        self._lifecycle()
        self._kubelets()
        self._taint_eviction()
        self._pod_gc()

    def _pods_on(self, node: str) -> list[Obj]:
        return self.store.pods_on(node)

    def _kubelets(self) -> None:
        """The kubelet of every live node (pkg/kubelet: ``syncPod`` / ``SyncTerminatingPod``)."""
        for pod in list(self.store.items(PODS)):
            node = pod["spec"].get("nodeName")
            if not node or node in self.dead or self.store.peek(NODES, "", node) is None:
                continue
            meta = pod["metadata"]
            if "deletionTimestamp" in meta:
                if _terminal(pod):
                    self.store.remove(PODS, pod)  # status reported; the kubelet completes the delete
                    continue
                grace = float(meta.get("deletionGracePeriodSeconds", 30))
                started = (parse_time(meta["deletionTimestamp"]) or self.clock.now + grace) - grace  # it is the deadline
                if pod["status"].get("phase") != "Running" or self.clock.now >= started + min(self.stop_after_s, grace):
                    if pod["status"].get("phase") == "Running":
                        self.sigterm.append(meta["name"])  # the worker got SIGTERM and saved
                    self._finish(pod, CHECKPOINTED, "Error")
                continue
            if _terminal(pod):
                continue
            scripted = self.exits.get(meta["uid"])
            if scripted is not None and self.clock.now >= scripted.at and pod["status"].get("phase") == "Running":
                self._finish(pod, scripted.code, "Completed" if scripted.code == 0 else "Error")
            elif pod["status"].get("phase") == "Pending" and node in self.rejecting:
                if self._bound_at(pod) < self.clock.now:
                    self._reject(pod, *self.rejecting[node])
            elif pod["status"].get("phase") == "Pending":
                self._start(pod)

    def _start(self, pod: Obj) -> None:
        status = pod["status"]
        status["phase"] = "Running"
        status["startTime"] = self.clock.iso()
        status["containerStatuses"] = [
            {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True, "restartCount": 0,
             "state": {"running": {"startedAt": self.clock.iso()}}}
            for c in pod["spec"].get("containers", [])
        ]
        for type_ in ("Initialized", "ContainersReady", "Ready"):
            add_condition(pod, type_, "True", "", "", self.clock)
        self.store.write(PODS, pod)

    def _bound_at(self, pod: Obj) -> float:
        """When the scheduler bound the pod (its PodScheduled condition)."""
        scheduled = next((c for c in pod["status"].get("conditions") or [] if c.get("type") == "PodScheduled" and c.get("status") == "True"), None)
        return (parse_time(scheduled.get("lastTransitionTime")) if scheduled else None) or self.clock.now

    def _reject(self, pod: Obj, reason: str, message: str) -> None:
        """pkg/kubelet/kubelet.go, ``HandlePodAdditions`` -> ``rejectPod`` (the device manager's
        admission handler failing, pkg/kubelet/lifecycle/predicate.go): the pod is Failed with
        the reason and message only. No container ran, so no container status has an exit code,
        and no condition is added: a Job's podFailurePolicy has nothing to match.

        A rejection comes after the device manager's ``Allocate`` call to the device plugin
        failed (pkg/kubelet/cm/devicemanager/manager.go), and it reaches kube-scheduler's cache
        only by the pod's status update: the pods released with it in the same round are all
        bound by then (scheduling one takes milliseconds). The world rejects a pod from the tick
        after its binding, never within the round that released it, so a rejecting node does
        not swallow its siblings one after another."""
        pod["status"] = {**pod["status"], "phase": "Failed", "reason": reason, "message": f"Pod was rejected: {message}"}
        self.store.write(PODS, pod)

    def _finish(self, pod: Obj, code: int, reason: str) -> None:
        status = pod["status"]
        started = next((s["state"].get("running", {}).get("startedAt") for s in status.get("containerStatuses") or []), None)
        status["phase"] = "Succeeded" if code == 0 else "Failed"
        status["containerStatuses"] = [
            {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False, "restartCount": 0,
             "state": {"terminated": {"exitCode": code, "reason": reason, "startedAt": started or self.clock.iso(), "finishedAt": self.clock.iso()}}}
            for c in pod["spec"].get("containers", [])
        ]
        for type_ in ("ContainersReady", "Ready"):
            add_condition(pod, type_, "False", "PodCompleted" if code == 0 else "PodFailed", "", self.clock)
        self.store.write(PODS, pod)

    # ------------------------------------------------------------------ control plane

    def _lifecycle(self) -> None:
        """nodelifecycle/node_lifecycle_controller.go: ``monitorNodeHealth`` marks a node whose
        kubelet stopped reporting for ``node-monitor-grace-period`` Ready=Unknown, and
        ``doNoScheduleTaintingPass`` / ``doNoExecuteTaintingPass`` taint it unreachable (NoSchedule
        and NoExecute); a spec.unschedulable node gets the unschedulable NoSchedule taint
        (TaintNodesByCondition). A node that reports again loses them."""
        for node in self.store.items(NODES):
            name = node["metadata"]["name"]
            changed = False
            ready = next((c for c in node["status"].get("conditions") or [] if c["type"] == "Ready"), None)
            dead_since = self.dead.get(name)
            lost = dead_since is not None and self.clock.now >= dead_since + self.grace_s
            if ready is not None and lost and ready["status"] == "True":
                ready.update(status="Unknown", reason="NodeStatusUnknown", message="Kubelet stopped posting node status.",
                             lastTransitionTime=self.clock.iso())
                changed = True
            elif ready is not None and dead_since is None and ready["status"] != "True":
                ready.update(status="True", reason="KubeletReady", message="kubelet is posting ready status",
                             lastTransitionTime=self.clock.iso())
                changed = True
            taints = list(node["spec"].get("taints") or [])
            wanted = [t for t in taints if t["key"] not in (UNREACHABLE, NOT_READY, UNSCHEDULABLE)]
            for taint in taints:  # keep the ones still true, with their timeAdded
                if taint["key"] == UNREACHABLE and lost:
                    wanted.append(taint)
                if taint["key"] == UNSCHEDULABLE and node["spec"].get("unschedulable"):
                    wanted.append(taint)
            keys = {(t["key"], t["effect"]) for t in wanted}
            if lost:
                for effect in ("NoSchedule", "NoExecute"):
                    if (UNREACHABLE, effect) not in keys:
                        wanted.append({"key": UNREACHABLE, "effect": effect, **({"timeAdded": self.clock.iso()} if effect == "NoExecute" else {})})
            if node["spec"].get("unschedulable") and (UNSCHEDULABLE, "NoSchedule") not in keys:
                wanted.append({"key": UNSCHEDULABLE, "effect": "NoSchedule", "timeAdded": self.clock.iso()})
            if wanted != taints:
                node["spec"]["taints"] = wanted
                changed = True
            if changed:
                self.store.write(NODES, node)

    def _taint_eviction(self) -> None:
        """tainteviction/taint_eviction.go: a pod tolerating a NoExecute taint for
        ``tolerationSeconds`` is deleted when they run out, with the DisruptionTarget condition
        (``addConditionAndDeletePod``, reason DeletionByTaintManager)."""
        for node in self.store.items(NODES):
            for taint in node["spec"].get("taints") or []:
                if taint.get("effect") != "NoExecute":
                    continue
                added = parse_time(taint.get("timeAdded")) or self.clock.now
                for pod in self._pods_on(node["metadata"]["name"]):
                    if _terminal(pod) or "deletionTimestamp" in pod["metadata"]:
                        continue
                    toleration = next((t for t in pod["spec"].get("tolerations") or [] if t.get("key") == taint["key"] and t.get("effect") == "NoExecute"), None)
                    limit = None if toleration is None else toleration.get("tolerationSeconds")
                    if toleration is not None and (limit is None or self.clock.now < added + limit):
                        continue
                    add_condition(pod, "DisruptionTarget", "True", "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint", self.clock)
                    self.store.write(PODS, pod)
                    self.store.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])

    def _pod_gc(self) -> None:
        """podgc/gc_controller.go, ``gcOrphaned``: a pod bound to a Node object that no longer
        exists is marked Failed with DisruptionTarget (DeletionByPodGC) and force-deleted, once
        the node has been missing for ``quarantineTime`` (40 s: the node is checked again after
        that delay, in case it was only being recreated)."""
        for pod in list(self.store.items(PODS)):
            node = pod["spec"].get("nodeName")
            if not node or self.store.peek(NODES, "", node) is not None:
                self.missing.pop(node or "", None)
                continue
            if self.clock.now >= self.missing.setdefault(node, self.clock.now) + self.pod_gc_quarantine_s:
                if not _terminal(pod):
                    pod["status"]["phase"] = "Failed"
                    add_condition(pod, "DisruptionTarget", "True", "DeletionByPodGC", "PodGC: node no longer exists", self.clock)
                    self.store.write(PODS, pod)
                self.store.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], grace=0)


def _terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
