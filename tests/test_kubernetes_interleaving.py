"""The controller against a world whose JobSet and Job controllers react between its writes, as
the real ones do within milliseconds (issue 23): one failure is one hotswap, and a Job that
creates no pods is repaired."""

from __future__ import annotations

import pytest
from k8s_fixtures.scenario import events, make_controller, make_world, run_until, running, submit
from k8s_fixtures.world import World
from k8s_fixtures.world.apiserver import Fault
from k8s_fixtures.world.store import JOBS

from hotswap.backends.kit.metrics import ControllerMetrics
from hotswap.backends.kubernetes.child_jobs import STALL_S
from test_kubernetes_metrics import sample


@pytest.fixture
def world() -> World:
    world = make_world(interleave=True)
    yield world
    world.close()


def jobs_created(world: World, jobset: str, since: int) -> list[str]:
    """UIDs of the Jobs of a JobSet created after revision ``since``."""
    return [
        e.obj["metadata"]["uid"] for e in world.store.history
        if e.revision > since and e.resource is JOBS and e.type == "ADDED"
        and (e.obj["metadata"].get("labels") or {}).get("jobset.sigs.k8s.io/jobset-name") == jobset
    ]


def test_one_node_failure_is_one_hotswap_though_jobset_recreates_jobs_between_the_writes(world: World) -> None:
    """JobSet recreates a deleted Job and writes the JobSet's status before the controller's next
    write. The hotswap is still carried out once: one Restarted event, one generation of new
    Jobs, counted once, and the lower-priority workload beside it is left alone."""
    metrics = ControllerMetrics()
    controller = make_controller(world, metrics=metrics)
    submit(world, "low", "low", 1)
    submit(world, "high", "high", 1)
    run_until(world, controller, lambda: running(world, "high") == 4 and running(world, "low") == 4)
    mark = world.store.revision
    requests = len(world.api.requests)
    world.fail_node(world.nodes_of_pool(world.pools_of("high")[0])[0])
    run_until(world, controller, lambda: running(world, "high", attempt=2) == 4, limit_s=300)
    world.advance(60, controller)
    assert [r for _, r, _ in events(world, "high")].count("Restarted") == 1
    assert len(jobs_created(world, "high", mark)) == 1  # one new Job, for its one replica
    deletes = [r for r in world.api.requests[requests:] if r.method == "DELETE" and "/jobs/" in r.path]
    assert len(deletes) == 1
    assert sample(metrics.exposition(), "hotswap_hotswaps_total") == 1
    state = world.state("high")
    assert (state["attempt"], state["disruptions"], state.get("retiring")) == (2, 1, None)
    low = world.state("low")
    assert (low["phase"], low["preemptions"], low["attempt"]) == ("RUNNING", 0, 1)
    assert running(world, "low", attempt=1) == 4 and not world.jobset("low")["spec"].get("suspend")


