"""The simulator's results, to the last digit, against those of the version before issue 37's
speed-up (31f8424), stored in tests/golden/sim_outputs.json.

Each case runs every policy on one cluster and seed, as ``hotswap simulate`` does, and compares
the unrounded figures (goodput and badput per priority, spare capacity used, every count of
:class:`hotswap.sim.simulation.Counts`, timers fired included), a digest of every job's ledger
and of the recovery times, and a digest of every decision: the ``now`` and the actions of each
round the core was asked for, in order. A faster simulator or core must not change any of them.

Regenerate only after an intended change of results: ``HOTSWAP_REGENERATE_GOLDEN=1 pytest
tests/test_sim_golden.py``, then review the diff like any other change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from hotswap.core import scheduler
from hotswap.sim import mix, simulation
from hotswap.sim.config import POLICIES, SimConfig

GOLDEN = Path(__file__).resolve().parent / "golden" / "sim_outputs.json"
REGENERATE = os.environ.get("HOTSWAP_REGENERATE_GOLDEN") == "1"
# (nodes, days, seed): 1k and 4k nodes of v6e-16, a month, two seeds at 1k; about 5 CPU-seconds before issue 37.
CASES = [(1024, 30.0, 0), (1024, 30.0, 1), (4096, 30.0, 0)]


def _digest(items: Any) -> str:
    return hashlib.sha256(repr(items).encode()).hexdigest()[:32]


def run_case(nodes: int, days: float, seed: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every policy's results on one cluster and seed, as plain data (floats unrounded)."""
    from hotswap.sim.runner import summarize

    config = SimConfig(nodes=nodes, days=days, seed=seed)
    trace = mix.failure_trace(config)
    fillers = mix.FillerMix(config)
    results: dict[str, Any] = {}
    for policy in config.policies:
        decisions = hashlib.sha256()

        def recording_decide(snapshot, events, now, config=scheduler.DEFAULT_CONFIG, **options):  # noqa: ANN001, ANN003, ANN202
            decision = scheduler.decide(snapshot, events, now, config, **options)
            decisions.update(repr((now, decision.actions)).encode())
            return decision

        monkeypatch.setattr(simulation, "decide", recording_decide)
        result = simulation.PolicySimulation(config, policy, POLICIES[policy], trace, fillers).run()
        summary = summarize(result, 0.0)
        jobs = [
            (name, job.mode.value, job.ended, job.progress, job.held_s, sorted((c.value, s) for c, s in job.ledger.seconds.items()))
            for name, job in sorted(result.jobs.items())
        ]
        results[policy] = {
            "counts": dataclasses.asdict(result.counts),
            "goodput_by_priority": summary.goodput_by_priority,
            "badput_by_priority": summary.badput_by_priority,
            "main_goodput": summary.main_goodput,
            "low_goodput": summary.low_goodput,
            "spare_used": summary.spare_used,
            "mttr_count": len(result.mttr),
            "mttr_digest": _digest(result.mttr),
            "jobs": len(jobs),
            "jobs_digest": _digest(jobs),
            "decisions_digest": decisions.hexdigest()[:32],
        }
    return results


def _key(nodes: int, days: float, seed: int) -> str:
    return f"nodes={nodes} days={days:g} seed={seed}"


@pytest.mark.parametrize(("nodes", "days", "seed"), CASES, ids=[_key(*case) for case in CASES])
def test_simulation_results_match_the_recorded_ones(nodes: int, days: float, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    got = json.loads(json.dumps(run_case(nodes, days, seed, monkeypatch)))  # (as stored: tuples become lists)
    recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    key = _key(nodes, days, seed)
    if REGENERATE:
        recorded[key] = got
        GOLDEN.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        return
    assert key in recorded, f"no recorded results for {key}: regenerate {GOLDEN.name} deliberately"
    for policy in POLICIES:
        assert got[policy] == recorded[key][policy], f"{key} {policy}: the simulation's results changed"
