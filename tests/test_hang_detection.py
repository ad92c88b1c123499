"""Hang detection on the local backend, with real workers that stop stepping: a deadlock, a
SIGSTOPped rank of a real PyTorch job, and what must never count as a hang (a slow first step,
an announced checkpoint save, an evaluation pass, a worker that finished and takes long to
exit)."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

import pytest
from local_helpers import PYTHON, home, hotswap, live_workers, query, wait_until, workloads  # noqa: F401 (home: a fixture)

from hotswap.demo.observe import read_trace

ROOT = Path(__file__).resolve().parents[1]
# --hang-timeout sets the limit, so these tests need not wait for the default's floor (60 s),
# and the controls below are hangs however loaded the machine.
LIMIT_S = 5.0

# A worker that writes the SDK's events itself (no torch: it starts at once), then misbehaves
# as told: a slow first step, a pause, an announced save, or a real deadlock.
STEPPER = textwrap.dedent(
    """
    import os, threading, time
    from hotswap.api.worker_output import event_record
    events = open(os.environ["HOTSWAP_EVENTS_FILE"], "a", buffering=1)
    def record(kind, **fields):
        events.write(event_record(kind, time.time(), **fields) + "\\n")
    number = lambda name, default: float(os.environ.get(name, default))
    first, step_s = number("FIRST_STEP_S", 0), number("STEP_S", 0.05)
    time.sleep(first)
    for step in range(1, int(number("STEPS", 1e9)) + 1):
        if step > 1:
            time.sleep(step_s)
        record("step", step=step, duration_s=first if step == 1 else step_s)
        if step == number("SAVE_AT", 0):
            record("checkpoint_begin", step=step, reason="periodic")
            time.sleep(number("PAUSE_S", 0))
            record("checkpoint_save", step=step, blocking_s=number("PAUSE_S", 0), total_s=1, bytes=1, reason="periodic")
        if step == number("PAUSE_AT", 0):
            time.sleep(number("PAUSE_S", 0))
        if step == number("DEADLOCK_AT", 0):
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()
    """
)


def hung_entries(home: Path, cluster: str) -> list[dict]:
    rows = query(home, cluster, "SELECT message, data FROM events WHERE kind = 'hung' ORDER BY id")
    return [{"message": r["message"], **json.loads(r["data"])} for r in rows]


def stepper(tmp_path: Path) -> str:
    script = tmp_path / "stepper.py"
    script.write_text(STEPPER)
    return f"{PYTHON} {script}"


def test_a_deadlocked_job_is_declared_hung_restarted_then_failed(home: Path, tmp_path: Path) -> None:
    hotswap(home, "cluster", "create", "--cluster", "h", "--device-type", "v6e-4", "--num-slices", "2", check=True)
    hotswap(home, "workload", "create", "--cluster", "h", "--workload", "stuck", "--num-slices", "2",
            "--max-restarts", "1", "--hang-timeout", str(LIMIT_S), "--command", stepper(tmp_path),
            "--env", "DEADLOCK_AT=20", check=True)
    failed = wait_until(lambda: (w := workloads(home, "h")["stuck"])["phase"] == "FAILED" and w, timeout=120,
                        what="the hung job to be restarted once, then failed")
    hangs = hung_entries(home, "h")
    assert [h["attempt"] for h in hangs] == [1, 2]
    assert "nothing for" in hangs[0]["message"] and "since step 20 completed" in hangs[0]["message"]
    assert failed["restarts"] == 1 and "hung:" in failed["status_message"]
    assert "max restarts (1) is used up" in failed["status_message"]
    wait_until(lambda: not live_workers(home, "h", "stuck"), timeout=60, what="the hung workers to be stopped")
    described = hotswap(home, "workload", "describe", "--cluster", "h", "--workload", "stuck", check=True).stdout
    assert "hung" in described


PAUSE_S = 2 * LIMIT_S


@pytest.mark.parametrize(
    ("name", "env", "hung"),
    [
        ("slow-first-step", {"FIRST_STEP_S": str(PAUSE_S)}, False),
        ("announced-save", {"SAVE_AT": "30", "PAUSE_S": str(PAUSE_S)}, False),
        ("silent-pause", {"PAUSE_AT": "30", "PAUSE_S": str(PAUSE_S)}, True),  # the control: the same pause, unannounced
    ],
)
def test_what_is_and_is_not_a_hang(home: Path, tmp_path: Path, name: str, env: dict[str, str], hung: bool) -> None:
    hotswap(home, "cluster", "create", "--cluster", "h", "--device-type", "v6e-4", "--num-slices", "1", check=True)
    flags = [arg for key, value in {"STEPS": "60", **env}.items() for arg in ("--env", f"{key}={value}")]
    hotswap(home, "workload", "create", "--cluster", "h", "--workload", name, "--max-restarts", "0",
            "--hang-timeout", str(LIMIT_S), "--command", stepper(tmp_path), *flags, check=True)
    final = wait_until(lambda: (w := workloads(home, "h")[name])["phase"] in ("SUCCESSFUL", "FAILED") and w,
                       timeout=120, what=f"{name} to end")
    assert bool(hung_entries(home, "h")) == hung
    assert final["phase"] == ("FAILED" if hung else "SUCCESSFUL"), final["status_message"]


def test_a_sigstopped_rank_of_a_real_training_job_is_detected_and_the_job_restarted(home: Path) -> None:
    pytest.importorskip("torch")
    hotswap(home, "cluster", "create", "--cluster", "h", "--device-type", "v6e-4", "--num-slices", "2", check=True)
    command = f"{PYTHON} {ROOT / 'examples' / 'train.py'} --steps 100000 --step-sleep 0.05 --checkpoint-every 20"
    hotswap(home, "workload", "create", "--cluster", "h", "--workload", "train", "--num-slices", "2",
            "--max-restarts", "2", "--hang-timeout", "10", "--command", command, "--env", "OMP_NUM_THREADS=1", check=True)
    directory = home / "clusters" / "h" / "workloads" / "train-0"
    wait_until(lambda: _steps(directory, 1) >= 40, timeout=180, what="40 steps of attempt 1")
    worker = next(w for w in live_workers(home, "h", "train") if w["replica"] == 1)
    (rank,) = _children(worker["pid"])  # the training process under the worker's shim
    os.kill(rank, signal.SIGSTOP)
    try:
        wait_until(lambda: hung_entries(home, "h"), timeout=60, what="the hang to be declared")
        restarted = wait_until(lambda: _steps(directory, 2) >= 5 and workloads(home, "h")["train"], timeout=180,
                               what="attempt 2 to train")
    finally:
        if os.path.exists(f"/proc/{rank}"):
            os.kill(rank, signal.SIGCONT)
    (hang,) = hung_entries(home, "h")
    assert hang["attempt"] == 1 and "rank h-np-" in hang["message"]
    assert restarted["attempt"] == 2 and restarted["restarts"] == 1 and "hung:" in restarted["status_message"]
    restores = [r for r in read_trace(directory).restores if r.attempt == 2]
    assert restores and restores[0].step >= 20  # it resumed from its checkpoints, not from scratch


def _steps(directory: Path, attempt: int) -> int:
    return max((s.step for s in read_trace(directory).steps if s.attempt == attempt), default=0)


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
