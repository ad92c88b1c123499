"""The controller's Prometheus metrics (``hotswap.backends.kit.metrics``): what a hotswap records, and
the endpoint ``controller run --metrics-address`` serves, scraped over HTTP."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

from k8s_fixtures.scenario import make_controller, make_world, run_until, running, submit
from test_kubernetes_cli import hotswap

from hotswap.backends.kubernetes.controller.loop import KubeController
from hotswap.backends.kit.metrics import METRICS, ControllerMetrics


def sample(text: str, name: str) -> float:
    """The value of one sample line of the exposition format."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the metrics")


def test_a_hotswap_is_counted_with_its_recovery_time_and_the_writes_it_took() -> None:
    world = make_world()
    try:
        metrics = ControllerMetrics()
        controller = make_controller(world, metrics=metrics)
        submit(world, "low", "low", 1)
        submit(world, "high", "high", 2)
        run_until(world, controller, lambda: running(world, "high") == 8 and running(world, "low") == 4)
        dead = world.nodes_of_pool(world.pools_of("high")[0])[0]
        world.fail_node(dead)
        run_until(world, controller, lambda: running(world, "high", attempt=2) == 8)
        world.advance(5, controller)
        text = metrics.exposition()
        assert sample(text, "hotswap_hotswaps_total") == 1
        assert sample(text, "hotswap_preemptions_total") == 1
        # A recovery ends at the first productive step after the failure, from the workers'
        # records (issue 35 item 3): these pods run no trainer, so none has ended, running or
        # not (tests/test_kubernetes_worker_reports.py times one that does).
        assert sample(text, "hotswap_recovery_seconds_count") == 0
        reconciles = sample(text, "hotswap_reconcile_duration_seconds_count")
        assert reconciles == sample(text, "hotswap_reconcile_writes_count") > 5
        assert sample(text, 'hotswap_reconcile_writes_bucket{le="0.0"}') >= 1  # reconciles with nothing to do
    finally:
        world.close()


def test_controller_run_serves_the_metrics_on_its_address() -> None:
    world = make_world()
    world.api.watch_timeout_cap_s = 0.3
    metrics = ControllerMetrics()
    host, port = metrics.serve("127.0.0.1:0")
    assert host == "127.0.0.1"
    controller = KubeController(world.client(), "c", metrics=metrics, log=lambda line: None)
    submit(world, "w", "high", 1)
    stop = threading.Event()
    thread = threading.Thread(target=controller.run, args=(stop, "pod-a"), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
            if "hotswap_leader 1.0" in text and sample(text, "hotswap_reconcile_duration_seconds_count") >= 1:
                break
            time.sleep(0.05)
        for spec in METRICS:
            assert f"# HELP {spec.name}" in text or f"# HELP {spec.name.removesuffix('_total')}" in text, spec.name
        assert "hotswap_leader 1.0" in text
    finally:
        stop.set()
        thread.join(20)
        metrics.close()
        world.close()
    assert "hotswap_leader 0.0" in metrics.exposition()  # let go of the Lease on the way out


def test_a_bad_metrics_address_is_one_line(tmp_path: Path) -> None:
    in_cluster = {"HOTSWAP_KUBERNETES_SETTINGS": "{}"}  # as the Deployment runs it: no local record
    result = hotswap(tmp_path, "controller", "run", "--cluster", "c", "--metrics-address", "localhost", env=in_cluster)
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.strip() == "error: --metrics-address: 'localhost' is not HOST:PORT"
