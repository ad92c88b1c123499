"""Save leases (hotswap.train.save_leases): a restart's restoring rank waits for the survivors
of the attempt before it to finish their last save, and for nothing else (issue 33)."""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path

import pytest
from local_helpers import PYTHON, cleanup, hotswap, live_workers, wait_until, workloads

from hotswap.demo.observe import read_trace
from hotswap.train.save_leases import LEASES_DIR, STALE_S, SaveLeases


ROOT = Path(__file__).resolve().parents[1]


def lease_file(directory: Path, name: str, age_s: float = 0.0) -> Path:
    (directory / LEASES_DIR).mkdir(exist_ok=True)
    path = directory / LEASES_DIR / name
    path.touch()
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def restorer(directory: Path, attempt: int = 2) -> SaveLeases:
    leases = SaveLeases(directory, attempt, host="restorer-host")
    leases.hold()
    return leases


def test_without_an_earlier_lease_nothing_waits(tmp_path: Path) -> None:
    leases = restorer(tmp_path)
    lease_file(tmp_path, "2-other-host-10")  # a peer of its own attempt
    lease_file(tmp_path, "3-other-host-11")  # a later attempt
    assert leases.live_earlier() == []
    assert leases.wait_for_earlier(30.0) < 1.0
    leases.release()


def test_another_hosts_lease_is_live_while_renewed_and_stale_after(tmp_path: Path) -> None:
    leases = restorer(tmp_path)
    lease_file(tmp_path, "1-survivor-host-10")
    lease_file(tmp_path, "1-lost-host-11", age_s=STALE_S + 5)  # its node died: nobody renews it
    assert leases.live_earlier() == ["1-survivor-host-10"]
    leases.release()


def test_a_process_of_this_host_is_live_while_it_runs_and_its_lease_goes_with_it(tmp_path: Path) -> None:
    leases = SaveLeases(tmp_path, 2)  # this host
    leases.hold()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = lease_file(tmp_path, f"1-{leases.host}-{child.pid}", age_s=STALE_S + 5)  # old mtime: the pid decides
        assert leases.live_earlier() == [live.name]
    finally:
        child.kill()
        child.wait()
    assert leases.live_earlier() == []
    assert not live.exists()  # a killed holder's lease is removed
    leases.release()


def test_the_wait_ends_when_the_survivor_releases_and_is_bounded_by_the_grace_period(tmp_path: Path) -> None:
    survivor = SaveLeases(tmp_path, 1, host="survivor-host", pid=10)
    survivor.hold()
    leases = restorer(tmp_path)
    threading.Timer(0.3, survivor.release).start()
    waited = leases.wait_for_earlier(30.0)
    assert 0.2 < waited < 10.0 and leases.live_earlier() == []
    stuck = SaveLeases(tmp_path, 1, host="survivor-host", pid=11)
    stuck.hold()
    assert 0.5 <= leases.wait_for_earlier(0.5) < 10.0  # never past the limit
    stuck.release()
    leases.release()


def test_a_holder_renews_its_lease_in_the_background(tmp_path: Path) -> None:
    holder = SaveLeases(tmp_path, 1, host="h", pid=12)
    holder.hold()
    first = holder.path.stat().st_mtime
    deadline = time.monotonic() + 30
    while holder.path.stat().st_mtime == first and time.monotonic() < deadline:
        time.sleep(0.1)
    assert holder.path.stat().st_mtime > first
    holder.release()
    assert not holder.path.exists()


class FakeTime:
    """The wait's clock and sleep: time moves only when it sleeps; ``on_sleep(n)`` runs at the n-th sleep."""

    def __init__(self, on_sleep: Callable[[int], None] | None = None) -> None:
        self.now = 100.0
        self.sleeps = 0
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(self.sleeps)


