"""The simulator: paired comparisons, conserved accounting, and what its policies must show."""

from __future__ import annotations

import dataclasses
import gc
import math

import pytest

from hotswap.api.errors import InvalidInputError
from hotswap.api.spec import WorkloadSpec
from hotswap.core.goodput import Category, Ledger, percentile
from hotswap.sim import mix
from hotswap.sim.config import POLICIES, PROFILES, SimConfig
from hotswap.sim.runner import compare, run_all, simulate, summarize
from hotswap.sim.simulation import PolicySimulation
from hotswap.sim.sweep import Estimate, ladder, sweep

# Small but failure-heavy: 128 nodes, 4 days, 20x Meta's failure rate so every policy is tested.
BUSY = SimConfig(nodes=128, days=4, seed=3, failures_per_1000_node_days=130.0)


@pytest.fixture(scope="module")
def busy():
    return compare(BUSY)


@pytest.fixture(scope="module")
def busy_runs():
    return {policy: simulate(BUSY, policy) for policy in BUSY.policies}


def without_timing(document: dict) -> dict:
    document = dict(document, wall_s=None)
    document["policies"] = {p: dict(r, wall_s=None) for p, r in document["policies"].items()}
    return document


def test_same_seed_same_result() -> None:
    config = SimConfig(nodes=64, days=2, seed=7, failures_per_1000_node_days=60.0)
    assert without_timing(compare(config).to_dict()) == without_timing(compare(config).to_dict())


def test_runs_in_worker_processes_give_the_same_results() -> None:
    config = SimConfig(nodes=64, days=2, seed=7, failures_per_1000_node_days=60.0)
    one = [dataclasses.replace(r, wall_s=0.0) for r in run_all([config], jobs=1)]
    many = [dataclasses.replace(r, wall_s=0.0) for r in run_all([config], jobs=3)]
    assert one == many


def test_failure_trace_matches_the_rate() -> None:
    config = SimConfig(nodes=4096, days=30, seed=1)
    trace = mix.failure_trace(config)
    expected = 4096 * 30 * 6.5 / 1000
    assert abs(len(trace) - expected) < 4 * math.sqrt(expected)
    assert [t for t, _ in trace] == sorted(t for t, _ in trace)
    assert all(0 <= t < config.duration_s for t, _ in trace)
    assert mix.failure_trace(SimConfig(nodes=4096, days=30, seed=2)) != trace


def assert_every_slice_second_is_accounted(config: SimConfig, results) -> None:  # type: ignore[no-untyped-def]
    """A job of N slices alive for T seconds books exactly N*T slice-seconds, none negative."""
    for result in results:
        for job in result.jobs.values():
            alive = (job.ended if job.ended is not None else config.duration_s) - job.arrived
            assert job.ledger.total == pytest.approx(job.size * alive, rel=1e-9, abs=1e-6), job.name
            assert all(v >= -1e-9 for v in job.ledger.seconds.values())


def test_every_slice_second_is_accounted(busy_runs) -> None:
    assert_every_slice_second_is_accounted(BUSY, busy_runs.values())


def test_a_job_finishing_while_new_workers_join_is_charged_nothing_after() -> None:
    """Short elastic jobs that grow and finish within the new workers' start-up: the start-up
    of workers that never joined must stop when the job ends (it was charged to the end of the
    simulation)."""
    config = SimConfig(
        nodes=128, days=2, seed=5, failures_per_1000_node_days=200.0, filler_mean_hours=0.1, filler_think_s=60.0
    )
    assert_every_slice_second_is_accounted(config, [simulate(config, p) for p in config.policies])


def test_a_job_finishes_exactly_when_its_work_is_done() -> None:
    """Elastic jobs change speed at every scale-down, scale-up and re-formation; each keeps one
    finish timer, set again when it is slowed down. A completed job has done exactly its work:
    finished neither early (a timer of an earlier speed) nor late (a missed earlier finish)."""
    config = SimConfig(
        nodes=512, days=1, seed=5, failures_per_1000_node_days=100.0, filler_mean_hours=0.5, filler_think_s=60.0
    )
    result = simulate(config, "hotswap+elastic")
    completed = [job for job in result.jobs.values() if job.stream is not None and job.ended is not None]
    reshaped = [job for job in completed if job.ledger.seconds[Category.ELASTIC] > 0]
    assert result.counts.completed == len(completed) > 200 and len(reshaped) > 20
    for job in completed:
        assert job.progress == pytest.approx(job.work_s, rel=1e-9, abs=1e-6), job.name
    for job in result.jobs.values():  # and none ran on past the end of its work
        assert job.progress <= job.work_s + max(1e-6, 1e-9 * job.work_s), job.name


