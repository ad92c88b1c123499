"""Demands for slices and the queue a round serves them from, like Kueue's queue manager.

Demands are served in :func:`hotswap.core.ordering.demand_order`. A demand that cannot be
served now is parked with its device type, like Kueue's inadmissible workloads, and goes back
into the queue as soon as capacity of that type is freed later in the round (an eviction, a
shrink, a requeue), because that capacity may be what it was missing.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools

from hotswap.core.model import Workload
from hotswap.core.ordering import DemandKind, demand_order

_Order = tuple[int, int, int]


@dataclasses.dataclass(slots=True)
class Demand:
    workload: str
    kind: DemandKind
    want: int  # slices it would like
    need: int  # fewest that make the demand worth serving
    # For replacements: the slices it had before the loss (positions are kept) and whether it
    # restarts (non-elastic) or scales (elastic, survivors keep running).
    previous: tuple[str, ...] = ()
    restart: bool = False
    reason: str = ""


class DemandQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[_Order, int, Demand]] = []
        # The counter keeps equal orders first-in first-out, and never compares demands.
        self._counter = itertools.count()
        self._parked: dict[str, list[tuple[_Order, Demand]]] = {}

    def push(self, demand: Demand, workload: Workload) -> None:
        heapq.heappush(self._heap, (demand_order(workload, demand.kind), next(self._counter), demand))

    def pop(self) -> Demand | None:
        """The next demand to serve, None when there is none."""
        return heapq.heappop(self._heap)[2] if self._heap else None

    def park(self, demand: Demand, workload: Workload) -> None:
        """Keep a demand that cannot be served until capacity of its type is freed."""
        self._parked.setdefault(workload.device_type, []).append((demand_order(workload, demand.kind), demand))

    def wake(self, device_type: str) -> None:
        """Capacity of ``device_type`` was freed: its parked demands are queued again."""
        for order, demand in self._parked.pop(device_type, []):
            heapq.heappush(self._heap, (order, next(self._counter), demand))
