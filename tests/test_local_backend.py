"""The local backend end to end: real controller daemons, real worker processes (tiny
``python`` scripts, no torch), driven through the CLI as a user drives it."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from local_helpers import (
    alive,
    cleanup,
    hotswap,
    live_workers,
    query,
    wait_until,
    workloads,
    write_sleeper,
)


@pytest.fixture
def home(tmp_path: Path):
    state = tmp_path / "state"
    yield state
    cleanup(state)


@pytest.fixture
def sleeper(tmp_path: Path) -> str:
    return write_sleeper(tmp_path)


def create_cluster(home: Path, slices: int = 3, device: str = "v6e-4", name: str = "c") -> None:
    hotswap(home, "cluster", "create", "--cluster", name, "--device-type", device, "--num-slices", str(slices), check=True)


def create(home: Path, name: str, command: str, *flags: str, cluster: str = "c") -> None:
    hotswap(home, "workload", "create", "--cluster", cluster, "--workload", name, "--command", command, *flags, check=True)


def status(home: Path, name: str, cluster: str = "c") -> tuple[str, list[str]]:
    record = workloads(home, cluster)[name]
    return record["phase"], record["slices"]


def running_on(home: Path, name: str, slices: int) -> bool:
    phase, held = status(home, name)
    return phase == "RUNNING" and len(held) == slices and len(live_workers(home, "c", name)) == slices


def test_hotswap_end_to_end(home: Path, sleeper: str) -> None:
    create_cluster(home)
    create(home, "low", sleeper, "--priority", "low")
    create(home, "high", sleeper, "--priority", "high", "--num-slices", "2")
    wait_until(lambda: running_on(home, "high", 2) and running_on(home, "low", 1), what="both running")
    _, high_slices = status(home, "high")
    _, low_slices = status(home, "low")
    failed_node = f"{high_slices[0]}-0"

    hotswap(home, "node", "fail", "--cluster", "c", "--node", failed_node, check=True)

    # At once (no repair): the high job runs on the low job's slice, the low job is queued.
    phase, held = status(home, "high")
    assert phase == "RUNNING" and set(held) == {low_slices[0], high_slices[1]}
    listing = json.loads(hotswap(home, "workload", "list", "--cluster", "c", "--output", "json", check=True).stdout)
    low = next(w for w in listing if w["name"] == "low")
    assert low["status"] == "QUEUED" and "preempted by high" in low["status_message"] and low["preemptions"] == 1
    high = next(w for w in listing if w["name"] == "high")
    assert high["restarts"] == 0 and high["status"] == "RUNNING"
    wait_until(lambda: running_on(home, "high", 2), what="high restarted")
    nodes = json.loads(hotswap(home, "node", "list", "--cluster", "c", "--output", "json", check=True).stdout)
    assert {n["name"]: n["state"] for n in nodes}[failed_node] == "Failed"
    assert {"name", "slice", "state", "workload"} <= set(nodes[0])

    hotswap(home, "node", "uncordon", "--cluster", "c", "--node", failed_node, check=True)
    wait_until(lambda: running_on(home, "low", 1), what="low running again")
    assert status(home, "low")[1] == [high_slices[0]]
    timeline = json.loads(hotswap(home, "workload", "describe", "--cluster", "c", "--workload", "low", "-o", "json", check=True).stdout)["timeline"]
    messages = [e["message"] for e in timeline]
    assert any("preempted by high" in m for m in messages) and sum(m.startswith("admitted") for m in messages) == 2


def test_worker_environment_follows_the_contract(home: Path, tmp_path: Path) -> None:
    create_cluster(home, slices=2, device="v5p-16")  # 2 hosts per slice
    dump = tmp_path / "dump.py"
    out = tmp_path / "env"
    out.mkdir()
    dump.write_text(
        "import json, os, time\n"
        f"open(os.path.join({str(out)!r}, os.environ['RANK']), 'w').write(json.dumps(dict(os.environ)))\n"
        "time.sleep(600)\n"
    )
    env_file = tmp_path / "vars.env"
    env_file.write_text("# comment\nFROM_FILE=a=b\n\nOVERRIDDEN=file\n")
    create(home, "job", f"python3 {dump}", "--num-slices", "2", "--env", "OVERRIDDEN=flag", "--env-file", str(env_file))
    def dumped() -> list[dict] | None:  # each file complete (a worker may be writing it)
        try:
            return [json.loads((out / str(rank)).read_text()) for rank in range(4)]
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    envs = wait_until(dumped, what="4 workers' environments")
    record = workloads(home, "c")["job"]
    for rank, env in enumerate(envs):
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "4"
        assert env["JOB_INDEX"] == env["MEGASCALE_SLICE_ID"] == str(rank // 2)
        assert env["JOB_COMPLETION_INDEX"] == str(rank % 2)
        assert env["MEGASCALE_NUM_SLICES"] == "2" and env["HOTSWAP_HOSTS_PER_SLICE"] == "2"
        assert env["JOBSET_NAME"] == env["HOTSWAP_WORKLOAD"] == "job" and env["REPLICATED_JOB_NAME"] == "slice"
        assert env["HOTSWAP_CLUSTER"] == "c" and env["HOTSWAP_ATTEMPT"] == "1" and env["HOTSWAP_RESTART_COUNT"] == "0"
        assert env["HOTSWAP_SLICE"] == record["slices"][rank // 2]
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == envs[0]["MASTER_PORT"]
        assert env["HOTSWAP_CHECKPOINT_DIR"] == envs[0]["HOTSWAP_CHECKPOINT_DIR"]  # one run, one directory
        root, run = os.path.split(env["HOTSWAP_CHECKPOINT_DIR"])
        assert root.endswith("checkpoints/c/job") and run == env["HOTSWAP_RUN_ID"] and len(run) == 22
        assert env["FROM_FILE"] == "a=b" and env["OVERRIDDEN"] == "flag"
        assert env["LOCAL_RANK"] == "0" and env["LOCAL_WORLD_SIZE"] == "1"
        assert env["TPU_WORKER_ID"] == str(rank % 2) and env["TPU_WORKER_HOSTNAMES"] == "127.0.0.1,127.0.0.1"
    log = hotswap(home, "workload", "logs", "--cluster", "c", "--workload", "job", check=True).stdout
    assert "attempt 1 of job" in log


def test_blocking_recreate_starts_no_new_worker_before_all_old_ones_exited(home: Path, tmp_path: Path, sleeper: str) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    create_cluster(home, slices=3)
    create(
        home, "job", sleeper, "--num-slices", "2", "--restart-strategy", "BlockingRecreate",
        "--env", f"MARKS={marks}", "--env", "LINGER=1.0",
    )
    wait_until(lambda: running_on(home, "job", 2), what="running")
    _, held = status(home, "job")
    hotswap(home, "node", "fail", "--cluster", "c", "--node", f"{held[0]}-0", check=True)
    assert status(home, "job")[0] == "RESTARTING"
    wait_until(lambda: running_on(home, "job", 2) and len(list(marks.glob("job-2-*.start"))) == 2, what="restarted")
    survivor_stop = float((marks / "job-1-1-0.stop").read_text())  # lingered 1 s after SIGTERM
    new_starts = [float(p.read_text()) for p in marks.glob("job-2-*.start")]
    assert min(new_starts) > survivor_stop


def test_recreate_overlaps_old_and_new_workers(home: Path, tmp_path: Path, sleeper: str) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    create_cluster(home, slices=3)
    create(home, "job", sleeper, "--num-slices", "2", "--env", f"MARKS={marks}", "--env", "LINGER=1.0")
    wait_until(lambda: running_on(home, "job", 2), what="running")
    _, held = status(home, "job")
    hotswap(home, "node", "fail", "--cluster", "c", "--node", f"{held[0]}-0", check=True)
    wait_until(lambda: len(list(marks.glob("job-2-*.start"))) == 2 and (marks / "job-1-1-0.stop").exists(), what="both")
    assert min(float(p.read_text()) for p in marks.glob("job-2-*.start")) < float((marks / "job-1-1-0.stop").read_text())


def test_restart_codes_and_max_restarts(home: Path, sleeper: str) -> None:
    create_cluster(home, slices=2)
    create(home, "flaky", sleeper, "--max-restarts", "2", "--env", "EXIT_CODE=42", "--env", "RUN_FOR=0.2")
    wait_until(lambda: status(home, "flaky")[0] == "FAILED", what="failed after restarts")
    record = workloads(home, "c")["flaky"]
    assert record["restarts"] == 2 and record["attempt"] == 3
    assert "max restarts (2) is used up" in record["status_message"]
    create(home, "buggy", sleeper, "--max-restarts", "5", "--env", "EXIT_CODE=1", "--env", "RUN_FOR=0.2")
    wait_until(lambda: status(home, "buggy")[0] == "FAILED", what="failed at once")
    assert workloads(home, "c")["buggy"]["restarts"] == 0
    create(home, "custom", sleeper, "--max-restarts", "1", "--restart-on-exit-codes", "7", "--env", "EXIT_CODE=7", "--env", "RUN_FOR=0.2")
    wait_until(lambda: status(home, "custom")[0] == "FAILED", what="custom codes")
    assert workloads(home, "c")["custom"]["restarts"] == 1
    create(home, "ok", sleeper, "--env", "EXIT_CODE=0", "--env", "RUN_FOR=0.2")
    wait_until(lambda: status(home, "ok")[0] == "SUCCESSFUL", what="success")
    listing = json.loads(hotswap(home, "workload", "list", "--cluster", "c", "-o", "json", "--filter-by-status", "FINISHED", check=True).stdout)
    assert {w["name"] for w in listing} == {"flaky", "buggy", "custom", "ok"}
    failed = json.loads(hotswap(home, "workload", "list", "--cluster", "c", "-o", "json", "--filter-by-status", "FAILED", check=True).stdout)
    assert {w["name"] for w in failed} == {"flaky", "buggy", "custom"}
    prefixed = json.loads(hotswap(home, "workload", "list", "--cluster", "c", "-o", "json", "--filter-by-job", "fl", check=True).stdout)
    assert [w["name"] for w in prefixed] == ["flaky"]


def test_grace_period_sigterm_then_sigkill(home: Path, tmp_path: Path, sleeper: str) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    create_cluster(home, slices=1)
    create(home, "stubborn", sleeper, "--termination-grace-period", "1", "--env", f"MARKS={marks}", "--env", "LINGER=30")
    wait_until(lambda: running_on(home, "stubborn", 1), what="running")
    pid = live_workers(home, "c", "stubborn")[0]["pid"]
    started = time.monotonic()
    hotswap(home, "workload", "delete", "--cluster", "c", "--workload", "stubborn", check=True)
    wait_until(lambda: not alive(pid), timeout=10, what="killed after the grace period")
    elapsed = time.monotonic() - started
    assert (marks / "stubborn-1-0-0.term").exists()  # SIGTERM first
    assert not (marks / "stubborn-1-0-0.stop").exists()  # never finished lingering: SIGKILL
    row = query(home, "c", "SELECT exit_code FROM workers WHERE pid = ?", (pid,))[0]
    wait_until(lambda: query(home, "c", "SELECT exit_code FROM workers WHERE pid = ?", (pid,))[0]["exit_code"] is not None)
    assert query(home, "c", "SELECT exit_code FROM workers WHERE pid = ?", (pid,))[0]["exit_code"] == 137
    assert elapsed < 25 and row is not None


def test_controller_killed_with_minus_9_loses_nothing(home: Path, sleeper: str) -> None:
    create_cluster(home, slices=3)
    create(home, "a", sleeper, "--num-slices", "2", "--priority", "high")
    create(home, "b", sleeper, "--priority", "low", "--max-restarts", "3")
    wait_until(lambda: running_on(home, "a", 2) and running_on(home, "b", 1), what="running")
    pids = {r["pid"] for r in live_workers(home, "c")}
    controller = int((home / "clusters" / "c" / "controller.lock").read_text())
    os.kill(controller, signal.SIGKILL)
    wait_until(lambda: not alive(controller), what="controller dead")
    # The workers keep running without it; any CLI call brings it back and it re-adopts them.
    assert all(alive(p) for p in pids)
    hotswap(home, "workload", "list", "--cluster", "c", check=True)
    wait_until(lambda: int((home / "clusters" / "c" / "controller.lock").read_text() or 0) != controller, what="new controller")
    # A worker that exits while nobody watches is noticed by the new controller, by policy.
    victim = next(r for r in live_workers(home, "c", "b"))
    os.killpg(victim["pid"], signal.SIGKILL)  # no exit record: killed (137), a restart code
    wait_until(lambda: running_on(home, "b", 1) and workloads(home, "c")["b"]["attempt"] == 2, what="b restarted")
    assert {r["pid"] for r in live_workers(home, "c", "a")} <= pids  # re-adopted, not restarted
    # And it still reacts: a failure under "a" hotswaps it onto b's slice.
    _, held = status(home, "a")
    hotswap(home, "node", "fail", "--cluster", "c", "--node", f"{held[0]}-0", check=True)
    assert status(home, "b")[0] == "QUEUED"


def test_controller_killed_between_commit_and_spawn_starts_the_workers(home: Path, sleeper: str) -> None:
    """A committed decision whose workers were never started is finished by the next controller."""
    create_cluster(home, slices=1)
    create(home, "a", sleeper)
    wait_until(lambda: running_on(home, "a", 1), what="running")
    row = live_workers(home, "c", "a")[0]
    controller = int((home / "clusters" / "c" / "controller.lock").read_text())
    os.kill(controller, signal.SIGKILL)
    os.killpg(row["pid"], signal.SIGKILL)
    # Forge the crash window: the row says 'starting' with no process and no pid file.
    import sqlite3

    connection = sqlite3.connect(home / "clusters" / "c" / "state.db")
    connection.execute("UPDATE workers SET state = 'starting', pid = NULL WHERE id = ?", (row["id"],))
    connection.commit()
    connection.close()
    (Path(row["dir"]) / "pid").unlink()
    (Path(row["dir"]) / "exit").unlink(missing_ok=True)
    hotswap(home, "workload", "list", "--cluster", "c", check=True)
    wait_until(lambda: live_workers(home, "c", "a") and live_workers(home, "c", "a")[0]["pid"], what="respawned")
    assert alive(live_workers(home, "c", "a")[0]["pid"])


def test_fifty_concurrent_creates_lose_and_duplicate_nothing(home: Path, sleeper: str) -> None:
    import concurrent.futures

    create_cluster(home, slices=2)
    names = [f"w{i}" for i in range(50)] + ["dup"] * 5
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda n: hotswap(home, "workload", "create", "--cluster", "c", "--workload", n, "--command", sleeper), names))
    ok = [n for n, r in zip(names, results) if r.returncode == 0]
    assert sorted(set(ok)) == sorted(set(names)) and ok.count("dup") == 1
    assert all("already exists" in r.stderr for n, r in zip(names, results) if r.returncode != 0)
    assert len(workloads(home, "c")) == 51
    assert len(query(home, "c", "SELECT * FROM events WHERE kind = 'created'")) == 51


def test_elastic_scales_down_and_up_and_publishes_membership(home: Path, sleeper: str) -> None:
    create_cluster(home, slices=3)
    create(home, "e", sleeper, "--num-slices", "3", "--min-slices", "2")
    wait_until(lambda: running_on(home, "e", 3), what="running")
    record = workloads(home, "c")["e"]
    membership_file = home / "clusters" / "c" / "workloads" / f"e-{record['seq']}" / "membership.json"
    first = json.loads(membership_file.read_text())
    assert first["slices"] == record["slices"] and first["world_size"] == 3
    survivors = {r["pid"] for r in live_workers(home, "c", "e") if r["slice"] != record["slices"][1]}
    hotswap(home, "node", "fail", "--cluster", "c", "--slice", record["slices"][1], check=True)
    phase, held = status(home, "e")
    assert phase == "RUNNING" and held == [record["slices"][0], record["slices"][2]]
    second = json.loads(membership_file.read_text())
    assert second["generation"] > first["generation"] and second["slices"] == held and second["master_port"] != first["master_port"]
    assert {r["pid"] for r in live_workers(home, "c", "e")} == survivors  # no restart
    hotswap(home, "node", "uncordon", "--cluster", "c", "--slice", record["slices"][1], check=True)
    wait_until(lambda: running_on(home, "e", 3), what="grew back")
    third = json.loads(membership_file.read_text())
    assert third["generation"] > second["generation"] and len(third["slices"]) == 3
    assert survivors <= {r["pid"] for r in live_workers(home, "c", "e")}


def test_drain_and_cordon_move_the_job(home: Path, sleeper: str) -> None:
    create_cluster(home, slices=3)
    create(home, "job", sleeper)
    wait_until(lambda: running_on(home, "job", 1), what="running")
    first = status(home, "job")[1][0]
    hotswap(home, "node", "drain", "--cluster", "c", "--slice", first, check=True)
    second = status(home, "job")[1][0]
    assert second != first
    hotswap(home, "node", "cordon", "--cluster", "c", "--node", f"{second}-0", check=True)
    third = status(home, "job")[1][0]
    assert third not in (first, second)
    nodes = {n["name"]: n["state"] for n in json.loads(hotswap(home, "node", "list", "--cluster", "c", "-o", "json").stdout)}
    assert nodes[f"{first}-0"] == nodes[f"{second}-0"] == "Cordoned"
    assert workloads(home, "c")["job"]["restarts"] == 0


def test_resize(home: Path, sleeper: str) -> None:
    create_cluster(home, slices=2)
    create(home, "job", sleeper, "--num-slices", "2")
    wait_until(lambda: running_on(home, "job", 2), what="running")
    create_cluster(home, slices=4)
    assert len(json.loads(hotswap(home, "node", "list", "--cluster", "c", "-o", "json").stdout)) == 4
    refused = hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "1")
    assert refused.returncode != 0 and "--force" in refused.stderr
    assert len(json.loads(hotswap(home, "node", "list", "--cluster", "c", "-o", "json").stdout)) == 4
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "2", "--force", check=True)
    assert running_on(home, "job", 2) or status(home, "job")[0] == "RUNNING"  # free slices went first
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", "1", "--force", check=True)
    assert status(home, "job")[0] == "QUEUED"  # moved off properly: requeued, not half-placed
    clusters = json.loads(hotswap(home, "cluster", "list", "-o", "json", check=True).stdout)
    assert clusters[0]["name"] == "c" and clusters[0]["num_slices"] == 1


@pytest.fixture(scope="module")
def bad_input_home(tmp_path_factory: pytest.TempPathFactory):
    """One cluster (2 x v6e-4, one workload named "existing") shared by the bad-input cases."""
    root = tmp_path_factory.mktemp("bad-input")
    home = root / "state"
    try:
        create_cluster(home, slices=2)
        create(home, "existing", write_sleeper(root))
        wait_until(lambda: running_on(home, "existing", 1), what="running")
        yield home
    finally:
        cleanup(home)


def _state(home: Path) -> tuple:
    rows = query(home, "c", "SELECT name, record FROM workloads ORDER BY name")
    nodes = query(home, "c", "SELECT name, state FROM nodes ORDER BY name")
    return tuple(tuple(r) for r in rows), tuple(tuple(r) for r in nodes)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("workload", "create", "--cluster", "c", "--workload", "Bad_Name", "--command", "true"), "DNS-1035"),
        (("workload", "create", "--cluster", "c", "--workload", "x", "--command", "true", "--device-type", "v6e-17"), "did you mean"),
        (("workload", "create", "--cluster", "c", "--workload", "x", "--command", "true", "--device-type", "v5p-16"), "has v6e-4 slices"),
        (("workload", "create", "--cluster", "c", "--workload", "x", "--command", "true", "--priority", "urgent"), "very-low"),
        (("workload", "create", "--cluster", "c", "--workload", "x", "--command", "true", "--env-file", "/nonexistent"), "no such file"),
        (("workload", "create", "--cluster", "c", "--workload", "x", "--command", "true", "--env", "NOEQUALS"), "NAME=value"),
        (("workload", "create", "--cluster", "c", "--workload", "x", "--command", "true", "--num-slices", "9"), "could never run"),
        (("workload", "create", "--cluster", "c", "--workload", "x", "--command", "true", "--min-slices", "3"), "--min-slices 3 is larger"),
        (("workload", "create", "--cluster", "c", "--workload", "x", "--command", "true", "--restart-on-exit-codes", "1-x"), "exit code"),
        (("workload", "create", "--cluster", "nope", "--workload", "x", "--command", "true"), "no cluster named nope"),
        (("workload", "create", "--cluster", "c", "--workload", "existing", "--command", "true"), "already exists"),
        (("workload", "delete", "--cluster", "c", "--workload", "ghost"), "no workload named ghost"),
        (("workload", "describe", "--cluster", "c", "--workload", "ghost"), "no workload named ghost"),
        (("workload", "list", "--cluster", "c", "--filter-by-status", "DONE"), "--filter-by-status"),
        (("node", "fail", "--cluster", "c", "--node", "ghost"), "no node named ghost"),
        (("node", "fail", "--cluster", "c"), "exactly one of --node or --slice"),
        (("cluster", "create", "--cluster", "c", "--device-type", "v5p-16", "--num-slices", "2"), "cannot change"),
        (("cluster", "create", "--cluster", "Bad", "--device-type", "v6e-4", "--num-slices", "2"), "DNS-1035"),
        (("cluster", "create", "--cluster", "d", "--device-type", "v9-8", "--num-slices", "2"), "unknown device type"),
        (("cluster", "create", "--cluster", "d", "--device-type", "v6e-4", "--num-slices", "0"), "--num-slices"),
        (("cluster", "delete", "--cluster", "ghost"), "no cluster named ghost"),
    ],
)
def test_bad_input_explains_itself_and_changes_nothing(bad_input_home: Path, args: tuple, message: str) -> None:
    home = bad_input_home
    before = _state(home)
    result = hotswap(home, *args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert result.stdout == ""
    assert _state(home) == before
    assert not (home / "clusters" / "d").exists()


def test_a_workload_that_can_never_fit_exits_with_the_capacity_code(bad_input_home: Path) -> None:
    """Exit 5 (capacity), in the same words as on Kubernetes (tests/test_kubernetes_cli.py), never
    4 (conflict): more slices than the cluster has is not a clash with existing state."""
    from hotswap.api.errors import CapacityError

    result = hotswap(bad_input_home, "workload", "create", "--cluster", "c", "--workload", "big", "--num-slices", "3", "--command", "true")
    assert result.returncode == CapacityError.exit_code == 5, result.stderr
    assert result.stderr.strip() == (
        "error: workload big rejected: it needs 3 slice(s) of v6e-4 and the cluster has only 2; it could never run"
    )


def test_warm_spares_take_over_starts_and_refill(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hotswap.api.spec import workload_spec
    from hotswap.backends.local.queries import logs
    from hotswap.backends.local.commands import clusters as cluster_commands
    from hotswap.backends.local.commands import workloads as workload_commands
    from hotswap.backends.local.queries import clusters as cluster_queries
    from hotswap.api.launch import Launch

    monkeypatch.setenv("HOTSWAP_HOME", str(home))
    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys, time\n"
        "print('warm' if 'json' in sys.modules else 'cold', os.environ['RANK'], os.environ['HOTSWAP_ATTEMPT'], sys.argv[1:], flush=True)\n"
        "time.sleep(600)\n"
    )
    # Spares preload only the standard library here; the demo's preload PyTorch.
    cluster_commands.create_cluster("c", "v6e-4", 3, True, lambda _: True, warm_workers=2, warm_preload=["json"])
    spares = lambda: query(home, "c", "SELECT * FROM workers WHERE state = 'warm'")  # noqa: E731
    wait_until(
        lambda: len(spares()) == 2 and all(r["pid"] and (Path(r["dir"]) / "ready").exists() for r in spares()),
        what="2 ready spares, their pids recorded",
    )
    spare_pids = {r["pid"] for r in spares()}
    launch = Launch(environ=dict(os.environ), cwd=str(tmp_path), checkpoint_dir=str(tmp_path / "ckpt"))
    spec = workload_spec(name="job", command=f"{sys.executable} job.py --flag 1", device_type="v6e-4", num_slices=2)
    workload_commands.create_workload("c", spec, launch)
    workers = live_workers(home, "c", "job")
    assert {w["pid"] for w in workers} == spare_pids  # both started on spares
    log = logs.log_file("c", "job", None, 0)
    wait_until(lambda: "warm 0 1 ['--flag', '1']" in log.read_text(), what="ran as worker 0")
    assert "on a warm spare" in log.read_text()
    # A failure restarts the job; the pool refills after a short delay and serves later starts.
    wait_until(lambda: len(spares()) == 2, timeout=30, what="pool refilled")
    hotswap(home, "node", "fail", "--cluster", "c", "--node", f"{workers[0]['slice']}-0", check=True)
    wait_until(lambda: "warm 0 2" in log.read_text() or "warm 0 2" in logs.log_file("c", "job", "1", 0).read_text(), what="restarted warm")
    describe = cluster_queries.describe_cluster("c")
    assert describe["warm_workers"] == 2


def test_logs_follow_until_the_workload_finishes(home: Path, tmp_path: Path) -> None:
    create_cluster(home, slices=1)
    script = tmp_path / "count.py"
    script.write_text("import time\nfor i in range(5):\n    print('line', i, flush=True)\n    time.sleep(0.2)\n")
    create(home, "counter", f"python3 {script}")
    result = hotswap(home, "workload", "logs", "--cluster", "c", "--workload", "counter", "--follow", timeout=60)
    assert result.returncode == 0
    assert [l for l in result.stdout.splitlines() if l.startswith("line")] == [f"line {i}" for i in range(5)]
    assert status(home, "counter")[0] == "SUCCESSFUL"
    bad = hotswap(home, "workload", "logs", "--cluster", "c", "--workload", "counter", "--slice", "7")
    assert bad.returncode != 0 and "replicas 0-0" in bad.stderr


def test_sigterm_stops_the_controller_and_leaves_workers_running(home: Path, sleeper: str) -> None:
    create_cluster(home, slices=1)
    create(home, "a", sleeper)
    wait_until(lambda: running_on(home, "a", 1), what="running")
    worker = live_workers(home, "c", "a")[0]["pid"]
    controller = int((home / "clusters" / "c" / "controller.lock").read_text())
    os.kill(controller, signal.SIGTERM)
    wait_until(lambda: not alive(controller), timeout=10, what="the controller to stop on SIGTERM")
    assert alive(worker)  # a controller restart re-adopts it
    hotswap(home, "workload", "list", "--cluster", "c", check=True)
    wait_until(lambda: int((home / "clusters" / "c" / "controller.lock").read_text() or 0) not in (0, controller), what="restarted")


def test_a_stopping_worker_never_charges_its_workload(home: Path, tmp_path: Path, sleeper: str) -> None:
    """Drain then repair at once: the elastic job scales down, then back up onto the same
    slice while the old worker there still finishes its checkpoint. Its late exit (143) is
    expected and must not fail the job or use a restart."""
    marks = tmp_path / "marks"
    marks.mkdir()
    create_cluster(home, slices=3)
    create(home, "e", sleeper, "--num-slices", "3", "--min-slices", "2", "--env", f"MARKS={marks}", "--env", "LINGER=2")
    wait_until(lambda: running_on(home, "e", 3), what="running")
    target = status(home, "e")[1][2]
    hotswap(home, "node", "drain", "--cluster", "c", "--slice", target, check=True)
    hotswap(home, "node", "uncordon", "--cluster", "c", "--slice", target, check=True)
    wait_until(lambda: len(list(marks.glob("e-1-2-0.stop"))) == 1, what="the drained worker to finish")
    wait_until(lambda: not [w for w in live_workers(home, "c", "e") if w["state"] == "stopping"], what="old worker gone")
    record = workloads(home, "c")["e"]
    assert record["phase"] == "RUNNING" and record["restarts"] == 0 and len(record["slices"]) == 3
    dirs = [w["dir"] for w in live_workers(home, "c", "e")]
    assert len(set(dirs)) == len(dirs)  # every process has a directory of its own


def test_a_command_that_cannot_run_says_so_and_follows_the_policy(home: Path) -> None:
    create_cluster(home, slices=1)
    create(home, "typo", "pyhton3 train.py", "--max-restarts", "1")
    wait_until(lambda: status(home, "typo")[0] == "FAILED", what="failed after its restart")
    record = workloads(home, "c")["typo"]
    assert record["restarts"] == 1 and "127" in record["status_message"]
    log = hotswap(home, "workload", "logs", "--cluster", "c", "--workload", "typo", check=True).stdout
    assert "pyhton3: command not found" in log


LEAVES = """
import os, subprocess, sys
marks = sys.argv[1]
# One that stops on SIGTERM (and says so), one that ignores SIGTERM and has a child of its own
# that ignores it too (orphaned only when its parent is killed).
polite = "import signal, sys, time\\ndef bye(*_):\\n    open(sys.argv[1], 'w').write('term')\\n    sys.exit(0)\\nsignal.signal(signal.SIGTERM, bye)\\ntime.sleep(300)"
deaf = "import signal, subprocess, sys, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nc = subprocess.Popen(['sleep', '300'])\\nopen(sys.argv[1], 'w').write(str(c.pid))\\ntime.sleep(300)"
a = subprocess.Popen([sys.executable, "-c", polite, os.path.join(marks, "polite.term")])
b = subprocess.Popen([sys.executable, "-c", deaf, os.path.join(marks, "deaf.child")])
child = os.path.join(marks, "deaf.child")
while not (os.path.exists(child) and open(child).read()):  # created first, its pid written after
    pass