def test_simulated_rounds_leave_no_reference_cycles() -> None:
    """A run keeps the cyclic garbage collector mostly off (PolicySimulation.run): that is only
    safe while decision rounds and the simulated world leave no cycles behind."""
    config = SimConfig(nodes=512, days=15, seed=2, failures_per_1000_node_days=50.0)
    for policy in config.policies:
        simulation = PolicySimulation(config, policy, POLICIES[policy], mix.failure_trace(config))
        gc.collect()
        gc.disable()
        try:
            result = simulation._run(None)
            found = gc.collect()
        finally:
            gc.enable()
        assert result.counts.decisions > 800
        assert found < result.counts.decisions / 20, (policy, found)


def test_a_run_gives_the_garbage_collector_back_as_it_found_it() -> None:
    config = SimConfig(nodes=64, days=1, seed=1)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    simulate(config, "hotswap")
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()
    try:
        simulate(config, "hotswap")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_policies_rank_as_expected_for_the_very_high_job(busy) -> None:
    summary = busy.to_dict()["policies"]
    wait = summary["wait-for-repair"]
    hot = summary["hotswap"]
    elastic = summary["hotswap+elastic"]
    assert wait["failures"] == hot["failures"] == elastic["failures"] > 0
    assert wait["main_goodput"] < hot["main_goodput"] < elastic["main_goodput"]
    # MTTR of the very-high job: repair + start-up + restore; stop + start-up + restore; re-form.
    assert wait["mttr_by_priority_s"]["very-high"]["p50"] == BUSY.repair_s + BUSY.startup_s + BUSY.restore_s
    assert hot["mttr_by_priority_s"]["very-high"]["p50"] == BUSY.stop_s + BUSY.startup_s + BUSY.restore_s
    assert elastic["mttr_by_priority_s"]["very-high"]["p50"] == BUSY.elastic_reconfigure_s
    assert elastic["main_restarts"] == 0 < elastic["main_elastic_reconfigurations"]
    # Hotswap takes lower-priority capacity: it preempts more than waiting does.
    assert hot["preemptions"] > wait["preemptions"]


def test_waiting_for_repair_shows_up_as_recovery_and_hotswap_removes_it(busy_runs) -> None:
    badput = {p: r.jobs[mix.MAIN].ledger.fractions() for p, r in busy_runs.items()}
    assert badput["wait-for-repair"]["recovery"] > 10 * badput["hotswap"]["recovery"]
    assert badput["hotswap+elastic"]["wasted_progress"] < badput["hotswap"]["wasted_progress"] / 5


def test_an_instant_repair_still_restarts_the_job_under_the_failed_node() -> None:
    """--repair-minutes 0: the node is back at once, but the workers on it died; hotswap must
    restart the job (it used to carry on as if nothing had happened)."""
    config = dataclasses.replace(BUSY, repair_s=0.0, policies=("hotswap",))
    run = summarize(simulate(config, "hotswap"), 0.0)
    assert run.counts.main_restarts > 0 and len(run.main_mttr_s) > 0
    assert run.badput_by_priority["very-high"]["wasted_progress"] > 0


def test_elastic_survivors_lose_the_steps_since_their_last_snapshot() -> None:
    config = dataclasses.replace(BUSY, policies=("hotswap+elastic",))
    runs = {}
    for snapshot_s in (0.0, 60.0, 600.0):
        result = simulate(dataclasses.replace(config, elastic_snapshot_s=snapshot_s), "hotswap+elastic")
        main = result.jobs[mix.MAIN]
        runs[snapshot_s] = (main.ledger.seconds[Category.WASTED_PROGRESS], main.size, result.counts.main_reconfigurations)
    assert runs[0.0][0] == 0.0  # a snapshot at every step: nothing to redo
    for snapshot_s in (60.0, 600.0):
        wasted, size, reconfigurations = runs[snapshot_s]
        losses = reconfigurations / 2  # each failure: one scale-down, then one scale-up
        # On average half a snapshot interval is redone per loss (wide bounds: few losses).
        assert 0.2 * snapshot_s < wasted / size / losses < 0.8 * snapshot_s, snapshot_s


