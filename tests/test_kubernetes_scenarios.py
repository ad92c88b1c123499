"""The scenarios of issue 12, end to end: the real controller against the world, which plays
JobSet v0.12, the Job controller, kube-scheduler, kubelets, node lifecycle and Kueue v0.19 as
their sources do. Each test states the behaviour a user relies on."""

from __future__ import annotations

import pytest
from k8s_fixtures.scenario import events, make_controller, make_world, run_until, running, submit
from k8s_fixtures.world import World
from k8s_fixtures.world.admission import JOBSET_NAME
from k8s_fixtures.world.store import JOBS

from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.pod_signals import EXIT_HOLD_S
from hotswap.backends.kubernetes.views import view_of
from hotswap.backends.kubernetes.live_objects import read_jobset


@pytest.fixture
def world() -> World:
    world = make_world()
    yield world
    world.close()


def seed_000(world: World, controller) -> tuple[list[str], str]:
    """Seed 000: a high-priority JobSet on two v6e-16 slices, a low-priority one on the third,
    BlockingRecreate, maxRestarts 10."""
    submit(world, "low-jax-trillium", "low", 1, restart_strategy="BlockingRecreate", max_restarts=10)
    submit(world, "high-jax-trillium", "high", 2, restart_strategy="BlockingRecreate", max_restarts=10)
    run_until(world, controller, lambda: running(world, "high-jax-trillium") == 8 and running(world, "low-jax-trillium") == 4)
    return world.pools_of("high-jax-trillium"), world.pools_of("low-jax-trillium")[0]  # type: ignore[return-value]


def test_seed_000_hotswap_survives_the_collateral_exits_of_a_node_failure(world: World) -> None:
    """A node under the high-priority job dies. Its peers lose their collective and exit 1
    within seconds, 40 s before Kubernetes marks the node NotReady. The exits must not fail
    (or charge) the JobSet: once the node is NotReady the job is hotswapped onto the low job's
    slice, the low job is preempted whole, and it resumes when the node is repaired."""
    controller = make_controller(world)
    high, low = seed_000(world, controller)
    dead = world.nodes_of_pool(high[0])[1]
    world.fail_node(dead)
    world.advance(3, controller)
    peers = [p for p in world.running("high-jax-trillium") if p["spec"]["nodeName"] != dead]
    world.exit(peers, 1)  # "lost a peer": an ordinary error code, as JAX/MaxText exit
    run_until(world, controller, lambda: running(world, "high-jax-trillium", attempt=2) == 8, limit_s=300)
    assert world.finished("high-jax-trillium") is None  # JobSet never failed it
    state = world.state("high-jax-trillium")
    assert (state["phase"], state["restarts"], state["disruptions"], state["attempt"]) == ("RUNNING", 0, 1, 2)
    assert world.pools_of("high-jax-trillium") == [low, high[1]]
    assert world.jobset("high-jax-trillium")["status"].get("restartsCountTowardsMax", 0) == 0
    low_state = world.state("low-jax-trillium")
    assert (low_state["phase"], low_state["preemptions"]) == ("QUEUED", 1)
    restarted = [p for p in world.running("high-jax-trillium")]
    assert {p["metadata"]["annotations"][labels.RESTART_COUNT_ANNOTATION] for p in restarted} == {"1"}
    # The held exits, of attempt 1, are never judged.
    world.advance(EXIT_HOLD_S + 5, controller)
    assert world.state("high-jax-trillium")["phase"] == "RUNNING" and world.state("high-jax-trillium")["attempt"] == 2
    world.repair_node(dead)
    run_until(world, controller, lambda: running(world, "low-jax-trillium", attempt=2) == 4)
    assert world.pools_of("low-jax-trillium") == [high[0]]


