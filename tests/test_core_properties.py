"""Property tests of the scheduling core over random event sequences (hypothesis).

After every decision round, whatever happened before, these must hold:
exclusivity, no worker on unhealthy or wrong-type capacity, slice counts within
[min_slices, num_slices], preemption only of strictly lower priority and only whole,
no queued workload that fits left waiting (so no lower-priority workload was admitted while a
higher-priority one that fits waits), legal phase transitions, max_restarts respected, one
replica map (its placed entries are exactly the slices held; running workers keep their indexes
until their workload restarts; the last action that places a running workload's replicas
carries the map its backends enact), and determinism (the same events give the same actions and
snapshot).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from builders import World, node, spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hotswap.api.phases import WorkloadPhase, is_legal
from hotswap.core import actions as act
from hotswap.core import events as ev
from hotswap.core.effects import Placement, effect_of
from hotswap.core.model import Snapshot
from hotswap.core.workload import Workload
from hotswap.core.policy import SchedulerConfig
from hotswap.core.scheduler import decide

NAMES = ["a", "b", "c", "d", "e", "f"]
PRIORITIES = ["very-low", "low", "medium", "high", "very-high"]
# Two device types: 4 slices of v6e-16 (4 hosts) and 2 of v5p-16 (2 hosts).
SLICES_A, SLICES_B = 4, 2
CONFIGS = [
    SchedulerConfig(hotswap=True, elastic=True),
    SchedulerConfig(hotswap=True, elastic=False),
    SchedulerConfig(hotswap=False, elastic=True),
    SchedulerConfig(hotswap=False, elastic=False),
]
SETTINGS = settings(
    max_examples=int(os.environ.get("HOTSWAP_PROPERTY_EXAMPLES", "150")), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def all_nodes(world: World) -> list[str]:
    return sorted(world.snapshot.nodes)


@st.composite
def create_event(draw: st.DrawFn) -> ev.WorkloadCreated:
    device = draw(st.sampled_from(["v6e-16", "v5p-16"]))
    slices = draw(st.integers(1, 3))
    extra: dict[str, object] = {}
    if slices > 1 and draw(st.booleans()):
        extra["min_slices"] = draw(st.integers(1, slices - 1))
    extra["restart_strategy"] = draw(st.sampled_from(["Recreate", "BlockingRecreate"]))
    extra["max_restarts"] = draw(st.integers(0, 2))
    return ev.WorkloadCreated(
        spec(draw(st.sampled_from(NAMES)), slices, draw(st.sampled_from(PRIORITIES)), device=device, **extra)
    )


def draw_events(data: st.DataObject, world: World) -> list[ev.Event]:
    """One round's worth of events, drawn against the current state."""
    snapshot = world.snapshot
    workloads = sorted(snapshot.workloads)
    events: list[ev.Event] = []
    for _ in range(data.draw(st.integers(1, 3), label="events in round")):
        kind = data.draw(
            st.sampled_from(["create", "delete", "node", "repair", "exit", "stopped", "checkpoint"]), label="kind"
        )
        if kind == "create":
            events.append(data.draw(create_event(), label="create"))
        elif kind in ("node", "repair"):
            target = data.draw(st.sampled_from(all_nodes(world)), label="node")
            if kind == "repair":
                events.append(ev.NodeRepaired(target))
            else:
                cls = data.draw(st.sampled_from([ev.NodeFailed, ev.NodeCordoned, ev.NodeDrained]), label="fault")
                events.append(cls(target))
        elif workloads:
            w = snapshot.workloads[data.draw(st.sampled_from(workloads), label="workload")]
            if kind == "delete":
                events.append(ev.WorkloadDeleted(w.name))
            elif kind == "exit" and w.slices:
                target = data.draw(st.sampled_from(w.slices), label="exit slice")
                code = data.draw(st.sampled_from([0, 0, 1, 42, 137]), label="code")
                attempt = w.attempt - data.draw(st.integers(0, 1), label="stale")
                events.append(ev.WorkerExited(w.name, attempt, target, data.draw(st.integers(0, 1)), code))
            elif kind == "stopped" and w.stopping:
                events.append(ev.WorkersStopped(w.name, min(w.stopping)))
            elif kind == "checkpoint":
                events.append(ev.CheckpointRecorded(w.name, 1, world.now))
    return events


def floor(w: Workload, config: SchedulerConfig) -> int:
    return w.spec.floor_slices if config.elastic else w.spec.num_slices


def fits(snapshot: Snapshot, w: Workload, config: SchedulerConfig) -> bool:
    free = len(snapshot.free_healthy(w.device_type))
    reclaimable = sum(
        sum(1 for s in o.slices if s not in snapshot.unhealthy)
        for o in snapshot.workloads.values()
        if o.priority < w.priority and o.device_type == w.device_type and o.phase.holds_slices
    )
    return free + reclaimable >= floor(w, config)


