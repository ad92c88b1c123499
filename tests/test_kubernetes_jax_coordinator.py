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
