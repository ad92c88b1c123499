"""The controller crash drill (issue 24, case 1): a local controller killed with -9 at any moment,
under CPU load, must never cost a workload anything. With the default ``--max-restarts 0`` a
single restart charged for the controller's own death fails the job for good.

Afterwards, for every workload: it is not FAILED, its restart count is still 0, exactly one
process runs each of its worker slots, and no step is lost: every start resumes from a
checkpoint at least as new as every checkpoint committed before it read one (the workers log
both, with the time), and each process's steps follow on from where it resumed.

The moments that matter are hit every time through the controller's test-only crash points
(``HOTSWAP_TEST_CRASH_AT``, ``backends/local/crash_points.py``) or by leaving exactly what such a
crash leaves; a randomized loop then kills every process with the controller's command line
(the forked child that is about to become a worker's shim included) at random moments of
creates, hotswaps and preemptions. ``HOTSWAP_CRASH_DRILL_KILLS`` sets how many (default 10;
a few hundred by hand: ``HOTSWAP_CRASH_DRILL_KILLS=300 pytest tests/test_controller_crash_drill.py
-k random``).
"""

from __future__ import annotations

import os
import random
import shlex
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from hardening_helpers import controllers, worker_shims
from local_helpers import alive, cleanup, live_workers, query, wait_until, workloads

from hotswap.backends.local.crash_points import POINTS

KILLS = int(os.environ.get("HOTSWAP_CRASH_DRILL_KILLS", "10"))

# A trainer in a few lines: resumes from its checkpoint (a step number, replaced atomically and
# never by an older one), logs each step, saves every 5 steps and on SIGTERM. Times are
# CLOCK_MONOTONIC, the same for every process of the machine.
TRAINER = textwrap.dedent(
    """
    import os, signal, sys, time
    path = os.path.join(os.environ["HOTSWAP_CHECKPOINT_DIR"], "step")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    def saved():
        try:
            return int(open(path).read())
        except (FileNotFoundError, ValueError):
            return 0
    read_at = time.monotonic()
    step = saved()
    print("resumed", step, os.getpid(), read_at, flush=True)
    def save(n):
        if n > saved():
            with open(f"{path}.{os.getpid()}", "w") as f:
                f.write(str(n))
            os.rename(f"{path}.{os.getpid()}", path)
            print("saved", n, os.getpid(), time.monotonic(), flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        time.sleep(0.05)
        step += 1
        print("step", step, os.getpid(), flush=True)
        if step % 5 == 0:
            save(step)
    save(step)
    sys.exit(143)
    """
)


