"""Issue 35: the records' heartbeat interval follows the cluster's size while workloads run. The
controller patches each record Lease whose interval is not the cluster's (once, within a rate,
again after a refusal, never in the steady state); a worker keeps the old interval until its
next write and its record says so, so the switch makes no false hang. The real channel
(hotswap.train.report_channel) against the world's API server, on the world's virtual clock."""

from __future__ import annotations

import copy
from typing import Any

from k8s_fixtures.scenario import POOLS, make_controller, make_world, run_until, running
from k8s_fixtures.world.apiserver import Fault
from k8s_fixtures.world.store import LEASES, NODES
from test_kubernetes_frozen_workers import _create, _train
from test_kubernetes_worker_reports import _stored, _trained

from hotswap.api.spec import workload_spec
from hotswap.api.worker_report import INTERVAL_ANNOTATION, REPORT_ANNOTATION, heartbeat_interval, report_name
from hotswap.backends.kubernetes.render.controller import controller_rules
from hotswap.backends.kubernetes.render.reports import report_leases
from hotswap.backends.kubernetes.settings import KubeSettings


def _lease_path(world: Any, name: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{world.namespace}/leases/{name}"


def _patches(world: Any, since: int = 0) -> list[str]:
    """The Lease patches sent from request ``since`` on (the controller's: the workers update)."""
    return [r.path for r in world.api.writes(since, leases=True) if r.method == "PATCH" and "/leases/" in r.path]


def _asked(world: Any, name: str) -> str:
    return world.store.get(LEASES, world.namespace, name)["metadata"]["annotations"][INTERVAL_ANNOTATION]


def _slices(controller: Any) -> int:
    return len(controller.observe().discovery.slices)


def _add_pool(world: Any, pool: str, like: str = POOLS[0]) -> None:
    """A node pool added to the cluster (GKE: `gcloud container node-pools create`)."""
    for name in world.nodes_of_pool(like):
        node = copy.deepcopy(world.store.peek(NODES, "", name))
        meta = node["metadata"]
        for key in ("resourceVersion", "uid", "creationTimestamp"):
            meta.pop(key, None)
        meta["name"] = f"{name}-{pool}"
        meta["labels"] = {k: (v.replace(like, pool) if isinstance(v, str) else v) for k, v in meta["labels"].items()}
        world.store.create(NODES, node)


def _grown_at(controller: Any, slices: int, interval_s: float) -> None:
    """The interval of a cluster beyond ``slices`` slices is ``interval_s`` (the world's few slices
    standing for thousands)."""
    controller.intervals.interval_of_cluster = lambda n: interval_s if n > slices else heartbeat_interval(n)


def test_a_grown_cluster_raises_a_running_records_interval_with_one_patch() -> None:
    """A node pool is added while the workload runs: its Lease asks for the grown cluster's
    interval after one merge patch, and nothing is written after it. The worker keeps 10 s until
    its next write (a conflict: it reads the Lease again), then 100 s, which its record says; it
    is not called hung for writing every 100 s."""
    world = make_world()
    controller = make_controller(world)
    try:
        _create(world, "w", 10.0)
        run_until(world, controller, lambda: running(world, "w") == 4)
        channel = _trained(world, "w")
        assert channel.report.interval_s == 10.0
        _grown_at(controller, _slices(controller), 100.0)
        since = len(world.api.requests)
        _add_pool(world, "tpu-v6e-np-9")
        world.advance(5, controller)
        assert _asked(world, report_name("w", 0)) == "100"
        assert _patches(world, since) == [_lease_path(world, report_name("w", 0))]
        assert channel.report.interval_s == 10.0  # it has not written since
        channel.publish()
        assert channel.report.interval_s == 100.0 and _stored(world, "w").interval_s == 100.0
        assert _stored(world, "w").progress.last_step == 10  # the patch left the record alone
        since = len(world.api.requests)
        _train(world, controller, channel, 600, step_every=5.0, write_every=100.0)
        assert _patches(world, since) == []  # the steady state writes nothing
        assert _asked(world, report_name("w", 0)) == "100"  # no write of the worker's put the old one back
        assert world.state("w")["attempt"] == 1 and not [line for line in controller.logs if "frozen" in line]
    finally:
        world.close()


def test_a_worker_keeping_the_old_longer_interval_is_not_hung_while_it_switches() -> None:
    """The cluster shrinks from 600 s's size: the Lease asks for 10 s at once, but the worker
    sleeps out its 600 s before its next write. The controller judges the silence by the record's
    600 s (by the Lease's 10 s, 600 s unrenewed would be far beyond the 110 s a frozen worker
    gets); after that write the record says 10 s and the worker keeps it."""
    world = make_world()
    controller = make_controller(world)
    try:
        _grown_at(controller, 0, 600.0)
        _create(world, "w", 600.0)
        run_until(world, controller, lambda: running(world, "w") == 4)
        channel = _trained(world, "w")
        assert channel.report.interval_s == 600.0
        controller.intervals.interval_of_cluster = heartbeat_interval  # pools deleted: the world's own size
        world.advance(2, controller)
        assert _asked(world, report_name("w", 0)) == "10"
        _train(world, controller, channel, 600, step_every=5.0, write_every=600.0)
        assert _stored(world, "w").interval_s == 10.0 and channel.report.interval_s == 10.0
        _train(world, controller, channel, 300, step_every=5.0, write_every=10.0)
        assert world.state("w")["attempt"] == 1 and world.state("w")["restarts"] == 0
        assert not [line for line in controller.logs if "frozen" in line]
    finally:
        world.close()


def test_the_patches_keep_a_rate_and_a_refused_one_is_retried_next_round() -> None:
    """120 records asking for 600 s in a cluster of 10 s's size: 50 patched a second (a round
    woken for each batch, not the resync), the refused one (a 500) patched the round after, each
    Lease patched once when accepted, and nothing written once all ask for 10 s."""
    world = make_world()
    controller = make_controller(world)
    try:
        _create(world, "w", 10.0)
        run_until(world, controller, lambda: running(world, "w") == 4)
        spec = workload_spec(name="w", command="python3 train.py", device_type="v6e-16", num_slices=121, priority="high")
        for lease in report_leases(spec, world.namespace, world.jobset("w"), 600.0)[1:]:
            world.apply(lease)
        names = [report_name("w", replica) for replica in range(1, 121)]
        refused = _lease_path(world, names[7])
        world.api.faults.append(Fault("PATCH", refused, 500, times=1))
        since = len(world.api.requests)
        controller.reconcile()
        assert len(_patches(world, since)) == 50
        assert controller.wake_at is not None and controller.wake_at - world.clock.now <= 1.0 + 1e-9
        world.advance(3, controller)
        patches = _patches(world, since)
        assert all(_asked(world, name) == "10" for name in names)
        assert len(patches) == 121 and patches.count(refused) == 2 and len(set(patches)) == 120
        since = len(world.api.requests)
        world.advance(60, controller)
        assert _patches(world, since) == []
    finally:
        world.close()


def test_the_controller_may_patch_the_records_and_nothing_more_of_them() -> None:
    """Least privilege: `patch` on Leases (the records' names are the workloads'), not `update`."""
    _, namespaced = controller_rules("c", KubeSettings())
    lease_verbs = sorted(v for rule in namespaced if "leases" in rule["resources"] and not rule.get("resourceNames") for v in rule["verbs"])
    assert lease_verbs == ["create", "list", "patch"]
    assert REPORT_ANNOTATION  # the patch names only the interval annotation (report_intervals.py)


def test_a_role_without_patch_is_said_once_and_tried_again_minutes_later() -> None:
    """A controller under an earlier release's Role (no `patch` on Leases): one warning, no
    refused write every round, and the interval kept once the Role allows it."""
    world = make_world()
    controller = make_controller(world)
    controller.client.sleep = lambda seconds: None  # the client's own retries of a 403
    try:
        controller.intervals.interval_of_cluster = lambda slices: 600.0
        _create(world, "w", 10.0)
        forbidden = Fault("PATCH", _lease_path(world, report_name("w", 0)), 403, "Forbidden")
        world.api.faults.append(forbidden)
        run_until(world, controller, lambda: running(world, "w") == 4)
        tried = len(_patches(world))
        assert tried >= 1
        world.advance(120, controller)
        assert len(_patches(world)) == tried and _asked(world, report_name("w", 0)) == "10"
        assert len([line for line in controller.logs if "heartbeat interval stays as created" in line]) == 1
        world.api.faults.remove(forbidden)
        world.advance(300, controller)
        assert _asked(world, report_name("w", 0)) == "600"
    finally:
        world.close()
