"""Nothing listens beyond loopback without an explicit opt-in and a real token; the Host of a
loopback dashboard is checked (DNS rebinding); the token need never be on a command line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from dashboard_helpers import served, state
from local_helpers import home, hotswap, wait_until  # noqa: F401

TOKEN = "s3cret-" + "k" * 20


def one_line(result: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(word in lines[0] for word in words), lines[0]
    return lines[0]


@pytest.fixture
def cluster(home: Path) -> Path:  # noqa: F811
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "1", check=True)
    return home


def test_metrics_beyond_loopback_need_expose_metrics(cluster: Path) -> None:
    for address in (":9464", "0.0.0.0:9464", "[::]:9464", "192.0.2.1:9464"):
        one_line(hotswap(cluster, "controller", "run", "--cluster", "c", "--metrics-address", address), 2, "--expose-metrics", address)
    # Opted in, the address passes: this cluster's controller already runs, which is the refusal.
    opted = hotswap(cluster, "controller", "run", "--cluster", "c", "--metrics-address", ":0", "--expose-metrics")
    assert opted.returncode == 4 and "already running" in opted.stderr, opted.stderr
    loopback = hotswap(cluster, "controller", "run", "--cluster", "c", "--metrics-address", "127.0.0.1:0")
    assert loopback.returncode == 4 and "already running" in loopback.stderr, loopback.stderr


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (("--expose", "--host", "0.0.0.0", "--token", " " * 16), {}, ("--token is blank",)),
        (("--token", "\t" * 20), {}, ("--token is blank",)),
        (("--expose", "--host", "0.0.0.0", "--token", "sixteen chars ok"), {}, ("whitespace",)),
        (("--expose", "--host", "0.0.0.0"), {"HOTSWAP_DASHBOARD_TOKEN": ""}, ("HOTSWAP_DASHBOARD_TOKEN is blank",)),
        ((), {"HOTSWAP_DASHBOARD_TOKEN": ""}, ("HOTSWAP_DASHBOARD_TOKEN is blank",)),  # never "no authentication"
        (("--expose", "--host", "0.0.0.0"), {"HOTSWAP_DASHBOARD_TOKEN": "short"}, ("at least 16",)),
        (("--expose", "--host", "0.0.0.0"), {}, ("--expose needs a token", "--token-file")),
    ],
)
def test_a_blank_or_missing_token_is_refused(cluster: Path, args: tuple[str, ...], env: dict[str, str], words: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOTSWAP_DASHBOARD_TOKEN", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    one_line(hotswap(cluster, "dashboard", "--cluster", "c", "--port", "0", *args, timeout=30), 2, *words)


def test_a_token_file_keeps_the_token_off_the_command_line(cluster: Path, tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    secret.chmod(0o644)
    one_line(hotswap(cluster, "dashboard", "--cluster", "c", "--token-file", str(secret)), 2, "chmod 600")
    secret.chmod(0o600)
    env = dict(os.environ, HOTSWAP_HOME=str(cluster))
    env.pop("HOTSWAP_DASHBOARD_TOKEN", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "hotswap", "dashboard", "--cluster", "c", "--port", "0", "--token-file", str(secret)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        url = re.search(r"(http://\S+/)\?token=(\S+)", line)
        assert url and url.group(2) == TOKEN, line  # the file's line, without its newline
        assert TOKEN.encode() not in Path(f"/proc/{process.pid}/cmdline").read_bytes()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url.group(1) + "api/state", timeout=10)
        assert refused.value.code == 401
        request = urllib.request.Request(url.group(1) + "api/state", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_a_loopback_dashboard_answers_loopback_host_names_only(cluster: Path) -> None:
    with served(cluster) as board:
        port = board.url.split(":")[2].split("/")[0]
        for name in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
            assert state(board, headers={"Host": name})["cluster"]["name"] == "c"
        for name in (f"rebound.example:{port}", "rebound.example", f"10.0.0.1:{port}", ""):
            with pytest.raises(urllib.error.HTTPError) as refused:
                state(board, headers={"Host": name})
            assert refused.value.code == 403, name


def test_healthz_answers_with_300_live_views_open(cluster: Path) -> None:
    """Each live view (an /api/stream) polls; unbounded, 300 of them starved /healthz (issue 36,
    item 8). At most MAX_STREAMS are served; the others are told so (503), and /healthz answers."""
    import socket

    from hotswap.dashboard.server import MAX_STREAMS

    with served(cluster) as board:
        port = int(board.url.split(":")[2].split("/")[0])
        views = []
        try:
            statuses = []
            for _ in range(300):
                view = socket.create_connection(("127.0.0.1", port), timeout=120)
                views.append(view)
                view.sendall(f"GET /api/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            for view in views:
                head = b""
                while b"\r\n" not in head:
                    head += view.recv(1024)
                statuses.append(int(head.split()[1]))
            assert statuses.count(200) == MAX_STREAMS and statuses.count(503) == 300 - MAX_STREAMS
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=120) as answer:
                assert answer.status == 200
        finally:
            for view in views:
                view.close()
