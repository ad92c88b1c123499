"""Leader election: never two controllers acting at once, whatever their clocks say and however
long a reconcile takes (client-go's rules), and a second replica that takes over a dead
leader's hotswap. The Lease lives in the world's API server (409 on a stale write)."""

from __future__ import annotations

import dataclasses

import pytest
from k8s_fixtures.scenario import make_controller, make_world, running, submit
from k8s_fixtures.world import World

from hotswap.backends.kubernetes import labels
from hotswap.backends.kubernetes.lease import (
    LEASE_DURATION_S,
    RENEW_DEADLINE_S,
    RETRY_PERIOD_S,
    LeaseRecord,
    lease_body,
    next_step,
    observe,
    read_lease,
    released,
)
from hotswap.backends.kubernetes.controller.leader import LeaderElector

@pytest.fixture
def world() -> World:
    world = make_world()
    yield world
    world.close()


# ---------------------------------------------------------------------- the rules, pure


def test_a_follower_judges_expiry_by_when_it_saw_the_record_change() -> None:
    held = LeaseRecord("a", acquired=1000.0, renewed=1000.0, duration_s=15)
    # b's wall clock is far ahead of a's: renewTime + duration is long past by b's clock...
    seen = observe(held, None, local_now=50.0)
    assert next_step(held, seen, "b", wall_now=99_999.0, local_now=50.0, duration_s=15).action == "wait"
    # ...but only b's own clock counts: unchanged for a lease duration since b saw it, it is free.
    assert next_step(held, seen, "b", wall_now=99_999.0, local_now=64.0, duration_s=15).action == "wait"
    taken = next_step(held, observe(held, seen, 66.0), "b", wall_now=99_999.0, local_now=66.0, duration_s=15)
    assert taken.action == "update" and taken.record.holder == "b" and taken.record.transitions == 1
    # Any change of the record restarts the wait.
    renewed = dataclasses.replace(held, renewed=1002.0)
    again = observe(renewed, seen, 66.0)
    assert again.at == 66.0 and next_step(renewed, again, "b", 99_999.0, 66.0, 15).action == "wait"


def test_lease_state_machine() -> None:
    first = next_step(None, None, "a", 1000.0, 0.0, 15)
    assert first.action == "create" and first.record.holder == "a"
    renewed = next_step(first.record, observe(first.record, None, 5.0), "a", 1005.0, 5.0, 15)
    assert renewed.action == "update" and renewed.record.renewed == 1005.0 and renewed.record.transitions == 0
    free = released(first.record, "a")
    assert free is not None and next_step(free, observe(free, None, 1.0), "b", 1001.0, 1.0, 15).action == "update"
    assert released(first.record, "b") is None
    record = LeaseRecord("pod-a", 1000.5, 1010.25, 15, 3, "42")
    body = lease_body("hotswap-controller", "default", record)
    assert body["metadata"]["resourceVersion"] == "42"  # optimistic concurrency on every write
    assert read_lease(body) == record
    assert RENEW_DEADLINE_S < LEASE_DURATION_S and RETRY_PERIOD_S < RENEW_DEADLINE_S


# ---------------------------------------------------------------------- against the API server


class Replica:
    """A controller replica with its own clocks: wall (may be skewed) and local (monotonic)."""

    def __init__(self, world: World, name: str, skew_s: float = 0.0) -> None:
        self.world = world
        self.controller = make_controller(world)
        self.elector = LeaderElector(
            self.controller.client, name, clock=lambda: world.clock.now + skew_s, local_clock=lambda: world.clock.now, log=lambda line: None
        )
        self.controller.may_act = self.elector.may_act
        self.alive = True


def drive(world: World, replicas: list[Replica], seconds: float) -> list[float]:
    """Both replicas as ``controller run`` drives them: renew every retry period, reconcile
    while allowed. Returns the times at which both could act (must stay empty)."""
    both: list[float] = []
    end = world.clock.now + seconds
    while world.clock.now < end:
        world.clock.now += RETRY_PERIOD_S
        world.settle()
        for replica in replicas:
            if replica.alive:
                replica.elector.tick()
        if sum(1 for r in replicas if r.alive and r.elector.may_act()) > 1:
            both.append(world.clock.now)
        for replica in replicas:
            if replica.alive and replica.elector.may_act():
                replica.controller.reconcile()
                world.settle()
    return both


def test_a_skewed_clock_never_makes_a_second_leader(world: World) -> None:
    """Replica b's clock runs a minute ahead. Judging the leader's renewTime on its own clock it
    would see an expired Lease at once; it must instead wait for the record to stop changing."""
    a, b = Replica(world, "a"), Replica(world, "b", skew_s=60.0)
    assert drive(world, [a, b], 2 * RETRY_PERIOD_S) == []
    assert a.elector.may_act() and not b.elector.may_act()
    assert drive(world, [a, b], 120) == []
    assert world.client().get_lease(labels.CONTROLLER_NAME)["spec"]["holderIdentity"] == "a"


def test_a_leader_that_cannot_renew_stops_acting_before_anyone_takes_over(world: World) -> None:
    """a cannot reach the Lease (its renewals fail) while b can: a stops acting at its renew
    deadline, b takes over only after a lease duration of no change: never both."""
    a, b = Replica(world, "a"), Replica(world, "b")
    drive(world, [a, b], 4)
    assert a.elector.may_act()
    failing_since = world.clock.now

    def a_cannot_renew(*args, **kwargs):
        from hotswap.backends.kubernetes.client import UnreachableError

        raise UnreachableError("cannot reach the Kubernetes API server while trying to renew the controller's Lease")

    a.elector.client.replace_lease = a_cannot_renew  # only a's path to the API server is broken
    stopped = taken = None
    while world.clock.now < failing_since + 30:
        assert drive(world, [a, b], RETRY_PERIOD_S) == []
        if stopped is None and not a.elector.may_act():
            stopped = world.clock.now
        if taken is None and b.elector.may_act():
            taken = world.clock.now
    assert stopped is not None and stopped - failing_since <= RENEW_DEADLINE_S + RETRY_PERIOD_S
    assert taken is not None and taken > stopped


def test_a_long_reconcile_stops_writing_when_leadership_lapses(world: World) -> None:
    """The renew deadline also holds mid-reconcile: operations are applied only while the
    controller may act."""
    controller = make_controller(world)
    submit(world, "a", "high", 1)
    submit(world, "b", "high", 1)
    allowed = iter([True, False])
    controller.may_act = lambda: next(allowed, False)
    mark = len(world.api.requests)
    controller.reconcile()
    assert len(world.api.writes(mark)) == 1
    assert "no longer the leader" in controller.logs[-1]


def test_two_replicas_the_survivor_completes_the_hotswap(world: World) -> None:
    a, b = Replica(world, "a"), Replica(world, "b")
    submit(world, "low", "low", 1)
    submit(world, "high", "high", 2)
    both = drive(world, [a, b], 30)
    assert both == [] and running(world, "high") == 8
    writers = {r.path for r in world.api.writes()}
    assert writers  # a did the work
    a.alive = False  # the leader's pod is killed: no release, no renewal
    world.fail_node(world.nodes_of_pool(world.pools_of("high")[0])[0])
    for _ in range(100):
        assert drive(world, [a, b], RETRY_PERIOD_S) == []
        if running(world, "high", attempt=2) == 8:
            break
    assert b.elector.may_act() and running(world, "high", attempt=2) == 8
    assert world.state("high")["disruptions"] == 1 and world.state("low")["preemptions"] == 1
