"""The JAX coordination service of one generation, in a process of its own.

``jax.distributed.initialize`` runs the coordination service inside rank 0's process, and every
other process of the generation aborts the moment it goes away (the distributed client's error
callback ends the process; a Python callback cannot replace it in jax 0.10). So an elastic job
could survive the loss of any slice but the first. hotswap starts the service in a small
process of its own instead (:func:`start`, by the generation's rank 0, in a new session so that
the loss of rank 0's process group or its exit does not take it along): with rank 0's slice
gone, the survivors' collectives fail as for any other peer, they leave through the service,
and they re-form without it, a survivor being rank 0 of the next generation.

Its lifetime: once the others have left, rank 0 disconnects and releases it (:func:`release`);
if rank 0 dies first, it is released too. A released service serves whoever is still on the
way out and exits once no process is connected to it any more (the kernel's table of TCP
connections says so), after :data:`ORPHAN_LIFETIME_S` at the most, so that its port is free for
the next attempt; and at once if the job's membership file goes away (the workload or its
cluster was removed). It is never stopped under a connected client: a JAX client whose
service goes away ends its process (a fatal error in jaxlib, from its error-polling thread,
even after it has disconnected), and a survivor moving to the next generation must live on.

The process that will be rank 0 of a published generation starts that generation's service
while it still trains in the previous one (:class:`~hotswap.train.jax.runtime.JaxGroup`'s
``prepare_service``), and its next program adopts it (:class:`Adopted`): the new group forms
without waiting for a Python process to start and load jaxlib.

Run as ``python -m hotswap.train.jax.coordinator HOST PORT PROCESSES HEARTBEAT_S PARENT_PID``.
It listens on HOST, the generation's MASTER_ADDR, only (:func:`~hotswap.train.rendezvous.listen_host`):
127.0.0.1 on a local cluster, so no other machine can reach the unauthenticated service.

**Every generation, outside the workers** (``--every-generation MEMBERSHIP_FILE HEARTBEAT_S``):
on Kubernetes a process that rank 0 starts lives in rank 0's pod, on rank 0's node, and dies
with it. There the backend runs this mode in a pod of its own (an elastic JobSet's
``coordinator`` replicated job, on no slice's node) and tells the workers so
(:data:`~hotswap.api.worker.HOTSWAP_JAX_COORDINATOR`): it reads the membership file as the
workers do and, for each newer generation, starts that generation's service on its
``master_port`` for its ``world_size`` processes (:func:`serve_every_generation`), on every
interface of its pod: the workers are other pods, and a pod's network namespace holds only
the pod network's interface and its own loopback (this pod does not use the host's network). A superseded
generation's service stays until nobody is connected to it (its members have left through it,
as they do from rank 0's own), at most :data:`ORPHAN_LIFETIME_S`, as an orphaned one above.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from hotswap.api.worker import HOTSWAP_MEMBERSHIP_FILE
from hotswap.train.membership import MembershipWatcher
from hotswap.train.rendezvous import listen_host

ORPHAN_LIFETIME_S = 30.0  # how long the service outlives rank 0's process
_POLL_S = 0.2


def start(master_addr: str, port: int, processes: int, heartbeat_s: int) -> subprocess.Popen[bytes]:
    """Start the service of a generation of ``processes`` on ``master_addr:port`` (see the module)."""
    return subprocess.Popen(
        [sys.executable, "-m", "hotswap.train.jax.coordinator", master_addr, str(port), str(processes), str(heartbeat_s), str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # not in rank 0's process group: a lost worker's group is killed whole
    )


class Adopted:
    """A service this process's previous program started (``exec`` keeps the pid, so it is
    still this process's child; a successor's is its keeper's, see
    :mod:`hotswap.train.jax.successor`): the part of ``Popen`` that :func:`release` and
    :func:`stop` use."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not our child (the keeper of our pid started it): is it there?
                try:
                    os.kill(self.pid, 0)
                except ProcessLookupError:
                    self.returncode = 0
            else:
                self.returncode = os.waitstatus_to_exitcode(status) if pid else None
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode or 0


Service = subprocess.Popen[bytes] | Adopted


def release(process: Service | None) -> None:
    """Let the service end by itself once nobody is connected to it (see the module)."""
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGUSR1)


