"""A run that failed is never resumed automatically (issue 34, item 5), end to end through the
CLI on the local backend with a real PyTorch worker: a hang kill is a SIGTERM, so the SDK saves
and its run's signal says ``resume``; the controller, which knows the run failed, says so in
the run's ``outcome`` file, and the next ``workload create`` of the name starts fresh and says
why, with and without ``--wait``. A run deleted while it trains still resumes (test_runs.py)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from local_helpers import PYTHON, home, hotswap, live_workers, wait_until, workloads  # noqa: F401 (home: a fixture)

from hotswap.api.runs import RUN_FAILED, RUN_OUTCOME_FILE, RUN_RESUME, RUN_SIGNAL_FILE

pytest.importorskip("torch")

# Trains fast to STALL_AT, then one step takes STALL_S: longer than --hang-timeout, shorter than
# the grace period, so the hang kill's SIGTERM is honoured at that step's end with a save.
TRAINER = textwrap.dedent(
    """
    import os, time
    import torch
    import hotswap.train as ht

    torch.set_num_threads(1)
    run = ht.init(checkpoint_every=5)
    model = torch.nn.Linear(4, 1)
    run.register(model=model)
    stall_at, stall_s = int(os.environ.get("STALL_AT", "-1")), float(os.environ.get("STALL_S", "0"))
    for step in run.steps(int(os.environ.get("STEPS", "100000"))):
        time.sleep(stall_s if step == stall_at else 0.02)
        run.report()
    """
)


def _create(home: Path, script: Path, *flags: str, env: dict[str, str] | None = None) -> str:
    env_flags = [arg for key, value in (env or {}).items() for arg in ("--env", f"{key}={value}")]
    result = hotswap(home, "workload", "create", "--cluster", "c", "--workload", "w", "--command", f"{PYTHON} {script}",
                     "--max-restarts", "0", *env_flags, *flags, check=True, timeout=300)
    created = [line for line in result.stderr.splitlines() if line.startswith("workload w created: ")]
    assert len(created) == 1 and "; run " in created[0], result.stderr
    return created[0]


def _describe(home: Path) -> dict:
    return json.loads(hotswap(home, "workload", "describe", "--cluster", "c", "--workload", "w", "-o", "json", check=True).stdout)


@pytest.mark.parametrize("wait", [False, True])
def test_a_run_killed_for_a_hang_is_not_resumed_and_the_new_one_says_why(home: Path, tmp_path: Path, wait: bool) -> None:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    hotswap(home, "cluster", "create", "--cluster", "c", "--device-type", "v4-8", "--num-slices", "1", "--warm-workers", "0", check=True)
    _create(home, script, "--hang-timeout", "2", "--termination-grace-period", "60", env={"STALL_AT": "12", "STALL_S": "8"})
    hung = _describe(home)
    wait_until(lambda: workloads(home, "c")["w"]["phase"] == "FAILED", timeout=240, what="w to fail for its hang")
    wait_until(lambda: not live_workers(home, "c", "w"), timeout=120, what="the hung worker to save and exit")
    run_dir = Path(hung["checkpoint_dir"])
    # What the worker knows (it got SIGTERM and saved) and what the controller knows (it failed).
    assert (run_dir / RUN_SIGNAL_FILE).read_text() == f"{RUN_RESUME}\n"
    assert (run_dir / RUN_OUTCOME_FILE).read_text() == f"{RUN_FAILED}\n"
    assert any("hung" in event["message"] for event in hung["timeline"] + _describe(home)["timeline"])

    hotswap(home, "workload", "delete", "--cluster", "c", "--workload", "w", check=True)
    wait_until(lambda: "w" not in workloads(home, "c"), timeout=60, what="w to be deleted")
    line = _create(home, script, *(["--wait"] if wait else []), env={"STEPS": "3"})
    again = _describe(home)
    assert again["run_id"] != hung["run_id"] and again["resumed_from"] is None
    assert again["not_resumed"] == {"run": hung["run_id"], "path": str(run_dir), "reason": "failed"}
    assert line.endswith(
        f"starts fresh: run {hung['run_id']} failed and is never resumed automatically (--resume-from {hung['run_id']} resumes it)"
    ), line
    wait_until(lambda: workloads(home, "c")["w"]["phase"] == "SUCCESSFUL", timeout=240, what="the new run to finish")
    logs = hotswap(home, "workload", "logs", "--cluster", "c", "--workload", "w").stdout
    assert "step=" in logs and "restored " not in logs