class Drill:
    def __init__(self, root: Path) -> None:
        self.home = root / "state"
        self.root = self.home / "clusters" / "c"
        self.once = root / "crashed"  # created by the controller that crashed at its point
        script = root / "trainer.py"
        script.write_text(TRAINER)
        self.command = shlex.join([sys.executable, str(script)])
        self.load = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a busy neighbour

    def close(self) -> None:
        self.load.kill()
        self.load.wait()
        cleanup(self.home)

    def cli(self, *args: str, crash: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, HOTSWAP_HOME=str(self.home))
        env.pop("HOTSWAP_TEST_CRASH_AT", None)
        if crash is not None:
            env["HOTSWAP_TEST_CRASH_AT"] = crash
        result = subprocess.run(
            [sys.executable, "-m", "hotswap", *args], capture_output=True, text=True, env=env, timeout=120
        )
        assert not check or result.returncode == 0, f"hotswap {' '.join(args)}: {result.stderr}"
        return result

    def cluster(self, slices: int) -> None:
        self.cli("cluster", "create", "--cluster", "c", "--device-type", "v6e-4", "--num-slices", str(slices))

    def create(self, name: str, priority: str = "medium", crash: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.cli(
            "workload", "create", "--cluster", "c", "--workload", name, "--command", self.command,
            "--priority", priority, "--termination-grace-period", "2", crash=crash,
        )

    def stop_controller(self) -> None:
        """Stop the cluster's controller (SIGTERM: it leaves the workers running), so that the
        next CLI call starts one with the environment the test gives it."""
        for pid in controllers(self.root):
            os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not controllers(self.root), what="the controller to stop")

    def kill_controller_then_worker(self, workload: str) -> dict:  # type: ignore[type-arg]
        """The controller killed, then the workload's first worker with its shim (its process
        group), as a crash of both leaves it; the worker's row."""
        row = live_workers(self.home, "c", workload)[0]
        self.kill_controllers()
        os.killpg(row["pid"], signal.SIGKILL)
        wait_until(lambda: not alive(row["pid"]), what=f"{workload}'s worker to die")
        return row

    def kill_controllers(self) -> int:
        """kill -9 of every process with the controller's command line."""
        found = controllers(self.root)
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(found)

    # ------------------------------------------------------------------ afterwards

    def settle(self) -> None:
        self.cli("workload", "list", "--cluster", "c")  # a controller again, whatever happened

        def settled() -> bool:
            if query(self.home, "c", "SELECT count(*) FROM requests WHERE status = 'pending'")[0][0]:
                return False
            rows = live_workers(self.home, "c")
            if any(r["state"] != "running" or not r["pid"] or not alive(r["pid"]) for r in rows):
                return False
            records = workloads(self.home, "c")
            if any(r["phase"] in ("RESTARTING", "FAILED") for r in records.values()):
                return True if any(r["phase"] == "FAILED" for r in records.values()) else False
            return all(
                sum(1 for w in rows if w["workload"] == n) == len(r["slices"])
                for n, r in records.items() if r["phase"] == "RUNNING"
            )

        wait_until(settled, timeout=90, what="the cluster to settle")

    def check(self) -> None:
        records = workloads(self.home, "c")
        for name, record in records.items():
            assert record["phase"] != "FAILED", f"{name}: {record['status_message']}"
            assert record["restarts"] == 0, f"{name} was charged {record['restarts']} restart(s): {record['status_message']}"
        shims = worker_shims(self.root)
        slots = Counter((env["HOTSWAP_WORKLOAD"], env["JOB_INDEX"], env["JOB_COMPLETION_INDEX"]) for env in shims)
        rows = {r["dir"]: dict(r) for r in query(self.home, "c", "SELECT * FROM workers")}
        seen = [(env["pid"], rows.get(env["dir"], env["dir"])) for env in shims]
        assert all(n == 1 for n in slots.values()), f"a worker runs twice: {slots}; shims and their rows: {seen}"
        running = {(r["workload"], str(r["replica"]), str(r["host"])) for r in live_workers(self.home, "c")}
        assert set(slots) == running, (slots, running)
        for name, record in records.items():
            self.check_steps(name, record["seq"], running=record["phase"] == "RUNNING")

    def check_steps(self, name: str, seq: int, running: bool) -> None:
        logs = sorted((self.root / "workloads" / f"{name}-{seq}" / "logs").glob("*.log"))
        lines = [line.split() for log in logs for line in log.read_text().splitlines()]
        saves = [(float(t), int(n)) for word, n, _, t in (x for x in lines if x[0] == "saved")]
        starts = [(int(k), int(pid), float(t)) for word, k, pid, t in (x for x in lines if x[0] == "resumed")]
        assert starts or not running, f"{name} never started"
        for resumed, pid, read_at in starts:
            committed = max((n for t, n in saves if t < read_at), default=0)
            assert resumed >= committed, f"{name}: pid {pid} resumed at step {resumed}; step {committed} was saved before"
            steps = [int(x[1]) for x in lines if x[0] == "step" and int(x[2]) == pid]
            assert steps == list(range(resumed + 1, resumed + 1 + len(steps))), f"{name}: pid {pid} skipped steps"
        if running:  # and it still trains
            size = sum(log.stat().st_size for log in logs)
            wait_until(lambda: sum(log.stat().st_size for log in logs) > size, timeout=10, what=f"{name} to go on")


@pytest.fixture
def drill(tmp_path: Path) -> Iterator[Drill]:
    drill = Drill(tmp_path)
    yield drill
    drill.close()


def forge(drill: Drill, row: sqlite3.Row, **columns: object) -> None:
    connection = sqlite3.connect(drill.root / "state.db")
    assignments = ", ".join(f"{key} = ?" for key in columns)
    connection.execute(f"UPDATE workers SET {assignments} WHERE id = ?", (*columns.values(), row["id"]))
    connection.commit()
    connection.close()


# ---------------------------------------------------------------------- the moments that matter


@pytest.mark.parametrize("point", POINTS)
def test_a_controller_killed_at_each_moment_of_a_start_costs_nothing(drill: Drill, point: str) -> None:
    drill.cluster(2)
    start_killed_at(drill, point)


def start_killed_at(drill: Drill, point: str) -> None:
    """Workload a runs; b's start meets a controller killed at ``point``; nothing is lost."""
    drill.create("a")
    drill.settle()
    drill.stop_controller()
    drill.create("b", crash=f"{point}@{drill.once}")  # its answer comes from the next controller
    assert drill.once.exists(), f"the controller never reached {point}"
    drill.settle()
    drill.check()