def test_a_user_error_fails_the_workload_once_no_node_failure_explains_it(world: World) -> None:
    controller = make_controller(world)
    submit(world, "w", "high", 2, max_restarts=5)
    run_until(world, controller, lambda: running(world, "w") == 8)
    world.exit(world.running("w"), 1)
    world.advance(EXIT_HOLD_S - 10, controller)
    assert world.state("w")["phase"] == "RUNNING"  # held: a node failure could still explain it
    run_until(world, controller, lambda: world.state("w")["phase"] == "FAILED", limit_s=30)
    state = world.state("w")
    assert "exit code 1 is not a restart code" in state["status_message"] and state["restarts"] == 0
    run_until(world, controller, lambda: not world.pods_of("w"))
    assert world.jobset("w")["spec"]["suspend"] is True  # its slices are free; the record stays
    view = view_of(read_jobset(world.jobset("w")), {})
    assert view["status"] == "FAILED" and view["slices"] == []
    assert ("w", "Failed") in {(n, r) for n, r, _ in events(world)}
    world.advance(30, controller)  # its last workers' stop is recorded
    mark = len(world.api.requests)
    world.advance(120, controller)
    assert world.api.writes(mark) == []  # then it stays failed, quietly


def test_a_restart_code_restarts_in_place_charged_and_the_worker_knows_its_restart_count(world: World) -> None:
    controller = make_controller(world)
    submit(world, "w", "high", 1, max_restarts=1)
    run_until(world, controller, lambda: running(world, "w") == 4)
    (pool,) = world.pools_of("w")
    world.exit(world.running("w")[:1], 42)  # the SDK's "cannot go on, restart me"
    run_until(world, controller, lambda: running(world, "w", attempt=2) == 4, limit_s=EXIT_HOLD_S + 60)
    state = world.state("w")
    assert (state["restarts"], state["disruptions"], state["attempt"]) == (1, 0, 2)
    assert world.pools_of("w") == [pool]  # in place
    assert {p["metadata"]["annotations"][labels.RESTART_COUNT_ANNOTATION] for p in world.running("w")} == {"1"}
    world.exit(world.running("w")[:1], 42)
    run_until(world, controller, lambda: world.state("w")["phase"] == "FAILED", limit_s=EXIT_HOLD_S + 60)
    assert "max restarts (1) is used up" in world.state("w")["status_message"]


def test_a_worker_evicted_on_a_healthy_node_moves_the_workload_uncharged(world: World) -> None:
    controller = make_controller(world)
    submit(world, "w", "high", 1)
    run_until(world, controller, lambda: running(world, "w") == 4)
    (pool,) = world.pools_of("w")
    victim = world.running("w")[0]
    world.api.evict(victim["metadata"]["namespace"], victim["metadata"]["name"])  # not a drain: the node stays schedulable
    run_until(world, controller, lambda: running(world, "w", attempt=2) == 4)
    state = world.state("w")
    assert (state["restarts"], state["disruptions"]) == (0, 1)
    assert world.pools_of("w")[0] != pool
    assert any("was disrupted (EvictionByEvictionAPI)" in m for _, r, m in events(world, "w") if r == "SliceLost")


def test_elastic_scale_down_completes_without_its_parked_replica_and_frees_every_slice(world: World) -> None:
    """Replicas of a JobSet are immutable and JobSet recreates a deleted Job: a scaled-down
    workload keeps a parked replica's Job behind the gate, which never completes, so JobSet
    (success policy All) never completes it. The controller does, once its active replicas
    finished, and suspends the JobSet: the parked pods go, and the slices are free."""
    controller = make_controller(world)
    submit(world, "el", "high", 3, min_slices=2)
    run_until(world, controller, lambda: running(world, "el") == 12)
    pools = world.pools_of("el")
    world.fail_node(world.nodes_of_pool(pools[2])[0])
    run_until(world, controller, lambda: world.state("el")["membership"] == 1)
    world.advance(5, controller)
    assert world.pools_of("el") == [pools[0], pools[1], None]
    refused = [m for _, r, m in events(world) if r == "FailedCreate"]
    assert refused == []  # no follower pod is refused while its replica is parked
    world.exit(world.running("el"), 0)
    run_until(world, controller, lambda: world.state("el")["phase"] == "SUCCESSFUL" and not world.pods_of("el"))
    assert world.state("el")["slices"] == []
    assert world.jobset("el")["spec"]["suspend"] is True
    assert world.finished("el") is None  # JobSet never declared it: its parked replica never ran