def check_round(before: Snapshot, after: Snapshot, actions: tuple[act.Action, ...], config: SchedulerConfig) -> None:
    after.check()
    removed = {a.workload for a in actions if isinstance(a, act.Remove)}
    held: dict[str, str] = {}
    for w in after.workloads.values():
        # Phases move only along the table (a deleted and re-created name is a new workload).
        old = before.workloads.get(w.name)
        if old is not None and w.name not in removed:
            assert old.phase is w.phase or is_legal(old.phase, w.phase), (old.phase, w.phase)
        assert w.restarts <= w.spec.max_restarts
        if not w.phase.holds_slices:
            assert w.slices == (), f"{w.name} is {w.phase} but holds {w.slices}"
            continue
        # Exclusivity, type, counts.
        for s in w.slices:
            assert s not in held, f"{s} held by {held.get(s)} and {w.name}"
            held[s] = w.name
            assert after.slices[s].device_type == w.device_type
        assert len(set(w.slices)) == len(w.slices)
        assert floor(w, config) <= len(w.slices) <= w.spec.num_slices, (w.name, w.slices)
        if w.phase is WorkloadPhase.RUNNING:
            assert all(s not in after.unhealthy for s in w.slices), f"{w.name} runs on unhealthy capacity"
    assert held == dict(after.holders)

    by_name = after.workloads
    for a in actions:
        if isinstance(a, (act.Admit, act.Restart, act.StartWorkers, act.ScaleUp)):
            starts = a.added if isinstance(a, act.ScaleUp) else a.slices
            if getattr(a, "start", True):
                assert all(s not in after.unhealthy for s in starts), f"{a} starts on unhealthy capacity"
        if isinstance(a, act.Preempt):
            victim, preemptor = by_name[a.workload], by_name[a.preemptor]
            assert victim.priority < preemptor.priority
            # Preempted whole: it holds nothing unless it was admitted afresh later in the round.
            later = actions[actions.index(a) + 1 :]
            readmitted = any(isinstance(b, act.Admit) and b.workload == a.workload for b in later)
            assert readmitted or (victim.phase is WorkloadPhase.QUEUED and victim.slices == ())
        if isinstance(a, act.ScaleDown) and a.preemptor is not None:
            assert by_name[a.workload].priority < by_name[a.preemptor].priority

    check_replica_maps(before, after, actions)

    # Work conservation, which implies the priority rule: no queued workload could be admitted
    # now (so none that fits waits behind a lower-priority one), and no elastic workload below
    # its size while free capacity of its type exists.
    for w in after.workloads.values():
        if w.phase is WorkloadPhase.QUEUED:
            assert not fits(after, w, config), f"{w.name} fits but waits"
        if (
            w.phase.holds_slices
            and config.elastic
            and w.spec.elastic
            and len(w.slices) < w.spec.num_slices
        ):
            assert not after.free_healthy(w.device_type), f"{w.name} could grow"


def check_replica_maps(before: Snapshot, after: Snapshot, actions: tuple[act.Action, ...]) -> None:
    """The core's replica map (its form is checked by ``Snapshot.check``): what the backends
    start each slice as, kept from round to round and carried by the actions."""
    placing: dict[str, tuple[str | None, ...]] = {}
    for action in actions:
        effect = effect_of(action)
        if effect.placement is not Placement.KEEP:
            placing[action.workload] = effect.replicas
    for w in after.workloads.values():
        if w.phase is not WorkloadPhase.RUNNING:
            continue
        old = before.workloads.get(w.name)
        if w.name in placing:
            assert placing[w.name] == w.replica_map, f"{w.name}'s last action carries another map than the core's"
        else:
            assert old is not None and old.replica_map == w.replica_map, f"{w.name}'s map changed with no action"
        if old is not None and old.phase is WorkloadPhase.RUNNING and old.attempt == w.attempt and old.seq == w.seq:
            was = {s: i for i, s in enumerate(old.replica_map) if s is not None}
            now = {s: i for i, s in enumerate(w.replica_map) if s is not None}
            assert all(was[s] == i for s, i in now.items() if s in was), f"{w.name}: a running worker changed its index"


@SETTINGS
@given(data=st.data(), config=st.sampled_from(CONFIGS))
def test_invariants_hold_after_every_round(data: st.DataObject, config: SchedulerConfig) -> None:
    world = World(slices=SLICES_A, config=config, extra=(("v5p-16", SLICES_B),))
    history: list[list[ev.Event]] = []
    for _ in range(data.draw(st.integers(1, 25), label="rounds")):
        events = draw_events(data, world)
        before = world.snapshot
        world.step(*events)
        history.append(events)
        check_round(before, world.snapshot, world.last, config)

    # Determinism: the same events at the same times give the same actions and state.
    replay = World(slices=SLICES_A, config=config, extra=(("v5p-16", SLICES_B),))
    for events in history:
        replay.step(*events)
    assert replay.log == world.log
    assert replay.snapshot == world.snapshot