def test_json_has_the_contract_keys(busy) -> None:
    summary = busy.to_dict()
    assert set(summary["policies"]) == {"wait-for-repair", "hotswap", "hotswap+elastic"}
    assert isinstance(summary["wall_s"], float)
    for result in summary["policies"].values():
        assert set(result) >= {
            "goodput_by_priority", "mttr_s", "preemptions", "failures", "main_goodput",
            "low_priority_goodput", "spare_capacity_used", "main_restarts",
        }
        assert set(result["mttr_s"]) >= {"p50", "p99"}
        assert all(0.0 <= v <= 1.0 for v in result["goodput_by_priority"].values())
        assert 0.0 < result["spare_capacity_used"] <= 1.0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"nodes": 4}, "too small"),
        ({"nodes": 0}, "out of range"),
        ({"nodes": 10**7}, "out of range"),
        ({"nodes": 4099}, "not a whole number of v6e-16 slices .4 hosts each.: use 4096 or 4100"),
        ({"days": 0}, "--days"),
        ({"days": -3}, "--days"),
        ({"days": 10_000}, "--days"),
        ({"days": math.nan}, "--days"),
        ({"failures_per_1000_node_days": -1.0}, "--failure-rate"),
        ({"failures_per_1000_node_days": 1e6}, "--failure-rate"),
        ({"repair_s": -60.0}, "--repair-minutes"),
        ({"checkpoint_interval_s": 0.0}, "--checkpoint-minutes"),
        ({"elastic_snapshot_s": -1.0}, "--elastic-snapshot-minutes"),
        ({"device_type": "v6e-17"}, "v6e-16"),
        ({"policies": ("magic",)}, "unknown policy"),
        ({"policies": ()}, "at least one policy"),
    ],
)
def test_bad_configuration_is_refused(fields: dict, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        SimConfig(**fields)


def test_published_failure_profiles_are_cited_separately() -> None:
    rsc1, rsc2, llama3 = PROFILES["meta-rsc1"], PROFILES["meta-rsc2"], PROFILES["llama3"]
    assert rsc1.failures_per_1000_node_days == 6.50 and "RSC-1" in rsc1.source
    assert rsc2.failures_per_1000_node_days == 2.34 and "RSC-2" in rsc2.source
    assert llama3.failures_per_1000_node_days == pytest.approx(419 / (2048 * 54) * 1000, abs=1e-3)
    assert SimConfig().failures_per_1000_node_days == rsc1.failures_per_1000_node_days


def test_a_long_run_keeps_little_per_finished_job() -> None:
    """A month at 262,144 nodes makes ~300,000 jobs: neither the results nor the shared filler
    mix keep a spec (two dicts, ~500 bytes) for each, only one per shape, shared; and a finished
    job drops its checkpoint and snapshot state."""
    config = SimConfig(nodes=1024, days=10)
    fillers = mix.FillerMix(config)
    result = PolicySimulation(config, "hotswap", POLICIES["hotswap"], mix.failure_trace(config), fillers).run()
    drawn = [fillers.job(job.stream, job.index) for job in result.jobs.values() if job.stream is not None]
    held = [*result.jobs.values(), *drawn]
    finished = [job for job in result.jobs.values() if job.ended is not None]
    assert len(finished) > 100
    values = (getattr(record, field.name) for record in held for field in dataclasses.fields(record))
    specs = {id(value) for value in values if isinstance(value, WorkloadSpec)}
    shapes = len(mix.FILLER_SIZES) * 2 * len(mix.FILLER_PRIORITIES)  # (size, elastic or not, priority)
    assert len(specs) <= shapes
    assert all(job.epoch is None and job.checkpoint is None and job.snapshot is None for job in finished)


def test_the_filler_mix_keeps_only_each_streams_latest_job_and_draws_a_stream_again_alike() -> None:
    import tracemalloc

    fillers = mix.FillerMix(SimConfig(nodes=1024, days=1))
    first = [fillers.job(0, index) for index in range(50)]
    tracemalloc.start()
    try:
        for index in range(50, 5050):  # a long run's stream: ~170 bytes a job when each was kept
            fillers.job(0, index)
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert kept < 100_000
    assert [fillers.job(0, index) for index in range(50)] == first  # the next policy's stream: the same jobs


def test_fillers_are_never_larger_than_the_room_beside_the_main_job() -> None:
    config = SimConfig(nodes=64, days=1)  # 16 slices, the main job on 12: room for 4
    fillers = mix.FillerMix(config)
    sizes = {fillers.job(stream, i).template.num_slices for stream in range(mix.filler_streams(config)) for i in range(30)}
    assert max(sizes) <= config.slices - config.main_slices


def test_the_comparison_reports_means_with_confidence_intervals() -> None:
    base = SimConfig(nodes=128, days=1, failures_per_1000_node_days=100.0, policies=("wait-for-repair", "hotswap"))
    result = sweep(base, [64, 128], seeds=3, jobs=2)
    assert len(result.runs) == 2 * 3 * 2 and result.seeds == [0, 1, 2]
    for policy in base.policies:
        for nodes in (64, 128):
            goodput = result.estimates(policy, nodes)["main_goodput"]
            values = [r.main_goodput for r in result.runs if r.policy == policy and r.nodes == nodes]
            assert goodput.mean == pytest.approx(sum(values) / 3) and goodput.ci95 > 0
    assert result.to_dict()["policies"]["hotswap"]["128"]["main_goodput"]["values"]


def test_confidence_interval_and_size_ladder() -> None:
    estimate = Estimate.of([1.0, 2.0, 3.0])
    assert estimate.mean == 2.0 and estimate.ci95 == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-3)
    assert Estimate.of([0.5]).ci95 == 0.0
    assert ladder(16384, 4) == [2048, 4096, 8192, 16384]
    assert ladder(64, 4) == [32, 64]  # no smaller than 8 slices


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
