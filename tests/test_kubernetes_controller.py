"""The Kubernetes controller's decisions, end to end: the real :class:`KubeController` and
:class:`KubeClient` against the world (an HTTP API server with JobSet, the Job controller,
kube-scheduler, kubelets and node lifecycle, all on a virtual clock) on recorded-style GKE
Node objects of three v6e-16 node pools."""

from __future__ import annotations

import json

import pytest
from k8s_fixtures.scenario import POOLS, events, make_controller, make_world, retired_jobs, run_until, running, slice_jobs, submit
from k8s_fixtures.world import World

from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes import operations as ops
from hotswap.core import events as ev
from hotswap.core.scheduler import decide
from hotswap.backends.kubernetes.controller.loop import KubeController


@pytest.fixture
def world() -> World:
    world = make_world()
    yield world
    world.close()


@pytest.fixture
def controller(world: World) -> KubeController:
    return make_controller(world)


def running_both(world: World, controller: KubeController) -> tuple[list[str], str]:
    submit(world, "low", "low", 1)
    submit(world, "high", "high", 2)
    run_until(world, controller, lambda: len(world.running("high")) == 8 and len(world.running("low")) == 4)
    world.advance(3, controller)  # the round after the release records it
    high, low = world.pools_of("high"), world.pools_of("low")
    assert world.state("high")["phase"] == "RUNNING" and world.state("low")["phase"] == "RUNNING"
    return high, low[0]  # type: ignore[return-value]


def test_new_jobsets_are_admitted_by_priority_and_pinned_to_the_cores_slices(world: World, controller: KubeController) -> None:
    high, low = running_both(world, controller)
    assert sorted([*high, low]) == POOLS
    assert world.state("high")["slices"] == high  # replica i runs on slices[i]
    for pod in world.running("high"):
        annotations = pod["metadata"]["annotations"]
        assert not pod["spec"].get("schedulingGates")
        assert annotations[labels.SLICE_ANNOTATION] == world.node_label(pod["spec"]["nodeName"], labels.NODE_POOL_LABEL)
        assert (annotations[labels.ATTEMPT_ANNOTATION], annotations[labels.RESTART_COUNT_ANNOTATION]) == ("1", "0")
    assert all(not js["spec"]["suspend"] for js in (world.jobset("high"), world.jobset("low")))
    assert {("high", "Admitted"), ("low", "Admitted")} <= {(n, r) for n, r, _ in events(world)}


def test_in_line_cluster_needs_no_operation(world: World, controller: KubeController) -> None:
    running_both(world, controller)
    mark = len(world.api.requests)
    assert controller.reconcile() == []
    # A new controller (a restart, or a new leader) derives the same state from the objects alone.
    assert make_controller(world).reconcile() == []
    assert world.api.writes(mark) == []


@pytest.mark.parametrize("fault", ["not-ready", "cordon", "drain"])
def test_node_fault_under_high_preempts_low_and_restarts_high_on_its_pool(world: World, controller: KubeController, fault: str) -> None:
    high, low = running_both(world, controller)
    broken = world.nodes_of_pool(high[0])[2]
    if fault == "not-ready":
        world.fail_node(broken)
        world.advance(world.nodes.grace_s + 1)  # the node lifecycle controller marks it NotReady
    elif fault == "cordon":
        world.cordon(broken)
        world.settle()
    else:
        world.drain(broken)
        world.settle()
    stuck = [p["metadata"]["name"] for p in world.pods_of("high") if p["spec"].get("nodeName") == broken]

    high_jobs = slice_jobs(world, "high")
    operations = controller.reconcile()

    # Whole, and kept queued: suspended (with the record of why, in the same patch), not deleted.
    assert any(isinstance(op, ops.PatchJobSet) and op.jobset == "low" and op.suspend is True and labels.STATE_ANNOTATION in op.annotations
               for op in operations)
    assert retired_jobs(operations, "high") == high_jobs and len(high_jobs) == 2  # all its Jobs recreated
    deleted = [op for op in operations if isinstance(op, ops.DeletePod)]
    if fault == "not-ready":  # deleted with its grace period first: forced only once that is over
        assert [(op.pod, op.force) for op in deleted] == [(name, False) for name in stuck]
    else:
        assert deleted == []  # stopped gracefully by JobSet instead
    run_until(world, controller, lambda: running(world, "high", attempt=2) == 8)
    assert world.pools_of("high") == [low, high[1]]  # the lost replica takes low's pool; the other stays
    assert world.state("high")["restarts"] == 0 and world.state("high")["disruptions"] == 1
    low_state = world.state("low")
    assert low_state["phase"] == "QUEUED" and low_state["preemptions"] == 1
    assert "preempted by high" in low_state["status_message"]
    assert world.jobset("low")["spec"]["suspend"] is True and world.pods_of("low") == []

    # Repaired: the pool is whole again and the low workload resumes on it.
    if fault == "not-ready":
        world.repair_node(broken)
    else:
        world.cordon(broken, on=False)
    run_until(world, controller, lambda: len(world.running("low")) == 4)
    assert world.pools_of("low") == [high[0]]
    assert world.state("low")["phase"] == "RUNNING"
    assert world.finished("high") is None and world.finished("low") is None


