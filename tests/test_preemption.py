"""The victim planner on its own: shrink before evict, minimal victims, cheapest first; and the
ranking index it reads, which must give the same plan as sorting every holder."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from builders import spec
from hypothesis import given, settings
from hypothesis import strategies as st

from hotswap.api.phases import WorkloadPhase
from hotswap.core.workload import Workload
from hotswap.core.ordering import candidates_ordering
from hotswap.core.preemption import Candidate, RankedCandidates, plan_reclaim

PRIORITIES = ["very-low", "low", "medium"]


class Listed:
    """Candidates given as a list, sorted here: the reference the index must agree with."""

    def __init__(self, candidates: Sequence[Candidate], now: float) -> None:
        self.ordered = sorted(candidates, key=lambda c: candidates_ordering(c.workload, now))

    @property
    def shrink_pool(self) -> int:
        return sum(c.shrinkable for c in self.ordered)

    def in_order(self) -> Iterator[Candidate]:
        return (c for c in self.ordered if c.healthy > 0)

    def shrinkable_in_order(self) -> Iterator[Candidate]:
        return (c for c in self.ordered if c.shrinkable > 0)


def plan(deficit: int, candidates: Sequence[Candidate], now: float):  # type: ignore[no-untyped-def]
    return plan_reclaim(deficit, Listed(candidates, now))


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
    result = plan(deficit, cands, now)
    total = sum(c.healthy for c in cands)
    if result is None:
        assert total < deficit
        return
    by_workload = {c.workload.name: c for c in cands}
    victims = {v.name for v in result.victims}
    freed = sum(by_workload[v].healthy for v in victims) + sum(n for _, n in result.shrinks)
    assert freed >= deficit
    for donor, given_up in result.shrinks:
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
    result = plan(1, [Candidate(w, 1, 0) for w in (low_old, low_ckpt, vlow)], now)
    assert result is not None and [v.name for v in result.victims] == ["vlow"]
    result = plan(1, [Candidate(w, 1, 0) for w in (low_old, low_ckpt)], now)
    assert result is not None and [v.name for v in result.victims] == ["low-ckpt"]
    a = running("a", 1, "low", started=10.0, checkpoint=90.0)
    b = running("b", 1, "low", started=20.0, checkpoint=90.0)  # same progress, started later
    result = plan(1, [Candidate(a, 1, 0), Candidate(b, 1, 0)], now)
    assert result is not None and [v.name for v in result.victims] == ["b"]


def test_a_declared_checkpoint_period_counts_from_the_last_periodic_save() -> None:
    """Saving every 100 s from t=0: at t=250 the last save was at 200 (50 s at risk), so a job
    that reported one save at 220 (30 s at risk) is cheaper, and one at 180 dearer."""
    now = 250.0
    periodic = dataclasses.replace(running("periodic", 1, "low", started=0.0, checkpoint=0.0), checkpoint_every=100.0)
    later = running("later", 1, "low", started=0.0, checkpoint=220.0)
    earlier = running("earlier", 1, "low", started=0.0, checkpoint=180.0)
    result = plan(1, [Candidate(w, 1, 0) for w in (periodic, earlier)], now)
    assert result is not None and [v.name for v in result.victims] == ["periodic"]
    result = plan(1, [Candidate(w, 1, 0) for w in (periodic, later)], now)
    assert result is not None and [v.name for v in result.victims] == ["later"]
    # A restart ends the period: the new attempt's start (10 s at risk) is what counts.
    restarted = dataclasses.replace(periodic, running_since=240.0)
    result = plan(1, [Candidate(w, 1, 0) for w in (restarted, later)], now)
    assert result is not None and [v.name for v in result.victims] == ["periodic"]


def test_shrink_comes_before_any_eviction() -> None:
    elastic = Candidate(running("e", 3, "medium", 0.0), 3, 2)
    victim = Candidate(running("v", 1, "very-low", 0.0), 1, 0)
    result = plan(2, [elastic, victim], 100.0)
    assert result is not None and result.victims == () and [(w.name, n) for w, n in result.shrinks] == [("e", 2)]


def test_zero_deficit_needs_nothing() -> None:
    result = plan(0, [], 0.0)
    assert result is not None and result.victims == () and result.shrinks == ()



@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_ranking_index_gives_the_plan_of_sorting_every_holder(data: st.DataObject) -> None:
    """The scheduler reads candidates from the ranking index (a few at a time); its plan equals
    the plan over every strictly lower-priority holder sorted by candidates_ordering, with
    checkpoints reported one by one and declared as a period."""
    from builders import World, create

    from hotswap.core import events as ev
    from hotswap.core.round_state import RoundState

    world = World(slices=12)
    for i in range(data.draw(st.integers(1, 8))):
        size = data.draw(st.integers(1, 3))
        extra = {"min_slices": data.draw(st.integers(1, size - 1))} if size > 1 and data.draw(st.booleans()) else {}
        world.step(create(f"w{i}", size, data.draw(st.sampled_from(PRIORITIES)), **extra))
        if data.draw(st.booleans()):
            every = data.draw(st.sampled_from([None, 7.0, 30.0]))
            world.step(ev.CheckpointRecorded(f"w{i}", 1, world.now - data.draw(st.integers(0, 3)), every))
    preemptor = data.draw(st.sampled_from(["low", "medium", "high"]))
    world.step(create("p", 1, preemptor))
    now = world.now + data.draw(st.integers(1, 100))
    demanding = world.snapshot.workloads["p"]
    full = [
        Candidate(w, len(w.slices), max(0, len(w.slices) - w.spec.floor_slices) if w.spec.elastic else 0)
        for w in world.snapshot.workloads.values()
        if w.slices and w.priority < demanding.priority
    ]
    deficit = data.draw(st.integers(1, 12))
    state = RoundState(world.snapshot, now, world.config)
    ranked = RankedCandidates(state.capacity, state.index, demanding, now, world.config.elastic)
    assert [c.workload.name for c in ranked.in_order()] == [c.workload.name for c in Listed(full, now).in_order()]
    assert plan_reclaim(deficit, ranked) == plan(deficit, full, now)
