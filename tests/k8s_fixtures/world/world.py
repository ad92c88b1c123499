"""The world: an API server (over HTTP) and the controllers of a GKE cluster with JobSet (and,
optionally, Kueue) installed, on a virtual clock.

A test builds a :class:`World`, connects the real :class:`~hotswap.backends.kubernetes.client.
KubeClient` to it (:meth:`World.client`), and drives time with :meth:`World.advance`: each tick
moves the clock, lets every controller of the cluster act until nothing changes
(:meth:`World.settle`), and reconciles the hotswap controller under test when a watch would
have woken it (something changed; with ``watched_wakes``, only what its watches see), when it
asked to be woken, or at its resync period.
Nothing sleeps; the same test always takes the same steps.
"""

from __future__ import annotations

import copy
import functools
import json
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from k8s_fixtures.world.admission import JOBSET_NAME, Admission
from k8s_fixtures.world.apiserver import ApiServer, load_crd_schemas
from k8s_fixtures.world.gc import GarbageCollector
from k8s_fixtures.world.rbac import CLUSTER_RBAC_RESOURCES, RBAC_RESOURCES
from k8s_fixtures.world.job_controller import JobController
from k8s_fixtures.world.jobset_controller import JobSetController, condition
from k8s_fixtures.world.kueue import Kueue
from k8s_fixtures.world.nodes import Nodes
from k8s_fixtures.world.scheduler import Scheduler
from k8s_fixtures.world.store import (
    BUILTIN,
    CLUSTER_QUEUES,
    CRDS,
    DEPLOYMENTS,
    JOBS,
    JOBSET_RESOURCES,
    JOBSETS,
    KUEUE_RESOURCES,
    KUEUE_WORKLOADS,
    LEASES,
    NODES,
    PODS,
    PRIORITY_CLASSES,
    Clock,
    Obj,
    Resource,
    Store,
)

FIXTURES = Path(__file__).resolve().parents[1]
CRD_DIR = FIXTURES / "crds"
JOBSET_VERSION = "v0.12.0"
KUEUE_VERSION = "v0.19.2"
RESYNC_S = 30.0


@functools.lru_cache(maxsize=None)
def _nodes(name: str) -> tuple[dict[str, Any], ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(yaml.load((FIXTURES / name).read_text(), Loader=loader)["items"])


def load_nodes(name: str = "gke_v6e16_nodes.yaml") -> list[dict[str, Any]]:
    """A recorded-style node list (fresh copies: tests change them)."""
    return copy.deepcopy(list(_nodes(name)))


def set_ready(node: dict[str, Any], ready: bool) -> None:
    """Flip a node object's Ready condition and unreachable taint (for pure tests without a
    world; in a world, use :meth:`World.fail_node`)."""
    for item in node["status"]["conditions"]:
        if item["type"] == "Ready":
            item["status"] = "True" if ready else "Unknown"
            item["reason"] = "KubeletReady" if ready else "NodeStatusUnknown"
    taints = [t for t in node["spec"].get("taints", []) if not t["key"].startswith("node.kubernetes.io/unreachable")]
    if not ready:
        taints.append({"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"})
    node["spec"]["taints"] = taints


@functools.lru_cache(maxsize=None)
def _crd_text(name: str) -> str:
    return (CRD_DIR / name).read_text()


@functools.lru_cache(maxsize=None)
def load_crd(name: str) -> Obj:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the JobSet CRD is 800 kB of YAML
    return yaml.load(_crd_text(name), Loader=loader)


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.lstrip("v").split("-")[0].split("."))


def jobset_crd(version: str = JOBSET_VERSION) -> Obj:
    """The JobSet CRD as a server with ``version`` installed serves it: v0.12.0's file, with
    what later releases added taken out for older ones (the changes between the releases'
    ``config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml``)."""
    crd = load_crd("jobset.x-k8s.io_jobsets.yaml")
    if version_tuple(version) >= (0, 12):
        return crd
    crd = copy.deepcopy(crd)
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2")["schema"]["openAPIV3Schema"]
    policy = schema["properties"]["spec"]["properties"]["failurePolicy"]["properties"]
    rule = policy["rules"]["items"]["properties"]
    rule["action"]["enum"] = ["FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"]  # RestartJob*: v0.12
    if version_tuple(version) < (0, 11):
        policy["restartStrategy"]["enum"] = ["Recreate", "BlockingRecreate"]  # InPlaceRestart: v0.11
        schema["properties"]["spec"]["properties"].pop("volumeClaimPolicies", None)
    if version_tuple(version) < (0, 10):
        rule.pop("onJobFailureMessagePatterns", None)  # v0.10
    return crd


