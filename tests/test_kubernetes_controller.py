"""The Kubernetes controller's decisions, on recorded GKE Node objects and JobSet/Job/Pod objects
shaped as JobSet and the Job controller create them (``k8s_fixtures/world.py`` plays the cluster,
the real :class:`KubeController` reconciles against it)."""

from __future__ import annotations

import json

import pytest
from k8s_fixtures.world import World, load_nodes, set_ready

from hotswap.api.spec import workload_spec
from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes import operations as ops
from hotswap.backends.kubernetes.lease import LeaseRecord, next_step, read_lease, lease_body, released
from hotswap.backends.kubernetes.render import render_jobset
from hotswap.backends.kubernetes.settings import KubeSettings
from hotswap.core.scheduler import decide
from hotswap.runtime.kube_controller import KubeController

POOLS = ["tpu-v6e-np-0", "tpu-v6e-np-1", "tpu-v6e-np-2"]


def submit(world: World, name: str, priority: str, slices: int, **fields) -> None:
    spec = workload_spec(name=name, command="python3 train.py", device_type="v6e-16", num_slices=slices, priority=priority, **fields)
    world.apply(render_jobset(spec, "c", world.settings))


def run(world: World, controller: KubeController, rounds: int = 4, finish_terminations: bool = True) -> list[ops.Operation]:
    """Reconcile and let the cluster react, until nothing more happens."""
    done: list[ops.Operation] = []
    for _ in range(rounds):
        operations = controller.reconcile()
        done.extend(operations)
        world.settle(finish_terminations=finish_terminations)
    return done


@pytest.fixture
def world() -> World:
    return World(load_nodes())


@pytest.fixture
def controller(world: World) -> KubeController:
    return KubeController(world, "c", clock=lambda: world.clock)  # type: ignore[arg-type]


def running_both(world: World, controller: KubeController) -> tuple[list[str], str]:
    submit(world, "low", "low", 1)
    submit(world, "high", "high", 2)
    run(world, controller)
    high, low = world.pools_of("high"), world.pools_of("low")
    assert None not in high and None not in low
    assert world.state("high")["phase"] == "RUNNING" and world.state("low")["phase"] == "RUNNING"
    return high, low[0]  # type: ignore[return-value]


def test_new_jobsets_are_admitted_by_priority_and_pinned_to_the_cores_slices(world: World, controller: KubeController) -> None:
    high, low = running_both(world, controller)
    assert sorted([*high, low]) == POOLS
    assert world.state("high")["slices"] == high  # replica i runs on slices[i]
    for pod in world.live_pods("high"):
        assert not pod["spec"].get("schedulingGates")
        assert pod["metadata"]["annotations"][labels.SLICE_ANNOTATION] == world.nodes[pod["spec"]["nodeName"]]["metadata"]["labels"][labels.NODE_POOL_LABEL]
    assert all(not js["spec"]["suspend"] for js in world.jobsets.values())
    assert {("high", "Admitted"), ("low", "Admitted")} <= {(n, r) for n, r, _ in world.events}


def test_in_line_cluster_needs_no_operation(world: World, controller: KubeController) -> None:
    running_both(world, controller)
    assert controller.reconcile() == []
    # A new controller (a restart, or a new leader) derives the same state from the objects alone.
    assert KubeController(world, "c", clock=lambda: world.clock).reconcile() == []  # type: ignore[arg-type]


@pytest.mark.parametrize("fault", ["not-ready", "cordon"])
def test_node_fault_under_high_preempts_low_and_restarts_high_on_its_pool(world: World, controller: KubeController, fault: str) -> None:
    high, low = running_both(world, controller)
    broken = world.node_of_pool(high[0], 2)
    if fault == "not-ready":
        set_ready(world.nodes[broken], False)
    else:
        world.nodes[broken]["spec"]["unschedulable"] = True
    stuck = [p["metadata"]["name"] for p in world.pods.values() if p["spec"].get("nodeName") == broken]

    operations = controller.reconcile()

    assert ops.SetSuspend("low", True) in operations  # whole, and kept queued: suspended, not deleted
    assert ops.RecreateJobs("high") in operations
    assert "low" in world.jobsets
    if fault == "cordon":
        assert not any(isinstance(op, ops.ForceDeletePod) for op in operations)  # drained gracefully instead
    if fault == "not-ready":  # its pod can never finish terminating on a machine that is gone
        assert [ops.ForceDeletePod(name) for name in stuck] == [op for op in operations if isinstance(op, ops.ForceDeletePod)]
    run(world, controller)
    assert world.pools_of("high") == [low, high[1]]  # the lost replica takes low's pool; the other stays
    assert world.state("high")["restarts"] == 0 and world.state("high")["disruptions"] == 1
    low_state = world.state("low")
    assert low_state["phase"] == "QUEUED" and low_state["preemptions"] == 1
    assert "preempted by high" in low_state["status_message"]
    assert world.jobsets["low"]["spec"]["suspend"] is True and world.live_pods("low") == []

    # Repaired: the pool is whole again and the low workload resumes on it.
    if fault == "not-ready":
        set_ready(world.nodes[broken], True)
    else:
        world.nodes[broken]["spec"].pop("unschedulable")
    operations = run(world, controller)
    assert ops.SetSuspend("low", False) in operations
    assert world.pools_of("low") == [high[0]]
    assert world.state("low")["phase"] == "RUNNING"


