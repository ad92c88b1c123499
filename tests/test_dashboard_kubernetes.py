"""The dashboard of a Kubernetes cluster: read through the Kubernetes backend from an HTTP-level
fake API server (as the CLI's tests do), then the API server gone: the last data, marked stale."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_kubernetes_cli import ClusterApi, hotswap

from hotswap.dashboard.source import ClusterSource


def test_a_kubernetes_cluster_on_the_page_and_an_unreachable_api_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_kubernetes_client import FakeApiServer, write_kubeconfig

    state = ClusterApi()
    server = FakeApiServer(state.route)
    try:
        env = {"KUBECONFIG": str(write_kubeconfig(tmp_path / "kubeconfig", server.url))}
        created = hotswap(tmp_path, "cluster", "create", "--backend", "kubernetes", "--cluster", "trillium", "--context", "fake", env=env)
        assert created.returncode == 0, created.stderr
        submitted = hotswap(tmp_path, "workload", "create", "--cluster", "trillium", "--workload", "high", "--priority", "high",
                            "--num-slices", "2", "--command", "python3 train.py", "--env", "TOKEN=s3cr3t-never-shown", env=env)
        assert submitted.returncode == 0, submitted.stderr
        for key, value in {"HOTSWAP_HOME": str(tmp_path), **env}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        from hotswap.cli import backends

        lines: list[str] = []
        source = ClusterSource("trillium", lambda: backends.for_cluster("trillium"), log=lines.append)
        source.look()
        document = json.loads(source.snapshot()[1])
        assert not document["stale"], document["error"]
        assert document["cluster"]["backend"] == "kubernetes"
        assert [s["name"] for s in document["slices"]] == ["tpu-v6e-np-0", "tpu-v6e-np-1", "tpu-v6e-np-2"]
        assert [q["name"] for q in document["queue"]] == ["high"]
        assert "s3cr3t-never-shown" not in json.dumps(document)
    finally:
        server.close()
    source.look()  # the API server is gone
    stale = json.loads(source.snapshot()[1])
    assert stale["stale"] and stale["error"] and "\n" not in stale["error"]
    assert [q["name"] for q in stale["queue"]] == ["high"]  # the last data, kept
    assert len(lines) == 1 and "marked stale" in lines[0], lines
    assert os.environ["HOTSWAP_HOME"] == str(tmp_path)
