"""Every socket a job listens on, on a local cluster, is on loopback (issue 36, item 5): the JAX
coordination service that rank 0 starts (it listened on ``[::]``, every interface), JAX's CPU
collectives (gloo), and torch's rendezvous store and collective sockets. Read from the kernel's
tables: each listening socket of the job's processes, by the inodes of their descriptors."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys

import pytest
from jax_helpers import ROOT
from local_helpers import alive
from train_harness import free_port

_LISTEN = "0A"


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    # /proc/net/tcp6 prints the address as four 32-bit words, each in host (little-endian) order
    return ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))


def listening_addresses(pids: list[int]) -> dict[int, list[str]]:
    """Each process's listening TCP sockets as ``address:port``."""
    found: dict[int, list[str]] = {}
    for pid in pids:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
        found[pid] = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as lines:
                next(lines)
                for line in lines:
                    fields = line.split()
                    if fields[3] == _LISTEN and fields[9] in inodes:
                        address, port = fields[1].rsplit(":", 1)
                        found[pid].append(f"{_address(address)}:{int(port, 16)}")
    return found


def _ready(process: subprocess.Popen[str]) -> list[str]:
    """The process's ``ready`` line, split (gloo prints lines of its own before it)."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("ready "):
            return line.split()
    return []


def _loopback(where: str) -> bool:
    address = ipaddress.ip_address(where.rsplit(":", 1)[0])
    mapped = getattr(address, "ipv4_mapped", None)  # gRPC's IPv6 socket for 127.0.0.1: ::ffff:127.0.0.1
    return (mapped or address).is_loopback


def _exposed(listeners: dict[int, list[str]]) -> list[str]:
    return [f"pid {pid} listens on {where}" for pid, addresses in listeners.items() for where in addresses if not _loopback(where)]


_JAX_RANK = """
import os, sys
from hotswap.train.jax.runtime import JaxGroup, configure_runtime
from hotswap.train.rendezvous import GroupSpec
rank, port = int(sys.argv[1]), int(sys.argv[2])
configure_runtime(None, no_gpu=True)
group = JaxGroup(60)
group.form(GroupSpec(1, rank, 2, "127.0.0.1", port), lambda: False)
assert group.agree_max([rank]) == [1]  # the CPU collectives exist and have met
service = group._coordinator.pid if rank == 0 else 0
print("ready", os.getpid(), service, flush=True)
sys.stdin.readline()
group.leave({0, 1})
print("left", flush=True)
"""


def test_a_jax_group_on_a_local_cluster_listens_on_loopback_only() -> None:
    """Rank 0's coordination service (unauthenticated gRPC) and every rank's gloo listen on
    127.0.0.1, where MASTER_ADDR says the group meets, not on every interface."""
    pytest.importorskip("jax")
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k != "HOTSWAP_MEMBERSHIP_FILE"},
        "PYTHONPATH": str(ROOT / "src"),
        "JAX_PLATFORMS": "cpu",
    }
    ranks = [
        subprocess.Popen([sys.executable, "-c", _JAX_RANK, str(rank), str(port)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for rank in range(2)
    ]
    service = 0
    try:
        ready = [_ready(process) for process in ranks]
        assert all(line[:1] == ["ready"] for line in ready), (ready, [p.poll() for p in ranks])
        service = int(ready[0][2])
        pids = [int(line[1]) for line in ready] + [service]
        listeners = listening_addresses(pids)
        assert any(f":{port}" in where for where in listeners[service]), listeners  # the service is seen
        assert sum(len(addresses) for addresses in listeners.values()) > 1, listeners  # gloo's too
        assert _exposed(listeners) == [], listeners
    finally:
        for process in ranks:  # every rank leaves at once, as a generation's members do
            process.stdin.write("\n")  # type: ignore[union-attr]
            process.stdin.flush()  # type: ignore[union-attr]
        outputs = [process.communicate(timeout=120) for process in ranks]
        if service and alive(service):
            os.kill(service, 9)
    for process, (out, err) in zip(ranks, outputs):
        assert process.returncode == 0 and "left" in out, err[-2000:]


_TORCH_RANK = """
import os, sys
from hotswap.api.worker import WorkerEnv
from hotswap.train.torch.distributed import ProcessGroup
from hotswap.train.rendezvous import GroupSpec
rank, port = int(sys.argv[1]), int(sys.argv[2])
os.environ.pop("GLOO_SOCKET_IFNAME", None)
group = ProcessGroup("gloo", collective_timeout_s=30, rendezvous_timeout_s=60, env=WorkerEnv.from_environ({"CUDA_VISIBLE_DEVICES": ""}))
group.form(GroupSpec(1, rank, 2, "127.0.0.1", port), interrupted=lambda: False)
assert group.agree_max([rank]) == [1]
print("ready", os.getpid(), os.environ.get("NCCL_SOCKET_IFNAME"), flush=True)
sys.stdin.readline()
group.destroy()
"""


def test_a_torch_group_on_a_local_cluster_listens_on_loopback_only() -> None:
    """Rank 0's TCPStore and every rank's gloo pairs listen on loopback; NCCL's bootstrap (on
    a GPU-backed local slice) is kept on the loopback interface the same way."""
    pytest.importorskip("torch")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("NCCL_SOCKET_IFNAME", None)
    ranks = [
        subprocess.Popen([sys.executable, "-c", _TORCH_RANK, str(rank), str(port)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for rank in range(2)
    ]
    try:
        ready = [_ready(process) for process in ranks]
        assert all(line[:1] == ["ready"] for line in ready), (ready, [p.poll() for p in ranks])
        assert all(line[2] == "lo" for line in ready), ready
        listeners = listening_addresses([int(line[1]) for line in ready])
        assert f"127.0.0.1:{port}" in listeners[int(ready[0][1])], listeners
        assert _exposed(listeners) == [], listeners
    finally:
        outputs = [process.communicate("\n", timeout=120) for process in ranks]
    for process, (_, err) in zip(ranks, outputs):
        assert process.returncode == 0, err[-2000:]
