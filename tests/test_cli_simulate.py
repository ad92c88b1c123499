"""``hotswap simulate`` end to end, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def hotswap(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hotswap", *args], capture_output=True, text=True, timeout=300)


def test_json_output_is_one_document_on_stdout() -> None:
    result = hotswap("simulate", "--nodes", "256", "--days", "2", "--seed", "4", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert set(summary["policies"]) == {"wait-for-repair", "hotswap", "hotswap+elastic"}
    assert summary["nodes"] == 256 and summary["days"] == 2 and summary["seed"] == 4
    for policy in summary["policies"].values():
        assert {"goodput_by_priority", "mttr_s", "preemptions", "failures"} <= set(policy)
    assert summary["wall_s"] > 0


def test_table_and_plot(tmp_path: Path) -> None:
    chart = tmp_path / "compare.png"
    result = hotswap("simulate", "--nodes", "128", "--days", "1", "--policy", "hotswap", "--plot", str(chart))
    assert result.returncode == 0, result.stderr
    assert "goodput very-high" in result.stdout and "hotswap" in result.stdout
    assert "wait-for-repair" not in result.stdout
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_user_errors_are_one_line_and_non_zero(tmp_path: Path) -> None:
    for args, message in [
        (("--device-type", "v6e-17"), "did you mean"),
        (("--policy", "magic"), "unknown policy"),
        (("--plot", str(tmp_path / "chart.jpg")), "PNG"),
        (("--plot", str(tmp_path / "missing" / "chart.png")), "does not exist"),
        (("--nodes", "3"), "too small"),
    ]:
        result = hotswap("simulate", "--days", "0.1", *args)
        assert result.returncode != 0, args
        assert result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, result.stderr)
