"""The dashboard served over HTTP against a real local cluster (real worker processes), the CLI's
one-line errors, and the token of an exposed dashboard."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from dashboard_helpers import drill_cluster, holder_of, poll, served, state
from local_helpers import alive, home, hotswap, wait_until

from hotswap.api.errors import InvalidInputError
from hotswap.dashboard.server import check_binding


def test_the_page_follows_a_hotswap_and_survives_a_controller_restart(home: Path, tmp_path: Path) -> None:
    drill_cluster(home, tmp_path)
    with served(home) as board:
        first = poll(board, lambda d: any(w["step"] for w in d["workloads"]), "a step of high")
        assert first["cluster"]["backend"] == "local" and not first["stale"]
        (high_slice,) = holder_of(first, "high")
        assert [q["name"] for q in first["queue"]] == ["waiter"]
        assert first["queue"][0]["reason"].startswith("queued")
        with urllib.request.urlopen(board.url + "static/vendor/uPlot.iife.min.js", timeout=10) as script:
            assert script.status == 200 and b"uPlot" in script.read(2000)

        hotswap(home, "node", "fail", "--cluster", "c", "--slice", high_slice, check=True)
        moved = poll(board, lambda d: holder_of(d, "high") not in ([], [high_slice]), "high on another slice")
        assert [s["kind"] for s in moved["slices"] if s["name"] == high_slice] == ["unhealthy"]
        assert {e["category"] for e in moved["events"] if e["workload"] == "high"} >= {"failure", "hotswap"}
        recovered = poll(board, lambda d: next(w for w in d["workloads"] if w["name"] == "high")["mttr_s"], "high's recovery")
        assert next(w for w in recovered["workloads"] if w["name"] == "high")["mttr_s"] > 0

        pid = recovered["cluster"]["controller_pid"]
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not alive(pid), timeout=30, what="the controller to end")
        # The next look finds the controller gone; the backend starts a new one; the page goes on.
        again = poll(board, lambda d: d["cluster"]["controller_pid"] not in (None, pid) and not d["stale"], "a new controller")
        assert holder_of(again, "high") == holder_of(recovered, "high")


def test_the_dashboard_is_read_only() -> None:
    from hotswap.dashboard.server import create_app
    from hotswap.dashboard.source import ClusterSource

    app = create_app(ClusterSource("c", lambda: None))  # type: ignore[arg-type,return-value]
    methods = {m for route in app.routes for m in (getattr(route, "methods", None) or ())}
    assert methods <= {"GET", "HEAD"}


def test_an_exposed_dashboard_needs_the_flag_and_a_token_and_checks_it(home: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="add --expose"):
        check_binding("0.0.0.0", expose=False, token=None)
    with pytest.raises(InvalidInputError, match="--token is 5 characters: a dashboard token must be at least 16"):
        check_binding("0.0.0.0", expose=True, token="short")
    check_binding("0.0.0.0", expose=True, token="x" * 16)
    check_binding("::1", expose=False, token=None)

    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "1", check=True)
    token = "t0ken-" + "x" * 20
    with served(home, token=token) as board:
        base = board.url.split("?")[0]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "api/state", timeout=10)
        assert refused.value.code == 401
        with pytest.raises(urllib.error.HTTPError):
            state(board, headers={"Authorization": "Bearer wrong-token-xxxxxxxxxxx"})
        assert state(board, headers={"Authorization": f"Bearer {token}"})["cluster"]["name"] == "c"
        with urllib.request.urlopen(board.url, timeout=10) as page:  # ?token= sets the cookie
            assert "HttpOnly" in page.headers["set-cookie"] and "default-src 'self'" in page.headers["content-security-policy"]


def test_the_cli_says_one_line_for_an_unknown_cluster_a_port_in_use_and_a_public_address(home: Path) -> None:
    unknown = hotswap(home, "dashboard", "--cluster", "nope")
    assert unknown.returncode != 0 and unknown.stderr.startswith("error: no cluster named nope")
    assert len(unknown.stderr.strip().splitlines()) == 1

    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "1", check=True)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = hotswap(home, "dashboard", "--cluster", "c", "--port", str(port))
    assert busy.returncode != 0
    assert busy.stderr.strip() == f"error: port {port} on 127.0.0.1 is in use: choose another with --port (0: any free port)"

    public = hotswap(home, "dashboard", "--cluster", "c", "--host", "0.0.0.0")
    assert public.returncode != 0 and "add --expose" in public.stderr and len(public.stderr.strip().splitlines()) == 1


def test_demo_dashboard_shows_the_drill_while_it_runs(home: Path) -> None:
    pytest.importorskip("torch")
    process = subprocess.Popen(
        [sys.executable, "-m", "hotswap", "demo", "hotswap", "--no-warm", "--json", "--dashboard", "--dashboard-port", "0"],
        env={**os.environ, "HOTSWAP_HOME": str(home)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines: list[str] = []
    assert process.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        url = wait_until(lambda: next((m.group(0) for line in list(lines) if (m := re.search(r"http://127\.0\.0\.1:\d+/", line))), None),
                         timeout=60, what="the dashboard's address")

        def document() -> dict:
            with urllib.request.urlopen(url + "api/state", timeout=10) as response:
                return json.loads(response.read())

        seen = wait_until(lambda: (d := document())["cluster"]["name"] and any(w["step"] for w in d["workloads"]) and d,
                          timeout=120, what="the drill's training on the page")
        assert seen["cluster"]["name"].startswith("demo-hotswap-") and not seen["stale"]
        stdout, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, "".join(lines[-20:])
    assert json.loads(stdout)["passed"]
    assert not any("no cluster named" in line for line in lines)  # the wait for the drill's cluster is not an error
