"""Issue 35, items 1 and 2: every deadline the controller keeps is a wake-up time of its loop,
and a refused record stops everything of that JobSet in that round.

The world here wakes the controller only as ``hotswap controller run`` is woken: by what its
watches see (Nodes, its JobSets, its pods; not Jobs, Events or other owners' pods) and by the
wake-up time its last round asked for, with no periodic resync at all, so that any action that
waits for a resync never happens and its test fails. Time moves in half-second ticks: "within a
second of its deadline" is measured, not assumed."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import pytest
from k8s_fixtures.scenario import events, make_controller, make_world, run_until, running, slice_jobs, submit
from k8s_fixtures.world import World, load_nodes
from k8s_fixtures.world.apiserver import Fault
from k8s_fixtures.world.store import JOBS, JOBSETS, PODS, parse_time
from test_kubernetes_jax_coordinator import CPU_POOL, coordinators

from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.child_jobs import STALL_S
from hotswap.backends.kubernetes.planning import STRANDED_SERVICE_AFTER_S
from hotswap.backends.kubernetes.controller.loop import KubeController

TICK_S = 0.5


def quiet_world(**options: Any) -> World:
    """A world that wakes the controller only by its watches and its wake-up times."""
    return make_world(watched_wakes=True, resync_s=math.inf, **options)


@pytest.fixture
def world() -> World:
    world = quiet_world()
    yield world
    world.close()


def until(world: World, controller: KubeController, done: Callable[[], bool], limit_s: float) -> float:
    """Advance in half-second ticks until ``done()``; returns the virtual time then."""
    run_until(world, controller, done, limit_s=limit_s, step=TICK_S)
    return world.clock.now


def pod(world: World, name: str) -> dict[str, Any] | None:
    return world.store.peek(PODS, world.namespace, name)


def test_the_force_delete_follows_the_grace_end_within_a_second_and_the_replica_runs_again(world: World) -> None:
    """A node's kubelet is gone: its pod is deleted with its grace period when the node is
    NotReady, and force-deleted within a second of that grace's end (nothing the controller
    watches changes in between: a resync would come 30 s later). Its Job, held by it in the
    foreground deletion, then goes, JobSet recreates it, and every worker runs again."""
    controller = make_controller(world)
    submit(world, "w", "high", 2, restart_strategy="BlockingRecreate")
    until(world, controller, lambda: running(world, "w") == 8, limit_s=120)
    dead = world.nodes_of_pool(world.pools_of("w")[0])[0]
    stuck = next(p["metadata"]["name"] for p in world.running("w") if p["spec"]["nodeName"] == dead)
    world.fail_node(dead)
    until(world, controller, lambda: "deletionTimestamp" in (pod(world, stuck) or {}).get("metadata", {}), limit_s=world.nodes.grace_s + 10)
    grace_end = parse_time(pod(world, stuck)["metadata"]["deletionTimestamp"])
    assert grace_end is not None and grace_end - world.clock.now >= 20  # its grace: SIGTERM first
    gone = until(world, controller, lambda: pod(world, stuck) is None, limit_s=120)
    assert grace_end <= gone <= grace_end + 1
    assert [m for _, r, m in events(world, "w") if r == "PodForceDeleted"] == [
        f"pod {stuck} force-deleted: its node {dead} failed and its grace period is over"
    ]
    until(world, controller, lambda: running(world, "w", attempt=2) == 8, limit_s=10)


def test_under_kueue_a_preempted_workloads_pod_on_a_dead_node_is_force_deleted_at_its_grace_end() -> None:
    """Kueue preempts a workload while a node under it is dying: its pods are deleted with
    their 120 s grace period, and the one on the dead node, whose kubelet never confirms, is
    force-deleted within a second of that grace's end. The workload is then outside the core
    (Kueue does not admit it): its pods' deadlines are still wake-ups (they were not: only the
    admitted workloads' pods were looked at for wake times, the force delete for all)."""
    world = quiet_world(kueue=True)
    try:
        controller = make_controller(world)
        submit(world, "low", "low", 2, termination_grace_period_s=120)
        until(world, controller, lambda: running(world, "low") == 8, limit_s=120)
        dead = world.nodes_of_pool(world.pools_of("low")[0])[0]
        stuck = next(p["metadata"]["name"] for p in world.running("low") if p["spec"]["nodeName"] == dead)
        world.fail_node(dead)
        submit(world, "high", "high", 2)
        until(world, controller, lambda: world.state("low")["phase"] == "QUEUED"
              and "deletionTimestamp" in (pod(world, stuck) or {}).get("metadata", {}), limit_s=30)
        grace_end = parse_time(pod(world, stuck)["metadata"]["deletionTimestamp"])
        assert grace_end - world.clock.now > world.nodes.grace_s  # the node is known dead before the grace ends
        gone = until(world, controller, lambda: pod(world, stuck) is None, limit_s=200)
        assert grace_end <= gone <= grace_end + 1
        assert any(r == "PodForceDeleted" and stuck in m for _, r, m in events(world, "low"))
    finally:
        world.close()


