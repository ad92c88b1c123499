"""The zygote of a local cluster (backends/local/workers/zygote.py, zygotes.py): workers and spares made
by fork from one pre-imported process are, from the outside, the workers the shim starts, and a
dead zygote never costs a workload anything but the cold start.

What a test asserts comes from the workers' own records: each process says who its shim's
parent is (the zygote, or the controller for a cold start)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from local_helpers import alive, hotswap, query, wait_until, workloads
from local_helpers import home_in_env as home  # noqa: F401 (a fixture)

# The worker: one JSON line of what it is, then (first attempt) death by SIGUSR1, else a sleep.
JOB = """
import json, os, signal, sys, time
shim = os.getppid()
with open(f"/proc/{shim}/stat") as stat:
    shim_parent = int(stat.read().rsplit(")", 1)[1].split()[1])
print("RECORD " + json.dumps({
    "rank": os.environ["RANK"], "attempt": os.environ["HOTSWAP_ATTEMPT"], "cwd": os.getcwd(),
    "mine": os.environ.get("MINE"), "shim": shim, "shim_parent": shim_parent, "pgid": os.getpgid(0),
    "handed_over": "HOTSWAP_HANDED_OVER_AT" in os.environ, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
}), flush=True)
if os.environ["HOTSWAP_ATTEMPT"] == "1":
    os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(600)
