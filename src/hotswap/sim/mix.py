"""What happens to the simulated cluster: node failures and the workload mix, from one seed.

Every policy sees the same failures at the same times and the same sequence of jobs in each
filler stream, so the comparison is paired: differences come from the policy alone.
"""

from __future__ import annotations

import dataclasses
import itertools
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


@dataclasses.dataclass(frozen=True, slots=True)
class FillerJob:
    """One job of a filler stream. It keeps its shape's template, not a spec of its own: the
    mix of a long run holds every job drawn (the policies share them), and a spec per job is
    most of a finished job's memory. :meth:`spec` makes the job's spec when it is submitted."""

    template: WorkloadSpec  # size, priority, elasticity; shared by every job of that shape
    name: str
    work_s: float  # seconds of training at full size until it is done
    think_s: float  # pause between this job finishing and the stream's next submission

    def spec(self) -> WorkloadSpec:
        return self.template.model_copy(update={"name": self.name})


def filler_streams(config: SimConfig) -> int:
    """Enough closed-loop submitters to oversubscribe the capacity the main job leaves."""
    if config.filler_oversubscription <= 0:
        return 0
    spare = config.slices - config.main_slices
    mean_size = sum(s * w for s, w in zip(FILLER_SIZES, FILLER_SIZE_WEIGHTS)) / sum(FILLER_SIZE_WEIGHTS)
    return max(1, math.ceil(spare * config.filler_oversubscription / mean_size))


class FillerMix:
    """The jobs of every filler stream, drawn in order from one generator per stream: the same
    jobs in every policy. A stream keeps only its latest job (a long run draws ~300,000); a
    policy that starts a stream over (the next one simulated in this process) draws it again
    from the stream's seed.

    A spec is a validated template per shape with the job's name filled in: validating 16,000
    specs would cost more than simulating them (see :class:`FillerJob`)."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self._latest: dict[int, FillerJob] = {}  # each stream's last job drawn
        self._drawn: dict[int, int] = {}  # ...and its index
        self._rngs: dict[int, random.Random] = {}
        self._templates: dict[tuple[int, int | None, str], WorkloadSpec] = {}
        # Only sizes that fit beside the main job: a filler that cannot is never admitted.
        room = max(1, config.slices - config.main_slices)
        self._sizes = [s for s in FILLER_SIZES if s <= room]
        # (random.choices accumulates the weights at every call; given accumulated, it draws alike.)
        self._size_cum_weights = list(itertools.accumulate(FILLER_SIZE_WEIGHTS[: len(self._sizes)]))

    def job(self, stream: int, index: int) -> FillerJob:
        """The ``index``-th job of a stream: the same in every policy."""
        drawn = self._drawn.get(stream, -1)
        if index < drawn:  # the stream starts over
            del self._rngs[stream]
            drawn = -1
        while drawn < index:
            drawn += 1
            self._latest[stream] = self._draw(stream, drawn)
        self._drawn[stream] = drawn
        return self._latest[stream]

    def _draw(self, stream: int, index: int) -> FillerJob:
        config = self.config
        rng = self._rngs.get(stream)
        if rng is None:
            rng = self._rngs[stream] = random.Random(f"{config.seed}:filler:{stream}")
        size = rng.choices(self._sizes, cum_weights=self._size_cum_weights)[0]
        elastic = size > 1 and rng.random() < 1 / 3
        priority = rng.choice(FILLER_PRIORITIES)
        work_s = rng.expovariate(1.0 / (config.filler_mean_hours * 3600.0))
        think_s = rng.expovariate(1.0 / config.filler_think_s) if config.filler_think_s > 0 else 0.0
        min_slices = math.ceil(size / 2) if elastic else None
        template = self._templates.get((size, min_slices, priority))
        if template is None:
            template = self._templates[(size, min_slices, priority)] = workload_spec(
                name="filler",
                command="train",
                device_type=config.device_type,
                num_slices=size,
                min_slices=min_slices,
                priority=priority,
                max_restarts=10,
            )
        return FillerJob(template, f"f{stream}-{index}", work_s, think_s)