def watched(resource: Resource, obj: Obj, namespace: str) -> bool:
    """Whether a change of ``obj`` reaches the watches of ``hotswap controller run``
    (client/watch.py ``watch_call``): every Node, the namespace's JobSets of hotswap and its pods
    with the workload label. Jobs, Events, Leases and other owners' pods do not wake it."""
    meta = obj.get("metadata") or {}
    if resource is NODES:
        return True
    if meta.get("namespace") != namespace:
        return False
    if resource is JOBSETS:
        return (meta.get("labels") or {}).get("app.kubernetes.io/managed-by") == "hotswap"
    return resource is PODS and "hotswap.dev/workload" in (meta.get("labels") or {})


class World:
    def __init__(
        self,
        nodes: Iterable[dict[str, Any]],
        namespace: str = "default",
        kueue: bool = False,
        jobset_version: str | None = JOBSET_VERSION,
        kueue_version: str = KUEUE_VERSION,
        interleave: bool = False,
        extended_resource_toleration: bool = True,
        watched_wakes: bool = False,
        resync_s: float = RESYNC_S,
    ) -> None:
        """``interleave``: the cluster's controllers react to each write of a client (the
        controller under test) before its next request, as the real ones do within milliseconds
        (JobSet recreates a deleted Job and writes its status in 10-20 ms), not only between
        reconciles. ``watched_wakes``: the controller under test is woken only by what its
        watches see (:data:`WATCHED`), as in ``hotswap controller run``, not by any change;
        ``resync_s``: its resync period (``math.inf``: none, so that a test fails when an action
        waits for a resync instead of a wake-up time)."""
        self.clock = Clock()
        self.namespace = namespace
        resources: list[Resource] = [*BUILTIN, *RBAC_RESOURCES, *CLUSTER_RBAC_RESOURCES]
        crds: list[Obj] = []
        if jobset_version is not None:
            resources += JOBSET_RESOURCES
            crds.append(jobset_crd(jobset_version))
        if kueue:
            resources += KUEUE_RESOURCES
            crds += [load_crd(f"kueue.x-k8s.io_{p}.yaml") for p in ("clusterqueues", "localqueues", "resourceflavors")]
        self.store = Store(self.clock, resources)
        self.api = ApiServer(self.store, load_crd_schemas(crds))
        self.admission = Admission(self.store, jobset_priority_label_on_all_pods=version_tuple(jobset_version or "v0") >= (0, 11))
        self.admission.kueue = kueue
        self.admission.extended_resource_toleration = extended_resource_toleration
        self.api.admission.append(self.admission)
        self.jobsets = JobSetController(self.store, self.clock)
        self.jobs = JobController(self.store, self.clock, lambda pod: self.admission("CREATE", PODS, pod, None))
        self.scheduler = Scheduler(self.store, self.clock)
        self.nodes = Nodes(self.store, self.clock)
        owned = (JOBSETS, JOBS, PODS, LEASES, *RBAC_RESOURCES)  # a workload's records and its workers' access go with it
        self.gc = GarbageCollector(self.store, (*owned, KUEUE_WORKLOADS) if kueue else owned)
        self.kueue = Kueue(self.store, self.clock) if kueue else None
        self.installed_jobset = jobset_version is not None
        for node in nodes:
            self.store.create(NODES, copy.deepcopy(node))
        for crd in crds:
            self.store.create(CRDS, copy.deepcopy(crd))
        if jobset_version is not None:
            self._deployment("jobset-system", "jobset-controller-manager", f"registry.k8s.io/jobset/jobset:{jobset_version}")
        if kueue:
            self._deployment("kueue-system", "kueue-controller-manager", f"registry.k8s.io/kueue/kueue:{kueue_version}")
        self.interleaving = interleave
        self.watched_wakes = watched_wakes
        self.resync_s = resync_s
        if interleave:
            self.api.after_write.append(lambda _request: self.settle())
        self._reconciled_at = -1.0
        self._reconciled_revision = -1
        self._kubeconfig = tempfile.NamedTemporaryFile("w", suffix=".kubeconfig", delete=False)
        self._kubeconfig.write(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "world",
            "clusters": [{"name": "world", "cluster": {"server": self.api.url}}],
            "users": [{"name": "me", "user": {"token": "t0ken"}}],
            "contexts": [{"name": "world", "context": {"cluster": "world", "user": "me"}}],
        }))
        self._kubeconfig.close()

    @property
    def kubeconfig(self) -> str:
        return self._kubeconfig.name

    def close(self) -> None:
        self.api.close()
        Path(self._kubeconfig.name).unlink(missing_ok=True)

    def _deployment(self, namespace: str, name: str, image: str) -> None:
        self.store.create(DEPLOYMENTS, {
            "metadata": {"name": name, "namespace": namespace, "labels": {"control-plane": "controller-manager"}},
            "spec": {"template": {"spec": {"containers": [{"name": "manager", "image": image}]}}},
        })

    def client(self, settings: Any = None) -> Any:
        """The real client of hotswap, connected to this world's API server."""
        from kubernetes import config

        from hotswap.backends.kubernetes.client import KubeClient
        from hotswap.backends.kubernetes.settings import KubeSettings

        api_client = config.new_client_from_config(config_file=self.kubeconfig, persist_config=False)
        api_client.configuration.retries = 0
        return KubeClient(api_client, settings or KubeSettings(namespace=self.namespace))

    # ------------------------------------------------------------------ time

    def settle(self, limit: int = 60) -> None:
        """Let every controller of the cluster act until none changes anything."""
        for _ in range(limit):
            before = self.store.revision
            with self.store.lock:
                self.jobs.observe_deletions()  # a Job gone reaches the Job controller first
                self.jobsets.reconcile_all()
                self.jobs.reconcile_all()
                if self.kueue is not None:
                    self.kueue.step()
                self.gc.step()
                self.jobs.observe_deletions()
                self.scheduler.schedule_all()
                self.nodes.step()
            if self.store.revision == before:
                return
        raise AssertionError("the world does not settle (a controller of the world loops)")

    def advance(self, seconds: float, *controllers: Any, step: float = 1.0) -> None:
        """Move the clock by ``seconds`` in ``step`` ticks; reconcile the hotswap controllers
        after each tick when a watch would have woken them, they asked to be woken, or their
        resync is due."""
        end = self.clock.now + seconds
        while self.clock.now < end - 1e-9:
            self.clock.now = min(end, self.clock.now + step)
            self.settle()
            self.reconcile_if_due(*controllers)

    def reconcile_if_due(self, *controllers: Any) -> None:
        for controller in controllers:
            wake = getattr(controller, "wake_at", None)
            due = (
                self._news()
                or self.clock.now - self._reconciled_at >= self.resync_s
                or (wake is not None and self.clock.now >= wake)
            )
            if due:
                seen = self.store.revision
                controller.reconcile()
                self._reconciled_at = self.clock.now
                # What the cluster does in answer is news for the next tick (a watch event);
                # interleaved, the cluster answered during the round, and its own writes too
                # reach its watches.
                self._reconciled_revision = seen if self.interleaving else self.store.revision
                self.settle()

    def _news(self) -> bool:
        """Whether a watch of the controller under test has seen a change since its last round:
        any change, or (``watched_wakes``) one of the objects it watches."""
        if self.store.revision == self._reconciled_revision:
            return False
        if not self.watched_wakes:
            return True
        if self._reconciled_revision < self.store.compacted:
            return True  # the watches re-list
        for event in reversed(self.store.history):
            if event.revision <= self._reconciled_revision:
                return False
            if watched(event.resource, event.obj, self.namespace):
                return True
        return False

    # ------------------------------------------------------------------ what people and machines do

    def install_priority_classes(self, classes: Iterable[Obj]) -> None:
        for obj in classes:
            self.store.create(PRIORITY_CLASSES, copy.deepcopy(obj))

    def apply(self, obj: Obj) -> Obj:
        """Create an object through the API (admission included), as ``kubectl apply``."""
        client = self.client()
        return client.apply(obj)

    def fail_node(self, name: str) -> None:
        self.nodes.fail(name)

    def repair_node(self, name: str) -> None:
        self.nodes.repair(name)

    def cordon(self, name: str, on: bool = True) -> None:
        node = self.store.peek(NODES, "", name)
        assert node is not None
        if on:
            node["spec"]["unschedulable"] = True
        else:
            node["spec"].pop("unschedulable", None)
        self.store.write(NODES, node)

    def drain(self, name: str) -> None:
        """``kubectl drain``: cordon, then evict every pod of the node through the Eviction API."""
        self.cordon(name)
        for pod in self.pods(lambda p: p["spec"].get("nodeName") == name and "deletionTimestamp" not in p["metadata"]):
            self.api.evict(pod["metadata"]["namespace"], pod["metadata"]["name"])

    def delete_node(self, name: str) -> None:
        node = self.store.peek(NODES, "", name)
        if node is not None:
            self.store.remove(NODES, node)

    def exit(self, pods: Iterable[Obj], code: int, after_s: float = 0.0) -> None:
        for pod in pods:
            stored = self.store.peek(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
            if stored is not None:
                self.nodes.exit(stored, code, after_s)

    def add_foreign_pod(self, name: str, node: str, namespace: str = "other-team", resources: dict[str, str] | None = None, priority: int = 0) -> Obj:
        """A pod of another owner (an xpk job, another namespace), bound to ``node``."""
        pod = {
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
            "spec": {"nodeName": node, "priority": priority,
                     "containers": [{"name": "main", "image": "busybox", "resources": {"limits": resources or {"google.com/tpu": "4"}}}]},
            "status": {"phase": "Pending"},
        }
        return self.store.create(PODS, pod)

    # ------------------------------------------------------------------ what tests look at

    def pods(self, where: Callable[[Obj], bool] | None = None) -> list[Obj]:
        return [p for p in self.store.list(PODS) if where is None or where(p)]

    def pods_of(self, jobset: str, live: bool = True) -> list[Obj]:
        return self.pods(lambda p: (p["metadata"].get("labels") or {}).get(JOBSET_NAME) == jobset
                         and (not live or ("deletionTimestamp" not in p["metadata"] and p["status"].get("phase") not in ("Succeeded", "Failed"))))

    def running(self, jobset: str) -> list[Obj]:
        return [p for p in self.pods_of(jobset) if p["status"].get("phase") == "Running"]

    def jobset(self, name: str) -> Obj:
        found = self.store.get(JOBSETS, self.namespace, name)
        assert found is not None, f"no JobSet {name}"
        return found

    def state(self, name: str) -> dict[str, Any]:
        return json.loads(self.jobset(name)["metadata"]["annotations"]["hotswap.dev/state"])

    def finished(self, name: str) -> str | None:
        js = self.jobset(name)
        if condition(js, "Completed") is not None:
            return "Completed"
        if condition(js, "Failed") is not None:
            return "Failed"
        return None

    def node_label(self, node: str, key: str) -> str | None:
        found = self.store.peek(NODES, "", node)
        return ((found or {}).get("metadata", {}).get("labels") or {}).get(key)

    def pools_of(self, jobset: str, pool_label: str = "cloud.google.com/gke-nodepool") -> list[str | None]:
        """The node pool each replica's running pods are on (None: none running), by job index
        (the slices' replicas: the first replicated job's)."""
        first = self.jobset(jobset)["spec"]["replicatedJobs"][0]
        replicas = first["replicas"]
        placed: dict[int, set[str]] = {}
        for pod in self.running(jobset):
            if pod["metadata"]["labels"].get("jobset.sigs.k8s.io/replicatedjob-name") != first["name"]:
                continue
            index = int(pod["metadata"]["labels"]["jobset.sigs.k8s.io/job-index"])
            placed.setdefault(index, set()).add(self.node_label(pod["spec"]["nodeName"], pool_label) or "?")
        result: list[str | None] = []
        for index in range(replicas):
            pools = placed.get(index, set())
            assert len(pools) <= 1, f"replica {index} of {jobset} spans pools {pools}"
            result.append(next(iter(pools)) if pools else None)
        return result

    def nodes_of_pool(self, pool: str, pool_label: str = "cloud.google.com/gke-nodepool") -> list[str]:
        return sorted(n["metadata"]["name"] for n in self.store.items(NODES) if (n["metadata"].get("labels") or {}).get(pool_label) == pool)

    def kueue_workload(self, jobset: str) -> Obj:
        found = [w for w in self.store.list(KUEUE_WORKLOADS) if any(o.get("name") == jobset for o in w["metadata"].get("ownerReferences") or [])]
        assert len(found) == 1, found
        return found[0]

    def cluster_queue(self, name: str) -> Obj | None:
        return self.store.get(CLUSTER_QUEUES, "", name)
