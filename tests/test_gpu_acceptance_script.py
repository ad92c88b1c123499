"""benchmarks/gpu_acceptance.sh, the one GPU acceptance command: without a GPU its GPU parts
say "skipped: no GPU" at once, it writes at most 8 files, and its report gives one line per
part (PASS/FAIL/SKIP, seconds, key figure) from what the parts printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from acceptance_report import report  # noqa: E402


def _no_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return True
    return not torch.cuda.is_available()


@pytest.mark.skipif(not _no_gpu(), reason="on a GPU machine the parts run for real (see gpu_acceptance.sh)")
def test_without_a_gpu_every_gpu_part_is_skipped_at_once_in_few_files(tmp_path: Path) -> None:
    parts = "nvml drill demo-hotswap demo-elastic-jax bench-mttr bench-checkpoint bench-jax"
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PARTS": parts, "PYTHON": sys.executable, "WHEELS": str(tmp_path / "none")}
    env.pop("ON_CPU", None)
    started = time.monotonic()
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_acceptance.sh")], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 60
    lines = [line for line in result.stdout.splitlines() if line.startswith(("PASS", "FAIL", "SKIP"))]
    assert [line.split()[1] for line in lines] == parts.split()
    assert all(line.startswith("SKIP") and "skipped: no GPU" in line for line in lines), result.stdout
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(files) <= 8 and "summary.txt" in files and "environment.txt" in files
    assert (tmp_path / "out" / "summary.txt").read_text().splitlines()[-1].startswith("== 0 part(s) failed")


def test_the_report_judges_each_part_from_its_output_and_merges_them(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()

    def part(name: str, code: int, seconds: int, stdout: object, stderr: str = "") -> None:
        (work / f"{name}.status").write_text(f"{code} {seconds}")
        (work / f"{name}.out").write_text(stdout if isinstance(stdout, str) else "log line\n" + json.dumps(stdout) + "\n")
        (work / f"{name}.err").write_text(stderr)

    part("gpu-tests", 0, 40, "...\n11 passed in 38.2s\n")
    part("demo-hotswap", 0, 60, {"passed": True, "backing": "gpu", "mttr_s": 7.8, "mttr_default_s": 0.3, "steps_lost": 0})
    part("demo-elastic-jax", 2, 1, "", "error: No such option: --fail-slice")
    part("bench-mttr", 0, 70, {"default_s": 2.5, "cold_s": 8.0, "warm_s": 0.25, "phases": {"cold": {"import_s": 5.0}}})
    part("bench-jax", 124, 60, "")
    (work / "nvml.status").write_text("skipped no GPU")
    lines, failed = report(work, out, ["gpu-tests", "nvml", "demo-hotswap", "demo-elastic-jax", "bench-mttr", "bench-jax"], on_gpu=True)
    assert [line.split()[0] for line in lines] == ["PASS", "SKIP", "PASS", "FAIL", "FAIL", "FAIL"]
    assert "11 passed" in lines[0] and "mttr 7.8 s" in lines[2] and "mttr_default 0.3 s" in lines[2]
    assert "exit 2" in lines[3]
    assert "targets missed: default_s > 2.0 s" in lines[4] and "cold phases import=5.0" in lines[4]
    assert "TIMED OUT" in lines[5]
    assert failed == 3
    assert sorted(p.name for p in out.iterdir()) == ["benchmarks.json", "checks.json", "logs.txt", "pytest_gpu.txt"]
    assert json.loads((out / "benchmarks.json").read_text())["bench-mttr"]["result"]["warm_s"] == 0.25
    assert "No such option: --fail-slice" in (out / "logs.txt").read_text()


def _bench_jax_line(tmp_path: Path, elastic: dict[str, float], on_gpu: bool) -> tuple[str, int]:
    """The acceptance report's line for a bench-jax part that printed ``elastic`` (and a
    restore faster than orbax's), and how many parts failed."""
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    result = {
        "checkpoints": {"state_mb": 512, "device_kind": "H200", "restore": {"median_s": 0.15}, "orbax_restore": {"median_s": 0.16}},
        "elastic": elastic,
    }
    (work / "bench-jax.status").write_text("0 60")
    (work / "bench-jax.out").write_text(json.dumps(result) + "\n")
    (work / "bench-jax.err").write_text("")
    (line,), failed = report(work, out, ["bench-jax"], on_gpu=on_gpu)
    return line, failed


def test_the_jax_figure_shows_the_elastic_runs_keys_as_bench_jax_writes_them(tmp_path: Path) -> None:
    line, failed = _bench_jax_line(tmp_path, {"runs": 1, "mttr_down_s": 2.9, "grow_back_s": 5.1, "stall_up_s": 0.4}, on_gpu=True)
    assert line.startswith("PASS") and failed == 0
    assert "elastic MTTR 2.9 s" in line and "elastic grow-back 5.1 s" in line and "elastic survivors' stall 0.4 s" in line


def test_the_jax_part_fails_on_a_gpu_host_when_the_survivors_stall_misses_its_target(tmp_path: Path) -> None:
    """Issue 26 item 2: the grow-back stall of survivors is at most 0.5 s; the acceptance run
    on a GPU host says so when it is not (on a machine without a GPU it only reports it)."""
    elastic = {"runs": 3, "mttr_down_s": 2.9, "grow_back_s": 5.1, "stall_up_s": 1.2}
    line, failed = _bench_jax_line(tmp_path, elastic, on_gpu=True)
    assert line.startswith("FAIL") and failed == 1 and "survivors' stall > 0.5 s" in line
    line, failed = _bench_jax_line(tmp_path, elastic, on_gpu=False)
    assert line.startswith("PASS") and failed == 0
