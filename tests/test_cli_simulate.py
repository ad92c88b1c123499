"""``hotswap simulate`` end to end, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def hotswap(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hotswap", *args], check=False, capture_output=True, text=True, timeout=600)


def test_json_output_is_one_document_on_stdout() -> None:
    result = hotswap("simulate", "--nodes", "256", "--days", "2", "--seed", "4", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert set(summary["policies"]) == {"wait-for-repair", "hotswap", "hotswap+elastic"}
    assert summary["nodes"] == 256 and summary["days"] == 2 and summary["seed"] == 4
    for policy in summary["policies"].values():
        assert {"goodput_by_priority", "mttr_s", "preemptions", "failures", "spare_capacity_used"} <= set(policy)
    assert summary["wall_s"] > 0


def test_table_and_plot(tmp_path: Path) -> None:
    chart = tmp_path / "compare.png"
    result = hotswap("simulate", "--nodes", "128", "--days", "1", "--policy", "hotswap", "--plot", str(chart))
    assert result.returncode == 0, result.stderr
    assert "goodput very-high" in result.stdout and "hotswap" in result.stdout
    assert "wait-for-repair" not in result.stdout
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_profile_sets_the_failure_rate() -> None:
    result = hotswap("simulate", "--nodes", "64", "--days", "1", "--profile", "meta-rsc2", "--json", "--jobs", "1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["params"]["failures_per_1000_node_days"] == 2.34


def test_compare_runs_sizes_and_seeds_in_parallel(tmp_path: Path) -> None:
    chart = tmp_path / "sweep.png"
    args = ("simulate", "--compare", "--nodes", "128", "--sizes", "64,128", "--seeds", "2", "--days", "1",
            "--failure-rate", "100", "--jobs", "2")
    result = hotswap(*args, "--plot", str(chart))
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "spare capacity used" in text and "± " in text and "128 nodes, mean of 2 seed(s)" in text
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    document = json.loads(hotswap(*args, "--json").stdout)
    assert document["sizes"] == [64, 128] and document["seeds"] == [0, 1]
    hotswap_128 = document["policies"]["hotswap"]["128"]
    assert set(hotswap_128) >= {"main_goodput", "low_priority_goodput", "spare_capacity_used", "main_restarts"}
    assert len(hotswap_128["main_goodput"]["values"]) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--device-type", "v6e-17"), "did you mean"),
        (("--policy", "magic"), "unknown policy"),
        (("--plot", "chart.jpg"), "PNG"),
        (("--plot", "missing/chart.png"), "does not exist"),
        (("--nodes", "3"), "too small"),
        (("--nodes", "4099"), "use 4096 or 4100"),
        (("--nodes", "0"), "out of range"),
        (("--nodes", "-8"), "out of range"),
        (("--nodes", "100000000"), "out of range"),
        (("--days", "0"), "--days"),
        (("--days", "-1"), "--days"),
        (("--days", "1e9"), "--days"),
        (("--failure-rate", "-2"), "--failure-rate"),
        (("--failure-rate", "5000"), "--failure-rate"),
        (("--repair-minutes", "-1"), "--repair-minutes"),
        (("--checkpoint-minutes", "0"), "--checkpoint-minutes"),
        (("--checkpoint-minutes", "0.05"), "--checkpoint-minutes 0.05 is shorter than"),
        (("--profile", "rsc-3"), "unknown failure profile"),
        (("--profile", "llama3", "--failure-rate", "3"), "either --profile or --failure-rate"),
        (("--seeds", "3"), "go with --compare"),
        (("--compare", "--seeds", "0"), "--seeds 0"),
        (("--compare", "--sizes", "64,99"), "--sizes 99 is not a whole number"),
        (("--compare", "--sizes", "1024,0"), "--sizes 0 is out of range"),
        (("--days", "nan"), "--days"),
        (("--elastic-snapshot-minutes", "-1"), "--elastic-snapshot-minutes"),
        (("--compare", "--sizes", "a,b"), "--sizes"),
        (("--jobs", "0"), "--jobs"),
    ],
)
def test_user_errors_are_one_line_and_non_zero(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    args = tuple(str(tmp_path / a) if a.endswith((".png", ".jpg")) else a for a in args)
    result = hotswap("simulate", "--days", "0.1", *args) if "--days" not in args else hotswap("simulate", *args)
    assert result.returncode != 0, args
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], (args, result.stderr)


def test_compare_draws_its_progress_bar_on_a_terminal_stderr_and_keeps_json_stdout_clean() -> None:
    """The bar goes to stderr only when stderr is a terminal (a log file or a pipe would fill with
    redraws); stdout holds only the JSON document either way."""
    import os
    import pty

    args = [sys.executable, "-m", "hotswap", "simulate", "--compare", "--nodes", "128", "--sizes", "64,128",
            "--seeds", "2", "--days", "1", "--jobs", "1", "--json"]
    main, terminal = pty.openpty()
    try:
        env = dict(os.environ, COLUMNS="100", TERM="xterm")
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=terminal, env=env)
        os.close(terminal)
        drawn = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal's other end closed: the command exited
                break
            if not chunk:
                break
            drawn += chunk
        stdout = process.stdout.read() if process.stdout else b""
        assert process.wait(timeout=600) == 0, drawn.decode(errors="replace")
    finally:
        os.close(main)
    assert json.loads(stdout)["sizes"] == [64, 128]
    assert b"simulating" in drawn and b"runs" in drawn, drawn[-500:]
    piped = hotswap(*args[3:])
    assert piped.returncode == 0 and "simulating" not in piped.stderr, piped.stderr
    assert json.loads(piped.stdout)["sizes"] == [64, 128]