open(os.path.join(marks, "pids"), "w").write(f"{a.pid} {b.pid} {open(os.path.join(marks, 'deaf.child')).read()}")
print("done", flush=True)
"""


def test_a_finished_command_is_not_kept_alive_by_what_it_left_running(home: Path, tmp_path: Path) -> None:
    """The README: whatever a finished command leaves running gets SIGTERM, then SIGKILL after
    5 s, and the worker ends. Also what those leave behind when they are killed."""
    create_cluster(home, slices=1)
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "leaves.py"
    script.write_text(LEAVES)
    create(home, "leaves", f"python3 {script} {marks}")
    wait_until(lambda: status(home, "leaves")[0] == "SUCCESSFUL", timeout=30, what="finished despite the stragglers")
    pids = [int(p) for p in (marks / "pids").read_text().split()]
    assert len(pids) == 3
    assert [pid for pid in pids if alive(pid)] == [], "a process the command left is still running"
    assert (marks / "polite.term").read_text() == "term"  # SIGTERM first: it could clean up
    log = hotswap(home, "workload", "logs", "--cluster", "c", "--workload", "leaves", check=True).stdout
    assert "done" in log and "stopping 2 process(es) it left" in log


def test_concurrent_creates_of_one_cluster_name_explain_themselves(home: Path) -> None:
    import concurrent.futures

    devices = ["v6e-4", "v5p-16", "v6e-4", "v4-8", "v6e-16"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        results = list(pool.map(
            lambda d: hotswap(home, "cluster", "create", "--cluster", "race", "--device-type", d, "--num-slices", "1"), devices
        ))
    winners = [d for d, r in zip(devices, results) if r.returncode == 0]
    assert len(set(winners)) == 1
    for result in results:
        if result.returncode != 0:
            assert len(result.stderr.strip().splitlines()) == 1 and "cannot change" in result.stderr, result.stderr


def test_warm_spares_apply_pythonpath(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hotswap.api.spec import workload_spec
    from hotswap.backends.local.queries import logs
    from hotswap.backends.local.commands import clusters as cluster_commands
    from hotswap.backends.local.commands import workloads as workload_commands
    from hotswap.backends.local.queries import clusters as cluster_queries
    from hotswap.api.launch import Launch

    monkeypatch.setenv("HOTSWAP_HOME", str(home))
    library = tmp_path / "lib"
    library.mkdir()
    (library / "helpermod.py").write_text("VALUE = 'from PYTHONPATH'\n")
    (tmp_path / "job.py").write_text("import time, helpermod\nprint(helpermod.VALUE, flush=True)\ntime.sleep(600)\n")
    cluster_commands.create_cluster("c", "v6e-4", 1, True, lambda _: True, warm_workers=1, warm_preload=["json"])
    wait_until(lambda: query(home, "c", "SELECT * FROM workers WHERE state = 'warm' AND pid IS NOT NULL"), what="a spare")
    spare = query(home, "c", "SELECT * FROM workers WHERE state = 'warm'")[0]
    wait_until(lambda: (Path(spare["dir"]) / "ready").exists(), what="spare ready")
    launch = Launch(environ=dict(os.environ), cwd=str(tmp_path), checkpoint_dir=str(tmp_path / "c"))
    spec = workload_spec(name="job", command=f"{sys.executable} job.py", device_type="v6e-4", env={"PYTHONPATH": str(library)})
    workload_commands.create_workload("c", spec, launch)
    log = logs.log_file("c", "job", None, 0)
    wait_until(lambda: "from PYTHONPATH" in log.read_text(), what="the module found on a spare")
    assert "on a warm spare" in log.read_text()
