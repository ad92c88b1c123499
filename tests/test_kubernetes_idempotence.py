"""Idempotence: a reconcile that finds the cluster as its decision wants it writes nothing. Write
calls are counted at the world's API server (Lease renewals aside: they are leader election's
heartbeat, not reconciles)."""

from __future__ import annotations

import pytest
from k8s_fixtures.scenario import make_controller, make_world, run_until, running, submit

from hotswap.backends.kubernetes.pod_signals import EXIT_HOLD_S


def assert_quiet(world, controller, seconds: float = 300.0) -> None:
    mark = len(world.api.requests)
    assert controller.reconcile() == [] and controller.reconcile() == []  # two in a row, no change
    world.advance(seconds, controller)  # resyncs every 30 s
    writes = world.api.writes(mark)
    assert writes == [], [(w.method, w.path) for w in writes]


@pytest.mark.parametrize("kueue", [False, True], ids=["hotswap-admits", "kueue"])
def test_every_kind_of_workload_at_rest_costs_no_write(kueue: bool) -> None:
    """Running, queued, scaled down with a parked replica, failed, rejected: at rest, none of
    them is written again; and a fresh controller (a restart, a new leader) agrees."""
    world = make_world(kueue=kueue)
    try:
        controller = make_controller(world)
        submit(world, "elastic", "high", 2, min_slices=1)
        run_until(world, controller, lambda: running(world, "elastic") == 8)
        submit(world, "bad", "very-high", 1)
        run_until(world, controller, lambda: running(world, "bad") == 4)
        submit(world, "waiting", "low", 2)
        submit(world, "huge", "medium", 5)
        world.advance(5, controller)
        assert_quiet(world, controller)
        world.exit(world.running("bad"), 1)
        run_until(world, controller, lambda: world.state("bad")["phase"] == "FAILED", limit_s=EXIT_HOLD_S + 30)
        world.advance(30, controller)
        pools = world.pools_of("elastic")
        world.fail_node(world.nodes_of_pool(pools[1])[0])
        run_until(world, controller, lambda: world.state("elastic").get("membership", 0) >= 1)
        # The lost replica's Job is deleted in the foreground: it goes (and the record forgets
        # it) once its pod on the failed node is gone, after that pod's grace period.
        run_until(world, controller, lambda: "retiring" not in world.state("elastic"))
        world.advance(30, controller)
        assert_quiet(world, controller)
        assert make_controller(world).reconcile() == []
    finally:
        world.close()


def test_the_steady_state_of_the_seed_000_drill_costs_no_write() -> None:
    world = make_world()
    try:
        controller = make_controller(world)
        submit(world, "low", "low", 1)
        submit(world, "high", "high", 2)
        run_until(world, controller, lambda: running(world, "high") == 8 and running(world, "low") == 4)
        world.advance(3, controller)  # the round after the release records it
        assert_quiet(world, controller)
        world.fail_node(world.nodes_of_pool(world.pools_of("high")[0])[0])
        run_until(world, controller, lambda: running(world, "high", attempt=2) == 8)
        world.advance(30, controller)
        assert_quiet(world, controller)
    finally:
        world.close()
