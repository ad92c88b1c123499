"""When work must be evicted, hotswap evicts the victim that loses the least work (progress since
its last checkpoint, priority first; what Kueue's issue 477 asks for); Kueue evicts the most
recently admitted one. ``SchedulerConfig.victims`` selects the rule (only the simulator's
comparison picks newest first), and ``hotswap simulate --compare-victims`` measures both on the
same failures and jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from builders import World, create

from hotswap.core.ordering import at_risk
from hotswap.core.policy import SchedulerConfig, VictimOrder
from hotswap.sim.config import SimConfig
from hotswap.sim.victims import compare_victims

NEWEST_FIRST = SchedulerConfig(victims=VictimOrder.NEWEST_FIRST)


def two_low_jobs_then_high(config: SchedulerConfig) -> tuple[World, dict[str, float], list[str]]:
    """``old`` started first and has just saved; ``new`` started later and never saved. A
    high-priority job then needs one of their slices. Returns what each would lose, and the
    high job's round."""
    world = World(slices=2, config=config)
    world.step(create("old", 1, "low"))  # t=2
    world.step(create("new", 1, "low"))  # t=3
    world.step()  # t=4
    world.checkpoint("old", 50)  # saved at t=5
    world.step()  # t=6
    world.now += 10  # both train on; the high job arrives at t=17
    risk = {name: at_risk(world.workload(name), world.now + 1) for name in ("old", "new")}
    return world, risk, world.step(create("high", 1, "high"))


def test_the_victim_is_the_one_that_loses_the_least_work_not_the_newest() -> None:
    world, risk, actions = two_low_jobs_then_high(SchedulerConfig())
    assert risk == {"old": 12.0, "new": 14.0}  # seconds since each one's last save (or start)
    assert actions == ["preempt old by high", "admit high np-0"]
    assert world.state("old") == "QUEUED" and world.state("new").startswith("RUNNING")

    kueue, risk_kueue, actions = two_low_jobs_then_high(NEWEST_FIRST)
    assert risk_kueue == risk
    assert actions == ["preempt new by high", "admit high np-1"]  # the newest, losing 14 s, not 12
    assert kueue.state("new") == "QUEUED" and kueue.state("old").startswith("RUNNING")


def test_priority_comes_before_lost_work_under_both_rules() -> None:
    for config in (SchedulerConfig(), NEWEST_FIRST):
        world = World(slices=2, config=config)
        world.step(create("medium", 1, "medium"))
        world.step(create("low", 1, "low"))
        world.checkpoint("low", 10)  # low just saved, medium never did: low still goes first
        world.step()
        assert world.step(create("high", 1, "high"))[0] == "preempt low by high", config


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_least_lost_work_loses_less_than_newest_first_on_the_same_failures(seed: int) -> None:
    """The simulator: the same cluster, node failures and jobs (one seed) under both rules; every
    preempted job loses the progress since its last checkpoint."""
    comparison = compare_victims(SimConfig(nodes=1024, days=30, seed=seed))
    ours, kueue = comparison.least_lost, comparison.newest_first
    assert comparison.failures > 100 and ours.preemptions > 100 and kueue.preemptions > 100
    assert ours.lost_slice_s < kueue.lost_slice_s
    document = comparison.to_dict()
    assert list(document["victims"]) == ["least-lost-work", "newest-first"]
    assert document["lost_work_ratio"] == round(ours.lost_slice_s / kueue.lost_slice_s, 4) < 1.0
    assert document["lost_slice_hours_saved"] > 0


def test_victims_that_save_on_sigterm_lose_nothing_under_either_rule() -> None:
    """Why the comparison turns the SIGTERM save off: with it, a preemption loses no progress."""
    from hotswap.sim.config import POLICIES
    from hotswap.sim import mix
    from hotswap.sim.simulation import PolicySimulation

    config = SimConfig(nodes=512, days=10, seed=0)
    for order in VictimOrder:
        scheduler = SchedulerConfig(hotswap=True, elastic=False, victims=order)
        assert POLICIES["hotswap"].victims is VictimOrder.LEAST_LOST_WORK
        result = PolicySimulation(config, "hotswap", scheduler, mix.failure_trace(config)).run()
        assert result.counts.preemptions > 0 and result.counts.preemption_lost_s == 0.0


def _simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hotswap", "simulate", *args], capture_output=True, text=True, timeout=120,
        env=dict(os.environ), check=False,
    )


def test_the_cli_prints_both_rules_side_by_side() -> None:
    result = _simulate("--compare-victims", "--nodes", "512", "--days", "10", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    runs = document["victims"]
    assert set(runs) == {"least-lost-work", "newest-first"} and document["policy"] == "hotswap"
    assert document["seed"] == 0 and document["failures"] > 0
    assert all(r["preemptions"] > 0 and r["lost_slice_hours"] > 0 for r in runs.values())
    text = _simulate("--compare-victims", "--nodes", "512", "--days", "10")
    assert text.returncode == 0 and "least-lost-work (hotswap)" in text.stdout and "newest-first (Kueue)" in text.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--compare",), "--compare-victims runs one cluster and seed: leave out --compare"),
        (("--policy", "hotswap", "--policy", "hotswap+elastic"), "give at most one --policy"),
        (("--plot", "x.png"), "--compare-victims draws no chart"),
    ],
)
def test_the_cli_refuses_what_the_comparison_cannot_do(args: tuple[str, ...], message: str) -> None:
    result = _simulate("--compare-victims", "--nodes", "512", "--days", "1", *args)
    assert result.returncode == 2 and message in result.stderr and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