def test_free_spare_slice_is_used_before_anyone_is_preempted(world: World, controller: KubeController) -> None:
    submit(world, "high", "high", 2)
    run_until(world, controller, lambda: len(world.running("high")) == 8)
    high = world.pools_of("high")
    spare = next(p for p in POOLS if p not in high)
    world.fail_node(world.nodes_of_pool(high[1])[0])
    run_until(world, controller, lambda: running(world, "high", attempt=2) == 8)
    assert world.pools_of("high") == [high[0], spare]
    assert world.state("high")["preemptions"] == 0 and world.state("high")["disruptions"] == 1


def test_no_capacity_requeues_and_resumes_when_repaired(world: World, controller: KubeController) -> None:
    submit(world, "big", "high", 3)
    run_until(world, controller, lambda: len(world.running("big")) == 12)
    broken = world.nodes_of_pool(world.pools_of("big")[1])[0]
    world.fail_node(broken)
    run_until(world, controller, lambda: world.state("big")["phase"] == "QUEUED")
    assert "no healthy capacity" in world.state("big")["status_message"]
    assert world.jobset("big")["spec"]["suspend"] is True
    world.repair_node(broken)
    run_until(world, controller, lambda: running(world, "big", attempt=2) == 12)
    assert world.state("big")["phase"] == "RUNNING"


def test_blocking_recreate_starts_new_pods_only_after_old_ones_are_gone(world: World, controller: KubeController) -> None:
    submit(world, "low", "low", 1)
    submit(world, "high", "high", 2, restart_strategy="BlockingRecreate")
    run_until(world, controller, lambda: len(world.running("high")) == 8 and len(world.running("low")) == 4)
    world.advance(3, controller)  # the round after the release records it
    high, low = world.pools_of("high"), world.pools_of("low")[0]
    world.nodes.stop_after_s = 20.0  # the old workers take a while to checkpoint and stop
    world.cordon(world.nodes_of_pool(high[0])[0])
    run_until(world, controller, lambda: world.state("high")["phase"] == "RESTARTING")
    world.advance(10, controller)
    assert world.pods(lambda p: p["metadata"]["labels"].get(labels.JOBSET_NAME_LABEL) == "high" and "deletionTimestamp" in p["metadata"])
    new = [p for p in world.pods_of("high") if p["metadata"]["annotations"].get(labels.ATTEMPT_ANNOTATION) != "1"]
    # Nothing new starts meanwhile: the Jobs are deleted in the foreground, so JobSet recreates
    # them (and their pods) only once the old pods are gone; any new pod waits behind the gate.
    assert all(p["spec"].get("schedulingGates") for p in new)
    run_until(world, controller, lambda: running(world, "high", attempt=2) == 8)
    assert world.state("high")["phase"] == "RUNNING" and world.pools_of("high") == [low, high[1]]