@SETTINGS
@given(data=st.data(), config=st.sampled_from(CONFIGS))
def test_an_attempt_succeeding_is_one_exit_0_per_worker(data: st.DataObject, config: SchedulerConfig) -> None:
    """``AttemptSucceeded`` (one event, as the simulator reports a finished job) decides exactly
    what a ``WorkerExited`` with code 0 from every worker of the attempt's slices decides, among
    whatever else happens in the round, for current and stale attempts."""
    world = World(slices=SLICES_A, config=config, extra=(("v5p-16", SLICES_B),))
    compared = 0
    for _ in range(data.draw(st.integers(1, 20), label="rounds")):
        events = draw_events(data, world)
        snapshot = world.snapshot
        holding = sorted(name for name, w in snapshot.workloads.items() if w.slices)
        if holding:
            w = snapshot.workloads[data.draw(st.sampled_from(holding), label="succeeds")]
            attempt = w.attempt - data.draw(st.integers(0, 1), label="stale")
            at = data.draw(st.integers(0, len(events)), label="position")
            exits = [ev.WorkerExited(w.name, attempt, s, h, 0) for s in w.slices for h in range(len(snapshot.slices[s].nodes))]
            batched = decide(snapshot, [*events[:at], ev.AttemptSucceeded(w.name, attempt), *events[at:]], world.now + 1, config)
            one_by_one = decide(snapshot, [*events[:at], *exits, *events[at:]], world.now + 1, config)
            assert batched.actions == one_by_one.actions
            assert batched.snapshot == one_by_one.snapshot
            compared += 1
        world.step(*events)


def comparable(snapshot: Snapshot) -> tuple:
    """A snapshot as plain values: the same whether its mappings were copied or changed in place."""
    return (
        snapshot.now, dict(snapshot.slices), dict(snapshot.nodes), dict(snapshot.workloads), snapshot.next_seq,
        snapshot.next_ordinal, {k: v for k, v in snapshot.slices_by_type.items() if v}, dict(snapshot.holders),
        snapshot.unhealthy, {k: tuple(v) for k, v in snapshot.free_by_type.items() if v},
        {k: v for k, v in snapshot.held_by_level.items() if v}, snapshot.index.comparable(),
    )


@SETTINGS
@given(data=st.data(), config=st.sampled_from(CONFIGS))
def test_a_round_that_consumes_its_snapshot_decides_the_same(data: st.DataObject, config: SchedulerConfig) -> None:
    """``decide(..., consume=True)`` (the simulator's: the snapshot is changed in place instead of
    copied) gives the same actions and the same next snapshot as a round that copies, round
    after round, and its indexes stay consistent with its records."""
    world = World(slices=SLICES_A, config=config, extra=(("v5p-16", SLICES_B),))
    consumed = world.snapshot
    for _ in range(data.draw(st.integers(1, 25), label="rounds")):
        events = draw_events(data, world)
        world.step(*events)
        decision = decide(consumed, events, world.now, config, consume=True)
        consumed = decision.snapshot
        assert decision.actions == world.last
        assert comparable(consumed) == comparable(world.snapshot)
        consumed.check()


def test_same_events_same_actions_across_hash_seeds() -> None:
    """Set and dict iteration order must never leak into decisions."""
    script = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, %r)
        from builders import World, create, fail, repair
        w = World(slices=6)
        w.step(create("v1", 1, "very-low"), create("v2", 1, "very-low"), create("l", 2, "low", min_slices=1))
        w.step(create("m", 1, "medium"))
        w.step(create("h", 3, "high"))
        w.step(fail(0), fail(3), fail(5))
        w.step(repair(0), repair(3))
        w.step(create("top", 4, "very-high"))
        print(w.log)
        """
    ) % os.path.dirname(__file__)
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        outputs.add(result.stdout)
    assert len(outputs) == 1


def test_decide_does_not_mutate_its_input() -> None:
    world = World(slices=3)
    world.step(ev.WorkloadCreated(spec("a", 2, "low")))
    snapshot = world.snapshot
    frozen = (dict(snapshot.slices), dict(snapshot.nodes), dict(snapshot.workloads), dict(snapshot.holders))
    decide(snapshot, [ev.NodeFailed(node(0)), ev.WorkloadCreated(spec("b", 1, "high"))], 10.0)
    assert frozen == (dict(snapshot.slices), dict(snapshot.nodes), dict(snapshot.workloads), dict(snapshot.holders))
