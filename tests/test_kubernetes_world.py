"""The world itself behaves as the upstream controllers do (each rule is cited in its module):
these tests pin the behaviours hotswap's design depends on, and reproduce, without hotswap's
controller, why the former rendering broke on a real cluster (issue 12)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from k8s_fixtures.scenario import events, make_world
from k8s_fixtures.world import World
from k8s_fixtures.world.store import JOBS, PODS

NODE_SELECTOR = {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "4x4"}


@pytest.fixture
def world() -> World:
    world = make_world(interleave=False)  # the world's own steps, one settle at a time
    yield world
    world.close()


def jobset(name: str, replicas: int = 2, policy: dict[str, Any] | None = None, pod_policy: dict[str, Any] | None = None,
           exclusive: bool = False, gated: bool = False, success: dict[str, Any] | None = None, priority: str = "high") -> dict[str, Any]:
    """A plain JobSet as users write them (seed 000's shape): one replicated job of 4-host slices."""
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "priorityClassName": priority,
        "nodeSelector": dict(NODE_SELECTOR),
        "containers": [{"name": "worker", "image": "x", "resources": {"limits": {"google.com/tpu": 4}}}],
    }
    if gated:
        pod_spec["schedulingGates"] = [{"name": "example.com/gate"}]
    job_spec: dict[str, Any] = {"parallelism": 4, "completions": 4, "backoffLimit": 0, "template": {"spec": pod_spec}}
    if pod_policy is not None:
        job_spec["podFailurePolicy"] = pod_policy
    obj: dict[str, Any] = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": "default", "annotations": {}},
        "spec": {"replicatedJobs": [{"name": "slice", "replicas": replicas, "template": {"spec": job_spec}}]},
    }
    if policy is not None:
        obj["spec"]["failurePolicy"] = policy
    if success is not None:
        obj["spec"]["successPolicy"] = success
    if exclusive:
        obj["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"] = "cloud.google.com/gke-nodepool"
    return obj


def workers(world: World, name: str) -> list[dict[str, Any]]:
    return world.running(name)


