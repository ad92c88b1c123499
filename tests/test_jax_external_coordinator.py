"""The JAX coordination service run by the backend, outside every worker (Kubernetes: an elastic
JobSet's ``coordinator`` pod): a real service process serving each generation the membership
file publishes, on loopback, and real JAX worker processes told (HOTSWAP_JAX_COORDINATOR) that
the service is external: they start none of their own and meet there."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hotswap.api.membership import Membership
from hotswap.api.worker import HOTSWAP_JAX_COORDINATOR, HOTSWAP_MEMBERSHIP_FILE

ROOT = Path(__file__).resolve().parents[1]

# A worker forms its generation's group through JaxGroup, then says whether it started a service.
_WORKER = (
    "import sys\n"
    "from hotswap.train.jax.runtime import JaxGroup\n"
    "from hotswap.train.rendezvous import GroupSpec\n"
    "generation, rank, port = (int(a) for a in sys.argv[1:4])\n"
    "group = JaxGroup(rendezvous_timeout_s=20, heartbeat_timeout_s=10)\n"
    # master_addr: the generation's rank 0 (a documentation address nobody answers): an external
    # service must be used instead.
    "group.form(GroupSpec(generation, rank, 2, '192.0.2.1', port), lambda: False)\n"
    "print('formed', rank, 'own-service' if group._coordinator is not None else 'no-own-service', flush=True)\n"
    "group.leave(range(2))\n"
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _publish(path: Path, generation: int, port: int) -> None:
    membership = Membership(generation, ("slice-a", "slice-b"), 1, "192.0.2.1", port)
    path.with_suffix(".tmp").write_text(membership.to_json())
    path.with_suffix(".tmp").rename(path)


def _form(generation: int, port: int, env: dict[str, str]) -> list[str]:
    workers = [
        subprocess.Popen([sys.executable, "-c", _WORKER, str(generation), str(rank), str(port)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for rank in range(2)
    ]
    lines = []
    for worker in workers:
        out, err = worker.communicate(timeout=90)
        assert worker.returncode == 0, f"a worker of generation {generation} failed: {err[-2000:]}"
        lines.append(out.strip())
    return lines


def test_workers_told_the_service_is_external_meet_there_generation_after_generation(tmp_path: Path) -> None:
    """A worker whose environment names the external service starts none itself, even as rank
    0, and connects to that host on its generation's port; the one service process serves a
    later generation (another port, its own process count) as well."""
    pytest.importorskip("jax")
    membership = tmp_path / "membership.json"
    membership.write_text("")  # the coordinator pod's file before the controller annotates it
    env = {k: v for k, v in os.environ.items() if k != HOTSWAP_MEMBERSHIP_FILE}
    env.update(PYTHONPATH=str(ROOT / "src"), JAX_PLATFORMS="cpu")
    service = subprocess.Popen(
        [sys.executable, "-m", "hotswap.train.jax.coordinator", "--every-generation", str(membership), "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        workers_env = {**env, HOTSWAP_JAX_COORDINATOR: "127.0.0.1"}
        first, second = _free_port(), _free_port()
        _publish(membership, 1, first)
        assert _form(1, first, workers_env) == ["formed 0 no-own-service", "formed 1 no-own-service"]
        _publish(membership, 2, second)  # the group changed: a new generation on its own port
        assert _form(2, second, workers_env) == ["formed 0 no-own-service", "formed 1 no-own-service"]
        assert service.poll() is None, "the service process ended with a generation"
        # The superseded generation's service goes once nobody is connected to it: its port is free.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", first)) != 0:
                    break
            time.sleep(0.2)
        else:
            pytest.fail("generation 1's service stayed after its members left")
    finally:
        service.terminate()
        out, _ = service.communicate(timeout=10)
    assert "serving generation 1 (2 processes)" in out and "serving generation 2 (2 processes)" in out


def test_in_an_image_without_jax_the_service_pod_idles_instead_of_failing(tmp_path: Path) -> None:
    """The coordinator pod runs for every elastic workload, PyTorch ones included, in the
    workload's image: without jaxlib it says so once and keeps running (no crash loop)."""
    membership = tmp_path / "membership.json"
    _publish(membership, 1, _free_port())
    probe = (
        "import sys\n"
        "sys.modules.update(jax=None, jaxlib=None)\n"  # as if not installed
        "from hotswap.train.jax import coordinator\n"
        f"print('returned', coordinator.serve_every_generation({str(membership)!r}, 10, polls=5))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["hotswap: no jaxlib in this image: no JAX coordination service to run", "returned 0"]
