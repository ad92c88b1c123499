"""``hotswap demo gpu`` without a GPU: the GPU drill's every step and check on an emulated slice
with a small state on the CPU (the real run on a GPU is in tests/test_gpu_real.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from local_helpers import home  # noqa: F401 (a fixture)

pytest.importorskip("torch")


def test_the_gpu_drill_on_an_emulated_slice(home: Path) -> None:
    env = dict(os.environ, HOTSWAP_HOME=str(home))
    result = subprocess.run(
        [sys.executable, "-m", "hotswap", "demo", "gpu", "--json", "--backing", "emulated"],
        capture_output=True, text=True, env=env, timeout=400, cwd=home.parent,
    )
    assert result.stdout.strip().startswith("{"), result.stderr[-4000:]
    summary = json.loads(result.stdout)
    assert result.returncode == 0 and summary["passed"], ([c for c in summary["checks"] if not c["passed"]], result.stderr[-4000:])
    assert summary["backing"] == "emulated" and summary["device"] == "cpu"
    names = {c["name"] for c in summary["checks"]}
    assert {
        "low saved on SIGTERM inside its grace period",
        "high ran on low's slice and finished",
        "low resumed at the step where it stopped",
        "parameters bit-identical after the restore (SHA-256)",
    } <= names
    assert summary["steps_lost"] == 0 and summary["preempted"] == ["low"]
    save, raw = summary["save"], summary["raw_write"]
    assert save["bytes"] == raw["bytes"] > 0.01e9 and save["seconds"] > 0 and raw["seconds"] > 0
    assert not list((home / "clusters").glob("*/state.db"))  # the drill removed its cluster