@pytest.mark.parametrize("point", POINTS)
def test_a_controller_killed_at_each_moment_of_a_start_by_the_zygote_costs_nothing(
    drill: Drill, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same moments when the worker is forked by the cluster's zygote (zygote.py): its shim
    is no child of the controller, it holds the start lock the controller passed, and a
    restarted controller adopts it (and the zygote) as it adopts any worker."""
    from hardening_helpers import forked_shims

    monkeypatch.setenv("HOTSWAP_ZYGOTE", "1")  # (the controllers inherit it from the CLI)
    drill.cluster(2)
    ready = drill.root / "zygote" / "ready"
    wait_until(ready.exists, timeout=90, what="the zygote to be ready")
    start_killed_at(drill, point)
    assert {env["HOTSWAP_WORKLOAD"] for env in forked_shims(drill.root)} == {"a", "b"}  # both forked, none cold


def test_a_shim_killed_after_its_pid_file_before_its_command_is_started_again_uncharged(drill: Drill) -> None:
    """The state the reported failures left: the kill hit the controller and the child it had
    just forked (which still carried the controller's command line): the row was committed
    without a pid, the child had become the shim and written its pid file, its command had
    not started. Found dead with no exit record, it was judged an exit 137: FAILED."""
    drill.cluster(1)
    drill.create("a")
    drill.settle()
    row = drill.kill_controller_then_worker("a")
    forge(drill, row, state="starting", pid=None, start_ticks=None)
    (Path(row["dir"]) / "started").unlink(missing_ok=True)
    assert (Path(row["dir"]) / "pid").exists() and not (Path(row["dir"]) / "exit").exists()
    drill.settle()
    drill.check()
    assert workloads(drill.home, "c")["a"]["attempt"] == 1  # the same start, made again


def test_a_shim_killed_under_its_running_command_restarts_the_workload_uncharged(drill: Drill) -> None:
    """The kill hit the child once it ran the worker: the shim died alone, its command ran on,
    unsupervised. It must not run twice, and the restart is not the workload's to pay for."""
    drill.cluster(1)
    drill.create("a")
    drill.settle()
    row = live_workers(drill.home, "c", "a")[0]
    drill.kill_controllers()
    os.kill(row["pid"], signal.SIGKILL)  # the shim alone
    drill.settle()
    drill.check()
    assert workloads(drill.home, "c")["a"]["attempt"] == 2
    events = query(drill.home, "c", "SELECT message FROM events WHERE kind = 'worker-lost'")
    assert events and "not the workload's fault" in events[0]["message"]


def forge_unrecorded_start(drill: Drill, row: dict) -> None:  # type: ignore[type-arg]
    """The state a controller killed between a start's commit and its spawn leaves: the row
    'starting' without a pid, and no pid, exit or started file."""
    forge(drill, row, state="starting", pid=None, start_ticks=None)
    for left in ("pid", "exit", "started"):
        (Path(row["dir"]) / left).unlink(missing_ok=True)


def test_two_controllers_racing_over_rows_without_a_pid(drill: Drill) -> None:
    """Two controllers start at once on a start committed without a pid (the controller died
    between commit and spawn); the one that wins is killed with the child it forked."""
    drill.cluster(2)
    drill.create("a")
    drill.create("b")
    drill.settle()
    row = drill.kill_controller_then_worker("b")
    forge_unrecorded_start(drill, row)
    second = drill.root.parent.parent.parent / "crashed-again"
    env = dict(os.environ, HOTSWAP_HOME=str(drill.home), HOTSWAP_TEST_CRASH_AT=f"with-child@{second}")
    entry = [sys.executable, "-m", "hotswap.backends.local.controller.entry", str(drill.root)]
    racing = [subprocess.Popen(entry, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
    wait_until(second.exists, timeout=30, what="a controller to take over")
    # The winner died at the point; the other one exited (held) or took over after it.
    wait_until(lambda: sum(1 for p in racing if p.poll() is None) <= 1, timeout=30, what="one controller left")
    drill.settle()
    drill.check()


def test_a_controller_woken_by_a_racing_one_while_it_takes_over_survives(drill: Drill) -> None:
    """A controller that loses the race for the claim wakes the winner with SIGUSR1 (its socket
    may have been removed) as soon as the winner has announced itself: before it has taken
    over from its predecessor. The signal's default action killed it half-way through."""
    drill.cluster(1)
    drill.create("a")
    drill.settle()
    row = live_workers(drill.home, "c", "a")[0]
    drill.kill_controllers()
    # The predecessor died between starting a's shim and recording it: the shim lives (it
    # holds its start lock) and its pid file is not there yet, so the next controller waits.
    forge(drill, row, pid=None, start_ticks=None, state="starting")
    pid_file = Path(row["dir"]) / "pid"
    held = pid_file.with_name("pid.later")
    pid_file.rename(held)
    entry = [sys.executable, "-m", "hotswap.backends.local.controller.entry", str(drill.root)]
    env = dict(os.environ, HOTSWAP_HOME=str(drill.home))
    winner = subprocess.Popen(entry, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    announced = drill.root / "controller.lock"
    wait_until(lambda: announced.exists() and announced.read_text().strip() == str(winner.pid), what="the announcement")
    time.sleep(0.3)  # taking over: waiting for a's pid file
    os.kill(winner.pid, signal.SIGUSR1)  # what the loser's wake_holder sends
    time.sleep(0.3)
    held.rename(pid_file)
    assert winner.poll() is None, f"the controller died of the wake-up (exit {winner.returncode})"
    drill.settle()
    drill.check()
    assert live_workers(drill.home, "c", "a")[0]["pid"] == row["pid"]  # adopted, never started twice


# ---------------------------------------------------------------------- at random moments


def test_random_kills_during_creates_hotswaps_and_preemptions(drill: Drill) -> None:
    seed = int(os.environ.get("HOTSWAP_CRASH_DRILL_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    drill.cluster(3)
    drill.create("a", "low")
    drill.create("b", "medium")
    created, hits = 0, Counter[int]()
    try:
        for _ in range(KILLS):
            records = workloads(drill.home, "c")
            held = [s for r in records.values() if r["phase"] == "RUNNING" for s in r["slices"]]
            failed = [n for n, state in _nodes(drill).items() if state != "Ready"]
            choices = ["create"] + (["hotswap"] if held else []) + (["repair"] if failed else [])
            action = rng.choice(choices)
            if action == "create":  # a higher priority preempts when the cluster is full
                created += 1
                args = ["workload", "create", "--cluster", "c", "--workload", f"w{created}", "--command", drill.command,
                        "--priority", rng.choice(["low", "medium", "high", "very-high"]), "--termination-grace-period", "2"]
            elif action == "hotswap":
                args = ["node", "fail", "--cluster", "c", "--node", f"{rng.choice(held)}-0"]
            else:
                args = ["node", "uncordon", "--cluster", "c", "--node", rng.choice(failed)]
            answer: list[subprocess.CompletedProcess[str]] = []
            worker = threading.Thread(target=lambda: answer.append(drill.cli(*args, check=False)))
            worker.start()
            time.sleep(rng.uniform(0.0, 0.6))
            hits[drill.kill_controllers()] += 1  # 2: the controller and the child it was forking
            worker.join(timeout=120)
            assert answer and "Traceback" not in answer[0].stderr, answer
        drill.settle()
        drill.check()
        print(f"crash drill seed {seed}: processes killed per kill -9 round: {dict(hits)}")
    except AssertionError as failure:
        raise AssertionError(f"{failure} (HOTSWAP_CRASH_DRILL_SEED={seed})") from failure


def _nodes(drill: Drill) -> dict[str, str]:
    """Each node's state (NodeState's values: "Ready", "Failed", ...)."""
    return {r["name"]: r["state"] for r in query(drill.home, "c", "SELECT name, state FROM nodes")}


def test_a_request_made_while_a_start_is_still_unrecorded_is_answered_at_once(drill: Drill) -> None:
    """Issue 36: recovery waited in place (up to 60 s) for the pid file of a shim a killed
    controller had started, holding the cluster unanswered meanwhile. The state such a crash
    leaves on a busy host (a row without a pid, its start lock held by a shim that has written
    no pid file yet) is made here with a stand-in that holds the lock until the test lets go:
    a request made meanwhile is answered while the start is still unrecorded, and the worker is
    then started again (its shim ended without running anything), uncharged."""
    drill.cluster(1)
    drill.create("a")
    drill.settle()
    row = drill.kill_controller_then_worker("a")
    forge_unrecorded_start(drill, row)
    release = drill.root.parent.parent.parent / "release-the-start-lock"
    holding = textwrap.dedent(
        f"""
        import fcntl, os, time
        lock = os.open({str(Path(row["dir"]) / "lock")!r}, os.O_RDWR)
        fcntl.flock(lock, fcntl.LOCK_EX)
        print("held", flush=True)
        deadline = time.monotonic() + 240  # a hang guard: the test lets go long before
        while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:
            time.sleep(0.05)
        """
    )
    shim = subprocess.Popen([sys.executable, "-c", holding], stdout=subprocess.PIPE, text=True)
    try:
        assert shim.stdout is not None and shim.stdout.readline().strip() == "held"
        drill.cli(  # the CLI starts a controller, which recovers, and waits for its answer
            "workload", "create", "--cluster", "c", "--workload", "b", "--command", drill.command,
        )
        assert shim.poll() is None, "the request was answered only once the unrecorded start ended"
        assert query(drill.home, "c", "SELECT pid FROM workers WHERE id = ?", (row["id"],))[0]["pid"] is None
        assert workloads(drill.home, "c")["b"]["phase"] == "QUEUED"  # served: queued behind a
    finally:
        release.touch()
        shim.wait()
    drill.settle()
    drill.check()
    assert workloads(drill.home, "c")["a"]["attempt"] == 1  # the same start, made again
