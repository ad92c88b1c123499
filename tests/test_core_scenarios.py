"""The scheduling core, one readable scenario per row.

Each row builds a cluster (3 slices of v6e-16 unless it says otherwise), runs its set-up steps
(one decision round each), then one trigger round, and checks the trigger's actions and the
resulting workload states. Slices are written by their short names ``np-<i>``; ``c-np-<i>-<h>``
is host ``h`` of slice ``i``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from builders import World, cordon, create, drain, fail, repair

from hotswap.core import events as ev
from hotswap.core.policy import SchedulerConfig

Step = Any  # an Event, a list of Events (one round), or a callable(World)


@dataclasses.dataclass
class Case:
    id: str
    setup: Sequence[Step]
    trigger: Step
    actions: list[str]
    states: dict[str, str]
    slices: int = 3
    config: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    extra: tuple[tuple[str, int], ...] = ()


def run_step(world: World, step: Step) -> list[str]:
    if callable(step) and not isinstance(step, type):
        return step(world)
    if isinstance(step, list):
        return world.step(*step)
    return world.step(step)


def finish(name: str) -> Callable[[World], list[str]]:
    return lambda w: w.finish(name)


def exit_code(name: str, code: int) -> Callable[[World], list[str]]:
    return lambda w: w.exit(name, code)


def lost(name: str) -> Callable[[World], list[str]]:
    """The backend lost a worker of the current attempt (its controller's crash killed its shim)."""
    return lambda w: w.step(ev.WorkerLost(name, w.workload(name).attempt, w.workload(name).slices[0], 0, "was lost"))


def stopped(name: str) -> Callable[[World], list[str]]:
    return lambda w: w.stop_all(name)


def checkpoint(name: str) -> Callable[[World], list[str]]:
    return lambda w: w.checkpoint(name)


def both(*steps: Callable[[World], list[str]]) -> Callable[[World], list[str]]:
    def run(world: World) -> list[str]:
        out: list[str] = []
        for step in steps:
            out += step(world)
        return out

    return run


WAIT_FOR_REPAIR = SchedulerConfig(hotswap=False, elastic=False)
ELASTIC = {"min_slices": 2}

CASES = [
    # 1. Queue: priority, then FIFO within a level; what can never fit is rejected.
    Case(
        "queue: higher priority is admitted first",
        slices=1,
        setup=[create("run", 1, "very-high"), create("l1", 1, "low"), create("h1", 1, "high"), create("l2", 1, "low")],
        trigger=finish("run"),
        actions=["complete run", "admit h1 np-0"],
        states={"h1": "RUNNING np-0", "l1": "QUEUED", "l2": "QUEUED"},
    ),
    Case(
        "queue: FIFO within one priority level",
        slices=1,
        setup=[create("run", 1, "very-high"), create("l1", 1, "low"), create("l2", 1, "low")],
        trigger=finish("run"),
        actions=["complete run", "admit l1 np-0"],
        states={"l1": "RUNNING np-0", "l2": "QUEUED"},
    ),
    Case(
        "queue: a workload larger than the cluster is rejected at creation",
        setup=[],
        trigger=create("big", 4),
        actions=["reject big"],
        states={},
    ),
    Case(
        "queue: a device type the cluster does not have is rejected",
        setup=[],
        trigger=create("other", 1, device="v5p-16"),
        actions=["reject other"],
        states={},
    ),
    Case(
        "queue: a duplicate name is rejected and the original is untouched",
        setup=[create("a", 1, "low")],
        trigger=create("a", 2, "high"),
        actions=["reject a"],
        states={"a": "RUNNING np-0"},
    ),
    # 2. Admission: exclusive, healthy slices of the right type.
    Case(
        "admission: one workload per slice",
        setup=[create("a", 2)],
        trigger=create("b", 2),
        actions=[],
        states={"a": "RUNNING np-0,np-1", "b": "QUEUED"},
    ),
    Case(
        "admission: never onto a slice with a failed node",
        setup=[fail(0)],
        trigger=create("a", 1),
        actions=["admit a np-1"],
        states={"a": "RUNNING np-1"},
    ),
    Case(
        "admission: never onto a cordoned slice",
        setup=[cordon(0, 1), cordon(1, 3)],
        trigger=create("a", 1),
        actions=["admit a np-2"],
        states={"a": "RUNNING np-2"},
    ),
    Case(
        "admission: only slices of the workload's device type",
        slices=2,
        extra=(("v5p-16", 2),),
        setup=[],
        trigger=create("p", 2, device="v5p-16"),
        actions=["admit p np-2,np-3"],
        states={"p": "RUNNING np-2,np-3"},
    ),
    # 3. Preemption: strictly lower priority, whole workloads, minimal set, least work lost.
    Case(
        "preemption: lowest priority is the victim",
        slices=2,
        setup=[create("low", 1, "low"), create("vlow", 1, "very-low")],
        trigger=create("high", 1, "high"),
        actions=["preempt vlow by high", "admit high np-1"],
        states={"high": "RUNNING np-1", "low": "RUNNING np-0", "vlow": "QUEUED"},
    ),
    Case(
        "preemption: among equals, the least progress since its checkpoint",
        slices=2,
        setup=[create("a", 1, "low"), create("b", 1, "low"), checkpoint("a")],
        trigger=create("high", 1, "high"),
        actions=["preempt a by high", "admit high np-0"],
        states={"a": "QUEUED", "b": "RUNNING np-1"},
    ),
    Case(
        "preemption: with equal progress, the most recently started",
        slices=2,
        setup=[create("a", 1, "low"), create("b", 1, "low"), lambda w: w.step(
            ev.CheckpointRecorded("a", 5, w.now), ev.CheckpointRecorded("b", 5, w.now))],
        trigger=create("high", 1, "high"),
        actions=["preempt b by high", "admit high np-1"],
        states={"a": "RUNNING np-0", "b": "QUEUED"},
    ),
    Case(
        "preemption: equal priority is never preempted",
        slices=2,
        setup=[create("a", 2, "high")],
        trigger=create("b", 1, "high"),
        actions=[],
        states={"a": "RUNNING np-0,np-1", "b": "QUEUED"},
    ),
    Case(
        "preemption: the victim is preempted whole",
        slices=2,
        setup=[create("low", 2, "low")],
        trigger=create("high", 1, "high"),
        actions=["preempt low by high", "admit high np-0"],
        states={"low": "QUEUED", "high": "RUNNING np-0"},
    ),
    Case(
        "preemption: the victim set is minimal (a needless victim is spared)",
        setup=[create("a", 1, "very-low"), create("b", 2, "low")],
        trigger=create("high", 2, "high"),
        actions=["preempt b by high", "admit high np-1,np-2"],
        states={"a": "RUNNING np-0", "b": "QUEUED", "high": "RUNNING np-1,np-2"},
    ),
    Case(
        "preemption: not enough lower-priority capacity means nobody is preempted",
        setup=[create("top", 2, "very-high"), create("low", 1, "low")],
        trigger=create("high", 2, "high"),
        actions=[],
        states={"top": "RUNNING np-0,np-1", "low": "RUNNING np-2", "high": "QUEUED"},
    ),
    # 4. Shrink before evict.
    Case(
        "shrink: an elastic lower-priority workload gives up a slice before anyone is evicted",
        slices=4,
        setup=[create("e", 3, "low", **ELASTIC), create("v", 1, "very-low")],
        trigger=create("h", 1, "high"),
        actions=["scaledown e -np-2", "admit h np-2"],
        states={"e": "RUNNING np-0,np-1", "v": "RUNNING np-3", "h": "RUNNING np-2"},
    ),
    Case(
        "shrink: when shrinking is not enough, evict the fewest and shrink the rest",
        slices=4,
        setup=[create("e", 3, "low", **ELASTIC), create("v", 1, "very-low")],
        trigger=create("h", 2, "high"),
        actions=["preempt v by h", "scaledown e -np-2", "admit h np-2,np-3"],
        states={"e": "RUNNING np-0,np-1", "v": "QUEUED", "h": "RUNNING np-2,np-3"},
    ),
    # 5. Hotswap.
    Case(
        "hotswap: a failed node moves the high job onto the low job's slice (seed 000)",
        setup=[create("low", 1, "low"), create("high", 2, "high")],
        trigger=fail(1),
        actions=["preempt low by high", "restart high np-0,np-2"],
        states={"low": "QUEUED", "high": "RUNNING np-0,np-2"},
    ),
    Case(
        "hotswap: a free spare is used before anyone is preempted",
        slices=4,
        setup=[create("low", 1, "low"), create("high", 2, "high")],
        trigger=fail(1, 3),
        actions=["restart high np-3,np-2"],
        states={"low": "RUNNING np-0", "high": "RUNNING np-3,np-2"},
    ),
    Case(
        "hotswap: a cordon moves the job like a failure",
        setup=[create("low", 1, "low"), create("high", 2, "high")],
        trigger=cordon(2),
        actions=["preempt low by high", "restart high np-1,np-0"],
        states={"low": "QUEUED", "high": "RUNNING np-1,np-0"},
    ),
    Case(
        "hotswap: a drain moves the job like a failure",
        setup=[create("low", 1, "low"), create("high", 2, "high")],
        trigger=drain(1),
        actions=["preempt low by high", "restart high np-0,np-2"],
        states={"low": "QUEUED", "high": "RUNNING np-0,np-2"},
    ),
    Case(
        "hotswap: BlockingRecreate reserves the slices but waits for the old workers",
        setup=[create("low", 1, "low"), create("high", 2, "high", restart_strategy="BlockingRecreate")],
        trigger=fail(1),
        actions=["preempt low by high", "restart high np-0,np-2 (waiting)"],
        states={"low": "QUEUED", "high": "RESTARTING np-0,np-2"},
    ),
    Case(
        "hotswap: BlockingRecreate starts once every old worker is gone",
        setup=[create("low", 1, "low"), create("high", 2, "high", restart_strategy="BlockingRecreate"), fail(1)],
        trigger=stopped("high"),
        actions=["start high np-0,np-2"],
        states={"high": "RUNNING np-0,np-2"},
    ),
    Case(
        "hotswap: never takes slices of equal or higher priority; requeues instead",
        setup=[create("a", 1, "high"), create("b", 2, "high")],
        trigger=fail(1),
        actions=["requeue b"],
        states={"a": "RUNNING np-0", "b": "QUEUED"},
    ),
    Case(
        "hotswap: with no capacity, the released slices go to lower-priority work",
        slices=2,
        setup=[create("high", 2, "high"), create("low", 1, "low")],
        trigger=fail(0),
        actions=["requeue high", "admit low np-1"],
        states={"high": "QUEUED", "low": "RUNNING np-1"},
    ),
    Case(
        "hotswap: a failure on a free slice changes nothing",
        setup=[create("a", 1)],
        trigger=fail(2),
        actions=[],
        states={"a": "RUNNING np-0"},
    ),
    Case(
        "hotswap: a slice removed from the cluster is replaced like a broken one",
        slices=3,
        setup=[create("a", 2)],
        trigger=ev.SliceRemoved("c-np-0"),
        actions=["restart a np-2,np-1"],
        states={"a": "RUNNING np-2,np-1"},
    ),
    # 6. Elastic.
    Case(
        "elastic: a lost slice scales the workload down; it keeps running",
        setup=[create("e", 3, **ELASTIC)],
        trigger=fail(1),
        actions=["scaledown e -np-1"],
        states={"e": "RUNNING np-0,np-2"},
    ),
    Case(
        "elastic: it grows back when the slice is repaired",
        setup=[create("e", 3, **ELASTIC), fail(1)],
        trigger=repair(1),
        actions=["scaleup e +np-1"],
        states={"e": "RUNNING np-0,np-2,np-1"},
    ),
    Case(
        "elastic: a free spare replaces the lost slice in the same round",
        slices=4,
        setup=[create("e", 3, **ELASTIC)],
        trigger=fail(1),
        actions=["scaledown e -np-1", "scaleup e +np-3"],
        states={"e": "RUNNING np-0,np-2,np-3"},
    ),
    Case(
        "elastic: with hotswap it takes a lower-priority slice without restarting",
        slices=4,
        setup=[create("e", 3, "high", **ELASTIC), create("low", 1, "low")],
        trigger=fail(1),
        actions=["scaledown e -np-1", "preempt low by e", "scaleup e +np-3"],
        states={"e": "RUNNING np-0,np-2,np-3", "low": "QUEUED"},
    ),
    Case(
        "elastic: below min_slices it cannot continue; with no capacity it is requeued",
        setup=[create("e", 3, **ELASTIC), fail(0)],
        trigger=fail(1),
        actions=["requeue e"],
        states={"e": "QUEUED"},
    ),
    Case(
        "elastic: queued work of the same priority is served before growth",
        slices=4,
        setup=[create("e", 3, "low", **ELASTIC), create("x", 1, "very-high"), fail(2), create("q", 1, "low")],
        trigger=repair(2),
        actions=["admit q np-2"],
        states={"e": "RUNNING np-0,np-1", "q": "RUNNING np-2"},
    ),
    Case(
        "elastic: admitted on fewer slices when that is all there is, never below min",
        slices=3,
        setup=[create("x", 1, "very-high")],
        trigger=create("e", 3, **ELASTIC),
        actions=["admit e np-1,np-2"],
        states={"e": "RUNNING np-1,np-2"},
    ),
    Case(
        "elastic: growth takes only free capacity, it never preempts",
        slices=4,
        setup=[create("e", 3, "high", **ELASTIC), create("x", 1, "very-high"), fail(0), create("low", 1, "low")],
        trigger=ev.WorkloadDeleted("x"),
        actions=["remove x", "scaleup e +np-3"],
        states={"e": "RUNNING np-1,np-2,np-3", "low": "QUEUED"},
    ),
    # 7. Failure policy.
    Case(
        "policy: a restart code restarts in place, charged to max_restarts",
        setup=[create("a", 1, max_restarts=1)],
        trigger=exit_code("a", 42),
        actions=["restart a np-0 charged"],
        states={"a": "RUNNING np-0"},
    ),
    Case(
        "policy: max_restarts used up means failure, and the slice goes to the queue",
        setup=[create("a", 1, max_restarts=1), create("b", 3), exit_code("a", 42)],
        trigger=exit_code("a", 42),
        actions=["fail a", "admit b np-0,np-1,np-2"],
        states={"a": "FAILED", "b": "RUNNING np-0,np-1,np-2"},
    ),
    Case(
        "policy: a non-restart code fails at once",
        setup=[create("a", 1, max_restarts=5), create("b", 3)],
        trigger=exit_code("a", 1),
        actions=["fail a", "admit b np-0,np-1,np-2"],
        states={"a": "FAILED", "b": "RUNNING np-0,np-1,np-2"},
    ),
    Case(
        "policy: a worker the backend lost restarts in place, never charged, even with max_restarts 0",
        setup=[create("a", 1, max_restarts=0)],
        trigger=lost("a"),
        actions=["restart a np-0"],
        states={"a": "RUNNING np-0"},
    ),
    Case(
        "policy: a killed worker (137) is a restart code by default",
        setup=[create("a", 1, max_restarts=1)],
        trigger=exit_code("a", 137),
        actions=["restart a np-0 charged"],
        states={"a": "RUNNING np-0"},
    ),
    Case(
        "policy: custom restart codes replace the default",
        setup=[create("a", 1, max_restarts=3, restart_on_exit_codes="3,7-9")],
        trigger=exit_code("a", 42),
        actions=["fail a"],
        states={"a": "FAILED"},
    ),
    Case(
        "policy: BlockingRecreate restarts wait for the old workers",
        setup=[create("a", 1, max_restarts=1, restart_strategy="BlockingRecreate")],
        trigger=exit_code("a", 42),
        actions=["restart a np-0 charged (waiting)"],
        states={"a": "RESTARTING np-0"},
    ),
    Case(
        "policy: node failures are never charged, even with max_restarts 0",
        setup=[create("a", 1, max_restarts=0)],
        trigger=fail(0),
        actions=["restart a np-1"],
        states={"a": "RUNNING np-1"},
    ),
    Case(
        "policy: an exit from an earlier attempt is ignored",
        setup=[create("a", 1), fail(0)],
        trigger=lambda w: w.step(ev.WorkerExited("a", 1, "c-np-0", 0, 137)),
        actions=[],
        states={"a": "RUNNING np-1"},
    ),
    Case(
        "policy: all workers exiting 0 completes the workload",
        setup=[create("a", 2), create("b", 2)],
        trigger=finish("a"),
        actions=["complete a", "admit b np-0,np-1"],
        states={"a": "SUCCESSFUL", "b": "RUNNING np-0,np-1"},
    ),
    # 8. Repair.
    Case(
        "repair: an uncordoned slice is given to the queue",
        slices=1,
        setup=[cordon(0), create("a", 1)],
        trigger=repair(0),
        actions=["admit a np-0"],
        states={"a": "RUNNING np-0"},
    ),
    Case(
        "repair: the requeued high job takes its capacity back",
        slices=2,
        setup=[create("high", 2, "high"), create("low", 1, "low"), fail(0)],
        trigger=repair(0),
        actions=["preempt low by high", "admit high np-0,np-1"],
        states={"high": "RUNNING np-0,np-1", "low": "QUEUED"},
    ),
    # Without hotswap: wait for repair holding the slices.
    Case(
        "wait-for-repair: the job keeps its slices and nobody is preempted",
        config=WAIT_FOR_REPAIR,
        setup=[create("low", 1, "low"), create("high", 2, "high")],
        trigger=fail(1),
        actions=["restart high np-1,np-2 (waiting)"],
        states={"low": "RUNNING np-0", "high": "RESTARTING np-1,np-2"},
    ),
    Case(
        "wait-for-repair: the job starts again when the node is repaired",
        config=WAIT_FOR_REPAIR,
        setup=[create("low", 1, "low"), create("high", 2, "high"), fail(1)],
        trigger=repair(1),
        actions=["start high np-1,np-2"],
        states={"low": "RUNNING np-0", "high": "RUNNING np-1,np-2"},
    ),
    # A failure and its repair reported in one round: the workers on the node died anyway.
    Case(
        "same-round repair: hotswap still restarts the workload",
        setup=[create("a", 1)],
        trigger=[fail(0), repair(0)],
        actions=["restart a np-0"],
        states={"a": "RUNNING np-0"},
    ),
    Case(
        "same-round repair: an elastic workload re-forms on the slice again",
        setup=[create("e", 2, min_slices=1)],
        trigger=[fail(1), repair(1)],
        actions=["scaledown e -np-1", "scaleup e +np-1"],
        states={"e": "RUNNING np-0,np-1"},
    ),
    Case(
        "same-round repair: waiting for repair starts the workers again at once",
        config=WAIT_FOR_REPAIR,
        setup=[create("a", 1)],
        trigger=[fail(0), repair(0)],
        actions=["restart a np-0 (waiting)", "start a np-0"],
        states={"a": "RUNNING np-0"},
    ),
    # Capacity freed late in a round reaches work that shrank earlier in the same round.
    Case(
        "elastic: a workload shrunk for a preemptor grows into capacity freed later in the round",
        slices=4,
        setup=[create("e", 2, "low", min_slices=1), create("r", 2, "low")],
        trigger=[fail(3), create("m", 1, "medium")],
        actions=["scaledown e -np-1", "admit m np-1", "requeue r", "scaleup e +np-2"],
        states={"e": "RUNNING np-0,np-2", "r": "QUEUED", "m": "RUNNING np-1"},
    ),
    # Deletion.
    Case(
        "delete: the slices go to the queue",
        slices=2,
        setup=[create("a", 2), create("b", 1)],
        trigger=ev.WorkloadDeleted("a"),
        actions=["remove a", "admit b np-0"],
        states={"b": "RUNNING np-0"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_scenario(case: Case) -> None:
    world = World(slices=case.slices, config=case.config, extra=case.extra)
    for step in case.setup:
        run_step(world, step)
    assert run_step(world, case.trigger) == case.actions
    for name, expected in case.states.items():
        assert world.state(name) == expected, name
    if case.actions and case.actions[0].startswith("reject"):
        rejected = case.actions[0].split()[1]
        assert rejected not in world.snapshot.workloads or world.state(rejected) != "QUEUED"


def test_preemption_and_node_failures_are_not_charged() -> None:
    world = World(slices=3)
    world.step(create("low", 1, "low", max_restarts=0))
    world.step(create("high", 2, "high", max_restarts=0))
    world.step(fail(1))
    assert world.workload("high").restarts == 0
    assert world.workload("high").disruptions == 1
    assert world.workload("low").restarts == 0
    assert world.workload("low").preemptions == 1
    assert world.workload("low").status_message == "preempted by high (priority high)"


def test_recreate_restart_bumps_the_attempt_and_stops_the_old_one() -> None:
    world = World(slices=3)
    world.step(create("a", 1))
    assert world.workload("a").attempt == 1
    world.step(fail(0))
    a = world.workload("a")
    assert a.attempt == 2 and a.stopping == frozenset({1})
    world.stop_all("a")
    assert world.workload("a").stopping == frozenset()


def test_readmission_after_preemption_waits_for_old_workers_with_blocking_recreate() -> None:
    world = World(slices=1)
    world.step(create("low", 1, "low", restart_strategy="BlockingRecreate"))
    world.step(create("high", 1, "high"))
    assert world.state("low") == "QUEUED"
    assert world.step(ev.WorkloadDeleted("high")) == ["remove high", "admit low np-0 (waiting)"]
    assert world.state("low") == "RESTARTING np-0"
    assert world.stop_all("low") == ["start low np-0"]


def test_checkpoint_only_rounds_change_nothing_but_the_record() -> None:
    world = World(slices=2)
    world.step(create("a", 1))
    before = world.snapshot
    assert world.checkpoint("a", 7) == []
    assert world.workload("a").last_checkpoint_step == 7
    assert world.snapshot.holders == before.holders


def test_elastic_is_ignored_when_the_policy_disables_it() -> None:
    world = World(slices=3, config=SchedulerConfig(hotswap=True, elastic=False))
    world.step(create("e", 3, **ELASTIC))
    assert world.step(fail(1)) == ["requeue e"]


def test_a_workload_waiting_for_repair_says_it_is_restarting() -> None:
    """Its workers have not started again: "restarting", not "restarted" (Recreate too)."""
    world = World(slices=2, config=WAIT_FOR_REPAIR)
    world.step(create("a", 1))
    world.step(fail(0))
    assert world.workload("a").status_message == "restarting: node c-np-0-0 failed; waiting for repair"
    world.step(repair(0))
    assert world.workload("a").status_message == "running on 1 slice(s)"


def test_an_elastic_donor_holding_a_broken_slice_gives_none_away() -> None:
    """A snapshot can show a running elastic workload on a broken slice that no round has handled
    yet (built from live objects). Shrinking gives up the last replicas, which may be the broken
    ones and free nothing: such a workload is no donor, so the demand is served by evicting it
    rather than by a shrink that frees nothing and leaves the demand unserved."""
    from builders import render, spec

    from hotswap.api.cluster import NodeState
    from hotswap.api.phases import WorkloadPhase
    from hotswap.core.model import Node, Slice, Snapshot
    from hotswap.core.workload import Workload
    from hotswap.core.scheduler import decide

    slices = [Slice(f"c-np-{i}", "v6e-16", tuple(f"c-np-{i}-{h}" for h in range(4)), i) for i in range(4)]
    nodes = [
        Node(f"c-np-{i}-{h}", f"c-np-{i}", h, NodeState.FAILED if (i, h) == (2, 0) else NodeState.READY)
        for i in range(4)
        for h in range(4)
    ]
    low = Workload(
        spec=spec("low", 3, "low", min_slices=1), seq=0, created_at=0.0, phase=WorkloadPhase.RUNNING,
        slices=("c-np-0", "c-np-1", "c-np-2"), attempt=1, running_since=0.0,
    )
    decision = decide(Snapshot.build(0.0, slices, nodes, [low]), [ev.WorkloadCreated(spec("high", 2, "high"))], 1.0)
    assert [render(a) for a in decision.actions] == ["preempt low by high", "admit high np-3,np-0", "admit low np-1"]


@pytest.mark.parametrize("strategy", ["Recreate", "BlockingRecreate"])
def test_a_hotswapped_workload_says_hotswapped_once_its_workers_start(strategy: str) -> None:
    """The README promises HOTSWAPPED after `node fail` for both strategies (issue 25 item 4):
    BlockingRecreate's workers start a round later, and still say so."""
    from hotswap.api.xpk_status import hotswap_state

    world = World(slices=3)
    world.step(create("low", 1, "low"))
    world.step(create("high", 2, "high", restart_strategy=strategy))
    world.step(fail(1))
    world.stop_all("high")  # BlockingRecreate's new workers start once the old ones are gone
    high = world.workload("high")
    assert world.state("high") == "RUNNING np-0,np-2"
    assert hotswap_state("RUNNING", high.status_message, len(high.slices), 2) == "HOTSWAPPED", high.status_message
    assert high.status_message.startswith("restarted: node c-np-1-0 failed")