def test_a_stranded_coordination_service_is_force_deleted_at_its_deadline() -> None:
    """The CPU node under the JAX coordination service dies: its pod is evicted (its
    toleration of an unreachable node runs out), and force-deleted within a second of the end
    of its grace period plus STRANDED_SERVICE_AFTER_S, not at a resync."""
    nodes = load_nodes()
    spare = copy.deepcopy(next(n for n in nodes if n["metadata"]["labels"].get("cloud.google.com/gke-nodepool") == CPU_POOL))
    spare["metadata"]["name"] = spare["metadata"]["labels"]["kubernetes.io/hostname"] = "gke-hotswap-default-pool-spare"
    world = quiet_world(nodes=[*nodes, spare])
    try:
        controller = make_controller(world)
        submit(world, "el", "high", 3, min_slices=2, max_restarts=0)
        until(world, controller, lambda: running(world, "el") == 12 and len(coordinators(world, "el")) == 1
              and coordinators(world, "el")[0]["status"].get("phase") == "Running", limit_s=120)
        (service,) = coordinators(world, "el")
        name = service["metadata"]["name"]
        world.fail_node(service["spec"]["nodeName"])
        until(world, controller, lambda: "deletionTimestamp" in (pod(world, name) or {}).get("metadata", {}), limit_s=120)
        deadline = parse_time(pod(world, name)["metadata"]["deletionTimestamp"]) + STRANDED_SERVICE_AFTER_S
        gone = until(world, controller, lambda: pod(world, name) is None, limit_s=120)
        assert deadline <= gone <= deadline + 1
        assert any(r == "PodForceDeleted" and name in m for _, r, m in events(world, "el"))
    finally:
        world.close()


def test_a_gated_pod_whose_release_keeps_failing_is_recreated_at_its_stall_time(world: World) -> None:
    """Every update of one gated pod is refused: nothing the controller watches changes after
    that, yet the pod is recreated (one Event) within a second of STALL_S and its worker runs."""
    controller = make_controller(world)
    submit(world, "w", "high", 1)
    controller.reconcile()  # admitted: JobSet resumes, the Job creates its pods, gated
    first = min(p["metadata"]["name"] for p in world.pods_of("w"))
    created = parse_time(pod(world, first)["metadata"]["creationTimestamp"])
    world.api.faults.append(Fault("PATCH", f"/api/v1/namespaces/{world.namespace}/pods/{first}", 500))
    stalled = until(world, controller, lambda: any(r == "PodStalled" for _, r, _ in events(world, "w")), limit_s=STALL_S + 10)
    assert stalled <= created + STALL_S + 1
    until(world, controller, lambda: running(world, "w") == 4, limit_s=10)
    assert [r for _, r, _ in events(world, "w")].count("PodStalled") == 1


