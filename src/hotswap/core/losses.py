"""The second step of a round: workloads that lost slices this round (failed, cordoned,
drained or removed) go on without them, are replaced, requeued, or wait for repair."""

from __future__ import annotations

from hotswap.core.demands import Demand
from hotswap.core.workload import Workload
from hotswap.core.ordering import DemandKind
from hotswap.core.placement import lost_positions, split_at
from hotswap.core.round_state import RESTARTING, RoundState


def handle_losses(state: RoundState) -> None:
    """Decide for each workload that lost slices, oldest first.

    - not started yet (its workers wait): only the reservation changes, nothing to stop;
    - elastic and still at or above its floor: it scales down and survivors keep running;
    - hotswap: it is restarted (or scaled) on replacement slices, see ``want_replacement``;
    - otherwise it waits holding its slices until they are repaired, or is requeued when a
      slice it held left the cluster and cannot come back.

    A slice lost in this round is gone for a running workload even when its node is back by the
    end of the round (a failure and its repair reported together): the workers on it died.
    """
    hotswap = state.config.hotswap
    holders = state.capacity.holders
    for name in sorted(state.lost, key=lambda n: state.workloads[n].seq):
        workload = state.workloads[name]
        lost = state.lost[name]
        reason = "; ".join(lost.values())
        gone_names = {s for s in state.capacity.unhealthy if holders.get(s) == name}
        if workload.phase is not RESTARTING:
            gone_names.update(lost)
        removed = any(s in state.capacity.removed for s in gone_names)
        # The replica positions of the lost slices, and the survivors in replica order, only for
        # a workload that goes on without them: finding them scans its slices, and the main job
        # of a large cluster holds tens of thousands (one that waits for repair keeps its own).
        if workload.phase is RESTARTING:
            if hotswap or removed:
                lost_at = lost_positions(workload.slices, gone_names)
                keep, gone = split_at(workload.slices, lost_at)
                state.release(workload, gone)
                state.update(workload, slices=keep)
                _want_replacement(state, workload, keep, lost_at, reason, restart=True)
            continue
        workload = state.update(workload, disruptions=workload.disruptions + 1)
        scales = state.elastic(workload) and len(workload.slices) - len(gone_names) >= state.floor(workload)
        if scales or hotswap:
            lost_at = lost_positions(workload.slices, gone_names)
            keep, gone = split_at(workload.slices, lost_at)
            if scales:
                state.scale_down(workload, keep, gone, reason)
                if hotswap:
                    _want_replacement(state, workload, keep, lost_at, reason, restart=False)
            else:
                state.release(workload, gone)
                state.update(workload, slices=keep, replicas=None)  # restarted (or requeued) below
                _want_replacement(state, workload, keep, lost_at, reason, restart=True)
        elif removed:
            state.requeue(workload, f"{reason}; it cannot wait for repair")
        else:
            state.restart_in_place(workload, f"{reason}; waiting for repair", charged=False, wait_for_repair=True)


def _want_replacement(
    state: RoundState, workload: Workload, keep: tuple[str, ...], lost_at: tuple[int, ...], reason: str, restart: bool
) -> None:
    """Ask for slices to bring ``workload`` (its record from before the loss) back to its size.

    ``need`` is what it must get to run at all (its floor minus what it kept); when it kept
    enough (elastic), the replacement is welcome but optional. The demand remembers the slices
    held before the loss, so that a restart puts replacements at the lost replicas' positions.
    """
    want = workload.spec.num_slices - len(keep)
    if want <= 0:
        return
    need = state.floor(workload) - len(keep)
    state.replacing[workload.name] = Demand(
        workload.name, DemandKind.REPLACE, want, need, workload.slices, lost_at, restart, reason
    )

