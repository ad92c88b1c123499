"""Issue 35's review of the local backend's bug fixed in 695d24c (rounds.still_wanted): in one
round a worker's exit restarted workload W, then a higher priority preempted W; the local
controller made the restart's start anyway, on a slice W's preemptor held. The Kubernetes
controller plans each JobSet from the decision's final state (the state record, the suspension
and the pod releases are level-triggered, planning.py), so a restart and a preemption of one
workload in one decision must come out as the preemption alone: no pod of W released, W
suspended and queued, its preemptor on W's slice."""

from __future__ import annotations

import pytest
from k8s_fixtures.scenario import make_controller, make_world, run_until, running, submit

from hotswap.backends.kubernetes import operations as ops
from hotswap.backends.kubernetes.pod_signals import EXIT_HOLD_S


@pytest.mark.parametrize("kueue", [False, True])
def test_a_restart_and_a_preemption_of_one_workload_in_one_round_start_nothing_of_it(kueue: bool) -> None:
    """W (low) shares a full cluster with M (medium); W's worker exits 42 and H (high) arrives
    while the controller is not running; the exit's hold ends, and one round sees both."""
    world = make_world(kueue=kueue)
    try:
        controller = make_controller(world)
        submit(world, "m", "medium", 2)
        submit(world, "w", "low", 1, max_restarts=5)
        run_until(world, controller, lambda: running(world, "m") == 8 and running(world, "w") == 4)
        (pool,) = world.pools_of("w")
        # Both seen by one round: W's worker exits with a restart code, and a high-priority
        # workload that needs W's slice arrives, while the controller does not run; then the
        # exit's hold is over.
        world.exit(world.running("w")[:1], 42)
        submit(world, "h", "high", 1)
        world.advance(EXIT_HOLD_S + 5)
        operations = controller.reconcile()
        if not kueue:  # one decision restarted W (its exit) and preempted it (for H); under Kueue, Kueue evicted W first
            reasons = [op.reason for op in operations if isinstance(op, ops.RecordEvent) and op.jobset == "w"]
            assert reasons == ["Restarted", "Preempted"]
            assert [op.suspend for op in operations if isinstance(op, ops.PatchJobSet) and op.jobset == "w"] == [True]
        assert not [op for op in operations if isinstance(op, ops.PlacePod) and op.jobset == "w"]
        state = world.state("w")
        assert (state["phase"], state["preemptions"]) == ("QUEUED", 1)
        run_until(world, controller, lambda: running(world, "h") == 4)
        world.advance(60, controller)
        assert world.pools_of("h") == [pool]
        assert running(world, "w") == 0 and world.state("w")["phase"] == "QUEUED"
        assert not [p for p in world.pods_of("w") if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
                    and p["status"].get("phase") in ("Pending", "Running")]
    finally:
        world.close()