def stop(process: Service | None) -> None:
    """End the service (the others have left), waiting a moment for it."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(2.0)
    except subprocess.TimeoutExpired:
        process.kill()


# Every interface of this network namespace: the Kubernetes coordinator pod's (see the module).
EVERY_INTERFACE = "::"


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listen_host(master_addr: str) -> str:
    """Where rank 0's service listens: MASTER_ADDR only, if it is this host's; on Kubernetes,
    while rank 0's DNS name is not published yet, its pod's interfaces (the pod network)."""
    deadline = time.monotonic() + 5.0
    while True:
        try:
            return listen_host(master_addr)
        except OSError:
            if time.monotonic() > deadline:
                print(f"hotswap: {master_addr} does not resolve; the coordination service listens on every interface of this pod", flush=True)
                return EVERY_INTERFACE
            time.sleep(_POLL_S)


def _service(host: str, port: int, processes: int, heartbeat_s: int) -> object:
    try:
        from jaxlib import _jax  # the runtime alone: the service needs no JAX backend
    except ImportError:  # pragma: no cover - older layouts
        from jax._src.lib import _jax  # type: ignore[no-redef]
    deadline = time.monotonic() + 5.0  # the previous attempt's service may still hold the port
    while True:
        try:
            return _jax.get_distributed_runtime_service(
                _address(host, port), processes, heartbeat_timeout=heartbeat_s, shutdown_timeout=60, recoverable=True
            )
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(_POLL_S)


def connections(port: int) -> int | None:
    """Established TCP connections to ``port`` on this host (None where the kernel's tables
    cannot be read)."""
    count, readable = 0, False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines = handle.readlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count if readable else None


def serve_every_generation(path: str, heartbeat_s: int, polls: int | None = None) -> int:
    """Serve each generation that ``path`` publishes (see the module), forever (``polls``: as
    many rounds, for tests)."""
    serving: dict[int, tuple[int, Any]] = {}  # generation -> (port, service)
    superseded: dict[int, tuple[float, int]] = {}  # generation -> (since, polls with nobody connected)
    jax_installed = True
    watcher = MembershipWatcher(path)  # read only when the file was replaced
    while polls is None or polls > 0:
        polls = None if polls is None else polls - 1
        membership = watcher.poll()
        if membership is not None and membership.generation > max(serving, default=-1) and membership.world_size > 1 and jax_installed:
            for generation in serving:
                superseded.setdefault(generation, (time.monotonic(), 0))
            try:
                service = _service(EVERY_INTERFACE, membership.master_port, membership.world_size, heartbeat_s)
            except ImportError:  # a PyTorch workload's image: its workers need no service
                print("hotswap: no jaxlib in this image: no JAX coordination service to run", flush=True)
                jax_installed = False
                continue
            serving[membership.generation] = (membership.master_port, service)
            print(f"hotswap: serving generation {membership.generation} ({membership.world_size} processes) on port {membership.master_port}", flush=True)
        for generation, (since, idle) in list(superseded.items()):
            port, service = serving[generation]
            idle = idle + 1 if connections(port) == 0 else 0
            superseded[generation] = (since, idle)
            if idle >= 3 or time.monotonic() - since > ORPHAN_LIFETIME_S:
                service.shutdown()
                del serving[generation], superseded[generation]
        time.sleep(_POLL_S)
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--every-generation":
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        return serve_every_generation(argv[1], int(argv[2]))
    port, processes, heartbeat_s, parent = (int(value) for value in argv[1:])
    released = []
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGUSR1, lambda *_: released.append(True))
    service = _service(_listen_host(argv[0]), port, processes, heartbeat_s)  # noqa: F841  (serves while referenced)
    membership = os.environ.get(HOTSWAP_MEMBERSHIP_FILE)
    orphaned: float | None = None
    idle = 0  # polls in a row with nobody connected, once orphaned
    while True:
        time.sleep(_POLL_S)
        if membership and not os.path.exists(membership):
            return 0
        if orphaned is None and (released or os.getppid() != parent):
            orphaned = time.monotonic()
        if orphaned is None:
            continue
        idle = idle + 1 if connections(port) == 0 else 0
        if idle >= 3 or time.monotonic() - orphaned > ORPHAN_LIFETIME_S:
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
