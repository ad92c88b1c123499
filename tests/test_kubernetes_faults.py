"""Bad answers and faults of the API server: an unreachable server, 403, 409, a missing CRD, a
watch that errors or expires (410 Gone). Each gives one clear line and a retry with backoff,
never a dead watcher or a crash loop; and the controller never deletes what it did not create."""

from __future__ import annotations

import threading
import time

import pytest
from k8s_fixtures.scenario import make_controller, make_world, run_until, running, submit
from k8s_fixtures.world import World
from k8s_fixtures.world.apiserver import Fault

from hotswap.api.errors import HotswapError, NotFoundError
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.client import ForbiddenError, UnreachableError
from hotswap.backends.kubernetes.client.watch import Watcher
from hotswap.backends.kubernetes.controller.loop import KubeController

JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"
NODES = "/api/v1/nodes"


@pytest.fixture
def world() -> World:
    world = make_world()
    world.api.watch_timeout_cap_s = 0.3
    yield world
    world.close()


def wait_for(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


class Watching:
    """A watcher on its own thread, as ``controller run`` starts them."""

    def __init__(self, world: World, kind: str = "nodes") -> None:
        self.changed, self.stop, self.lines = threading.Event(), threading.Event(), []
        client = world.client()
        function, args, kwargs = client.watch_call(kind, "c")
        self.watcher = Watcher(kind, function, args, kwargs, self.changed, self.stop, timeout_s=1, log=self.lines.append)
        self.thread = threading.Thread(target=self.watcher.run, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def touch_node(world: World) -> None:
    from k8s_fixtures.world.store import NODES as NODE_RESOURCE

    node = world.store.items(NODE_RESOURCE)[0]
    node["metadata"].setdefault("labels", {})["touched"] = str(time.monotonic_ns())
    world.store.write(NODE_RESOURCE, node)


def test_a_watch_survives_error_events_and_a_compacted_resource_version(world: World) -> None:
    """An ERROR event in the stream (the client's own Watch raises KeyError on it when not
    deserializing, which killed the watcher) and a 410 Gone both end in a fresh watch; changes
    keep waking the controller."""
    watching = Watching(world)
    try:
        assert wait_for(watching.changed.is_set)
        world.api.faults.append(Fault("GET", NODES, 500, reason="InternalError", message="etcdserver: request timed out", times=2, watch=True, as_event=True))
        watching.changed.clear()
        assert wait_for(lambda: watching.changed.is_set() and not world.api.faults[0].times)
        assert watching.thread.is_alive()
        assert any("etcdserver: request timed out" in line for line in watching.lines)
        assert wait_for(lambda: any("working again" in line for line in watching.lines), 30)
        # A resourceVersion older than etcd's compaction: 410 Gone, watch again from now.
        world.store.compact()
        touch_node(world)
        watching.changed.clear()
        touch_node(world)
        assert wait_for(watching.changed.is_set)
        assert watching.thread.is_alive()
    finally:
        watching.close()
    assert not watching.thread.is_alive()


def test_a_watch_survives_a_dropped_connection_and_refusals(world: World) -> None:
    watching = Watching(world)
    try:
        world.api.faults.append(Fault("GET", NODES, 0, times=2, watch=True))  # the connection drops
        world.api.faults.append(Fault("GET", NODES, 403, reason="Forbidden", message='nodes is forbidden: User "x" cannot watch resource "nodes"', times=2, watch=True))
        assert wait_for(lambda: all(f.times == 0 for f in world.api.faults), 30)
        watching.changed.clear()
        touch_node(world)
        assert wait_for(watching.changed.is_set, 30)
        assert watching.thread.is_alive()
        assert any("forbidden" in line for line in watching.lines)
        assert len([line for line in watching.lines if "forbidden" in line]) == 1  # logged once while it lasts
    finally:
        watching.close()


def test_a_brief_403_after_an_api_server_restart_is_retried_quietly(world: World) -> None:
    """A restarted kube-apiserver answers 403 until its RBAC caches synced: the controller
    retries quietly, and the round (its reads, its writes) goes on; no permission warning."""
    controller = make_controller(world)
    pauses: list[float] = []
    controller.client.sleep = pauses.append
    submit(world, "w", "high", 1)
    refused = 'jobsets.jobset.x-k8s.io is forbidden: User "system:serviceaccount:default:hotswap-controller" cannot list resource "jobsets"'
    world.api.faults.append(Fault("GET", JOBSETS, 403, reason="Forbidden", message=refused, times=1))
    world.api.faults.append(Fault("PATCH", f"{JOBSETS}/w", 403, reason="Forbidden", message="RBAC: not yet synced", times=2))
    controller.reconcile()
    assert world.state("w")["phase"] == "RUNNING" and len(pauses) == 3
    watching = Watching(world)
    try:
        world.api.faults.append(Fault("GET", NODES, 403, reason="Forbidden", message='nodes is forbidden: User "x" cannot watch resource "nodes"', times=1, watch=True))
        assert wait_for(lambda: all(f.times == 0 for f in world.api.faults), 30)
        watching.changed.clear()
        touch_node(world)
        assert wait_for(watching.changed.is_set, 30)
        assert not [line for line in watching.lines if "forbidden" in line]
    finally:
        watching.close()


def test_reconcile_errors_are_one_clear_line(world: World) -> None:
    controller = make_controller(world)
    pauses: list[float] = []
    controller.client.sleep = pauses.append
    world.api.faults.append(Fault("GET", JOBSETS, 403, reason="Forbidden", message='jobsets.jobset.x-k8s.io is forbidden: User "system:serviceaccount:default:hotswap-controller" cannot list resource "jobsets"', times=3))
    with pytest.raises(ForbiddenError) as forbidden:  # a 403 that persists is a permission problem
        controller.reconcile()
    assert len(pauses) == 2
    assert "\n" not in str(forbidden.value) and "cannot list resource" in str(forbidden.value) and "hotswap controller manifests" in str(forbidden.value)
    drops = Fault("GET", NODES, 0)  # every connection drops (after the client's own retries)
    world.api.faults.append(drops)
    with pytest.raises(UnreachableError, match="cannot reach the Kubernetes API server"):
        controller.reconcile()
    world.api.faults.remove(drops)
    controller.reconcile()  # the server answers again: so does the controller


def test_a_missing_jobset_crd_says_what_to_install() -> None:
    world = make_world(jobset_version=None)
    try:
        with pytest.raises(NotFoundError) as missing:
            make_controller(world).reconcile()
        message = str(missing.value)
        assert "jobset.x-k8s.io/v1alpha2 is not installed" in message
        assert "install JobSet v0.12.0: kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml" in message
    finally:
        world.close()


def test_a_conflict_is_decided_again_on_fresh_objects(world: World) -> None:
    """Someone changed the JobSet between the controller's read and its write: the write is
    refused (409: the patch carries the resourceVersion read) and the next round decides on
    what is there now."""
    controller = make_controller(world)
    submit(world, "w", "high", 1)
    world.settle()
    world.api.faults.append(Fault("PATCH", f"{JOBSETS}/w", 409, reason="Conflict",
                                  message='Operation cannot be fulfilled on jobsets.jobset.x-k8s.io "w": the object has been modified', times=1))
    controller.reconcile()
    assert any("changed meanwhile" in line for line in controller.logs)
    assert labels.STATE_ANNOTATION not in world.jobset("w")["metadata"]["annotations"]
    run_until(world, controller, lambda: running(world, "w") == 4)


def test_the_run_loop_backs_off_and_recovers_without_exiting(world: World) -> None:
    """``controller run`` against a server that stops answering: it logs one line, retries with
    backoff, and carries on when the server is back (no crash loop)."""
    lines: list[str] = []
    controller = KubeController(world.client(), "c", log=lines.append)
    submit(world, "w", "high", 1)
    outage = Fault(None, JOBSETS, 503, reason="ServiceUnavailable", message="the server is currently unable to handle the request")
    world.api.faults.append(outage)
    stop = threading.Event()
    thread = threading.Thread(target=controller.run, args=(stop, "pod-a"), daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: any("retrying with backoff" in line and "503" in line for line in lines), 30)
        attempts = len([r for r in world.api.requests if r.path == JOBSETS])
        time.sleep(1.5)
        assert len([r for r in world.api.requests if r.path == JOBSETS]) - attempts <= 3  # backing off, not spinning
        world.api.faults.remove(outage)
        assert wait_for(lambda: labels.STATE_ANNOTATION in world.jobset("w")["metadata"]["annotations"], 30)
        assert wait_for(lambda: any("working again" in line for line in lines), 30)
        assert thread.is_alive()
        # One line for the whole outage, from the loop (and one from the JobSet watch).
        assert len([line for line in lines if "503" in line and "reconcile" in line]) == 1
        assert len([line for line in lines if "503" in line and "watch jobsets" in line]) <= 1
    finally:
        stop.set()
        thread.join(20)
    assert not thread.is_alive()


def test_nothing_is_deleted_that_the_controller_did_not_create(world: World) -> None:
    """A node dies under a hotswap workload and under other owners' pods: the controller deletes
    its workload's Jobs and force-deletes its own pods stuck there, and nothing else."""
    controller = make_controller(world)
    submit(world, "w", "high", 1)
    run_until(world, controller, lambda: running(world, "w") == 4)
    (pool,) = world.pools_of("w")
    dead = world.nodes_of_pool(pool)[0]
    world.add_foreign_pod("daemon", dead, namespace="kube-system", resources={"cpu": "100m"})
    world.add_foreign_pod("neighbour", world.nodes_of_pool("tpu-v6e-np-2")[0], namespace="default", resources={"cpu": "1"})
    world.fail_node(dead)
    run_until(world, controller, lambda: running(world, "w", attempt=2) == 4)
    deleted = [r.path for r in world.api.requests if r.method == "DELETE"]
    assert deleted and all(p.rsplit("/", 1)[1].startswith("w-slice-") for p in deleted), deleted
    assert {p["metadata"]["name"] for p in world.pods(lambda p: p["metadata"]["name"] in ("daemon", "neighbour"))} == {"daemon", "neighbour"}


def test_errors_are_hotswap_errors_with_exit_codes() -> None:
    assert issubclass(UnreachableError, HotswapError) and UnreachableError.exit_code == 7
    assert ForbiddenError.exit_code == 6
