"""The decision round: a snapshot and events in, a new snapshot and actions out.

``decide`` is pure: no I/O, no clock (``now`` is an argument), no threads, no randomness, and
nothing in it depends on set or hash order, so the same inputs always give the same actions.
Like Kueue's scheduler it works in three steps: take the snapshot, compute the targets
(:func:`hotswap.core.preemption.plan_reclaim`), and return the effects as data for a backend to
enact.

One round, each step in its own module, all working on one
:class:`~hotswap.core.round_state.RoundState` (the workloads, and the capacity indexes of
:mod:`hotswap.core.capacity`):

1. :mod:`~hotswap.core.apply_events`: apply cluster events (nodes, slices), then workload
   events, in the order given;
2. :mod:`~hotswap.core.losses`: handle lost capacity: a workload whose slice became unhealthy
   scales down (elastic), is marked for replacement (hotswap) or waits for repair holding its
   slices;
3. :mod:`~hotswap.core.admission`: serve demands for slices in
   :func:`hotswap.core.ordering.demand_order`: replacements, queued workloads, elastic growth.
   Each takes free healthy slices first, then (except growth) slices of strictly
   lower-priority work (:mod:`~hotswap.core.placement`, :mod:`~hotswap.core.preemption`);
4. :mod:`~hotswap.core.admission`: start the workers of workloads that were waiting
   (BlockingRecreate, repair) once they can.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from hotswap.core import actions as act
from hotswap.core import events as ev
from hotswap.core.admission import serve_demands, start_ready
from hotswap.core.apply_events import apply_events
from hotswap.core.losses import handle_losses
from hotswap.core.model import Snapshot
from hotswap.core.policy import DEFAULT_CONFIG, SchedulerConfig
from hotswap.core.records import fast_init
from hotswap.core.round_state import RoundState


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    snapshot: Snapshot
    actions: tuple[act.Action, ...]


def decide(
    snapshot: Snapshot,
    events: Iterable[ev.Event],
    now: float,
    config: SchedulerConfig = DEFAULT_CONFIG,
    consume: bool = False,
) -> Decision:
    """Apply ``events`` to ``snapshot`` at time ``now`` and decide what to do.

    ``consume``: the caller gives ``snapshot`` up, and never reads it (or a snapshot decided
    from it without ``consume``) again; the round then changes its mappings in place instead of
    copying them (:mod:`hotswap.core.cow`), and the same actions come out. The simulator does
    this; a backend, which keeps its last snapshot if a round fails, does not."""
    state = RoundState(snapshot, now, config, consume)
    apply_events(state, list(events))
    if state.needs_scheduling:
        handle_losses(state)
        serve_demands(state)
        start_ready(state)
        # Last: until now the holders of removed slices still had to let go of them.
        state.capacity.drop_removed()
    return Decision(state.freeze(), tuple(state.actions))
