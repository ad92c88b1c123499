"""The policy comparison over cluster sizes and seeds, with confidence intervals.

Each (size, seed) is one cluster: its failure trace and workload mix are drawn from the seed
and every policy runs on that same cluster, so the policies are compared pair by pair. A metric
is reported as the mean over seeds with a 95% confidence interval from Student's t
distribution (seeds are independent draws).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence

from hotswap.api.errors import InvalidInputError
from hotswap.core.goodput import percentile
from hotswap.sim.config import SimConfig
from hotswap.sim.runner import Progress, RunSummary, params_of, run_all

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom (any statistics table);
# above 30 the normal quantile is within 2%.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)
MAX_SEEDS = 100

METRICS: dict[str, Callable[[RunSummary], float | None]] = {
    "main_goodput": lambda run: run.main_goodput,
    "low_priority_goodput": lambda run: run.low_goodput,
    "spare_capacity_used": lambda run: run.spare_used,
    "main_restarts": lambda run: float(run.counts.main_restarts),
    "main_mttr_p50_s": lambda run: percentile(run.main_mttr_s, 50),
    "main_mttr_p99_s": lambda run: percentile(run.main_mttr_s, 99),
}

# How a metric reads in a table: its label and number format.
METRIC_LABELS: dict[str, tuple[str, str]] = {
    "main_goodput": ("goodput, high-priority job", "{:.3f}"),
    "low_priority_goodput": ("goodput, all other work", "{:.3f}"),
    "spare_capacity_used": ("spare capacity used", "{:.3f}"),
    "main_restarts": ("restarts, high job", "{:.0f}"),
    "main_mttr_p50_s": ("MTTR p50, high job (s)", "{:.0f}"),
    "main_mttr_p99_s": ("MTTR p99, high job (s)", "{:.0f}"),
}


@dataclasses.dataclass(frozen=True)
class Estimate:
    mean: float
    ci95: float  # half-width; 0 with a single seed
    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Estimate:
        mean = statistics.fmean(values)
        if len(values) < 2:
            return cls(mean, 0.0, tuple(values))
        df = len(values) - 1
        t = _T95[df - 1] if df <= len(_T95) else 1.960
        return cls(mean, t * statistics.stdev(values) / math.sqrt(len(values)), tuple(values))


def ladder(nodes: int, hosts_per_slice: int, steps: int = 4) -> list[int]:
    """Cluster sizes for the comparison: ``nodes`` and halvings of it, as long as they stay
    whole slices and hold the main job plus at least one other slice."""
    sizes = [nodes]
    while len(sizes) < steps:
        half = sizes[-1] // 2
        if half % hosts_per_slice or half < 8 * hosts_per_slice:
            break
        sizes.append(half)
    return sorted(sizes)


@dataclasses.dataclass
class Sweep:
    base: SimConfig
    sizes: list[int]
    seeds: list[int]
    runs: list[RunSummary]
    wall_s: float

    def estimates(self, policy: str, nodes: int) -> dict[str, Estimate]:
        runs = [r for r in self.runs if r.policy == policy and r.nodes == nodes]
        found: dict[str, Estimate] = {}
        for name, metric in METRICS.items():
            values = [v for v in (metric(r) for r in runs) if v is not None]
            if values:
                found[name] = Estimate.of(values)
        return found

    def to_dict(self) -> dict:
        """The ``--compare --json`` document."""
        c = self.base
        return {
            "compare": True,
            "sizes": self.sizes,
            "seeds": self.seeds,
            "device_type": c.device_type,
            "days": c.days,
            "params": params_of(c, sized=False),
            "policies": {
                policy: {
                    str(nodes): {
                        name: {"mean": round(e.mean, 4), "ci95": round(e.ci95, 4), "values": [round(v, 4) for v in e.values]}
                        for name, e in self.estimates(policy, nodes).items()
                    }
                    for nodes in self.sizes
                }
                for policy in c.policies
            },
            "wall_s": round(self.wall_s, 3),
        }


def sweep(
    base: SimConfig, sizes: Sequence[int], seeds: int, jobs: int | None, progress: Progress | None = None
) -> Sweep:
    """Every policy of ``base`` on every size and seed (seeds ``base.seed`` onwards)."""
    if not 1 <= seeds <= MAX_SEEDS:
        raise InvalidInputError(f"--seeds {seeds} is out of range: give 1 to {MAX_SEEDS}")
    seed_list = list(range(base.seed, base.seed + seeds))
    configs = [dataclasses.replace(base, nodes=nodes, seed=seed) for nodes in sizes for seed in seed_list]
    started = time.perf_counter()
    runs = run_all(configs, jobs, progress)
    return Sweep(base, sorted(sizes), seed_list, runs, time.perf_counter() - started)
