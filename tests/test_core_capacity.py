"""The capacity indexes of a round on their own: the free pool, holders and the healthy slices
held per level, health, topology changes, and copy-on-write of the snapshot they start from.

Slices ``b a c`` are v6e-16 with ordinals 0, 1, 2 (so name order is not placement order) and
``d`` is v5p-16; each has one host ``<slice>-0``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import pytest
from builders import capacity_of, holding

from hotswap.api.cluster import NodeState
from hotswap.core.capacity import Capacity
from hotswap.core.index import Indexes
from hotswap.core.model import Snapshot
from hotswap.core.workload import Workload

SLICES = [("b", "v6e-16"), ("a", "v6e-16"), ("c", "v6e-16"), ("d", "v5p-16")]
V6E, V5P = "v6e-16", "v5p-16"
MEDIUM = (V6E, 500)
LOW = (V6E, 250)


def freeze(capacity: Capacity, workloads: dict[str, Workload]) -> Snapshot:
    return capacity.freeze(1.0, workloads, 0, Indexes.build(workloads))


@pytest.mark.parametrize(
    ("workloads", "down", "device", "count", "expected"),
    [
        ((), (), V6E, 2, ["b", "a"]),  # lowest ordinal first, not name order
        ((), (), V6E, 5, ["b", "a", "c"]),  # no more than there is
        ((holding("w", ("a",)),), (), V6E, 3, ["b", "c"]),  # held slices are not free
        ((), ("b",), V6E, 3, ["a", "c"]),  # unhealthy slices are not free
        ((), (), V5P, 3, ["d"]),  # only slices of the asked type
        ((), (), "v4-8", 1, []),  # a type the cluster does not have
    ],
    ids=["ordinal-order", "all-there-is", "held", "unhealthy", "device-type", "unknown-type"],
)
def test_take_free(workloads: tuple[Workload, ...], down: tuple[str, ...], device: str, count: int, expected: list[str]) -> None:
    capacity, _ = capacity_of(SLICES, workloads, down)
    assert capacity.take_free(device, count) == expected
    assert not set(capacity.take_free(device, 10)) & set(expected), "a slice was handed out twice"


def test_returned_slices_are_taken_again_in_ordinal_order() -> None:
    capacity, _ = capacity_of(SLICES)
    assert capacity.take_free(V6E, 3) == ["b", "a", "c"]
    capacity.return_free(V6E, ["c", "b"])
    assert capacity.take_free(V6E, 1) == ["b"]
    capacity.return_free(V6E, ["a"])
    assert capacity.take_free(V6E, 3) == ["a", "c"]


def test_a_repaired_slice_is_free_even_after_the_pool_was_ordered() -> None:
    capacity, _ = capacity_of(SLICES, down=("b",))
    assert capacity.take_free(V6E, 0) == []  # orders the pool
    capacity.mark_healthy("b")
    assert capacity.take_free(V6E, 3) == ["b", "a", "c"]


@dataclasses.dataclass
class Case:
    id: str
    workloads: tuple[Workload, ...]
    change: Callable[[Capacity, dict[str, Workload]], object]
    returns: object
    free: set[str]  # free v6e-16 slices afterwards
    held: dict[tuple[str, int], int]  # healthy slices held per (device type, priority), non-zero
    holders: dict[str, str]
    down: tuple[str, ...] = ()


W = holding("w", ("b", "a"))
OTHER = holding("x", ("c",), "low")

CASES = [
    Case("hold-counts-healthy-slices", (), lambda c, _: c.hold(W, c.take_free(V6E, 2)), None,
         {"c"}, {MEDIUM: 2}, {"b": "w", "a": "w"}),
    Case("hold-of-a-broken-slice-is-not-counted", (), lambda c, _: c.hold(W, ("b",)), None,
         {"a", "c"}, {}, {"b": "w"}, down=("b",)),
    Case("release-frees-healthy-slices", (W,), lambda c, ws: c.release(ws["w"], ("a",)), True,
         {"a", "c"}, {MEDIUM: 1}, {"b": "w"}),
    Case("release-of-a-broken-slice-frees-nothing", (W,), lambda c, ws: c.release(ws["w"], ("b",)), False,
         {"c"}, {MEDIUM: 1}, {"a": "w"}, down=("b",)),
    Case("release-ignores-slices-of-others", (W, OTHER), lambda c, ws: c.release(ws["w"], ("c",)), False,
         set(), {MEDIUM: 2, LOW: 1}, {"b": "w", "a": "w", "c": "x"}),
    Case("held-slice-down-is-no-longer-counted", (W,), lambda c, _: c.mark_unhealthy("a"), None,
         {"c"}, {MEDIUM: 1}, {"b": "w", "a": "w"}),
    Case("free-slice-down-leaves-the-pool", (W,), lambda c, _: c.mark_unhealthy("c"), None,
         set(), {MEDIUM: 2}, {"b": "w", "a": "w"}),
    Case("down-twice-counts-once", (W,), lambda c, _: (c.mark_unhealthy("a"), c.mark_unhealthy("a")), (None, None),
         {"c"}, {MEDIUM: 1}, {"b": "w", "a": "w"}),
    Case("repaired-held-slice-counts-again", (W,), lambda c, _: c.mark_healthy("a"), None,
         {"c"}, {MEDIUM: 2}, {"b": "w", "a": "w"}, down=("a",)),
    Case("repaired-free-slice-joins-the-pool", (W,), lambda c, _: c.mark_healthy("c"), None,
         {"c"}, {MEDIUM: 2}, {"b": "w", "a": "w"}, down=("c",)),
    Case("removed-slice-leaves-the-pool", (), lambda c, _: c.remove_slice("a"), True,
         {"b", "c"}, {}, {}),
    Case("removing-twice-is-a-no-op", (), lambda c, _: (c.remove_slice("a"), c.remove_slice("a")), (True, False),
         {"b", "c"}, {}, {}),
    Case("removing-an-unknown-slice-is-a-no-op", (), lambda c, _: c.remove_slice("zz"), False,
         {"b", "a", "c"}, {}, {}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_capacity_change(case: Case) -> None:
    capacity, workloads = capacity_of(SLICES, case.workloads, case.down)
    assert case.change(capacity, workloads) == case.returns
    frozen = freeze(capacity, workloads)
    assert set(frozen.free_healthy(V6E)) == case.free
    assert {k: v for k, v in frozen.held_by_level.items() if v} == case.held
    assert dict(frozen.holders) == case.holders


@pytest.mark.parametrize(
    ("node", "state", "expected"),
    [
        ("a-0", NodeState.FAILED, ((), ("a-0",))),
        ("a-0", NodeState.CORDONED, ((), ("a-0",))),
        ("b-0", NodeState.READY, (("b-0",), ())),  # repaired
        ("a-0", NodeState.READY, None),  # already Ready: nothing changes
        ("nope-0", NodeState.FAILED, None),  # unknown (a stale event)
    ],
    ids=["fail", "cordon", "repair", "unchanged", "unknown"],
)
def test_set_node_state_reports_the_slice_before_and_after(node: str, state: NodeState, expected: object) -> None:
    capacity, _ = capacity_of(SLICES, down=("b",))
    changed = capacity.set_node_state(node, state)
    if expected is None:
        assert changed is None
        return
    assert changed is not None
    before, after = changed
    assert (tuple(before.down_nodes), tuple(after.down_nodes)) == expected
    assert capacity.nodes[node].state is state and capacity.slices[after.name] == after
    # Health is the caller's decision (a loss for the holder): the indexes are not touched.
    assert capacity.unhealthy == {"b"}


def test_added_slice_comes_after_every_other_and_is_free() -> None:
    capacity, workloads = capacity_of(SLICES)
    capacity.add_slice("e", V6E, ("e-0", "e-1"))
    assert capacity.slices["e"].ordinal == 4 and capacity.nodes["e-1"].host == 1
    with pytest.raises(ValueError, match="already exists"):
        capacity.add_slice("a", V6E, ("a2-0",))
    with pytest.raises(ValueError, match="already exists"):
        capacity.add_slice("f", V6E, ("a-0",))
    freeze(capacity, workloads).check()
    assert capacity.take_free(V6E, 4) == ["b", "a", "c", "e"]


def test_removed_slices_are_dropped_with_their_nodes() -> None:
    capacity, workloads = capacity_of(SLICES)
    capacity.remove_slice("a")
    assert capacity.type_size(V6E) == 2 and "a" in capacity.unhealthy
    capacity.drop_removed()
    assert "a" not in capacity.slices and "a-0" not in capacity.nodes and "a" not in capacity.unhealthy
    frozen = freeze(capacity, workloads)
    frozen.check()
    assert frozen.slices_by_type[V6E] == {"b", "c"}


def test_a_held_slice_cannot_be_dropped() -> None:
    capacity, _ = capacity_of(SLICES, (W,))
    capacity.remove_slice("a")
    with pytest.raises(AssertionError, match="still held"):
        capacity.drop_removed()


def test_what_lower_priorities_hold() -> None:
    very_low = holding("vl", ("b",), "very-low")
    low = holding("l", ("a",), "low")
    other_type = holding("o", ("d",), "very-low", V5P)
    capacity, _ = capacity_of(SLICES, (very_low, low, other_type), down=("a",))
    assert capacity.reclaimable(V6E, 750) == 1  # "a" is broken: it frees nothing
    assert capacity.reclaimable(V6E, 250) == 1  # strictly lower only
    assert capacity.reclaimable(V6E, 100) == 0
    assert capacity.admissible(V6E, 750) == 2  # and "c" is free
    assert capacity.broken_by_holder() == {"l": 1}


def test_the_snapshot_it_starts_from_is_never_changed() -> None:
    capacity, workloads = capacity_of(SLICES, (W, OTHER), down=("c",))
    snapshot = freeze(capacity, workloads)
    before = copy.deepcopy(snapshot)
    changed = Capacity(snapshot, dict(workloads))
    changed.release(W, ("a",))
    changed.hold(W, changed.take_free(V6E, 1))
    changed.mark_healthy("c")
    changed.set_node_state("b-0", NodeState.CORDONED)
    changed.mark_unhealthy("b")
    changed.add_slice("e", V6E, ("e-0",))
    changed.remove_slice("d")
    changed.drop_removed()
    assert snapshot == before
