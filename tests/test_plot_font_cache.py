"""Issue 34 item 7: a ``--plot`` on a fresh machine first waits for matplotlib to build its font
cache (a scan of every font on the machine: minutes with many fonts); the command says so on
stderr while it happens, once, and the demo's report gives the plot's share of its wall time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from hotswap.cli import plotting  # noqa: E402


def _simulate_plot(cache: Path, chart: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MPLCONFIGDIR": str(cache)}
    args = ["simulate", "--nodes", "64", "--days", "1", "--policy", "hotswap", "--jobs", "1", "--plot", str(chart)]
    return subprocess.run([sys.executable, "-m", "hotswap", *args], capture_output=True, text=True, env=env, timeout=600)


def test_a_plot_with_an_empty_cache_says_it_builds_the_font_cache_and_the_next_does_not(tmp_path: Path) -> None:
    cache = tmp_path / "mplconfig"
    cache.mkdir()
    first = _simulate_plot(cache, tmp_path / "first.png")
    assert first.returncode == 0, first.stderr
    assert f"building matplotlib's font cache in {cache} (first use only" in first.stderr
    assert list(cache.glob("fontlist-v*.json"))  # what the pattern looks for is what matplotlib writes
    second = _simulate_plot(cache, tmp_path / "second.png")
    assert second.returncode == 0, second.stderr
    assert "font cache" not in second.stderr
    # A day on 64 nodes sees no failure of the very-high job: its MTTR chart says so, no warning.
    assert second.stderr == ""


def test_drawing_times_the_plot_and_names_the_cache_it_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib

    monkeypatch.setattr(matplotlib, "get_cachedir", lambda: str(tmp_path))
    ticks = iter([10.0, 12.5, 20.0, 20.25])
    said: list[str] = []
    with plotting.drawing(said.append, clock=lambda: next(ticks)) as drawn:
        (tmp_path / "fontlist-v390.json").write_text("{}")  # what matplotlib's first use leaves
    assert drawn.font_cache == tmp_path and drawn.seconds == 2.5
    assert said == [f"building matplotlib's font cache in {tmp_path} (first use only: it scans every font on this machine)"]
    with plotting.drawing(said.append, clock=lambda: next(ticks)) as drawn:
        pass
    assert drawn.font_cache is None and drawn.seconds == 0.25 and len(said) == 1
