"""The demand queue on its own: served in demand_order, parked demands woken per device type."""

from __future__ import annotations

import dataclasses

from builders import holding

from hotswap.core.demands import Demand, DemandQueue
from hotswap.core.ordering import DemandKind


def drain(queue: DemandQueue) -> list[tuple[str, DemandKind]]:
    served = []
    while (demand := queue.pop()) is not None:
        served.append((demand.workload, demand.kind))
    return served


def test_served_by_priority_then_kind_then_age() -> None:
    queue = DemandQueue()
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
    queue = DemandQueue()
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
