"""Run every policy over the same failures and workload mix, and summarise the comparison."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from hotswap.core.goodput import Category, combine, goodput_by, percentile
from hotswap.sim import mix
from hotswap.sim.config import POLICIES, SimConfig
from hotswap.sim.simulation import PolicyResult, PolicySimulation

Progress = Callable[[str, float], None]


@dataclasses.dataclass
class Comparison:
    config: SimConfig
    results: list[PolicyResult]
    wall_s: float

    def to_dict(self) -> dict:
        """The ``--json`` document."""
        policies = {}
        for result in self.results:
            goodput = goodput_by(result.ledgers, result.priorities)
            grouped = {}
            for name, ledger in result.ledgers.items():
                grouped.setdefault(result.priorities[name], []).append(ledger)
            badput = {
                level: {c.value: round(v, 4) for c, v in _shares(combine(ls)).items() if c is not Category.PRODUCTIVE}
                for level, ls in grouped.items()
            }
            policies[result.policy] = {
                "goodput_by_priority": {level: round(goodput[level], 4) for level in _levels(goodput)},
                "badput_by_priority": {level: badput[level] for level in _levels(badput)},
                "mttr_s": _mttr(result.mttr_s),
                "mttr_by_priority_s": {
                    level: _mttr(result.mttr_by_priority[level]) for level in _levels(result.mttr_by_priority)
                },
                "preemptions": result.preemptions,
                "failures": result.failures,
                "disruptions": result.disruptions,
                "completed_jobs": result.completed,
                "scheduler_decisions": result.decisions,
            }
        c = self.config
        return {
            "nodes": c.nodes,
            "slices": c.slices,
            "device_type": c.device_type,
            "days": c.days,
            "seed": c.seed,
            "params": {
                "failures_per_1000_node_days": c.failures_per_1000_node_days,
                "repair_s": c.repair_s,
                "startup_s": c.startup_s,
                "restore_s": c.restore_s,
                "checkpoint_interval_s": c.checkpoint_interval_s,
                "main_slices": c.main_slices,
                "main_min_slices_when_elastic": c.main_min_slices,
                "filler_streams": mix.filler_streams(c),
            },
            "policies": policies,
            "wall_s": round(self.wall_s, 3),
        }


def _levels(mapping: dict) -> list[str]:
    order = ["very-high", "high", "medium", "low", "very-low"]
    return [level for level in order if level in mapping]


def _shares(ledger) -> dict[Category, float]:
    total = ledger.total
    return {c: (v / total if total else 0.0) for c, v in ledger.seconds.items()}


def _mttr(values: list[float]) -> dict[str, float | None]:
    p50, p99 = percentile(values, 50), percentile(values, 99)
    return {
        "p50": None if p50 is None else round(p50, 1),
        "p99": None if p99 is None else round(p99, 1),
        "count": len(values),
    }


def compare(config: SimConfig, progress: Progress | None = None) -> Comparison:
    """Simulate each policy of ``config.policies`` on the same trace."""
    started = time.perf_counter()
    failures = mix.failure_trace(config)
    results = []
    for name in config.policies:
        simulation = PolicySimulation(config, name, POLICIES[name], failures)
        callback = (lambda fraction, name=name: progress(name, fraction)) if progress else None
        results.append(simulation.run(callback))
    return Comparison(config, results, time.perf_counter() - started)
