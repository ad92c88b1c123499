"""Removing a local cluster (``cluster delete``), in steps that can be cut short and run again.

1. A ``shutdown`` request commits that the cluster is being deleted. From then on every
   controller of the cluster stops every worker and exits, serving nothing else.
2. The CLI waits for the cluster's lock, which the controller releases once its last worker
   is gone; if a controller was killed half-way, it starts one to finish. A controller that
   holds the lock past every grace period (and 20 s more) is killed.
3. Holding the lock (no controller can start meanwhile), it ends every process of the cluster
   still running (``leftovers.py``: what no record names, the controller that just let go),
   renames the cluster's directory to a tombstone, which no command sees, and removes it.

Ctrl-C or a crash at any step leaves a cluster that ``cluster delete`` finishes. A cluster
whose database cannot be read any more is removed too: its controller and workers are found
through their pid files (pid and kernel start time, so no other process is ever signalled).
Checkpoints live outside the cluster's directory and are kept.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
import uuid
from pathlib import Path

from hotswap.api.errors import ConflictError
from hotswap.backends.local.commands import client
from hotswap.backends.local import protocol
from hotswap.backends.local import leftovers
from hotswap.backends.local.claim import AlreadyClaimed, Claim, holder_pid
from hotswap.backends.local.protocol import DONE
from hotswap.api.processes import start_ticks
from hotswap.store import faults
from hotswap.store.paths import ClusterPaths
from hotswap.backends.local.tables import LIVE_WORKER_STATES, LocalStore

TOMBSTONE_PREFIX = ".deleted-"
MAX_CONTROLLER_RUNS = 3
STRAGGLER_GRACE_S = 10.0


def delete_cluster(paths: ClusterPaths) -> None:
    try:
        readable = _begin(paths)
    except Exception as error:
        if not faults.unreadable(error):
            raise
        readable = False
    if readable:
        _finish(paths)
    else:
        _remove_unreadable(paths)


def _begin(paths: ClusterPaths) -> bool:
    """Step 1, unless an earlier `cluster delete` took it; False if the database is unreadable."""
    from hotswap.backends.local.requests import Shutdown  # loaded for requests only (see requests.py)

    with LocalStore.open(paths.database) as store:
        store.cluster()  # a cluster without a readable record is removed the hard way
        if store.deleted():
            return True
    outcome = client.request(paths, Shutdown())
    if outcome.status != DONE:
        raise ConflictError(outcome.message)
    return True


def _finish(paths: ClusterPaths) -> None:
    """Steps 2 and 3."""
    timeout = _longest_grace(paths) + 20.0
    for _ in range(MAX_CONTROLLER_RUNS):
        with _claimed(paths, timeout) as claim:
            if claim is None:
                return  # removed meanwhile (a concurrent `cluster delete`)
            if not _anything_alive(paths):
                _end_and_remove(paths)
                return
        client.run_controller(paths, timeout)  # a controller stopped half-way: it finishes
    with _claimed(paths, timeout) as claim:  # each controller had every grace period: end the rest
        if claim is not None:
            _end_and_remove(paths)


@contextlib.contextmanager
def _claimed(paths: ClusterPaths, timeout: float):
    """The cluster's lock (None: the cluster is gone). A controller that still holds it after
    ``timeout`` (every grace period, and more) stops no worker any more: it is killed."""
    try:
        claim = Claim.take(paths, wait_s=timeout)
    except FileNotFoundError:
        yield None
        return
    except AlreadyClaimed:
        claim = _take_from_stuck_controller(paths)
    try:
        yield claim
    finally:
        claim.release()


def _take_from_stuck_controller(paths: ClusterPaths) -> Claim:
    with contextlib.suppress(Exception), LocalStore.open(paths.database) as store:
        stuck = holder_pid(store)
        if stuck is not None:
            os.kill(stuck, signal.SIGKILL)
    try:
        return Claim.take(paths, wait_s=STRAGGLER_GRACE_S)
    except AlreadyClaimed:  # not a controller: another `cluster delete` removing it
        raise ConflictError(
            f"the controller of cluster {paths.name} is still stopping its workers; run"
            f" `hotswap cluster delete --cluster {paths.name}` again"
        ) from None


def _end_and_remove(paths: ClusterPaths) -> None:
    """Holding the cluster: end whatever of it still runs (the controller that just let go of it
    included: "cluster deleted" is said once it is gone), then remove it."""
    leftovers.end_cluster_processes(paths.root)
    _remove_directory(paths)


def _longest_grace(paths: ClusterPaths) -> float:
    with LocalStore.open(paths.database) as store:
        return max((float(r["spec"]["termination_grace_period_s"]) for r in store.workload_records()), default=0.0)


def _anything_alive(paths: ClusterPaths) -> bool:
    """Whether a worker or spare of the cluster may still run (by the database's account)."""
    with LocalStore.open(paths.database) as store:
        return bool(store.worker_rows.select((*LIVE_WORKER_STATES, "warm")))


def _remove_directory(paths: ClusterPaths) -> None:
    """Rename the directory away (atomic: every command stops seeing the cluster at once),
    then remove it and any tombstone an interrupted deletion left."""
    tombstone = paths.root.with_name(f"{TOMBSTONE_PREFIX}{paths.name}-{uuid.uuid4().hex[:8]}")
    os.rename(paths.root, tombstone)
    remove_tombstones(paths.root.parent)


def remove_tombstones(clusters: Path) -> None:
    for leftover in clusters.glob(f"{TOMBSTONE_PREFIX}*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _remove_unreadable(paths: ClusterPaths) -> None:
    """A cluster whose database cannot be read: stop its controller and its workers by their
    pid files, then remove it."""
    controller = _process(paths.pid_file, protocol.CONTROLLER_MODULE)
    if controller is not None:
        os.kill(controller, signal.SIGTERM)
    with _claimed(paths, timeout=STRAGGLER_GRACE_S) as claim:
        if claim is None:
            return
        groups = [pid for pid in map(_worker_process, paths.root.glob("workloads/*/workers/*/pid")) if pid]
        groups += [pid for pid in map(_worker_process, paths.root.glob("spares/*/pid")) if pid]
        _stop_groups(groups)
        _end_and_remove(paths)


def _process(pid_file: Path, marker: str) -> int | None:
    """The pid in ``pid_file`` if that process runs ``marker`` (a controller of this cluster)."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text().split()[0])
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        if marker in command and str(pid_file.parent) in command:
            return pid
    return None


def _worker_process(pid_file: Path) -> int | None:
    """The pid of a worker's shim if it still runs (its pid file holds the pid and the kernel
    start time, so a pid reused by another process is never taken for it)."""
    with contextlib.suppress(OSError, ValueError):
        pid_text, ticks_text = pid_file.read_text().split()
        if start_ticks(int(pid_text)) == int(ticks_text):
            return int(pid_text)
    return None


def _stop_groups(groups: list[int]) -> None:
    """SIGTERM each worker's process group, SIGKILL what is left after the grace."""
    for number in (signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, number)
        deadline = time.monotonic() + STRAGGLER_GRACE_S
        while number == signal.SIGTERM and any(start_ticks(g) is not None for g in groups):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