"""


def zygote_pid(home: Path) -> int:
    ready = home / "clusters" / "c" / "zygote" / "ready"
    wait_until(ready.exists, timeout=60, what="the zygote to be ready")
    info = json.loads(ready.read_text())
    assert info["problem"] is None  # one thread, CUDA untouched: it may fork
    return int(info["pid"])


def records(home: Path) -> list[dict]:
    from hotswap.backends.local.queries import logs

    found = []
    for attempt_log in sorted(logs.log_file("c", "job", None, 0).parent.glob("*")):
        for line in attempt_log.read_text().splitlines():
            if line.startswith("RECORD "):
                found.append(json.loads(line.removeprefix("RECORD ")))
    return found


def submit(tmp_path: Path, *, max_restarts: int = 3) -> None:
    from hotswap.api.spec import workload_spec
    from hotswap.api.launch import Launch
    from hotswap.backends.local.commands import clusters as cluster_commands
    from hotswap.backends.local.commands import workloads as workload_commands
    from hotswap.backends.local.queries import clusters as cluster_queries

    (tmp_path / "job.py").write_text(JOB)
    launch = Launch(environ=dict(os.environ), cwd=str(tmp_path), checkpoint_dir=str(tmp_path / "ckpt"))
    spec = workload_spec(name="job", command=f"{sys.executable} job.py", device_type="v6e-4", max_restarts=max_restarts, env={"MINE": "mine"})
    workload_commands.create_workload("c", spec, launch)


def create(zygote: bool, spares: int = 0) -> None:
    from hotswap.backends.local.commands import clusters as cluster_commands
    from hotswap.backends.local.commands import workloads as workload_commands
    from hotswap.backends.local.queries import clusters as cluster_queries

    # The zygote preloads only the standard library here (the pool's preload list).
    cluster_commands.create_cluster("c", "v6e-4", 2, True, lambda _: True, warm_workers=spares, warm_preload=["json"], zygote=zygote)


def test_a_worker_forked_from_the_zygote_is_its_own_worker_and_restarts_from_it(home: Path, tmp_path: Path) -> None:
    from hotswap.backends.local.commands import clusters as cluster_commands
    from hotswap.backends.local.commands import workloads as workload_commands
    from hotswap.backends.local.queries import clusters as cluster_queries

    create(zygote=True)
    assert cluster_queries.describe_cluster("c")["zygote"] is True  # cluster describe says it has one
    zygote = zygote_pid(home)
    submit(tmp_path)
    wait_until(lambda: len(records(home)) >= 2, timeout=60, what="the first attempt and its restart")
    first, second = records(home)[:2]
    for record, attempt in ((first, "1"), (second, "2")):
        assert record["attempt"] == attempt and record["rank"] == "0"
        assert record["shim_parent"] == zygote  # forked by the zygote, no spare in the pool
        assert record["pgid"] == record["shim"]  # its own process group, led by its shim
        assert record["cwd"] == str(tmp_path) and record["mine"] == "mine"
        assert record["handed_over"]  # the restart's "spawn" phase is the fork
    rows = query(home, "c", "SELECT * FROM workers WHERE workload = 'job' ORDER BY id")
    assert rows[0]["exit_code"] == 128 + signal.SIGUSR1  # the shim's record: 128+N for a signal
    assert (Path(rows[0]["dir"]) / "exit").read_text().strip() == str(128 + signal.SIGUSR1)
    assert rows[1]["pid"] == second["shim"] and (Path(rows[1]["dir"]) / "started").exists()
    assert workloads(home, "c")["job"]["restarts"] == 1


def test_a_dead_zygote_falls_back_to_a_cold_start_and_says_so_once(home: Path, tmp_path: Path) -> None:
    create(zygote=True)
    zygote = zygote_pid(home)
    os.kill(zygote, signal.SIGKILL)
    wait_until(lambda: not alive(zygote), what="the zygote to die")
    submit(tmp_path)
    wait_until(lambda: len(records(home)) >= 2, timeout=60, what="the first attempt and its restart")
    controller = int((home / "clusters" / "c" / "controller.lock").read_text())
    for record in records(home)[:2]:
        assert record["shim_parent"] == controller and not record["handed_over"]  # cold: a shim of the controller
    log = (home / "clusters" / "c" / "controller.log").read_text()
    assert log.count("starting workers cold (without the zygote)") == 1


def test_the_pool_refills_by_fork_and_a_killed_controller_keeps_the_zygote(home: Path, tmp_path: Path) -> None:
    create(zygote=True, spares=1)
    zygote = zygote_pid(home)

    def spare_parents() -> list[int]:
        rows = query(home, "c", "SELECT * FROM workers WHERE state = 'warm' AND pid IS NOT NULL")
        return [int(open(f"/proc/{r['pid']}/stat").read().rsplit(")", 1)[1].split()[1]) for r in rows if alive(r["pid"])]

    wait_until(lambda: spare_parents() == [zygote], timeout=30, what="a spare forked by the zygote")
    controller = int((home / "clusters" / "c" / "controller.lock").read_text())
    os.kill(controller, signal.SIGKILL)
    wait_until(lambda: not alive(controller), what="the controller to die")
    submit(tmp_path)  # restarts the controller, which adopts the zygote and the spare
    wait_until(lambda: len(records(home)) >= 2, timeout=60, what="the first attempt and its restart")
    first, second = records(home)[:2]
    assert not first["handed_over"] or first["shim_parent"] == zygote
    assert second["shim_parent"] == zygote  # the spare (refilled by fork) or a fork: never cold
    assert zygote_pid(home) == zygote and alive(zygote)  # adopted, not started again
    wait_until(lambda: spare_parents() == [zygote], timeout=30, what="the pool refilled by fork")
    hotswap(home, "cluster", "delete", "--cluster", "c", "--force", check=True)
    wait_until(lambda: not alive(zygote), timeout=20, what="the zygote to stop with its cluster")


def test_forked_workers_get_fresh_seeds_and_a_zygote_with_threads_refuses_to_fork(tmp_path: Path) -> None:
    from spare_helpers import fork_worker, start_zygote

    from hotswap.backends.local.workers.zygotes import ZygoteUnusable

    process, ready = start_zygote(tmp_path / "zygote", ["numpy"])
    try:
        assert ready["problem"] is None  # numpy's OpenBLAS threads were stopped before it serves
        draws = "import random, numpy\nprint('DRAW', random.random(), numpy.random.rand(), flush=True)\n"
        env = {"PATH": os.environ["PATH"]}
        outputs = [fork_worker(tmp_path / "zygote", tmp_path / f"w{i}", env, draws) for i in range(2)]
        assert [code for code, _ in outputs] == [0, 0]
        lines = [next(line for line in log.splitlines() if line.startswith("DRAW")) for _, log in outputs]
        first, second = (line.split()[1:] for line in lines)
        assert first[0] != second[0] and first[1] != second[1]  # neither generator shared with a sibling
    finally:
        process.terminate()
        process.wait()
    # A preload that leaves a thread running: forking would copy a process without it.
    (tmp_path / "threaded.py").write_text("import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    os.environ["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    try:
        process, ready = start_zygote(tmp_path / "threaded-zygote", ["threaded"])
    finally:
        os.environ["PYTHONPATH"] = os.environ["PYTHONPATH"].split(os.pathsep, 1)[1]
    try:
        assert ready["problem"] == "the zygote runs 2 threads"
        with pytest.raises(ZygoteUnusable, match="cannot fork: the zygote runs 2 threads"):
            fork_worker(tmp_path / "threaded-zygote", tmp_path / "w-threaded", {"PATH": os.environ["PATH"]}, "print(1)\n")
    finally:
        process.terminate()
        process.wait()


def test_a_cluster_deleted_while_its_zygote_still_imports_is_deleted(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller stopped the zygote by removing its ready file; one still importing had
    none yet, so the controller waited for it forever and `cluster delete` never returned."""
    import threading

    from hotswap.backends.local.commands import clusters as cluster_commands

    from hotswap.backends.local.commands import workloads as workload_commands

    from hotswap.backends.local.queries import clusters as cluster_queries

    (tmp_path / "slow_import_for_zygote.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    cluster_commands.create_cluster("c", "v6e-4", 1, True, lambda _: True, warm_workers=0, warm_preload=["slow_import_for_zygote"], zygote=True)
    wait_until(lambda: bool(zygote_processes()), timeout=30, what="the zygote importing")
    deleting = threading.Thread(target=cluster_commands.delete_cluster, args=("c",), daemon=True)
    deleting.start()
    deleting.join(timeout=60)  # a hang guard, not a measurement
    assert not deleting.is_alive(), "cluster delete hangs on a zygote that still imports"
    assert not zygote_processes()


def zygote_processes() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"slow_import_for_zygote" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def test_a_fork_the_controller_gave_up_on_never_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A zygote that answers after the controller's timeout forked the shim anyway: the worker
    (started cold meanwhile) ran twice, the late one recorded nowhere. Now the forked shim runs
    only once the controller says so, and exits at once when it gave up."""
    import dataclasses
    import fcntl
    import time

    from spare_helpers import start_zygote

    from hotswap.backends.local.tables import SPARE
    from hotswap.backends.local.workers import zygotes
    from hotswap.backends.local.workers.supervisor import WorkerLaunch
    from hotswap.backends.local.workers.zygote import SLOW_FORK_VARIABLE

    monkeypatch.setenv(SLOW_FORK_VARIABLE, "2")  # it forks 2 s after the request ...
    monkeypatch.setattr(zygotes, "REPLY_TIMEOUT_S", 0.2)  # ... and is given up on long before
    process, _ = start_zygote(tmp_path / "zygote", [])
    spare_dir = tmp_path / "spare"
    spare_dir.mkdir()
    lock = os.open(spare_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        zygote = zygotes.Zygote(tmp_path, [], {})
        launch = WorkerLaunch(dataclasses.replace(SPARE), spare_dir, spare_dir / "log", "", str(spare_dir), {"PATH": os.environ["PATH"]})
        with pytest.raises(zygotes.ZygoteUnusable, match="did not answer: timed out"):
            zygote.fork(launch, lock, {"spare": str(spare_dir)})
        # The next starts go cold at once rather than wait on it again, each of them.
        with pytest.raises(zygotes.ZygoteUnusable, match="did not answer a moment ago"):
            zygote.fork(launch, lock, {"spare": str(spare_dir)})
    finally:
        os.close(lock)

    def lock_free() -> bool:  # the zygote and any shim it forked have let the start lock go
        probe = os.open(spare_dir / "lock", os.O_RDWR)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(probe)

    try:
        deadline = time.monotonic() + 120  # a hang guard, not a measurement
        while not lock_free() and not (spare_dir / "pid").exists():
            assert time.monotonic() < deadline, "the late fork neither ran nor ended"
            time.sleep(0.05)
        assert not (spare_dir / "pid").exists(), "the shim forked after the controller gave up runs"
    finally:
        process.kill()
        process.wait()


def test_a_stopped_zygote_is_stopped_without_holding_the_controller(tmp_path: Path) -> None:
    """The controller stopped the zygote with SIGTERM and waited for it: a zygote stopped with
    SIGSTOP (a debugger, a frozen cgroup) never acted on it, and `cluster delete` hung."""
    import threading

    from hotswap.backends.local.workers.zygotes import Zygote

    zygote = Zygote(tmp_path, [], dict(os.environ))
    zygote.start()
    wait_until(lambda: zygote.info() is not None, timeout=60, what="the zygote to be ready")
    assert zygote.process is not None
    pid = zygote.process.pid
    os.kill(pid, signal.SIGSTOP)
    stopping = threading.Thread(target=zygote.stop, daemon=True)
    stopping.start()
    stopping.join(timeout=60)  # a hang guard, not a measurement
    try:
        assert not stopping.is_alive(), "stopping a stopped zygote hangs"
        assert not alive(pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
