"""Issue 23, items B, D and E(1), E(3): the controller against a world whose API server, kubelets
and node lifecycle behave as the real ones do on gated pods, unreachable nodes, other owners'
pods under Kueue and kubelet admission rejections."""

from __future__ import annotations

import pytest
from k8s_fixtures.scenario import events, make_controller, make_world, retired_jobs, run_until, running, submit
from k8s_fixtures.world import World
from k8s_fixtures.world.store import JOBS, NODES, PODS
from test_kubernetes_scenarios import gpu_nodes

from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes import operations as ops
from hotswap.backends.kubernetes.pod_signals import UNSCHEDULABLE_AFTER_S


@pytest.fixture
def world() -> World:
    world = make_world()
    yield world
    world.close()


def _not_scheduled(world: World, name: str) -> list[str]:
    return [m for _, r, m in events(world, name) if r == "SliceLost" and "has not been scheduled" in m]


def test_not_scheduled_counts_from_the_release_of_the_gate_not_from_the_pod_creation(world: World) -> None:
    """An elastic workload's parked replica waits behind the gate for minutes; when a slice
    frees, it is released there. Its pods then fail to schedule (someone reserved the pool): the
    controller gives them UNSCHEDULABLE_AFTER_S from the release, not from their creation."""
    controller = make_controller(world)
    world.add_foreign_pod("xpk-job-0", world.nodes_of_pool("tpu-v6e-np-2")[0])
    submit(world, "el", "high", 3, min_slices=2)
    run_until(world, controller, lambda: running(world, "el") == 8)
    assert world.pools_of("el") == ["tpu-v6e-np-0", "tpu-v6e-np-1", None]
    world.advance(UNSCHEDULABLE_AFTER_S + 30, controller)  # the parked replica's pods wait, gated
    parked = [p for p in world.pods_of("el") if p["spec"].get("schedulingGates")]
    assert len(parked) == 4
    scheduled = next(c for c in parked[0]["status"]["conditions"] if c["type"] == "PodScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "SchedulingGated")  # as the API server sets it
    for node in world.nodes_of_pool("tpu-v6e-np-2"):
        obj = world.store.peek(NODES, "", node)
        obj["spec"].setdefault("taints", []).append({"key": "example.com/reserved", "effect": "NoSchedule"})
        world.store.write(NODES, obj)
    world.store.delete(PODS, "other-team", "xpk-job-0", grace=0)
    run_until(world, controller, lambda: any(not p["spec"].get("schedulingGates") and p["metadata"]["labels"].get(labels.JOB_INDEX_LABEL) == "2"
                                             for p in world.pods_of("el")))
    released_at = world.clock.now
    pod = next(p for p in world.pods_of("el") if p["metadata"]["labels"].get(labels.JOB_INDEX_LABEL) == "2")
    scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert scheduled["reason"] == "Unschedulable"
    world.advance(UNSCHEDULABLE_AFTER_S - 10, controller)
    assert _not_scheduled(world, "el") == []  # no false alarm right after the release
    run_until(world, controller, lambda: _not_scheduled(world, "el") != [], limit_s=60)
    waited = int(_not_scheduled(world, "el")[0].split("for ")[-1].split(" s")[0])
    assert UNSCHEDULABLE_AFTER_S <= waited <= world.clock.now - released_at + 1


def _deletes_of(world: World, pod: str) -> list[str]:
    """The options (query and body) of each DELETE of ``pod`` sent to the API server."""
    found = []
    for r in world.api.requests:
        if r.method == "DELETE" and r.path.split("?")[0].endswith(f"/pods/{pod}"):
            grace = (r.query.get("gracePeriodSeconds") or [None])[0]
            if grace is None and isinstance(r.body, dict):
                grace = r.body.get("gracePeriodSeconds")
            found.append("" if grace is None else f"gracePeriodSeconds={grace}")
    return found


def test_a_worker_on_a_node_whose_gpu_was_withdrawn_gets_its_sigterm(world: World) -> None:
    """The device plugin withdraws a GPU: the node is failed for hotswap, but its kubelet still
    runs. The worker there is deleted with its grace period, so it gets SIGTERM and saves."""
    world.close()
    world = make_world(nodes=gpu_nodes(2))
    try:
        controller = make_controller(world)
        submit(world, "g", "high", 1, device_type="h100-80gb-8")
        run_until(world, controller, lambda: running(world, "g") == 1)
        pod = world.running("g")[0]
        node = pod["spec"]["nodeName"]
        stored = world.store.peek(NODES, "", node)
        stored["status"]["allocatable"]["nvidia.com/gpu"] = "7"
        world.store.write(NODES, stored)
        run_until(world, controller, lambda: running(world, "g", attempt=2) == 1 and world.store.peek(PODS, world.namespace, pod["metadata"]["name"]) is None)
        assert pod["metadata"]["name"] in world.nodes.sigterm  # it saved before it stopped
        assert "gracePeriodSeconds=0" not in " ".join(_deletes_of(world, pod["metadata"]["name"]))
    finally:
        world.close()


def test_pods_on_an_unreachable_node_get_their_grace_period_before_they_are_force_deleted(world: World) -> None:
    """A node stops answering (a network partition: its container may still run). Its pods are
    deleted with their grace period first; only when that is over and they are still there are
    they force-deleted, and the Event says why."""
    controller = make_controller(world)
    submit(world, "w", "high", 1)
    run_until(world, controller, lambda: running(world, "w") == 4)
    dead = world.nodes_of_pool(world.pools_of("w")[0])[0]
    stuck = next(p["metadata"]["name"] for p in world.running("w") if p["spec"]["nodeName"] == dead)
    world.fail_node(dead)
    world.advance(world.nodes.grace_s + 1, controller)  # NotReady: the workload is hotswapped
    run_until(world, controller, lambda: _deletes_of(world, stuck) != [], limit_s=30)
    assert "gracePeriodSeconds=0" not in _deletes_of(world, stuck)[0]  # SIGTERM first, for a kubelet that may still hear
    pod = world.store.peek(PODS, world.namespace, stuck)
    grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
    world.advance(grace - 5, controller)
    assert world.store.peek(PODS, world.namespace, stuck) is not None  # Terminating: within its grace
    assert all("gracePeriodSeconds=0" not in q for q in _deletes_of(world, stuck))
    run_until(world, controller, lambda: world.store.peek(PODS, world.namespace, stuck) is None, limit_s=40)
    assert "gracePeriodSeconds=0" in _deletes_of(world, stuck)[-1]
    said = [m for _, r, m in events(world, "w") if r == "PodForceDeleted"]
    assert said == [f"pod {stuck} force-deleted: its node {dead} failed and its grace period is over"]
    run_until(world, controller, lambda: running(world, "w", attempt=2) == 4)



def test_pods_on_a_deleted_node_are_force_deleted_at_once(world: World) -> None:
    """The VM is deleted with its Node object: no kubelet will ever confirm its pods' deletion.
    The controller force-deletes them at once (PodGC would wait 40 s), and says why."""
    controller = make_controller(world)
    submit(world, "w", "high", 1)
    run_until(world, controller, lambda: running(world, "w") == 4)
    gone = world.nodes_of_pool(world.pools_of("w")[0])[0]
    stuck = next(p["metadata"]["name"] for p in world.running("w") if p["spec"]["nodeName"] == gone)
    world.fail_node(gone)
    world.delete_node(gone)
    world.advance(3, controller)
    assert world.store.peek(PODS, world.namespace, stuck) is None
    assert "gracePeriodSeconds=0" in _deletes_of(world, stuck)[-1]
    said = [m for _, r, m in events(world, "w") if r == "PodForceDeleted"]
    assert said == [f"pod {stuck} force-deleted: its node {gone} was deleted"]
    run_until(world, controller, lambda: running(world, "w", attempt=2) == 4)

def test_under_kueue_a_slice_another_teams_pod_holds_is_never_used() -> None:
    """With --kueue too, a pod of another owner holding TPUs on a node makes its slice unusable:
    the workload is placed elsewhere, and kube-scheduler never preempts the other team's pod
    for it (the README's promise)."""
    world = make_world(kueue=True)
    try:
        controller = make_controller(world)
        node = world.nodes_of_pool("tpu-v6e-np-0")[0]
        world.add_foreign_pod("xpk-job-0", node, priority=0)
        submit(world, "a", "high", 1)
        run_until(world, controller, lambda: running(world, "a") == 4)
        assert world.pools_of("a") != ["tpu-v6e-np-0"]
        foreign = world.store.peek(PODS, "other-team", "xpk-job-0")
        assert foreign is not None and "deletionTimestamp" not in foreign["metadata"]  # never preempted
    finally:
        world.close()


def test_our_own_pods_listed_only_among_all_pods_are_not_taken_for_another_owners() -> None:
    """The controller lists its pods, then every namespace's: a pod of its JobSets created in
    between (a Job recreated; under Kueue, pods Kueue just admitted) is in the second list only.
    It is never taken for another owner's pod, so the slice is not lost for it."""
    world = make_world(kueue=True)
    try:
        controller = make_controller(world)
        submit(world, "a", "high", 1)
        run_until(world, controller, lambda: running(world, "a") == 4)
        client = controller.client
        listed_before = client.list_pods
        client.list_pods = lambda selector: [p for p in listed_before(selector) if not p["metadata"]["name"].startswith("a-slice-0-0-")]
        operations = controller.reconcile()
        assert [op for op in operations if isinstance(op, ops.RecordEvent) and "another owner" in op.message] == []
        assert retired_jobs(operations, "a") == set()  # not hotswapped away from itself
        assert world.state("a")["attempt"] == 1
    finally:
        world.close()


def test_a_pod_the_kubelet_rejects_without_an_exit_code_is_a_hardware_failure_hotswapped_uncharged(world: World) -> None:
    """A TPU host's device plugin cannot allocate its failing chips: its kubelet rejects the pod
    (UnexpectedAdmissionError, no exit code) while the node stays Ready. That is the machine's
    failure: the workload is hotswapped off that slice, uncharged; JobSet does not fail it
    (max_restarts 0) nor restart it."""
    controller = make_controller(world)
    bad = world.nodes_of_pool("tpu-v6e-np-0")[1]
    world.nodes.reject_pods(bad)  # the node stays Ready: nothing in its status tells
    submit(world, "w", "high", 1)
    # Released and bound; the kubelet of ``bad`` answers on the next tick (world/nodes.py).
    run_until(world, controller, lambda: len([p for p in world.pods_of("w") if p["spec"].get("nodeName")]) == 4)
    world.advance(1)  # the rejection, while the controller is busy for a while
    assert any(p["status"].get("reason") == "UnexpectedAdmissionError" for p in world.pods_of("w", live=False))
    assert world.state("w")["slices"] == ["tpu-v6e-np-0"]
    world.advance(15)  # the Job and JobSet do not fail meanwhile
    assert world.finished("w") is None
    assert [j["metadata"]["name"] for j in world.store.list(JOBS) if any(c["type"] in ("FailureTarget", "Failed") for c in j["status"].get("conditions") or [])] == []
    assert running(world, "w") == 3  # the other workers were not stopped
    run_until(world, controller, lambda: running(world, "w", attempt=2) == 4)
    assert world.pools_of("w")[0] != "tpu-v6e-np-0"
    assert world.finished("w") is None  # JobSet never failed it
    assert world.jobset("w")["status"].get("restarts", 0) == 0  # nor restarted it
    state = world.state("w")
    assert (state["phase"], state["restarts"], state["disruptions"]) == ("RUNNING", 0, 1)  # uncharged
    assert any(f"the kubelet of node {bad} rejected pod" in m and "UnexpectedAdmissionError" in m for _, r, m in events(world, "w") if r == "SliceLost")
