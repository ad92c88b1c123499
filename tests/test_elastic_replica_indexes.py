"""Every live worker of an elastic workload has a replica index of its own, through a loss and
a grow-back: a joiner takes the parked index of the lost replica (as the Kubernetes backend's
replica map does), the survivors keep theirs, and each replica's log has one writer."""

from __future__ import annotations

import json
from pathlib import Path

from local_helpers import PYTHON, alive, cleanup, hotswap, live_workers, wait_until, workloads
import pytest

# A worker that records its indices (by its pid) and then says it is alive in its log.
WORKER = """
import json, os, time
keys = ("JOB_INDEX", "RANK", "MEGASCALE_SLICE_ID", "HOTSWAP_SLICE")
path = os.path.join(os.environ["ENVS"], f"{os.getpid()}.json")
with open(path + ".partial", "w") as f:
    json.dump({k: os.environ[k] for k in keys}, f)
os.rename(path + ".partial", path)
while True:
    print("alive", os.getpid(), flush=True)
    time.sleep(0.2)
"""


@pytest.fixture
def home(tmp_path: Path):
    state = tmp_path / "state"
    yield state
    cleanup(state)


def live_environments(envs: Path) -> dict[int, dict[str, str]]:
    return {int(p.stem): json.loads(p.read_text()) for p in envs.glob("*.json") if alive(int(p.stem))}


def running(home: Path, slices: int) -> bool:
    record = workloads(home, "c")["e"]
    rows = live_workers(home, "c", "e")
    return record["phase"] == "RUNNING" and len(record["slices"]) == slices and len(rows) == slices and all(r["pid"] for r in rows)


def test_a_joiner_takes_the_lost_replicas_index_and_no_two_workers_share_one(home: Path, tmp_path: Path) -> None:
    envs = tmp_path / "envs"
    envs.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "3", check=True)
    hotswap(
        home, "workload", "create", "--cluster", "c", "--workload", "e", "--command", f"{PYTHON} {script}",
        "--num-slices", "3", "--min-slices", "2", "--env", f"ENVS={envs}", check=True,
    )
    wait_until(lambda: running(home, 3) and len(live_environments(envs)) == 3, what="three workers")
    first = {env["HOTSWAP_SLICE"]: env for env in live_environments(envs).values()}
    lost = workloads(home, "c")["e"]["slices"][1]
    assert first[lost]["JOB_INDEX"] == "1"
    hotswap(home, "node", "fail", "--cluster", "c", "--slice", lost, check=True)
    wait_until(lambda: len(live_environments(envs)) == 2, what="the lost worker gone")
    hotswap(home, "node", "uncordon", "--cluster", "c", "--slice", lost, check=True)
    wait_until(lambda: running(home, 3) and len(live_environments(envs)) == 3, what="grown back")
    now = live_environments(envs)
    by_slice = {env["HOTSWAP_SLICE"]: env for env in now.values()}
    assert sorted(by_slice) == sorted(first)
    for name in ("JOB_INDEX", "RANK", "MEGASCALE_SLICE_ID"):
        assert sorted(env[name] for env in now.values()) == ["0", "1", "2"], (name, now)
    assert by_slice == first  # the survivors kept theirs; the joiner took the lost replica's 1
    # Each replica's log is written by one live worker: its own.
    logs = home / "clusters" / "c" / "workloads" / f"e-{workloads(home, 'c')['e']['seq']}" / "logs"

    def writers(replica: str) -> set[int]:
        lines = (logs / f"slice-{replica}-host-0.log").read_text().splitlines()
        return {int(line.split()[1]) for line in lines if line.startswith("alive ")} & set(now)

    wait_until(lambda: all(len(writers(str(i))) == 1 for i in range(3)), what="every live worker in its log")
    assert {pid: env["JOB_INDEX"] for pid, env in now.items()} == {
        next(iter(writers(str(i)))): str(i) for i in range(3)
    }
    # The repaired slice's log by its name is the joiner's.
    joiner = next(pid for pid, env in now.items() if env["HOTSWAP_SLICE"] == lost)
    wait_until(
        lambda: f"alive {joiner}" in hotswap(home, "workload", "logs", "--cluster", "c", "--workload", "e", "--slice", lost).stdout,
        what="the joiner's log by its slice's name",
    )


def test_the_elastic_demo_sees_a_shared_index_and_a_log_with_two_writers(tmp_path: Path) -> None:
    """What ``hotswap demo elastic`` checks after grow-back, from the workers' own environments
    (/proc) and logs: the defect as it was seen (two workers with JOB_INDEX=2, RANK=2, both
    appending to slice-2-host-0.log) fails the drill."""
    import os
    import subprocess
    import sys

    from hotswap.api.worker_output import restored_line, step_line
    from hotswap.demo.observe import process_environment, repeated_steps, shared_identities

    mine = process_environment(os.getpid())
    assert mine and mine.get("PATH") == os.environ.get("PATH")
    child = subprocess.Popen([sys.executable, "-c", "print(flush=True); import time; time.sleep(30)"], env={"JOB_INDEX": "7"},
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        child.stdout.readline()  # it runs: exec is done, so /proc shows its own environment, not ours
        assert process_environment(child.pid)["JOB_INDEX"] == "7"
    finally:
        child.kill()
        child.wait()
    assert process_environment(child.pid) == {}  # gone
    same = {"JOB_INDEX": "2", "RANK": "2", "MEGASCALE_SLICE_ID": "2"}
    assert shared_identities([{"JOB_INDEX": "0", "RANK": "0", "MEGASCALE_SLICE_ID": "0"}, same, dict(same)]) == [
        "JOB_INDEX=2 x2", "RANK=2 x2", "MEGASCALE_SLICE_ID=2 x2",
    ]
    assert shared_identities([{k: str(i) for k in same} for i in range(3)]) == []
    one_writer = [step_line(s, 3, 1) for s in range(1, 5)]
    assert repeated_steps([restored_line(4, "peer"), *one_writer]) == []
    two_writers = [*one_writer, restored_line(4, "peer"), step_line(5, 3, 1), step_line(5, 3, 1), step_line(6, 3, 1), step_line(6, 3, 1)]
    assert repeated_steps(two_writers) == [5, 6]
