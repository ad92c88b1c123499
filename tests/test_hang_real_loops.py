"""No false hang in a real-shaped 2-rank PyTorch job on the local backend: a worker that finished
and takes long to exit (a logger's final flush in an exit handler), and an evaluation pass
longer than the old 4 s floor. The user's exit handlers still run, the exit code stays the
script's, and no rank warns that its process group is still referenced."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from local_helpers import PYTHON, home, hotswap, query, wait_until, workloads  # noqa: F401 (home: a fixture)

pytest.importorskip("torch")

# A trainer as users write them: a per-rank seed for the data, gradient accumulation, an
# evaluation pass that pauses the loop, and a logger whose final flush is an exit handler
# registered before hotswap (so it runs after hotswap's own).
TRAINER = textwrap.dedent(
    """
    import atexit, os, sys, time
    import torch
    import torch.nn.functional as F
    import hotswap.train as ht

    marks = os.environ["MARKS"]
    rank_env = os.environ.get("RANK", "0")
    def final_flush():
        time.sleep(float(os.environ.get("FLUSH_S", "0")))
        with open(os.path.join(marks, "flushed-" + rank_env), "w") as f:
            f.write("ok")
    atexit.register(final_flush)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    run = ht.init(checkpoint_every=10)
    data = torch.Generator().manual_seed(1000 + run.rank)  # each rank its own batches
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run.register(model=model, optimizer=optimizer)
    eval_at, eval_s = int(os.environ.get("EVAL_AT", "0")), float(os.environ.get("EVAL_S", "0"))
    for step in run.steps(int(os.environ.get("STEPS", "30"))):
        optimizer.zero_grad()
        for _ in range(2):  # gradient accumulation
            x = torch.randn(4, 8, generator=data)
            (F.mse_loss(model(x), x.sum(1, keepdim=True)) / 2).backward()
        ht.average_gradients(model)
        optimizer.step()
        run.report(step_in_loop=step)
        if step == eval_at:  # an evaluation pass: no step completes meanwhile
            with torch.no_grad():
                deadline = time.monotonic() + eval_s
                while time.monotonic() < deadline:
                    model(torch.randn(64, 8, generator=data))
                    time.sleep(0.05)
    if os.environ.get("RAISE_AFTER"):
        raise RuntimeError("an error after the loop")
    """
)


def create(home: Path, tmp_path: Path, name: str, *flags: str, **env: str) -> None:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    env_flags = [arg for key, value in {"MARKS": str(marks), "OMP_NUM_THREADS": "1", **env}.items()
                 for arg in ("--env", f"{key}={value}")]
    hotswap(home, "cluster", "create", "--cluster", "h", "--device-type", "v6e-4", "--num-slices", "2",
            "--warm-workers", "0", check=True)  # cold workers: torch._dynamo is imported after the group
    hotswap(home, "workload", "create", "--cluster", "h", "--workload", name, "--num-slices", "2",
            "--max-restarts", "0", "--command", f"{PYTHON} {script}", *flags, *env_flags, check=True)


def ended(home: Path, name: str) -> dict:
    return wait_until(lambda: (w := workloads(home, "h")[name])["phase"] in ("SUCCESSFUL", "FAILED") and w,
                      timeout=240, what=f"{name} to end")


def hangs(home: Path) -> list[str]:
    return [r["message"] for r in query(home, "h", "SELECT message FROM events WHERE kind = 'hung'")]


def logs(home: Path, name: str) -> str:
    return "".join(p.read_text() for p in sorted((home / "clusters" / "h" / "workloads").glob(f"{name}-*/logs/*.log")))


def test_a_finished_job_whose_workers_take_long_to_exit_succeeds(home: Path, tmp_path: Path) -> None:
    # The limit is short (4 s) and each worker's exit takes 3 x as long after its stop record:
    # leaving is never a hang, whatever the limit.
    create(home, tmp_path, "slow-exit", "--hang-timeout", "4", FLUSH_S="12")
    final = ended(home, "slow-exit")
    assert final["phase"] == "SUCCESSFUL", final["status_message"]
    assert hangs(home) == []
    assert sorted(p.name for p in (tmp_path / "marks").iterdir()) == ["flushed-0", "flushed-1"]  # both flushes ran
    text = logs(home, "slow-exit")
    assert "step=30 " in text and "still referenced" not in text, text[-2000:]


def test_an_evaluation_pause_longer_than_the_old_floor_is_no_hang(home: Path, tmp_path: Path) -> None:
    create(home, tmp_path, "evaluates", STEPS="20", EVAL_AT="10", EVAL_S="8")  # the default limit
    final = ended(home, "evaluates")
    assert final["phase"] == "SUCCESSFUL", final["status_message"]
    assert hangs(home) == []


def test_an_error_after_the_loop_still_fails_the_job_with_the_scripts_exit_code(home: Path, tmp_path: Path) -> None:
    create(home, tmp_path, "raises", STEPS="10", RAISE_AFTER="1")
    final = ended(home, "raises")
    assert final["phase"] == "FAILED" and "exit code 1" in final["status_message"], final["status_message"]
    assert hangs(home) == []
    assert "RuntimeError: an error after the loop" in logs(home, "raises")
    assert sorted(p.name for p in (tmp_path / "marks").iterdir()) == ["flushed-0", "flushed-1"]