def test_an_elastic_job_is_not_completed_when_its_first_replica_finishes(world: World) -> None:
    """Replicas of a multislice job finish one after another (each saves its checkpoint, then
    exits 0). The first replica to finish must not complete the JobSet: JobSet would delete
    the other replicas' Jobs while they still write their checkpoint."""
    controller = make_controller(world)
    submit(world, "el", "high", 2, min_slices=1)
    run_until(world, controller, lambda: running(world, "el") == 8)
    first = [p for p in world.running("el") if p["metadata"]["labels"][labels.JOB_INDEX_LABEL] == "0"]
    world.exit(first, 0)
    world.advance(30, controller)
    assert world.finished("el") is None
    assert running(world, "el") == 4  # the second replica is still at work
    assert world.state("el")["phase"] == "RUNNING"
    world.exit(world.running("el"), 0)
    run_until(world, controller, lambda: world.finished("el") == "Completed")
    run_until(world, controller, lambda: world.state("el")["phase"] == "SUCCESSFUL")


def test_the_controller_killed_mid_hotswap_is_completed_by_a_fresh_one(world: World) -> None:
    """The controller dies after it recorded the decision (with the Jobs it retires) but before
    it deleted them. A new one, knowing nothing, finds the record and deletes the Jobs it lists:
    the same hotswap, decided once."""

    class Killed(BaseException):
        pass

    first = make_controller(world)
    high, low = seed_000(world, first)
    world.fail_node(world.nodes_of_pool(high[0])[0])
    world.advance(world.nodes.grace_s + 1)
    old_jobs = {j["metadata"]["uid"] for j in world.store.list(JOBS) if j["metadata"]["labels"].get(JOBSET_NAME) == "high-jax-trillium"}
    original = first.client.delete_job

    def die(*args, **kwargs):
        raise Killed()

    first.client.delete_job = die  # the process dies at its first Job deletion of the round
    with pytest.raises(Killed):
        first.reconcile()
    first.client.delete_job = original
    state = world.state("high-jax-trillium")
    assert state["attempt"] == 2 and set(state["retiring"]) == old_jobs  # recorded, with the Jobs it retires
    assert not [e for e in world.api.requests if e.method == "DELETE" and "/jobs/" in e.path]  # none deleted yet
    second = make_controller(world)
    run_until(world, second, lambda: running(world, "high-jax-trillium", attempt=2) == 8)
    state = world.state("high-jax-trillium")
    assert (state["disruptions"], state["restarts"], state["attempt"], state.get("retiring")) == (1, 0, 2, None)
    assert len([e for e in world.api.requests if e.method == "DELETE" and "/jobs/" in e.path]) == 2  # each old Job once
    assert world.pools_of("high-jax-trillium") == [low, high[1]]
    assert world.state("low-jax-trillium")["preemptions"] == 1
    assert [r for _, r, _ in events(world, "high-jax-trillium")].count("Restarted") == 1


def test_other_owners_pods_occupy_slices(world: World) -> None:
    """A pod of another owner (another namespace, an xpk job) holding TPUs on a node makes
    that slice unusable: it is never offered, and a workload on it moves away."""
    controller = make_controller(world)
    world.add_foreign_pod("xpk-job-0", world.nodes_of_pool("tpu-v6e-np-0")[0])
    submit(world, "a", "high", 2)
    run_until(world, controller, lambda: running(world, "a") == 8)
    assert sorted(world.pools_of("a")) == ["tpu-v6e-np-1", "tpu-v6e-np-2"]
    submit(world, "b", "high", 1)
    world.advance(20, controller)
    assert world.state("b")["phase"] == "QUEUED"  # np-0 is taken, not free
    world.add_foreign_pod("late", world.nodes_of_pool("tpu-v6e-np-1")[2], resources={"google.com/tpu": "4"})
    world.store.peek(*_pod_key(world, "late"))["status"]["phase"] = "Running"
    run_until(world, controller, lambda: world.state("a")["phase"] == "QUEUED")  # lost np-1, nothing free
    assert "used by pod other-team/late" in " ".join(m for _, r, m in events(world, "a") if r == "SliceLost")
    assert {p["metadata"]["name"] for p in world.pods(lambda p: p["metadata"]["namespace"] == "other-team")} == {"xpk-job-0", "late"}