def test_elastic_workload_scales_down_without_restart_and_grows_back(world: World, controller: KubeController) -> None:
    submit(world, "el", "high", 3, min_slices=2)
    run_until(world, controller, lambda: running(world, "el") == 12)
    pools = world.pools_of("el")
    survivors = {p["metadata"]["name"] for p in world.running("el") if p["metadata"]["labels"][labels.JOB_INDEX_LABEL] != "1"
                 and p["metadata"]["labels"][labels.REPLICATED_JOB_NAME_LABEL] == "slice"}
    broken = world.nodes_of_pool(pools[1])[0]
    world.fail_node(broken)
    run_until(world, controller, lambda: world.state("el")["membership"] == 1)
    # The lost replica's Job is deleted in the foreground: JobSet recreates it (and its Job its
    # pods, parked) once the pod on the failed node is gone, after its grace period.
    replica_1 = lambda: [p for p in world.pods_of("el") if p["metadata"]["labels"][labels.JOB_INDEX_LABEL] == "1"]  # noqa: E731
    run_until(world, controller, lambda: len(replica_1()) == 4, limit_s=world.nodes.grace_s + 60)
    world.advance(10, controller)
    assert survivors <= {p["metadata"]["name"] for p in world.running("el")}  # the others keep running
    assert world.pools_of("el") == [pools[0], None, pools[2]]  # replica 1 parked behind its gate
    parked = replica_1()
    assert len(parked) == 4 and all(p["spec"].get("schedulingGates") for p in parked)  # all four: none refused
    membership = json.loads(world.pods(lambda p: p["metadata"]["name"] == sorted(survivors)[0])[0]["metadata"]["annotations"][labels.MEMBERSHIP_ANNOTATION])
    assert membership["slices"] == [pools[0], pools[2]] and membership["generation"] == 1
    world.repair_node(broken)
    run_until(world, controller, lambda: running(world, "el") == 12)
    assert world.pools_of("el") == pools
    membership = json.loads(world.pods(lambda p: p["metadata"]["name"] == sorted(survivors)[0])[0]["metadata"]["annotations"][labels.MEMBERSHIP_ANNOTATION])
    assert membership["slices"] == pools and membership["generation"] == 2


def test_workload_the_cluster_can_never_hold_is_rejected(world: World, controller: KubeController) -> None:
    submit(world, "huge", "high", 4)
    world.advance(2, controller)
    rejected = world.jobset("huge")["metadata"]["annotations"][labels.REJECTED_ANNOTATION]
    assert "it needs 4 slice(s) of v6e-16 and the cluster has only 3" in rejected
    assert world.jobset("huge")["spec"]["suspend"] is True


def test_deleted_node_pool_moves_its_workload(world: World, controller: KubeController) -> None:
    submit(world, "high", "high", 1)
    run_until(world, controller, lambda: len(world.running("high")) == 4)
    (pool,) = world.pools_of("high")
    for name in world.nodes_of_pool(pool):
        world.delete_node(name)
    run_until(world, controller, lambda: running(world, "high", attempt=2) == 4)
    assert world.pools_of("high")[0] not in (None, pool)


def test_observe_turns_live_losses_into_core_events(world: World, controller: KubeController) -> None:
    high, _ = running_both(world, controller)
    failed = world.nodes_of_pool(high[0])[0]
    cordoned = world.nodes_of_pool(high[0])[1]
    world.fail_node(failed)
    world.advance(world.nodes.grace_s + 1)
    world.cordon(cordoned)
    world.settle()
    observation = controller.observe()
    assert ev.NodeFailed(failed) in observation.events and ev.NodeCordoned(cordoned) in observation.events
    decision = decide(observation.snapshot, observation.events, observation.now)
    assert {type(a).__name__ for a in decision.actions} >= {"Restart", "Preempt"}
    assert observation.causes["high"][0].startswith(f"node {failed}: not ready: Ready=Unknown")


def test_run_loop_leads_reconciles_and_lets_go() -> None:
    """The loop as ``controller run`` runs it, on real threads and the real clock: it takes the
    Lease, reconciles at once, and releases the Lease on the way out."""
    import threading

    world = make_world()
    try:
        world.api.watch_timeout_cap_s = 0.5
        controller = KubeController(world.client(), "c", log=lambda line: None)
        submit(world, "high", "high", 1)
        stop = threading.Event()
        thread = threading.Thread(target=controller.run, args=(stop, "pod-a"), daemon=True)
        thread.start()
        for _ in range(400):  # the first reconcile comes at once; poll for its effect, no fixed sleep
            if labels.STATE_ANNOTATION in world.jobset("high")["metadata"]["annotations"]:
                break
            stop.wait(0.05)
        stop.set()
        thread.join(20)
        assert not thread.is_alive()
        assert world.state("high")["phase"] == "RUNNING"
        lease = world.client().get_lease(labels.CONTROLLER_NAME)
        assert lease is not None and lease["spec"].get("holderIdentity") is None  # released on the way out
    finally:
        world.close()
