"""Elastic JAX on Kubernetes survives the loss of slice 0: the JAX coordination service runs in
the JobSet's ``coordinator`` pod, on no slice's node (render/coordination.py), and serves each
generation the controller publishes. The real controller against the world (JobSet v0.12, the
Job controller, kube-scheduler, kubelets, node lifecycle, Kueue as their sources do)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from k8s_fixtures.scenario import events, make_controller, make_world, run_until, running, submit
from k8s_fixtures.world import World
from k8s_fixtures.world.world import load_nodes

from hotswap.api import worker as contract
from hotswap.backends.kubernetes import labels

CPU_POOL = "default-pool"


@pytest.fixture(params=[False, True], ids=["hotswap-admits", "kueue"])
def world(request: pytest.FixtureRequest) -> World:
    world = make_world(kueue=request.param)
    yield world
    world.close()


def coordinators(world: World, name: str) -> list[dict[str, Any]]:
    return [p for p in world.pods_of(name) if p["metadata"]["labels"].get(labels.REPLICATED_JOB_NAME_LABEL) == contract.COORDINATOR_JOB]


def membership(pod: dict[str, Any]) -> dict[str, Any]:
    return json.loads(pod["metadata"]["annotations"][labels.MEMBERSHIP_ANNOTATION])


def worker_env(pod: dict[str, Any], name: str) -> str | None:
    return next((e.get("value") for e in pod["spec"]["containers"][0]["env"] if e["name"] == name), None)


def test_slice_0_node_failure_leaves_the_coordinator_serving_the_survivors_then_the_joiner(world: World) -> None:
    """Slice 0's node fails. The coordination service is not there: its pod runs on a CPU node,
    untouched (same pod), and is given the survivors' generation (their process count, their
    port) as they are; the workers reach it by its stable DNS name. When the node is repaired the
    slice joins and the same pod is given the grown generation. Nothing restarted, nothing
    charged."""
    controller = make_controller(world)
    submit(world, "el", "high", 3, min_slices=2)
    run_until(world, controller, lambda: running(world, "el") == 12 and len(coordinators(world, "el")) == 1)
    (service,) = coordinators(world, "el")
    run_until(world, controller, lambda: world.state("el")["membership"] == 0 and running(world, "el") == 12)
    assert world.node_label(service["spec"]["nodeName"], "cloud.google.com/gke-nodepool") == CPU_POOL  # on no slice
    # The workers' address of the service is the name JobSet's headless service gives that pod.
    worker = next(p for p in world.running("el") if p["metadata"]["labels"][labels.REPLICATED_JOB_NAME_LABEL] == "slice")
    host = f"{service['spec']['hostname']}.{service['spec']['subdomain']}"
    assert worker_env(worker, contract.HOTSWAP_JAX_COORDINATOR) == host == "el-coordinator-0-0.el"
    pools = world.pools_of("el")
    uid = service["metadata"]["uid"]

    world.fail_node(world.nodes_of_pool(pools[0])[0])  # slice 0: rank 0's node
    run_until(world, controller, lambda: world.state("el")["membership"] == 1)
    run_until(world, controller, lambda: membership(coordinators(world, "el")[0])["generation"] == 1, limit_s=30)
    (service,) = coordinators(world, "el")
    assert service["metadata"]["uid"] == uid and service["status"]["phase"] == "Running"
    survivors = [p for p in world.running("el") if p["metadata"]["labels"][labels.JOB_INDEX_LABEL] != "0"
                 and p["metadata"]["labels"][labels.REPLICATED_JOB_NAME_LABEL] == "slice"]
    served = membership(service)
    assert served["slices"] == [pools[1], pools[2]] and served["world_size"] == 8
    assert all(membership(p) == served for p in survivors)  # the same generation, port and process count

    world.repair_node(world.nodes_of_pool(pools[0])[0])
    run_until(world, controller, lambda: running(world, "el") == 12 and world.state("el")["membership"] == 2, limit_s=900)
    run_until(world, controller, lambda: membership(coordinators(world, "el")[0])["generation"] == 2, limit_s=30)
    (service,) = coordinators(world, "el")
    assert service["metadata"]["uid"] == uid
    assert membership(service)["world_size"] == 12 and len(membership(service)["slices"]) == 3
    state = world.state("el")
    assert (state["phase"], state["restarts"], state["attempt"]) == ("RUNNING", 0, 1)
    assert world.jobset("el")["status"].get("restarts", 0) == 0


def test_a_lost_coordinator_is_replaced_and_its_generation_restarts_uncharged(world: World) -> None:
    """The service process dies. Its Job makes a new pod with the same DNS name, which the
    controller gives the current generation; JobSet neither restarts nor fails the workload.
    JAX ends every worker of the generation it served (exit 1, its client's fatal error): the
    workload restarts in place, never charged (max_restarts 0 would fail it otherwise)."""
    controller = make_controller(world)
    submit(world, "el", "high", 3, min_slices=2, max_restarts=0)
    run_until(world, controller, lambda: running(world, "el") == 12 and len(coordinators(world, "el")) == 1)
    (service,) = coordinators(world, "el")
    run_until(world, controller, lambda: membership(coordinators(world, "el")[0])["generation"] == 0, limit_s=30)
    world.exit([service], 1)  # the service process died
    world.advance(2, controller)
    world.exit(world.running("el"), 1)  # JAX ends every process of the generation it served
    replaced = lambda: [p for p in coordinators(world, "el") if p["metadata"]["uid"] != service["metadata"]["uid"]]  # noqa: E731
    run_until(world, controller, lambda: running(world, "el", attempt=2) == 12, limit_s=300)
    run_until(world, controller, lambda: bool(replaced()) and replaced()[0]["status"].get("phase") == "Running"
              and labels.MEMBERSHIP_ANNOTATION in replaced()[0]["metadata"]["annotations"], limit_s=60)
    (new,) = replaced()
    assert f"{new['spec']['hostname']}.{new['spec']['subdomain']}" == "el-coordinator-0-0.el"
    assert membership(new) == membership(next(p for p in world.running("el") if p["metadata"]["name"].startswith("el-slice")))
    world.advance(90, controller)  # past the hold in which exits are judged
    assert world.finished("el") is None and world.jobset("el")["status"].get("restarts", 0) == 0
    state = world.state("el")
    assert (state["phase"], state["restarts"], state["attempt"]) == ("RUNNING", 0, 2)
    assert running(world, "el", attempt=2) == 12


@pytest.mark.parametrize("kueue", [False, True], ids=["hotswap-admits", "kueue"])
def test_a_coordinator_stranded_on_a_dead_node_is_replaced_on_another(kueue: bool) -> None:
    """The CPU node under the service dies. Its pod is evicted after 30 s (not the default
    300 s), force-deleted by the controller once its grace period is over (the dead kubelet
    never confirms), and its Job's new pod runs on another CPU node with the current
    generation. The generation it served ends; the workload restarts in place, uncharged."""
    nodes = load_nodes()
    spare = copy.deepcopy(next(n for n in nodes if n["metadata"]["labels"].get("cloud.google.com/gke-nodepool") == CPU_POOL))
    spare["metadata"]["name"] = spare["metadata"]["labels"]["kubernetes.io/hostname"] = "gke-hotswap-default-pool-spare"
    world = make_world(kueue=kueue, nodes=[*nodes, spare])  # two CPU nodes
    try:
        controller = make_controller(world)
        submit(world, "el", "high", 3, min_slices=2, max_restarts=0)
        run_until(world, controller, lambda: running(world, "el") == 12 and len(coordinators(world, "el")) == 1
                  and coordinators(world, "el")[0]["status"].get("phase") == "Running")
        (service,) = coordinators(world, "el")
        dead = service["spec"]["nodeName"]
        world.fail_node(dead)
        world.advance(100, controller)  # the workers' clients give up on it after their heartbeat timeout
        world.exit([p for p in world.running("el") if p["metadata"]["name"].startswith("el-slice")], 1)
        replaced = lambda: [p for p in coordinators(world, "el") if p["metadata"]["uid"] != service["metadata"]["uid"]]  # noqa: E731
        run_until(world, controller, lambda: running(world, "el", attempt=2) == 12 and bool(replaced())
                  and replaced()[0]["status"].get("phase") == "Running", limit_s=400)
        (new,) = replaced()
        assert new["spec"]["nodeName"] not in (dead, None)
        assert not [p for p in world.pods(lambda p: p["metadata"]["uid"] == service["metadata"]["uid"])]  # gone
        assert any(r == "PodForceDeleted" and service["metadata"]["name"] in m for _, r, m in events(world, "el"))
        world.advance(90, controller)
        state = world.state("el")
        assert (state["phase"], state["restarts"], state["attempt"]) == ("RUNNING", 0, 2)
    finally:
        world.close()


def lose_the_service(world: World, controller: Any) -> float:
    """The service process of the running generation dies and JAX ends every worker of that
    generation (exit 1); returns when the service went away."""
    (service,) = [p for p in coordinators(world, "el") if p["status"].get("phase") == "Running"]
    lost_at = world.clock.now
    world.exit([service], 1)
    world.advance(2, controller)
    world.exit([p for p in world.running("el") if p["metadata"]["labels"][labels.REPLICATED_JOB_NAME_LABEL] == "slice"], 1)
    return lost_at


def served(world: World, attempt: int) -> bool:
    """The generation ``attempt`` runs, with a live service that serves it."""
    live = [p for p in coordinators(world, "el") if p["status"].get("phase") == "Running"]
    return running(world, "el", attempt=attempt) == 12 and len(live) == 1 and labels.MEMBERSHIP_ANNOTATION in live[0]["metadata"]["annotations"]


def test_a_coordinator_lost_again_and_again_is_charged_after_three_in_a_row_and_fails_the_workload(world: World) -> None:
    """The service dies in every generation. The first UNCHARGED_SERVICE_LOSSES losses in a row
    restart the workload uncharged; the next ones are charged like a crash with a restart code,
    so max_restarts (1) ends it: FAILED, where it used to restart without end. The count lives
    on the JobSet: a controller restarted between the losses counts on."""
    from hotswap.backends.kubernetes.pod_signals import UNCHARGED_SERVICE_LOSSES

    assert UNCHARGED_SERVICE_LOSSES == 3
    controller = make_controller(world)
    submit(world, "el", "high", 3, min_slices=2, max_restarts=1)
    run_until(world, controller, lambda: served(world, 1))
    for attempt in range(1, 5):
        lose_the_service(world, controller)
        controller = make_controller(world)  # stateless: what it needs is on the JobSet
        run_until(world, controller, lambda: served(world, attempt + 1), limit_s=300)
        state = world.state("el")
        assert (state["phase"], state["attempt"], state["restarts"]) == ("RUNNING", attempt + 1, 0 if attempt <= 3 else 1)
        assert world.jobset("el")["metadata"]["annotations"][labels.SERVICE_LOSSES_IN_A_ROW_ANNOTATION] == str(attempt)
    lose_the_service(world, controller)
    run_until(world, controller, lambda: world.state("el")["phase"] == "FAILED", limit_s=300)
    state = world.state("el")
    assert state["restarts"] == 1 and "5 times in a row" in state["status_message"], state["status_message"]
    said = [(r, m) for _, r, m in events(world, "el") if r in ("Restarted", "Failed")]
    assert [r for r, _ in said] == ["Restarted"] * 4 + ["Failed"]
    assert [m.endswith("; not charged") for _, m in said] == [True] * 3 + [False] * 2
    assert "max restarts (1) is used up" in said[-1][1]


def test_a_generation_that_runs_past_the_window_starts_the_count_again(world: World) -> None:
    """Three losses in a row, then the workload runs past the last one's window without a loss:
    the next loss is the first of a new count, uncharged (max_restarts 0 would fail it)."""
    controller = make_controller(world)
    submit(world, "el", "high", 3, min_slices=2, max_restarts=0)
    run_until(world, controller, lambda: served(world, 1))
    for attempt in range(1, 4):
        lose_the_service(world, controller)
        run_until(world, controller, lambda: served(world, attempt + 1), limit_s=300)
    world.advance(400, controller)  # a healthy run: longer than a window (and the hold before the next)
    lose_the_service(world, controller)
    run_until(world, controller, lambda: served(world, 5), limit_s=300)
    state = world.state("el")
    assert (state["phase"], state["attempt"], state["restarts"]) == ("RUNNING", 5, 0)
    assert world.jobset("el")["metadata"]["annotations"][labels.SERVICE_LOSSES_IN_A_ROW_ANNOTATION] == "1"


def test_losses_in_a_row_count_on_from_the_jobset_and_start_again_after_a_gap() -> None:
    """The count the controller keeps on the JobSet: a loss within the gap of the recorded one
    is the next in a row, one after it the first of a new count; the recorded loss (seen again
    in its pod, to the second) is never counted twice; a record from before the count was kept
    counts as one."""
    from hotswap.api.times import iso_utc
    from hotswap.backends.kubernetes.live_objects import CoordinatorPod, LiveJobSet
    from hotswap.backends.kubernetes.pod_signals import SERVICE_LOSS_STREAK_GAP_S, service_losses_of

    def job(annotations: dict[str, str]) -> LiveJobSet:
        return LiveJobSet("el", "u", None, None, False, None, "", None, None, 0.0, 0, 0, annotations)

    def pod(lost_at: float) -> CoordinatorPod:
        return CoordinatorPod(f"el-coordinator-{lost_at}", "el", None, False, lost_at)

    t = 1_767_600_000.0
    recorded = {labels.SERVICE_LOST_ANNOTATION: iso_utc(t), labels.SERVICE_LOSSES_IN_A_ROW_ANNOTATION: "2"}
    assert service_losses_of(job({}), []).in_a_row == 0
    assert service_losses_of(job(recorded), [pod(t + 0.4)]).in_a_row == 2  # the recorded one
    assert service_losses_of(job(recorded), [pod(t + SERVICE_LOSS_STREAK_GAP_S)]).in_a_row == 3
    assert service_losses_of(job(recorded), [pod(t + SERVICE_LOSS_STREAK_GAP_S + 1)]).in_a_row == 1
    assert service_losses_of(job(recorded), [pod(t + 60), pod(t + 120)]).charged  # the 4th in a row
    assert service_losses_of(job({labels.SERVICE_LOST_ANNOTATION: iso_utc(t)}), [pod(t + 60)]).in_a_row == 2
