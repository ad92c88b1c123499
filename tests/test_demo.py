"""``hotswap demo``: each drill end to end with real PyTorch workers (gloo, CPU), as CI runs it.

The drills check themselves (the summary's ``passed``); these tests hold them to the JSON
contract, run seed 001's awk script over the elastic drill's log, and make sure nothing is
left running.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from local_helpers import cleanup

pytest.importorskip("torch")

CONTRACT = {"scenario", "mttr_s", "steps_lost", "preempted", "passed", "logs"}
AWK = Path(__file__).resolve().parents[1] / "src" / "hotswap" / "demo" / "seed001_slice_changes.awk"


@pytest.fixture
def home(tmp_path: Path):
    state = tmp_path / "state"
    yield state
    cleanup(state)


def demo(home: Path, scenario: str, *args: str) -> dict:
    env = dict(os.environ, HOTSWAP_HOME=str(home))
    result = subprocess.run(
        [sys.executable, "-m", "hotswap", "demo", scenario, "--json", *args],
        capture_output=True, text=True, env=env, timeout=400, cwd=home.parent,
    )
    assert result.stdout.strip().startswith("{"), result.stderr[-4000:]
    summary = json.loads(result.stdout)
    failed = [c for c in summary["checks"] if not c["passed"]]
    assert result.returncode == 0 and summary["passed"], (failed, result.stderr[-4000:])
    assert CONTRACT <= set(summary)
    assert summary["scenario"] == scenario
    assert Path(summary["logs"]).is_file()
    # The drill removed its cluster: no cluster and no process of it is left.
    assert not list((home / "clusters").glob("*/state.db"))
    return summary


def test_hotswap_drill(home: Path, tmp_path: Path) -> None:
    chart = tmp_path / "timeline.png"
    summary = demo(home, "hotswap", "--plot", str(chart))
    assert summary["preempted"] == ["low"]
    assert summary["steps_lost"] == 0 and summary["mttr_s"] > 0
    assert summary["steps_lost_warm"] == 0 and summary["mttr_warm_s"] > 0  # spares serve GPU-backed slices too
    # A cluster created without --warm-workers: here the suite's HOTSWAP_WARM_WORKERS=0 (conftest).
    assert summary["default_warm_workers"] == 0 and summary["mttr_default_s"] == summary["mttr_s"]
    assert summary["zygote"] is False  # the suite's HOTSWAP_ZYGOTE=0: that restart was cold
    # Where each restart's time went, from the workers' own records, in order.
    order = ["decision_s", "stop_s", "spawn_s", "import_s", "formed_s", "restored_s", "first_step_s"]
    for key, mttr in (("restart_phases", "mttr_s"), ("restart_phases_warm", "mttr_warm_s")):
        phases = summary[key]
        assert list(phases) == order
        ready = [phases[k] for k in order[2:]]
        assert all(v is not None for v in ready) and ready == sorted(ready) and 0 < ready[0], phases
        assert phases["first_step_s"] == summary[mttr]
    cold, warm = summary["restart_phases"], summary["restart_phases_warm"]
    assert warm["import_s"] - warm["spawn_s"] < cold["import_s"] - cold["spawn_s"]  # a spare has imported already
    assert summary["wait_for_repair_s"] > 600
    assert set(summary["goodput"]) == {"high", "low"}
    assert chart.read_bytes()[:4] == b"\x89PNG"


def test_elastic_drill_and_the_seed_001_awk_script(home: Path) -> None:
    summary = demo(home, "elastic")
    awk = shutil.which("awk")
    assert awk is not None, "seed 001's check needs awk"
    printed = subprocess.run([awk, "-f", str(AWK), summary["logs"]], capture_output=True, text=True, check=True).stdout
    down = printed.index("Old Slice Count: 3, New Slice Count: 2")
    up = printed.index("Old Slice Count: 2, New Slice Count: 3")
    assert down < up
    assert summary["preempted"] == [] and summary["steps_lost"] == 0


def test_migration_drill(home: Path) -> None:
    summary = demo(home, "migration")
    assert summary["steps_lost"] == 0
    assert any(c["name"] == "restored from the migration checkpoint" and c["passed"] for c in summary["checks"])


def test_shrink_drill(home: Path, tmp_path: Path) -> None:
    """A high-priority job shrinks the elastic low one instead of evicting it (PyTorch workers)."""
    chart = tmp_path / "shrink.png"
    summary = demo(home, "shrink", "--plot", str(chart))
    assert summary["preempted"] == [] and summary["shrunk"] == ["low"]
    assert summary["steps_lost"] == 0 and summary["low_steps_skipped"] == 0
    assert summary["low_slices"] == [3, 2, 3] and summary["mttr_s"] > 0
    assert [(old, new) for _, old, new in summary["slice_count_changes"]] == [(3, 2), (2, 3)]
    assert set(summary["goodput"]) == {"high", "low"}
    assert 0 <= summary["plot_s"] <= summary["wall_s"] and "plot_font_cache" in summary  # the plot's share of the wall time
    assert chart.read_bytes()[:4] == b"\x89PNG"