def test_a_job_without_pods_is_touched_then_recreated_each_at_its_deadline(world: World) -> None:
    """A Job that creates no pods (the Job controller's stale expectations,
    test_kubernetes_interleaving): neither its touch nor its deletion reaches the controller's
    watches (it watches no Jobs), so each next step is a wake-up time of its own: the touch at
    STALL_S, the recreation STALL_S later, the workers running right after, with no resync."""
    controller = make_controller(world)
    submit(world, "w", "high", 1)
    until(world, controller, lambda: running(world, "w") == 4, limit_s=120)
    (job,) = [j for j in world.store.list(JOBS) if j["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == "w"]
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    with world.store.lock:  # two deletions within milliseconds, between two passes of the Job controller
        world.store.delete(JOBS, namespace, name, "Background")
        world.jobsets.reconcile_all()
        world.jobs.reconcile_all()
        world.store.delete(JOBS, namespace, name, "Background")
    world.settle()
    (recreated,) = [j for j in world.store.list(JOBS) if j["metadata"]["name"] == name]
    created = parse_time(recreated["metadata"]["creationTimestamp"])
    stalled = lambda: [m for _, r, m in events(world, "w") if r == "JobStalled"]  # noqa: E731
    touched = until(world, controller, lambda: len(stalled()) == 1, limit_s=STALL_S + 10)
    assert touched <= created + STALL_S + 1 and "touched" in stalled()[0]
    again = until(world, controller, lambda: len(stalled()) == 2, limit_s=STALL_S + 10)
    assert again <= touched + STALL_S + 1 and "recreating it" in stalled()[1]
    until(world, controller, lambda: running(world, "w") == 4, limit_s=10)


def test_an_admitted_workload_with_a_replica_without_a_job_is_repaired_with_one_event_per_touch(world: World) -> None:
    """JobSet's Job creations are refused for two minutes (an admission webhook down): the
    admitted workload is RUNNING, its replicas have no Job, and JobSet's controller backs off
    exponentially (controller-runtime), so once creations work again it would retry only after
    minutes. The controller notices replicas without a Job STALL_S after the workload started
    running and touches the JobSet each STALL_S (one Event each): an event on the JobSet makes
    JobSet reconcile at once, so the Jobs exist within STALL_S of the webhook's return."""
    controller = make_controller(world)
    world.jobsets.refused_creates.add("w")
    submit(world, "w", "high", 2)
    controller.reconcile()
    started = world.clock.now
    assert world.state("w")["phase"] == "RUNNING" and not slice_jobs(world, "w")
    world.advance(120, controller, step=TICK_S)
    stalled = [m for _, r, m in events(world, "w") if r == "JobStalled"]
    assert len(stalled) == 120 // STALL_S and all(m.startswith("replica 0, 1 of the running workload: no Job for ") for m in stalled), stalled
    touched = parse_time(world.jobset("w")["metadata"]["annotations"][labels.TOUCHED_ANNOTATION])
    assert touched == started + 120 // STALL_S * STALL_S
    world.jobsets.refused_creates.discard("w")  # the webhook is back
    assert world.jobsets.backoff["w"].retry_at > world.clock.now + 2 * STALL_S  # JobSet alone would wait this long
    back = world.clock.now
    done = until(world, controller, lambda: running(world, "w") == 8, limit_s=2 * STALL_S)
    assert done <= back + STALL_S + 2
    assert [r for _, r, _ in events(world, "w")].count("JobStalled") == len(stalled) + 1  # the touch that helped
    world.advance(3 * STALL_S, controller, step=TICK_S)
    assert [r for _, r, _ in events(world, "w")].count("JobStalled") == len(stalled) + 1  # none once every replica has its Job


def test_a_replica_whose_job_is_being_deleted_is_not_a_stall(world: World) -> None:
    """While a replica's Job is still being deleted (in the foreground, held by a pod within
    its grace period), the replica waits for it: no JobStalled, no touch."""
    controller = make_controller(world)
    world.nodes.stop_after_s = 25.0  # the workers take their time to save
    submit(world, "w", "high", 2)
    until(world, controller, lambda: running(world, "w") == 8, limit_s=120)
    (job,) = [j for j in world.store.list(JOBS) if j["metadata"]["name"] == "w-slice-1"]
    started = world.clock.now
    controller.client.delete_job("w-slice-1", job["metadata"]["uid"])
    world.advance(STALL_S + 10, controller, step=TICK_S)
    assert not [m for _, r, m in events(world, "w") if r == "JobStalled"]
    assert labels.TOUCHED_ANNOTATION not in world.jobset("w")["metadata"]["annotations"]
    assert world.clock.now - started > STALL_S


def test_after_a_refused_record_nothing_of_that_jobset_is_written_in_that_round(world: World) -> None:
    """An elastic workload grows back onto a freed slice: the round writes its record, releases
    the parked replica's pods and updates its workers' membership. JobSet's controller writes
    the JobSet (its status) between the controller's read and its record's write, so the record
    is refused (409, as the API server refuses a stale resourceVersion): none of that JobSet's
    pods is written in that round (pkg/registry/rest/update.go: the precondition fails). The
    next round decides again on fresh objects and grows it, once."""
    controller = make_controller(world)
    world.add_foreign_pod("xpk-job-0", world.nodes_of_pool("tpu-v6e-np-2")[0])
    submit(world, "el", "high", 3, min_slices=2)
    until(world, controller, lambda: running(world, "el") == 8, limit_s=120)
    assert world.pools_of("el")[2] is None
    refused: list[int] = []

    def jobset_status_written_meanwhile(request: Any) -> None:
        if request.method == "PATCH" and request.path.endswith("/jobsets/el") and not refused:
            refused.append(len(world.api.requests))
            js = world.store.peek(JOBSETS, world.namespace, "el")
            js.setdefault("status", {})["observedGeneration"] = 7  # JobSet's status write
            world.store.write(JOBSETS, js)

    world.api.before_write.append(jobset_status_written_meanwhile)
    world.store.delete(PODS, "other-team", "xpk-job-0", grace=0)  # the slice is free
    controller.reconcile()
    assert refused and world.api.requests[refused[0] - 1].status == 409
    in_that_round = world.api.requests[refused[0]:]
    assert not [r.path for r in in_that_round if r.write and "/pods/" in r.path]  # no release, no membership update
    assert not [r.path for r in in_that_round if r.write and "/events" in r.path]
    until(world, controller, lambda: running(world, "el") == 12, limit_s=30)
    assert [r for _, r, _ in events(world, "el")].count("ScaledUp") <= 1
    assert world.pools_of("el")[2] == "tpu-v6e-np-2"
