"""The same Prometheus figures from the local controller (``controller run --metrics-address``)
as from the Kubernetes controller: counters of what happened and the cluster's state."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from dashboard_helpers import drill_cluster
from k8s_fixtures.scenario import (
    make_controller,
    make_world,
    run_until,
    running,
    submit,
)
from local_helpers import alive, home, hotswap, wait_until
from test_kubernetes_metrics import sample

from hotswap.backends.kit.metrics import METRICS, ControllerMetrics


def figure(text: str, name: str) -> float | None:
    """A sample's value, or None before the controller first set it."""
    try:
        return sample(text, name)
    except AssertionError:
        return None


def names(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ") and not line.split()[2].endswith("_created")}


def test_the_local_controller_serves_the_figures_of_a_hotswap(home: Path, tmp_path: Path) -> None:
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "2", check=True)
    # The controller `cluster create` started in the background (no workers yet) makes way for
    # one in the foreground that serves metrics.
    described = json.loads(hotswap(home, "cluster", "describe", "--cluster", "c", "--output", "json", check=True).stdout)
    os.kill(described["controller_pid"], signal.SIGTERM)
    wait_until(lambda: not alive(described["controller_pid"]), timeout=30, what="the background controller to stop")
    process = subprocess.Popen(
        [sys.executable, "-m", "hotswap", "controller", "run", "--cluster", "c", "--metrics-address", "127.0.0.1:0"],
        env={**os.environ, "HOTSWAP_HOME": str(home)}, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        url = re.search(r"http://\S+/metrics", line)
        assert url, line

        def scrape() -> str:
            with urllib.request.urlopen(url.group(0), timeout=10) as response:
                return response.read().decode()

        assert names(scrape()) == names(ControllerMetrics().exposition()) == {m.name for m in METRICS}
        # Set once the controller has read the cluster (it serves metrics from its first moment).
        wait_until(lambda: figure(scrape(), 'hotswap_slices{state="spare"}') == 2, timeout=60, what="two spare slices")

        drill_cluster(home, tmp_path, create=False)
        wait_until(lambda: figure(scrape(), 'hotswap_workloads{status="RUNNING"}') == 2, timeout=60, what="two running")
        assert sample(scrape(), 'hotswap_workloads{status="QUEUED"}') == 1
        rows = json.loads(hotswap(home, "workload", "list", "--cluster", "c", "--output", "json", check=True).stdout)
        (high_slice,) = next(r["slices"] for r in rows if r["name"] == "high")
        hotswap(home, "node", "fail", "--cluster", "c", "--slice", high_slice, check=True)
        wait_until(lambda: figure(scrape(), "hotswap_recovery_seconds_count") == 1, timeout=60, what="the recovery")
        text = scrape()
        # The metric's MTTR is describe's: the failure to high's first step after it, from the records.
        progress = json.loads(hotswap(home, "workload", "describe", "--cluster", "c", "--workload", "high", "-o", "json", check=True).stdout)["progress"]
        assert progress["mttr_s"] is not None
        assert sample(text, "hotswap_recovery_seconds_sum") == pytest.approx(progress["mttr_s"], abs=0.002)
        assert sample(text, "hotswap_hotswaps_total") == 1
        assert sample(text, "hotswap_preemptions_total") == 1  # low made room for high
        assert sample(text, 'hotswap_slices{state="unhealthy"}') == 1 and sample(text, 'hotswap_slices{state="held"}') == 1
        assert sample(text, 'hotswap_workloads{status="QUEUED"}') == 2
        assert sample(text, "hotswap_reconcile_duration_seconds_count") >= 4
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_the_kubernetes_controller_sets_the_same_cluster_state_gauges() -> None:
    world = make_world()
    try:
        metrics = ControllerMetrics()
        controller = make_controller(world, metrics=metrics)
        submit(world, "high", "high", 2)
        run_until(world, controller, lambda: running(world, "high") == 8)
        text = metrics.exposition()
        assert sample(text, 'hotswap_workloads{status="RUNNING"}') == 1
        assert sample(text, 'hotswap_slices{state="held"}') == 2
    finally:
        world.close()


def test_a_metrics_port_in_use_is_one_line(home: Path) -> None:
    import socket

    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "1", check=True)
    running = int((home / "clusters" / "c" / "controller.lock").read_text())
    os.kill(running, signal.SIGTERM)  # (with it running, `already running` is the answer: see below)
    wait_until(lambda: not alive(running), timeout=60, what="the controller to stop")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = hotswap(home, "controller", "run", "--cluster", "c", "--metrics-address", f"127.0.0.1:{port}")
    assert result.returncode != 0
    assert result.stderr.strip() == f"error: --metrics-address 127.0.0.1:{port}: Address already in use"


def test_a_second_controller_run_says_already_running_before_serving_metrics(home: Path) -> None:
    """Issue 36, item 8: the second `controller run` bound its metrics port and printed the URL,
    then said the cluster's controller already runs. The claim comes first now."""
    import socket

    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "1", check=True)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    result = hotswap(home, "controller", "run", "--cluster", "c", "--metrics-address", f"127.0.0.1:{port}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 4 and len(lines) == 1 and "already running" in lines[0], result.stderr