# The failure policy hotswap rendered before issue 12 (render.py at 48cfd3d).
FORMER_POLICY = {
    "maxRestarts": 10,
    "restartStrategy": "BlockingRecreate",
    "rules": [
        {"name": "disruptionRestartsFree", "action": "RestartJobSetAndIgnoreMaxRestarts", "onJobFailureReasons": ["PodFailurePolicy"],
         "onJobFailureMessagePatterns": ["has condition DisruptionTarget"]},
        {"name": "userErrorFails", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
    ],
}
FORMER_POD_POLICY = {"rules": [
    {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    {"action": "FailJob", "onExitCodes": {"containerName": "worker", "operator": "NotIn", "values": [42, *range(127, 256)]}},
]}


def test_with_the_former_policy_collateral_exits_failed_the_whole_jobset(world: World) -> None:
    """Issue 12, item 1, without hotswap: a node dies, its peers exit 1 before it is NotReady:
    FailJob on exit code -> the Job fails with reason PodFailurePolicy -> the userErrorFails rule
    fails the JobSet. Terminal: nothing left to hotswap."""
    world.apply(jobset("former", policy=FORMER_POLICY, pod_policy=FORMER_POD_POLICY))
    world.advance(3)
    assert len(workers(world, "former")) == 8
    dead = workers(world, "former")[0]["spec"]["nodeName"]
    world.fail_node(dead)
    world.advance(3)
    world.exit([p for p in workers(world, "former") if p["spec"]["nodeName"] != dead], 1)
    world.advance(5)
    assert world.finished("former") == "Failed"
    failed = next(c for c in world.jobset("former")["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "FailJobSetFailurePolicyAction"


def test_failure_policy_rules_match_in_order_by_reason_pattern_and_target(world: World) -> None:
    policy = {"maxRestarts": 2, "rules": [
        {"name": "others", "action": "FailJobSet", "targetReplicatedJobs": ["other"]},
        {"name": "disruptions", "action": "RestartJobSetAndIgnoreMaxRestarts", "onJobFailureReasons": ["PodFailurePolicy"],
         "onJobFailureMessagePatterns": ["has condition Disruption"]},
        {"name": "codes", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
    ]}
    world.apply(jobset("p", policy=policy, pod_policy=FORMER_POD_POLICY))
    world.advance(3)
    victim = workers(world, "p")[0]
    world.api.evict(victim["metadata"]["namespace"], victim["metadata"]["name"])
    world.advance(10)
    status = world.jobset("p")["status"]
    assert (status["restarts"], status.get("restartsCountTowardsMax", 0)) == (1, 0)  # the pattern rule: free restart
    assert world.finished("p") is None
    world.advance(10)
    assert len(workers(world, "p")) == 8
    assert {p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for p in workers(world, "p")} == {"1"}
    world.exit(workers(world, "p")[:1], 7)
    world.advance(5)
    assert world.finished("p") == "Failed"  # no "other" replicated job here; the code rule fails it


def test_default_action_restarts_counted_until_max_restarts(world: World) -> None:
    world.apply(jobset("d", policy={"maxRestarts": 1}))
    world.advance(3)
    world.exit(workers(world, "d")[:1], 3)
    world.advance(10)
    assert world.jobset("d")["status"]["restartsCountTowardsMax"] == 1 and world.finished("d") is None
    world.advance(5)
    world.exit(workers(world, "d")[:1], 3)
    world.advance(10)
    failed = next(c for c in world.jobset("d")["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "ReachedMaxRestarts"


@pytest.mark.parametrize("strategy", ["Recreate", "BlockingRecreate"])
def test_blocking_recreate_creates_no_job_while_any_previous_attempt_exists(world: World, strategy: str) -> None:
    """A restart deletes the Jobs in the foreground. Recreate creates each new Job as soon as
    its predecessor of the same name is gone; BlockingRecreate creates none while any is left
    (here: the Job with a pod stuck on a dead node)."""
    world.apply(jobset("b", policy={"maxRestarts": 3, "restartStrategy": strategy}))
    world.advance(3)
    stuck = next(p for p in workers(world, "b") if p["metadata"]["labels"]["jobset.sigs.k8s.io/job-index"] == "0")
    world.fail_node(stuck["spec"]["nodeName"])
    world.exit([p for p in workers(world, "b") if p["metadata"]["labels"]["jobset.sigs.k8s.io/job-index"] == "1"][:1], 3)
    world.advance(15)
    jobs = {(j["metadata"]["name"], j["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"]) for j in world.store.list(JOBS)}
    if strategy == "Recreate":
        assert jobs == {("b-slice-0", "0"), ("b-slice-1", "1")}
    else:
        assert jobs == {("b-slice-0", "0")}


def test_pod_failure_policy_ignore_replaces_the_pod_after_the_backoff(world: World) -> None:
    ignore = {"rules": [{"action": "Ignore", "onExitCodes": {"containerName": "worker", "operator": "NotIn", "values": [0]}}]}
    world.apply(jobset("i", replicas=1, pod_policy=ignore))
    world.advance(3)
    first = workers(world, "i")[0]
    world.exit([first], 1)
    world.advance(5)
    index = first["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
    same_index = lambda: [p for p in world.pods_of("i") if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == index]  # noqa: E731
    assert same_index() == []  # the 10 s backoff of the first failure
    world.advance(6)
    assert len(same_index()) == 1 and world.store.list(JOBS)[0]["status"].get("failed", 0) == 0  # not counted


def test_a_deleted_child_job_is_recreated_and_success_needs_every_job(world: World) -> None:
    """JobSet recreates a deleted child Job under the same name (replicas are immutable); with
    the default success policy (All) a Job whose pods never run keeps the JobSet from
    completing, while Any completes with the first Job."""
    for name, success in (("all", None), ("any", {"operator": "Any", "targetReplicatedJobs": ["slice"]})):
        world.apply(jobset(name, success=success))
    world.advance(3)
    job = next(j for j in world.store.list(JOBS) if j["metadata"]["name"] == "all-slice-1")
    world.client().batch.delete_namespaced_job("all-slice-1", "default", propagation_policy="Background")
    world.advance(5)
    again = next(j for j in world.store.list(JOBS) if j["metadata"]["name"] == "all-slice-1")
    assert again["metadata"]["uid"] != job["metadata"]["uid"]
    with pytest.raises(Exception):
        world.client().custom.patch_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "all",
            {"spec": {"replicatedJobs": [{**world.jobset("all")["spec"]["replicatedJobs"][0], "replicas": 1}]}},
            _content_type="application/merge-patch+json",
        )  # replicas are immutable (jobset_webhook.go ValidateUpdate)
    for name in ("all", "any"):
        world.exit([p for p in workers(world, name) if p["metadata"]["labels"]["jobset.sigs.k8s.io/job-index"] == "0"], 0)
    world.advance(5)
    assert (world.finished("all"), world.finished("any")) == (None, "Completed")
    assert [j["metadata"]["name"] for j in world.store.list(JOBS) if j["metadata"]["name"].startswith("any")] == ["any-slice-0"]


def test_exclusive_placement_refuses_followers_of_a_gated_leader(world: World) -> None:
    """Why hotswap does not use JobSet's exclusive placement: a replica's followers are
    refused by JobSet's pod webhook until its leader is scheduled, so a replica parked behind a
    gate keeps the Job controller retrying (FailedCreate), and every start costs a round trip."""
    world.apply(jobset("ex", replicas=1, exclusive=True, gated=True))
    world.advance(10)
    pods = world.pods_of("ex")
    assert [p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in pods] == ["0"]
    refused = [m for _, reason, m in events(world) if reason == "FailedCreate"]
    # The mutating webhook could not copy the leader's node pool (not scheduled): refused.
    assert refused and all("follower pod node selector for topology domain not found" in m for m in refused)


def test_kube_scheduler_honours_selectors_readiness_occupancy_and_gates(world: World) -> None:
    pinned = jobset("pin", replicas=1)
    pinned["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-nodepool"] = "tpu-v6e-np-1"
    dead = world.nodes_of_pool("tpu-v6e-np-1")[0]
    world.fail_node(dead)
    world.advance(world.nodes.grace_s + 1)
    world.add_foreign_pod("squatter", world.nodes_of_pool("tpu-v6e-np-1")[1], priority=2_000_000)  # not preemptible by ours
    world.apply(pinned)
    world.apply(jobset("gated", replicas=1, gated=True))
    world.advance(3)
    nodes = sorted(p["spec"].get("nodeName") or "" for p in world.pods_of("pin"))
    assert nodes[:2] == ["", ""] and dead not in nodes and world.nodes_of_pool("tpu-v6e-np-1")[1] not in nodes
    unschedulable = next(p for p in world.pods_of("pin") if not p["spec"].get("nodeName"))
    scheduled = next(c for c in unschedulable["status"]["conditions"] if c["type"] == "PodScheduled")
    assert scheduled["reason"] == "Unschedulable" and "Insufficient google.com/tpu" in scheduled["message"]
    assert all(not p["spec"].get("nodeName") for p in world.pods_of("gated"))


def test_kube_scheduler_preempts_lower_priority_pods_with_a_disruption_condition(world: World) -> None:
    world.apply(jobset("low", replicas=3, priority="low"))
    world.advance(3)
    assert len(workers(world, "low")) == 12
    world.apply(jobset("high", replicas=1, priority="high"))
    world.advance(10)
    assert len(workers(world, "high")) == 4
    preempted = [p for p in world.store.history if p.resource is PODS and any(
        c.get("reason") == "PreemptionByScheduler" for c in (p.obj.get("status") or {}).get("conditions") or [])]
    assert preempted


def test_kueue_admits_by_priority_and_preempts_within_the_cluster_queue() -> None:
    world = make_world(kueue=True, interleave=False)
    try:
        def queued(name: str, priority: str, replicas: int) -> None:
            obj = jobset(name, replicas=replicas, priority=priority)
            obj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "multislice-queue"}
            obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"].pop("nodeSelector")
            world.apply(obj)

        queued("low", "low", 2)
        assert world.jobset("low")["spec"]["suspend"] is True  # Kueue's webhook suspends it
        world.advance(3)
        assert world.jobset("low")["spec"]["suspend"] is False and len(workers(world, "low")) == 8
        selector = world.jobset("low")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"]
        assert selector == NODE_SELECTOR  # the flavor's node labels
        queued("high", "high", 2)
        world.advance(10)
        assert world.jobset("low")["spec"]["suspend"] is True and len(workers(world, "high")) == 8
        evicted = next(c for c in world.kueue_workload("low")["status"]["conditions"] if c["type"] == "Evicted")
        assert evicted["reason"] == "Preempted"
        low_template = world.jobset("low")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert "nodeSelector" not in low_template or low_template["nodeSelector"] == {}  # restored when stopped
        workload = copy.deepcopy(world.kueue_workload("high"))
        world.client().custom.patch_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", "default", "workloads",
                                                             workload["metadata"]["name"], {"spec": {"active": False}},
                                                             _content_type="application/merge-patch+json")
        world.advance(10)
        assert world.jobset("high")["spec"]["suspend"] is True and len(workers(world, "low")) == 8
    finally:
        world.close()


def test_the_store_indexes_agree_with_a_scan_of_every_object() -> None:
    """The indexes the world's controllers read through (each kind in name order, objects by
    owner, pods by node, objects by label) stay those a scan finds, through placements,
    a node failure and its hotswap, a Job recreated and a JobSet deleted in the foreground."""
    from k8s_fixtures.scenario import make_controller, submit

    world = make_world()
    try:
        controller = make_controller(world)
        submit(world, "a", "high", 2)
        submit(world, "b", "low", 1)
        world.advance(20, controller)
        world.fail_node(world.nodes_of_pool(world.pools_of("a")[0])[0])
        world.advance(world.nodes.grace_s + 40, controller)
        world.client().delete_jobset("b")
        world.advance(40, controller)
        everything = list(world.store.objects.items())
        assert any(res is PODS and obj["spec"].get("nodeName") for (res, _, _), obj in everything)
        for resource in {res for (res, _, _), _obj in everything}:
            scanned = [obj for (res, ns, name), obj in sorted(everything, key=lambda i: i[0][1:]) if res is resource]
            assert world.store.items(resource) == scanned, resource.plural
            for obj in scanned:
                meta = obj["metadata"]
                for owner in meta.get("ownerReferences") or []:
                    assert world.store.owned_by(resource, owner["uid"]) == [
                        o for o in scanned if any(r["uid"] == owner["uid"] for r in o["metadata"].get("ownerReferences") or [])]
                for key, value in (meta.get("labels") or {}).items():
                    assert world.store.labelled(resource, key, value) == [o for o in scanned if (o["metadata"].get("labels") or {}).get(key) == value]
        pods = [obj for (res, _, _), obj in sorted(everything, key=lambda i: i[0][1:]) if res is PODS]
        for node in world.store.items(world.store.resource("v1", "nodes")):
            name = node["metadata"]["name"]
            assert world.store.pods_on(name) == [p for p in pods if p["spec"].get("nodeName") == name]
        assert world.store.owned_by(JOBS, "no-such-uid") == [] and world.store.pods_on("no-such-node") == []
    finally:
        world.close()
