"""Run policies over the same failures and workload mix, in parallel processes, and summarise.

A run is one policy on one cluster (size, seed). Runs are independent, so ``jobs`` worker
processes run them side by side; a worker sends back only a :class:`RunSummary` (a few numbers
and the recovery times), never the simulation.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence

from hotswap.core.goodput import BADPUT, Category, Ledger, percentile
from hotswap.sim import mix
from hotswap.sim.config import POLICIES, SimConfig
from hotswap.sim.simulation import Counts, PolicyResult, PolicySimulation

LEVELS = ("very-high", "high", "medium", "low", "very-low")
# progress(config, policy, fraction of that run done)
Progress = Callable[[SimConfig, str, float], None]


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What one run measured."""

    policy: str
    nodes: int
    seed: int
    goodput_by_priority: dict[str, float]
    badput_by_priority: dict[str, dict[str, float]]
    main_goodput: float  # the very-high job's productive share of its slice-time
    low_goodput: float  # the same over all lower-priority work together
    spare_used: float  # productive lower-priority slice-time / slice-time the main job did not hold
    main_mttr_s: tuple[float, ...]  # failure under the main job -> it makes progress again
    mttr_s: tuple[float, ...]  # the same for every job
    mttr_by_priority_s: dict[str, tuple[float, ...]]
    counts: Counts
    wall_s: float


def summarize(result: PolicyResult, wall_s: float) -> RunSummary:
    config = result.config
    by_level: dict[str, Ledger] = {}
    low = Ledger()
    main_held = 0.0
    for job in result.jobs.values():
        level = job.level
        by_level.setdefault(level, Ledger())
        by_level[level] += job.ledger
        if job.stream is None:
            main_held += job.held_s
        else:
            low += job.ledger
    main = by_level.get("very-high", Ledger())
    spare = config.slices * config.duration_s - main_held
    mttr_by_level: dict[str, list[float]] = {}
    for name, seconds in result.mttr:
        mttr_by_level.setdefault(result.jobs[name].level, []).append(seconds)
    return RunSummary(
        policy=result.policy,
        nodes=config.nodes,
        seed=config.seed,
        goodput_by_priority={lv: by_level[lv].goodput for lv in LEVELS if lv in by_level},
        badput_by_priority={
            lv: {c.value: share for c, share in _shares(by_level[lv]).items() if c in BADPUT}
            for lv in LEVELS
            if lv in by_level
        },
        main_goodput=main.goodput,
        low_goodput=low.goodput,
        spare_used=low.seconds[Category.PRODUCTIVE] / spare if spare > 0 else 0.0,
        main_mttr_s=tuple(mttr_by_level.get("very-high", ())),
        mttr_s=tuple(seconds for _, seconds in result.mttr),
        mttr_by_priority_s={lv: tuple(mttr_by_level[lv]) for lv in LEVELS if lv in mttr_by_level},
        counts=result.counts,
        wall_s=wall_s,
    )


def _shares(ledger: Ledger) -> dict[Category, float]:
    total = ledger.total
    return {c: (v / total if total else 0.0) for c, v in ledger.seconds.items()}


def simulate(config: SimConfig, policy: str, progress: Callable[[float], None] | None = None) -> PolicyResult:
    """One policy on ``config``'s cluster, in this process (tests read its jobs)."""
    return PolicySimulation(config, policy, POLICIES[policy], mix.failure_trace(config)).run(progress)


def _run_config(config: SimConfig, policies: Sequence[str], progress: Progress | None) -> list[RunSummary]:
    """The policies on one cluster, one after the other, sharing the trace and the job mix."""
    trace = mix.failure_trace(config)
    fillers = mix.FillerMix(config)
    runs = []
    for policy in policies:
        started = time.perf_counter()
        report = (lambda fraction, policy=policy: progress(config, policy, fraction)) if progress else None
        result = PolicySimulation(config, policy, POLICIES[policy], trace, fillers).run(report)
        runs.append(summarize(result, time.perf_counter() - started))
    return runs


def _run_one(config: SimConfig, policy: str) -> RunSummary:
    return _run_config(config, (policy,), None)[0]


def default_jobs(runs: int) -> int:
    """Worker processes for ``runs`` simulations: one each when there are few (three policies
    on two CPUs finish in 1.5 runs' time, not 2), else one per CPU."""
    cpus = os.cpu_count() or 1
    return runs if runs <= 2 * cpus else cpus