def test_free_spare_slice_is_used_before_anyone_is_preempted(world: World, controller: KubeController) -> None:
    submit(world, "high", "high", 2)
    run(world, controller)
    high = world.pools_of("high")
    spare = next(p for p in POOLS if p not in high)
    set_ready(world.nodes[world.node_of_pool(high[1])], False)
    operations = run(world, controller)
    assert not any(isinstance(op, ops.SetSuspend) for op in operations)
    assert world.pools_of("high") == [high[0], spare]


def test_no_capacity_requeues_and_resumes_when_repaired(world: World, controller: KubeController) -> None:
    submit(world, "big", "high", 3)
    run(world, controller)
    pools = world.pools_of("big")
    broken = world.node_of_pool(pools[1])
    set_ready(world.nodes[broken], False)
    run(world, controller)
    assert world.state("big")["phase"] == "QUEUED" and "no healthy capacity" in world.state("big")["status_message"]
    assert world.jobsets["big"]["spec"]["suspend"] is True
    set_ready(world.nodes[broken], True)
    run(world, controller)
    assert world.state("big")["phase"] == "RUNNING" and None not in world.pools_of("big")


def test_blocking_recreate_starts_new_pods_only_after_old_ones_are_gone(world: World, controller: KubeController) -> None:
    submit(world, "low", "low", 1)
    submit(world, "high", "high", 2, restart_strategy="BlockingRecreate")
    run(world, controller)
    high, low = world.pools_of("high"), world.pools_of("low")[0]
    set_ready(world.nodes[world.node_of_pool(high[0])], False)
    # The old pods take their grace period to stop (they checkpoint); nothing new starts meanwhile.
    run(world, controller, rounds=3, finish_terminations=False)
    assert world.state("high")["phase"] == "RESTARTING"
    new = [p for p in world.pods.values() if p["metadata"]["labels"][labels.JOBSET_NAME_LABEL] == "high" and "deletionTimestamp" not in p["metadata"]]
    assert new and all(p["spec"].get("schedulingGates") for p in new)
    world.finish_terminations()
    run(world, controller)
    assert world.state("high")["phase"] == "RUNNING" and world.pools_of("high") == [low, high[1]]


def test_elastic_workload_scales_down_without_restart_and_grows_back(world: World, controller: KubeController) -> None:
    submit(world, "el", "high", 3, min_slices=2)
    run(world, controller)
    pools = world.pools_of("el")
    survivors = {p["metadata"]["name"] for p in world.live_pods("el") if p["metadata"]["labels"][labels.JOB_INDEX_LABEL] != "1"}
    broken = world.node_of_pool(pools[1])
    set_ready(world.nodes[broken], False)
    operations = run(world, controller)
    assert ops.RecreateJobs("el", (1,)) in operations  # only the lost replica's Job
    assert survivors <= set(world.pods)  # the others keep running
    assert world.pools_of("el") == [pools[0], None, pools[2]]  # replica 1 parked behind its gate
    membership = json.loads(world.pods[sorted(survivors)[0]]["metadata"]["annotations"][labels.MEMBERSHIP_ANNOTATION])
    assert membership["slices"] == [pools[0], pools[2]] and membership["generation"] == 1
    set_ready(world.nodes[broken], True)
    run(world, controller)
    assert world.pools_of("el") == pools
    membership = json.loads(world.pods[sorted(survivors)[0]]["metadata"]["annotations"][labels.MEMBERSHIP_ANNOTATION])
    assert membership["slices"] == pools and membership["generation"] == 2


