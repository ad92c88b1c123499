"""Placement on its own: how many slices a demand reclaims, and which replica runs where (the
replica map the core writes and every backend applies).

The cluster has v6e-16 slices ``s0``..``s5`` and a v5p-16 slice ``t0``, each one host.
Which free slices a demand gets (lowest ordinal first) is the free pool's order, tested with
the capacity indexes.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from builders import capacity_of, holding

from hotswap.core.placement import (
    fill_positions,
    give_up_last,
    grow_map,
    kept_map,
    parked_indexes,
    lost_positions,
    reclaim_target,
    recorded_map,
    shrink_map,
    split_at,
)

SLICES = [(f"s{i}", "v6e-16") for i in range(6)] + [("t0", "v5p-16")]


@dataclasses.dataclass
class Case:
    id: str
    held: dict[str, tuple[str, tuple[str, ...]]]  # holder -> (priority, slices)
    have: int  # free slices the demand already got
    want: int
    need: int
    expected: int
    down: tuple[str, ...] = ()


def _low(*slices: str) -> tuple[str, tuple[str, ...]]:
    return ("low", slices)


def _high(*slices: str) -> tuple[str, tuple[str, ...]]:
    return ("high", slices)


CASES = [
    Case("takes-what-is-missing", {"l": _low("s0", "s1", "s2", "s3")}, 2, 3, 3, 1),
    Case("takes-all-it-wants-when-nothing-is-free", {"l": _low("s0", "s1", "s2", "s3", "s4", "s5")}, 0, 2, 2, 2),
    Case("no-more-than-lower-priorities-hold", {"l": _low("s0", "s1"), "m": _high("s2", "s3", "s4", "s5")}, 0, 3, 2, 2),
    Case("equal-priority-is-never-reclaimed", {"m": _high("s0", "s1", "s2", "s3", "s4")}, 1, 3, 3, 0),
    Case("nobody-is-evicted-for-a-demand-that-cannot-be-met", {"l": _low("s0"), "m": _high("s1", "s2", "s3", "s4")}, 1, 3, 3, 0),
    Case("an-optional-demand-still-reclaims", {"l": _low("s0", "s1", "s2", "s3", "s4")}, 1, 2, 0, 1),
    Case("broken-slices-free-nothing", {"l": _low("s0", "s1")}, 3, 5, 4, 1, down=("s0",)),
    Case("other-device-types-free-nothing", {"l": ("low", ("t0",)), "m": _high("s0", "s1", "s2", "s3", "s4", "s5")}, 0, 1, 1, 0),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reclaim_target(case: Case) -> None:
    workloads = tuple(
        holding(name, slices, priority, "v5p-16" if slices[0].startswith("t") else "v6e-16")
        for name, (priority, slices) in case.held.items()
    )
    capacity, _ = capacity_of(SLICES, workloads, case.down)
    demander = holding("d", ("x",), "high")
    assert reclaim_target(capacity, demander, case.have, case.want, case.need) == case.expected


@pytest.mark.parametrize(
    ("previous", "lost", "got", "expected"),
    [
        (("a", "b", "c"), {"b"}, ("x",), ("a", "x", "c")),  # the replacement takes replica 1
        (("a", "b", "c"), {"c", "a"}, ("x", "y"), ("x", "b", "y")),  # lowest lost index first
        (("a", "b", "c"), set(), ("x",), ("a", "b", "c", "x")),  # nothing lost: appended
        (("a", "b", "c"), {"a", "b"}, ("x",), ("x", "c")),  # too few: positions close up after the gap
        (("a", "b"), {"a", "b"}, ("x", "y", "z"), ("x", "y", "z")),  # more than were lost: the rest appended
        ((), set(), ("x",), ("x",)),  # no previous positions: replacements only
    ],
    ids=["one-lost", "two-lost", "none-lost", "fewer-replacements", "extra-replacements", "no-previous"],
)
def test_fill_positions(previous: tuple[str, ...], lost: set[str], got: tuple[str, ...], expected: tuple[str, ...]) -> None:
    assert fill_positions(previous, lost_positions(previous, lost), got) == expected


@pytest.mark.parametrize(
    ("slices", "lost", "expected"),
    [
        (("a", "b", "c"), {"b"}, (("a", "c"), ("b",))),
        (("a", "b", "c"), set(), (("a", "b", "c"), ())),
        (("a", "b"), {"b", "a"}, ((), ("a", "b"))),  # gone in replica order, not set order
    ],
    ids=["one", "none", "all"],
)
def test_split_keeps_replica_order(slices: tuple[str, ...], lost: set[str], expected: object) -> None:
    assert split_at(slices, lost_positions(slices, lost)) == expected


@pytest.mark.parametrize(
    ("slices", "count", "expected"),
    [
        (("a", "b", "c"), 1, (("a", "b"), ("c",))),  # the last replica leaves; others keep indices
        (("a", "b", "c"), 2, (("a",), ("b", "c"))),
        (("a", "b", "c"), 0, (("a", "b", "c"), ())),
    ],
)
def test_give_up_last(slices: tuple[str, ...], count: int, expected: object) -> None:
    assert give_up_last(slices, count) == expected


@pytest.mark.parametrize(
    ("replicas", "gone", "expected"),
    [
        (("a", "b", "c"), {"b"}, (("a", None, "c"), (1,))),  # the survivors keep their indexes
        (("a", "b", "c"), {"c"}, (("a", "b"), (2,))),  # no parked index at the end
        (("a", None, "c", "d"), {"d", "a"}, ((None, None, "c"), (0, 3))),
        (("a",), {"a"}, ((), (0,))),
    ],
    ids=["middle", "last", "two-around-a-hole", "all"],
)
def test_a_shrink_parks_the_lost_replicas(replicas: tuple, gone: set[str], expected: object) -> None:
    assert shrink_map(replicas, gone) == expected


@pytest.mark.parametrize(
    ("replicas", "added", "expected"),
    [
        (("a", None, "c"), ("x",), ("a", "x", "c")),  # the joiner takes the parked index
        ((None, "b", None, "d"), ("x", "y"), ("x", "b", "y", "d")),  # lowest first, in order
        ((None, "b", None, "d"), ("x",), ("x", "b", None, "d")),
        (("a", None, "c"), ("x", "y"), ("a", "x", "c", "y")),  # the rest after the last
        ((), ("x", "y"), ("x", "y")),
    ],
    ids=["one-hole", "two-holes", "fewer-joiners", "more-joiners", "empty"],
)
def test_a_grow_back_fills_the_parked_indexes(replicas: tuple, added: tuple[str, ...], expected: tuple) -> None:
    assert grow_map(replicas, added) == expected


def test_a_workload_keeps_one_form_of_each_map() -> None:
    """Replica i on slices[i] is kept as None (every (re)start's map); any other map as itself."""
    assert kept_map(("a", "b"), ("a", "b")) is None
    assert kept_map(("a", None, "c"), ("a", "c")) == ("a", None, "c")
    assert kept_map(("a", "x", "c"), ("a", "c", "x")) == ("a", "x", "c")  # grown back: not the slices' order


@pytest.mark.parametrize(
    ("recorded", "expected"),
    [
        (["a", None, "c"], ("a", None, "c")),
        (["a", None, "c", None, None], ("a", None, "c")),  # padded to the JobSet's replicas
        (["a", "c"], None),  # the slices' own map
        (None, None),  # a record of an earlier release: the map its slices imply
        (["a", "b", "c"], None),  # not a map of these slices
        (["a", "a", "c"], None),
        (["a", None, None, None, None, "c"], None),  # past the workload's size
        (["a", 3, "c"], None),
        ("a,c", None),
    ],
)
def test_a_recorded_map_reads_back_only_as_a_map_of_the_slices(recorded: object, expected: object) -> None:
    assert recorded_map(recorded, ("a", "c"), 5) == expected


def _walked_grow(replicas: tuple, added: tuple[str, ...]) -> tuple:
    """A grow-back found by walking the whole map (the reference the carried indexes must match)."""
    after = list(replicas)
    joining = iter(added)
    for index, name in enumerate(after):
        if name is None:
            joiner = next(joining, None)
            if joiner is None:
                break
            after[index] = joiner
    after.extend(joining)
    while after and after[-1] is None:
        after.pop()
    return tuple(after)


def test_a_map_carries_its_parked_indexes_through_shrinks_and_grows() -> None:
    """A grow-back reads the parked indexes kept with the map (it does not walk a map of
    thousands of replicas): through any run of scale-downs and grow-backs they are exactly the
    map's Nones, and every map equals the one a walk of the whole map gives."""
    rng = random.Random(37)
    fresh = (f"n{i}" for i in range(10**6))
    replicas: tuple = tuple(next(fresh) for _ in range(40))
    for _ in range(400):
        placed = [name for name in replicas if name is not None]
        if placed and rng.random() < 0.5:
            gone = set(rng.sample(placed, rng.randint(1, min(4, len(placed)))))
            expected = tuple(None if name in gone else name for name in replicas)
            gone_at = tuple(sorted(replicas.index(name) for name in gone))
            replicas, parked = shrink_map(replicas, gone)
            assert parked == gone_at
            while expected and expected[-1] is None:
                expected = expected[:-1]
        else:
            added = tuple(next(fresh) for _ in range(rng.randint(1, 5)))
            expected = _walked_grow(replicas, added)
            replicas = grow_map(replicas, added)
        assert replicas == expected
        assert parked_indexes(replicas) == tuple(i for i, name in enumerate(expected) if name is None)
        assert replicas.parked == parked_indexes(replicas)  # kept with the map, not found by a walk
