"""With ``--kueue``: Kueue (v0.19, played by the world from its source) admits, queues and
preempts by priority; the controller never fights it, records what Kueue decided, and adds what
Kueue lacks: restarting an admitted JobSet that lost a node, judging worker exits."""

from __future__ import annotations

import pytest
from k8s_fixtures.scenario import events, listed, make_controller, make_world, retired_jobs, run_until, running, slice_jobs, submit
from k8s_fixtures.world import World

from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes import operations as ops
from hotswap.backends.kubernetes.pod_signals import EXIT_HOLD_S


@pytest.fixture
def world() -> World:
    world = make_world(kueue=True)
    yield world
    world.close()


def test_kueue_preempts_by_priority_and_the_controller_records_it_without_looping(world: World) -> None:
    """A high-priority JobSet arrives while a low one holds the quota: Kueue evicts the low one
    (suspends its JobSet) and admits the high one, which the controller places on healthy
    slices. It writes the new states once, and then nothing at all: a JobSet Kueue keeps
    suspended is queued in Kueue, never "admitted" again each round."""
    controller = make_controller(world)
    submit(world, "low", "low", 2)
    run_until(world, controller, lambda: running(world, "low") == 8)
    submit(world, "high", "high", 2)
    run_until(world, controller, lambda: running(world, "high") == 8)
    low, high = world.state("low"), world.state("high")
    assert (low["phase"], low["preemptions"], low["attempt"]) == ("QUEUED", 1, 1)
    assert "evicted by Kueue (Preempted)" in low["status_message"]
    assert (high["phase"], high["attempt"]) == ("RUNNING", 1)
    assert world.jobset("low")["spec"]["suspend"] is True
    reserved = {c["type"]: c["status"] for c in world.kueue_workload("low")["status"]["conditions"]}
    assert reserved["QuotaReserved"] == "False" and reserved["Evicted"] == "True"  # back in Kueue's queue
    # Kueue's suspension is never undone, and nothing is rewritten: steady state writes nothing.
    mark = len(world.api.requests)
    for _ in range(5):
        assert controller.reconcile() == []
    world.advance(300, controller)
    assert world.api.writes(mark) == []
    assert world.state("low")["attempt"] == 1
    admitted = [name for name, reason, _ in events(world) if reason == "Admitted"]
    assert sorted(admitted) == ["high", "low"]  # placed once each, never again


def test_a_kueue_jobset_that_loses_a_node_is_restarted_where_kube_scheduler_finds_room(world: World) -> None:
    """The gap Kueue leaves (kueue#12701): it keeps a non-TAS workload admitted when a node under
    it fails. The controller hotswaps it onto the free healthy slice (its Jobs recreated, the
    new pods pinned there); the JobSet stays admitted, nobody suspends it."""
    controller = make_controller(world)
    submit(world, "high", "high", 2)
    run_until(world, controller, lambda: running(world, "high") == 8)
    pools = world.pools_of("high")
    free = next(p for p in ("tpu-v6e-np-0", "tpu-v6e-np-1", "tpu-v6e-np-2") if p not in pools)
    dead = world.nodes_of_pool(pools[0])[0]
    world.fail_node(dead)
    world.advance(world.nodes.grace_s + 1)
    high_jobs = slice_jobs(world, "high")
    operations = controller.reconcile()
    assert retired_jobs(operations, "high") == high_jobs and len(high_jobs) == 2  # all its Jobs recreated
    assert not any(isinstance(op, ops.PatchJobSet) and op.suspend is not None for op in operations)  # Kueue's to decide
    run_until(world, controller, lambda: running(world, "high", attempt=2) == 8)
    assert sorted(p for p in world.pools_of("high") if p) == sorted([free, pools[1]])
    state = world.state("high")
    assert (state["phase"], state["disruptions"], state["restarts"]) == ("RUNNING", 1, 0)
    for pod in world.running("high"):
        assert pod["metadata"]["annotations"][labels.RESTART_COUNT_ANNOTATION] == "1"
    assert world.jobset("high")["spec"]["suspend"] is False


def test_a_user_error_under_kueue_deactivates_the_workload_and_frees_its_quota(world: World) -> None:
    controller = make_controller(world)
    submit(world, "bad", "high", 2)
    submit(world, "next", "low", 2)
    run_until(world, controller, lambda: running(world, "bad") == 8)
    row = listed(world, "next")
    assert row["status"] == "QUEUED" and row["status_message"].startswith("queued in Kueue")  # no quota left
    world.exit(world.running("bad"), 3)
    run_until(world, controller, lambda: world.state("bad")["phase"] == "FAILED", limit_s=EXIT_HOLD_S + 30)
    run_until(world, controller, lambda: running(world, "next") == 8)
    assert world.kueue_workload("bad")["spec"]["active"] is False  # Kueue's own way to stop it
    assert world.jobset("bad")["spec"]["suspend"] is True and world.state("bad")["phase"] == "FAILED"
    assert listed(world, "bad")["status"] == "FAILED"  # not Kueue's "queued": hotswap failed it
    world.advance(5, controller)
    mark = len(world.api.requests)
    world.advance(120, controller)
    assert world.api.writes(mark) == []


def test_a_jobset_kueue_keeps_queued_while_slices_are_free_is_not_admitted_every_round(world: World) -> None:
    """Kueue's quota, not capacity, keeps a JobSet suspended: a slice is free, but the
    ClusterQueue's quota is used up. The controller must not admit it (before issue 12 it did,
    every round: the state rewritten about ten times a second, its attempt climbing)."""
    from k8s_fixtures.world.store import CLUSTER_QUEUES

    queue = world.store.items(CLUSTER_QUEUES)[0]
    queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = 32  # 2 of the 3 slices
    world.store.write(CLUSTER_QUEUES, queue)
    controller = make_controller(world)
    submit(world, "high", "high", 2)
    run_until(world, controller, lambda: running(world, "high") == 8)
    submit(world, "low", "low", 1)
    world.advance(30, controller)
    assert world.jobset("low")["spec"]["suspend"] is True
    row = listed(world, "low")
    assert (row["status"], row["attempt"]) == ("QUEUED", 0) and "queued in Kueue" in row["status_message"]
    mark = len(world.api.requests)
    for _ in range(5):
        assert controller.reconcile() == []
    assert world.api.writes(mark) == []


def test_a_scaled_down_elastic_jobset_that_finished_frees_its_quota(world: World) -> None:
    """A scaled-down elastic JobSet has a parked replica that never runs, so JobSet never
    completes it (success policy All). Once its active replicas finished the controller
    declares it done and deactivates its Kueue Workload: the parked pods go and the quota
    is free for the next JobSet."""
    controller = make_controller(world)
    submit(world, "el", "high", 3, min_slices=2)
    run_until(world, controller, lambda: running(world, "el") == 12)
    pools = world.pools_of("el")
    world.fail_node(world.nodes_of_pool(pools[2])[0])
    run_until(world, controller, lambda: world.state("el")["membership"] == 1)
    submit(world, "next", "low", 1)
    world.exit(world.running("el"), 0)
    run_until(world, controller, lambda: world.state("el")["phase"] == "SUCCESSFUL" and not world.pods_of("el"))
    assert world.kueue_workload("el")["spec"]["active"] is False
    run_until(world, controller, lambda: running(world, "next") == 4)
    assert listed(world, "el")["status"] == "SUCCESSFUL"
