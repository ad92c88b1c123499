"""The simulator: paired comparisons, conserved accounting, and what its policies must show."""

from __future__ import annotations

import math

import pytest

from hotswap.api.errors import InvalidInputError
from hotswap.core.goodput import Category, Ledger, percentile
from hotswap.sim import mix
from hotswap.sim.config import SimConfig
from hotswap.sim.runner import compare

# Small but failure-heavy: 128 nodes, 4 days, 20x Meta's failure rate so every policy is tested.
BUSY = SimConfig(nodes=128, days=4, seed=3, failures_per_1000_node_days=130.0)


@pytest.fixture(scope="module")
def busy():
    return compare(BUSY)


def test_same_seed_same_result() -> None:
    config = SimConfig(nodes=64, days=2, seed=7, failures_per_1000_node_days=60.0)
    first, second = compare(config).to_dict(), compare(config).to_dict()
    first.pop("wall_s"), second.pop("wall_s")
    assert first == second


def test_failure_trace_matches_the_rate() -> None:
    config = SimConfig(nodes=4096, days=30, seed=1)
    trace = mix.failure_trace(config)
    expected = 4096 * 30 * 6.5 / 1000
    assert abs(len(trace) - expected) < 4 * math.sqrt(expected)
    assert [t for t, _ in trace] == sorted(t for t, _ in trace)
    assert all(0 <= t < config.duration_s for t, _ in trace)
    assert mix.failure_trace(SimConfig(nodes=4096, days=30, seed=2)) != trace


def test_every_slice_second_is_accounted(busy) -> None:
    """A job of N slices alive for T seconds books exactly N*T slice-seconds."""
    end = BUSY.duration_s
    for result in busy.results:
        for job in result.jobs.values():
            alive = (job.ended if job.ended is not None else end) - job.arrived
            assert job.ledger.total == pytest.approx(job.size * alive, rel=1e-9, abs=1e-6), job.spec.name
            assert all(v >= -1e-9 for v in job.ledger.seconds.values())


def test_policies_rank_as_expected_for_the_very_high_job(busy) -> None:
    summary = busy.to_dict()["policies"]
    wait = summary["wait-for-repair"]
    hot = summary["hotswap"]
    elastic = summary["hotswap+elastic"]
    assert wait["failures"] == hot["failures"] == elastic["failures"] > 0
    assert wait["goodput_by_priority"]["very-high"] < hot["goodput_by_priority"]["very-high"]
    assert hot["goodput_by_priority"]["very-high"] < elastic["goodput_by_priority"]["very-high"]
    # MTTR of the very-high job: repair + start-up + restore; stop + start-up + restore; re-form.
    assert wait["mttr_by_priority_s"]["very-high"]["p50"] == BUSY.repair_s + BUSY.startup_s + BUSY.restore_s
    assert hot["mttr_by_priority_s"]["very-high"]["p50"] == BUSY.stop_s + BUSY.startup_s + BUSY.restore_s
    assert elastic["mttr_by_priority_s"]["very-high"]["p50"] == BUSY.elastic_reconfigure_s
    # Hotswap takes lower-priority capacity: it preempts more than waiting does.
    assert hot["preemptions"] > wait["preemptions"]


def test_waiting_for_repair_shows_up_as_recovery_and_hotswap_removes_it(busy) -> None:
    badput = {r.policy: r.ledgers["main"].fractions() for r in busy.results}
    assert badput["wait-for-repair"]["recovery"] > 10 * badput["hotswap"]["recovery"]
    assert badput["hotswap+elastic"]["wasted_progress"] < badput["hotswap"]["wasted_progress"] / 10


def test_json_has_the_contract_keys(busy) -> None:
    summary = busy.to_dict()
    assert set(summary["policies"]) == {"wait-for-repair", "hotswap", "hotswap+elastic"}
    assert isinstance(summary["wall_s"], float)
    for result in summary["policies"].values():
        assert set(result) >= {"goodput_by_priority", "mttr_s", "preemptions", "failures"}
        assert set(result["mttr_s"]) >= {"p50", "p99"}
        assert all(0.0 <= v <= 1.0 for v in result["goodput_by_priority"].values())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"nodes": 4}, "too small"),
        ({"days": 0}, "--days"),
        ({"device_type": "v6e-17"}, "v6e-16"),
        ({"policies": ("magic",)}, "unknown policy"),
    ],
)
def test_bad_configuration_is_refused(fields: dict, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        SimConfig(**fields)


def test_ledger_moves_wasted_progress_out_of_productive() -> None:
    ledger = Ledger()
    ledger.add(Category.PRODUCTIVE, 100.0)
    ledger.add(Category.QUEUED, 100.0)
    ledger.waste(30.0)
    assert ledger.seconds[Category.PRODUCTIVE] == 70.0
    assert ledger.seconds[Category.WASTED_PROGRESS] == 30.0
    assert ledger.goodput == pytest.approx(0.35)
    with pytest.raises(ValueError):
        ledger.add(Category.STARTUP, -1.0)


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    assert percentile(range(1, 101), 50) == pytest.approx(50.5)
    assert percentile(range(1, 101), 99) == pytest.approx(99.01)
