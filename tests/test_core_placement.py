"""Placement on its own: which slices a demand gets, and which replica runs on which slice.

The cluster has v6e-16 slices ``s0``..``s5`` in ordinal order, each one host.
"""

from __future__ import annotations

import dataclasses

import pytest
from builders import capacity_of, holding

from hotswap.core.placement import Assignment, assign, fill_positions, give_up_last, split_healthy

SLICES = [(f"s{i}", "v6e-16") for i in range(6)]


@dataclasses.dataclass
class Case:
    id: str
    held: dict[str, tuple[str, tuple[str, ...]]]  # holder -> (priority, slices)
    want: int
    need: int
    expected: Assignment | None
    may_reclaim: bool = True
    priority: str = "high"
    down: tuple[str, ...] = ()


def _low(*slices: str) -> tuple[str, tuple[str, ...]]:
    return ("low", slices)


CASES = [
    Case("free-slices-lowest-ordinal-first", {"l": _low("s0", "s2")}, 3, 3, Assignment(("s1", "s3", "s4"), 0)),
    Case("short-takes-from-lower-priority", {"l": _low("s0", "s1", "s2", "s3")}, 3, 3, Assignment(("s4", "s5"), 1)),
    Case("reclaims-only-what-is-missing", {"l": _low("s0", "s1", "s2", "s3", "s4")}, 3, 1, Assignment(("s5",), 2)),
    Case(
        "reclaims-no-more-than-lower-priorities-hold",
        {"l": _low("s0", "s1"), "m": ("high", ("s2", "s3", "s4", "s5"))},
        3, 2, Assignment((), 2),
    ),
    Case(
        "equal-priority-is-never-reclaimed",
        {"m": ("high", ("s0", "s1", "s2", "s3", "s4"))},
        3, 3, None,
    ),
    Case(
        "nobody-is-evicted-for-a-demand-that-cannot-be-met",
        {"l": _low("s0"), "m": ("high", ("s1", "s2", "s3", "s4"))},
        3, 3, None,
    ),
    Case(
        "growth-takes-free-slices-only",
        {"l": _low("s0", "s1", "s2", "s3", "s4")},
        3, 1, Assignment(("s5",), 0), may_reclaim=False,
    ),
    Case(
        "growth-with-no-free-slice-gets-nothing",
        {"l": _low("s0", "s1", "s2", "s3", "s4", "s5")},
        2, 1, None, may_reclaim=False,
    ),
    Case("fewer-free-than-needed-without-reclaim", {"l": _low("s0", "s1", "s2", "s3")}, 3, 3, None, may_reclaim=False),
    Case(
        "optional-demand-still-gets-something",  # need 0: an elastic workload above its floor
        {"l": _low("s0", "s1", "s2", "s3", "s4")},
        2, 0, Assignment(("s5",), 1),
    ),
    Case("optional-demand-with-nothing-to-get", {"m": ("high", tuple(f"s{i}" for i in range(6)))}, 2, 0, None),
    Case(
        "broken-slices-are-neither-free-nor-reclaimable",
        {"l": _low("s0", "s1")},
        5, 4, Assignment(("s2", "s3", "s4"), 1), down=("s0", "s5"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_assign(case: Case) -> None:
    workloads = tuple(holding(name, slices, priority) for name, (priority, slices) in case.held.items())
    capacity, live = capacity_of(SLICES, workloads, case.down)
    demander = holding("d", ("x",), case.priority)
    free_before = set(capacity.freeze(0.0, live, 0).free_healthy("v6e-16"))
    got = assign(capacity, demander, case.want, case.need, case.may_reclaim)
    assert got == case.expected
    free_after = set(capacity.freeze(0.0, live, 0).free_healthy("v6e-16"))
    taken = set(got.free) if got else set()
    assert free_after == free_before - taken, "what is not assigned stays free"


@pytest.mark.parametrize(
    ("previous", "kept", "got", "expected"),
    [
        (("a", "b", "c"), ("a", "c"), ("x",), ("a", "x", "c")),  # the replacement takes replica 1
        (("a", "b", "c"), ("b",), ("x", "y"), ("x", "b", "y")),
        (("a", "b", "c"), ("a", "b", "c"), ("x",), ("a", "b", "c", "x")),  # nothing lost: appended
        (("a", "b", "c"), ("c",), ("x",), ("x", "c")),  # too few: positions close up after the gap
        (("a", "b"), (), ("x", "y", "z"), ("x", "y", "z")),  # more than were lost: the rest appended
        ((), ("a",), ("x",), ("x",)),  # no previous positions: replacements only
    ],
    ids=["one-lost", "two-lost", "none-lost", "fewer-replacements", "extra-replacements", "no-previous"],
)
def test_fill_positions(previous: tuple[str, ...], kept: tuple[str, ...], got: tuple[str, ...], expected: tuple[str, ...]) -> None:
    assert fill_positions(previous, kept, got) == expected


@pytest.mark.parametrize(
    ("slices", "broken", "expected"),
    [
        (("a", "b", "c"), {"b"}, (("a", "c"), ("b",))),
        (("a", "b", "c"), set(), (("a", "b", "c"), ())),
        (("a", "b"), {"a", "b"}, ((), ("a", "b"))),
    ],
)
def test_split_healthy_keeps_replica_order(slices: tuple[str, ...], broken: set[str], expected: object) -> None:
    assert split_healthy(slices, lambda s: s not in broken) == expected


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
