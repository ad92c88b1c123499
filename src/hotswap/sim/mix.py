"""What happens to the simulated cluster: node failures and the workload mix, from one seed.

Every policy sees the same failures at the same times and the same sequence of jobs in each
filler stream, so the comparison is paired: differences come from the policy alone.
"""

from __future__ import annotations

import dataclasses
import math
import random

from hotswap.api.cluster import node_name, slice_name
from hotswap.api.spec import WorkloadSpec, workload_spec
from hotswap.sim.config import SimConfig

CLUSTER = "sim"
MAIN = "main"
FILLER_PRIORITIES = ("very-low", "low", "medium", "high")
FILLER_SIZES = (1, 2, 4, 8, 16)
FILLER_SIZE_WEIGHTS = (4, 4, 3, 2, 1)


def slice_names(config: SimConfig) -> list[str]:
    return [slice_name(CLUSTER, i) for i in range(config.slices)]


def nodes_of(slice_: str, config: SimConfig) -> tuple[str, ...]:
    return tuple(node_name(slice_, h) for h in range(config.hosts_per_slice))


def failure_trace(config: SimConfig) -> list[tuple[float, str]]:
    """Node failures as a Poisson process: each node fails at the configured rate.

    Returns (time, node) pairs in time order. A node that is still broken when it is drawn
    again is skipped (it cannot fail twice), so the trace holds only real failures.
    """
    rng = random.Random(f"{config.seed}:failures")
    nodes = [n for s in slice_names(config) for n in nodes_of(s, config)]
    rate_per_s = len(nodes) * config.failures_per_1000_node_days / 1000.0 / 86400.0
    trace: list[tuple[float, str]] = []
    broken_until: dict[str, float] = {}
    if rate_per_s <= 0:
        return trace
    t = 0.0
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= config.duration_s:
            return trace
        node = rng.choice(nodes)
        if broken_until.get(node, -1.0) > t:
            continue
        broken_until[node] = t + config.repair_s
        trace.append((t, node))


def main_spec(config: SimConfig) -> WorkloadSpec:
    """The long very-high-priority job (elastic when the policy allows it)."""
    return workload_spec(
        name=MAIN,
        command="train",
        device_type=config.device_type,
        num_slices=config.main_slices,
        min_slices=config.main_min_slices,
        priority="very-high",
        restart_strategy="BlockingRecreate",
        max_restarts=10,
    )


@dataclasses.dataclass(frozen=True)
class FillerJob:
    spec: WorkloadSpec
    work_s: float  # seconds of training at full size until it is done


def filler_streams(config: SimConfig) -> int:
    """Enough closed-loop submitters to oversubscribe the capacity the main job leaves."""
    spare = config.slices - config.main_slices
    mean_size = sum(s * w for s, w in zip(FILLER_SIZES, FILLER_SIZE_WEIGHTS)) / sum(FILLER_SIZE_WEIGHTS)
    return max(1, math.ceil(spare * config.filler_oversubscription / mean_size))


def filler_job(config: SimConfig, stream: int, index: int) -> FillerJob:
    """The ``index``-th job of a filler stream: the same in every policy."""
    rng = random.Random(f"{config.seed}:filler:{stream}:{index}")
    sizes = [s for s in FILLER_SIZES if s <= config.slices]
    weights = FILLER_SIZE_WEIGHTS[: len(sizes)]
    size = rng.choices(sizes, weights)[0]
    min_slices = math.ceil(size / 2) if size > 1 and rng.random() < 1 / 3 else None
    spec = workload_spec(
        name=f"f{stream}-{index}",
        command="train",
        device_type=config.device_type,
        num_slices=size,
        min_slices=min_slices,
        priority=rng.choice(FILLER_PRIORITIES),
        max_restarts=10,
    )
    return FillerJob(spec, rng.expovariate(1.0 / (config.filler_mean_hours * 3600.0)))


def filler_think_s(config: SimConfig, stream: int, index: int) -> float:
    """Pause between a stream's job finishing and its next submission."""
    rng = random.Random(f"{config.seed}:think:{stream}:{index}")
    return rng.expovariate(1.0 / config.filler_think_s) if config.filler_think_s > 0 else 0.0
