"""The JAX coordination service a worker starts (``train/jax/coordinator.py``), with spawned
processes on loopback: rank 0's service in a process of its own outlives rank 0 and ends once
nobody is connected; two real JAX ranks leave a generation and live on while the service ends;
the survivor that will be rank 0 of the next generation starts its service ahead and its next
program forms the group on it. The service run by the backend, outside every worker, is in
``test_jax_external_coordinator.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from jax_helpers import ROOT, ends
from local_helpers import alive
from train_harness import free_port


def test_the_coordination_service_outlives_rank_0_then_frees_its_port() -> None:
    """Rank 0 starts the coordination service in a process of its own: when rank 0's process
    is gone the service still accepts a connection (survivors leave through it), and once
    nobody is connected it exits, so the port is free for the next attempt."""
    pytest.importorskip("jax")
    import socket
    import time

    from hotswap.train.jax import coordinator

    port = free_port()
    rank0 = (
        "import sys\n"
        "from hotswap.train.jax import coordinator\n"
        f"print(coordinator.start('127.0.0.1', {port}, 3, 10).pid, flush=True)\n"
        "sys.stdin.read()\n"  # rank 0 lives until the test closes its input
    )
    env = {k: v for k, v in os.environ.items() if k != "HOTSWAP_MEMBERSHIP_FILE"}
    rank_0 = subprocess.Popen([sys.executable, "-c", rank0], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**env, "PYTHONPATH": str(ROOT / "src")})
    assert rank_0.stdout is not None and rank_0.stdin is not None
    service = int(rank_0.stdout.readline().strip())
    try:
        survivor = None
        deadline = time.monotonic() + 30
        while survivor is None and time.monotonic() < deadline:
            try:
                survivor = socket.create_connection(("127.0.0.1", port), timeout=1)
            except OSError:
                time.sleep(0.1)
        assert survivor is not None, "the service never listened"
        rank_0.stdin.close()
        rank_0.wait(30)  # rank 0's process is gone: the service is an orphan now
        time.sleep(1.5)
        assert alive(service), "the service went away under a survivor when rank 0's process did"
        survivor.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.path.exists(f"/proc/{service}") and coordinator.connections(port):
            time.sleep(0.1)
        assert ends(service), "the service stayed after everyone left"
    finally:
        if alive(service):
            os.kill(service, 9)


_LEAVER = """
import sys, time
from hotswap.train.jax.runtime import JaxGroup, configure_runtime
from hotswap.train.rendezvous import GroupSpec
rank, port = int(sys.argv[1]), int(sys.argv[2])
configure_runtime(None)
group = JaxGroup(60)
group.form(GroupSpec(1, rank, 2, "127.0.0.1", port), lambda: False)
if rank == 0:
    print("service", group._coordinator.pid, flush=True)
assert group.agree_max([rank]) == [1]
if rank == 1:
    time.sleep(0.5)  # rank 0 waits for it to leave
group.leave({0, 1})
time.sleep(2.0)  # what a survivor does next: hand its state over, join the next generation
print("alive after leaving", flush=True)
"""


def test_every_member_lives_on_after_leaving_a_generation_and_its_service_then_ends() -> None:
    """A survivor moving to the next generation leaves its group first: no member, rank 0
    included, may be ended by the coordination service going away after it left (a JAX
    client aborts its process when its service disappears, even after disconnecting); the
    service ends by itself once nobody is connected, freeing its port."""
    pytest.importorskip("jax")
    import time

    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if k != "HOTSWAP_MEMBERSHIP_FILE"}, "PYTHONPATH": str(ROOT / "src")}
    ranks = [
        subprocess.Popen([sys.executable, "-c", _LEAVER, str(rank), str(port)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
        for rank in range(2)
    ]
    outputs = [process.communicate(timeout=180) for process in ranks]
    service = next((int(line.split()[1]) for line in outputs[0][0].splitlines() if line.startswith("service ")), None)
    try:
        for rank, (process, (out, err)) in enumerate(zip(ranks, outputs)):
            assert process.returncode == 0 and "alive after leaving" in out, (rank, process.returncode, err[-2000:])
        assert service is not None
        assert ends(service), "the service stayed after everyone left"
    finally:
        if service is not None and alive(service):
            os.kill(service, 9)


_SUCCESSOR = """
import sys, time
from hotswap.train.jax import handoff as handoffs
from hotswap.train.jax.runtime import JaxGroup, configure_runtime
from hotswap.train.rendezvous import GroupSpec
rank, port = int(sys.argv[1]), int(sys.argv[2])
taken = handoffs.take()
group = JaxGroup(60)
if rank == 0 and taken is None:  # still training in the old generation: start the next one's service
    group.prepare_service("127.0.0.1", port, 2)
    print("prepared", group.prepared_service()[1], flush=True)
    change = handoffs.MembershipChange(1, 2, time.monotonic(), False)
    handoffs.restart(handoffs.Handoff(change, None, None, None, None, service=group.prepared_service()))
group.adopt_service(taken.service if taken else None)
configure_runtime(None)
group.form(GroupSpec(2, rank, 2, "127.0.0.1", port), lambda: False)
if rank == 0:
    print("formed on", group._coordinator.pid, flush=True)
assert group.agree_max([rank]) == [1]
group.leave({0, 1})
print("left", flush=True)
"""


def test_rank_0_of_the_next_generation_forms_it_on_the_service_it_started_ahead(tmp_path: Path) -> None:
    """The survivor that will be rank 0 of a published generation starts its coordination
    service while it still trains; its next program (after its restart) forms the group on
    that service instead of starting one then, and the others form with it."""
    pytest.importorskip("jax")
    script = tmp_path / "successor.py"
    script.write_text(_SUCCESSOR)
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if k != "HOTSWAP_MEMBERSHIP_FILE"}, "PYTHONPATH": str(ROOT / "src")}
    ranks = [
        subprocess.Popen([sys.executable, str(script), str(rank), str(port)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
        for rank in range(2)
    ]
    outputs = [process.communicate(timeout=180) for process in ranks]
    for rank, (process, (out, err)) in enumerate(zip(ranks, outputs)):
        assert process.returncode == 0 and "left" in out, (rank, process.returncode, err[-2000:])
    lines = outputs[0][0].split()
    prepared = lines[lines.index("prepared") + 1]
    formed = lines[lines.index("on") + 1]
    assert formed == prepared  # the same service process: none was started after the restart