def _pod_key(world: World, name: str) -> tuple:
    from k8s_fixtures.world.store import PODS

    return PODS, "other-team", name


def test_pinned_pods_that_never_schedule_lose_their_slice(world: World) -> None:
    """Someone taints a free pool's nodes right after the controller pinned a workload there;
    its pods can never schedule. The controller notices and moves it, it does not hang."""
    controller = make_controller(world)
    submit(world, "w", "high", 1)
    world.advance(1, controller)
    pool = world.state("w")["slices"][0]
    for name in world.nodes_of_pool(pool):
        node = world.store.peek(*_node_key(name))
        node["spec"]["taints"].append({"key": "example.com/reserved", "effect": "NoSchedule"})
        world.store.write(_node_key(name)[0], node)
    run_until(world, controller, lambda: running(world, "w") == 4, limit_s=400)
    assert world.pools_of("w")[0] != pool
    assert any("has not been scheduled for" in m for _, r, m in events(world, "w") if r == "SliceLost")
    # The decision says what happened, not that a node "was cordoned" (no node was).
    said = [m for _, r, m in events(world, "w") if "(attempt 2)" in m]
    assert said and all("cordoned" not in m for m in said), said
    assert any("has not been scheduled for" in m for m in said), said


def _node_key(name: str) -> tuple:
    from k8s_fixtures.world.store import NODES

    return NODES, "", name


def gpu_nodes(count: int) -> list[dict]:
    """``count`` A3 nodes (8 H100 each) like the recorded one."""
    import copy

    from k8s_fixtures.world import load_nodes

    template = next(n for n in load_nodes("gke_single_host_nodes.yaml") if "nvidia.com/gpu" in n["status"]["capacity"])
    nodes = []
    for index in range(count):
        node = copy.deepcopy(template)
        name = f"gke-hotswap-a3-pool-6d0f2a91-{index:04d}"
        node["metadata"]["name"] = node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        nodes.append(node)
    return nodes


def test_a_gpu_node_whose_device_plugin_withdrew_a_gpu_is_failed() -> None:
    """The NVIDIA device plugin withdraws a GPU it finds unhealthy: allocatable drops below
    capacity. The node is Failed for hotswap (with that reason) and its workload moves."""
    world = make_world(nodes=gpu_nodes(2))
    try:
        controller = make_controller(world)
        submit(world, "g", "high", 1, device_type="h100-80gb-8")
        run_until(world, controller, lambda: running(world, "g") == 1)
        node = world.running("g")[0]["spec"]["nodeName"]
        stored = world.store.peek(*_node_key(node))
        stored["status"]["allocatable"]["nvidia.com/gpu"] = "7"
        world.store.write(_node_key(node)[0], stored)
        run_until(world, controller, lambda: running(world, "g", attempt=2) == 1)
        assert world.running("g")[0]["spec"]["nodeName"] != node
        assert any("7 of 8 nvidia.com/gpu allocatable" in m for _, r, m in events(world, "g") if r == "SliceLost")
    finally:
        world.close()


def test_a_worker_deleted_while_no_controller_watched_is_noticed(world: World) -> None:
    """A worker's pod is force-deleted while the controller is down: no trace of it is left,
    only the gated pod its Job created instead. The controller must not release that pod into a
    gang that lost a member: it restarts the workload, uncharged."""
    controller = make_controller(world)
    submit(world, "w", "high", 1)
    run_until(world, controller, lambda: running(world, "w") == 4)
    world.advance(3, controller)  # the release is recorded
    (pool,) = world.pools_of("w")
    victim = world.running("w")[1]
    world.client().core.delete_namespaced_pod(victim["metadata"]["name"], "default", grace_period_seconds=0, _preload_content=False)
    world.advance(5)  # the controller is down meanwhile: the Job has replaced the pod
    replacement = [p for p in world.pods_of("w") if p["spec"].get("schedulingGates")]
    assert len(replacement) == 1
    run_until(world, controller, lambda: running(world, "w", attempt=2) == 4)
    state = world.state("w")
    assert (state["restarts"], state["disruptions"]) == (0, 1)
    assert any("is gone (deleted or evicted)" in m for _, r, m in events(world, "w") if r == "SliceLost")


