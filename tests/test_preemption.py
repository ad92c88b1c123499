"""The victim planner on its own: shrink before evict, minimal victims, cheapest first."""

from __future__ import annotations

from builders import spec
from hypothesis import given, settings
from hypothesis import strategies as st

from hotswap.api.phases import WorkloadPhase
from hotswap.core.model import Workload
from hotswap.core.preemption import Candidate, find_candidates, plan_reclaim

PRIORITIES = ["very-low", "low", "medium"]


def running(name: str, slices: int, priority: str, started: float, checkpoint: float | None = None) -> Workload:
    held = tuple(f"{name}-s{i}" for i in range(slices))
    return Workload(
        spec=spec(name, slices, priority),
        seq=int(started),
        created_at=started,
        phase=WorkloadPhase.RUNNING,
        slices=held,
        attempt=1,
        running_since=started,
        last_checkpoint_at=checkpoint,
    )


@st.composite
def candidates(draw: st.DrawFn) -> list[Candidate]:
    out = []
    for i in range(draw(st.integers(0, 7))):
        slices = draw(st.integers(1, 4))
        w = running(f"w{i}", slices, draw(st.sampled_from(PRIORITIES)), float(draw(st.integers(0, 50))),
                    draw(st.one_of(st.none(), st.floats(0, 60))))
        shrinkable = draw(st.integers(0, slices - 1))
        out.append(Candidate(w, slices, shrinkable))
    return out


@settings(max_examples=400, deadline=None)
@given(candidates(), st.integers(1, 12))
def test_plan_frees_enough_with_a_minimal_victim_set(cands: list[Candidate], deficit: int) -> None:
    now = 100.0
    plan = plan_reclaim(deficit, cands, now)
    total = sum(c.healthy for c in cands)
    if plan is None:
        assert total < deficit
        return
    by_workload = {c.workload.name: c for c in cands}
    victims = {v.name for v in plan.victims}
    freed = sum(by_workload[v].healthy for v in victims) + sum(n for _, n in plan.shrinks)
    assert freed >= deficit
    for donor, given_up in plan.shrinks:
        assert donor.name not in victims
        assert 0 < given_up <= by_workload[donor.name].shrinkable
    shrink_capacity = sum(c.shrinkable for c in cands)
    if shrink_capacity >= deficit:
        assert not victims, "shrink before evict"
    # Minimal: sparing any one victim leaves the deficit uncovered even with every shrink.
    for spared in victims:
        rest = victims - {spared}
        best = sum(by_workload[v].healthy for v in rest) + sum(
            c.shrinkable for c in cands if c.workload.name not in rest
        )
        assert best < deficit, f"{spared} was not needed"


def test_lowest_priority_then_least_progress_then_most_recent() -> None:
    now = 100.0
    low_old = running("low-old", 1, "low", started=10.0)  # 90 s of progress at risk
    low_ckpt = running("low-ckpt", 1, "low", started=10.0, checkpoint=95.0)  # 5 s at risk
    vlow = running("vlow", 1, "very-low", started=0.0)  # lowest priority wins regardless
    plan = plan_reclaim(1, [Candidate(w, 1, 0) for w in (low_old, low_ckpt, vlow)], now)
    assert plan is not None and [v.name for v in plan.victims] == ["vlow"]
    plan = plan_reclaim(1, [Candidate(w, 1, 0) for w in (low_old, low_ckpt)], now)
    assert plan is not None and [v.name for v in plan.victims] == ["low-ckpt"]
    a = running("a", 1, "low", started=10.0, checkpoint=90.0)
    b = running("b", 1, "low", started=20.0, checkpoint=90.0)  # same progress, started later
    plan = plan_reclaim(1, [Candidate(a, 1, 0), Candidate(b, 1, 0)], now)
    assert plan is not None and [v.name for v in plan.victims] == ["b"]


def test_shrink_comes_before_any_eviction() -> None:
    elastic = Candidate(running("e", 3, "medium", 0.0), 3, 2)
    victim = Candidate(running("v", 1, "very-low", 0.0), 1, 0)
    plan = plan_reclaim(2, [elastic, victim], 100.0)
    assert plan is not None and plan.victims == () and [(w.name, n) for w, n in plan.shrinks] == [("e", 2)]


def test_zero_deficit_needs_nothing() -> None:
    plan = plan_reclaim(0, [], 0.0)
    assert plan is not None and plan.victims == () and plan.shrinks == ()



@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_scheduler_lists_enough_candidates_for_the_same_plan(data: st.DataObject) -> None:
    """The scheduler lists only the candidates a plan can use; the plan equals the plan over
    every strictly lower-priority holder."""
    from builders import World, create

    from hotswap.core.capacity import Capacity

    world = World(slices=12)
    for i in range(data.draw(st.integers(1, 8))):
        size = data.draw(st.integers(1, 3))
        extra = {"min_slices": data.draw(st.integers(1, size - 1))} if size > 1 and data.draw(st.booleans()) else {}
        world.step(create(f"w{i}", size, data.draw(st.sampled_from(PRIORITIES)), **extra))
    preemptor = data.draw(st.sampled_from(["low", "medium", "high"]))
    world.step(create("p", 1, preemptor))
    now = world.now + 5.0
    demanding = world.snapshot.workloads["p"]
    full = [
        Candidate(w, len(w.slices), max(0, len(w.slices) - w.spec.floor_slices) if w.spec.min_slices else 0)
        for w in world.snapshot.workloads.values()
        if w.slices and w.priority < demanding.priority
    ]
    deficit = data.draw(st.integers(1, 12))
    listed = find_candidates(Capacity(world.snapshot, world.snapshot.workloads), demanding, deficit, now, world.config.elastic)
    assert {c.workload.name for c in listed} <= {c.workload.name for c in full}
    assert plan_reclaim(deficit, listed, now) == plan_reclaim(deficit, full, now)
