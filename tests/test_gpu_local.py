"""GPU-backed slices on the local backend, end to end through the CLI, on a fake NVML layer
(tests/fake_nvml.py) so that CI needs no GPU: claims, what workers see, one process per GPU,
never two processes on one GPU, GPU health (XIDs, ECC, lost GPUs) and NVML failures."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fake_nvml import FakeMachine
from local_helpers import PYTHON, home, live_workers, query, wait_until, write_sleeper  # noqa: F401 (home: a fixture)

from hotswap.backends.local.workers import shim
from hotswap.backends.local.controller import gpu_health

# A worker that writes what it was started with, then waits (SIGTERM: it lingers, then exits 143).
ENV_PROBE = textwrap.dedent(
    """
    import json, os, signal, sys, time
    names = ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE",
             "HOTSWAP_SLICE", "HOTSWAP_EVENTS_FILE", "HOTSWAP_WORKLOAD", "HOTSWAP_ATTEMPT"]
    seen = {n: os.environ.get(n) for n in names}
    tag = f"{seen['HOTSWAP_WORKLOAD']}-{seen['HOTSWAP_ATTEMPT']}-{seen['RANK']}"
    marks = os.environ["MARKS"]
    with open(os.path.join(marks, tag + ".json"), "w") as f:
        json.dump({**seen, "start": time.time(), "pid": os.getpid()}, f)
    def on_term(*_):
        time.sleep(float(os.environ.get("LINGER", "0")))
        with open(os.path.join(marks, tag + ".stop"), "w") as f:
            f.write(repr(time.time()))
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    time.sleep(float(os.environ.get("RUN_FOR", "600")))
    """
)


@pytest.fixture
def probe(tmp_path: Path) -> tuple[Path, str]:
    """The directory ENV_PROBE workers write to, and the command that runs one."""
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "env_probe.py"
    script.write_text(ENV_PROBE)
    return marks, f"{PYTHON} {script}"


class Cli:
    """The CLI as a user runs it, on a machine whose NVML is the fake one."""

    def __init__(self, home: Path, machine: FakeMachine | None) -> None:
        self.home = home
        self.machine = machine

    def __call__(self, *args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, HOTSWAP_HOME=str(self.home), **(self.machine.environ() if self.machine else {}))
        result = subprocess.run([PYTHON, "-m", "hotswap", *args], capture_output=True, text=True, env=env, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"hotswap {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    def json(self, *args: str) -> object:
        return json.loads(self(*args, "--output", "json", check=True).stdout)


def one_line_error(result: subprocess.CompletedProcess[str], words: str) -> None:
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.stderr, result.stderr


def timeline(home: Path, cluster: str, kind: str | None = None) -> list[str]:
    rows = query(home, cluster, "SELECT kind, message FROM events ORDER BY id")
    return [r["message"] for r in rows if kind is None or r["kind"] == kind]


def test_slices_are_backed_by_gpus_and_show_their_indices_and_uuids(home: Path, tmp_path: Path) -> None:
    machine = FakeMachine(tmp_path, gpus=4)
    cli = Cli(home, machine)
    summary = cli.json("cluster", "create", "--cluster", "g", "--device-type", "local-gpu-2", "--gpus", "all")
    assert summary["num_slices"] == 2 and summary["backing"] == "gpu" and summary["gpus_per_host"] == 2
    assert [[g["index"] for g in s["gpus"]] for s in summary["slices"]] == [[0, 1], [2, 3]]
    nodes = cli.json("node", "list", "--cluster", "g")
    assert [[g["uuid"] for g in n["gpus"]] for n in nodes] == [[machine.uuid(0), machine.uuid(1)], [machine.uuid(2), machine.uuid(3)]]
    table = cli("node", "list", "--cluster", "g", check=True).stdout
    assert "GPUs (index UUID)" in table and machine.uuid(3) in table
    described = cli("cluster", "describe", "--cluster", "g", check=True).stdout
    assert "GPU-backed" in described and f"2 {machine.uuid(2)}" in described
    # An emulated cluster says so, and its nodes have no GPU.
    cli("cluster", "create", "--cluster", "e", "--device-type", "local-gpu-1", "--num-slices", "1", check=True)
    assert cli.json("cluster", "describe", "--cluster", "e")["backing"] == "emulated"
    assert cli.json("node", "list", "--cluster", "e")[0]["gpus"] == []


def test_bad_gpu_requests_are_one_line_and_create_nothing(home: Path, tmp_path: Path) -> None:
    machine = FakeMachine(tmp_path, gpus=2)
    cli = Cli(home, machine)
    cases = [
        (["--device-type", "local-gpu-1", "--gpus", "device=5"], "no GPU 5 on this machine (it has GPUs 0-1"),
        (["--device-type", "local-gpu-1", "--gpus", "device=1,1"], "names GPU 1 (GPU-fake-0001) twice"),
        (["--device-type", "local-gpu-1", "--gpus", "3"], "3 GPU(s) needed; 2 of this machine's 2 are free"),
        (["--device-type", "v6e-4", "--gpus", "all"], "v6e-4 is a TPU type"),
        (["--device-type", "local-gpu-1", "--gpus", "zero"], "--gpus zero: use all"),
        (["--device-type", "local-gpu-1", "--gpus", "2", "--num-slices", "1"], "1 slice(s) of 1 need 1"),
    ]
    for flags, words in cases:
        one_line_error(cli("cluster", "create", "--cluster", "bad", *flags), words)
        assert not (home / "clusters" / "bad").exists(), flags
    one_line_error(cli("cluster", "create", "--cluster", "bad", "--backend", "kubernetes", "--device-type", "local-gpu-1"),
                   "local-gpu-1 is a local-only device type")
    machine.update(init_error="NVML Shared Library Not Found")
    one_line_error(
        cli("cluster", "create", "--cluster", "bad", "--device-type", "local-gpu-1", "--gpus", "all"),
        "without NVML, slices can only be emulated",
    )
    assert not (home / "clusters" / "bad").exists()
    # Without --gpus nothing asks NVML: an emulated cluster is made as ever.
    cli("cluster", "create", "--cluster", "fine", "--device-type", "local-gpu-1", "--num-slices", "1", check=True)
    machine.update(init_error=None)
    one_line_error(cli("cluster", "create", "--cluster", "fine", "--device-type", "local-gpu-1", "--gpus", "all"),
                   "cluster fine is emulated: its slices cannot take GPUs")
    cli("cluster", "create", "--cluster", "a", "--device-type", "local-gpu-1", "--gpus", "device=1", check=True)
    one_line_error(cli("cluster", "create", "--cluster", "b", "--device-type", "local-gpu-1", "--gpus", "device=1"),
                   "GPU 1 (GPU-fake-0001) is held by local cluster a")
    assert not (home / "clusters" / "b").exists()


def test_concurrent_creates_never_take_the_same_gpu(home: Path, tmp_path: Path) -> None:
    machine = FakeMachine(tmp_path, gpus=1)
    cli = Cli(home, machine)
    for attempt in range(2):
        names = [f"r{attempt}a", f"r{attempt}b"]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = list(pool.map(
                lambda name: cli("cluster", "create", "--cluster", name, "--device-type", "local-gpu-1", "--gpus", "all"),
                names,
            ))
        won = [n for n, r in zip(names, results) if r.returncode == 0]
        lost = [r for r in results if r.returncode != 0]
        assert len(won) == 1 and len(lost) == 1, [r.stderr for r in results]
        assert "1 GPU(s) needed; 0 of this machine's 1 are free (the others are held by" in lost[0].stderr
        cli("cluster", "delete", "--cluster", won[0], check=True)  # gives the GPU back


def test_a_backed_cluster_grows_onto_free_gpus_and_shrinking_gives_them_back(home: Path, tmp_path: Path) -> None:
    machine = FakeMachine(tmp_path, gpus=3)
    cli = Cli(home, machine)
    cli("cluster", "create", "--cluster", "g", "--device-type", "local-gpu-1", "--gpus", "device=2", check=True)
    grown = cli.json("cluster", "create", "--cluster", "g", "--device-type", "local-gpu-1", "--num-slices", "3")
    assert [s["gpus"][0]["index"] for s in grown["slices"]] == [2, 0, 1]  # the first slice keeps its GPU
    one_line_error(cli("cluster", "create", "--cluster", "h", "--device-type", "local-gpu-1", "--gpus", "1"),
                   "0 of this machine's 3 are free")
    cli("cluster", "create", "--cluster", "g", "--device-type", "local-gpu-1", "--num-slices", "1", "--force", check=True)
    taken = cli.json("cluster", "create", "--cluster", "h", "--device-type", "local-gpu-1", "--gpus", "2")
    assert sorted(s["gpus"][0]["index"] for s in taken["slices"]) == [0, 1]


def test_workers_see_only_their_slices_gpus_one_process_each(home: Path, tmp_path: Path, probe: tuple[Path, str]) -> None:
    machine = FakeMachine(tmp_path, gpus=4)
    cli = Cli(home, machine)
    marks, command = probe
    cli("cluster", "create", "--cluster", "g", "--device-type", "local-gpu-2", "--gpus", "all", check=True)
    cli("workload", "create", "--cluster", "g", "--workload", "w", "--num-slices", "2", "--max-restarts", "1",
        "--command", command, "--env", f"MARKS={marks}", check=True)
    seen = wait_until(lambda: _marks(marks) if len(_marks(marks)) == 4 else None, timeout=60, what="4 processes")
    by_rank = {int(m["RANK"]): m for m in seen}
    assert sorted(by_rank) == [0, 1, 2, 3]
    assert [(by_rank[r]["CUDA_VISIBLE_DEVICES"], by_rank[r]["LOCAL_RANK"]) for r in range(4)] == [
        ("0,1", "0"), ("0,1", "1"), ("2,3", "0"), ("2,3", "1"),
    ]
    assert {(m["WORLD_SIZE"], m["LOCAL_WORLD_SIZE"], m["CUDA_DEVICE_ORDER"]) for m in seen} == {("4", "2", "PCI_BUS_ID")}
    assert len({m["HOTSWAP_EVENTS_FILE"] for m in seen}) == 4  # each process its own events file
    assert len(live_workers(home, "g", "w")) == 2  # one supervised worker per host
    logs = sorted(p.name for p in next((home / "clusters" / "g" / "workloads").rglob("logs")).iterdir())
    assert logs == ["slice-0-host-0.local1.log", "slice-0-host-0.log", "slice-1-host-0.local1.log", "slice-1-host-0.log"]
    # One process of a host fails: the shim stops its sibling, the worker exits with the first failure.
    os.kill(by_rank[1]["pid"], signal.SIGKILL)
    wait_until(lambda: _record(home, "g", "w")["attempt"] == 2, timeout=60, what="a restart after the failure")
    cli("workload", "delete", "--cluster", "g", "--workload", "w", check=True)
    # On an emulated cluster the variable is set and empty: no GPU, even on a machine that has some.
    for stale in marks.iterdir():
        stale.unlink()
    cli("cluster", "create", "--cluster", "e", "--device-type", "local-gpu-2", "--num-slices", "1", check=True)
    cli("workload", "create", "--cluster", "e", "--workload", "w", "--command", command,
        "--env", f"MARKS={marks}", check=True)
    (emulated,) = wait_until(lambda: _marks(marks) or None, timeout=60, what="the emulated worker")
    assert (emulated["CUDA_VISIBLE_DEVICES"], emulated["LOCAL_WORLD_SIZE"], emulated["CUDA_DEVICE_ORDER"]) == ("", "1", None)


def _marks(directory: Path) -> list[dict]:
    found = []
    for path in directory.glob("*.json"):
        try:
            found.append(json.loads(path.read_text()))
        except ValueError:
            continue
    return found


def _record(home: Path, cluster: str, name: str) -> dict:
    rows = query(home, cluster, "SELECT record FROM workloads")
    return next(json.loads(r["record"]) for r in rows if json.loads(r["record"])["spec"]["name"] == name)


def test_a_job_that_takes_a_gpu_waits_until_the_previous_one_has_left_it(home: Path, tmp_path: Path, probe: tuple[Path, str]) -> None:
    machine = FakeMachine(tmp_path, gpus=1)
    cli = Cli(home, machine)
    marks, command = probe
    cli("cluster", "create", "--cluster", "g", "--device-type", "local-gpu-1", "--gpus", "all", check=True)
    cli("workload", "create", "--cluster", "g", "--workload", "low", "--priority", "low", "--command", command,
        "--env", f"MARKS={marks}", "--env", "LINGER=2", check=True)
    wait_until(lambda: (marks / "low-1-0.json").exists(), timeout=60, what="low to start")
    cli("workload", "create", "--cluster", "g", "--workload", "high", "--priority", "high", "--command", command,
        "--env", f"MARKS={marks}", check=True)
    wait_until(lambda: (marks / "high-1-0.json").exists(), timeout=60, what="high to start")
    low_left = float((marks / "low-1-0.stop").read_text())
    high_started = json.loads((marks / "high-1-0.json").read_text())["start"]
    assert high_started > low_left  # never two processes on one GPU
    log = next((home / "clusters" / "g" / "workloads").glob("high-*/logs/slice-0-host-0.log")).read_text()
    assert "waits for low" in log


def watched_cluster(home: Path, tmp_path: Path, gpus: int) -> tuple[FakeMachine, Cli, str]:
    """A cluster g with a slice per fake GPU, once its health probe watches them; and a sleeper."""
    machine = FakeMachine(tmp_path, gpus=gpus)
    cli = Cli(home, machine)
    cli("cluster", "create", "--cluster", "g", "--device-type", "local-gpu-1", "--gpus", "all", check=True)
    wait_until(lambda: timeline(home, "g", "gpu-health"), timeout=30, what="the health probe to start")
    return machine, cli, write_sleeper(tmp_path)


def test_hardware_faults_fail_the_node_and_hotswap_application_xids_do_not(home: Path, tmp_path: Path) -> None:
    machine, cli, sleeper = watched_cluster(home, tmp_path, gpus=3)
    assert "watching GPU 0" in timeline(home, "g", "gpu-health")[-1]
    cli("workload", "create", "--cluster", "g", "--workload", "w", "--command", sleeper, check=True)
    first = _record(home, "g", "w")["slices"][0]
    index = int(first.rsplit("-", 1)[1])
    # An application error: recorded, the node stays Ready, nothing moves.
    machine.xid(index, 31)
    wait_until(lambda: timeline(home, "g", "gpu-xid"), timeout=30, what="the XID to be recorded")
    assert "XID 31 (GPU memory page fault)" in timeline(home, "g", "gpu-xid")[-1] and "application error" in timeline(home, "g", "gpu-xid")[-1]
    assert _node(cli, f"{first}-0")["state"] == "Ready" and _record(home, "g", "w")["slices"] == [first]
    # A GPU that fell off the bus: its node fails with the reason, the job is hotswapped.
    machine.xid(index, 79)
    failed = wait_until(lambda: (n := _node(cli, f"{first}-0"))["state"] == "Failed" and n, timeout=30, what="the node to fail")
    assert "XID 79 (GPU has fallen off the bus)" in failed["reason"] and machine.uuid(index) in failed["reason"]
    moved = wait_until(lambda: (r := _record(home, "g", "w"))["slices"] != [first] and r["phase"] == "RUNNING" and r,
                       timeout=30, what="the hotswap")
    assert moved["disruptions"] == 1 and moved["restarts"] == 0
    assert any("XID 79" in m for m in timeline(home, "g", "node-failed"))
    # New uncorrectable ECC errors and a lost GPU take their nodes out too.
    second = moved["slices"][0]
    machine.reading(int(second.rsplit("-", 1)[1]), ecc_uncorrected=0)
    time.sleep(2 * gpu_health.READING_INTERVAL_S + 1)  # the baseline is read
    machine.reading(int(second.rsplit("-", 1)[1]), ecc_uncorrected=2)
    node = wait_until(lambda: (n := _node(cli, f"{second}-0"))["state"] == "Failed" and n, timeout=30, what="ECC")
    assert "2 new uncorrectable ECC error(s)" in node["reason"]
    third = next(s for s in (f"g-np-{i}" for i in range(3)) if s not in (first, second))
    machine.reading(int(third.rsplit("-", 1)[1]), reachable=False, problem="GPU is lost")
    node = wait_until(lambda: (n := _node(cli, f"{third}-0"))["state"] == "Failed" and n, timeout=30, what="a lost GPU")
    assert "lost or unreachable (GPU is lost)" in node["reason"]
    # Repaired: Ready again, no reason.
    machine.update(readings={})
    cli("node", "uncordon", "--cluster", "g", "--node", f"{first}-0", check=True)
    assert _node(cli, f"{first}-0")["state"] == "Ready" and _node(cli, f"{first}-0")["reason"] is None


def _node(cli: Cli, name: str) -> dict:
    return next(n for n in cli.json("node", "list", "--cluster", "g") if n["name"] == name)  # type: ignore[union-attr]


def test_a_controller_that_loses_nvml_keeps_scheduling_and_says_so(home: Path, tmp_path: Path) -> None:
    machine, cli, sleeper = watched_cluster(home, tmp_path, gpus=1)
    machine.update(fail="the driver went away")
    lost = wait_until(lambda: [m for m in timeline(home, "g", "gpu-health") if "not being checked" in m], timeout=30,
                      what="the controller to say NVML is lost")
    assert "NVML failed: fake NVML: the driver went away" in lost[0]
    assert "not being checked" in cli.json("cluster", "describe", "--cluster", "g")["gpu_health"]["message"]
    cli("workload", "create", "--cluster", "g", "--workload", "w", "--command", sleeper, check=True)
    wait_until(lambda: _record(home, "g", "w")["phase"] == "RUNNING", timeout=30, what="scheduling to go on")
    assert _node(cli, "g-np-0-0")["state"] == "Ready"  # losing NVML says nothing about the GPU
    machine.update(fail=None)
    wait_until(lambda: "NVML answers again" in timeline(home, "g", "gpu-health")[-1], timeout=60, what="NVML back")
    log = (home / "clusters" / "g" / "controller.log").read_text()
    assert "GPU health is not being checked" in log


def test_the_shim_runs_a_process_per_gpu_and_reports_the_first_failure(tmp_path: Path) -> None:
    worker = tmp_path / "worker"
    worker.mkdir()
    script = tmp_path / "local.py"
    script.write_text(textwrap.dedent(
        """
        import os, signal, sys, time
        rank = int(os.environ["LOCAL_RANK"])
        print("local rank", rank, flush=True)
        if os.environ.get("FAIL") == str(rank):
            sys.exit(3)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        time.sleep(float(os.environ.get("RUN_FOR", "0")))
        """
    ))
    logs = [tmp_path / "host.log", tmp_path / "host.local1.log"]
    (worker / "local.json").write_text(json.dumps([{"env": {"LOCAL_RANK": "1"}, "log": str(logs[1])}]))

    def run(**env: str) -> int:
        environ = {**os.environ, "LOCAL_RANK": "0", "HOTSWAP_TERMINATION_GRACE_S": "5", **env}
        with open(worker / "lock", "w") as lock:
            command = [sys.executable, "-S", shim.__file__, str(worker), str(logs[0]), str(lock.fileno()), "--", f"{PYTHON} {script}"]
            return subprocess.run(command, env=environ, timeout=60, pass_fds=(lock.fileno(),)).returncode

    assert run() == 0
    assert "local rank 0" in logs[0].read_text() and "local rank 1" in logs[1].read_text()
    assert run(FAIL="1", RUN_FOR="30") == 3  # rank 1 fails at once; rank 0 is stopped, not waited for
    assert "stopping its 1 other(s)" in logs[0].read_text()
    assert (worker / "exit").read_text().strip() == "3"