def test_a_recreate_restart_never_lets_the_old_coordinator_answer_its_name(world: World) -> None:
    """Under Recreate the controller deletes a replica's Jobs to restart it. The headless
    Service publishes not-ready addresses, so while an old worker still checkpoints after its
    SIGTERM, a new pod of the same hostname would share its DNS name: the new attempt's
    MASTER_ADDR could reach the old coordinator. The Jobs are deleted in the foreground, as
    JobSet's own restarts do: a Job, and so its successor of the same name, waits until its
    pods are gone."""
    controller = make_controller(world)
    world.nodes.stop_after_s = 20.0  # a checkpoint that takes 20 s after SIGTERM
    submit(world, "w", "high", 1, restart_strategy="Recreate")
    run_until(world, controller, lambda: running(world, "w") == 4)
    victim = next(p for p in world.running("w") if p["spec"]["hostname"].endswith("-1"))
    world.api.evict(victim["metadata"]["namespace"], victim["metadata"]["name"])
    overlaps: set[str] = set()

    def restarted() -> bool:
        alive: dict[str, int] = {}
        for pod in world.pods_of("w", live=False):
            if pod["status"].get("phase") not in ("Succeeded", "Failed"):
                alive[pod["spec"]["hostname"]] = alive.get(pod["spec"]["hostname"], 0) + 1
        overlaps.update(name for name, count in alive.items() if count > 1)
        return running(world, "w", attempt=2) == 4

    run_until(world, controller, restarted, limit_s=300)
    assert overlaps == set()
    assert world.state("w")["disruptions"] == 1


@pytest.mark.parametrize("device_type, nodes", [("v6e-16", "gke_v6e16_nodes.yaml"), ("h100-80gb-8", "gke_single_host_nodes.yaml")])
def test_workers_tolerate_the_accelerator_taint_without_gke_admission(device_type: str, nodes: str) -> None:
    """GKE taints TPU and GPU nodes (google.com/tpu, nvidia.com/gpu: NoSchedule) and adds the
    tolerations through its ExtendedResourceToleration admission. A cluster without that
    plugin must still run hotswap's workers: the pods carry the toleration themselves."""
    world = make_world(nodes=nodes, extended_resource_toleration=False)
    try:
        controller = make_controller(world)
        submit(world, "w", "high", 1, device_type=device_type)
        hosts = 4 if device_type == "v6e-16" else 1
        run_until(world, controller, lambda: running(world, "w") == hosts, limit_s=120)
    finally:
        world.close()


def test_describe_shows_the_events_as_the_timeline_and_the_workers_real_state(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """`workload describe` on a running workload: its timeline is the Events recorded on its
    JobSet (hotswap's decisions among them), and its running workers read "running"."""
    from k8s_fixtures.scenario import CLUSTER, settings_of

    from hotswap.backends.kubernetes import backend as kube_backend

    controller = make_controller(world)
    submit(world, "w", "high", 1)
    run_until(world, controller, lambda: running(world, "w") == 4)
    world.advance(3, controller)
    monkeypatch.setattr(kube_backend, "settings_of", lambda cluster: settings_of(world))
    monkeypatch.setattr(kube_backend.KubernetesBackend, "_client", lambda self, settings: world.client(settings))
    described = kube_backend.KubernetesBackend().describe_workload(CLUSTER, "w")
    assert any(e["event"] == "Admitted" and "admitted on" in e["message"] and e["time"] for e in described["timeline"]), described["timeline"]
    assert [w["state"] for w in described["workers"]] == ["running"] * 4
    world.exit(world.running("w"), 0)
    run_until(world, controller, lambda: world.state("w")["phase"] == "SUCCESSFUL")
    described = kube_backend.KubernetesBackend().describe_workload(CLUSTER, "w")
    assert [(w["state"], w["exit_code"]) for w in described["workers"]] == [("exited", 0)] * 4
