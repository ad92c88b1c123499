"""``hotswap demo elastic|migration --framework jax``: the drills end to end from the CLI, with
real multi-process JAX workers (jax.distributed, gloo on CPU, orbax checkpoints), held to the
same JSON contract and checks as the PyTorch drills; nothing is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from local_helpers import cleanup

pytest.importorskip("jax", reason="the JAX drills need hotswap[jax]")
pytest.importorskip("orbax.checkpoint", reason="the JAX drills need hotswap[jax]")
pytest.importorskip("optax", reason="the JAX drills need hotswap[jax]")

CONTRACT = {"scenario", "framework", "mttr_s", "steps_lost", "preempted", "passed", "logs"}


@pytest.fixture
def home(tmp_path: Path):  # type: ignore[no-untyped-def]
    state = tmp_path / "state"
    yield state
    cleanup(state)


def demo(home: Path, scenario: str, *options: str) -> dict:  # type: ignore[type-arg]
    env = dict(os.environ, HOTSWAP_HOME=str(home))
    result = subprocess.run(
        [sys.executable, "-m", "hotswap", "demo", scenario, "--framework", "jax", "--json", *options],
        capture_output=True, text=True, env=env, timeout=400, cwd=home.parent,
    )
    assert result.stdout.strip().startswith("{"), result.stderr[-4000:]
    summary = json.loads(result.stdout)
    failed = [c for c in summary["checks"] if not c["passed"]]
    assert result.returncode == 0 and summary["passed"], (failed, result.stderr[-4000:])
    assert CONTRACT <= set(summary) and (summary["scenario"], summary["framework"]) == (scenario, "jax")
    assert Path(summary["logs"]).is_file()
    assert not list((home / "clusters").glob("*/state.db"))  # the drill removed its cluster
    return summary


def test_jax_elastic_drill(home: Path) -> None:
    summary = demo(home, "elastic")
    assert summary["steps_lost"] == 0 and summary["mttr_s"] > 0
    assert [change[1:] for change in summary["slice_count_changes"]] == [[3, 2], [2, 3]]
    assert "Old Slice Count: 3, New Slice Count: 2" in summary["awk_output"]
    assert "Old Slice Count: 2, New Slice Count: 3" in summary["awk_output"]
    assert summary["goodput"]["elastic"]["badput"]["elastic"] > 0  # the restarts are accounted


def test_jax_elastic_drill_survives_the_loss_of_rank_0s_slice(home: Path) -> None:
    """Rank 0's slice fails: the coordination service is not in its process, so the survivors
    go on on 2 slices without a restart and with no step lost, then grow back to 3."""
    summary = demo(home, "elastic", "--fail-slice", "0")
    assert summary["failed_slice"] == 0
    assert summary["steps_lost"] == 0 and summary["mttr_s"] > 0
    assert [change[1:] for change in summary["slice_count_changes"]] == [[3, 2], [2, 3]]
    assert summary["stall_up_s"] is not None


def test_jax_migration_drill(home: Path) -> None:
    summary = demo(home, "migration")
    assert summary["steps_lost"] == 0
    log = Path(summary["logs"]).read_text()
    assert "restored step=" in log and "source=migration" in log


def test_jax_hotswap_drill(home: Path) -> None:
    """A failed node under the high-priority 2-slice JAX job (not elastic): the survivor cannot
    take an orbax checkpoint without its group, so it writes its replica as a survivor save; high
    restarts on low's slice from it, 0 steps lost (before survivor saves: from step 0)."""
    summary = demo(home, "hotswap")
    assert summary["steps_lost"] == 0 and summary["preempted"] == ["low"] and summary["low_steps_lost"] == 0
    log = "\n".join(path.read_text() for path in Path(summary["logs"]).parent.glob("*.log"))
    assert "by a survivor (its part, without the group)" in log