def run_all(
    configs: Sequence[SimConfig], jobs: int | None = 1, progress: Progress | None = None
) -> list[RunSummary]:
    """Every policy of every config; with ``jobs`` > 1 in that many worker processes (None:
    :func:`default_jobs`).

    Results come back in the order of ``configs`` and, within one, of its policies."""
    tasks = [(config, policy) for config in configs for policy in config.policies]
    if jobs is None:
        jobs = default_jobs(len(tasks))
    if jobs <= 1 or len(tasks) == 1:
        runs = []
        for config in configs:
            runs.extend(_run_config(config, config.policies, progress))
        return runs
    # fork: workers start in milliseconds and inherit the imports (the CLI has no threads).
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=context) as pool:
        futures = {pool.submit(_run_one, config, policy): (config, policy) for config, policy in tasks}
        done: dict[tuple[int, str], RunSummary] = {}
        for future in concurrent.futures.as_completed(futures):
            config, policy = futures[future]
            done[(id(config), policy)] = future.result()
            if progress is not None:
                progress(config, policy, 1.0)
    return [done[(id(config), policy)] for config, policy in tasks]


@dataclasses.dataclass
class Comparison:
    """The policies of one cluster and seed, side by side."""

    config: SimConfig
    runs: list[RunSummary]
    wall_s: float

    def to_dict(self) -> dict:
        """The ``--json`` document."""
        c = self.config
        return {
            "nodes": c.nodes,
            "slices": c.slices,
            "device_type": c.device_type,
            "days": c.days,
            "seed": c.seed,
            "params": params_of(c),
            "policies": {run.policy: run_document(run) for run in self.runs},
            "wall_s": round(self.wall_s, 3),
        }


def params_of(c: SimConfig, sized: bool = True) -> dict:
    """The parameters of a run; ``sized``: with those that depend on the cluster's size."""
    params = {
        "failures_per_1000_node_days": c.failures_per_1000_node_days,
        "repair_s": c.repair_s,
        "startup_s": c.startup_s,
        "restore_s": c.restore_s,
        "checkpoint_interval_s": c.checkpoint_interval_s,
        "elastic_snapshot_s": c.elastic_snapshot_s,
        "main_fraction": c.main_fraction,
        "main_min_fraction_when_elastic": c.main_min_fraction,
    }
    if sized:
        params.update(
            main_slices=c.main_slices,
            main_min_slices_when_elastic=c.main_min_slices,
            filler_streams=mix.filler_streams(c),
        )
    return params


def run_document(run: RunSummary) -> dict:
    return {
        "goodput_by_priority": {lv: round(v, 4) for lv, v in run.goodput_by_priority.items()},
        "badput_by_priority": {
            lv: {k: round(v, 4) for k, v in shares.items()} for lv, shares in run.badput_by_priority.items()
        },
        "main_goodput": round(run.main_goodput, 4),
        "low_priority_goodput": round(run.low_goodput, 4),
        "spare_capacity_used": round(run.spare_used, 4),
        "main_restarts": run.counts.main_restarts,
        "main_elastic_reconfigurations": run.counts.main_reconfigurations,
        "mttr_s": mttr_document(run.mttr_s),
        "mttr_by_priority_s": {lv: mttr_document(v) for lv, v in run.mttr_by_priority_s.items()},
        "preemptions": run.counts.preemptions,
        "failures": run.counts.failures,
        "disruptions": run.counts.disruptions,
        "completed_jobs": run.counts.completed,
        "scheduler_decisions": run.counts.decisions,
        "events": run.counts.events,
        "wall_s": round(run.wall_s, 3),
    }


def mttr_document(values: Sequence[float]) -> dict[str, float | int | None]:
    p50, p99 = percentile(values, 50), percentile(values, 99)
    return {
        "p50": None if p50 is None else round(p50, 1),
        "p99": None if p99 is None else round(p99, 1),
        "count": len(values),
    }


def compare(config: SimConfig, jobs: int | None = 1, progress: Progress | None = None) -> Comparison:
    """Simulate each policy of ``config.policies`` on the same trace."""
    started = time.perf_counter()
    runs = run_all([config], jobs, progress)
    return Comparison(config, runs, time.perf_counter() - started)
