"""Which victim loses the least: hotswap's rule against Kueue's, on the same failures and jobs.

When work must be evicted, hotswap's core takes, within the lowest priority level, the holder
that loses the least progress since its last checkpoint (``VictimOrder.LEAST_LOST_WORK``, what
Kueue's issue 477 asks for); Kueue takes the most recently admitted one
(``VictimOrder.NEWEST_FIRST``). A victim that saves on SIGTERM loses nothing either way, so the
comparison runs with victims that cannot (``SimConfig.preemption_saves`` off): each loses the
progress since its last periodic checkpoint. Both runs share the seed, so they see the same
node failures and the same arrivals of the same jobs; only the choice of victims differs.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from hotswap.core.policy import VictimOrder
from hotswap.sim import mix
from hotswap.sim.config import POLICIES, SimConfig
from hotswap.sim.runner import summarize
from hotswap.sim.simulation import PolicySimulation

DEFAULT_POLICY = "hotswap"  # the main job takes a lower-priority job's slice at every failure under it


@dataclasses.dataclass(frozen=True)
class VictimRun:
    """What one victim rule cost over the run."""

    victims: str
    preemptions: int
    lost_slice_s: float  # progress preempted jobs threw away, in slice-seconds
    low_goodput: float  # the lower-priority jobs' productive share of their slice-time
    main_goodput: float
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        per = self.lost_slice_s / self.preemptions if self.preemptions else 0.0
        return {
            "preemptions": self.preemptions,
            "lost_slice_hours": round(self.lost_slice_s / 3600.0, 2),
            "lost_slice_minutes_per_preemption": round(per / 60.0, 2),
            "low_priority_goodput": round(self.low_goodput, 4),
            "main_goodput": round(self.main_goodput, 4),
            "wall_s": round(self.wall_s, 3),
        }


@dataclasses.dataclass(frozen=True)
class VictimComparison:
    config: SimConfig
    policy: str
    failures: int
    runs: dict[str, VictimRun]  # by VictimOrder value, least-lost-work first

    @property
    def least_lost(self) -> VictimRun:
        return self.runs[VictimOrder.LEAST_LOST_WORK.value]

    @property
    def newest_first(self) -> VictimRun:
        return self.runs[VictimOrder.NEWEST_FIRST.value]

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document: both rules side by side."""
        c = self.config
        ours, kueue = self.least_lost, self.newest_first
        return {
            "comparison": "victims",
            "nodes": c.nodes,
            "slices": c.slices,
            "device_type": c.device_type,
            "days": c.days,
            "seed": c.seed,
            "policy": self.policy,
            "failures": self.failures,
            "checkpoint_interval_s": c.checkpoint_interval_s,
            "victims_lose": "the progress since their last periodic checkpoint (no save on SIGTERM)",
            "victims": {name: run.to_dict() for name, run in self.runs.items()},
            "lost_slice_hours_saved": round((kueue.lost_slice_s - ours.lost_slice_s) / 3600.0, 2),
            "lost_work_ratio": round(ours.lost_slice_s / kueue.lost_slice_s, 4) if kueue.lost_slice_s else None,
        }


def compare_victims(config: SimConfig, policy: str = DEFAULT_POLICY) -> VictimComparison:
    """Run ``policy`` twice on ``config``'s cluster and seed: least lost work, then newest first."""
    config = dataclasses.replace(config, preemption_saves=False, policies=(policy,))
    trace = mix.failure_trace(config)
    fillers = mix.FillerMix(config)
    runs: dict[str, VictimRun] = {}
    for order in (VictimOrder.LEAST_LOST_WORK, VictimOrder.NEWEST_FIRST):
        started = time.perf_counter()
        scheduler = dataclasses.replace(POLICIES[policy], victims=order)
        result = PolicySimulation(config, policy, scheduler, trace, fillers).run()
        wall = time.perf_counter() - started
        summary = summarize(result, wall)
        runs[order.value] = VictimRun(
            order.value, result.counts.preemptions, result.counts.preemption_lost_s,
            summary.low_goodput, summary.main_goodput, wall,
        )
    return VictimComparison(config, policy, len(trace), runs)