def test_a_job_that_creates_no_pods_is_touched_then_recreated_and_its_workers_start(world: World) -> None:
    """A Job deleted and recreated under the same name before the Job controller saw the pods it
    had created for the middle one: the Job controller's expectations for that name are never
    met, and it creates no pods for the new Job until they expire, five minutes later (an update
    does not lower them: job_controller.go ``updateJob``). The controller notices a RUNNING
    workload whose Job has no pods and touches it (one Event), then, the touch not helping,
    recreates it (one more): the Job's deletion reaches the Job controller while the name is
    free, which drops the stale expectations, and its workers run again well before the Job
    controller would have recovered alone."""
    controller = make_controller(world)
    submit(world, "w", "high", 1)
    run_until(world, controller, lambda: running(world, "w") == 4)
    (job,) = [j for j in world.store.list(JOBS) if j["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == "w"]
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    with world.store.lock:  # two deletions within milliseconds, between two passes of the Job controller
        world.store.delete(JOBS, namespace, name, "Background")
        world.jobsets.reconcile_all()
        world.jobs.reconcile_all()  # the pods of the middle Job: created, not yet seen by its informer
        world.store.delete(JOBS, namespace, name, "Background")
    world.settle()
    assert len([j for j in world.store.list(JOBS) if j["metadata"]["name"] == name]) == 1
    assert not world.pods_of("w")

    def started() -> bool:
        mine = [p for p in world.running("w") if p["metadata"]["name"].startswith(name)]
        return len(mine) == 4

    run_until(world, controller, started, limit_s=2 * STALL_S + 30)  # alone, the Job controller waits 300 s
    stalled = [m for _, r, m in events(world, "w") if r == "JobStalled"]
    assert len(stalled) == 2 and all(name in m for m in stalled)
    assert "touched" in stalled[0] and "recreating it" in stalled[1]
    world.advance(2 * STALL_S, controller)
    assert [r for _, r, _ in events(world, "w")].count("JobStalled") == 2 and started()
    assert world.state("w")["attempt"] == 1  # repaired in place: no restart, no hotswap


def test_a_pod_whose_release_keeps_failing_is_recreated_once(world: World) -> None:
    """One pod of a RUNNING workload cannot be released (every update of it is refused). After
    the stall time its pod is recreated, with one Event, and the new pod is released: all
    workers run."""
    controller = make_controller(world)
    submit(world, "w", "high", 1)
    controller.reconcile()  # admitted: JobSet resumes, the Job creates its pods, gated
    first = sorted(p["metadata"]["name"] for p in world.pods_of("w"))[0]
    world.api.faults.append(Fault("PATCH", f"/api/v1/namespaces/{world.namespace}/pods/{first}", 500))
    run_until(world, controller, lambda: running(world, "w") == 3)
    took = run_until(world, controller, lambda: running(world, "w") == 4, limit_s=STALL_S + 30)
    assert took > 0 and first not in {p["metadata"]["name"] for p in world.pods_of("w")}
    stalled = [m for _, r, m in events(world, "w") if r == "PodStalled"]
    assert len(stalled) == 1 and first in stalled[0]
    world.advance(2 * STALL_S, controller)
    assert [r for _, r, _ in events(world, "w")].count("PodStalled") == 1 and running(world, "w") == 4


def test_a_job_recreated_under_the_same_name_is_never_deleted_for_its_predecessor(world: World) -> None:
    """The controller deletes a retired Job by name with its UID as a precondition: once JobSet
    has recreated it, the delete is refused and the new Job stays."""
    controller = make_controller(world)
    submit(world, "w", "high", 1)
    run_until(world, controller, lambda: running(world, "w") == 4)
    (job,) = [j for j in world.store.list(JOBS) if j["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == "w"]
    name, old = job["metadata"]["name"], job["metadata"]["uid"]
    assert controller.client.delete_job(name, old) is True
    # In the foreground the Job stays, marked, until the garbage collector has deleted its pods;
    # JobSet creates no Job under a name that is still taken (jobset_controller.go
    # ``shouldCreateJob``), so it recreates it only once the old one is gone.
    (still,) = [j["metadata"] for j in world.store.list(JOBS) if j["metadata"]["name"] == name]
    assert still["uid"] == old and "deletionTimestamp" in still
    uids = lambda: [j["metadata"]["uid"] for j in world.store.list(JOBS) if j["metadata"]["name"] == name]  # noqa: E731
    world.advance(60)  # the pods' grace period: the kubelet confirms, the GC frees the name
    (new,) = uids()
    assert new != old
    assert controller.client.delete_job(name, old) is False
    assert uids() == [new]


def test_one_node_failure_is_one_shrink_of_an_elastic_workload(world: World) -> None:
    """Elastic: the lost replica's Job alone is recreated, once, and the shrink is recorded
    once, though JobSet recreates it before the controller's next write."""
    controller = make_controller(world)
    submit(world, "el", "high", 3, min_slices=2)
    run_until(world, controller, lambda: running(world, "el") == 12)
    pools = world.pools_of("el")
    mark = world.store.revision
    requests = len(world.api.requests)
    world.fail_node(world.nodes_of_pool(pools[2])[0])
    run_until(world, controller, lambda: world.state("el")["membership"] == 1, limit_s=300)
    world.advance(60, controller)
    assert [r for _, r, _ in events(world, "el")].count("ScaledDown") == 1
    assert len(jobs_created(world, "el", mark)) == 1
    assert len([r for r in world.api.requests[requests:] if r.method == "DELETE" and "/jobs/" in r.path]) == 1
    state = world.state("el")
    assert (state["membership"], state.get("retiring")) == (1, None) and world.pools_of("el") == [pools[0], pools[1], None]


def test_a_touched_job_that_still_has_no_pods_is_recreated_by_uid() -> None:
    from hotswap.backends.kubernetes import operations as ops
    from hotswap.backends.kubernetes.child_jobs import ChildJob, repairs
    from hotswap.backends.kubernetes.deadlines import Deadlines

    fresh = ChildJob("w-slice-0", "u1", "w", 0, created=100.0, touched=None, deleting=False, suspended=False, finished=False)
    assert repairs("w", [fresh], frozenset({"u1"}), set(), Deadlines(100.0 + STALL_S - 1)) == []  # not yet
    assert repairs("w", [fresh], frozenset({"u1"}), {"u1"}, Deadlines(1000.0)) == []  # it has pods
    assert repairs("w", [fresh], frozenset(), set(), Deadlines(1000.0)) == []  # retired: not current
    waiting = Deadlines(100.0 + STALL_S - 1)
    assert repairs("w", [fresh], frozenset({"u1"}), set(), waiting) == [] and waiting.wake_at == 100.0 + STALL_S  # its wake-up
    after_touch = Deadlines(100.0 + STALL_S)
    first = repairs("w", [fresh], frozenset({"u1"}), set(), after_touch)
    assert after_touch.wake_at == 100.0 + 2 * STALL_S  # the touch reaches no watch: its own deadline is a wake-up
    assert isinstance(first[0], ops.TouchJob) and first[1].reason == "JobStalled"
    touched = ChildJob("w-slice-0", "u1", "w", 0, created=100.0, touched=100.0 + STALL_S, deleting=False, suspended=False, finished=False)
    assert repairs("w", [touched], frozenset({"u1"}), set(), Deadlines(100.0 + STALL_S + 1)) == []  # the touch gets its time
    second = repairs("w", [touched], frozenset({"u1"}), set(), Deadlines(100.0 + 2 * STALL_S))
    assert second[0] == ops.DeleteJob("w", "w-slice-0", "u1", "stalled") and "recreating" in second[1].message


def test_a_coordinator_loss_seen_with_its_exits_is_one_uncharged_restart_though_jobset_recreates_jobs_between_the_writes(world: World) -> None:
    """The controller is down while the JAX coordination service dies and its workers exit.
    Its first round back sees the loss and the exits at once: it records the loss on the JobSet
    (service-lost-at, and the first of a count in a row) and restarts the workload; JobSet
    recreates the deleted Jobs before the controller's next write. The restart happens once,
    uncharged, and the loss is counted once: the next rounds do not take the recorded loss for
    a new one."""
    from test_kubernetes_jax_coordinator import coordinators, served

    from hotswap.backends.kubernetes import labels

    controller = make_controller(world)
    submit(world, "el", "high", 3, min_slices=2, max_restarts=0)
    run_until(world, controller, lambda: served(world, 1))
    mark = world.store.revision
    (service,) = coordinators(world, "el")
    world.exit([service], 1)  # no controller watches
    world.advance(2)
    world.exit([p for p in world.running("el") if p["metadata"]["labels"][labels.REPLICATED_JOB_NAME_LABEL] == "slice"], 1)
    world.advance(90)  # past the hold in which exits wait to be judged
    controller = make_controller(world)  # back
    run_until(world, controller, lambda: served(world, 2), limit_s=300)
    world.advance(120, controller)
    assert [r for _, r, _ in events(world, "el")].count("Restarted") == 1
    assert len(jobs_created(world, "el", mark)) == 3  # one generation of the slices' Jobs
    annotations = world.jobset("el")["metadata"]["annotations"]
    assert annotations[labels.SERVICE_LOSSES_IN_A_ROW_ANNOTATION] == "1" and labels.SERVICE_LOST_ANNOTATION in annotations
    state = world.state("el")
    assert (state["phase"], state["attempt"], state["restarts"]) == ("RUNNING", 2, 0)