def test_workload_the_cluster_can_never_hold_is_rejected(world: World, controller: KubeController) -> None:
    submit(world, "huge", "high", 4)
    operations = controller.reconcile()
    rejected = [op for op in operations if isinstance(op, ops.SetAnnotations) and labels.REJECTED_ANNOTATION in op.annotations]
    assert rejected and "it needs 4 slice(s) of v6e-16 and the cluster has only 3" in rejected[0].annotations[labels.REJECTED_ANNOTATION]
    assert world.jobsets["huge"]["spec"]["suspend"] is True


def test_deleted_node_pool_moves_its_workload(world: World, controller: KubeController) -> None:
    submit(world, "high", "high", 1)
    run(world, controller)
    (pool,) = world.pools_of("high")
    for name in [n for n, o in list(world.nodes.items()) if o["metadata"]["labels"].get(labels.NODE_POOL_LABEL) == pool]:
        del world.nodes[name]
    run(world, controller)
    (now,) = world.pools_of("high")
    assert now not in (None, pool)


def test_kueue_mode_only_restarts_what_lost_a_node() -> None:
    settings = KubeSettings(kueue=True)
    world = World(load_nodes(), settings)
    controller = KubeController(world, "c", clock=lambda: world.clock)  # type: ignore[arg-type]
    submit(world, "high", "high", 2)
    submit(world, "low", "low", 1)
    for name in ("high", "low"):  # Kueue admits them, highest priority first
        world.jobsets[name]["spec"]["suspend"] = False
        world.settle()
    assert None not in world.pools_of("high")
    first = controller.reconcile()
    assert first and all(isinstance(op, ops.SetAnnotations) for op in first)  # it only records what it sees
    assert world.state("high")["phase"] == "RUNNING"
    high = world.pools_of("high")
    set_ready(world.nodes[world.node_of_pool(high[0])], False)
    operations = controller.reconcile()
    assert ops.RecreateJobs("high") in operations
    assert not any(isinstance(op, ops.SetSuspend) for op in operations)  # Kueue owns suspension
    assert not any(isinstance(op, ops.PlacePod) for op in operations)


def test_observe_turns_live_losses_into_core_events(world: World, controller: KubeController) -> None:
    high, _ = running_both(world, controller)
    failed = world.node_of_pool(high[0], 0)
    cordoned = world.node_of_pool(high[0], 1)
    set_ready(world.nodes[failed], False)
    world.nodes[cordoned]["spec"]["unschedulable"] = True
    observation = controller.observe()
    from hotswap.core import events as ev

    assert ev.NodeFailed(failed) in observation.events and ev.NodeCordoned(cordoned) in observation.events
    decision = decide(observation.snapshot, observation.events, observation.now)
    assert {type(a).__name__ for a in decision.actions} >= {"Restart", "Preempt"}


# ---------------------------------------------------------------------- leader election


def test_lease_state_machine() -> None:
    now = 1000.0
    first = next_step(None, "a", now, 15)
    assert first.action == "create" and first.record.holder == "a"
    held = first.record
    assert next_step(held, "b", now + 5, 15).action == "wait"  # a holds it and renews
    renewed = next_step(held, "a", now + 5, 15)
    assert renewed.action == "update" and renewed.record.renewed == now + 5 and renewed.record.transitions == 0
    taken = next_step(held, "b", now + 16, 15)  # a stopped renewing: b takes over
    assert taken.action == "update" and taken.record.holder == "b" and taken.record.transitions == 1
    free = released(held, "a")
    assert free is not None and next_step(free, "b", now + 1, 15).action == "update"
    assert released(held, "b") is None


def test_lease_round_trips_through_its_api_object() -> None:
    record = LeaseRecord("pod-a", 1000.5, 1010.25, 15, 3, "42")
    body = lease_body("hotswap-controller", "default", record)
    assert body["metadata"]["resourceVersion"] == "42"  # optimistic concurrency on every write
    again = read_lease(body)
    assert again == record


def test_run_loop_leads_reconciles_and_lets_go(world: World) -> None:
    import threading

    controller = KubeController(world, "c")  # type: ignore[arg-type]
    submit(world, "high", "high", 1)
    stop = threading.Event()
    thread = threading.Thread(target=controller.run, args=(stop, "pod-a"), daemon=True)
    thread.start()
    for _ in range(200):  # the first reconcile comes at once; poll for its effect, no fixed sleep
        if labels.STATE_ANNOTATION in world.jobsets["high"]["metadata"]["annotations"]:
            break
        stop.wait(0.05)
    stop.set()
    thread.join(10)
    assert not thread.is_alive()
    assert world.state("high")["phase"] == "RUNNING"
    assert world.lease is not None and world.lease["spec"]["holderIdentity"] is None  # released on the way out
