"""The demand queue on its own: served in demand_order, parked demands woken per device type,
and buckets of queued workloads that hand out only the first one that fits."""

from __future__ import annotations

import dataclasses

from builders import holding, spec

from hotswap.core.demands import Demand, DemandQueue
from hotswap.core.index import Indexes, WorkloadIndex
from hotswap.core.workload import Workload
from hotswap.core.ordering import DemandKind

V6E = "v6e-16"


@dataclasses.dataclass
class Room:
    """What the queue asks of a round: here, fixed numbers per (type, priority)."""

    index: WorkloadIndex
    room: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)
    free: dict[str, int] = dataclasses.field(default_factory=dict)

    def admissible(self, device_type: str, priority: int) -> int:
        return self.room.get((device_type, priority), 0)

    def free_count(self, device_type: str) -> int:
        return self.free.get(device_type, 0)


def queued(name: str, seq: int, slices: int, priority: str = "low", **more: object) -> Workload:
    return Workload(spec=spec(name, slices, priority, **more), seq=seq, created_at=0.0)


def room_of(*workloads: Workload, **kwargs: object) -> Room:
    return Room(WorkloadIndex(Indexes.build({w.name: w for w in workloads})), **kwargs)  # type: ignore[arg-type]


def drain(queue: DemandQueue) -> list[tuple[str, DemandKind]]:
    served = []
    while (demand := queue.pop()) is not None:
        served.append((demand.workload, demand.kind))
    return served


def test_served_by_priority_then_kind_then_age() -> None:
    queue = DemandQueue(room_of(), elastic=True)
    old = holding("old", ("s0",), "low")
    new = dataclasses.replace(holding("new", ("s1",), "low"), seq=1)
    high = holding("high", ("s2",), "high")
    queue.push(Demand("new", DemandKind.ADMIT, 1, 1), new)
    queue.push(Demand("old", DemandKind.GROW, 1, 1), old)
    queue.push(Demand("old", DemandKind.ADMIT, 1, 1), old)
    queue.push(Demand("high", DemandKind.GROW, 1, 1), high)
    queue.push(Demand("new", DemandKind.REPLACE, 1, 1), new)
    assert drain(queue) == [
        ("high", DemandKind.GROW),
        ("new", DemandKind.REPLACE),
        ("old", DemandKind.ADMIT),
        ("new", DemandKind.ADMIT),
        ("old", DemandKind.GROW),
    ]


def test_parked_demands_wait_for_capacity_of_their_type() -> None:
    queue = DemandQueue(room_of(), elastic=True)
    v6e, v5p = holding("a", ("s0",)), holding("b", ("s1",), device="v5p-16")
    queue.park(Demand("a", DemandKind.ADMIT, 1, 1), v6e)
    queue.park(Demand("b", DemandKind.ADMIT, 1, 1), v5p)
    assert queue.pop() is None
    queue.wake("v5p-16")
    assert drain(queue) == [("b", DemandKind.ADMIT)]
    queue.wake("v5p-16")  # woken once: parked again only if refused again
    assert queue.pop() is None
    queue.wake("v6e-16")
    assert drain(queue) == [("a", DemandKind.ADMIT)]


def test_a_bucket_hands_out_the_first_queued_workload_that_fits() -> None:
    # Room for 2 slices at "low": the 4-slice head does not fit, the next two do (FIFO).
    room = room_of(queued("big", 0, 4), queued("one", 1, 1), queued("two", 2, 2), room={(V6E, 250): 2})
    queue = DemandQueue(room, elastic=True)
    queue.open(grow=False, no_grow=set())
    first = queue.pop()
    assert first is not None and (first.workload, first.want, first.need) == ("one", 1, 1)
    room.room[(V6E, 250)] = 1  # "one" took a slice
    assert queue.pop() is None  # "two" needs 2: it is not handed out


def test_elastic_workloads_need_only_their_floor_when_the_cluster_scales_them() -> None:
    elastic = queued("e", 0, 4, min_slices=2)
    for scales, expected in ((True, [("e", DemandKind.ADMIT)]), (False, [])):
        queue = DemandQueue(room_of(elastic, room={(V6E, 250): 2}), elastic=scales)
        queue.open(grow=False, no_grow=set())
        assert drain(queue) == expected


def test_a_wake_looks_at_every_queued_workload_of_the_type_again() -> None:
    room = room_of(queued("a", 0, 2), queued("b", 1, 2), room={(V6E, 250): 1})
    queue = DemandQueue(room, elastic=True)
    queue.open(grow=False, no_grow=set())
    assert queue.pop() is None  # nothing fits
    room.room[(V6E, 250)] = 2  # capacity freed later in the round
    queue.wake(V6E)
    served = queue.pop()
    assert served is not None and served.workload == "a"


def test_growth_needs_a_free_slice_and_skips_workloads_being_replaced() -> None:
    grower = holding("g", ("s0",), "low", min_slices=1)
    grower = dataclasses.replace(grower, spec=spec("g", 3, "low", min_slices=1))
    replaced = dataclasses.replace(grower, spec=spec("r", 3, "low", min_slices=1), seq=1)
    room = room_of(grower, replaced)
    queue = DemandQueue(room, elastic=True)
    queue.open(grow=True, no_grow={"r"})
    assert queue.pop() is None  # no free slice
    room.free[V6E] = 1
    queue.wake(V6E)
    assert drain(queue) == [("g", DemandKind.GROW)]  # once per round, and never "r"