def start_ticks(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process start times come from /proc")


@needs_proc
def test_a_reused_pid_of_this_host_is_not_the_holder(tmp_path: Path) -> None:
    """A worker killed here whose pid now belongs to a process that started later: gone at once."""
    leases = SaveLeases(tmp_path, 2)
    leases.hold()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        holder = lease_file(tmp_path, f"1-{leases.host}-{child.pid}")
        holder.write_text(f"{leases.namespace} {start_ticks(child.pid)}")
        assert leases.live_earlier() == [holder.name]
        holder.write_text(f"{leases.namespace} {int(start_ticks(child.pid)) - 1}")  # the holder started before it
        assert leases.live_earlier() == []
        assert not holder.exists()
    finally:
        child.kill()
        child.wait()
        leases.release()


@needs_proc
def test_a_pod_that_kept_the_host_name_is_judged_by_its_renewal_not_by_a_pid(tmp_path: Path) -> None:
    """A JobSet recreates its pods with the same host names, and the new pod's process may have
    the lost one's pid (here: the restorer's own, running): the old lease of another PID
    namespace is live while renewed and stale after, as another host's."""
    leases = SaveLeases(tmp_path, 2)
    leases.hold()
    name = f"1-{leases.host}-{os.getpid()}"
    lease_file(tmp_path, name).write_text(f"another-boot:4026531836 {start_ticks(os.getpid())}")
    assert leases.live_earlier() == [name]
    lease_file(tmp_path, name, age_s=STALE_S + 5)
    assert leases.live_earlier() == []
    leases.release()


def test_names_that_are_not_leases_are_ignored(tmp_path: Path) -> None:
    leases = restorer(tmp_path)
    for name in ("junk", "one-host-10", "1-host-pid", "1", ".1-host-10.tmp"):
        lease_file(tmp_path, name)
    assert leases.live_earlier() == []
    leases.release()


def test_the_wait_ends_at_the_limit_by_its_clock_while_the_lease_is_renewed(tmp_path: Path) -> None:
    survivor = lease_file(tmp_path, "1-survivor-host-10")
    fake = FakeTime(on_sleep=lambda _: os.utime(survivor))  # still renewed: a survivor stuck in its collective
    leases = restorer(tmp_path)
    waited = leases.wait_for_earlier(3.0, clock=fake.clock, sleep=fake.sleep)
    assert 3.0 <= waited < 3.1 and fake.sleeps >= 3.0 / 0.1
    assert leases.live_earlier() == [survivor.name]  # the limit ended the wait, not the lease
    leases.release()


def test_a_restore_takes_the_save_committed_while_it_waited(tmp_path: Path) -> None:
    """Rank 0 of attempt 2 restores (torch StateSync): the survivor of attempt 1, on another
    host, commits step 40 during the wait and releases its lease; step 40 is restored, not the
    periodic checkpoint of step 25."""
    torch = pytest.importorskip("torch")
    from hotswap.train.events import EventLog
    from hotswap.train.progress import Progress
    from hotswap.train.torch.checkpointer import Checkpointer
    from hotswap.train.torch.state import StateRegistry, build_tree
    from hotswap.train.torch.store import CheckpointStore
    from hotswap.train.torch.sync import StateSync

    def checkpoint(checkpointer: Checkpointer, step: int, reason: str) -> None:
        registry = StateRegistry()
        registry.register("weights", {"w": torch.full((3,), float(step))})
        checkpointer.save(step, build_tree(registry, Progress(step=step).counters(), [None]), reason)

    survivor = Checkpointer(CheckpointStore(tmp_path), EventLog(None))
    checkpoint(survivor, 25, "periodic")
    lease = SaveLeases(tmp_path, 1, host="survivor-host", pid=10)
    lease.hold()

    def survivor_saves(sleeps: int) -> None:
        if sleeps == 5:
            checkpoint(survivor, 40, "termination")
            lease.release()

    fake = FakeTime(on_sleep=survivor_saves)
    leases = restorer(tmp_path)
    leases.wait_for_earlier = functools.partial(  # type: ignore[method-assign]
        SaveLeases.wait_for_earlier, leases, clock=fake.clock, sleep=fake.sleep
    )
    weights = {"w": torch.zeros(3)}
    registry = StateRegistry()
    registry.register("weights", weights)
    progress = Progress()
    group = types.SimpleNamespace(rank=0, world_size=1)
    sync = StateSync(registry, Checkpointer(CheckpointStore(tmp_path), EventLog(None)), group, progress,  # type: ignore[arg-type]
                     EventLog(None), async_checkpoints=False, leases=leases, grace_period_s=30.0)
    sync.synchronise(lambda: False)
    assert fake.sleeps == 5 and progress.step == 40
    assert weights["w"].tolist() == [40.0, 40.0, 40.0]
    leases.release()


def test_a_restart_waits_for_the_survivors_save_of_a_slow_step(tmp_path: Path) -> None:
    """End to end, the GPT example with DDP under Recreate, steps of 3 s: the survivor sees
    its SIGTERM only when its step ends, well after the warm spare has started the new attempt,
    whose restoring rank waits for the survivor's save instead of taking the checkpoint before."""
    pytest.importorskip("torch")
    home = tmp_path / "state"
    try:
        hotswap(home, "cluster", "create", "--cluster", "w", "--device-type", "v6e-4", "--num-slices", "3", check=True)
        command = shlex.join([PYTHON, str(ROOT / "examples" / "train_gpt.py"), "--max-iters", "8",
                              "--checkpoint-every", "2", "--eval-interval", "100", "--step-sleep", "3"])
        hotswap(home, "workload", "create", "--cluster", "w", "--workload", "gpt", "--num-slices", "2",
                "--command", command, "--env", "OMP_NUM_THREADS=1", check=True)
        directory = home / "clusters" / "w" / "workloads" / "gpt-0"
        wait_until(lambda: max((s.step for s in read_trace(directory).steps), default=0) >= 3, timeout=180, what="3 steps")
        lost = next(w["slice"] for w in live_workers(home, "w", "gpt") if w["replica"] == 1)
        hotswap(home, "node", "fail", "--cluster", "w", "--slice", lost, check=True)
        final = wait_until(lambda: (r := workloads(home, "w")["gpt"])["phase"] in ("SUCCESSFUL", "FAILED") and r,
                           timeout=300, what="the end")
        assert final["phase"] == "SUCCESSFUL" and final["attempt"] == 2, final["status_message"]
        trace = read_trace(directory)
        survivor_last = max(s.step for s in trace.steps if s.attempt == 1 and s.replica == 0)
        restores = [r for r in trace.restores if r.attempt == 2]
        assert restores and all(r.step == survivor_last for r in restores), (survivor_last, restores)
    finally:
        cleanup(home)
